"""Scheduling policies of the engine: FCFS through the scheduler equals the engine's own paths,
priority, VTC and KVTC order and preempt as documented, per-tenant limits hold, and the queueing and
block-seconds records mean what they say."""

from __future__ import annotations

import numpy as np
import pytest

from prefixshield.experiments.single import RunSpec, build_trace
from prefixshield.policies import make_policy
from prefixshield.scheduling import SchedulerConfig, TenantLimits
from prefixshield.scheduling.kvtc import KVTCScheduler, capacity_price
from prefixshield.scheduling.priority import PriorityScheduler
from prefixshield.scheduling.vtc import VTCScheduler
from prefixshield.simulator.config import EngineConfig
from prefixshield.simulator.costmodel import load_profile
from prefixshield.simulator.engine import Engine, EngineError

PROFILE = load_profile("l4-qwen2.5-1.5b")
EXACT = ["request_id", "group", "prompt_tokens", "cached_tokens", "new_blocks", "output_tokens",
         "preemptions", "arrival_cached_tokens"]
TIMES = ["ttft_s", "e2e_s", "queue_s", "block_s"]


def trace_of(workload: str, seed: int = 0, **overrides):
    if workload == "one_touch":  # every policy serves the two-group population (no static
        overrides.setdefault("population", "two_group")  # share holds an 8-group victim)
    spec = RunSpec(workload=workload, policies=("lru",), engine=EngineConfig(), profile=PROFILE,
                   seed=seed, overrides=overrides)
    return build_trace(spec)[0]


def run(trace, scheduler=None, policy="lru", blocks=512, **kw):
    config = EngineConfig(num_blocks=blocks, scheduler=scheduler or SchedulerConfig())
    return Engine(trace, make_policy(policy, blocks), PROFILE.cost, config, **kw).run()


@pytest.mark.parametrize("policy", ["lru", "prefixshield", "s3fifo", "static_quota"])
@pytest.mark.parametrize("workload", ["one_touch", "sharegpt", "borrowing"])
def test_fcfs_through_the_scheduler_equals_the_fused_engine(workload, policy):
    """Limits no request reaches send FCFS through the scheduler (its compiled queue in the
    fused loop, not the loop's own ring): every record, the evictions and the occupancy equal
    the default run, bit for bit."""
    trace = trace_of(workload)
    plain = run(trace, policy=policy)
    loose = SchedulerConfig("fcfs", limits=(("*", TenantLimits(max_running=10**6)),))
    via = run(trace, loose, policy=policy)
    assert via.records.equals(plain.records)
    assert np.array_equal(via.evictions, plain.evictions)
    assert np.array_equal(via.occupancy, plain.occupancy)


def test_priority_with_equal_priorities_and_no_preemption_is_fcfs():
    trace = trace_of("one_touch")
    plain = run(trace)
    assert plain.records["preemptions"].sum() == 0
    assert run(trace, SchedulerConfig("priority")).records.equals(plain.records)


@pytest.mark.parametrize("scheduler", [
    SchedulerConfig("vtc"),
    SchedulerConfig("kvtc"),
    SchedulerConfig("priority", priorities=(("attacker", 1),)),
    SchedulerConfig("fcfs", limits=(("attacker", TenantLimits(max_running=4, max_blocks=200)),)),
], ids=["vtc", "kvtc", "priority", "limits"])
def test_decode_jumps_change_nothing_under_every_scheduler(scheduler):
    """Quiet decode steps taken in one jump or one by one: the same decisions (exact counts) and
    the same times up to the rounding of a summed series."""
    trace = trace_of("one_touch", max_output_tokens=None, duration_s=10.0)
    a = run(trace, scheduler).records
    b = run(trace, scheduler, coalesce_decode=False).records
    assert a[EXACT].equals(b[EXACT])
    for col in TIMES:
        np.testing.assert_allclose(a[col], b[col], rtol=1e-9, atol=1e-9)


def test_priority_serves_the_preferred_group_first():
    trace = trace_of("one_touch")
    fcfs = run(trace).records
    prio = run(trace, SchedulerConfig("priority", priorities=(("victim", 0),
                                                               ("attacker", 1)))).records

    def queue(rec, g):
        return rec.loc[rec["group"] == g, "queue_s"].mean()

    assert queue(prio, "victim") < queue(fcfs, "victim")
    assert prio.loc[prio["group"] == "victim", "hit_fraction"].mean() > \
        fcfs.loc[fcfs["group"] == "victim", "hit_fraction"].mean()


def test_limits_hold_at_every_step():
    """No group ever runs more than max_running requests; outputs are cut to
    max_output_tokens."""
    trace = trace_of("one_touch", max_output_tokens=None, duration_s=10.0)
    peak = []

    def observe(eng, t):
        peak.append(sum(1 for s in eng.running if eng.groups[s.group] == "attacker"))

    for cap in (None, 1):
        limits = (("attacker", TenantLimits(max_running=cap)),) if cap else ()
        config = EngineConfig(scheduler=SchedulerConfig("fcfs", limits=limits))
        peak.clear()
        Engine(trace, make_policy("lru", 512), PROFILE.cost, config).run(observe=observe,
                                                                          every_s=0.05)
        if cap is None:
            assert max(peak) > 1  # the limit binds
        else:
            assert max(peak) == 1
    limits = (("attacker", TenantLimits(max_output_tokens=5)),)
    result = run(trace, SchedulerConfig("fcfs", limits=limits))
    rec = result.records
    att = rec[rec["group"] == "attacker"]
    assert att["output_tokens"].max() == 5
    raw = trace.requests["output_tokens"].to_numpy()[(rec["group"] == "attacker").to_numpy()]
    assert (att["output_tokens"].to_numpy() == np.minimum(raw, 5)).all()


def test_block_seconds_lie_between_the_prompt_and_the_whole_table():
    """A request's block-seconds: at least its prompt's blocks over its time running, at most
    its prompt-and-output blocks over it (no preemption in this trace)."""
    rec = run(trace_of("sharegpt")).records
    assert (rec["preemptions"] == 0).all()
    running = rec["e2e_s"] - rec["queue_s"]
    lo = np.floor(rec["prompt_tokens"] / 16) * running
    hi = np.ceil((rec["prompt_tokens"] + rec["output_tokens"]) / 16) * running
    assert (rec["block_s"] >= lo - 1e-9).all() and (rec["block_s"] <= hi + 1e-9).all()
    assert (rec["queue_s"] >= 0).all()
    assert (rec["arrival_cached_tokens"] >= 0).all()


def _seq(rid, group, prompt=32):
    from types import SimpleNamespace

    return SimpleNamespace(request_id=rid, group=group, num_prompt_tokens=prompt,
                           num_tokens=prompt)


def test_priority_queue_and_victim_follow_vllm():
    arrival = np.array([0.0, 1.0, 2.0, 3.0])
    sched = PriorityScheduler(SchedulerConfig("priority", priorities=(("b", -1),)), ["a", "b"],
                              arrival, np.array([0, 1, 0, 1]))
    seqs = [_seq(0, 0), _seq(1, 1), _seq(2, 0), _seq(3, 1)]
    for s in seqs:
        sched.arrive(s)
    order = []
    while sched:
        s = sched.peek()
        sched.pop(s)
        order.append(s.request_id)
    assert order == [1, 3, 0, 2]  # (priority, arrival)
    # the victim: largest (priority, arrival), the first such in running order
    assert sched.victim([seqs[1], seqs[2], seqs[0], seqs[3]]) == 1


def test_vtc_lifts_a_newly_backlogged_group_and_serves_the_least_counter():
    arrival = np.zeros(6)
    sched = VTCScheduler(SchedulerConfig("vtc"), ["a", "b"], arrival, np.zeros(6, dtype=int))
    a0, a1, b0 = _seq(0, 0, 100), _seq(1, 0, 100), _seq(2, 1, 10)
    sched.arrive(a0)
    sched.arrive(a1)
    s = sched.peek()
    assert s is a0
    sched.pop(a0)
    sched.on_admit(a0, True, 0.0)
    sched.on_output(0, 10)
    assert sched.counter(0) == 100 * 1 + 10 * 2
    # b arrives with a still waiting: lifted to a's counter (the least of the waiting groups)
    sched.arrive(b0)
    assert sched.counter(1) == sched.counter(0)
    # ties go to the earliest arrival (a1, row 1), then b once a's counter grows
    assert sched.peek() is a1
    sched.pop(a1)
    sched.on_admit(a1, True, 0.0)
    assert sched.peek() is b0
    # victim: the newest running request of the group with the largest counter
    assert sched.victim([a0, b0, a1]) == 2


@pytest.mark.parametrize("kwargs, message", [
    (dict(name="nope"), "unknown scheduler"),
    (dict(name="vtc", vtc_output_weight=float("nan")), "finite"),
    (dict(name="vtc", vtc_input_weight=-1.0), ">= 0"),
    (dict(name="kvtc", kvtc_kv_weight=float("inf")), "kvtc_kv_weight must be a finite"),
    (dict(name="kvtc", kvtc_kv_weight=-2.0), "kvtc_kv_weight must be a finite number >= 0"),
    (dict(name="kvtc", kvtc_kv_weight=True), "kvtc_kv_weight must be a finite"),
    (dict(name="kvtc", vtc_input_weight=0.0, vtc_output_weight=0.0, kvtc_kv_weight=0.0),
     "charge nothing"),
    (dict(name="vtc", kvtc_kv_weight=1.0), "kvtc scheduler only"),
    (dict(name="vtc", vtc_input_weight=0.0, vtc_output_weight=0.0), "both be 0"),
    (dict(name="fcfs", priorities=(("a", 1),)), "priority scheduler only"),
    (dict(name="priority", priorities=(("a", 1), ("a", 2))), "twice"),
])
def test_bad_scheduler_configs_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SchedulerConfig(**kwargs)


@pytest.mark.parametrize("key", ["max_running", "max_blocks", "max_output_tokens"])
@pytest.mark.parametrize("value", [0, -3])
def test_limits_below_one_are_refused(key, value):
    with pytest.raises(ValueError, match="between 1"):
        TenantLimits(**{key: value})


def test_a_group_the_trace_does_not_have_is_refused_before_the_run():
    trace = trace_of("one_touch")
    with pytest.raises(EngineError, match="'ghost', which the trace does not have"):
        run(trace, SchedulerConfig("priority", priorities=(("ghost", 1),)))
    with pytest.raises(EngineError, match="max_blocks limit 2"):
        run(trace, SchedulerConfig("fcfs", limits=(("victim", TenantLimits(max_blocks=2)),)))


@pytest.mark.parametrize("workload", ["one_touch", "sharegpt"])
def test_the_held_series_is_the_same_on_every_path_and_integrates_to_the_block_seconds(workload):
    """Blocks held by running requests over time: equal on the fused, per-step batched and
    step-by-step paths, and its integral per group is the group's summed block-seconds."""
    trace = trace_of(workload)
    runs = [run(trace, policy="prefixshield", **kw)
            for kw in ({}, dict(fused=False), dict(batched=False))]
    for other in runs[1:]:
        assert np.array_equal(other.held_t, runs[0].held_t)
        assert np.array_equal(other.held, runs[0].held)
    r = runs[0]
    assert (r.held >= 0).all() and (r.held[-1] == 0).all()
    widths = np.diff(np.append(r.held_t, r.held_t[-1]))
    integral = (widths[:, None] * r.held).sum(axis=0)
    per_group = r.records.groupby("group")["block_s"].sum().reindex(r.groups).fillna(0.0)
    np.testing.assert_allclose(integral, per_group.to_numpy(), rtol=1e-9)


@pytest.mark.parametrize("alpha", [0.2, 0.6])
def test_vtc_counters_do_not_depend_on_decode_jumps(alpha):
    """An arrival during what would be a jump reads the counters the steps before it charged:
    with and without jumps, the same lifts, the same counters at the end, the same decisions."""
    spec = RunSpec(workload="sharegpt", policies=("lru",), engine=EngineConfig(),
                   profile=PROFILE, alpha=alpha, overrides={"duration_s": 30.0})
    trace = build_trace(spec)[0]
    config = EngineConfig(scheduler=SchedulerConfig("vtc"))
    engines = [Engine(trace, make_policy("lru", 512), PROFILE.cost, config, coalesce_decode=c)
               for c in (True, False)]
    a, b = (e.run().records for e in engines)
    assert a[EXACT].equals(b[EXACT])
    sa, sb = (e.scheduler for e in engines)
    assert np.array_equal(sa.input_tokens, sb.input_tokens)
    assert np.array_equal(sa.output_tokens, sb.output_tokens)
    np.testing.assert_allclose(sa.lift, sb.lift, rtol=0, atol=1e-9)


def schedulers(groups: list[str]) -> dict[str, SchedulerConfig]:
    """The schedulers the batched path is held to, over a trace's groups (the first two play
    the roles one_touch names attacker and victim)."""
    a, b = (groups[1], groups[0]) if "attacker" not in groups else ("attacker", "victim")
    return {
        "vtc": SchedulerConfig("vtc"),
        "priority": SchedulerConfig("priority", priorities=((a, 1),)),
        "priority-rev": SchedulerConfig("priority", priorities=((b, 1),)),
        "limits": SchedulerConfig("fcfs", limits=((a, TenantLimits(max_running=2)),
                                                 ("*", TenantLimits(max_blocks=400)))),
        "vtc-limits": SchedulerConfig("vtc", limits=(("*", TenantLimits(max_running=3)),)),
        "kvtc": SchedulerConfig("kvtc"),
        "kvtc-kv-only": SchedulerConfig("kvtc", vtc_input_weight=0.0, vtc_output_weight=0.0,
                                        kvtc_kv_weight=1.0),
    }


SCHEDULER_NAMES = ["vtc", "priority", "priority-rev", "limits", "vtc-limits", "kvtc",
                   "kvtc-kv-only"]


def same_runs(a, b) -> None:
    assert a.records.equals(b.records)
    assert np.array_equal(a.occupancy_t, b.occupancy_t)
    assert np.array_equal(a.occupancy, b.occupancy)
    assert np.array_equal(a.held_t, b.held_t) and np.array_equal(a.held, b.held)
    assert np.array_equal(a.evictions, b.evictions)
    assert a.num_steps == b.num_steps


@pytest.mark.parametrize("name", SCHEDULER_NAMES)
@pytest.mark.parametrize("policy", ["lru", "prefixshield"])
@pytest.mark.parametrize("workload, blocks, overrides", [
    ("one_touch", 512, {}),
    ("sharegpt", 128, {"duration_s": 30.0}),  # preemptions
    ("sharegpt", 512, {"duration_s": 30.0}),
])
def test_the_fused_and_batched_steps_equal_the_step_by_step_path_under_every_scheduler(
        name, policy, workload, blocks, overrides):
    """Bit for bit, the fused loop and the per-step batched path against the step-by-step
    oracle: records, occupancy, blocks held, evictions, steps, events and the scheduler's own
    counters -- with jumps and without, and with preemptions of any running request."""
    trace = trace_of(workload, **overrides)
    sched = schedulers(trace.group_names())[name]
    config = EngineConfig(num_blocks=blocks, scheduler=sched)
    for coalesce in (True, False):
        engines = [Engine(trace, make_policy(policy, blocks), PROFILE.cost, config,
                          coalesce_decode=coalesce, **kw)
                   for kw in (dict(batched=False), dict(fused=False), dict())]
        assert [e.fused_applies() for e in engines] == [False, False, True]
        step, *others = [e.run() for e in engines]
        for engine, other in zip(engines[1:], others):
            same_runs(other, step)
            assert other.num_events == step.num_events
            assert engine.scheduler.stats() == engines[0].scheduler.stats()


def test_the_preemption_case_preempts():
    """The small pool of the equality test above does make requests preempt."""
    trace = trace_of("sharegpt", duration_s=30.0)
    for sched in schedulers(trace.group_names()).values():
        rec = run(trace, sched, blocks=128).records
        assert rec["preemptions"].sum() > 0


def test_kvtc_charges_block_seconds_lifts_and_preempts_the_most_charged_group():
    arrival = np.zeros(4)
    cfg = SchedulerConfig("kvtc", kvtc_kv_weight=0.5)
    sched = KVTCScheduler(cfg, ["a", "b"], arrival, np.array([0, 0, 1, 1]))
    sched.bind_capacity(511, 1e4)  # an explicit weight is kept
    assert sched.kv_weight == 0.5
    a0, a1, b0 = _seq(0, 0, 100), _seq(1, 0, 100), _seq(3, 1, 10)
    sched.arrive(a0)
    sched.arrive(a1)
    sched.pop(sched.peek())
    sched.on_admit(a0, True, 0.0)
    # a's running request holds 40 blocks for 2 s and emits 3 tokens
    sched.on_hold(np.array([40, 0]), 2.0)
    sched.on_output(0, 3)
    assert sched.counter(0) == 100 + 2 * 3 + 0.5 * 80
    assert sched.stats()["kvtc_block_s"] == {"a": 80.0, "b": 0.0}
    # b arrives while a waits: lifted to a's counter, the memory-time included
    sched.arrive(b0)
    assert sched.counter(1) == sched.counter(0)
    sched.on_hold(np.array([40, 0]), 1.0)
    assert sched.peek() is b0  # a held more since: b first
    sched.pop(b0)
    sched.on_admit(b0, True, 3.0)
    # victim: the newest running request of the group with the largest counter
    assert sched.victim([a0, b0]) == 0
    sched.on_hold(np.array([0, 400]), 1.0)
    assert sched.victim([a0, b0]) == 1


def test_kvtc_default_weight_is_the_capacity_price():
    """Unset, w_kv is the engine's: the prompt tokens per second of a full-budget prefill step
    over the usable blocks -- the whole pool held for a second costs a second of prefill."""
    trace = trace_of("one_touch")
    config = EngineConfig(num_blocks=512, scheduler=SchedulerConfig("kvtc"))
    eng = Engine(trace, make_policy("lru", 512), PROFILE.cost, config)
    m = config.max_num_batched_tokens
    want = m / PROFILE.cost.step_time(m, 0, m, 0) / 511
    assert eng.scheduler.kv_weight == pytest.approx(want, rel=1e-12)
    assert 30 < want < 45  # l4-qwen2.5-1.5b, 512 blocks: ~38 per block-second
    assert capacity_price(511, 1.0e4) == pytest.approx(1.0e4 / 511)
    with pytest.raises(ValueError, match="positive prompt token rate"):
        capacity_price(511, float("nan"))
    unbound = KVTCScheduler(SchedulerConfig("kvtc"), ["a"], np.zeros(1), np.zeros(1, dtype=int))
    with pytest.raises(RuntimeError, match="bind_capacity"):
        unbound.counter(0)


@pytest.mark.parametrize("workload, blocks", [("one_touch", 512), ("sharegpt", 128)])
def test_kvtc_block_seconds_are_the_groups_block_seconds(workload, blocks):
    """What KVTC charged each group is the block-seconds its requests' tables held (the
    records' ``block_s`` summed per group), on every path, with and without decode jumps."""
    trace = trace_of(workload, duration_s=30.0) if workload == "sharegpt" else \
        trace_of(workload)
    config = EngineConfig(num_blocks=blocks, scheduler=SchedulerConfig("kvtc"))
    charged = []
    for kw in (dict(), dict(batched=False), dict(coalesce_decode=False)):
        eng = Engine(trace, make_policy("lru", blocks), PROFILE.cost, config, **kw)
        rec = eng.run().records
        per_group = rec.groupby("group")["block_s"].sum().reindex(eng.groups).fillna(0.0)
        np.testing.assert_allclose(eng.scheduler.block_s, per_group.to_numpy(), rtol=1e-9)
        charged.append(eng.scheduler.block_s)
    assert np.array_equal(charged[0], charged[1])  # batched = step by step, bit for bit
    np.testing.assert_allclose(charged[0], charged[2], rtol=1e-9)
    assert (charged[0] > 0).all()


def test_kvtc_is_deterministic_and_differs_from_vtc():
    trace = trace_of("sharegpt", duration_s=30.0)
    a, b = (run(trace, SchedulerConfig("kvtc"), blocks=128) for _ in range(2))
    same_runs(a, b)
    assert not run(trace, SchedulerConfig("vtc"), blocks=128).records.equals(a.records)


def test_kvtc_config_round_trips_and_a_default_config_reads_as_before():
    for cfg in (SchedulerConfig("kvtc"), SchedulerConfig("kvtc", vtc_input_weight=0.0,
                                                         kvtc_kv_weight=2.5)):
        assert SchedulerConfig.from_dict(cfg.to_dict()) == cfg
    assert "kvtc_kv_weight" not in SchedulerConfig("vtc").to_dict()
    assert SchedulerConfig.from_dict({"name": "kvtc", "kvtc_kv_weight": 1.0}).kvtc_kv_weight == 1.0
