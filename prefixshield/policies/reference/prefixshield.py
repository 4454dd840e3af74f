"""PrefixShield in plain Python, straight from its formulas: the executable spec.

Readable over fast: every victim scans all candidates. The numba policy
(`prefixshield.policies.prefixshield.PrefixShieldPolicy`) must make the same decisions in
the same order; the differential tests hold the two together. Interpretations of the spec are the
ones listed in that module's docstring; they are repeated here where they act.

Units: blocks and seconds. Not registered in the policy registry (it is a test oracle).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

import numpy as np

from prefixshield.policies.base import Policy
from prefixshield.tenancy import Contract

PROBATIONARY, NORMAL, REUSE = 0, 1, 2


class ReferencePrefixShield(Policy):
    """Pure-Python PrefixShield with the same interface and flags as the numba policy.

    Args: as `PrefixShieldPolicy` (``vllm_compat``,
    ``segmentation``, ``debt_gate``, ``responsibility``, ``epsilon`` blocks, ``history_factor``,
    ``admission``, ``charge_decode``, ``prefix_source``).
    """

    name = "prefixshield_reference"

    def __init__(self, num_blocks: int, vllm_compat: str = "current", *,
                 segmentation: bool = True, debt_gate: bool = True, responsibility: bool = True,
                 epsilon: float = 1e-9, history_factor: float = 4.0,
                 admission: str = "request", charge_decode: bool = True,
                 prefix_source: str = "root") -> None:
        super().__init__(num_blocks, vllm_compat)
        if admission not in ("request", "call"):
            raise ValueError(f"admission must be 'request' or 'call', got {admission!r}")
        if prefix_source not in ("root", "declared", "tenant"):
            raise ValueError(f"unknown prefix_source {prefix_source!r}")
        self.admission = admission
        self.charge_decode = charge_decode
        self.prefix_source = prefix_source
        self.request_class: dict[int, int] = {}   # admitted running request -> its class
        self.segmentation = segmentation
        self.debt_gate = debt_gate
        self.responsibility = responsibility
        self.epsilon = epsilon
        self.history_capacity = max(1, int(history_factor * num_blocks))
        self.history: OrderedDict[tuple[int, int], None] = OrderedDict()  # LRU first
        self.clock = 0.0
        self.stamp = 0                      # native order: stamp of the latest release
        self.truly_free: list[int] = list(range(1, num_blocks))   # in reuse order
        self.candidates: dict[int, int] = {}                      # free cached block -> stamp
        self.meta: dict[int, dict] = {}     # cached block -> owner, contract, prefix, klass, ...

    def bind_tenants(self, groups: Sequence[str], contracts: Sequence[Contract]) -> None:
        """Groups and contracts; every bucket starts full (``B = beta_c`` at ``t0 = 0``) and the
        admission history starts empty."""
        super().bind_tenants(groups, contracts)
        self.history.clear()
        G, C = len(self.groups), len(self.contracts)
        self.rho = [c.rho_blocks_per_s for c in self.contracts]
        self.beta = [c.beta_blocks for c in self.contracts]
        rho_min = min(self.rho)
        self.w = [r / rho_min for r in self.rho]
        self.B = [[self.beta[c] for c in range(C)] for _ in range(G)]
        self.t0 = [[0.0] * C for _ in range(G)]
        self.charged = [[0] * C for _ in range(G)]
        self.uncharged = [0] * G
        self.request_class.clear()
        self.granted = [0] * G
        self.gated = [0] * G
        self.evictions = [[0] * (G + 1) for _ in range(G)]

    # ------------------------------------------------------------------ formulas
    def effective_balance(self, g: int, c: int, t: float) -> float:
        """``B̂_{g,c}(t) = min(beta_c, B + rho_c · (t − t0))``, with ``t − t0`` clamped at 0."""
        return min(self.beta[c], self.B[g][c] + self.rho[c] * max(0.0, t - self.t0[g][c]))

    def debt(self, g: int, t: float) -> float:
        """``D_g(t) = Σ_c max(0, −B̂_{g,c}(t))``."""
        d = 0.0
        for c in range(len(self.contracts)):
            x = -self.effective_balance(g, c, t)
            if x > 0.0:
                d += x
        return d

    def normalized_debt(self, g: int, t: float) -> tuple[float, float]:
        """``(D̃_g(t), W_g(t))``; indebted contract = ``B̂_{g,c}(t) < 0``."""
        d, wmax = 0.0, 0.0
        for c in range(len(self.contracts)):
            x = -self.effective_balance(g, c, t)
            if x > 0.0:
                d += x / self.w[c]
                wmax = max(wmax, self.w[c])
        return d, wmax

    def _class_of(self, b: int) -> int:
        return self.meta[b]["klass"] if b in self.meta else PROBATIONARY

    def _order_key(self, b: int) -> tuple[int, int]:
        """Eviction order among candidates: class (PROBATIONARY first), then oldest release."""
        return (self._class_of(b), self.candidates[b])

    # ------------------------------------------------------------------ events
    def prefix_key(self, prefix_id, root) -> int:
        """The logical prefix: the root key (as int64 bits), the declared id, or 0 per group."""
        if self.prefix_source == "root" and root is not None:
            root = int(root)
            return root - (1 << 64) if root >= (1 << 63) else root
        return int(prefix_id) if self.prefix_source != "tenant" else 0

    def on_materialize(self, blocks, hashes, group, contract, prefix_id, now, *, request_id=-1,
                       root=None, num_decode=0) -> None:
        """Charge the blocks (decode blocks only with ``charge_decode``); the request's first
        call is its admission, which decides the class of every block it materializes."""
        self.clock = max(self.clock, now)
        n = len(blocks)
        if n == 0:
            return
        g, c = group, contract
        pid = self.prefix_key(prefix_id, root)
        free = 0 if self.charge_decode else min(max(int(num_decode), 0), n)
        if n - free > 0:
            self.B[g][c] = self.effective_balance(g, c, now) - (n - free)
            self.t0[g][c] = now
            self.charged[g][c] += n - free
        self.uncharged[g] += free
        per_request = self.admission == "request" and request_id >= 0
        if per_request and request_id in self.request_class:
            klass = self.request_class[request_id]
        else:
            key = (g, pid)
            first = key not in self.history
            self.history[key] = None
            self.history.move_to_end(key)
            if len(self.history) > self.history_capacity:
                self.history.popitem(last=False)
            if not self.segmentation:
                klass = NORMAL
            elif self.B[g][c] < -self.epsilon or first:
                klass = PROBATIONARY
            else:
                klass = NORMAL
            if per_request:
                self.request_class[request_id] = klass
        for b in blocks:
            self.meta[int(b)] = dict(owner=g, contract=c, prefix=pid, klass=klass,
                                     hits=0, last_access=now)

    def on_request_finished(self, request_id) -> None:
        """Forget the request's admission."""
        self.request_class.pop(request_id, None)

    def on_hit(self, blocks, group, contract, prefix_id, now, *, root=None) -> None:
        """Reuse evidence for every hit block; eligible ones promoted iff ``D_g(now) ≤ ε``."""
        self.clock = max(self.clock, now)
        prefix_id = self.prefix_key(prefix_id, root)
        debt = self.debt(group, now)
        gate_open = (not self.debt_gate) or debt <= self.epsilon
        for b in map(int, blocks):
            if b not in self.meta:
                continue
            m = self.meta[b]
            m["hits"] += 1
            m["last_access"] = now
            eligible = (m["owner"], m["contract"], m["prefix"]) == (group, contract, prefix_id)
            if self.segmentation and eligible and m["klass"] != REUSE:
                if gate_open:
                    m["klass"] = REUSE
                    self.granted[group] += 1
                else:
                    self.gated[group] += 1
            if b in self.candidates:  # a hit free candidate becomes the most recent of its class
                self.stamp += 1
                self.candidates[b] = self.stamp

    def on_release(self, blocks, cached, now) -> None:
        """Cached blocks become candidates (newest stamp); the others become truly free."""
        self.clock = max(self.clock, now)
        newly_free = []
        for b, is_cached in zip(map(int, blocks), cached):
            self.stamp += 1
            if is_cached:
                if b not in self.meta:  # hashed but never materialized here: no owner
                    self.meta[b] = dict(owner=-1, contract=-1, prefix=-1,
                                        klass=PROBATIONARY if self.segmentation else NORMAL,
                                        hits=0, last_access=0.0)
                self.candidates[b] = self.stamp
            else:
                self.meta.pop(b, None)
                newly_free.append(b)
        if self.vllm_compat == "current":
            self.truly_free[0:0] = newly_free
        else:
            self.truly_free.extend(newly_free)

    def on_acquire(self, blocks) -> None:
        """Hit candidates leave the free set."""
        for b in map(int, blocks):
            del self.candidates[b]

    def select_victims(self, n, now, requester) -> np.ndarray:
        """Truly free blocks first; then the design's reclamation, scanning all candidates."""
        self.clock = max(self.clock, now)
        if n > self.num_free():
            raise ValueError(f"cannot select {n} victims: {self.num_free()} free blocks")
        out = []
        while len(out) < n and self.truly_free:
            out.append(self.truly_free.pop(0))
        m = n - len(out)
        if m == 0:
            return np.asarray(out, dtype=np.int32)
        G = len(self.groups)
        P, W = [0.0] * G, [0.0] * G
        for g in {self.meta[b]["owner"] for b in self.candidates} - {-1}:
            P[g], W[g] = self.normalized_debt(g, now)
        for _ in range(m):
            victim = None
            if self.responsibility:
                best_of: dict[int, int] = {}   # group -> its first candidate
                for b in self.candidates:
                    g = self.meta[b]["owner"]
                    if g >= 0 and P[g] > self.epsilon:
                        if g not in best_of or self._order_key(b) < self._order_key(best_of[g]):
                            best_of[g] = b
                if best_of:
                    g_star = min(best_of, key=lambda g: (-P[g], *self._order_key(best_of[g])))
                    victim = best_of[g_star]
                    P[g_star] -= 1.0 / W[g_star]
            if victim is None:
                victim = min(self.candidates, key=self._order_key)
            del self.candidates[victim]
            owner = self.meta.pop(victim)["owner"]
            self.evictions[requester][owner if owner >= 0 else G] += 1
            out.append(victim)
        return np.asarray(out, dtype=np.int32)

    # ------------------------------------------------------------------ views
    def num_free(self) -> int:
        """Truly free plus cached candidates."""
        return len(self.truly_free) + len(self.candidates)

    def free_order(self) -> np.ndarray:
        """Order of a dry-run selection of every free block at the latest clock seen."""
        saved = (list(self.truly_free), dict(self.candidates),
                 {b: dict(m) for b, m in self.meta.items()},
                 [row[:] for row in self.evictions] if self.groups else None)
        try:
            if not self.groups and self.candidates:
                raise RuntimeError("bind_tenants first")
            if not self.groups:
                return np.asarray(self.truly_free, dtype=np.int32)
            return self.select_victims(self.num_free(), self.clock, 0)
        finally:
            self.truly_free, self.candidates, self.meta, ev = saved
            if ev is not None:
                self.evictions = ev

    def block_class(self, b: int) -> int | None:
        """Retention class of cached block b, or None if b holds no cached content."""
        return self.meta[b]["klass"] if b in self.meta else None
