"""The compiled lockstep loop (`prefixshield.fleet.fused`) against the Python one
(`prefixshield.fleet.lockstep`): the same assignment, records, replica results, event and
step counts, jumps that waited for the router and router state, bit for bit -- under every
compiled router, policy and scheduler, through windows, buffer growth and invariant checks."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st

from helpers import RANDOM_REQUEST, assert_same_run, make_trace, random_cost, random_rows
from prefixshield.experiments.single import RunSpec, build_trace
from prefixshield.fleet import fused as fleet_fused
from prefixshield.fleet import run as fleet_run
from prefixshield.fleet.config import FleetConfig
from prefixshield.fleet.replica import LockstepReplica
from prefixshield.fleet.routers.base import RouterConfig
from prefixshield.fleet.routers.prefix_affinity import PrefixAffinity
from prefixshield.fleet.run import run_fleet
from prefixshield.policies import make_policy
from prefixshield.scheduling import SchedulerConfig, TenantLimits
from prefixshield.simulator.config import EngineConfig
from prefixshield.simulator.costmodel import CostModel, load_profile
from prefixshield.simulator.engine import EngineError
from prefixshield.tenancy import DEFAULT_CONTRACTS


@functools.lru_cache(maxsize=None)
def _trace(workload: str, scheduler: str = "fcfs", alpha: float = 0.6):
    """The workload's trace at ``alpha`` (512 blocks; ``one_touch`` with its attack
    workloads' two-group population) with its engine config and cost."""
    eng = EngineConfig(num_blocks=512, scheduler=SchedulerConfig(name=scheduler))
    over = {"population": "two_group"} if workload == "one_touch" else {}
    spec = RunSpec(workload=workload, policies=("lru",), engine=eng,
                   profile=load_profile("l4-qwen2.5-1.5b"), alpha=alpha, overrides=over)
    return build_trace(spec)[0], eng, spec.profile.cost

POLICIES = ("lru", "s3fifo", "static_quota", "prefixshield")
ROUTERS = ("least_loaded", "kv_aware", "prefix_affinity")


def _both(trace, policy, fleet, config, cost, blocks=512, **policy_args):
    """The Python and the compiled lockstep run of one fleet, each with its replicas and
    router (asserting the compiled loop ran), compared in full; None when both raised the
    same engine error."""
    with pytest.MonkeyPatch.context() as mp:
        return _compare(mp, trace, policy, fleet, config, cost, blocks, **policy_args)


def _compare(mp, trace, policy, fleet, config, cost, blocks, **policy_args):
    made, routers, compiled = [], [], []
    init = LockstepReplica.__init__

    def spy_init(self, *a, **k):
        init(self, *a, **k)
        made.append(self)

    make_router = fleet_run.make_router

    def spy_router(*a, **k):
        routers.append(make_router(*a, **k))
        return routers[-1]

    run_compiled = fleet_fused.run_compiled

    def spy_compiled(*a, **k):
        compiled.append(True)
        return run_compiled(*a, **k)

    mp.setattr(LockstepReplica, "__init__", spy_init)
    mp.setattr(fleet_run, "make_router", spy_router)
    mp.setattr(fleet_fused, "run_compiled", spy_compiled)

    def fresh():
        return make_policy(policy, blocks, vllm_compat=config.vllm_compat, **policy_args)

    runs = []
    for fused in (False, True):
        del made[:]
        try:
            res = run_fleet(trace, fresh, cost, config, DEFAULT_CONTRACTS, fleet, fused=fused)
        except EngineError as err:
            runs.append((err, None, None))
            continue
        runs.append((res, list(made), routers[-1]))
    assert compiled == [True], "the compiled loop did not run"
    (a, reps_a, router_a), (b, reps_b, router_b) = runs
    if isinstance(a, EngineError) or isinstance(b, EngineError):
        assert str(a) == str(b)
        return None
    assert np.array_equal(a.fleet.assignment, b.fleet.assignment), "assignments differ"
    assert_same_run(a, b)
    assert (a.num_steps, a.num_events) == (b.num_steps, b.num_events)
    assert np.array_equal(a.held_t, b.held_t) and np.array_equal(a.held, b.held)
    for x, y in zip(a.fleet.replicas, b.fleet.replicas):
        assert_same_run(x, y)
        assert (x.num_steps, x.num_events) == (y.num_steps, y.num_events)
    assert [r.deferred_jumps for r in reps_a] == [r.deferred_jumps for r in reps_b]
    assert [r.rows for r in reps_a] == [r.rows for r in reps_b]
    assert [r.scheduler.stats() for r in reps_a] == [r.scheduler.stats() for r in reps_b]
    assert getattr(router_a, "_last", None) == getattr(router_b, "_last", None)
    if a.fleet.ledger is not None:
        log_a, log_b = a.fleet.ledger.log(), b.fleet.ledger.log()
        assert all(np.array_equal(log_a[k], log_b[k]) for k in log_a), "ledger logs differ"
        assert b.fleet.ledger.next_due() == np.inf
    if isinstance(router_a, PrefixAffinity):
        assert router_a._trees == router_b._trees
    return b, reps_b


@pytest.mark.parametrize("router", ROUTERS)
@pytest.mark.parametrize("policy", POLICIES)
def test_compiled_lockstep_is_the_python_loop(router, policy):
    # a static quota's 63-block shares of ShareGPT's 8 groups cannot hold its longest
    # requests: it runs one_touch's two groups
    workload = "one_touch" if policy == "static_quota" else "sharegpt"
    trace, eng, cost = _trace(workload, "fcfs", 1.5)
    res, reps = _both(trace, policy, FleetConfig(4, RouterConfig(router)), eng, cost)
    assert len(set(res.fleet.assignment.tolist())) == 4
    assert sum(r.deferred_jumps for r in reps) > 0  # replicas did wait for the router


@pytest.mark.parametrize("scheduler,router,alpha", [
    ("vtc", "least_loaded", 3.0), ("priority", "kv_aware", 1.5),
    ("kvtc", "prefix_affinity", 2.0), ("fcfs", "kv_aware", 3.0)])
def test_compiled_lockstep_is_the_python_loop_under_every_scheduler(scheduler, router, alpha):
    trace, eng, cost = _trace("sharegpt", scheduler, alpha)
    res, _ = _both(trace, "prefixshield", FleetConfig(3, RouterConfig(router)),
                   eng, cost)
    assert res.records["preemptions"].sum() > 0 or scheduler != "fcfs"


@pytest.mark.parametrize("router,staleness_s", [
    ("round_robin", 0.0), ("least_loaded", 0.0), ("kv_aware", 0.05), ("prefix_affinity", 1.0),
    ("session", 0.2)])
def test_a_fleet_ledger_runs_compiled_in_one_time_order(router, staleness_s):
    # every replica's events and the ledger's deliveries in one order: the charges, their
    # deliveries to the other copies and what the copies then decide are the Python loop's
    trace, eng, cost = _trace("one_touch", "fcfs", 1.5)
    res, _ = _both(trace, "prefixshield", FleetConfig(4, RouterConfig(router), ledger="fleet",
                                                      ledger_staleness_s=staleness_s),
                   eng, cost)
    assert len(res.fleet.ledger.t_s) > 0


def test_routers_that_read_no_state_follow_their_assignment_in_lockstep():
    trace, eng, cost = _trace("one_touch", "vtc", 1.5)
    for router in ("round_robin", "session", "random"):
        _both(trace, "lru", FleetConfig(3, RouterConfig(router), "lockstep"), eng,
              cost)


def test_windows_buffer_growth_and_invariant_checks(monkeypatch):
    # a window of 64 hashes (slid at almost every arrival), series and logs that start at 4
    # rows (grown every few steps), invariants checked after every step: the loop's returns
    # to Python change nothing
    monkeypatch.setattr(LockstepReplica, "FUSED_WINDOW_HASHES", 64)
    monkeypatch.setattr(LockstepReplica, "FUSED_FIRST_ROWS", 4)
    trace, eng, cost = _trace("sharegpt", "fcfs", 1.5)
    checked = EngineConfig(num_blocks=eng.num_blocks, check_invariants=True)
    for router, policy, ledger in (("kv_aware", "prefixshield", "replica"),
                                   ("least_loaded", "s3fifo", "replica"),
                                   ("least_loaded", "prefixshield", "fleet")):
        _both(trace, policy, FleetConfig(3, RouterConfig(router), ledger=ledger), checked, cost)


def test_prefix_affinity_trees_grow_past_their_first_table(monkeypatch):
    monkeypatch.setattr(fleet_fused, "TREE_SLOTS", 8)
    trace, eng, cost = _trace("sharegpt", "fcfs", 1.5)
    _both(trace, "lru", FleetConfig(4, RouterConfig("prefix_affinity")), eng, cost)


def test_a_request_no_replica_can_admit_raises_the_same_error():
    # a static quota of 12 of the 24 blocks per group: the 60-token prompt (16 blocks of 4
    # tokens) fits the pool but never its group's quota, on whichever replica
    rows = [dict(arrival_s=0.1 * i, segment_ids=[i], segment_lengths=[60 if i == 5 else 8],
                 output_tokens=2, group=f"g{i % 2}") for i in range(10)]
    config = EngineConfig(num_blocks=24, block_size=4)
    assert _both(make_trace(rows), "static_quota", FleetConfig(2, RouterConfig(
        "least_loaded")), config, CostModel(0.01, 0.0, 0.0, 0.0, 0.0), blocks=24) is None


def test_what_stays_on_the_python_loop():
    trace, eng, cost = _trace("one_touch")

    def replicas(policy):
        first = LockstepReplica(trace, policy, cost, eng, contracts=DEFAULT_CONTRACTS)
        return [first]

    class Custom(PrefixAffinity):
        name = "prefix_affinity"

    from prefixshield.fleet.hashes import trace_hashes
    from prefixshield.fleet.routers.base import make_router
    from prefixshield.policies.lru import LRUPolicy

    info = trace_hashes(trace, eng)[2]
    router = make_router(RouterConfig("kv_aware"), 1, info, trace.seed)
    lru = replicas(make_policy("lru", 512))
    assert fleet_fused.applies(lru, router, None)
    assert not fleet_fused.applies(lru, router, object())  # another package's ledger

    class MyLRU(LRUPolicy):  # a subclass may change an event: the loop does not drive it
        pass

    assert not fleet_fused.applies(replicas(MyLRU(512)), router, None)
    assert not fleet_fused.applies(lru, Custom(RouterConfig("prefix_affinity"), 1, info, 0),
                                   None)
    wide = make_router(RouterConfig("prefix_affinity"), 65, info, trace.seed)
    assert not fleet_fused.applies(lru * 65, wide, None)


schedulers = st.one_of(
    st.just(SchedulerConfig()),
    st.builds(lambda n: SchedulerConfig("fcfs", limits=(("g0", TenantLimits(max_running=n)),)),
              st.sampled_from([1, 2])),
    st.builds(lambda p: SchedulerConfig("priority", priorities=(("g1", p),)),
              st.sampled_from([-1, 1])),
    st.just(SchedulerConfig("vtc")), st.just(SchedulerConfig("kvtc", kvtc_kv_weight=0.5)))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reqs=st.lists(RANDOM_REQUEST, min_size=1, max_size=16), num_blocks=st.integers(12, 32),
       max_seqs=st.sampled_from([2, 256]), replicas=st.integers(1, 4),
       router=st.sampled_from(ROUTERS), policy=st.sampled_from(POLICIES),
       scheduler=schedulers, tied=st.booleans(),
       ledger=st.sampled_from([None, 0.0, 1 / 32, 0.5]))
def test_random_small_fleets_run_bit_identical_in_the_compiled_loop(
        reqs, num_blocks, max_seqs, replicas, router, policy, scheduler, tied, ledger):
    # ``tied`` puts arrivals and steps on one binary grid: arrivals due exactly when a
    # replica's step ends, several rows at one instant (each routed before any of them
    # arrives), jumps cut to nothing by the next row
    B = 4
    rows = random_rows(reqs, B, tied, both_groups=True)  # both groups: the configs name them
    config = EngineConfig(num_blocks=num_blocks, block_size=B, max_num_seqs=max_seqs,
                          scheduler=scheduler)
    got = _both(make_trace(rows, seed=len(reqs)), policy,
                FleetConfig(replicas, RouterConfig(router, imbalance=1),
                            ledger="replica" if ledger is None else "fleet",
                            ledger_staleness_s=ledger or 0.0), config,
                random_cost(tied), blocks=num_blocks)
    event(f"router: {router}")
    if policy == "prefixshield" and ledger is not None:
        event("a fleet ledger")
    if got is None:
        event("cannot run (same error on both loops)")
        return
    event(f"jumps waited: {'yes' if sum(r.deferred_jumps for r in got[1]) else 'no'}")
