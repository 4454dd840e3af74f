"""A fleet-wide PrefixShield ledger: one token bucket per (group, contract) for the whole fleet,
so a group's creation debt follows it to every replica.

What it models. In a real fleet each vLLM engine holds its own PrefixShield buckets (the
per-replica ledger, which needs nothing shared). A fleet-wide ledger needs a shared counter
service (a Redis-like store, or the router): every engine posts each charge ``(group,
contract, blocks, time)`` to it and keeps a local copy of the buckets that the service's
updates reach after a delay (network, batching of the updates, the period of a pull). The
eviction path cannot wait on a remote call (a victim is chosen in microseconds inside the
scheduler step), so the engine always decides on its local copy, and the copy is stale by the
propagation delay. Here every replica keeps its own copy (its policy's buckets): its own
charges apply at once, and a charge another replica made at ``t`` is applied to it at
``t + staleness_s``, metered at that time (``B ← B̂(t + staleness_s) − n``), as a copy
receiving the update then would. With ``staleness_s = 0`` every copy applies every charge at the
time it was made, in the fleet's one time order, so every copy equals the one fleet bucket:
the bucket replayed over all replicas' charges (`replay_balance`; tested). With a
positive staleness a copy's refill cap may round the late charges differently from the fleet
bucket (a charge applied to a full bucket later is not refilled in between), which is what a
late update does to a real copy too.

The charges of one replica affect the others' eviction decisions, so the replicas cannot run
independently: a fleet ledger runs in lockstep mode, in one time order over all replicas'
events and the ledger's deliveries (`prefixshield.fleet.lockstep.run_lockstep`).
"""

from __future__ import annotations

import heapq
import math

import numpy as np

MAX_STALENESS_S = 1e6
"""Largest modelled propagation delay of the shared ledger (seconds)."""

LEDGERS = ("replica", "fleet")
"""Where PrefixShield's buckets live: one set per replica (default) or one for the fleet."""


class FleetLedger:
    """The shared counter of a fleet: a log of every charge and the deliveries still due.

    Args:
        policies: the replicas' PrefixShield policies (replica r's is ``policies[r]``; each is
            linked to this ledger and posts its charges here).
        staleness_s: seconds after which a charge reaches the other replicas' copies (>= 0,
            finite).

    Attributes (the log, one entry per charge, in the order the charges were made):
        t_s, replica, group, contract, blocks: lists of the charge's time (s), the replica that
            made it, its group and contract ids, and its blocks (> 0).
    """

    def __init__(self, policies: list, staleness_s: float = 0.0) -> None:
        if not (math.isfinite(staleness_s) and 0.0 <= staleness_s <= MAX_STALENESS_S):
            raise ValueError(f"ledger staleness must be in [0, {MAX_STALENESS_S:g}] s, "
                             f"got {staleness_s}")
        self.policies = list(policies)
        self.staleness_s = float(staleness_s)
        self.t_s: list[float] = []
        self.replica: list[int] = []
        self.group: list[int] = []
        self.contract: list[int] = []
        self.blocks: list[int] = []
        self._due: list[tuple[float, int]] = []  # (delivery time s, log index), a heap
        for r, p in enumerate(self.policies):
            p.link_ledger(self, r)

    def post(self, replica: int, t: float, group: int, contract: int, n: int) -> None:
        """Replica ``replica`` charged ``n`` blocks to (group, contract) at ``t`` seconds (its
        own buckets already hold it); the others' copies get it at ``t + staleness_s``."""
        k = len(self.t_s)
        self.t_s.append(float(t))
        self.replica.append(int(replica))
        self.group.append(int(group))
        self.contract.append(int(contract))
        self.blocks.append(int(n))
        if len(self.policies) > 1:
            # ties at one delivery time go in the order the charges were made
            heapq.heappush(self._due, (float(t) + self.staleness_s, k))

    def next_due(self) -> float:
        """Delivery time (s) of the earliest charge not yet applied everywhere (inf: none)."""
        return self._due[0][0] if self._due else math.inf

    def deliver_next(self) -> None:
        """Apply the earliest due charge to every replica's copy but its maker's, at its
        delivery time."""
        at, k = heapq.heappop(self._due)
        origin = self.replica[k]
        for r, p in enumerate(self.policies):
            if r != origin:
                p.remote_charge(self.group[k], self.contract[k], self.blocks[k], at)

    def flush(self) -> None:
        """Apply every charge still due (at the end of a run: the copies then hold them all)."""
        while self._due:
            self.deliver_next()

    def log(self) -> dict[str, np.ndarray]:
        """The charges as arrays: ``t_s`` (float64), ``replica``, ``group``, ``contract``,
        ``blocks`` (int64), in the order they were made."""
        return {"t_s": np.array(self.t_s, dtype=np.float64),
                "replica": np.array(self.replica, dtype=np.int64),
                "group": np.array(self.group, dtype=np.int64),
                "contract": np.array(self.contract, dtype=np.int64),
                "blocks": np.array(self.blocks, dtype=np.int64)}


def replay_balance(t_s: np.ndarray, blocks: np.ndarray, rho: float,
                   beta: float) -> tuple[float, float]:
    """The token bucket ``(B blocks, t0 s)`` of one (group, contract) after the charges
    ``blocks`` made at ``t_s`` (in that order) from a full bucket: ``B ← min(beta, B + rho ·
    max(0, t − t0)) − n; t0 ← t``, the same floating-point operations as the policy's kernel.
    Applied to a fleet's log at zero staleness it is the one fleet bucket: the sum of what every
    replica charged, less the refill."""
    bal, t0 = float(beta), 0.0
    for t, n in zip(t_s.tolist(), blocks.tolist()):
        dt = t - t0
        if dt < 0.0:
            dt = 0.0
        v = bal + rho * dt
        bal = (beta if beta < v else v) - n
        t0 = t
    return bal, t0
