"""Numba kernels of the PrefixShield policy (DESIGN §5.4) over struct-of-arrays state.

Every public kernel here is one call per policy event (``on_materialize``, ``on_hit``,
``on_release``, ``on_acquire``, ``select_victims``); none loops in Python per block. The formulas
live here once; :mod:`prefixshield.policies.prefixshield` only owns the arrays and calls these.

State layout (all numpy, indexed by block id ``b < num_blocks`` unless said otherwise):

* ``owner[b]`` (int32): group that materialized b's cached content, -1 if none/unknown;
  ``contract[b]`` (int32), ``prefix[b]`` (int64): the request's contract and prefix_id;
  ``klass[b]`` (int8): retention class, PROBATIONARY=0 < NORMAL=1 < REUSE=2;
  ``cached[b]`` (bool): the policy believes b carries a hash; ``seq[b]`` (int64): native-order
  stamp (larger = more recent release); ``hits[b]`` (int64), ``last_access[b]`` (float64 s):
  reuse evidence.
* Global lists (one :class:`~prefixshield.policies.kernels.linkedlist.LinkedLists` with 4 lists,
  arrays ``g*``): list k in 0..2 = free cached candidates of class k over all groups, in native
  free order (oldest at the head); list 3 = truly free blocks, in reuse order.
* Group lists (another ``LinkedLists`` with 3·G lists, arrays ``q*``): list ``3·g + k`` = free
  cached candidates owned by group g in class k, oldest at the head. A candidate with an unknown
  owner is only in the global lists.
* Buckets: ``bal[g, c]`` (blocks), ``t0[g, c]`` (s); contract arrays ``rho[c]`` (blocks/s),
  ``beta[c]`` (blocks), ``w[c] = rho[c] / min(rho)``.

Because every list receives blocks at its tail in increasing ``seq`` order, "head of a list" is
"oldest in native order", and the best candidate of a group is the head of its lowest non-empty
class list (O(3)).
"""

from __future__ import annotations

from numba import njit

from prefixshield.policies.kernels.linkedlist import insert_after as _insert_after
from prefixshield.policies.kernels.linkedlist import push_tail_one as _push_tail1
from prefixshield.policies.kernels.linkedlist import unlink_one as _unlink1

PROBATIONARY = 0
NORMAL = 1
REUSE = 2
NUM_CLASSES = 3
TRULY_FREE = 3
"""Index of the truly-free list in the global lists (lists 0..2 are the classes)."""
NUM_GLOBAL_LISTS = 4


# ----------------------------------------------------------------------------- block metadata
@njit(cache=True, inline="always")
def _forget(b, cached, owner, contract, prefix, klass, hits):
    """Block ``b`` holds no content any more: no owner, contract, prefix, class or reuse."""
    cached[b] = False
    owner[b] = -1
    contract[b] = -1
    prefix[b] = -1
    klass[b] = PROBATIONARY
    hits[b] = 0


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


@njit(cache=True)
def group_debt(bal, t0, rho, beta, g, t):
    """Raw debt ``D_g(t) = Σ_c max(0, −B̂_{g,c}(t))`` in blocks."""
    d = 0.0
    for c in range(bal.shape[1]):
        x = -effective_balance(bal[g, c], t0[g, c], rho[c], beta[c], t)
        if x > 0.0:
            d += x
    return d


@njit(cache=True)
def group_normalized_debt(bal, t0, rho, beta, w, g, t):
    """``(D̃_g(t), W_g(t))``: ``Σ_c max(0, −B̂_{g,c}(t)) / w_c`` and the largest ``w_c`` over
    contracts with ``B̂_{g,c}(t) < 0`` (0.0 when g owes nothing)."""
    d = 0.0
    wmax = 0.0
    for c in range(bal.shape[1]):
        x = -effective_balance(bal[g, c], t0[g, c], rho[c], beta[c], t)
        if x > 0.0:
            d += x / w[c]
            if w[c] > wmax:
                wmax = w[c]
    return d, wmax


# ----------------------------------------------------------------------------- admission history
@njit(cache=True)
def _history_admit(hmap, hkey_g, hkey_p, hprev, hnxt, hused, g, pid):
    """Record an admission of ``(g, pid)`` in the LRU set; True if it was not in the set."""
    cap = hkey_g.shape[0]
    head = cap
    tail = cap + 1
    key = (g, pid)
    if key in hmap:
        s = hmap[key]
        p = hprev[s]
        q = hnxt[s]
        hnxt[p] = q
        hprev[q] = p
        first = False
    else:
        if hused[0] < cap:
            s = hused[0]
            hused[0] += 1
        else:
            s = hnxt[head]
            p = hprev[s]
            q = hnxt[s]
            hnxt[p] = q
            hprev[q] = p
            del hmap[(hkey_g[s], hkey_p[s])]
        hkey_g[s] = g
        hkey_p[s] = pid
        hmap[key] = s
        first = True
    last = hprev[tail]
    hprev[s] = last
    hnxt[s] = tail
    hnxt[last] = s
    hprev[tail] = s
    return first


# ----------------------------------------------------------------------------- events
@njit(cache=True)
def materialize(blocks, g, c, pid, t, bal, t0, rho, beta, eps, segmentation, gmember,
                hmap, hkey_g, hkey_p, hprev, hnxt, hused,
                owner, contract, prefix, klass, cached, hits, last_access,
                cls_count, charged, materialized):
    """Charge one request's ``n_r = len(blocks)`` new full blocks to bucket (g, c) at ``t`` and
    label the blocks (owner, contract, prefix, initial class). Returns ``(D_g(t) after the
    charge in blocks, -1)``, or ``(0.0, i)`` without any change if ``blocks[i]`` is free or not
    a block id (blocks must be in use)."""
    n = blocks.shape[0]
    num_blocks = owner.shape[0]
    for i in range(n):
        b = blocks[i]
        if b < 1 or b >= num_blocks or gmember[b] >= 0:
            return 0.0, i
    if n == 0:
        return group_debt(bal, t0, rho, beta, g, t), -1
    bal[g, c] = effective_balance(bal[g, c], t0[g, c], rho[c], beta[c], t) - n
    t0[g, c] = t
    charged[g, c] += n
    first = _history_admit(hmap, hkey_g, hkey_p, hprev, hnxt, hused, g, pid)
    if not segmentation:
        k = NORMAL
    elif bal[g, c] < -eps:
        k = PROBATIONARY
    elif first:
        k = PROBATIONARY
    else:
        k = NORMAL
    for i in range(n):
        b = blocks[i]
        if cached[b] and owner[b] >= 0:
            cls_count[owner[b], klass[b]] -= 1
        owner[b] = g
        contract[b] = c
        prefix[b] = pid
        klass[b] = k
        cached[b] = True
        hits[b] = 0
        last_access[b] = t
        cls_count[g, k] += 1
        materialized[g] += 1
    return group_debt(bal, t0, rho, beta, g, t), -1


@njit(cache=True)
def hit(blocks, g, c, pid, t, bal, t0, rho, beta, eps, segmentation, debt_gate,
        gprev, gnxt, gmember, glen, qprev, qnxt, qmember, qlen,
        owner, contract, prefix, klass, cached, seq, seq_counter, hits, last_access,
        cls_count, granted, gated, in_debt):
    """Reuse of cached ``blocks`` by a request (g, c, pid) at ``t``: reuse evidence for each,
    promotion of eligible ones behind the debt gate. A hit block that is a free candidate moves
    to the most recent end of its (possibly new) class lists. Returns ``D_g(t)`` (blocks)."""
    num_blocks = owner.shape[0]
    debt = group_debt(bal, t0, rho, beta, g, t)
    gate_open = (not debt_gate) or debt <= eps
    for i in range(blocks.shape[0]):
        b = blocks[i]
        if not cached[b]:
            continue
        hits[b] += 1
        last_access[b] = t
        k_old = klass[b]
        k_new = k_old
        if (segmentation and k_old != REUSE and owner[b] == g and contract[b] == c
                and prefix[b] == pid):
            if gate_open:
                k_new = REUSE
                granted[g] += 1
                if debt > eps:
                    in_debt[g] += 1
            else:
                gated[g] += 1
        o = owner[b]
        if k_new != k_old and o >= 0:
            cls_count[o, k_old] -= 1
            cls_count[o, k_new] += 1
        if gmember[b] >= 0 and gmember[b] < NUM_CLASSES:
            _unlink1(gprev, gnxt, gmember, glen, b)
            if o >= 0:
                _unlink1(qprev, qnxt, qmember, qlen, b)
            klass[b] = k_new
            seq[b] = seq_counter[0]
            seq_counter[0] += 1
            _push_tail1(gprev, gnxt, gmember, glen, num_blocks, k_new, b)
            if o >= 0:
                _push_tail1(qprev, qnxt, qmember, qlen, num_blocks, NUM_CLASSES * o + k_new, b)
        else:
            klass[b] = k_new
    return debt


@njit(cache=True)
def release(blocks, cached_mask, truly_free_to_head, segmentation,
            gprev, gnxt, gmember, glen, qprev, qnxt, qmember, qlen,
            owner, contract, prefix, klass, cached, seq, seq_counter, hits, cls_count):
    """``blocks`` reached ref_cnt 0, in vLLM's free order. Cached ones join the tail of their
    class lists (native order); the others lose any metadata and join the truly-free list: at its
    head in the given order if ``truly_free_to_head`` (vLLM "current"), else at its tail.
    Returns -1, or the index i of the first block that is already free or not a block id (the
    blocks before it were released, the rest not)."""
    num_blocks = owner.shape[0]
    anchor = num_blocks + 2 * TRULY_FREE
    for i in range(blocks.shape[0]):
        b = blocks[i]
        if b < 1 or b >= num_blocks or gmember[b] >= 0:
            return i
        seq[b] = seq_counter[0]
        seq_counter[0] += 1
        if cached_mask[i]:
            if not cached[b]:
                # a hashed block the policy never saw materialized: no owner, no evidence
                cached[b] = True
                owner[b] = -1
                contract[b] = -1
                prefix[b] = -1
                klass[b] = PROBATIONARY if segmentation else NORMAL
                hits[b] = 0
            k = klass[b]
            _push_tail1(gprev, gnxt, gmember, glen, num_blocks, k, b)
            if owner[b] >= 0:
                _push_tail1(qprev, qnxt, qmember, qlen, num_blocks, NUM_CLASSES * owner[b] + k, b)
        else:
            if cached[b] and owner[b] >= 0:
                cls_count[owner[b], klass[b]] -= 1
            _forget(b, cached, owner, contract, prefix, klass, hits)
            if truly_free_to_head:
                _insert_after(gprev, gnxt, gmember, glen, anchor, TRULY_FREE, b)
                anchor = b
            else:
                _push_tail1(gprev, gnxt, gmember, glen, num_blocks, TRULY_FREE, b)
    return -1


@njit(cache=True)
def acquire(blocks, gprev, gnxt, gmember, glen, qprev, qnxt, qmember, qlen):
    """Free cached ``blocks`` taken back into use by a hit leave every list. Returns -1, or the
    index i of the first block that is not a free cached candidate (those before it left)."""
    num_blocks = gmember.shape[0]
    for i in range(blocks.shape[0]):
        b = blocks[i]
        if b < 1 or b >= num_blocks or gmember[b] < 0 or gmember[b] >= NUM_CLASSES:
            return i
        _unlink1(gprev, gnxt, gmember, glen, b)
        if qmember[b] >= 0:
            _unlink1(qprev, qnxt, qmember, qlen, b)
    return -1


# ----------------------------------------------------------------------------- selection
@njit(cache=True, inline="always")
def _group_best(qnxt, qlen, num_blocks, g):
    """(class, block) of group g's first candidate: head of its lowest non-empty class list."""
    for k in range(NUM_CLASSES):
        lst = NUM_CLASSES * g + k
        if qlen[lst] > 0:
            return k, qnxt[num_blocks + 2 * lst]
    return -1, -1


@njit(cache=True)
def _better(a, b, P, qnxt, qlen, seq, num_blocks):
    """Group a goes before group b: larger P; ties: lower best class, then older best block."""
    if P[a] > P[b]:
        return True
    if P[a] < P[b]:
        return False
    ka, ba = _group_best(qnxt, qlen, num_blocks, a)
    kb, bb = _group_best(qnxt, qlen, num_blocks, b)
    if ka != kb:
        return ka < kb
    return seq[ba] < seq[bb]


@njit(cache=True)
def _sift_down(heap, size, i, P, qnxt, qlen, seq, num_blocks):
    while True:
        left = 2 * i + 1
        if left >= size:
            return
        best = left
        right = left + 1
        if right < size and _better(heap[right], heap[left], P, qnxt, qlen, seq, num_blocks):
            best = right
        if _better(heap[best], heap[i], P, qnxt, qlen, seq, num_blocks):
            tmp = heap[i]
            heap[i] = heap[best]
            heap[best] = tmp
            i = best
        else:
            return


@njit(cache=True)
def select(n, t, requester, out, bal, t0, rho, beta, w, eps, responsibility,
           gprev, gnxt, gmember, glen, qprev, qnxt, qmember, qlen,
           owner, contract, prefix, klass, cached, seq, hits, cls_count, evictions,
           evicted_class, P, W, heap):
    """Take ``n`` free blocks into ``out`` (caller guarantees ``n`` ≤ free blocks).

    Truly free blocks first (work conservation); then reclamation by projected debt:
    ``P_g = D̃_g(t)`` for every group owning a candidate; while some such group has
    ``P_g > eps``, the one with the largest ``P_g`` (ties: lowest best class, then oldest best
    block) gives its first candidate (class order, then native order) and ``P_g -= 1 / W_g(t)``;
    otherwise the first candidate globally (class, then native order). A binary heap over the
    indebted groups makes each victim O(log G). Each reclaimed cached block is evicted: its
    metadata is dropped and ``evictions[requester, owner]`` (column G = unknown owner) and
    ``evicted_class[owner, class]`` (row G = unknown owner) counted.
    Returns the number of truly free blocks handed out (the rest were evictions)."""
    num_blocks = owner.shape[0]
    G = bal.shape[0]
    tf_head = num_blocks + 2 * TRULY_FREE
    k0 = 0
    while k0 < n and glen[TRULY_FREE] > 0:
        b = gnxt[tf_head]
        _unlink1(gprev, gnxt, gmember, glen, b)
        out[k0] = b
        k0 += 1
    if k0 == n:
        return k0
    size = 0
    if responsibility:
        for g in range(G):
            P[g] = 0.0
            W[g] = 0.0
            base = NUM_CLASSES * g
            if qlen[base] + qlen[base + 1] + qlen[base + 2] == 0:
                continue
            p, wmax = group_normalized_debt(bal, t0, rho, beta, w, g, t)
            P[g] = p
            W[g] = wmax
            if p > eps:
                heap[size] = g
                size += 1
        for i in range(size // 2 - 1, -1, -1):
            _sift_down(heap, size, i, P, qnxt, qlen, seq, num_blocks)
    for j in range(k0, n):
        if size > 0:
            gs = heap[0]
            _k, b = _group_best(qnxt, qlen, num_blocks, gs)
            _unlink1(qprev, qnxt, qmember, qlen, b)
            _unlink1(gprev, gnxt, gmember, glen, b)
            P[gs] -= 1.0 / W[gs]
            base = NUM_CLASSES * gs
            if qlen[base] + qlen[base + 1] + qlen[base + 2] == 0 or not P[gs] > eps:
                size -= 1
                heap[0] = heap[size]
            if size > 1:
                _sift_down(heap, size, 0, P, qnxt, qlen, seq, num_blocks)
        else:
            b = -1
            for k in range(NUM_CLASSES):
                if glen[k] > 0:
                    b = gnxt[num_blocks + 2 * k]
                    break
            _unlink1(gprev, gnxt, gmember, glen, b)
            if qmember[b] >= 0:
                _unlink1(qprev, qnxt, qmember, qlen, b)
        o = owner[b]
        if o >= 0:
            cls_count[o, klass[b]] -= 1
            evictions[requester, o] += 1
            evicted_class[o, klass[b]] += 1
        else:
            evictions[requester, G] += 1
            evicted_class[G, klass[b]] += 1
        _forget(b, cached, owner, contract, prefix, klass, hits)
        out[j] = b
    return k0
