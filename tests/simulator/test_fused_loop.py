"""The fused event loop (one numba kernel per run) against the step-by-step oracle.

``Engine(...)`` with LRU and the linear cost model runs the whole event loop in
:func:`prefixshield.simulator.fused.run_loop`; ``Engine(..., batched=False)`` is the oracle and
``Engine(..., fused=False)`` the per-step batched path. All three must agree bit for bit:
records, occupancy series, eviction matrix, policy stats, creation log, step and event counts,
and the pool and free queue they leave behind.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st

from helpers import assert_same_run as same_run, make_trace, small_trace
from prefixshield.policies import POLICIES, make_policy
from prefixshield.simulator.config import EngineConfig
from prefixshield.simulator.costmodel import CostModel, load_profile
from prefixshield.simulator.engine import Engine, EngineError
from prefixshield.simulator import fused as fz
from prefixshield.simulator.hashing import chain_block_hashes
from prefixshield.workloads import WORKLOADS, generate

COMPATS = ("0.10", "current")
PROFILE_COST = load_profile("l4-qwen2.5-1.5b").cost


def assert_same_run(a, b) -> None:
    """Bit-identical results, event counts included (:func:`helpers.assert_same_run`)."""
    same_run(a, b)
    assert a.num_events == b.num_events, "event counts differ"


def assert_same_pool(a: Engine, b: Engine) -> None:
    """The pool and the LRU queue left behind are the same (free order included)."""
    pa, pb = a.pool, b.pool
    for name in ("ref_cnt", "block_hash", "hash_next", "owner_group", "occupancy", "evictions",
                 "_map_keys", "_map_vals", "_map_size"):
        assert np.array_equal(getattr(pa, name), getattr(pb, name)), name
    assert pa.num_evicted_total == pb.num_evicted_total
    assert np.array_equal(pa.last_evicted, pb.last_evicted)
    assert np.array_equal(pa.policy.free_order(), pb.policy.free_order())


def three_paths(trace, config: EngineConfig, cost=PROFILE_COST, coalesce: bool = True):
    """Runs of the oracle, the per-step batched path and the fused loop (asserted to be the
    fused loop), all checked equal; None if the trace cannot run (same error on all three)."""
    engines, results, errors = [], [], []
    for kw in (dict(batched=False), dict(fused=False), dict()):
        engine = Engine(trace, make_policy("lru", config.num_blocks, config.vllm_compat), cost,
                        config, coalesce_decode=coalesce, **kw)
        assert engine.fused_applies() == (kw == {})
        try:
            results.append(engine.run())
            engines.append(engine)
        except EngineError as e:
            errors.append(str(e))
    if errors:
        assert len(errors) == 3 and len(set(errors)) == 1, errors
        return None
    for engine, result in zip(engines[1:], results[1:]):
        assert_same_run(results[0], result)
        assert_same_pool(engines[0], engine)
        assert engine.env.now == engines[0].env.now
    return results[2]


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
@pytest.mark.parametrize("compat", COMPATS)
def test_every_workload_runs_bit_identical_in_the_fused_loop(workload, compat):
    trace = small_trace(workload, seed=1)
    # 512 blocks (the default), and a pool small enough to preempt and evict, with the
    # pool's and the batch's invariants checked after every step (one kernel call per step).
    for num_blocks, check in ((512, False), (160, True)):
        three_paths(trace, EngineConfig(num_blocks=num_blocks, vllm_compat=compat,
                                        check_invariants=check))


@pytest.mark.parametrize("compat", COMPATS)
@pytest.mark.parametrize("coalesce", [True, False])
def test_bench_setting_is_bit_identical_in_the_fused_loop(compat, coalesce):
    # one_touch at 4,096 blocks with 16-64 output tokens (the engine bench's target row)
    trace = generate("one_touch", duration_s=20.0, seed=2, num_blocks=4096,
                     output_tokens=(16, 64))
    result = three_paths(trace, EngineConfig(num_blocks=4096, vllm_compat=compat),
                         coalesce=coalesce)
    assert result is not None and result.evictions.sum() > 0


def test_the_fused_runs_exercise_preemption_chunking_and_eviction():
    # Guard for the tests here: the small pools and budgets must reach what the kernel could
    # get wrong (preemption, chunked prefill, evictions, prefix hits, head-of-line blocking).
    preemptions = evictions = hits = 0
    for workload in sorted(WORKLOADS):
        result = three_paths(small_trace(workload, seed=1),
                             EngineConfig(num_blocks=160, max_num_batched_tokens=256))
        if result is not None:
            preemptions += int(result.records["preemptions"].sum())
            evictions += int(result.evictions.sum())
            hits += int(result.records["cached_tokens"].sum())
    assert preemptions > 0 and evictions > 0 and hits > 0


# (arrival s, shared prefix id, tail tokens / block, output tokens / block, group)
request = st.tuples(st.floats(0, 0.5), st.integers(0, 3), st.floats(0.05, 2.0),
                    st.floats(0.05, 6.0), st.integers(0, 1))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reqs=st.lists(request, min_size=1, max_size=14), compat=st.sampled_from(COMPATS),
       num_blocks=st.integers(12, 32), block_size=st.sampled_from([4, 16]),
       max_tokens=st.sampled_from([24, 64, 8192]), max_seqs=st.sampled_from([2, 3, 256]),
       reserve=st.sampled_from([None, True, False]), coalesce=st.booleans(),
       check=st.booleans(), tied=st.booleans())
def test_random_small_traces_run_bit_identical_in_the_fused_loop(reqs, compat, num_blocks,
                                                                 block_size, max_tokens,
                                                                 max_seqs, reserve, coalesce,
                                                                 check, tied):
    # Preemption, evictions, chunked prefill, small max_num_seqs, prefix hits across requests
    # of one group; ``tied`` puts arrivals on a coarse grid so that several arrive at once and
    # at step boundaries (SimPy's event order decides those ties).
    reqs = sorted(reqs)
    B = block_size
    rows = [dict(arrival_s=round(8 * t) / 8 if tied else t, segment_ids=[p, 100 + i],
                 segment_lengths=[2 * B, max(1, round(n * B))], output_tokens=max(1, round(o * B)),
                 group=f"g{g}", prefix_id=p)
            for i, (t, p, n, o, g) in enumerate(reqs)]
    config = EngineConfig(num_blocks=num_blocks, block_size=block_size, vllm_compat=compat,
                          max_num_batched_tokens=max_tokens, max_num_seqs=max_seqs,
                          reserve_full_prompt=reserve, check_invariants=check)
    # steps of 1/64 s (prefill free; binary fractions add exactly) end on the arrivals' grid
    cost = (CostModel(1 / 64, 0.0, 0.0, 0.0, 0.0) if tied
            else CostModel(0.01, 0.0005, 0.001, 1e-6, 0.002))
    result = three_paths(make_trace(rows, seed=len(reqs)), config, cost, coalesce)
    if result is None:
        event("cannot run (same error on all paths)")
        return
    event(f"preemptions: {'yes' if result.records['preemptions'].sum() else 'no'}")
    event(f"evictions: {'yes' if result.evictions.sum() else 'no'}")


def test_arrivals_at_a_step_boundary_follow_simpy_event_order():
    # Step times and arrivals on binary fractions of a second (the sums are exact), so that
    # arrivals fall due exactly when steps end: the next step sees such an arrival or not
    # according to which event SimPy scheduled first. Steps of 1/64 s with arrivals two at a
    # time every 1/32 s give ties the arrival's timeout was scheduled first; steps of 1/32 s
    # with arrivals every 1/64 s give ties the step's timeout was scheduled first.
    for step_s, arrival_s in ((1 / 64, lambda i: (i // 2) / 32), (1 / 32, lambda i: i / 64)):
        rows = [dict(segment_ids=[i], segment_lengths=[8], output_tokens=5,
                     arrival_s=arrival_s(i)) for i in range(24)]
        for compat in COMPATS:
            for coalesce in (True, False):
                three_paths(make_trace(rows), EngineConfig(num_blocks=64, block_size=4,
                                                           vllm_compat=compat),
                            CostModel(step_s, 0.0, 0.0, 0.0, 0.0), coalesce)


def test_preemption_in_the_middle_of_a_decoding_batch_in_the_fused_loop():
    rows = [dict(segment_ids=[i], segment_lengths=[20], output_tokens=70, arrival_s=0.01 * i)
            for i in range(3)]
    for compat in COMPATS:
        result = three_paths(make_trace(rows), EngineConfig(num_blocks=12, vllm_compat=compat,
                                                            check_invariants=True))
        assert result.records["preemptions"].sum() > 0


def test_output_buffers_grow_mid_run():
    # Start the kernel's occupancy and creation buffers tiny: the run asks for more (GROW)
    # and resumes where it stopped, with the same results.
    trace = small_trace("one_touch", seed=1)
    config = EngineConfig(num_blocks=160)
    want = Engine(trace, make_policy("lru", 160), PROFILE_COST, config, batched=False).run()
    engine = Engine(trace, make_policy("lru", 160), PROFILE_COST, config)
    engine.FUSED_FIRST_ROWS = 1
    assert_same_run(want, engine.run())


def test_fused_loop_applies_only_where_it_is_exact():
    trace = small_trace("one_touch", seed=1)
    config = EngineConfig()

    def engine(policy="lru", cost=PROFILE_COST, **kw):
        return Engine(trace, make_policy(policy, config.num_blocks), cost, config, **kw)

    assert engine().fused_applies()
    assert not engine(batched=False).fused_applies()
    assert not engine(fused=False).fused_applies()
    for name in sorted(set(POLICIES) - {"lru"}):
        assert not engine(name).fused_applies()

    class Recorded:  # a duck-typed cost model: only its own step_time knows the durations
        def step_time(self, prefill_tokens, decode_seqs, context_tokens, new_requests=0):
            return PROFILE_COST.step_time(prefill_tokens, decode_seqs, context_tokens,
                                          new_requests)

    assert not engine(cost=Recorded()).fused_applies()
    small = engine()
    small.FUSED_MAX_HASHES = 10
    assert not small.fused_applies()


def test_observed_runs_take_the_per_step_path_with_the_same_results():
    trace = small_trace("one_touch", seed=1)
    config = EngineConfig()
    plain = Engine(trace, make_policy("lru", 512), PROFILE_COST, config).run()
    seen = []
    watched = Engine(trace, make_policy("lru", 512), PROFILE_COST, config).run(
        observe=lambda eng, t: seen.append(len(eng.running)), every_s=0.5)
    assert seen and max(seen) > 0
    assert_same_run(plain, watched)


@pytest.mark.parametrize("workload", ["one_touch", "sharegpt"])
def test_build_hashes_equals_the_token_builder_and_chain(workload):
    # prompt-only requests, and conversation requests whose outputs are segments
    trace = small_trace(workload, seed=3)
    engine = Engine(trace, make_policy("lru", 512), PROFILE_COST, EngineConfig())
    B = engine.config.block_size
    hash_off = np.zeros(len(trace) + 1, dtype=np.int64)
    np.cumsum(engine._total_tokens // B, out=hash_off[1:])
    got = np.zeros(int(hash_off[-1]), dtype=np.uint64)
    tr = trace
    fz.build_hashes(np.int64(tr.seed), np.int64(tr.vocab_size), engine._seg_ids_flat,
                    engine._seg_lens_flat, engine._seg_offsets, engine.output_segment_id,
                    engine.output_tokens, np.int64(tr.seed ^ 0x0DEC0DE), engine.group_id,
                    np.int64(B), np.int64(0), hash_off, got)
    for i in range(len(trace)):
        seq = engine._make_sequence(i)
        want = chain_block_hashes(seq.token_ids, seq.token_ids.shape[0], B, seq.group, 0)
        assert np.array_equal(got[hash_off[i]:hash_off[i + 1]], want), i


def test_check_tables_names_a_corrupt_row():
    # the fused path's own invariant check: ref_cnt equals the running tables' references
    state = np.zeros((2, 6), dtype=np.int64)
    state[0, 4] = 2  # request 0 holds two blocks, none cached
    table = np.array([3, 4, 0, 0], dtype=np.int32)
    table_off = np.array([0, 2, 4], dtype=np.int64)
    hashes = np.zeros(2, dtype=np.uint64)
    hash_off = np.array([0, 1, 2], dtype=np.int64)
    run_ids = np.array([0], dtype=np.int64)
    ref_cnt = np.zeros(6, dtype=np.int32)
    block_hash = np.zeros(6, dtype=np.uint64)
    counts = np.zeros(6, dtype=np.int64)
    args = (table, table_off, hashes, hash_off, ref_cnt, block_hash, counts)
    ref_cnt[[3, 4]] = 1
    assert fz.check_tables(state, run_ids, 1, *args) == -1
    ref_cnt[4] = 2
    assert fz.check_tables(state, run_ids, 1, *args) == -2
    ref_cnt[4] = 1
    state[0, 5] = 1  # claims a cached first block whose hash the pool does not carry
    hashes[0] = 7
    assert fz.check_tables(state, run_ids, 1, *args) == 0
