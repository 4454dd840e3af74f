"""PrefixShield: meter who *creates* KV state and make that group bear reclamation.

Per (group, contract) a token bucket ``(B, t0)``, initialised full (``B = beta_c``), refilled lazily
on the accounting clock: ``B̂(t) = min(beta_c, B + rho_c·(t − t0))``. A request that materializes
``n_r`` new full blocks is charged ``B ← B̂(t) − n_r; t0 ← t`` (hits never charge; the balance
may go arbitrarily negative; eviction never repays). From the buckets:

* raw debt ``D_g(t) = Σ_c max(0, −B̂_{g,c}(t))`` (blocks; summed over contracts, so relabelling
  the contract cannot launder debt);
* weights ``w_c = rho_c / rho_min``; normalized debt ``D̃_g(t) = Σ_c max(0, −B̂_{g,c}(t)) / w_c``;
  ``W_g(t)`` = max ``w_c`` over the contracts with ``B̂_{g,c}(t) < 0``.

Each cached block carries a retention class ``PROBATIONARY < NORMAL < REUSE`` (eviction order).
An *admission* of ``(g, prefix)`` is a request of g that materializes at least one block; its
new blocks are PROBATIONARY if its charge left ``B_{g,c} < −ε`` or it is the first admission of
``(g, prefix)``, NORMAL otherwise (decided once per request; the logical prefix is an input,
see ``prefix_source`` below). A hit whose request (group, contract, prefix_id) equals the
block's (owner, contract, prefix_id) promotes it to REUSE only if ``D_g(t) ≤ ε`` (the debt gate,
invariant I2); otherwise a *gated promotion* is counted.

Reclamation happens only when no truly free block is left (work conservation): for ``m`` victims
at ``t``, ``P_g = D̃_g(t)``; while a group with a candidate has ``P_g > ε``, the largest ``P_g``
(ties: lowest class of its best candidate, then oldest) gives its first candidate (class order,
then native free order) and ``P_g -= 1/W_g(t)``; otherwise the first candidate globally.

Implementation: per-(group, class) intrusive LRU lists, global per-class lists and a heap over the
indebted groups, all in one packed buffer of numpy arrays (narrow dtypes, bounds stated in the
kernels module) driven by the numba kernels of
`prefixshield.policies.kernels.prefixshield_kernels` (one kernel call per event, passing the
buffer; a victim costs O(log G) plus, for several victims, a pass over the groups that may
owe; one victim walks a max tree of the groups' debt bounds instead). The pure-Python
executable spec is `prefixshield.policies.reference.prefixshield.ReferencePrefixShield`;
the two agree decision for decision (tests/policies/test_prefixshield_random.py). The pure cache
driver's loop also runs as one kernel (`PrefixShieldPolicy.replay_keys`, held to the
per-call path in tests/policies/test_prefixshield_replay.py).

Interpretations of the spec, stated once here:

* admission is per *request* (``admission="request"``, the default): the pool names the request
  a materialization belongs to (``request_id``), and the request's first call that materializes
  a block is its admission: the first-admission test, the history refresh and the initial class
  are decided there, once; every block the request materializes later (further prefill chunks,
  decode blocks, blocks recomputed after a preemption) takes that class, whatever the bucket
  says by then. The charge is metered as the blocks materialize (a chunked prompt is charged
  chunk by chunk, each charge ``B ← B̂(t) − n``; the request's charges add up to ``n_r``), so a
  block is charged exactly once, when it is created, and the debt a later hit meets is the debt
  of the blocks created so far. The pool forgets the request at its end
  (`on_request_finished`). ``admission="call"`` is the other reading: every call is an
  admission (a request's later chunks and decode blocks then find ``(g, prefix_id)`` admitted
  and start NORMAL if funded). A call without a request id is its own request;
* decode blocks are charged (``charge_decode=True``): the design charges "every newly
  materialized full block ... exactly once" (I1), and a decode block that fills is cached and
  owned like a prompt block. ``charge_decode=False`` is the other reading ("a block computed
  because lookup missed it": prompt blocks only); the blocks are still labelled, and I1 then
  reads ``charged + uncharged decode blocks == materialized``;
* the *logical prefix* is a policy input, ``prefix_source``: ``"root"`` (default) is the
  request's root, the content key of its first full block (the chained hash, so it names the
  group and the whole first block; a server computes it without the client's help, and live
  mode takes the same key from vLLM's block hashes); ``"declared"`` is the trace's
  ``prefix_id`` (an id the client declares: a system prompt, a conversation); ``"tenant"``
  makes every request of a group the same prefix. A caller that passes no root (the pure cache
  driver's per-key calls, direct calls) gets the declared id under ``"root"``;
* hits are evaluated where the pool reports them, before the request's own new blocks are
  cached (vLLM's ``allocate_slots`` touches the hits, then caches the new blocks): the gate
  reads the debt metered so far;
* the admission history is one LRU set of ``(group, prefix_id)`` pairs over all groups, holding
  at most ``max(1, int(history_factor × num_blocks))`` entries; an admission refreshes its entry,
  hits do not;
* "currently indebted contract" means ``B̂_{g,c}(t) < 0`` (so ``W_g`` is defined whenever
  ``D̃_g > 0``);
* a promotion is counted only when a block actually changes class to REUSE; a gated promotion only
  for an eligible block not already in REUSE;
* a free candidate that is hit moves to the most recent end of its class (its recency stamp is
  refreshed); under the block pool a free hit block is acquired right after, so this only matters
  to direct callers;
* ``segmentation=False`` puts every cached block in one class (stored as NORMAL) and performs no
  promotions; ``responsibility=False`` skips group selection; ``debt_gate=False`` promotes every
  eligible block (``promotions_in_debt`` then counts the promotions the gate would have refused);
* a clock that steps back refills nothing (``t − t0`` is clamped at 0); truly free blocks are
  reused in vLLM's order for the compat mode (unhashed blocks to the head in ``"current"``, to the
  tail in ``"0.10"``); a hashed block released without ever being materialized (no owner) is a
  PROBATIONARY candidate of no group, reclaimed only by the global fallback.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from prefixshield.policies.base import FusedArrays, Policy, register_policy
from prefixshield.policies.kernels import prefixshield_kernels as K
from prefixshield.policies.kernels.hashtable import new_table, table_bits
from prefixshield.policies.kernels.linkedlist import list_to_array
from prefixshield.policies.kernels.packed import Packed, entry_point
from prefixshield.tenancy import Contract

PROBATIONARY = K.PROBATIONARY
NORMAL = K.NORMAL
REUSE = K.REUSE
CLASS_NAMES = ("probationary", "normal", "reuse")
"""Retention classes by value; the eviction order is ascending."""

class DebtLog:
    """Bounded series of ``(t s, group, D_g blocks, cached blocks per group and class)``
    samples, one per charge.

    Keeps the samples of charges ``0, stride, 2·stride, ...`` (counting every charge), at most
    ``max_samples`` of them: when full, ``stride`` doubles and every second sample is dropped, so
    the series stays evenly spread over the whole run. ``max_samples=0`` records nothing.
    ``num_classes_per_sample`` is the size of the class snapshot each sample carries (groups x
    classes; 0: none).
    """

    def __init__(self, max_samples: int, num_classes_per_sample: int = 0) -> None:
        if max_samples < 0:
            raise ValueError(f"max_debt_samples must be >= 0, got {max_samples}")
        self.max_samples = int(max_samples)
        cap = min(self.max_samples, 1024)
        self.t = np.empty(cap, dtype=np.float64)
        self.group = np.empty(cap, dtype=np.int32)
        self.debt = np.empty(cap, dtype=np.float64)
        self.classes = np.empty((cap, int(num_classes_per_sample)), dtype=np.int64)
        self.size = 0
        self.stride = 1
        self.num_charges = 0

    def append(self, t: float, group: int, debt: float,
               classes: np.ndarray | None = None) -> None:
        """Count one charge and record its sample if its index is a multiple of the stride
        (``classes``: the class snapshot, flattened to ``num_classes_per_sample`` counts)."""
        i = self.num_charges
        self.num_charges += 1
        if self.max_samples == 0 or i % self.stride:
            return
        if self.size == self.t.shape[0]:
            if self.size < self.max_samples:
                cap = min(self.max_samples, 2 * self.size)
                self.t = np.resize(self.t, cap)
                self.group = np.resize(self.group, cap)
                self.debt = np.resize(self.debt, cap)
                self.classes = np.resize(self.classes, (cap, self.classes.shape[1]))
            else:
                keep = (self.size + 1) // 2
                for arr in (self.t, self.group, self.debt, self.classes):
                    arr[:keep] = arr[0:self.size:2]
                self.size = keep
                self.stride *= 2
                if i % self.stride:
                    return
        self.t[self.size] = t
        self.group[self.size] = group
        self.debt[self.size] = debt
        if classes is not None:
            self.classes[self.size] = classes.reshape(-1)
        self.size += 1

    def reserve(self, appends: int) -> None:
        """Make room for ``appends`` more samples without growing (for the batch replay kernel,
        which appends in place: its arrays then hold ``min(max_samples, size + appends)``
        rows, so "full" still means ``max_samples``)."""
        cap = min(self.max_samples, max(self.t.shape[0], self.size + int(appends)))
        if cap > self.t.shape[0]:
            self.t = np.resize(self.t, cap)
            self.group = np.resize(self.group, cap)
            self.debt = np.resize(self.debt, cap)
            self.classes = np.resize(self.classes, (cap, self.classes.shape[1]))

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Copies of (t seconds, group id, raw debt blocks)."""
        n = self.size
        return self.t[:n].copy(), self.group[:n].copy(), self.debt[:n].copy()

    def class_samples(self) -> np.ndarray:
        """Copy of the class snapshots, ``[samples, num_classes_per_sample]``."""
        return self.classes[:self.size].copy()


ADMISSION_MODES = ("request", "call")
"""Readings of "an admission": once per request (default) or once per materialization call."""
PREFIX_SOURCES = {"root": K.PREFIX_ROOT, "declared": K.PREFIX_DECLARED, "tenant": K.PREFIX_TENANT}
"""Where the logical prefix comes from (``prefix_source``) -> the kernels' code."""


def signed_key(root) -> int:
    """A uint64 content key as the int64 with the same bits (the kernels' ``prefix`` field)."""
    root = int(root)
    return root - (1 << 64) if root >= (1 << 63) else root


MAX_HISTORY_FACTOR = 64.0
"""Largest admission-history size in entries per configured block (the history is per-block
state; beyond this it is a memory mistake, not a setting)."""


@register_policy
class PrefixShieldPolicy(Policy):
    """PrefixShield (see the module docstring for the algorithm and every interpretation).

    Args:
        num_blocks: configured blocks, null block included.
        vllm_compat: order of truly free blocks (``"current"``: freed unhashed blocks are reused
            first; ``"0.10"``: they queue at the tail). Cached candidates are unaffected.
        segmentation: keep retention classes (False: one class, plain LRU within a group).
        debt_gate: refuse promotions while the group owes (False: promote every eligible block).
        responsibility: select the most indebted group first (False: class order then LRU).
        epsilon: debt tolerance ε in blocks (>= 0) for "debt cleared" and ``P_g > ε``.
        history_factor: admission-history capacity in entries per configured block: the LRU set
            holds ``max(1, int(history_factor * num_blocks))`` ``(group, prefix_id)`` pairs.
        max_debt_samples: bound of the debt-over-time series (see `DebtLog`).
        rho_scale: multiplies every bound contract's refill rate ``rho`` (the policy's view of
            the entitlement; bursts, the trace and the engine's creation meter are unchanged).
            1.0: the contracts as stated. For sweeps of "how generous is the refill".
        admission: ``"request"`` (a request is admitted once, at its first materialization) or
            ``"call"`` (every materialization call is an admission); see the module docstring.
        charge_decode: charge decode blocks (True) or only prompt blocks (False).
        prefix_source: the logical prefix: ``"root"`` (the request's first full block),
            ``"declared"`` (the trace's ``prefix_id``) or ``"tenant"`` (one per group).
    """

    name = "prefixshield"

    _ledger = None
    """A fleet-wide ledger this replica's charges are posted to (`link_ledger`); None:
    the buckets are this policy's own (a copy or pickle is never linked)."""
    _replica = 0

    def __init__(self, num_blocks: int, vllm_compat: str = "current", *,
                 segmentation: bool = True, debt_gate: bool = True, responsibility: bool = True,
                 epsilon: float = 1e-9, history_factor: float = 4.0,
                 max_debt_samples: int = 16384, rho_scale: float = 1.0,
                 admission: str = "request", charge_decode: bool = True,
                 prefix_source: str = "root") -> None:
        super().__init__(num_blocks, vllm_compat)
        if admission not in ADMISSION_MODES:
            raise ValueError(f"admission must be one of {ADMISSION_MODES}, got {admission!r}")
        if prefix_source not in PREFIX_SOURCES:
            raise ValueError(f"prefix_source must be one of {tuple(PREFIX_SOURCES)}, got "
                             f"{prefix_source!r}")
        self.admission = admission
        self.charge_decode = bool(charge_decode)
        self.prefix_source = prefix_source
        self._source = PREFIX_SOURCES[prefix_source]
        self._requests: dict[int, int] = {}
        """Admitted requests still running: request id -> the class of its blocks."""
        if not (math.isfinite(rho_scale) and rho_scale > 0):
            raise ValueError(f"rho_scale must be a finite number > 0, got {rho_scale}")
        if not epsilon >= 0:
            raise ValueError(f"epsilon must be >= 0 blocks, got {epsilon}")
        if not 0 < history_factor <= MAX_HISTORY_FACTOR:
            raise ValueError(f"history_factor must be in (0, {MAX_HISTORY_FACTOR:g}] entries per "
                             f"block, got {history_factor}")
        self.segmentation = bool(segmentation)
        self.debt_gate = bool(debt_gate)
        self.responsibility = bool(responsibility)
        self.epsilon = float(epsilon)
        self.rho_scale = float(rho_scale)
        self.history_factor = float(history_factor)
        self.history_capacity = max(1, int(history_factor * self.num_blocks))
        self.max_debt_samples = int(max_debt_samples)
        self.debt_log = DebtLog(self.max_debt_samples)
        self._bound = False
        self._build(0, [])

    def _build(self, G: int, contracts: Sequence[Contract]) -> None:
        """(Re)build the packed state for ``G`` groups and ``contracts``: buckets full, counters,
        history and group lists empty; per-block state and the global lists kept (all blocks but
        the null block start truly free)."""
        if G > K.MAX_GROUPS or len(contracts) > K.MAX_CONTRACTS:
            raise ValueError(f"prefixshield supports at most {K.MAX_GROUPS} groups and "
                             f"{K.MAX_CONTRACTS} contracts, got {G} and {len(contracts)}")
        N, C, H = self.num_blocks, len(contracts), self.history_capacity
        old = getattr(self, "_packed", None)
        self._layout = (N, G, C, H, K.history_bits(H))
        self._attach(None)
        a = self._packed.arrays
        ctl = a["ctl"]
        ctl[[K.C_N, K.C_G, K.C_C, K.C_H, K.C_HBITS]] = self._layout
        ctl[K.C_SEGMENTATION] = self.segmentation
        ctl[K.C_DEBT_GATE] = self.debt_gate
        ctl[K.C_RESPONSIBILITY] = self.responsibility
        ctl[K.C_TF_TO_HEAD] = self.vllm_compat == "current"
        ctl[K.C_PER_CALL] = self.admission == "call"
        ctl[K.C_CHARGE_DECODE] = self.charge_decode
        ctl[K.C_PREFIX_SOURCE] = self._source
        a["fctl"][K.F_EPSILON] = self.epsilon
        a["fctl"][K.F_PRUNE_CLOCK] = -np.inf
        a["fctl"][K.F_CLOCK] = old.arrays["fctl"][K.F_CLOCK] if old is not None else 0.0
        for name in ("gprev", "gnxt", "qprev", "qnxt"):
            a[name][:] = -1
        a["dpos"][:] = -1
        if old is None:
            a["owner"][:] = -1
            a["contract"][:] = -1
            a["prefix"][:] = -1
            a["gmember"][:] = -1
            # the global lists: classes 0..2 empty, truly free = 1 .. N-1 in order
            for k in range(K.NUM_GLOBAL_LISTS):
                a["gnxt"][N + 2 * k] = N + 2 * k + 1
                a["gprev"][N + 2 * k + 1] = N + 2 * k
            chain = np.concatenate(([N + 2 * K.TRULY_FREE], np.arange(1, N),
                                    [N + 2 * K.TRULY_FREE + 1])).astype(np.int32)
            a["gnxt"][chain[:-1]] = chain[1:]
            a["gprev"][chain[1:]] = chain[:-1]
            a["gmember"][1:] = K.TRULY_FREE
            a["glen"][K.TRULY_FREE] = N - 1
        else:
            for name in K.PER_BLOCK:  # per-block fields and the global lists survive
                a[name][...] = old.arrays[name]
            ctl[K.C_SEQ] = old.arrays["ctl"][K.C_SEQ]
        for lst in range(K.NUM_CLASSES * G):
            a["qnxt"][N + 2 * lst] = N + 2 * lst + 1
            a["qprev"][N + 2 * lst + 1] = N + 2 * lst
        a["hnxt"][H] = H + 1
        a["hprev"][H + 1] = H
        self.rho[:] = [c.rho_blocks_per_s * self.rho_scale for c in contracts]
        self.beta[:] = [c.beta_blocks for c in contracts]
        if C:
            self.weight[:] = self.rho / self.rho.min()
        self.balance[:] = self.beta
        self.debt_log = DebtLog(self.max_debt_samples, G * K.NUM_CLASSES)
        self._connect_select()

    def _attach(self, buffer: np.ndarray | None) -> None:
        """Views, addresses and the selection entry over packed state ``buffer`` (None: a new,
        zeroed one) of layout ``self._layout``."""
        self._packed = packed = Packed(K.layout(*self._layout), buffer)
        self._state = packed.buffer
        self._history_start = min(packed.offsets[f] for f in K.HISTORY_FIELDS)
        for name, attr in K.VIEWS:
            setattr(self, attr, packed.arrays[name])
        # the selection fast path: scalar arguments only (see select_victims); the addresses
        # are of arrays this object holds
        self._new_chunk(0)
        self._state_addr = self._state.ctypes.data
        self._state_nbytes = self._state.shape[0]
        if self._ctl[K.C_N] == self.num_blocks:  # sizes written (else _build connects it)
            self._connect_select()

    def _connect_select(self) -> None:
        self._select_at = entry_point(K.select_at, self._state_addr, self._state_nbytes, 0,
                                      0.0, 0, self._out_addr, 0)

    def __getstate__(self) -> dict:
        """Pickle/deepcopy: the buffer and the plain attributes (views, addresses and the
        compiled entry are rebuilt over the copy's own buffer)."""
        derived = {attr for _, attr in K.VIEWS} | {
            "_packed", "_state_addr", "_state_nbytes", "_select_at", "_out", "_out_addr",
            "_out_off", "_history_start", "_ledger", "_replica"}
        return {k: v for k, v in self.__dict__.items() if k not in derived}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._attach(self._state)

    def bind_tenants(self, groups: Sequence[str], contracts: Sequence[Contract]) -> None:
        """Name the groups and contracts and size the per-group state: buckets start full.

        Must be called before any block is cached; rebinding resets all accounting (buckets,
        counters, admission history, debt series)."""
        if np.any(self.cached):
            raise RuntimeError("bind_tenants after blocks were cached would orphan their owners")
        if len(contracts) == 0:
            raise ValueError("prefixshield needs at least one contract")
        super().bind_tenants(groups, contracts)
        self._requests.clear()
        self._build(len(self.groups), self.contracts)
        self._bound = True

    # ------------------------------------------------------------------ helpers
    def _check(self, group: int, contract: int | None = None) -> None:
        if not self._bound:
            raise RuntimeError("prefixshield: call bind_tenants(groups, contracts) first")
        if not 0 <= group < len(self.groups):
            raise ValueError(f"group id {group} out of range: {len(self.groups)} groups bound")
        if contract is not None and not 0 <= contract < len(self.contracts):
            raise ValueError(f"contract id {contract} out of range: "
                             f"{len(self.contracts)} contracts bound")

    @property
    def _now(self) -> float:
        """Latest clock seen (s)."""
        return float(self._fctl[K.F_CLOCK])

    def _tick(self, now: float) -> float:
        now = float(now)
        if now > self._fctl[K.F_CLOCK]:
            self._fctl[K.F_CLOCK] = now
        return now

    # ------------------------------------------------------------------ Policy interface
    def prefix_key(self, prefix_id: int, root=None) -> int:
        """The logical prefix this policy uses for a request with declared ``prefix_id`` and
        root content key ``root`` (uint64, None: not known): see ``prefix_source``."""
        if self._source == K.PREFIX_ROOT:
            return int(prefix_id) if root is None else signed_key(root)
        if self._source == K.PREFIX_DECLARED:
            return int(prefix_id)
        return 0

    def on_materialize(self, blocks: np.ndarray, hashes: np.ndarray, group: int, contract: int,
                       prefix_id: int, now: float, *, request_id: int = -1, root=None,
                       num_decode: int = 0) -> None:
        """Meter ``len(blocks)`` new full blocks of request ``request_id`` (the last
        ``num_decode`` of them decode blocks) to bucket (group, contract) at ``now`` seconds and
        give the blocks owner, contract, logical prefix and class (one kernel call). The
        request's first such call is its admission (module docstring); ``request_id < 0``: the
        call is a request of its own."""
        self._check(group, contract)
        now = self._tick(now)
        if len(blocks) == 0:
            return
        blocks = np.asarray(blocks, dtype=np.int32)
        known = request_id >= 0 and self.admission == "request"
        k_req = self._requests.get(request_id, K.NO_CLASS) if known else K.NO_CLASS
        d, bad, k = K.materialize(self._state, blocks, group, contract,
                                  self.prefix_key(prefix_id, root), now, k_req, int(num_decode))
        if bad >= 0:
            raise ValueError(f"on_materialize: block {int(blocks[bad])} is free or not a block id "
                             f"(materialized blocks must be in use); nothing was charged")
        if known and k_req == K.NO_CLASS:
            self._requests[request_id] = int(k)
        self.debt_log.append(now, group, d, self.class_count)
        if self._ledger is not None:
            # what _materialize charged: every block, or the prompt blocks alone
            free = 0 if self.charge_decode else min(max(int(num_decode), 0), len(blocks))
            if len(blocks) > free:
                self._ledger.post(self._replica, now, group, contract, len(blocks) - free)

    def link_ledger(self, ledger, replica: int) -> None:
        """Share the buckets of a fleet: every charge this policy makes is posted to
        ``ledger`` (a `prefixshield.fleet.ledger.FleetLedger`) as ``replica``'s, which
        applies it to the other replicas' buckets (`remote_charge`)."""
        self._ledger = ledger
        self._replica = int(replica)

    def remote_charge(self, group: int, contract: int, n: int, now: float) -> None:
        """Take ``n > 0`` blocks from bucket (group, contract) at ``now`` seconds for a charge
        another replica of a fleet-wide ledger made (the balance, debt and reclamation order
        change as after a charge of this policy's own; the ``charged_blocks`` counts and the
        debt log keep this policy's own charges only)."""
        self._check(group, contract)
        if n <= 0:
            raise ValueError(f"remote_charge: n must be > 0 blocks, got {n}")
        K.remote_charge(self._state, int(n), group, contract, self._tick(now))

    def on_request_finished(self, request_id: int) -> None:
        """Request ``request_id`` ended: forget its admission."""
        self._requests.pop(request_id, None)

    def on_hit(self, blocks: np.ndarray, group: int, contract: int, prefix_id: int,
               now: float, *, root=None) -> None:
        """Record reuse evidence for ``blocks`` and promote eligible ones (the request's
        logical prefix is the blocks' one) if ``D_g(now) ≤ ε`` (one kernel call; nothing is
        charged)."""
        self._check(group, contract)
        now = self._tick(now)
        if len(blocks) == 0:
            return
        K.hit(self._state, np.asarray(blocks, dtype=np.int32), group, contract,
              self.prefix_key(prefix_id, root), now)

    def fused_arrays(self) -> FusedArrays:
        """The loop's ``prefixshield`` kernels on the packed state and the debt log."""
        return FusedArrays("prefixshield", packed=self._state, debt_log=self.debt_log)

    def on_release(self, blocks: np.ndarray, cached: np.ndarray, now: float) -> None:
        """``blocks`` became free in vLLM's free order; cached ones become candidates at the
        most recent end of their class (one kernel call)."""
        self._tick(now)
        if len(blocks) == 0:
            return
        blocks = np.asarray(blocks, dtype=np.int32)
        bad = K.release(self._state, blocks, np.asarray(cached, dtype=np.bool_))
        if bad >= 0:
            raise ValueError(f"on_release: block {int(blocks[bad])} is already free or not a "
                             f"block id; blocks[:{bad}] were released")

    def on_acquire(self, blocks: np.ndarray) -> None:
        """Free cached ``blocks`` taken back into use leave the candidate lists (one kernel)."""
        if len(blocks) == 0:
            return
        blocks = np.asarray(blocks, dtype=np.int32)
        bad = K.acquire(self._state, blocks)
        if bad >= 0:
            raise ValueError(f"on_acquire: block {int(blocks[bad])} is not a free cached block; "
                             f"blocks[:{bad}] were taken")

    _OUT_CHUNK = 4096
    """Victim arrays are cut from chunks of this many int32 slots (see select_victims)."""

    def select_victims(self, n: int, now: float, requester: int) -> np.ndarray:
        """Remove and return ``n`` free blocks: truly free ones first, then reclaimed candidates
        by projected debt at ``now`` seconds (one kernel call for all ``n``).

        This is the hot call of the pool, so it is one kernel call with scalar arguments only
        (`select_at`, through its
        compiled entry: no array unboxing, no dispatch), which also checks ``requester`` and
        ``n`` and advances the clock. Victims are written into a preallocated chunk: the array
        returned is a slice of it that no later call writes (cheaper than allocating one per
        call; the chunk is replaced when full)."""
        off = self._out_off
        if off + n > self._OUT_CHUNK:
            self._new_chunk(n)
            off = 0
        got = self._select_at(self._state_addr, self._state_nbytes, n, now, requester,
                              self._out_addr, off)
        if got < 0:
            self._select_error(got, n, requester)
        self._out_off = off + n
        return self._out[off:off + n]

    def _new_chunk(self, n: int) -> None:
        self._out = np.empty(max(self._OUT_CHUNK, n), dtype=np.int32)
        self._out_addr = self._out.ctypes.data
        self._out_off = 0

    def _select_error(self, code: int, n: int, requester: int) -> None:
        if code == -3:
            raise RuntimeError("prefixshield: call bind_tenants(groups, contracts) first")
        if code == -2:
            raise ValueError(f"group id {requester} out of range: {len(self.groups)} groups "
                             f"bound")
        raise ValueError(f"cannot select {n} victims: {self.num_free()} free blocks")

    def replay_keys(self, keys: np.ndarray, block_of, key_of: np.ndarray,
                    groups: np.ndarray | None = None, contract: int = 0) -> np.ndarray:
        """The pure cache driver's loop in one kernel (see
        `prefixshield.simulator.cachedriver.replay_keys`, whose per-request calls it makes
        decision for decision, debt-log samples included: tests/policies/
        test_prefixshield_replay.py); request i has clock ``i`` s, group ``groups[i]``
        (default 0), ``contract`` and prefix_id = its key.

        Args:
            keys: int64 content keys (>= 0), one per request.
            block_of: numba typed Dict content key -> block (read at the start and written back;
                during the replay the map is an array hash table).
            key_of: int64 per block, its content key or -1 (updated).
            groups: group id per request (int, each in range), or None.
            contract: contract id of every request.

        Returns:
            bool per request, True where it hit.
        """
        n = keys.shape[0]
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        groups = (np.zeros(n, dtype=np.int64) if groups is None
                  else np.ascontiguousarray(groups, dtype=np.int64))
        self._check(0, contract)
        if n and (int(keys.min()) < 0 or int(groups.min()) < 0
                  or int(groups.max()) >= len(self.groups)):
            raise ValueError("replay_keys: keys must be >= 0 and groups bound group ids")
        if groups.shape[0] != n:
            raise ValueError(f"replay_keys: {groups.shape[0]} groups for {n} keys")
        hits = np.zeros(n, dtype=np.bool_)
        bits = table_bits(self.num_blocks)
        bk, bv = new_table(bits, np.int32)
        log = self.debt_log
        log.reserve(n)
        meta = np.array([log.size, log.stride, log.num_charges], dtype=np.int64)
        bad = K.replay_keys(self._state, keys, groups, contract, hits, block_of, key_of,
                            (bk, bv), bits, (log.t, log.group, log.debt, log.classes, meta),
                            log.max_samples)
        log.size, log.stride, log.num_charges = (int(x) for x in meta)
        if bad >= 0:
            raise ValueError(f"replay_keys: request {bad} made an illegal policy call")
        return hits

    def num_free(self) -> int:
        """Free blocks held (truly free plus cached candidates)."""
        return sum(self._glen.tolist())

    def num_truly_free(self) -> int:
        """Free blocks without a hash (handed out before any reclamation)."""
        return int(self._glen[K.TRULY_FREE])

    def free_mask(self) -> np.ndarray:
        """Bool per block id: True where the block is free (truly free or a cached candidate)."""
        return self._gmember >= 0

    def _global_list(self, k: int) -> np.ndarray:
        return list_to_array(self._gnxt, self.num_blocks, k, self._glen[k])

    def free_order(self) -> np.ndarray:
        """The free blocks in the order `select_victims` would hand them out if asked for
        all of them at the latest clock seen (a dry run on a copy of the state up to the
        admission history, which selection does not read; the state is untouched)."""
        n = self.num_free()
        out = np.empty(n, dtype=np.int32)
        if n == 0:
            return out
        if not self._bound:
            return self._global_list(K.TRULY_FREE)
        dry = np.empty_like(self._state)
        dry[:self._history_start] = self._state[:self._history_start]
        K.select(dry, n, self._now, 0, out, 0)
        return out

    # ------------------------------------------------------------------ accounting views
    def effective_balance(self, group: int, contract: int, now: float) -> float:
        """``B̂_{g,c}(now)`` in blocks (no side effect)."""
        self._check(group, contract)
        return float(K.effective_balance(self.balance[group, contract], self.t0[group, contract],
                                         self.rho[contract], self.beta[contract], float(now)))

    def debt(self, group: int, now: float) -> float:
        """Raw debt ``D_g(now)`` in blocks (no side effect)."""
        self._check(group)
        return float(K.group_debt(self.balance, self.t0, self.rho, self.beta, group, float(now)))

    def normalized_debt(self, group: int, now: float) -> tuple[float, float]:
        """``(D̃_g(now), W_g(now))``: normalized debt (blocks / weight) and the largest weight of
        an indebted contract (0.0 when none)."""
        self._check(group)
        d, w = K.group_normalized_debt(self.balance, self.t0, self.rho, self.beta, self.weight,
                                       group, float(now))
        return float(d), float(w)

    def clearance_time_s(self, group: int, now: float) -> float:
        """Seconds of quiescence after ``now`` until ``D_g`` reaches 0:
        ``max_c max(0, −B̂_{g,c}(now)) / rho_c`` (the Proposition's bound on gating)."""
        self._check(group)
        return max((max(0.0, -self.effective_balance(group, c, now)) / self.rho[c]
                    for c in range(len(self.contracts))), default=0.0)

    def block_classes(self) -> np.ndarray:
        """Retention class per block (int8; meaningful where `cached`)."""
        return self.klass.copy()

    # ------------------------------------------------------------------ observability
    def stats(self) -> dict:
        """JSON-able counters at the latest clock seen (units: blocks, seconds).

        Keys: ``flags``; ``groups``; ``clock_s``; ``cached_blocks`` and ``free_cached_blocks``
        (per group, per class name; cached = in use + free); ``truly_free_blocks``;
        ``debt_blocks`` / ``normalized_debt`` (per group, now); ``debt_samples`` (``t_s``,
        ``group``, ``debt_blocks`` lists, one per charge, bounded); ``class_samples`` (per
        group, per class name: cached blocks at each of those samples); ``promotions_granted``,
        ``promotions_gated``, ``promotions_in_debt`` (per group); ``evictions`` (matrix
        ``[requesting group][owner]``, owners named by ``eviction_owners``, the last being an
        unknown owner); ``evicted_by_class`` (per owner, per class name: the class each evicted
        block had); ``charged_blocks`` (per group, a list indexed like ``contracts``);
        ``materialized_blocks`` (per group)."""
        G = len(self.groups)
        names = list(self.groups)
        free_cls = self._qlen.reshape(G, K.NUM_CLASSES) if G else np.zeros((0, 3), np.int64)
        t, grp, d = self.debt_log.arrays()
        snap = self.debt_log.class_samples().reshape(-1, G, K.NUM_CLASSES)
        return {
            "policy": self.name,
            "flags": {"segmentation": self.segmentation, "debt_gate": self.debt_gate,
                      "responsibility": self.responsibility, "epsilon": self.epsilon,
                      "history_factor": self.history_factor, "rho_scale": self.rho_scale,
                      "history_capacity": self.history_capacity,
                      "admission": self.admission, "charge_decode": self.charge_decode,
                      "prefix_source": self.prefix_source},
            "groups": names,
            "clock_s": self._now,
            "cached_blocks": {names[g]: dict(zip(CLASS_NAMES, map(int, self.class_count[g])))
                              for g in range(G)},
            "free_cached_blocks": {names[g]: dict(zip(CLASS_NAMES, map(int, free_cls[g])))
                                   for g in range(G)},
            "truly_free_blocks": self.num_truly_free(),
            "debt_blocks": {names[g]: self.debt(g, self._now) for g in range(G)},
            "normalized_debt": {names[g]: self.normalized_debt(g, self._now)[0]
                                for g in range(G)},
            "debt_samples": {"t_s": t.tolist(), "group": grp.tolist(), "debt_blocks": d.tolist(),
                             "stride": self.debt_log.stride},
            "class_samples": {names[g]: {c: snap[:, g, k].tolist()
                                         for k, c in enumerate(CLASS_NAMES)}
                              for g in range(G)},
            "promotions_granted": {names[g]: int(self.granted[g]) for g in range(G)},
            "promotions_gated": {names[g]: int(self.gated[g]) for g in range(G)},
            "promotions_in_debt": {names[g]: int(self.in_debt[g]) for g in range(G)},
            "evictions": self.evictions.tolist(),
            "eviction_owners": names + ["<unknown>"],
            "evicted_by_class": {o: dict(zip(CLASS_NAMES, map(int, self.evicted_class[i])))
                                 for i, o in enumerate(names + ["<unknown>"])},
            "contracts": [c.name for c in self.contracts],
            "charged_blocks": {names[g]: [int(x) for x in self.charged[g]] for g in range(G)},
            "materialized_blocks": {names[g]: int(self.materialized[g]) for g in range(G)},
            "uncharged_decode_blocks": {names[g]: int(self.uncharged[g]) for g in range(G)},
        }

    def check_invariants(self) -> None:
        """Raise ``AssertionError`` naming the first broken invariant.

        I1: per group, blocks charged (all contracts) plus decode blocks left uncharged
        (``charge_decode=False``) == blocks materialized. I2 (with the gate
        on): no promotion happened while ``D_g > ε``. Free set: the truly free list holds
        uncached blocks only; each class list holds cached blocks of that class in strictly
        increasing native order; every owned candidate is in exactly its (owner, class) list;
        per-(group, class) cached counts match the block labels; without segmentation every
        cached block is NORMAL. The max tree over the debt bounds matches them."""
        G = len(self.groups)
        N = self.num_blocks
        charged = self.charged.sum(axis=1)
        bad = np.flatnonzero(charged + self.uncharged != self.materialized)
        if bad.size:
            g = int(bad[0])
            raise AssertionError(f"I1: group {self.groups[g]!r} charged {int(charged[g])} blocks "
                                 f"(and left {int(self.uncharged[g])} decode blocks uncharged) "
                                 f"but materialized {int(self.materialized[g])}")
        if self.debt_gate and self.in_debt.any():
            g = int(np.flatnonzero(self.in_debt)[0])
            raise AssertionError(f"I2: group {self.groups[g]!r} had {int(self.in_debt[g])} "
                                 f"promotion(s) while its debt exceeded epsilon={self.epsilon}")
        tree = self._packed.arrays["utree"]
        if G and not (np.array_equal(tree[G:], self._ub)
                      and np.array_equal(tree[1:G], np.maximum(tree[2:2 * G:2],
                                                               tree[3:2 * G:2]))):
            raise AssertionError("the debt-bound tree does not match the bounds (leaf G + g = "
                                 "ub[g], node i = max of nodes 2i and 2i + 1)")
        tf = self._global_list(K.TRULY_FREE)
        if self.cached[tf].any():
            raise AssertionError(f"truly free list holds cached block(s) {tf[self.cached[tf]][:5]}")
        if 0 in tf or self._gmember[0] != -1:
            raise AssertionError("the null block is in a free list")
        seen = tf.shape[0]
        num_owned = 0
        for k in range(K.NUM_CLASSES):
            blocks = self._global_list(k)
            seen += blocks.shape[0]
            if not self.cached[blocks].all():
                raise AssertionError(f"class list {CLASS_NAMES[k]} holds uncached block(s) "
                                     f"{blocks[~self.cached[blocks]][:5]}")
            wrong = blocks[self.klass[blocks] != k]
            if wrong.size:
                raise AssertionError(f"block {int(wrong[0])} of class {int(self.klass[wrong[0]])} "
                                     f"is in the {CLASS_NAMES[k]} list")
            if blocks.size > 1 and not np.all(np.diff(self.seq[blocks]) > 0):
                raise AssertionError(f"{CLASS_NAMES[k]} list is not in native free order")
            num_owned += int(np.count_nonzero(self.owner[blocks] >= 0))
        if seen != self.num_free() or int(self._glen.sum()) != seen:
            raise AssertionError(f"free lists hold {seen} blocks but report {self.num_free()}")
        # every group list holds only its (owner, class) candidates and together they hold every
        # owned candidate: so each owned candidate is in exactly its list
        listed = [np.zeros(0, dtype=np.int32)]
        for lst in range(K.NUM_CLASSES * G):
            blocks = list_to_array(self._qnxt, N, lst, self._qlen[lst])
            listed.append(blocks)
            if blocks.size and self._gmember[blocks].max() >= K.NUM_CLASSES:
                raise AssertionError(f"group list {lst} holds a block that is not a candidate")
            g, k = divmod(lst, K.NUM_CLASSES)
            if blocks.size and (np.any(self.owner[blocks] != g) or np.any(self.klass[blocks] != k)):
                raise AssertionError(f"group list ({self.groups[g]!r}, {CLASS_NAMES[k]}) holds a "
                                     f"block of another group or class")
            if blocks.size > 1 and not np.all(np.diff(self.seq[blocks]) > 0):
                raise AssertionError(f"group list ({self.groups[g]!r}, {CLASS_NAMES[k]}) is not in "
                                     f"native free order")
        listed = np.concatenate(listed)
        if listed.shape[0] != num_owned or np.unique(listed).shape[0] != num_owned:
            raise AssertionError(f"group lists hold {listed.shape[0]} blocks "
                                 f"({np.unique(listed).shape[0]} distinct), {num_owned} owned "
                                 f"candidates are free")
        owned = self.cached & (self.owner >= 0)
        counts = np.zeros((G, K.NUM_CLASSES), dtype=np.int64)
        np.add.at(counts, (self.owner[owned], self.klass[owned].astype(np.int64)), 1)
        if not np.array_equal(counts, self.class_count):
            raise AssertionError(f"cached blocks per (group, class) {counts.tolist()} != counters "
                                 f"{self.class_count.tolist()}")
        if not self.segmentation and np.any(self.klass[self.cached] != NORMAL):
            raise AssertionError("segmentation is off but a cached block is not NORMAL")

