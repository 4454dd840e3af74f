"""Lockstep mode: every replica in one loop, each advanced up to an arrival before the router
decides where it goes.

Each replica keeps its own SimPy environment (a `LockstepReplica`);
for each request in arrival order the loop (1) advances every replica
through its events that come before the arrival, (2) asks the router, which reads the replicas
as they are at that instant, (3) delivers the request to the chosen replica. With a per-replica
ledger, replicas never interact except through the router, so one environment each (instead of
one shared) keeps every replica's event order exactly a single engine's (see
`prefixshield.fleet.slots`), and each replica is advanced on its own.

A fleet-wide ledger (`prefixshield.fleet.ledger`) couples the replicas between arrivals:
a charge made on one replica changes the buckets the others read. The loop then merges the
replicas' event queues and the ledger's deliveries into one time order (the earliest event
first; at one instant a delivery before events, events by replica index), so a charge at ``t``
reaches the other replicas before any of their events after ``t`` (at zero staleness; at
``t + staleness`` with one). A replica's own events keep the single engine's order. A decode
jump that waits for the router is settled as soon as no arrival can shorten it (rather than
once its replica has no earlier event), because its end may come before other replicas'
events; one that an arrival can shorten ends at or after that arrival, after every event the
loop processed.
"""

from __future__ import annotations

import gc
import heapq
import math

import numpy as np

from prefixshield.fleet.ledger import FleetLedger
from prefixshield.fleet.replica import LockstepReplica
from prefixshield.fleet.routers.base import Router


def _advance_merged(replicas: list[LockstepReplica], ledger: FleetLedger, t: float) -> None:
    """Process, in one time order, every replica's events before an arrival at ``t`` could be
    and the ledger's deliveries due no later than the last of them (``t = inf``: to the end)."""
    limits = [rep.horizon(t) for rep in replicas]
    for rep in replicas:
        rep.jump_settles(t)
    while True:
        best, at = -1, math.inf
        for r, rep in enumerate(replicas):
            e = rep.env.peek()
            if e < limits[r] and e < at:
                best, at = r, e
        if best < 0:
            return
        if ledger.next_due() <= at:
            ledger.deliver_next()
            continue
        rep = replicas[best]
        rep.env.step()
        rep.jump_settles(t)


class _Due:
    """Which replicas have anything to do before an arrival (without a fleet ledger, where a
    replica changes only when advanced or given a request): those whose next event comes
    before it, from a heap of next-event times, and those whose decode jump waits for the
    router (an arrival's time may settle it). Any other replica is already in its state at
    the arrival: advancing it would process nothing. Call `update` after every call that
    may change a replica's queue (advance, deliver)."""

    def __init__(self, replicas: list[LockstepReplica]) -> None:
        self.replicas = replicas
        self.next_t = [math.inf] * len(replicas)
        self.heap: list[tuple[float, int]] = []
        self.jumping: set[int] = set()
        for r in range(len(replicas)):
            self.update(r)

    def update(self, r: int) -> None:
        """Re-read replica ``r``'s next event time and whether a jump of its waits."""
        rep = self.replicas[r]
        at = rep.env.peek()
        self.next_t[r] = at
        if at < math.inf:
            # one entry per change; an entry whose time is no longer the replica's is stale
            heapq.heappush(self.heap, (at, r))
        if rep.jump_waits():
            self.jumping.add(r)
        else:
            self.jumping.discard(r)

    def before(self, t: float) -> list[int]:
        """The replicas to advance before an arrival at ``t`` (each once, ascending), their
        heap entries taken out (`update` puts them back)."""
        heap, next_t = self.heap, self.next_t
        due = set(self.jumping)
        while heap and heap[0][0] < t:
            at, r = heapq.heappop(heap)
            if at == next_t[r]:
                due.add(r)
                next_t[r] = math.nan  # taken: a duplicate entry of the same time is stale
        return sorted(due)


def run_lockstep(replicas: list[LockstepReplica], router: Router,
                 arrival_s: np.ndarray, ledger: FleetLedger | None = None) -> np.ndarray:
    """Route every row of the trace through ``router`` to ``replicas`` (built over the whole
    trace) and run them to the end. Returns the replica of every row (int64). An engine error
    of any replica (a request it can never admit) is raised. ``ledger``: the replicas' policies
    share it (one time order over all replicas, see the module doc); None: each replica is
    advanced on its own, as a single engine."""
    # The loop makes short-lived objects at every step, and each of the collector's full
    # passes would walk every object alive before it (the trace's per-row arrays: millions at
    # 10^6 requests); frozen, they are left out (a 3x10^5-request, 16-replica run: 92 -> 73
    # CPU-us a request). Only when nothing was frozen before: unfreezing would free more.
    freeze = gc.get_freeze_count() == 0
    if freeze:
        gc.collect()
        gc.freeze()
    try:
        return _run(replicas, router, arrival_s, ledger)
    finally:
        if freeze:
            gc.unfreeze()


def _run(replicas: list[LockstepReplica], router: Router, arrival_s: np.ndarray,
         ledger: FleetLedger | None) -> np.ndarray:
    """`run_lockstep`'s loop."""
    n = arrival_s.shape[0]
    assignment = np.empty(n, dtype=np.int64)
    for rep in replicas:
        rep.start()
    views = replicas if router.reads_state else None
    due = _Due(replicas) if ledger is None else None
    for i in range(n):
        t = arrival_s[i]
        if ledger is not None:
            _advance_merged(replicas, ledger, t)
        else:
            for r in due.before(t):
                replicas[r].advance(t)
                due.update(r)
        r = router.route(i, views)
        if not 0 <= r < len(replicas):
            raise RuntimeError(f"router {router.name} chose replica {r} of {len(replicas)}")
        assignment[i] = r
        replicas[r].deliver(i)
        if due is not None:
            due.update(r)
    for rep in replicas:
        rep.close()
    if ledger is not None:
        _advance_merged(replicas, ledger, math.inf)
        ledger.flush()
    for rep in replicas:
        rep.finish()
    return assignment
