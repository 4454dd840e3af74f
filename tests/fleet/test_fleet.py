"""A fleet of engines behind a router: one replica is today's engine, split and lockstep runs
agree, routers do what their production counterparts do, the bound bounds."""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd
import pytest

from prefixshield.experiments.single import RunSpec, build_trace
from prefixshield.fleet.config import FleetConfig
from prefixshield.fleet.metrics import replica_table, tenant_table, with_bound
from prefixshield.fleet.replica import LockstepReplica
from prefixshield.fleet.routers.base import RouterConfig, least
from prefixshield.fleet.run import run_fleet
from prefixshield.policies import make_policy
from prefixshield.scheduling.config import SchedulerConfig
from prefixshield.simulator.config import EngineConfig
from prefixshield.simulator.costmodel import load_profile
from prefixshield.simulator.engine import Engine
from prefixshield.tenancy import DEFAULT_CONTRACTS

POLICIES = ("lru", "s3fifo", "static_quota", "prefixshield")


@functools.lru_cache(maxsize=None)
def _trace(workload: str, scheduler: str = "fcfs", alpha: float = 0.6):
    eng = EngineConfig(num_blocks=512, scheduler=SchedulerConfig(name=scheduler))
    # the attack workloads' two-group population: every policy serves it (a static quota's
    # 63-block shares of the 8-group background population hold no victim request)
    over = {"population": "two_group"} if workload == "one_touch" else {}
    spec = RunSpec(workload=workload, policies=("lru",), engine=eng,
                   profile=load_profile("l4-qwen2.5-1.5b"), alpha=alpha, overrides=over)
    return build_trace(spec)[0], eng, spec.profile.cost


def _fleet(workload, policy, fleet, scheduler="fcfs", alpha=0.6, fused=True):
    trace, eng, cost = _trace(workload, scheduler, alpha)
    return run_fleet(trace, lambda: make_policy(policy, 512, vllm_compat=eng.vllm_compat), cost,
                     eng, DEFAULT_CONTRACTS, fleet, fused=fused)


def _same_run(a, b) -> None:
    pd.testing.assert_frame_equal(a.records, b.records)
    assert np.array_equal(a.evictions, b.evictions)
    assert np.array_equal(a.occupancy_t, b.occupancy_t)
    assert np.array_equal(a.occupancy, b.occupancy)
    assert np.array_equal(a.held_t, b.held_t) and np.array_equal(a.held, b.held)
    assert (a.num_steps, a.num_events) == (b.num_steps, b.num_events)
    for k in a.creations:
        assert np.array_equal(a.creations[k], b.creations[k])


@pytest.mark.parametrize("policy", POLICIES)
def test_one_replica_is_the_single_engine(policy):
    trace, eng, cost = _trace("one_touch")
    single = Engine(trace, make_policy(policy, 512, vllm_compat=eng.vllm_compat), cost,
                    eng).run()
    fleet = _fleet("one_touch", policy, FleetConfig(1))
    assert fleet.fleet.mode == "split"
    _same_run(single, fleet.fleet.replicas[0])
    pd.testing.assert_frame_equal(single.records, fleet.records.drop(columns="replica"))
    assert single.policy_stats == fleet.fleet.replicas[0].policy_stats


@pytest.mark.parametrize("policy", ["lru", "prefixshield"])
def test_one_replica_in_lockstep_is_the_single_engine(policy):
    trace, eng, cost = _trace("sharegpt")
    single = Engine(trace, make_policy(policy, 512, vllm_compat=eng.vllm_compat), cost,
                    eng).run()
    fleet = _fleet("sharegpt", policy, FleetConfig(1, mode="lockstep"))
    _same_run(single, fleet.fleet.replicas[0])


def _count_deferred(monkeypatch) -> list:
    made = []
    init = LockstepReplica.__init__

    def spy(self, *a, **k):
        init(self, *a, **k)
        made.append(self)

    monkeypatch.setattr(LockstepReplica, "__init__", spy)
    return made


@pytest.mark.parametrize("workload,scheduler,policy,router", [
    ("one_touch", "fcfs", "lru", "round_robin"),
    ("one_touch", "fcfs", "static_quota", "session"),
    ("sharegpt", "fcfs", "s3fifo", "random"),
    ("sharegpt", "vtc", "prefixshield", "round_robin"),
    ("one_touch", "vtc", "lru", "random"),
])
def test_lockstep_equals_split_for_routers_that_read_no_state(monkeypatch, workload, scheduler,
                                                              policy, router):
    made = _count_deferred(monkeypatch)
    cfg = RouterConfig(router)
    split = _fleet(workload, policy, FleetConfig(3, cfg, "split"), scheduler, alpha=1.5)
    lock = _fleet(workload, policy, FleetConfig(3, cfg, "lockstep"), scheduler, alpha=1.5)
    assert np.array_equal(split.fleet.assignment, lock.fleet.assignment)
    pd.testing.assert_frame_equal(split.records, lock.records)
    for a, b in zip(split.fleet.replicas, lock.fleet.replicas):
        _same_run(a, b)
        assert a.policy_stats == b.policy_stats
    # the lockstep replicas did wait for the router to end decode jumps
    assert sum(r.deferred_jumps for r in made) > 0


@pytest.mark.parametrize("router", ["least_loaded", "prefix_affinity", "kv_aware", "random"])
def test_fleet_runs_are_deterministic(router):
    a = _fleet("one_touch", "prefixshield", FleetConfig(4, RouterConfig(router)))
    b = _fleet("one_touch", "prefixshield", FleetConfig(4, RouterConfig(router)))
    assert np.array_equal(a.fleet.assignment, b.fleet.assignment)
    pd.testing.assert_frame_equal(a.records, b.records)


def test_every_request_is_served_once_and_records_follow_the_trace():
    trace, _, _ = _trace("one_touch")
    r = _fleet("one_touch", "lru", FleetConfig(4, RouterConfig("kv_aware")))
    assert r.records["request_id"].tolist() == trace.requests["request_id"].tolist()
    assert r.records["replica"].tolist() == r.fleet.assignment.tolist()
    assert sum(len(x.records) for x in r.fleet.replicas) == len(trace)
    assert np.array_equal(r.evictions, sum(x.evictions for x in r.fleet.replicas))


def test_round_robin_takes_turns_and_least_loaded_takes_the_shortest_queue(monkeypatch):
    rr = _fleet("one_touch", "lru", FleetConfig(3))
    assert rr.fleet.assignment.tolist() == [i % 3 for i in range(len(rr.records))]
    from prefixshield.fleet.routers.least_loaded import LeastLoaded

    seen = []
    route = LeastLoaded.route

    def spy(self, row, replicas):
        loads = [r.num_requests() for r in replicas]
        choice = route(self, row, replicas)
        seen.append((loads, choice))
        return choice

    monkeypatch.setattr(LeastLoaded, "route", spy)
    # the Python loop, where the router object decides (the compiled loop's choices are the
    # same: tests/fleet/test_fleet_fused.py)
    _fleet("sharegpt", "lru", FleetConfig(3, RouterConfig("least_loaded")), alpha=3.0,
           fused=False)
    assert all(loads[c] == min(loads) for loads, c in seen)
    assert any(max(loads) > min(loads) for loads, _ in seen)  # queues did differ


def test_session_router_keeps_a_key_on_one_replica():
    trace, _, _ = _trace("sharegpt")
    r = _fleet("sharegpt", "lru", FleetConfig(4, RouterConfig("session")))
    df = trace.requests.assign(replica=r.fleet.assignment)
    assert (df.groupby(["group", "prefix_id"])["replica"].nunique() == 1).all()
    assert df["replica"].nunique() > 1
    g = _fleet("sharegpt", "lru", FleetConfig(4, RouterConfig("session", session_key="group")))
    df = trace.requests.assign(replica=g.fleet.assignment)
    assert (df.groupby("group")["replica"].nunique() == 1).all()


def test_prefix_affinity_keeps_a_prefix_on_one_replica_when_load_allows():
    trace, _, _ = _trace("one_touch")
    r = _fleet("one_touch", "lru",
               FleetConfig(4, RouterConfig("prefix_affinity", imbalance=1_000_000)))
    df = trace.requests.assign(replica=r.fleet.assignment)
    victim = df[df["role"] == "victim"]
    # the victim's hot prefixes each stay where they were first sent
    assert (victim.groupby("prefix_id")["replica"].nunique() == 1).all()
    rr = _fleet("one_touch", "lru", FleetConfig(4))
    by_tenant = {"affinity": tenant_table(r), "round_robin": tenant_table(rr)}
    hit = {k: float(t.loc[t["group"] == "victim", "hit_ratio"].iloc[0])
           for k, t in by_tenant.items()}
    assert hit["affinity"] > hit["round_robin"]


class _View:
    def __init__(self, load, cached, pending=0, held=0):
        self.load, self.cached, self.pending, self.held = load, cached, pending, held

    def num_requests(self):
        return self.load

    def cached_prefix_blocks(self, hashes):
        return min(self.cached, len(hashes))

    def pending_prefill_tokens(self):
        return self.pending

    def held_blocks(self):
        return self.held


def test_kv_aware_weighs_cached_blocks_against_work():
    from prefixshield.fleet.routers.base import RequestInfo, make_router

    hashes = np.arange(10, dtype=np.uint64)
    info = RequestInfo(["g"], np.zeros(1, np.int64), np.zeros(1, np.int64),
                       np.array([161]), np.array([8]), 16, hashes=lambda i: hashes)
    router = make_router(RouterConfig("kv_aware"), 3, info, 0)
    # 10 prompt blocks; replica 1 caches 8 of them
    assert router.route(0, [_View(0, 0), _View(0, 8), _View(0, 0)]) == 1
    # ... unless its pending prefill outweighs them (8 blocks saved < 20 blocks queued)
    assert router.route(0, [_View(0, 0), _View(1, 8, pending=320), _View(0, 0)]) in (0, 2)


def test_least_rotates_ties():
    assert least([1, 0, 0], 0) == 1
    assert least([1, 0, 0], 2) == 2
    assert least([0, 0, 0], 1) == 1


@pytest.mark.parametrize("router", ["round_robin", "kv_aware"])
def test_infinite_cache_bound_is_at_least_the_hits(router):
    r = _fleet("sharegpt", "lru", FleetConfig(3, RouterConfig(router)), alpha=1.5)
    rec = with_bound(r)
    ok = rec.dropna(subset=["bound_cached_tokens"])
    assert len(ok) == len(rec)
    assert (ok["bound_cached_tokens"] >= ok["cached_tokens"]).all()
    assert (ok["bound_cached_tokens"] <= ok["prompt_tokens"] - 1).all()
    table = replica_table(r, rec)
    assert table["requests"].sum() == len(rec)
    assert (table["bound_hit_ratio"] >= table["hit_ratio"] - 1e-12).all()


def test_split_refuses_a_router_that_reads_state():
    with pytest.raises(ValueError, match="lockstep mode only"):
        FleetConfig(2, RouterConfig("kv_aware"), "split").resolved_mode()
    with pytest.raises(ValueError, match="replicas"):
        FleetConfig(0)
    with pytest.raises(ValueError, match="unknown router"):
        FleetConfig(2, RouterConfig("nope"))


def test_lockstep_replicas_share_per_request_arrays_and_own_their_run_state(monkeypatch):
    made = _count_deferred(monkeypatch)
    _fleet("one_touch", "lru", FleetConfig(3, RouterConfig("least_loaded")))
    first, *others = made
    for rep in others:
        # read from the trace, or written only at the rows routed to one replica
        for name in ("arrival_s", "prompt_tokens", "_seg_ids_flat", "first_token_s",
                     "cached_tokens", "_state"):
            assert getattr(rep, name) is getattr(first, name)
        assert rep._head_chunks is first._arrival_chunks  # tokens and hashes built once
        for name in ("pool", "kv", "env", "scheduler", "waiting", "running", "_occ",
                     "_run_ids"):
            assert getattr(rep, name) is not getattr(first, name)


def test_fleet_series_are_the_sum_of_the_replicas_step_functions():
    from prefixshield.fleet.run import _sum_series

    # replica 0: 2 from 0 s, 5 from 1 s (set twice at 1 s: the later value holds); replica 1:
    # nothing before 0.5 s, then 3, 1 from 2 s
    t, v = _sum_series([np.array([0.0, 1.0, 1.0]), np.array([0.5, 2.0])],
                       [np.array([[2], [4], [5]]), np.array([[3], [1]])])
    assert t.tolist() == [0.0, 0.5, 1.0, 2.0]
    assert v[:, 0].tolist() == [2, 5, 8, 6] and v.dtype == np.int64


@pytest.mark.parametrize("scheduler", ["fcfs", "vtc"])
def test_a_replica_counts_the_requests_its_scheduler_holds(monkeypatch, scheduler):
    # waiting requests sit in Engine.waiting under FCFS, in the scheduler's queue under VTC:
    # the count the routers read is every request routed here and not finished, either way
    reads = []
    count = LockstepReplica.num_requests

    def spy(self):
        reads.append((count(self), len(self.scheduler), len(self.waiting) + len(self.routed.fed)
                      + len(self.running)))
        return reads[-1][0]

    monkeypatch.setattr(LockstepReplica, "num_requests", spy)
    # the Python loop's replicas (the compiled loop reads the same count in its kernel,
    # tests/fleet/test_fleet_fused.py)
    _fleet("sharegpt", "lru", FleetConfig(2, RouterConfig("least_loaded")), scheduler,
           alpha=3.0, fused=False)
    assert all(got == queued + rest for got, queued, rest in reads)
    assert max(got for got, _, _ in reads) > 2  # requests did wait
