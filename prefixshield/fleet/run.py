"""Run one policy over a fleet: build the router and the replicas, run them in split or
lockstep mode, and merge what they produced into one `RunResult`
(every summary, table and comparison of a single engine then reads a fleet too) with
the per-replica results attached (`FleetRun`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np
import pandas as pd

from prefixshield.fleet import fused as fleet_fused
from prefixshield.fleet.config import FleetConfig
from prefixshield.fleet.hashes import trace_hashes
from prefixshield.fleet.ledger import FleetLedger
from prefixshield.fleet.lockstep import run_lockstep
from prefixshield.fleet.replica import LockstepReplica
from prefixshield.fleet.routers.base import make_router
from prefixshield.fleet.split import pack_trace, sub_trace, tenants_of, unpack_trace
from prefixshield.policies.base import Policy
from prefixshield.policies.prefixshield import PrefixShieldPolicy
from prefixshield.simulator.config import EngineConfig
from prefixshield.simulator.costmodel import CostModel
from prefixshield.simulator.engine import Engine, RunResult
from prefixshield.tenancy import Contract
from prefixshield.traces.schema import Trace


@dataclass
class FleetRun:
    """What a fleet run adds to the merged `RunResult` (its ``fleet`` attribute).

    Attributes:
        config: the fleet's settings.
        mode: ``split`` or ``lockstep`` (how it ran).
        assignment: the replica of every trace row (int64).
        replicas: each replica's own result (records of its rows only, its pool's occupancy,
            evictions, policy state).
        hashes, hash_offsets: every request's full-block hashes (prompt then output), request
            i's at ``hashes[hash_offsets[i]:hash_offsets[i+1]]`` (for the infinite-cache bound).
        block_size: tokens per block.
    """

    config: FleetConfig
    mode: str
    assignment: np.ndarray
    replicas: list[RunResult]
    hashes: np.ndarray
    hash_offsets: np.ndarray
    block_size: int
    ledger: FleetLedger | None = None
    """The fleet-wide ledger with its log of charges (a PrefixShield under ``ledger="fleet"``);
    None: each replica kept its own buckets."""
    loop: str = ""
    """A lockstep run's loop: ``compiled`` (`prefixshield.fleet.fused`) or ``Python loop:
    <why>`` (`prefixshield.fleet.lockstep`; the same results, slower); empty for a split
    run."""


@dataclass(frozen=True)
class ReplicaTask:
    """One split-mode replica as a self-contained task (what an executor ships to a worker).

    Attributes:
        replica: its index in the fleet.
        trace: its share of the trace (`sub_trace`).
        make_policy: builds its fresh policy (picklable for the process and Ray executors, e.g.
            a `functools.partial` of `prefixshield.policies.make_policy` over the
            policy's name and parameters).
        cost, config, contracts: as for [`Engine`][prefixshield.simulator.engine.Engine].
    """

    replica: int
    trace: Trace
    make_policy: Callable[[], Policy]
    cost: CostModel
    config: EngineConfig
    contracts: Mapping[str, Contract]

    def __getstate__(self) -> dict:
        # the sub-trace travels flat (split.pack_trace): its list cells pickle slowly
        state = dict(vars(self))
        state["trace"] = pack_trace(self.trace)
        return state

    def __setstate__(self, state: dict) -> None:
        state = dict(state)
        state["trace"] = unpack_trace(state["trace"])
        for k, v in state.items():
            object.__setattr__(self, k, v)  # a frozen dataclass


def run_replica(task: ReplicaTask) -> RunResult:
    """Run one split-mode replica: an ordinary single engine over its sub-trace (a pure
    function of the task, so every executor returns the same result)."""
    return Engine(task.trace, task.make_policy(), task.cost, task.config,
                  contracts=task.contracts).run()


def _run_split(tasks: list[ReplicaTask], executor: Any) -> list[RunResult]:
    """Every replica's result, in replica order, on ``executor`` (None: one after another
    here). Results arrive in any order; they are put back by the task's replica index."""
    if executor is None:
        return [run_replica(t) for t in tasks]
    results: list[RunResult | None] = [None] * len(tasks)
    for task, res in executor.map(run_replica, tasks):
        results[task.replica] = res
    return results


def run_fleet(trace: Trace, make_policy: Callable[[], Policy], cost: CostModel,
              config: EngineConfig, contracts: Mapping[str, Contract],
              fleet: FleetConfig, executor: Any = None, fused: bool = True) -> RunResult:
    """Simulate ``trace`` on ``fleet.replicas`` engines behind ``fleet.router``.

    Args:
        trace: the requests (validated).
        make_policy: a fresh policy for one replica (called once per replica). With a process
            or Ray ``executor`` it must be picklable (not a lambda).
        cost: as for `Engine`, the same for every replica.
        config: as for `Engine`, the same for every replica.
        contracts: as for `Engine`, the same for every replica.
        fleet: replicas, router, mode, ledger.
        executor: where a split run's replicas run (an executor of
            `prefixshield.experiments.executors`, a task a replica); None: one after
            another in this process. Lockstep runs always run here (one loop drives every
            replica). The result is the same on every executor.
        fused: a lockstep run takes the compiled loop where it applies
            (`prefixshield.fleet.fused`); False: the Python loop
            (`prefixshield.fleet.lockstep`). The same results.

    Returns:
        The merged result: records of every row (trace order) with a ``replica`` column,
        evictions summed, occupancy and held blocks summed over replicas (fleet-wide step
        functions), creations of every replica by time, steps and events summed; its
        ``fleet`` attribute is the `FleetRun`. Raises
        [`EngineError`][prefixshield.simulator.engine.EngineError] as a replica's engine does.
    """
    # only PrefixShield keeps buckets; under any other policy the fleet ledger changes nothing
    probe = make_policy()   # lockstep's first replica's policy (split tasks build their own)
    shared = fleet.ledger == "fleet" and isinstance(probe, PrefixShieldPolicy)
    mode = fleet.resolved_mode(shares_ledger=shared)
    hashes, offsets, info = trace_hashes(trace, config)
    router = make_router(fleet.router, fleet.replicas, info, trace.seed)
    ledger, loop = None, ""
    if mode == "split":
        assignment = router.assign_all(len(trace))
        # a plain dict: a read-only mapping (DEFAULT_CONTRACTS) does not pickle
        table = dict(contracts)
        tenants = tenants_of(trace)
        tasks = [ReplicaTask(r, sub_trace(trace, np.flatnonzero(assignment == r), tenants),
                             make_policy, cost, config, table) for r in range(fleet.replicas)]
        results = _run_split(tasks, executor)
    else:
        policies = [probe] + [make_policy() for _ in range(fleet.replicas - 1)]
        first = LockstepReplica(trace, policies[0], cost, config, contracts=contracts)
        # the others take the first's per-request arrays (each row is served by one replica)
        reps = [first] + [LockstepReplica(trace, p, cost, config, contracts=contracts,
                                          shared=first.shared) for p in policies[1:]]
        # linked after the engines bind the tenants (binding resets the buckets)
        ledger = FleetLedger(policies, fleet.ledger_staleness_s) if shared else None
        why = (fleet_fused.python_loop_reason(reps, router, ledger) if fused
               else "asked for (fused=False)")
        if why is None:
            assignment = fleet_fused.run_compiled(reps, router, reps[0].arrival_s, hashes,
                                                  offsets, info, ledger)
            loop = "compiled"
        else:
            assignment = run_lockstep(reps, router, reps[0].arrival_s, ledger)
            loop = f"Python loop: {why}"
        results = [rep._result() for rep in reps]  # records: the replica's rows
    merged = merge(results, assignment)
    merged.fleet = FleetRun(fleet, mode, assignment, results, hashes, offsets,
                            config.block_size, ledger, loop)
    return merged


def _sum_series(ts: list[np.ndarray], vs: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The sum of step functions (value ``v[k]`` from ``t[k]`` on, 0 before ``t[0]``), at the
    union of times (sorted, each once), in int64."""
    # each series as its changes (v[k] - v[k-1] at t[k]); their running sum in time order is
    # the total, read at the last change of each instant: exact integers, and one sort of
    # every change instead of a pass over the union per replica
    t = np.concatenate(ts)
    d = np.concatenate([np.diff(v.astype(np.int64), axis=0,
                                prepend=np.zeros((1, v.shape[1]), np.int64)) for v in vs])
    order = np.argsort(t, kind="stable")
    t, total = t[order], np.cumsum(d[order], axis=0)
    last = np.flatnonzero(np.append(t[1:] != t[:-1], True))
    return t[last], total[last]


def merge(results: list[RunResult], assignment: np.ndarray) -> RunResult:
    """One fleet-wide `RunResult` from the replicas' (see `run_fleet`)."""
    first = results[0]
    n = assignment.shape[0]
    parts = []
    for r, res in enumerate(results):
        rec = res.records.copy()
        rec["replica"] = np.int64(r)
        rec.index = np.flatnonzero(assignment == r)
        parts.append(rec)
    records = pd.concat(parts).sort_index() if n else first.records.assign(replica=np.int64(0))
    records = records.reset_index(drop=True)
    occ_t, occ = _sum_series([r.occupancy_t for r in results], [r.occupancy for r in results])
    held_t, held = _sum_series([r.held_t for r in results], [r.held for r in results])
    cre = {k: np.concatenate([r.creations[k] for r in results]) for k in first.creations}
    order = np.argsort(cre["t_s"], kind="stable")
    cre = {k: v[order] for k, v in cre.items()}
    return RunResult(records=records, groups=first.groups, occupancy_t=occ_t, occupancy=occ,
                     evictions=sum(r.evictions for r in results),
                     num_steps=sum(r.num_steps for r in results),
                     num_events=sum(r.num_events for r in results),
                     policy_stats={"replicas": [r.policy_stats for r in results]},
                     creations=cre, contracts=first.contracts, contract_rho=first.contract_rho,
                     contract_beta=first.contract_beta, trace_meta=first.trace_meta,
                     held_t=held_t, held=held)
