"""Lockstep mode: every replica in one loop, each advanced up to an arrival before the router
decides where it goes.

Each replica keeps its own SimPy environment (a :class:`~prefixshield.fleet.replica.
LockstepReplica`); for each request in arrival order the loop (1) advances every replica
through its events that come before the arrival, (2) asks the router, which reads the replicas
as they are at that instant, (3) delivers the request to the chosen replica. Replicas never
interact except through the router, so one environment each (instead of one shared) keeps every
replica's event order exactly a single engine's (see :mod:`prefixshield.fleet.slots`).
"""

from __future__ import annotations

import numpy as np

from prefixshield.fleet.replica import LockstepReplica
from prefixshield.fleet.routers.base import Router


def run_lockstep(replicas: list[LockstepReplica], router: Router,
                 arrival_s: np.ndarray) -> np.ndarray:
    """Route every row of the trace through ``router`` to ``replicas`` (built over the whole
    trace) and run them to the end. Returns the replica of every row (int64). An engine error
    of any replica (a request it can never admit) is raised."""
    n = arrival_s.shape[0]
    assignment = np.empty(n, dtype=np.int64)
    for rep in replicas:
        rep.start()
    views = replicas if router.reads_state else None
    for i in range(n):
        t = arrival_s[i]
        for rep in replicas:
            rep.advance(t)
        r = router.route(i, views)
        if not 0 <= r < len(replicas):
            raise RuntimeError(f"router {router.name} chose replica {r} of {len(replicas)}")
        assignment[i] = r
        replicas[r].deliver(i)
    for rep in replicas:
        rep.close()
    for rep in replicas:
        rep.finish()
    return assignment
