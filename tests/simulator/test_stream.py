"""Streamed runs (:mod:`prefixshield.simulator.stream`) against the unstreamed fused loop:
the same trace in windows of a few rows gives the same run, bit for bit -- records, series,
creation log, evictions, policy stats, counts -- and the same summary from the files."""

import math

import numpy as np
import pandas as pd
import pytest

from helpers import assert_same_run, small_trace
from prefixshield.parquetfiles import read_frame
from prefixshield.policies import make_policy
from prefixshield.scheduling import SchedulerConfig, TenantLimits
from prefixshield.simulator.config import EngineConfig
from prefixshield.simulator.costmodel import load_profile
from prefixshield.simulator.engine import Engine, EngineError
from prefixshield.simulator.metrics import summarize
from prefixshield.simulator.stream import StreamedRun, summarize_files
from prefixshield.traces.schema import Trace, TraceError
from prefixshield.traces.stream import TraceStream
from prefixshield.workloads import generate

COST = load_profile("l4-qwen2.5-1.5b").cost
FUSED_POLICIES = ("lru", "prefixshield", "static_quota", "s3fifo")


def same_summary(a: dict, b: dict) -> None:
    """Equal dicts, NaN equal to NaN."""
    assert a.keys() == b.keys()
    for k in a:
        same = a[k] == b[k] or (isinstance(a[k], float) and math.isnan(a[k])
                                and math.isnan(b[k]))
        assert same, (k, a[k], b[k])


def both(trace, policy, config, tmp_path, window_rows, chunk_rows, **params):
    """The unstreamed run and the streamed result (``params``: the policy's)."""
    whole = Engine(trace, make_policy(policy, config.num_blocks, config.vllm_compat, **params),
                   COST, config).run()
    run = StreamedRun(TraceStream.of_trace(trace, chunk_rows),
                      make_policy(policy, config.num_blocks, config.vllm_compat, **params),
                      COST, config, tmp_path / policy, window_rows=window_rows)
    streamed = run.run()
    return whole, streamed


@pytest.mark.parametrize("policy", FUSED_POLICIES)
def test_a_streamed_run_is_the_unstreamed_run_bit_for_bit(policy, tmp_path):
    # a pool small enough to preempt and evict, invariants checked after every step
    trace = generate("one_touch", duration_s=5.0, seed=1, num_blocks=300,
                     output_tokens=(64, 200), population="two_group")
    config = EngineConfig(num_blocks=300, check_invariants=True)
    whole, streamed = both(trace, policy, config, tmp_path, window_rows=3, chunk_rows=7)
    back = streamed.load()
    assert_same_run(whole, back)
    assert whole.num_events == back.num_events
    assert streamed.num_windows > 10 and streamed.requests == len(trace)
    assert np.array_equal(whole.held_t, back.held_t) and np.array_equal(whole.held, back.held)
    same_summary(summarize(whole), summarize_files(streamed))
    assert whole.records["preemptions"].sum() > 0 or policy == "static_quota"


def test_the_records_file_is_the_unstreamed_records(tmp_path):
    trace = small_trace("two_pass_replay", seed=2)
    config = EngineConfig(num_blocks=512, vllm_compat="current")
    # a debt log of 8 samples: thinned as the run goes (its samples are in the stats)
    whole, streamed = both(trace, "prefixshield", config, tmp_path, window_rows=5,
                           chunk_rows=3, max_debt_samples=8)
    assert whole.policy_stats == streamed.policy_stats
    pd.testing.assert_frame_equal(read_frame(streamed.files["records"]), whole.records)
    same_summary(summarize(whole), summarize_files(streamed))
    assert not list(tmp_path.glob("**/.*.partial"))


def test_a_streamed_run_refuses_what_is_not_the_fused_loop(tmp_path):
    from prefixshield.policies.lru import LRUPolicy

    class MyLRU(LRUPolicy):  # a subclass may change an event: the fused loop does not drive it
        pass

    trace = small_trace("one_touch", seed=1)
    with pytest.raises(EngineError, match="a streamed run takes the fused loop"):
        StreamedRun(TraceStream.of_trace(trace, 10), MyLRU(512), COST,
                    EngineConfig(num_blocks=512), tmp_path)


@pytest.mark.parametrize("scheduler", [
    SchedulerConfig("fcfs", limits=(("attacker", TenantLimits(max_running=2, max_blocks=120,
                                                              max_output_tokens=96)),)),
    SchedulerConfig("priority", priorities=(("attacker", 1),)),
    SchedulerConfig("vtc", limits=(("*", TenantLimits(max_running=3)),)),
    SchedulerConfig("kvtc")], ids=lambda c: c.name)
@pytest.mark.parametrize("policy", ["lru", "prefixshield"])
def test_a_streamed_run_under_every_compiled_scheduler_is_the_unstreamed_run(scheduler, policy,
                                                                          tmp_path):
    # windows of 3 rows: every slide moves the scheduler's lists by the rows that left them
    # (victims anywhere in the running order, held-back requests, VTC's counters, a gateway's
    # output cap applied to each chunk as to the whole trace)
    trace = generate("one_touch", duration_s=5.0, seed=1, num_blocks=300,
                     output_tokens=(64, 200), population="two_group")
    config = EngineConfig(num_blocks=300, check_invariants=True, scheduler=scheduler)
    whole, streamed = both(trace, policy, config, tmp_path, window_rows=3, chunk_rows=7)
    back = streamed.load()
    assert_same_run(whole, back)
    assert whole.num_events == back.num_events and streamed.num_windows > 10
    assert np.array_equal(whole.held_t, back.held_t) and np.array_equal(whole.held, back.held)
    assert whole.records["preemptions"].sum() > 0


def test_a_streamed_request_over_its_groups_block_limit_is_the_unstreamed_error(tmp_path):
    trace = small_trace("one_touch", seed=1)
    config = EngineConfig(num_blocks=512, scheduler=SchedulerConfig(
        "fcfs", limits=(("*", TenantLimits(max_blocks=4)),)))
    with pytest.raises(EngineError) as whole:
        Engine(trace, make_policy("lru", 512), COST, config)
    with pytest.raises(EngineError) as streamed:
        StreamedRun(TraceStream.of_trace(trace, 10), make_policy("lru", 512), COST, config,
                    tmp_path).run()
    assert str(streamed.value) == str(whole.value)


def test_arrivals_that_go_back_across_chunks_name_the_row(tmp_path):
    trace = small_trace("one_touch", seed=1)
    df = trace.requests
    first, rest = df.iloc[:10].copy(), df.iloc[10:20].copy()
    first["arrival_s"] += 1000.0   # each chunk sorted, the second one earlier
    chunks = [Trace(p.reset_index(drop=True), trace.seed, trace.vocab_size, trace.meta)
              for p in (first, rest)]
    stream = TraceStream(trace.seed, trace.vocab_size, trace.meta, trace.group_names(),
                         trace.contract_names(), lambda: iter(chunks))
    run = StreamedRun(stream, make_policy("lru", 512), COST, EngineConfig(), tmp_path,
                      window_rows=4)
    with pytest.raises(TraceError, match="row 10: field arrival_s decreases"):
        run.run()
    assert not list(tmp_path.iterdir()) or not list(tmp_path.glob("*.parquet"))


def test_a_trace_file_streams_in_row_batches_with_the_same_run(tmp_path):
    from prefixshield.traces.io import stream_trace, write_trace

    trace = small_trace("one_touch", seed=3)
    write_trace(trace, tmp_path / "t.parquet")
    stream = stream_trace(tmp_path / "t.parquet", batch_rows=4)
    assert stream.groups == trace.group_names() and stream.contracts == trace.contract_names()
    config = EngineConfig(num_blocks=512)
    whole = Engine(trace, make_policy("lru", 512), COST, config).run()
    streamed = StreamedRun(stream, make_policy("lru", 512), COST, config, tmp_path / "out",
                           window_rows=2).run()
    assert_same_run(whole, streamed.load())


def test_a_bad_row_of_a_streamed_file_is_named_by_its_row_in_the_file(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from prefixshield.traces.io import stream_trace, write_trace

    write_trace(small_trace("one_touch", seed=3), tmp_path / "t.parquet")
    table = pq.read_table(tmp_path / "t.parquet")
    out = table.column("output_tokens").to_numpy().copy()
    out[13] = 0
    i = table.schema.get_field_index("output_tokens")
    pq.write_table(table.set_column(i, "output_tokens", pa.array(out)), tmp_path / "bad.parquet")
    stream = stream_trace(tmp_path / "bad.parquet", batch_rows=5)
    with pytest.raises(TraceError, match="row 13: field output_tokens must be >= 1"):
        list(stream.rows())


def test_a_long_generated_workload_streams_the_rows_of_its_in_memory_trace():
    from prefixshield.traces.stream import concat_traces
    from prefixshield.workloads import make_params
    from prefixshield.workloads.attack import GEN_WINDOW_S, stream_attack

    for kw in (dict(seed=5, duration_s=400.0),                 # one window: today's trace
               dict(seed=3, duration_s=2.5 * GEN_WINDOW_S, base_rate=5.0)):
        whole = generate("one_touch", **kw)
        stream = stream_attack("one_touch", make_params("one_touch", **kw))
        parts = list(stream.chunks())
        assert len(parts) == (1 if kw["duration_s"] <= GEN_WINDOW_S else 3)
        assert concat_traces(parts, stream.seed, stream.vocab_size, whole.meta).equals(whole)
        assert stream.groups == whole.group_names()
    with pytest.raises(ValueError, match="cannot be streamed"):
        stream_attack("one_touch", make_params("one_touch", aim="session"))


def test_arrivals_at_t0_past_the_first_window_and_equal_times_stream_alike(tmp_path):
    from helpers import make_trace

    rows = [{"arrival_s": 0.0 if i < 9 else 0.5 * (i // 3), "prefix_id": i % 2,
             "segment_ids": [i % 2, 100 + i], "segment_lengths": [32, 5 + i],
             "output_tokens": 1 + i % 4, "group": f"g{i % 2}"} for i in range(20)]
    trace = make_trace(rows, seed=4)
    config = EngineConfig(num_blocks=64, check_invariants=True)
    whole, streamed = both(trace, "prefixshield", config, tmp_path, window_rows=2,
                           chunk_rows=3)
    assert_same_run(whole, streamed.load())


def test_a_request_that_can_never_be_admitted_is_the_unstreamed_error(tmp_path):
    trace = generate("one_touch", duration_s=5.0, seed=1, num_blocks=300,
                     output_tokens=(64, 200))
    with pytest.raises(EngineError) as whole:
        Engine(trace, make_policy("static_quota", 200), COST,
               EngineConfig(num_blocks=200)).run()
    with pytest.raises(EngineError) as streamed:
        StreamedRun(TraceStream.of_trace(trace, 4), make_policy("static_quota", 200), COST,
                    EngineConfig(num_blocks=200), tmp_path, window_rows=3).run()
    assert str(whole.value) == str(streamed.value)
    assert not list(tmp_path.glob("*.parquet"))
