"""The fused event loop (one numba kernel per run) against the step-by-step oracle.

``Engine(...)`` with LRU, PrefixShield, StaticQuota or S3-FIFO and the linear cost model runs
the whole event loop in
:func:`prefixshield.simulator.fused.run_loop`; ``Engine(..., batched=False)`` is the oracle and
``Engine(..., fused=False)`` the per-step batched path. All three must agree bit for bit:
records, occupancy series, eviction matrix, policy stats (PrefixShield's debt samples and class
snapshots included), creation log, step and event counts, and the pool and free order they
leave behind.
"""

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st

from helpers import (RANDOM_REQUEST, assert_same_run as same_run, make_trace, random_cost,
                     random_rows, small_trace)
from prefixshield.policies import POLICIES, make_policy
from prefixshield.scheduling import SchedulerConfig, TenantLimits
from prefixshield.scheduling.vtc import VTCScheduler
from prefixshield.simulator.config import EngineConfig
from prefixshield.simulator.costmodel import CostModel, load_profile
from prefixshield.simulator import engine as engine_module
from prefixshield.simulator.engine import Engine, EngineError
from prefixshield.simulator import fused as fz
from prefixshield.simulator.hashing import chain_block_hashes
from prefixshield.workloads import WORKLOADS, generate

COMPATS = ("0.10", "current")
FUSED_POLICIES = ("lru", "prefixshield", "static_quota", "s3fifo")
"""The policies the fused loop drives."""
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
    if hasattr(pa.policy, "_state"):  # PrefixShield: every byte of its packed state
        assert np.array_equal(pa.policy._state, pb.policy._state), "policy state differs"
    if hasattr(pa.policy, "quota"):  # StaticQuota's own owners and occupancy
        assert np.array_equal(pa.policy.owner, pb.policy.owner), "quota owners differ"
        assert np.array_equal(pa.policy.occupancy, pb.policy.occupancy), "quota occupancy"
    if pa.policy.name == "s3fifo":  # S3-FIFO's own arrays, its ghost in FIFO order
        for name in ("_freq", "_in_use", "_key", "_cnt"):
            assert np.array_equal(getattr(pa.policy, name), getattr(pb.policy, name)), name
        for q in ("free", "small", "main"):
            assert np.array_equal(pa.policy.queue(q), pb.policy.queue(q)), q
        assert np.array_equal(pa.policy.ghost_keys(), pb.policy.ghost_keys()), "ghost"
        assert pa.policy._ghost_slack == pb.policy._ghost_slack, "ghost slack"
        pa.policy.check_invariants()
        pb.policy.check_invariants()


def three_paths(trace, config: EngineConfig, cost=PROFILE_COST, coalesce: bool = True,
                policy: str = "lru", **params):
    """Runs of the oracle, the per-step batched path and the fused loop (asserted to be the
    fused loop) under ``policy`` (with constructor ``params``), all checked equal; None if the
    trace cannot run (same error on all three)."""
    engines, results, errors = [], [], []
    for kw in (dict(batched=False), dict(fused=False), dict()):
        engine = Engine(trace, make_policy(policy, config.num_blocks, config.vllm_compat,
                                           **params), cost,
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
        assert engine.scheduler.stats() == engines[0].scheduler.stats(), "scheduler counters"
    return results[2]


@pytest.mark.parametrize("policy", FUSED_POLICIES)
@pytest.mark.parametrize("workload", sorted(WORKLOADS))
@pytest.mark.parametrize("compat", COMPATS)
def test_every_workload_runs_bit_identical_in_the_fused_loop(workload, compat, policy):
    trace = small_trace(workload, seed=1)
    # 512 blocks (the default), and a pool small enough to preempt and evict, with the
    # pool's and the batch's invariants checked after every step (one kernel call per step).
    for num_blocks, check in ((512, False), (160, True)):
        three_paths(trace, EngineConfig(num_blocks=num_blocks, vllm_compat=compat,
                                        check_invariants=check), policy=policy)


@pytest.mark.parametrize("policy", FUSED_POLICIES)
@pytest.mark.parametrize("compat", COMPATS)
@pytest.mark.parametrize("coalesce", [True, False])
def test_bench_setting_is_bit_identical_in_the_fused_loop(compat, coalesce, policy):
    # one_touch at 4,096 blocks with 16-64 output tokens (the engine bench's target row)
    trace = generate("one_touch", duration_s=20.0, seed=2, num_blocks=4096,
                     output_tokens=(16, 64))
    result = three_paths(trace, EngineConfig(num_blocks=4096, vllm_compat=compat),
                         coalesce=coalesce, policy=policy)
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


def test_the_fused_prefixshield_runs_exercise_debt_gating_and_reclamation():
    # Guard for PrefixShield's fused runs: at a small pool these workloads must gate and grant
    # promotions and reclaim from more than one owner, and the debt log (a bound of 64
    # samples) must fill and thin out -- the kernel's paths the LRU runs skip.
    stats, evictions = [], []
    for workload in ("delayed_replay", "sharegpt", "two_pass_replay"):
        result = three_paths(small_trace(workload, seed=1), EngineConfig(num_blocks=160),
                             policy="prefixshield", max_debt_samples=64)
        assert result is not None
        stats.append(result.policy_stats)
        evictions.append(result.evictions)
    assert sum(sum(s["promotions_gated"].values()) for s in stats) > 0
    assert sum(sum(s["promotions_granted"].values()) for s in stats) > 0
    assert all(len(s["debt_samples"]["t_s"]) <= 64 for s in stats)
    assert any(s["debt_samples"]["stride"] > 1 for s in stats)
    assert any(np.count_nonzero(e.sum(axis=0)) > 1 for e in evictions)


def test_the_fused_static_quota_runs_reach_the_quota():
    # Guard for StaticQuota's fused runs: groups reach their quota and reclaim their own
    # cached blocks, never another group's (the path its kernels add). 320 blocks: the
    # largest request of these two-group workloads fits a quota of 159.
    for workload in ("one_touch", "two_pass_replay"):
        result = three_paths(small_trace(workload, seed=1), EngineConfig(num_blocks=320),
                             policy="static_quota")
        assert result is not None
        ev = result.evictions
        assert ev.sum() > 0 and np.array_equal(ev, np.diag(np.diag(ev)))  # own blocks only


def test_the_fused_s3fifo_runs_reach_ghost_hits_and_main_reinsertions():
    # Guard for S3-FIFO's fused runs: these pools must evict from small into the ghost, hit the
    # ghost (content cached again goes to main), promote, reinsert at the main head and rotate
    # pinned blocks past both heads -- the kernels' paths a plain FIFO would skip.
    # Both traces at the parameters this guard was written for (the workloads' defaults before
    # they were fitted to the reference): at the fitted defaults (8-token outputs; no system
    # prompt, CV 1.125) some of these paths are not reached.
    old = {"delayed_replay": {"max_output_tokens": None, "suffix_tokens": (1, 15),
                              "neutral_duration_s": None},
           "bursty_sharegpt": {"cv": 4.0, "system_prompt_tokens": 256, "think_time_s": 10.0}}
    for workload, num_blocks in (("delayed_replay", 320), ("bursty_sharegpt", 160)):
        kw = old[workload]
        result = three_paths(small_trace(workload, seed=1, **kw),
                             EngineConfig(num_blocks=num_blocks), policy="s3fifo")
        assert result is not None
        stats = result.policy_stats
        assert all(stats[name] > 0 for name in (
            "ghost_hits", "main_reinsertions", "promotions", "evictions_small", "evictions_main",
            "pinned_kept_small", "pinned_kept_main")), (workload, stats)


# PrefixShield's switches and small bounds (history, debt log) that change its decisions
prefixshield_params = st.fixed_dictionaries({}, optional={
    "segmentation": st.booleans(), "debt_gate": st.booleans(),
    "responsibility": st.booleans(), "history_factor": st.sampled_from([0.25, 1.0, 4.0]),
    "max_debt_samples": st.sampled_from([0, 1, 3, 16]),
    "rho_scale": st.sampled_from([0.01, 1.0, 100.0])})


@settings(max_examples=160, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reqs=st.lists(RANDOM_REQUEST, min_size=1, max_size=14), compat=st.sampled_from(COMPATS),
       num_blocks=st.integers(12, 32), block_size=st.sampled_from([4, 16]),
       max_tokens=st.sampled_from([24, 64, 8192]), max_seqs=st.sampled_from([2, 3, 256]),
       reserve=st.sampled_from([None, True, False]), coalesce=st.booleans(),
       check=st.booleans(), tied=st.booleans(), policy=st.sampled_from(FUSED_POLICIES),
       params=prefixshield_params)
def test_random_small_traces_run_bit_identical_in_the_fused_loop(reqs, compat, num_blocks,
                                                                 block_size, max_tokens,
                                                                 max_seqs, reserve, coalesce,
                                                                 check, tied, policy, params):
    # Preemption, evictions, chunked prefill, small max_num_seqs, prefix hits across requests
    # of one group; ``tied`` puts arrivals on a coarse grid so that several arrive at once and
    # at step boundaries (SimPy's event order decides those ties).
    rows = random_rows(reqs, block_size, tied)
    config = EngineConfig(num_blocks=num_blocks, block_size=block_size, vllm_compat=compat,
                          max_num_batched_tokens=max_tokens, max_num_seqs=max_seqs,
                          reserve_full_prompt=reserve, check_invariants=check)
    # steps of 1/64 s (prefill free; binary fractions add exactly) end on the arrivals' grid
    cost = random_cost(tied)
    result = three_paths(make_trace(rows, seed=len(reqs)), config, cost, coalesce, policy,
                         **(params if policy == "prefixshield" else {}))
    event(f"policy: {policy}")
    if result is None:
        event("cannot run (same error on all paths)")
        return
    event(f"preemptions: {'yes' if result.records['preemptions'].sum() else 'no'}")
    event(f"evictions: {'yes' if result.evictions.sum() else 'no'}")


def _limits(draw_running, draw_blocks):
    lim = {}
    if draw_running:
        lim["max_running"] = draw_running
    if draw_blocks:
        lim["max_blocks"] = draw_blocks
    return TenantLimits(**lim)


# The schedulers the fused loop compiles, with and without per-tenant limits (a request of the
# random traces below needs at most 10 blocks, so a max_blocks of 10 holds none back for ever)
schedulers = st.one_of(
    st.builds(lambda lim: SchedulerConfig("fcfs", limits=(("g0", lim),)),
              st.builds(_limits, st.sampled_from([1, 2]), st.sampled_from([None, 10, 16]))),
    st.builds(lambda g, p: SchedulerConfig("priority", priorities=((g, p),)),
              st.sampled_from(["g0", "g1"]), st.sampled_from([-1, 1])),
    st.builds(lambda lim: SchedulerConfig("vtc", limits=(("*", lim),) if lim.any else ()),
              st.builds(_limits, st.sampled_from([None, 1]), st.sampled_from([None, 10]))),
    st.builds(lambda w: SchedulerConfig("kvtc", kvtc_kv_weight=w),
              st.sampled_from([None, 0.5, 40.0])))


@settings(max_examples=160, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reqs=st.lists(RANDOM_REQUEST, min_size=1, max_size=14), num_blocks=st.integers(11, 24),
       max_tokens=st.sampled_from([24, 64, 8192]), max_seqs=st.sampled_from([2, 3, 256]),
       coalesce=st.booleans(), tied=st.booleans(), policy=st.sampled_from(FUSED_POLICIES),
       scheduler=schedulers)
def test_random_small_traces_run_bit_identical_under_every_scheduler(reqs, num_blocks,
                                                                     max_tokens, max_seqs,
                                                                     coalesce, tied, policy,
                                                                     scheduler):
    # Victims anywhere in the running order (priority, VTC), budgets given back, requests
    # held back by limits, counter lifts, jumps that end before an arrival (VTC's order moves
    # with decoding): the fused loop's scheduler kernels against the Python schedulers.
    B = 4
    rows = random_rows(reqs, B, tied, both_groups=True)  # both groups: the configs name them
    config = EngineConfig(num_blocks=num_blocks, block_size=B, max_num_batched_tokens=max_tokens,
                          max_num_seqs=max_seqs, scheduler=scheduler)
    cost = random_cost(tied)
    result = three_paths(make_trace(rows, seed=len(reqs)), config, cost, coalesce, policy)
    event(f"scheduler: {scheduler.name}")
    if result is None:
        event("cannot run (same error on all paths)")
        return
    event(f"preemptions: {'yes' if result.records['preemptions'].sum() else 'no'}")


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


@pytest.mark.parametrize("policy", FUSED_POLICIES)
def test_output_buffers_grow_mid_run(policy):
    # Start the kernel's occupancy and creation buffers tiny: the run asks for more (GROW)
    # and resumes where it stopped, with the same results. (PrefixShield's debt log starts
    # with room for one step's samples and grows the same way.)
    # (320 blocks: StaticQuota's quota of 159 fits every request)
    trace = small_trace("one_touch", seed=1)
    config = EngineConfig(num_blocks=320)
    want = Engine(trace, make_policy(policy, 320), PROFILE_COST, config, batched=False).run()
    engine = Engine(trace, make_policy(policy, 320), PROFILE_COST, config)
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
    assert engine("prefixshield").fused_applies()
    for name in sorted(set(POLICIES) - set(FUSED_POLICIES)):
        assert not engine(name).fused_applies()

    class Recorded:  # a duck-typed cost model: only its own step_time knows the durations
        def step_time(self, prefill_tokens, decode_seqs, context_tokens, new_requests=0):
            return PROFILE_COST.step_time(prefill_tokens, decode_seqs, context_tokens,
                                          new_requests)

    assert not engine(cost=Recorded()).fused_applies()
    small = engine()
    small.FUSED_WINDOW_HASHES = 10   # the window no longer picks the path
    assert small.fused_applies()
    # every registered scheduler, with limits too; not a subclass (it may change a method)
    for sched in (SchedulerConfig("priority"), SchedulerConfig("vtc"), SchedulerConfig("kvtc"),
                  SchedulerConfig("fcfs", limits=(("*", TenantLimits(max_running=2)),))):
        cfg = EngineConfig(scheduler=sched)
        assert Engine(trace, make_policy("lru", cfg.num_blocks), PROFILE_COST,
                      cfg).fused_applies(), sched.name

    class Tweaked(VTCScheduler):
        pass

    vtc = Engine(trace, make_policy("lru", config.num_blocks), PROFILE_COST,
                 EngineConfig(scheduler=SchedulerConfig("vtc")))
    vtc.scheduler = Tweaked(vtc.scheduler.config, vtc.groups, vtc.arrival_s, vtc.group_id)
    assert not vtc.fused_applies()


@pytest.mark.parametrize("policy", FUSED_POLICIES)
@pytest.mark.parametrize("window", [1, 37, 400])
def test_windowed_fused_loop_gives_the_unwindowed_run(policy, window):
    # Hashes and tables held a few requests at a time (1 hash: every arrival slides the
    # window; 37: windows of a few requests, 400: a few dozen) give the run of the whole
    # trace at once, bit for bit: records, pool, policy state, series; requests still waiting
    # or decoding when a window slides keep their hashes and tables.
    trace = small_trace("one_touch", seed=2)
    config = EngineConfig(num_blocks=320)
    whole = Engine(trace, make_policy(policy, 320), PROFILE_COST, config)
    want = whole.run()
    assert whole.num_windows == 1
    windowed = Engine(trace, make_policy(policy, 320), PROFILE_COST, config)
    windowed.FUSED_WINDOW_HASHES = window
    assert_same_run(want, windowed.run())
    assert_same_pool(whole, windowed)
    assert windowed.num_windows > 3


def test_windowed_fused_loop_under_preemption_and_checks():
    rows = [dict(segment_ids=[i % 3], segment_lengths=[20 + 7 * (i % 4)], output_tokens=40,
                 arrival_s=0.004 * i) for i in range(40)]
    for compat in COMPATS:
        config = EngineConfig(num_blocks=14, vllm_compat=compat, check_invariants=True)
        want = Engine(make_trace(rows), make_policy("lru", 14, vllm_compat=compat),
                      PROFILE_COST, config, batched=False).run()
        engine = Engine(make_trace(rows), make_policy("lru", 14, vllm_compat=compat),
                        PROFILE_COST, config)
        engine.FUSED_WINDOW_HASHES = 3
        got = engine.run()
        assert got.records["preemptions"].sum() > 0
        assert engine.num_windows > 5
        assert_same_run(want, got)


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
    rows = (engine._seg_ids_flat, engine._seg_lens_flat, engine._seg_offsets,
            engine.output_segment_id, engine.output_tokens, engine.group_id)
    fz.build_hashes(np.int64(tr.seed), np.int64(tr.vocab_size), np.int64(tr.seed ^ 0x0DEC0DE),
                    np.int64(0), rows, np.int64(B), hash_off, got, np.int64(0),
                    np.int64(len(tr)), np.int64(0))
    for i in range(len(trace)):
        seq = engine._make_sequence(i)
        want = chain_block_hashes(seq.token_ids, seq.token_ids.shape[0], B, seq.group, 0)
        assert np.array_equal(got[hash_off[i]:hash_off[i + 1]], want), i
    # a range of requests into a buffer of its own (a window): the same hashes
    lo, hi = len(tr) // 3, 2 * len(tr) // 3
    part = np.zeros(int(hash_off[hi] - hash_off[lo]), dtype=np.uint64)
    fz.build_hashes(np.int64(tr.seed), np.int64(tr.vocab_size), np.int64(tr.seed ^ 0x0DEC0DE),
                    np.int64(0), rows, np.int64(B), hash_off, part, np.int64(lo), np.int64(hi),
                    hash_off[lo])
    assert np.array_equal(part, got[hash_off[lo]:hash_off[hi]])


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
    args = (table, table_off, hashes, hash_off, ref_cnt, block_hash, counts, 0, 0)
    ref_cnt[[3, 4]] = 1
    assert fz.check_tables(state, run_ids, 1, *args) == -1
    ref_cnt[4] = 2
    assert fz.check_tables(state, run_ids, 1, *args) == -2
    ref_cnt[4] = 1
    state[0, 5] = 1  # claims a cached first block whose hash the pool does not carry
    hashes[0] = 7
    assert fz.check_tables(state, run_ids, 1, *args) == 0
