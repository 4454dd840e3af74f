"""Numba kernels of the PrefixShield policy over one packed state buffer.

Every public event kernel here is one call per policy event (``on_materialize``, ``on_hit``,
``on_release``, ``on_acquire``, ``select_victims``) and takes the policy's whole state as one
uint8 buffer (`Packed`, every field declared once in
`SPEC`: name, dtype, shape, the policy's view of it; `state` rebuilds the arrays from it
without allocating), so a call from
Python unboxes one array instead of thirty. The formulas live here once;
`prefixshield.policies.prefixshield` only builds the buffer and calls these.

State layout (indexed by block id ``b < N`` unless said otherwise; bounds of the narrow dtypes
are enforced by the policy: ``G <= MAX_GROUPS``, ``C <= MAX_CONTRACTS``):

* ``owner[b]`` (int16): group that materialized b's cached content, -1 if none/unknown;
  ``contract[b]`` (int16), ``prefix[b]`` (int64): the request's contract and prefix_id;
  ``klass[b]`` (int8): retention class, PROBATIONARY=0 < NORMAL=1 < REUSE=2;
  ``cached[b]`` (bool): the policy believes b carries a hash; ``seq[b]`` (int32): native-order
  stamp (larger = more recent release; see `_next_seq` for its bound); ``hits[b]``
  (int32, saturating at 2**31 - 1; no decision reads it): reuse evidence.
* Global lists (``gprev``/``gnxt`` int32 over ``N + 2·4`` nodes, ``gmember`` int8, ``glen``;
  the layout of `LinkedLists`): list k in 0..2
  = free cached candidates of class k over all groups, in native free order (oldest at the
  head); list 3 = truly free blocks, in reuse order.
* Group lists (``qprev``/``qnxt`` over ``N + 2·3G`` nodes, ``qlen``): list ``3·g + k`` = free
  cached candidates owned by group g in class k, oldest at the head. A candidate with an unknown
  owner is only in the global lists. A block's group list is not stored: it is
  ``3·owner[b] + klass[b]`` whenever b is a free candidate with ``owner[b] >= 0`` (the kernels
  unlink a block before they change its class).
* Buckets: ``bal[g, c]`` (blocks), ``t0[g, c]`` (s); contract arrays ``rho[c]`` (blocks/s),
  ``beta[c]`` (blocks), ``w[c] = rho[c] / min(rho)``; ``charged[g, c]`` and ``uncharged[g]``
  (decode blocks materialized without a charge, ``ctl[C_CHARGE_DECODE]`` off) count blocks.
* Admission: a request's class is decided at its first materialization (`_admit`) and
  kept by the caller (the policy per request id, the fused loop per request row), who passes
  it back with the request's later calls; ``ctl[C_PER_CALL]`` makes every call an admission.
* Debtors: ``debtors[:ctl[C_NUM_DEBTORS]]`` (int32, ``dpos[g]`` its index or -1) holds every
  group that may owe at some clock >= ``fctl[F_PRUNE_CLOCK]``: every group whose last charge
  left ``bal[g, c] < 0`` and whose debt was not seen cleared since. A group outside it owes
  nothing at such a clock (a bucket with ``bal >= 0`` never goes negative by refilling, and a
  cleared one stays cleared as the clock advances), so selection computes ``P_g`` only for
  these; at an earlier clock (one that stepped back) it computes all groups, as before.
  ``ub[g]`` (float64) bounds ``D̃_g`` at every clock (`_debt_bound`, updated at each
  charge; a debtor whose bound drops to 0 leaves the list there). ``utree`` (float64, ``2·G``
  nodes) is a max tree over the bounds: leaf ``G + g`` holds ``ub[g]``, node ``i < G`` the
  larger of nodes ``2i`` and ``2i + 1`` (node 1 the root, node 0 unused). A selection of one
  victim walks it from the root, largest bound first, and skips every subtree whose largest
  bound is below the best exact ``P`` found so far (or not above ``eps``): it scores the few
  groups whose bound can reach the winner, O(log G) each, at any clock. (``W_g`` is recomputed
  for the group that gives a victim; ``P`` and ``heap`` are per-selection scratch, ``heap``
  also the walk's stack.)
* Admission history: an LRU set of ``(group, prefix_id)`` pairs in entries ``0..H-1``
  (``hkey_g`` int16, ``hkey_p`` int64; LRU order in ``hprev``/``hnxt``, int32, sentinels H and
  H+1) indexed by an open-addressing table ``htab`` (int32, 0 = empty, else ``entry + 1`` in
  the low ``bits`` bits and the slot's displacement from its key's home above them, saturated
  at ``2**(31 - bits) - 1`` (`_h_slot_value`), so probes and deletions read an entry's
  key only where its home is the probed key's or unknown; linear probing, backward-shift
  deletion; ``2**bits`` slots at load <= 3/4).
* ``ctl`` (int64) / ``fctl`` (float64): sizes, flags and counters (the ``C_*`` / ``F_*``
  indices below).

Because every list receives blocks at its tail in increasing ``seq`` order, "head of a list" is
"oldest in native order", and the best candidate of a group is the head of its lowest non-empty
class list (O(3)).
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np
from numba import njit

from prefixshield.policies.kernels.hashtable import delete as _ht_delete
from prefixshield.policies.kernels.hashtable import find as _ht_find
from prefixshield.policies.kernels.hashtable import insert as _ht_insert
from prefixshield.policies.kernels.hashtable import moves_back as _ht_moves_back
from prefixshield.policies.kernels.hashtable import slot as _ht_slot
from prefixshield.policies.kernels.linkedlist import insert_after as _insert_after
from prefixshield.policies.kernels.linkedlist import push_tail_one as _push_tail1
from prefixshield.policies.kernels.linkedlist import unlink_one as _unlink1
from prefixshield.policies.kernels.packed import at_address as _at_address
from prefixshield.policies.kernels.packed import views
from prefixshield.policies.kernels.packed import prefetch as _prefetch

PROBATIONARY = 0
NORMAL = 1
REUSE = 2
NUM_CLASSES = 3
TRULY_FREE = 3
"""Index of the truly-free list in the global lists (lists 0..2 are the classes)."""
NUM_GLOBAL_LISTS = 4

MAX_GROUPS = 32767
"""Groups fit ``owner``/``hkey_g`` (int16). (The eviction matrix alone is 8·G² bytes: 8 GiB at
this bound.)"""
MAX_CONTRACTS = 32767
"""Contracts fit ``contract`` (int16)."""
SEQ_LIMIT = 2**31 - 1
"""``seq`` is int32: at this stamp the stamps are renumbered (`_renumber_seq`)."""
HITS_LIMIT = 2**31 - 1
"""``hits`` is int32 and saturates here."""

# ctl (int64) indices
C_N = 0              # blocks, null block included
C_G = 1              # groups (0: not bound yet)
C_C = 2              # contracts
C_H = 3              # admission-history capacity (entries)
C_HBITS = 4          # log2 of the history table's slots
C_SEGMENTATION = 5   # flags, 0/1
C_DEBT_GATE = 6
C_RESPONSIBILITY = 7
C_TF_TO_HEAD = 8     # vLLM "current": freed unhashed blocks go to the head of the truly free list
C_SEQ = 9            # next native-order stamp
C_HUSED = 10         # history entries used so far (<= H)
C_NUM_DEBTORS = 11
C_PER_CALL = 12      # 1: every on_materialize call is an admission (the per-call reading)
C_CHARGE_DECODE = 13 # 1: decode blocks are charged like prompt blocks
C_PREFIX_SOURCE = 14 # where the logical prefix comes from: PREFIX_ROOT, _DECLARED or _TENANT
NUM_CTL = 15

# Sources of the logical prefix (ctl[C_PREFIX_SOURCE]); see prefix_key.
PREFIX_ROOT = 0
PREFIX_DECLARED = 1
PREFIX_TENANT = 2
NO_CLASS = -1
"""A request's admission class before its first materialization (see `_materialize`)."""
# fctl (float64) indices
F_EPSILON = 0
F_PRUNE_CLOCK = 1    # latest clock at which a debtor was dropped (-inf: none yet)
F_CLOCK = 2          # latest clock seen (s)
NUM_FCTL = 3

FieldSpec = namedtuple("FieldSpec", ["name", "dtype", "shape", "attr", "per_block"])
"""One field of the packed state: its name, dtype, shape (a function of the sizes ``N`` blocks,
``G`` groups, ``C`` contracts, ``H`` history entries, ``T`` history table slots), the
attribute name of its numpy view on the policy (None: kernels only) and whether it is
per-block state that survives a rebuild of the buffer at ``bind_tenants``."""


def _f(name, dtype, shape, attr=None, per_block=False):
    return FieldSpec(name, dtype, shape, attr, per_block)


# The packed state, declared once: the header order (field i), dtypes and shapes of `layout`,
# the kernels' `State` views, the policy's numpy views and what a rebuild keeps.
SPEC = (
    _f("ctl", np.int64, lambda N, G, C, H, T: (NUM_CTL,), "_ctl"),
    _f("fctl", np.float64, lambda N, G, C, H, T: (NUM_FCTL,), "_fctl"),
    _f("owner", np.int16, lambda N, G, C, H, T: (N,), "owner", True),
    _f("contract", np.int16, lambda N, G, C, H, T: (N,), "contract", True),
    _f("prefix", np.int64, lambda N, G, C, H, T: (N,), "prefix", True),
    _f("klass", np.int8, lambda N, G, C, H, T: (N,), "klass", True),
    _f("cached", np.bool_, lambda N, G, C, H, T: (N,), "cached", True),
    _f("seq", np.int32, lambda N, G, C, H, T: (N,), "seq", True),
    _f("hits", np.int32, lambda N, G, C, H, T: (N,), "hits", True),
    _f("gprev", np.int32, lambda N, G, C, H, T: (N + 2 * NUM_GLOBAL_LISTS,), None, True),
    _f("gnxt", np.int32, lambda N, G, C, H, T: (N + 2 * NUM_GLOBAL_LISTS,), "_gnxt", True),
    _f("gmember", np.int8, lambda N, G, C, H, T: (N,), "_gmember", True),
    _f("glen", np.int64, lambda N, G, C, H, T: (NUM_GLOBAL_LISTS,), "_glen", True),
    _f("qprev", np.int32, lambda N, G, C, H, T: (N + 2 * NUM_CLASSES * G,)),
    _f("qnxt", np.int32, lambda N, G, C, H, T: (N + 2 * NUM_CLASSES * G,), "_qnxt"),
    _f("qlen", np.int64, lambda N, G, C, H, T: (NUM_CLASSES * G,), "_qlen"),
    _f("rho", np.float64, lambda N, G, C, H, T: (C,), "rho"),
    _f("beta", np.float64, lambda N, G, C, H, T: (C,), "beta"),
    _f("w", np.float64, lambda N, G, C, H, T: (C,), "weight"),
    _f("bal", np.float64, lambda N, G, C, H, T: (G, C), "balance"),
    _f("t0", np.float64, lambda N, G, C, H, T: (G, C), "t0"),
    _f("charged", np.int64, lambda N, G, C, H, T: (G, C), "charged"),
    _f("materialized", np.int64, lambda N, G, C, H, T: (G,), "materialized"),
    _f("cls_count", np.int64, lambda N, G, C, H, T: (G, NUM_CLASSES), "class_count"),
    _f("granted", np.int64, lambda N, G, C, H, T: (G,), "granted"),
    _f("gated", np.int64, lambda N, G, C, H, T: (G,), "gated"),
    _f("in_debt", np.int64, lambda N, G, C, H, T: (G,), "in_debt"),
    _f("evictions", np.int64, lambda N, G, C, H, T: (G, G + 1), "evictions"),
    _f("evicted_class", np.int64, lambda N, G, C, H, T: (G + 1, NUM_CLASSES), "evicted_class"),
    _f("P", np.float64, lambda N, G, C, H, T: (G,), "_P"),
    _f("ub", np.float64, lambda N, G, C, H, T: (G,), "_ub"),
    _f("heap", np.int32, lambda N, G, C, H, T: (G,), "_heap"),
    _f("debtors", np.int32, lambda N, G, C, H, T: (G,)),
    _f("dpos", np.int32, lambda N, G, C, H, T: (G,)),
    _f("utree", np.float64, lambda N, G, C, H, T: (2 * G,)),
    _f("uncharged", np.int64, lambda N, G, C, H, T: (G,), "uncharged"),
    # the admission history, last: selection never reads it (`free_order` copies the buffer
    # up to it)
    _f("hkey_g", np.int16, lambda N, G, C, H, T: (H,)),
    _f("hkey_p", np.int64, lambda N, G, C, H, T: (H,)),
    _f("hprev", np.int32, lambda N, G, C, H, T: (H + 2,)),
    _f("hnxt", np.int32, lambda N, G, C, H, T: (H + 2,)),
    _f("htab", np.int32, lambda N, G, C, H, T: (T,)),
)
"""Every field of the packed state, in header order (see `FieldSpec` and the module
docstring)."""

FIELDS = tuple(f.name for f in SPEC)
State = namedtuple("State", FIELDS)
"""The arrays of the packed state, in field order: what `state` returns in a kernel."""
HISTORY_FIELDS = FIELDS[FIELDS.index("hkey_g"):]
"""The last fields of the buffer: selection never reads them (`free_order` copies the
buffer up to them)."""
PER_BLOCK = tuple(f.name for f in SPEC if f.per_block)
"""Per-block fields (and the global lists): they survive a rebuild at ``bind_tenants``."""
VIEWS = tuple((f.name, f.attr) for f in SPEC if f.attr is not None)
"""(field, attribute): the numpy views of the packed state the policy's Python side reads."""


def layout(N: int, G: int, C: int, H: int, hbits: int) -> list[tuple[str, type, tuple]]:
    """``(name, dtype, shape)`` of every field, in `FIELDS` order, for
    `Packed`."""
    return [(f.name, f.dtype, f.shape(N, G, C, H, 1 << hbits)) for f in SPEC]


def history_bits(H: int) -> int:
    """log2 of the history table's slots: the least power of two with ``H`` at load <= 3/4."""
    bits = 2
    while 3 * (1 << bits) < 4 * H:
        bits += 1
    return bits


def history_bytes(H: int) -> int:
    """Bytes of an admission history of ``H`` entries (keys, LRU links, hash index)."""
    return H * (2 + 8) + (H + 2) * 4 * 2 + (1 << history_bits(H)) * 4


_views = views(State, [(f.dtype, len(f.shape(1, 1, 1, 1, 1))) for f in SPEC])


@njit(cache=True, inline="always")
def state(st):
    """The `State` views of packed buffer ``st`` (no allocation), in the shapes its header
    gives."""
    return _views(st)


# ----------------------------------------------------------------------------- block metadata
@njit(cache=True, inline="always")
def _forget(s, b):
    """Block ``b`` holds no content any more: no owner, contract, prefix, class or reuse."""
    s.cached[b] = False
    s.owner[b] = -1
    s.contract[b] = -1
    s.prefix[b] = -1
    s.klass[b] = PROBATIONARY
    s.hits[b] = 0


@njit(cache=True)
def _renumber_seq(s):
    """Restamp every free candidate ``0, 1, ...`` in the order of its class list and continue
    at N. Stamps are only ever compared between blocks of one class list (the tie-break of
    `_better`, the invariant check), and every list is in stamp order, so every
    comparison keeps its answer; the next stamps (>= N) are above all of them."""
    N = s.ctl[C_N]
    for k in range(NUM_CLASSES):
        b = s.gnxt[N + 2 * k]
        i = 0
        while b < N:
            s.seq[b] = i
            i += 1
            b = s.gnxt[b]
    s.ctl[C_SEQ] = N


@njit(cache=True, inline="always")
def _next_seq(s):
    """The next native-order stamp (renumbering all at `SEQ_LIMIT`, once per ~2**31
    releases, so int32 stamps never wrap)."""
    if s.ctl[C_SEQ] >= SEQ_LIMIT:
        _renumber_seq(s)
    v = s.ctl[C_SEQ]
    s.ctl[C_SEQ] = v + 1
    return v


# ----------------------------------------------------------------------------- group lists
@njit(cache=True, inline="always")
def _q_unlink(s, b):
    """Remove free candidate ``b`` (owner >= 0) from its group list ``3·owner + klass``."""
    p = s.qprev[b]
    q = s.qnxt[b]
    s.qnxt[p] = q
    s.qprev[q] = p
    s.qprev[b] = -1
    s.qnxt[b] = -1
    s.qlen[NUM_CLASSES * s.owner[b] + s.klass[b]] -= 1


@njit(cache=True, inline="always")
def _q_push_tail(s, lst, b):
    """Append ``b`` at the tail of group list ``lst``."""
    tail = s.ctl[C_N] + 2 * lst + 1
    at = s.qprev[tail]
    s.qprev[b] = at
    s.qnxt[b] = tail
    s.qnxt[at] = b
    s.qprev[tail] = b
    s.qlen[lst] += 1


# ----------------------------------------------------------------------------- buckets and debt
@njit(cache=True, inline="always")
def effective_balance(bal, t0, rho, beta, t):
    """``B̂(t) = min(beta, B + rho · max(0, t − t0))`` in blocks (a clock that steps back refills
    nothing)."""
    dt = t - t0
    if dt < 0.0:
        dt = 0.0
    v = bal + rho * dt
    if beta < v:
        return beta
    return v


@njit(cache=True, inline="always")
def group_debt(bal, t0, rho, beta, g, t):
    """Raw debt ``D_g(t) = Σ_c max(0, −B̂_{g,c}(t))`` in blocks."""
    d = 0.0
    for c in range(bal.shape[1]):
        x = -effective_balance(bal[g, c], t0[g, c], rho[c], beta[c], t)
        if x > 0.0:
            d += x
    return d


@njit(cache=True, inline="always")
def group_normalized_debt(bal, t0, rho, beta, w, g, t):
    """``(D̃_g(t), W_g(t))``: ``Σ_c max(0, −B̂_{g,c}(t)) / w_c`` and the largest ``w_c`` over
    contracts with ``B̂_{g,c}(t) < 0`` (0.0 when g owes nothing)."""
    d = 0.0
    wmax = 0.0
    for c in range(bal.shape[1]):
        if bal[g, c] >= 0.0:
            continue  # B̂ = min(beta >= 0, B + (>= 0)) >= 0: no term (saves the arithmetic)
        x = -effective_balance(bal[g, c], t0[g, c], rho[c], beta[c], t)
        if x > 0.0:
            d += x / w[c]
            if w[c] > wmax:
                wmax = w[c]
    return d, wmax


@njit(cache=True, inline="always")
def _debt_bound(bal, w, g):
    """``Σ_c max(0, −B_{g,c}) / w_c``: g's normalized debt with no refill, an upper bound of
    ``D̃_g(t)`` at every clock ``t`` (``B̂ >= min(beta, B)`` and ``beta >= 0``), also in floating
    point: `group_normalized_debt` adds, in the same order, terms no larger (rounding is
    monotone). Kept in ``ub[g]`` and recomputed at every charge that can change it."""
    d = 0.0
    for c in range(bal.shape[1]):
        if bal[g, c] < 0.0:
            d += -bal[g, c] / w[c]
    return d


@njit(cache=True, inline="always")
def _set_bound(s, g, u):
    """``ub[g] = u`` and the max tree's path from leaf ``G + g`` up, as far as a node changes."""
    s.ub[g] = u
    G = s.ctl[C_G]
    i = G + g
    s.utree[i] = u
    while i > 1:
        parent = i >> 1
        m = max(s.utree[2 * parent], s.utree[2 * parent + 1])
        if s.utree[parent] == m:
            return
        s.utree[parent] = m
        i = parent


@njit(cache=True, inline="always")
def _add_debtor(s, g):
    if s.dpos[g] < 0:
        n = s.ctl[C_NUM_DEBTORS]
        s.debtors[n] = g
        s.dpos[g] = n
        s.ctl[C_NUM_DEBTORS] = n + 1


@njit(cache=True, inline="always")
def _drop_debtor(s, g):
    n = s.ctl[C_NUM_DEBTORS] - 1
    i = s.dpos[g]
    last = s.debtors[n]
    s.debtors[i] = last
    s.dpos[last] = i
    s.dpos[g] = -1
    s.ctl[C_NUM_DEBTORS] = n


# ----------------------------------------------------------------------------- admission history
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@njit(cache=True, inline="always")
def _h_home(s, g, pid):
    """Home slot of key ``(g, pid)`` (Fibonacci hashing of the two mixed)."""
    k = (np.uint64(pid) ^ (np.uint64(g) * np.uint64(0xC2B2AE3D27D4EB4F))) * _GOLDEN
    return np.int64(k >> np.uint64(64 - s.ctl[C_HBITS]))


@njit(cache=True, inline="always")
def _h_slot_value(s, e, i, home):
    """Table value of entry ``e`` in slot ``i`` whose key's home slot is ``home``: ``e + 1`` in
    the low ``hbits`` bits, above them the displacement ``(i - home) mod 2**hbits`` saturated at
    ``2**(31 - hbits) - 1`` (that value: not stored; the entry's key tells). The value stays a
    positive int32 (``e + 1 <= H < 2**hbits``)."""
    hb = s.ctl[C_HBITS]
    mask = (1 << hb) - 1
    dmax = (1 << max(31 - hb, 0)) - 1
    d = (i - home) & mask
    if d > dmax:
        d = dmax
    return np.int32((d << hb) | (e + 1))


@njit(cache=True, inline="always")
def _h_find(s, g, pid):
    """Table slot holding ``(g, pid)``, or ``-1 - slot`` of the empty slot where it would go.
    A slot whose stored displacement puts its key's home elsewhere is passed without reading
    its entry's key."""
    hb = s.ctl[C_HBITS]
    mask = (1 << hb) - 1
    dmax = (1 << max(31 - hb, 0)) - 1
    home = _h_home(s, g, pid)
    i = home
    while True:
        v = s.htab[i]
        if v <= 0:
            return -1 - i
        d = v >> hb
        if d == dmax or ((i - d) & mask) == home:
            e = (v & mask) - 1
            if s.hkey_p[e] == pid and s.hkey_g[e] == g:
                return i
        i = (i + 1) & mask


@njit(cache=True, inline="always")
def _h_slot_of(s, e):
    """Table slot of entry ``e`` (in the set): its key's probe, comparing slot values' entry
    bits with ``e + 1`` instead of reading each probed entry's key (the key is in the table
    once, so this is the slot `_h_find` returns for it)."""
    mask = (1 << s.ctl[C_HBITS]) - 1
    i = _h_home(s, s.hkey_g[e], s.hkey_p[e])
    while (s.htab[i] & mask) != e + 1:
        i = (i + 1) & mask
    return i


@njit(cache=True, inline="always")
def _h_delete(s, i):
    """Empty table slot ``i`` (backward-shift deletion keeps probe chains whole). Returns the
    one slot that is empty now and was not: entries only move back within i's chain, and the
    scan stops at the first empty slot without writing it. A moved entry's home comes from its
    stored displacement (its key is read only where that saturated)."""
    hb = s.ctl[C_HBITS]
    mask = (1 << hb) - 1
    dmax = (1 << max(31 - hb, 0)) - 1
    j = i
    while True:
        j = (j + 1) & mask
        v = s.htab[j]
        if v <= 0:
            break
        e = (v & mask) - 1
        d = v >> hb
        if d == dmax:
            h = _h_home(s, s.hkey_g[e], s.hkey_p[e])
        else:
            h = (j - d) & mask
        if _ht_moves_back(h, i, j):
            s.htab[i] = _h_slot_value(s, e, i, h)
            i = j
    s.htab[i] = 0
    return i


@njit(cache=True, inline="always")
def _history_admit(s, g, pid):
    """Record an admission of ``(g, pid)`` in the LRU set; True if it was not in the set (when
    full, the least recently admitted pair leaves first)."""
    H = s.ctl[C_H]
    head = H
    tail = H + 1
    i = _h_find(s, g, pid)
    if i >= 0:
        e = (s.htab[i] & ((1 << s.ctl[C_HBITS]) - 1)) - 1
        p = s.hprev[e]
        q = s.hnxt[e]
        s.hnxt[p] = q
        s.hprev[q] = p
        first = False
    else:
        if s.ctl[C_HUSED] < H:
            e = s.ctl[C_HUSED]
            s.ctl[C_HUSED] = e + 1
        else:
            e = s.hnxt[head]
            p = s.hprev[e]
            q = s.hnxt[e]
            s.hnxt[p] = q
            s.hprev[q] = p
            hole = _h_delete(s, _h_slot_of(s, e))
            # (g, pid) goes to the first empty slot from its home: the slots from there up to
            # the one found above were all full, and the deletion emptied only ``hole``
            mask = (1 << s.ctl[C_HBITS]) - 1
            home = _h_home(s, g, pid)
            if ((hole - home) & mask) < ((-1 - i - home) & mask):
                i = -1 - hole
        s.hkey_g[e] = g
        s.hkey_p[e] = pid
        s.htab[-1 - i] = _h_slot_value(s, e, -1 - i, _h_home(s, g, pid))
        first = True
    last = s.hprev[tail]
    s.hprev[e] = last
    s.hnxt[e] = tail
    s.hnxt[last] = e
    s.hprev[tail] = e
    return first


# ----------------------------------------------------------------------------- events
@njit(cache=True, inline="always")
def prefix_key(source, declared, root):
    """The logical prefix of a request for the admission history and promotion eligibility:
    its root key (the content key of its first full block, int64 bits of the uint64 hash) for
    `PREFIX_ROOT`, the trace's declared ``prefix_id`` for `PREFIX_DECLARED`, 0 (one
    prefix per group) for `PREFIX_TENANT`."""
    if source == PREFIX_ROOT:
        return root
    if source == PREFIX_DECLARED:
        return declared
    return 0


@njit(cache=True, inline="always")
def _charge(s, n, g, c, t):
    """Charge ``n > 0`` new blocks to bucket (g, c) at ``t``: the balance, the debtor list and
    the debt bound (`_meter`), and the blocks this policy charged."""
    s.charged[g, c] += n
    _meter(s, n, g, c, t)


@njit(cache=True, inline="always")
def _meter(s, n, g, c, t):
    """Take ``n > 0`` blocks from bucket (g, c) at ``t``: the balance, the debtor list and the
    debt bound (no counter: a fleet ledger's charge made on another replica comes here)."""
    old = s.bal[g, c]
    s.bal[g, c] = effective_balance(old, s.t0[g, c], s.rho[c], s.beta[c], t) - n
    s.t0[g, c] = t
    if s.bal[g, c] < 0.0:
        _add_debtor(s, g)
    if old < 0.0 or s.bal[g, c] < 0.0:  # else no term of the bound changed
        u = _debt_bound(s.bal, s.w, g)
        _set_bound(s, g, u)
        if u == 0.0 and s.dpos[g] >= 0:
            # every bucket has B >= 0 (or a term too small to round above 0, so P = 0 too):
            # P_g = 0 at any clock until g's next charge
            _drop_debtor(s, g)


@njit(cache=True)
def remote_charge(st, n, g, c, t):
    """A fleet ledger's charge of ``n > 0`` blocks to bucket (g, c) made by another replica,
    applied here at ``t`` seconds (`_meter`); ``charged`` keeps counting this policy's
    own charges only, so invariant I1 stays per replica."""
    _meter(state(st), n, g, c, t)


@njit(cache=True, inline="always")
def _admit(s, n, g, c, pid, t, k_req):
    """Meter ``n`` blocks (>= 0) of a request of (g, c, pid) at ``t`` and return the class of
    its new blocks. ``k_req`` is the request's class if an earlier call already
    admitted it (kept: admission, its first-admission test and its class are the request's),
    else `NO_CLASS`: this call is the admission, tested against the history and the
    balance after the charge."""
    if n > 0:
        _charge(s, n, g, c, t)
    if k_req >= 0:
        return k_req
    first = _history_admit(s, g, pid)
    if s.ctl[C_SEGMENTATION] == 0:
        return NORMAL
    if s.bal[g, c] < -s.fctl[F_EPSILON] or first:
        return PROBATIONARY
    return NORMAL


@njit(cache=True, inline="always")
def _label(s, b, g, c, pid, k):
    """Block ``b`` now holds content of (g, c, pid) in class ``k``, with no reuse yet (the
    caller took back any class count of its old content)."""
    s.owner[b] = g
    s.contract[b] = c
    s.prefix[b] = pid
    s.klass[b] = k
    s.cached[b] = True
    s.hits[b] = 0
    s.cls_count[g, k] += 1
    s.materialized[g] += 1


@njit(cache=True, inline="always")
def _materialize(s, blocks, g, c, pid, t, k_req, num_decode):
    """Label ``blocks`` (new full blocks of one request, the last ``num_decode`` of them
    decode blocks) after metering them (`_admit`; decode blocks are charged only with
    ``ctl[C_CHARGE_DECODE]``). Returns ``(-1, class)``, or ``(i, NO_CLASS)`` without any change
    if ``blocks[i]`` is free or not a block id."""
    n = blocks.shape[0]
    N = s.ctl[C_N]
    for i in range(n):
        b = blocks[i]
        if b < 1 or b >= N or s.gmember[b] >= 0:
            return i, NO_CLASS
    if n == 0:
        return -1, k_req
    if s.ctl[C_PER_CALL] != 0:
        k_req = NO_CLASS
    free = 0 if s.ctl[C_CHARGE_DECODE] != 0 else min(max(num_decode, 0), n)
    k = _admit(s, n - free, g, c, pid, t, k_req)
    s.uncharged[g] += free
    for i in range(n):
        b = blocks[i]
        if s.cached[b] and s.owner[b] >= 0:
            s.cls_count[s.owner[b], s.klass[b]] -= 1
        _label(s, b, g, c, pid, k)
    return -1, k


@njit(cache=True)
def materialize(st, blocks, g, c, pid, t, k_req, num_decode):
    """Meter and label one request's new full ``blocks`` at ``t`` (`_materialize`:
    ``k_req`` the request's class from an earlier call or `NO_CLASS`, the last
    ``num_decode`` blocks decode blocks). Returns ``(D_g(t) after the charge in blocks, -1,
    class of the blocks)``, or ``(0.0, i, NO_CLASS)`` without any change if ``blocks[i]`` is
    free or not a block id (blocks must be in use)."""
    s = state(st)
    bad, k = _materialize(s, blocks, g, c, pid, t, k_req, num_decode)
    if bad >= 0:
        return 0.0, bad, NO_CLASS
    return group_debt(s.bal, s.t0, s.rho, s.beta, g, t), -1, k


@njit(cache=True, inline="always")
def _reuse(s, b, g, c, pid, t, debt):
    """Reuse evidence and the debt-gated class of cached block ``b`` hit by (g, c, pid) at
    ``t``: counts the hit, the promotion or gated promotion and the class counters, and returns
    ``(old class, new class, debt)``; ``debt`` is ``D_g(t)``, computed here at the first
    promotion-eligible block when the caller passes a negative one (hits charge nothing, so it
    holds for every block of a request). The block's lists and ``klass`` are the caller's."""
    if s.hits[b] < HITS_LIMIT:
        s.hits[b] += 1
    k_old = s.klass[b]
    k_new = k_old
    o = s.owner[b]
    if (s.ctl[C_SEGMENTATION] != 0 and k_old != REUSE and o == g and s.contract[b] == c
            and s.prefix[b] == pid):
        if debt < 0.0:
            debt = group_debt(s.bal, s.t0, s.rho, s.beta, g, t)
        eps = s.fctl[F_EPSILON]
        if s.ctl[C_DEBT_GATE] == 0 or debt <= eps:
            k_new = REUSE
            s.granted[g] += 1
            if debt > eps:
                s.in_debt[g] += 1
        else:
            s.gated[g] += 1
    if k_new != k_old and o >= 0:
        s.cls_count[o, k_old] -= 1
        s.cls_count[o, k_new] += 1
    return k_old, k_new, debt


@njit(cache=True, inline="always")
def _hit(s, blocks, g, c, pid, t):
    N = s.ctl[C_N]
    debt = -1.0
    for i in range(blocks.shape[0]):
        b = blocks[i]
        if not s.cached[b]:
            continue
        _k_old, k_new, debt = _reuse(s, b, g, c, pid, t, debt)
        o = s.owner[b]
        m = s.gmember[b]
        if m >= 0 and m < NUM_CLASSES:
            _unlink1(s.gprev, s.gnxt, s.gmember, s.glen, b)
            if o >= 0:
                _q_unlink(s, b)
            s.klass[b] = k_new
            s.seq[b] = _next_seq(s)
            _push_tail1(s.gprev, s.gnxt, s.gmember, s.glen, N, k_new, b)
            if o >= 0:
                _q_push_tail(s, NUM_CLASSES * o + k_new, b)
        else:
            s.klass[b] = k_new


@njit(cache=True, inline="always")
def _hit_candidate(s, b, g, c, pid, t):
    """``_hit``, ``_acquire``, ``_release(cached)`` of the one block ``b``, a cached free
    candidate (the replay's hit), in one pass with the same end state: the calls unlink b,
    relink it at the tail of its new class lists, unlink it and link it there again with a
    second stamp; here it is unlinked once, takes both stamps (renumbering, if due, happens
    while b is out of every list, as in the calls) and is linked once."""
    N = s.ctl[C_N]
    _k_old, k_new, _debt = _reuse(s, b, g, c, pid, t, -1.0)
    o = s.owner[b]
    _unlink1(s.gprev, s.gnxt, s.gmember, s.glen, b)
    if o >= 0:
        _q_unlink(s, b)
    s.klass[b] = k_new
    _next_seq(s)
    s.seq[b] = _next_seq(s)
    _push_tail1(s.gprev, s.gnxt, s.gmember, s.glen, N, k_new, b)
    if o >= 0:
        _q_push_tail(s, NUM_CLASSES * o + k_new, b)


@njit(cache=True)
def hit(st, blocks, g, c, pid, t):
    """Reuse of cached ``blocks`` by a request (g, c, pid) at ``t``: reuse evidence for each,
    promotion of eligible ones behind the debt gate. A hit block that is a free candidate moves
    to the most recent end of its (possibly new) class lists. Returns ``D_g(t)`` (blocks)."""
    s = state(st)
    _hit(s, blocks, g, c, pid, t)
    return group_debt(s.bal, s.t0, s.rho, s.beta, g, t)


@njit(cache=True, inline="always")
def _release(s, blocks, cached_mask):
    N = s.ctl[C_N]
    anchor = N + 2 * TRULY_FREE
    to_head = s.ctl[C_TF_TO_HEAD] != 0
    for i in range(blocks.shape[0]):
        b = blocks[i]
        if b < 1 or b >= N or s.gmember[b] >= 0:
            return i
        s.seq[b] = _next_seq(s)
        if cached_mask[i]:
            if not s.cached[b]:
                # a hashed block the policy never saw materialized: no owner, no evidence
                s.cached[b] = True
                s.owner[b] = -1
                s.contract[b] = -1
                s.prefix[b] = -1
                s.klass[b] = PROBATIONARY if s.ctl[C_SEGMENTATION] != 0 else NORMAL
                s.hits[b] = 0
            k = s.klass[b]
            _push_tail1(s.gprev, s.gnxt, s.gmember, s.glen, N, k, b)
            if s.owner[b] >= 0:
                _q_push_tail(s, NUM_CLASSES * s.owner[b] + k, b)
        else:
            if s.cached[b] and s.owner[b] >= 0:
                s.cls_count[s.owner[b], s.klass[b]] -= 1
            _forget(s, b)
            if to_head:
                _insert_after(s.gprev, s.gnxt, s.gmember, s.glen, anchor, TRULY_FREE, b)
                anchor = b
            else:
                _push_tail1(s.gprev, s.gnxt, s.gmember, s.glen, N, TRULY_FREE, b)
    return -1


@njit(cache=True)
def release(st, blocks, cached_mask):
    """``blocks`` reached ref_cnt 0, in vLLM's free order. Cached ones join the tail of their
    class lists (native order); the others lose any metadata and join the truly-free list: at its
    head in the given order in vLLM "current" mode, else at its tail. Returns -1, or the index i
    of the first block that is already free or not a block id (the blocks before it were
    released, the rest not)."""
    return _release(state(st), blocks, cached_mask)


@njit(cache=True, inline="always")
def _acquire(s, blocks):
    N = s.ctl[C_N]
    for i in range(blocks.shape[0]):
        b = blocks[i]
        if b < 1 or b >= N or s.gmember[b] < 0 or s.gmember[b] >= NUM_CLASSES:
            return i
        _unlink1(s.gprev, s.gnxt, s.gmember, s.glen, b)
        if s.owner[b] >= 0:
            _q_unlink(s, b)
    return -1


@njit(cache=True)
def acquire(st, blocks):
    """Free cached ``blocks`` taken back into use by a hit leave every list. Returns -1, or the
    index i of the first block that is not a free cached candidate (those before it left)."""
    return _acquire(state(st), blocks)


# ----------------------------------------------------------------------------- selection
@njit(cache=True, inline="always")
def _first_global(s):
    """The first free cached candidate over all groups (head of the lowest non-empty class
    list; class, then native order), or -1 if there is none."""
    N = s.ctl[C_N]
    for k in range(NUM_CLASSES):
        if s.glen[k] > 0:
            return s.gnxt[N + 2 * k]
    return -1


@njit(cache=True, inline="always")
def _count_eviction(s, b, requester):
    """Count the reclamation of cached block ``b`` by ``requester``: its owner's class count
    drops, the eviction matrix and the evicted-class counts (owner -1: the unknown column)."""
    o = s.owner[b]
    G = s.ctl[C_G]
    if o >= 0:
        s.cls_count[o, s.klass[b]] -= 1
        s.evictions[requester, o] += 1
        s.evicted_class[o, s.klass[b]] += 1
    else:
        s.evictions[requester, G] += 1
        s.evicted_class[G, s.klass[b]] += 1


@njit(cache=True, inline="always")
def _group_best(s, g):
    """(class, block) of group g's first candidate: head of its lowest non-empty class list."""
    N = s.ctl[C_N]
    for k in range(NUM_CLASSES):
        lst = NUM_CLASSES * g + k
        if s.qlen[lst] > 0:
            return k, s.qnxt[N + 2 * lst]
    return -1, -1


@njit(cache=True, inline="always")
def _better(s, a, b):
    """Group a goes before group b: larger P; ties: lower best class, then older best block.
    A strict total order over groups with candidates (best blocks differ and stamps within a
    class list are distinct), so the heap's pops do not depend on its insertion order."""
    if s.P[a] > s.P[b]:
        return True
    if s.P[a] < s.P[b]:
        return False
    ka, ba = _group_best(s, a)
    kb, bb = _group_best(s, b)
    if ka != kb:
        return ka < kb
    return s.seq[ba] < s.seq[bb]


@njit(cache=True, inline="always")
def _better_in(P, qlen, qnxt, seq, N, a, b):
    """`_better` over the arrays it reads (for `_sift_down`)."""
    if P[a] > P[b]:
        return True
    if P[a] < P[b]:
        return False
    ka = kb = -1
    ba = bb = -1
    for k in range(NUM_CLASSES):
        if qlen[NUM_CLASSES * a + k] > 0:
            ka, ba = k, qnxt[N + 2 * (NUM_CLASSES * a + k)]
            break
    for k in range(NUM_CLASSES):
        if qlen[NUM_CLASSES * b + k] > 0:
            kb, bb = k, qnxt[N + 2 * (NUM_CLASSES * b + k)]
            break
    if ka != kb:
        return ka < kb
    return seq[ba] < seq[bb]


@njit(cache=True)
def _sift_down(heap, size, i, P, qlen, qnxt, seq, N):
    """Restore the heap below ``i`` (a separate function taking only what it reads: inlined
    into the selection kernel its code slowed the common path without a heap)."""
    while True:
        left = 2 * i + 1
        if left >= size:
            return
        best = left
        right = left + 1
        if right < size and _better_in(P, qlen, qnxt, seq, N, heap[right], heap[left]):
            best = right
        if _better_in(P, qlen, qnxt, seq, N, heap[best], heap[i]):
            tmp = heap[i]
            heap[i] = heap[best]
            heap[best] = tmp
            i = best
        else:
            return


@njit(cache=True, inline="always")
def _has_candidates(s, g):
    base = NUM_CLASSES * g
    return s.qlen[base] + s.qlen[base + 1] + s.qlen[base + 2] > 0


@njit(cache=True, inline="always")
def _score_group(s, g, t):
    """Group g's ``D̃_g(t)`` into ``P[g]`` and True; or False for a group with no indebted
    contract at ``t`` (``W_g = 0``): cleared at ``t``, it stays cleared as the clock advances,
    so a debtor leaves the debtor list and the prune clock moves up to ``t`` (a clock stepping
    back behind it scores every group again)."""
    p, wmax = group_normalized_debt(s.bal, s.t0, s.rho, s.beta, s.w, g, t)
    if wmax == 0.0:
        if s.dpos[g] >= 0:
            _drop_debtor(s, g)
            if t > s.fctl[F_PRUNE_CLOCK]:
                s.fctl[F_PRUNE_CLOCK] = t
        return False
    s.P[g] = p
    return True


@njit(cache=True, inline="always")
def _select(s, n, t, requester, out, off):
    N = s.ctl[C_N]
    G = s.ctl[C_G]
    if G == 0:
        return -3
    if requester < 0 or requester >= G:
        return -2
    if t > s.fctl[F_CLOCK]:
        s.fctl[F_CLOCK] = t
    glen = s.glen
    if n < 0 or n > glen[0] + glen[1] + glen[2] + glen[3]:
        return -1
    eps = s.fctl[F_EPSILON]
    tf_head = N + 2 * TRULY_FREE
    k0 = 0
    while k0 < n and glen[TRULY_FREE] > 0:
        b = s.gnxt[tf_head]
        _unlink1(s.gprev, s.gnxt, s.gmember, glen, b)
        out[off + k0] = b
        k0 += 1
    if k0 == n:
        return k0
    size = 0
    if s.ctl[C_RESPONSIBILITY] != 0 and n - k0 == 1:
        # one reclamation: the unique best group (the heap's first pop), found by walking the
        # bound tree largest bound first; a subtree whose largest bound is below the best P so
        # far cannot hold a winner or a tie (ub >= P at every clock, module docstring)
        best = -1
        stack = s.heap
        stack[0] = 1
        sp = 1
        utree = s.utree
        while sp > 0:
            sp -= 1
            node = stack[sp]
            u = utree[node]
            if not u > eps or (best >= 0 and u < s.P[best]):
                continue
            if node < G:
                left = 2 * node
                if utree[left] >= utree[left + 1]:  # the larger child on top
                    stack[sp] = left + 1
                    stack[sp + 1] = left
                else:
                    stack[sp] = left
                    stack[sp + 1] = left + 1
                sp += 2
                continue
            g = node - G
            if not _has_candidates(s, g) or not _score_group(s, g, t):
                continue
            if s.P[g] > eps and (best < 0 or _better(s, g, best)):
                best = g
        if best >= 0:
            s.heap[0] = best
            size = 1
    elif s.ctl[C_RESPONSIBILITY] != 0:
        if t >= s.fctl[F_PRUNE_CLOCK]:
            # only debtors can owe at t (module docstring); a debtor seen cleared is dropped
            for i in range(s.ctl[C_NUM_DEBTORS] - 1, -1, -1):
                g = s.debtors[i]
                if not _score_group(s, g, t):
                    continue
                if s.P[g] > eps and _has_candidates(s, g):
                    s.heap[size] = g
                    size += 1
        else:  # the clock stepped back behind a drop: every group, as the spec reads
            for g in range(G):
                if not _has_candidates(s, g):
                    continue
                p, wmax = group_normalized_debt(s.bal, s.t0, s.rho, s.beta, s.w, g, t)
                s.P[g] = p
                if p > eps:
                    s.heap[size] = g
                    size += 1
        for i in range(size // 2 - 1, -1, -1):
            _sift_down(s.heap, size, i, s.P, s.qlen, s.qnxt, s.seq, N)
    for j in range(k0, n):
        if size > 0:
            gs = s.heap[0]
            _k, b = _group_best(s, gs)
            _q_unlink(s, b)
            _unlink1(s.gprev, s.gnxt, s.gmember, glen, b)
            # W_g(t), recomputed (buckets do not change during a selection)
            s.P[gs] -= 1.0 / group_normalized_debt(s.bal, s.t0, s.rho, s.beta, s.w, gs, t)[1]
            if not _has_candidates(s, gs) or not s.P[gs] > eps:
                size -= 1
                s.heap[0] = s.heap[size]
            if size > 1 and j + 1 < n:
                _sift_down(s.heap, size, 0, s.P, s.qlen, s.qnxt, s.seq, N)
        else:
            b = _first_global(s)
            _unlink1(s.gprev, s.gnxt, s.gmember, glen, b)
            if s.owner[b] >= 0:
                _q_unlink(s, b)
        _count_eviction(s, b, requester)
        _forget(s, b)
        out[off + j] = b
    return k0


@njit(cache=True)
def select(st, n, t, requester, out, off):
    """Take ``n`` free blocks into ``out[off:off + n]``.

    Truly free blocks first (work conservation); then reclamation by projected debt:
    ``P_g = D̃_g(t)`` for every group owning a candidate; while some such group has
    ``P_g > eps``, the one with the largest ``P_g`` (ties: lowest best class, then oldest best
    block) gives its first candidate (class order, then native order) and ``P_g -= 1 / W_g(t)``;
    otherwise the first candidate globally (class, then native order). A binary heap over the
    indebted groups makes each victim O(log G) and only debtors are scored; one victim walks the
    max tree of debt bounds and scores only the groups whose bound can reach the best so far
    (module docstring), at any clock.
    Each reclaimed cached block is evicted: its metadata is dropped and
    ``evictions[requester, owner]`` (column G = unknown owner) and
    ``evicted_class[owner, class]`` (row G = unknown owner) counted.
    Returns the number of truly free blocks handed out (the rest were evictions), or without
    any change -1 if fewer than ``n`` blocks are free, -2 if ``requester`` is not a group id,
    -3 if no groups are bound."""
    return _select(state(st), n, t, requester, out, off)


@njit(cache=True, _nrt=False)
def select_at(st_addr, st_bytes, n, t, requester, out_addr, off):
    """`select` on the packed buffer of ``st_bytes`` bytes at address ``st_addr``, writing
    into the int32 array at ``out_addr`` (the policy's fast path: scalar arguments only; the
    caller keeps both arrays alive and ``out`` at least ``off + n`` long). Compiled without
    numba's reference counting: it allocates nothing, and its arrays are unmanaged views."""
    st = _at_address(st_addr, st_bytes, np.uint8)
    out = _at_address(out_addr, off + n, np.int32)
    return _select(state(st), n, t, requester, out, off)


# ----------------------------------------------------------------------------- key-stream replay
PREFETCH_AHEAD = 16
"""The batch replay prefetches the hash slots of the request this many requests ahead."""

@njit(cache=True, inline="always")
def _first_candidate(s, g, t):
    """The block `_select` of one victim for requester ``g`` at ``t`` (the clock already
    advanced to ``t``) takes when it ranks no group: no truly free block, a free candidate, and
    no group that can owe at ``t`` (responsibility off, or no debtor and ``t`` at or after the
    prune clock); then it is the first candidate globally (class, then native order). -1 where
    the general selection must decide (or refuse)."""
    glen = s.glen
    if glen[TRULY_FREE] != 0 or g < 0 or g >= s.ctl[C_G]:
        return -1
    if s.ctl[C_RESPONSIBILITY] != 0 and (s.ctl[C_NUM_DEBTORS] != 0
                                        or not t >= s.fctl[F_PRUNE_CLOCK]):
        return -1
    return _first_global(s)


@njit(cache=True, inline="always")
def _miss_one(s, b, g, c, pid, t):
    """A replay miss on the one block ``b`` that `_first_candidate` gave: ``_select``'s
    eviction of b (requester g), ``_materialize`` of b for (g, c, pid) at ``t`` and
    ``_release(cached)`` of b, fused, with the same end state: the fields ``_forget`` would clear
    and ``_materialize`` set again are written once, and the n-block loops and the checks that
    cannot fail here (b was a free candidate) are gone. The debt-log sample of the charge (which
    reads only buckets and class counts) is the caller's, after this."""
    N = s.ctl[C_N]
    # eviction (the global-first branch of _select)
    _unlink1(s.gprev, s.gnxt, s.gmember, s.glen, b)
    if s.owner[b] >= 0:
        _q_unlink(s, b)
    _count_eviction(s, b, g)
    # materialize (one block, not cached after the eviction: no class count to take back)
    k = _admit(s, 1, g, c, pid, t, NO_CLASS)
    _label(s, b, g, c, pid, k)
    # release(cached): the stamp (renumbering, if due, while b is in no list), then the tails
    s.seq[b] = _next_seq(s)
    _push_tail1(s.gprev, s.gnxt, s.gmember, s.glen, N, k, b)
    _q_push_tail(s, NUM_CLASSES * g + k, b)


@njit(cache=True, inline="always")
def _prefetch_block(s, key_of, b):
    """Prefetch the lines of block ``b``'s per-block fields that a hit or an eviction of b
    reads or writes."""
    _prefetch(s.gprev, b)
    _prefetch(s.gnxt, b)
    _prefetch(s.gmember, b)
    _prefetch(s.qprev, b)
    _prefetch(s.qnxt, b)
    _prefetch(s.owner, b)
    _prefetch(s.contract, b)
    _prefetch(s.prefix, b)
    _prefetch(s.klass, b)
    _prefetch(s.cached, b)
    _prefetch(s.hits, b)
    _prefetch(s.seq, b)
    _prefetch(key_of, b)


@njit(cache=True, inline="always")
def _prefetch_next_miss(s, key_of, bk, bshift):
    """After a miss, prefetch what the next misses will touch if nothing else moves first: the
    next victim ``v1`` (the head of the lowest non-empty class list; its block lines were
    prefetched at the previous miss, so reading them here is cheap): the map slot of its key and
    its group-list neighbour; the block lines of the victim after it; the history's next LRU
    entry to leave (its home slot) and the one after it (its lines). Hints only: no value
    changes."""
    N = s.ctl[C_N]
    v1 = _first_global(s)
    if v1 >= 0:
        kv = key_of[v1]
        if kv >= 0:
            _prefetch(bk, _ht_slot(kv, bshift))
        q = s.qnxt[v1]
        if q >= 0:
            _prefetch(s.qprev, q)
        v2 = s.gnxt[v1]
        if v2 < N:
            _prefetch_block(s, key_of, v2)
    H = s.ctl[C_H]
    if s.ctl[C_HUSED] == H:
        e1 = s.hnxt[H]
        if e1 < H:
            _prefetch(s.htab, _h_home(s, s.hkey_g[e1], s.hkey_p[e1]))
            e2 = s.hnxt[e1]
            if e2 < H:
                _prefetch(s.hkey_g, e2)
                _prefetch(s.hkey_p, e2)
                _prefetch(s.hnxt, e2)
                _prefetch(s.hprev, e2)


@njit(cache=True, inline="always")
def _debt_log_append(log_t, log_g, log_d, log_cls, meta, max_samples, t, g, s):
    """`prefixshield.policies.prefixshield.DebtLog.append` of group g's charge at ``t``,
    on its arrays (``meta`` = size, stride, charges counted; the arrays hold
    ``min(max_samples, size + appends to come)`` rows, so "full" means ``max_samples`` as in
    the Python method). ``D_g(t)`` and the class snapshot are read from state ``s`` only for a
    sample that is kept (most charges are only counted)."""
    i = meta[2]
    meta[2] = i + 1
    stride = meta[1]
    # (the stride is a power of two, as DebtLog keeps it: a mask instead of an integer division)
    if max_samples == 0 or (i & (stride - 1) if stride & (stride - 1) == 0 else i % stride):
        return
    size = meta[0]
    if size == max_samples:
        keep = (size + 1) // 2
        for k in range(keep):
            log_t[k] = log_t[2 * k]
            log_g[k] = log_g[2 * k]
            log_d[k] = log_d[2 * k]
            for x in range(log_cls.shape[1]):  # a loop: a slice copy needs numba's NRT
                log_cls[k, x] = log_cls[2 * k, x]
        size = keep
        meta[1] *= 2
        if i % meta[1]:
            meta[0] = size
            return
    log_t[size] = t
    log_g[size] = g
    log_d[size] = group_debt(s.bal, s.t0, s.rho, s.beta, g, t)
    cls_count = s.cls_count
    G = cls_count.shape[0]
    for gg in range(G):
        for k in range(NUM_CLASSES):
            log_cls[size, NUM_CLASSES * gg + k] = cls_count[gg, k]
    meta[0] = size + 1


@njit(cache=True)
def replay_keys(st, keys, groups, contract, hits, block_of, key_of, table, bbits, log,
                max_samples):
    """The pure cache driver's loop (`prefixshield.simulator.cachedriver.replay_keys`)
    for PrefixShield in one kernel: request i (clock ``i`` s) of group ``groups[i]`` under
    ``contract`` with prefix_id = content key ``keys[i]``; a hit is ``on_hit, on_acquire,
    on_release(cached)`` of the key's block, a miss ``select_victims(1)``, ``on_materialize``
    (with its debt-log sample), ``on_release(cached)`` -- the policy's own event code, inlined.
    ``block_of`` (typed Dict key -> block) and ``key_of`` (int64 per block, -1: none) are
    read and written back; in between the key -> block map is the array hash table
    ``table = (bk, bv)`` (``2**bbits`` slots, ``bk`` filled with -1; keys >= 0). ``log`` is the
    debt log's columns ``(t, group, debt, classes, meta)`` (``meta``: size, stride, charges;
    updated), sampled as `_debt_log_append` does, at most ``max_samples`` rows. Returns -1, or
    the index of the request at which an event was illegal (the policy method would raise).

    Speed notes: the loop (`_replay`) is compiled without numba's reference-counted
    runtime (``_nrt=False``): with it, every inlined helper taking the state tuple increfed and
    decrefed its ~40 arrays, most of the loop's time. A hit on a free candidate (every hit here)
    takes the fused `_hit_candidate`; a miss that selection would settle without ranking
    a group (no truly free block, no group that can owe: `_first_candidate`, every miss of
    a steady state without debt) takes the fused `_miss_one` and then prefetches the next
    victims' lines (`_prefetch_next_miss`); the hash slots of the request
    `PREFETCH_AHEAD` requests later are prefetched."""
    s = state(st)
    N = s.ctl[C_N]
    bk, bv = table
    bshift = np.uint64(64 - bbits)
    bmask = (1 << bbits) - 1
    for kk, b in block_of.items():
        _ht_insert(bk, bv, kk, b, bshift, bmask)
    one = np.empty(1, dtype=np.int32)
    yes = np.ones(1, dtype=np.bool_)
    bad = _replay(st, keys, groups, contract, hits, key_of, table, bshift, bmask, log,
                  max_samples, one, yes)
    block_of.clear()
    for b in range(N):
        if key_of[b] >= 0:
            block_of[key_of[b]] = np.int32(b)
    return bad


@njit(cache=True, _nrt=False)
def _replay(st, keys, groups, contract, hits, key_of, table, bshift, bmask, log, max_samples,
            one, yes):
    """`replay_keys`'s loop over the requests, with the key -> block table ``(bk, bv)`` ready
    (``bshift``, ``bmask``: its hashing) and ``log`` the debt log's columns as `replay_keys`
    takes them; ``one`` (int32) and ``yes`` (bool, True) are one-element scratch arrays
    (allocating nothing, it runs without numba's NRT)."""
    bk, bv = table
    log_t, log_g, log_d, log_cls, log_meta = log
    s = state(st)
    n = keys.shape[0]
    for i in range(n):
        if i + PREFETCH_AHEAD < n:
            # the home slots of a later request's key (map, history): random reads that miss the
            # cache on large pools; fetched now, they are in cache when that request comes
            kd = keys[i + PREFETCH_AHEAD]
            h = _ht_slot(kd, bshift)
            _prefetch(bk, h)
            _prefetch(bv, h)
            _prefetch(s.htab, _h_home(s, groups[i + PREFETCH_AHEAD],
                                      prefix_key(s.ctl[C_PREFIX_SOURCE], kd, kd)))
        kk = keys[i]
        pid = prefix_key(s.ctl[C_PREFIX_SOURCE], kk, kk)  # a request is one block: its root
        g = groups[i]
        t = float(i)
        if t > s.fctl[F_CLOCK]:
            s.fctl[F_CLOCK] = t
        j = _ht_find(bk, kk, bshift, bmask)
        if j >= 0:
            hits[i] = True
            b = bv[j]
            m = s.gmember[b]
            if s.cached[b] and m >= 0 and m < NUM_CLASSES:
                _hit_candidate(s, b, g, contract, pid, t)
                continue
            one[0] = b
            _hit(s, one, g, contract, pid, t)
            if _acquire(s, one) >= 0 or _release(s, one, yes) >= 0:
                return i
            continue
        b = _first_candidate(s, g, t)
        fused = b >= 0
        if not fused:
            if _select(s, 1, t, g, one, 0) < 0:
                return i
            b = one[0]
        old = key_of[b]
        if old >= 0:
            _ht_delete(bk, bv, _ht_find(bk, old, bshift, bmask), bshift, bmask)
        key_of[b] = kk
        _ht_insert(bk, bv, kk, b, bshift, bmask)
        if fused:
            _miss_one(s, b, g, contract, pid, t)
            _debt_log_append(log_t, log_g, log_d, log_cls, log_meta, max_samples, t, g, s)
            _prefetch_next_miss(s, key_of, bk, bshift)
            continue
        if _materialize(s, one, g, contract, pid, t, NO_CLASS, 0)[0] >= 0:
            return i
        _debt_log_append(log_t, log_g, log_d, log_cls, log_meta, max_samples, t, g, s)
        if _release(s, one, yes) >= 0:
            return i
    return -1
