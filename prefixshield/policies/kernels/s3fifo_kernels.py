"""Numba kernels of the S3-FIFO policy (see ``prefixshield/policies/s3fifo.py`` for semantics).

State layout (struct of arrays, all indexed by block id):

* three intrusive lists in one `LinkedLists`
  (``prev``/``nxt``/``member``/``length``): list ``FREE`` holds truly free blocks (no content),
  ``SMALL`` and ``MAIN`` are S3-FIFO's two FIFO queues, head = oldest;
* ``freq`` (int8): the capped access counter of a queued block;
* ``in_use`` (bool): the block is pinned (taken by a request and not yet released);
* ``key`` (uint64): content key of a queued block (what goes to the ghost);
* ``cnt`` (int64): counters, indexed by the ``C_*`` constants below (``cnt[SMALL]`` and
  ``cnt[MAIN]`` are the numbers of pinned blocks in each queue);
* ``params`` (int64): the ``P_*`` constants below;
* the ghost FIFO, in three arrays: ``gkeys`` (uint64 ring of the keys in FIFO order, capacity
  ``ghost_size + num_blocks + num_blocks // 4 + 2``, see `ghost_sizes`), ``gtab`` (int32
  open-addressing table of ``2**bits`` slots: -1, or the ring index of a live key -- the key
  itself is read from ``gkeys``, so a slot costs 4 bytes) and ``gpos`` (int64: ``G_HEAD`` and
  ``G_TAIL``, absolute ring positions of the oldest entry and one past the newest; ``G_LIVE``,
  the live keys; ``G_BITS``). Any uint64 is a key (0 and 2**64 - 1 included: emptiness is in
  ``gtab``). The ring entry at position ``p`` is live iff the table maps its key to ``p %
  capacity``; a ghost hit deletes the key from the table only, leaving a stale entry that
  trimming skips, and a full ring is compacted in place (amortized O(1): a compaction frees at
  least ``num_blocks // 4 + 2`` entries, more than ``num_blocks`` in the steady state). Linear
  probing, Fibonacci hashing and backward-shift deletion as in
  `hashtable`. Nothing here allocates: the call-by-call
  kernels are compiled without numba's runtime (``_nrt=False``), so the fused event loop
  (`prefixshield.simulator.fused`) calls them. Keys evicted by one ``select_victims``
  call are appended untrimmed; the ghost is trimmed back to ``ghost_size`` (oldest first)
  after the next ``on_materialize`` has looked its keys up, or at the start of the next
  ``select_victims`` -- which reproduces libCacheSim's order (ghost lookup of the missed key
  *before* the eviction that makes room for it).

Every kernel is O(1) per block except eviction, which passes over the blocks it rotates (as
libCacheSim's S3-FIFO does).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from prefixshield.policies.kernels.hashtable import EMPTY as _EMPTY
from prefixshield.policies.kernels.hashtable import moves_back as _ht_moves_back
from prefixshield.policies.kernels.hashtable import probe_pairs as _ht_probe_pairs
from prefixshield.policies.kernels.hashtable import slot as _ht_slot
from prefixshield.policies.kernels.hashtable import table_bits
from prefixshield.policies.kernels.linkedlist import move_to_tail_one as _move_to_tail1
from prefixshield.policies.kernels.linkedlist import push_head_one as _push_head1
from prefixshield.policies.kernels.linkedlist import push_tail_one as _push_tail1
from prefixshield.policies.kernels.linkedlist import unlink_one as _unlink1

FREE = 0
SMALL = 1
MAIN = 2
NUM_LISTS = 3

# counters (cnt[SMALL], cnt[MAIN] = pinned blocks in that queue)
C_HAS_EVICTED = 0
C_PROMOTIONS = 3          # small -> main because freq >= move_to_main_threshold
C_EVICTED_SMALL = 4       # reclaimed from small (key goes to the ghost)
C_EVICTED_MAIN = 5        # reclaimed from main
C_MAIN_REINSERTS = 6      # main head with freq >= 1 reinserted at main tail (freq - 1)
C_GHOST_HITS = 7          # materialized content found in the ghost -> inserted into main
C_WARMUP_MAIN_INSERTS = 8  # inserted into main because small was full before any eviction
C_PINNED_KEPT_SMALL = 9   # pinned block at small head moved to small tail
C_PINNED_KEPT_MAIN = 10   # pinned block with freq 0 at main head moved to main tail
C_TRULY_FREE_TAKEN = 11   # victims that were truly free blocks (no eviction)
NUM_COUNTERS = 12

P_SMALL_SIZE = 0
P_MAIN_SIZE = 1
P_GHOST_SIZE = 2
P_THRESHOLD = 3
P_FREQ_CAP = 4
P_CURRENT_MODE = 5
NUM_PARAMS = 6

# gpos slots
G_HEAD = 0   # absolute ring position of the oldest entry (live or stale)
G_TAIL = 1   # one past the newest
G_LIVE = 2   # live ghost keys (keys in gtab)
G_BITS = 3   # log2 of gtab's slots
NUM_GPOS = 4


def ghost_sizes(num_blocks: int, ghost_size: int) -> tuple[int, int]:
    """(ring capacity, log2 of table slots) of the ghost. Live keys never exceed ``ghost_size +
    num_blocks - 1`` (``ghost_size`` plus the keys of one allocation), so the ring keeps at
    least ``num_blocks // 4 + 2`` entries free after a compaction, and the table keeps an empty
    slot (its load is <= 1/2 at ``ghost_size`` keys, the steady state). No ghost: a ring of one
    entry and the smallest table."""
    if ghost_size <= 0:
        return 1, 4
    cap = ghost_size + num_blocks + num_blocks // 4 + 2
    bits = table_bits(ghost_size)
    while (1 << bits) < ghost_size + num_blocks + 1:
        bits += 1
    return cap, bits


@njit(cache=True, inline="always")
def num_free(length, cnt):
    """Free blocks: truly free ones plus the unpinned blocks of small and main."""
    return length[FREE] + length[SMALL] - cnt[SMALL] + length[MAIN] - cnt[MAIN]


@njit(cache=True, inline="always")
def _g_probe(gkeys, gtab, shift, mask, k):
    """Slot of ``gtab`` naming ``k``'s ring entry, else the empty slot where its probe ends."""
    j = _ht_slot(k, shift)
    while True:
        i = gtab[j]
        if i < 0 or gkeys[i] == k:
            return j
        j = (j + 1) & mask


@njit(cache=True, inline="always")
def _g_delete(gkeys, gtab, shift, mask, i):
    """Empty slot ``i`` of ``gtab`` by backward-shift deletion (home slots from ``gkeys``)."""
    j = i
    while True:
        j = (j + 1) & mask
        x = gtab[j]
        if x < 0:
            break
        if _ht_moves_back(_ht_slot(gkeys[x], shift), i, j):
            gtab[i] = x
            i = j
    gtab[i] = -1


@njit(cache=True, inline="always")
def _g_shift_mask(gtab, gpos):
    """(``shift``, ``mask``) of the ghost table for `_g_probe` / `_g_delete`."""
    return np.uint64(64 - gpos[G_BITS]), gtab.shape[0] - 1


@njit(cache=True, _nrt=False)
def ghost_insert(gkeys, gtab, gpos, ghost_size, k):
    """Append content key ``k`` to the ghost FIFO (no trimming: see `ghost_trim`).

    A key already in the ghost is left where it is (libCacheSim's ghost ``get`` is a hit). A
    full ring is compacted in place first (live entries keep their order)."""
    if ghost_size <= 0:
        return
    shift, mask = _g_shift_mask(gtab, gpos)
    j = _g_probe(gkeys, gtab, shift, mask, k)
    if gtab[j] >= 0:
        return
    cap = gkeys.shape[0]
    head = gpos[G_HEAD]
    tail = gpos[G_TAIL]
    if tail - head >= cap:
        # every position of the window names a distinct ring index: moving live entries
        # towards the head overwrites only entries already read
        w = head
        for p in range(head, tail):
            i = p % cap
            old = gkeys[i]
            s = _g_probe(gkeys, gtab, shift, mask, old)
            if gtab[s] == i:
                wi = w % cap
                gkeys[wi] = old
                gtab[s] = wi
                w += 1
        tail = w
    i = tail % cap
    gkeys[i] = k
    gtab[j] = i  # compaction moves no table slot: j is still k's empty slot
    gpos[G_TAIL] = tail + 1
    gpos[G_LIVE] += 1


@njit(cache=True, _nrt=False)
def ghost_trim(gkeys, gtab, gpos, ghost_size):
    """Drop the oldest ghost keys until at most ``ghost_size`` remain."""
    if gpos[G_LIVE] <= ghost_size:
        return
    shift, mask = _g_shift_mask(gtab, gpos)
    cap = gkeys.shape[0]
    head = gpos[G_HEAD]
    tail = gpos[G_TAIL]
    live = gpos[G_LIVE]
    while live > ghost_size and head < tail:
        i = head % cap
        head += 1
        j = _g_probe(gkeys, gtab, shift, mask, gkeys[i])
        if gtab[j] == i:
            _g_delete(gkeys, gtab, shift, mask, j)
            live -= 1
    gpos[G_HEAD] = head
    gpos[G_LIVE] = live


@njit(cache=True, _nrt=False)
def ghost_remove(gkeys, gtab, gpos, k):
    """Remove ``k`` from the ghost if it is there (a ghost hit); whether it was. Its ring entry
    goes stale."""
    shift, mask = _g_shift_mask(gtab, gpos)
    j = _g_probe(gkeys, gtab, shift, mask, k)
    if gtab[j] < 0:
        return False
    _g_delete(gkeys, gtab, shift, mask, j)
    gpos[G_LIVE] -= 1
    return True


@njit(cache=True, _nrt=False)
def _evict_small(prev, nxt, member, length, num_blocks, freq, in_use, key, cnt, params,
                 gkeys, gtab, gpos, update_ghost):
    """libCacheSim ``S3FIFO_evict_small`` with pinning; returns the evicted block or -1."""
    head = num_blocks + 2 * SMALL
    while length[SMALL] > 0:
        if length[SMALL] - cnt[SMALL] == 0:
            return -1
        b = nxt[head]
        if freq[b] >= params[P_THRESHOLD]:
            _move_to_tail1(prev, nxt, member, length, num_blocks, MAIN, b)
            freq[b] = 0
            if in_use[b]:
                cnt[SMALL] -= 1
                cnt[MAIN] += 1
            cnt[C_PROMOTIONS] += 1
        elif in_use[b]:
            _move_to_tail1(prev, nxt, member, length, num_blocks, SMALL, b)
            cnt[C_PINNED_KEPT_SMALL] += 1
        else:
            _unlink1(prev, nxt, member, length, b)
            if update_ghost:
                ghost_insert(gkeys, gtab, gpos, params[P_GHOST_SIZE], key[b])
            freq[b] = 0
            key[b] = 0
            cnt[C_EVICTED_SMALL] += 1
            return b
    return -1


@njit(cache=True, _nrt=False)
def _evict_main(prev, nxt, member, length, num_blocks, freq, in_use, key, cnt):
    """libCacheSim ``S3FIFO_evict_main`` with pinning; returns the evicted block or -1."""
    head = num_blocks + 2 * MAIN
    while length[MAIN] > 0:
        if length[MAIN] - cnt[MAIN] == 0:
            return -1
        b = nxt[head]
        f = freq[b]
        if f >= 1:
            _move_to_tail1(prev, nxt, member, length, num_blocks, MAIN, b)
            freq[b] = min(f, 3) - 1
            cnt[C_MAIN_REINSERTS] += 1
        elif in_use[b]:
            _move_to_tail1(prev, nxt, member, length, num_blocks, MAIN, b)
            cnt[C_PINNED_KEPT_MAIN] += 1
        else:
            _unlink1(prev, nxt, member, length, b)
            key[b] = 0
            cnt[C_EVICTED_MAIN] += 1
            return b
    return -1


@njit(cache=True, _nrt=False)
def _evict_one(prev, nxt, member, length, num_blocks, freq, in_use, key, cnt, params,
               gkeys, gtab, gpos, update_ghost):
    """Reclaim one unpinned queued block (libCacheSim's ``S3FIFO_evict`` loop); -1 if none."""
    while True:
        small_free = length[SMALL] - cnt[SMALL]
        main_free = length[MAIN] - cnt[MAIN]
        if small_free + main_free <= 0:
            return -1
        cnt[C_HAS_EVICTED] = 1
        if (length[MAIN] > params[P_MAIN_SIZE] or small_free == 0) and main_free > 0:
            b = _evict_main(prev, nxt, member, length, num_blocks, freq, in_use, key, cnt)
        else:
            b = _evict_small(prev, nxt, member, length, num_blocks, freq, in_use, key, cnt,
                             params, gkeys, gtab, gpos, update_ghost)
        if b >= 0:
            return b


@njit(cache=True, _nrt=False)
def select_victims(n, out, lists, num_blocks, freq, in_use, key, cnt, params, ghost,
                   update_ghost):
    """Fill ``out[:n]`` with the next ``n`` free blocks (truly free first, then reclaimed ones);
    they become in use. Returns how many were found (``< n`` only if fewer were free).

    ``lists`` is the queues' ``(prev, nxt, member, length)`` and ``ghost`` the ghost's
    ``(gkeys, gtab, gpos)`` (see the module docstring); ``update_ghost``: reclaimed keys join
    the ghost (False: the ghost is left as it is, for a dry run on copies)."""
    prev, nxt, member, length = lists
    gkeys, gtab, gpos = ghost
    free_head = num_blocks + 2 * FREE
    if update_ghost:
        ghost_trim(gkeys, gtab, gpos, params[P_GHOST_SIZE])
    for i in range(n):
        if length[FREE] > 0:
            b = nxt[free_head]
            _unlink1(prev, nxt, member, length, b)
            cnt[C_TRULY_FREE_TAKEN] += 1
        else:
            b = _evict_one(prev, nxt, member, length, num_blocks, freq, in_use, key, cnt, params,
                           gkeys, gtab, gpos, update_ghost)
            if b < 0:
                return i
        in_use[b] = True
        out[i] = b
    return n


@njit(cache=True, _nrt=False)
def on_hit(blocks, member, freq, freq_cap):
    """freq += 1 (capped) for every queued block of ``blocks``."""
    for b in blocks:
        m = member[b]
        if (m == SMALL or m == MAIN) and freq[b] < freq_cap:
            freq[b] += 1


@njit(cache=True, _nrt=False)
def on_acquire(blocks, member, in_use, cnt):
    """Pin free queued blocks (queue positions unchanged). Returns the number of bad blocks."""
    bad = 0
    for b in blocks:
        m = member[b]
        if in_use[b] or not (m == SMALL or m == MAIN):
            bad += 1
            continue
        in_use[b] = True
        cnt[m] += 1
    return bad


_TO_FREE = -2  # member[] mark of a block on_release is about to link into the free list


@njit(cache=True, _nrt=False)
def on_release(blocks, cached, prev, nxt, member, length, num_blocks, in_use, key, cnt,
               current_mode):
    """Unpin ``blocks``; cached ones keep their queue position, the others become truly free
    (``current_mode``: at the head of the free list, reading in the given order; else at its
    tail). Returns the number of bad blocks (not in use, or cached but unknown). Allocates
    nothing: blocks to free are marked in ``member`` between the two passes."""
    bad = 0
    n = blocks.shape[0]
    for i in range(n):
        b = blocks[i]
        if not in_use[b]:
            bad += 1
            continue
        in_use[b] = False
        m = member[b]
        if m == SMALL or m == MAIN:
            cnt[m] -= 1
            if not cached[i]:  # content dropped without a reclamation: leave the queues
                _unlink1(prev, nxt, member, length, b)
                key[b] = 0
                member[b] = _TO_FREE
        else:
            if cached[i]:
                bad += 1
            if m >= 0:  # a truly free block released again: relink it below
                _unlink1(prev, nxt, member, length, b)
            member[b] = _TO_FREE
    if current_mode:
        for i in range(n - 1, -1, -1):
            b = blocks[i]
            if member[b] == _TO_FREE:
                member[b] = -1
                _push_head1(prev, nxt, member, length, num_blocks, FREE, b)
    else:
        for i in range(n):
            b = blocks[i]
            if member[b] == _TO_FREE:
                member[b] = -1
                _push_tail1(prev, nxt, member, length, num_blocks, FREE, b)
    return bad


@njit(cache=True, _nrt=False)
def on_materialize(blocks, hashes, lists, num_blocks, freq, in_use, key, cnt, params, ghost):
    """Insert newly cached blocks (libCacheSim ``S3FIFO_insert``): ghost hit -> main tail;
    small full before the first eviction -> main tail; else small tail. freq = 0. Returns the
    number of bad blocks (truly free ones, which must be taken before they are materialized).

    ``lists`` and ``ghost`` as `select_victims` takes them."""
    prev, nxt, member, length = lists
    gkeys, gtab, gpos = ghost
    bad = 0
    for i in range(blocks.shape[0]):
        b = blocks[i]
        h = hashes[i]
        m = member[b]
        if m >= 0:
            if m == FREE:
                bad += 1
            elif in_use[b]:
                cnt[m] -= 1
            _unlink1(prev, nxt, member, length, b)
        key[b] = h
        freq[b] = 0
        if params[P_GHOST_SIZE] > 0 and ghost_remove(gkeys, gtab, gpos, h):
            q = MAIN
            cnt[C_GHOST_HITS] += 1
        elif cnt[C_HAS_EVICTED] == 0 and length[SMALL] >= params[P_SMALL_SIZE]:
            q = MAIN
            cnt[C_WARMUP_MAIN_INSERTS] += 1
        else:
            q = SMALL
        _push_tail1(prev, nxt, member, length, num_blocks, q, b)
        if in_use[b]:
            cnt[q] += 1
    ghost_trim(gkeys, gtab, gpos, params[P_GHOST_SIZE])
    return bad


@njit(cache=True)
def ghost_live_keys(gkeys, gtab, gpos):
    """The ghost's live keys, oldest first, and how many live ring entries there are (for tests
    and invariant checks: they must equal ``gpos[G_LIVE]``)."""
    shift, mask = _g_shift_mask(gtab, gpos)
    cap = gkeys.shape[0]
    out = np.empty(max(gpos[G_LIVE], 0), dtype=np.uint64)
    n = 0
    for p in range(gpos[G_HEAD], gpos[G_TAIL]):
        i = p % cap
        k = gkeys[i]
        if gtab[_g_probe(gkeys, gtab, shift, mask, k)] == i:
            if n < out.shape[0]:
                out[n] = k
            n += 1
    return out[:min(n, out.shape[0])], n


@njit(cache=True)
def replay_keys(keys, hits, block_of, key_of, lists, num_blocks, freq, in_use, key, cnt, params,
                ghost, freq_cap, current_mode):
    """The pure cache driver's loop for S3-FIFO in one kernel: for each key, a hit is
    ``on_hit, on_acquire, on_release(cached)``; a miss is ``select_victims(1)``,
    ``on_materialize``, ``on_release(cached)`` — the very kernels the policy's methods call.
    ``block_of`` maps content key -> block, ``key_of`` block -> key (-1: none); ``lists`` and
    ``ghost`` as `select_victims` takes them. Returns the number of illegal calls met (0 when
    the state was consistent)."""
    prev, nxt, member, length = lists
    gkeys, gtab, gpos = ghost
    one = np.empty(1, dtype=np.int32)
    one_key = np.empty(1, dtype=np.uint64)
    cached = np.ones(1, dtype=np.bool_)
    bad = 0
    for i in range(keys.shape[0]):
        kk = keys[i]
        if kk in block_of:
            hits[i] = True
            one[0] = block_of[kk]
            on_hit(one, member, freq, freq_cap)
            bad += on_acquire(one, member, in_use, cnt)
            bad += on_release(one, cached, prev, nxt, member, length, num_blocks, in_use, key,
                              cnt, current_mode)
            continue
        got = select_victims(1, one, lists, num_blocks, freq, in_use, key, cnt, params, ghost,
                             True)
        if got != 1:
            return bad + 1
        b = one[0]
        old = key_of[b]
        if old >= 0:
            del block_of[old]
        key_of[b] = kk
        block_of[kk] = b
        one_key[0] = np.uint64(kk)
        bad += on_materialize(one, one_key, lists, num_blocks, freq, in_use, key, cnt, params,
                              ghost)
        bad += on_release(one, cached, prev, nxt, member, length, num_blocks, in_use, key, cnt,
                          current_mode)
    return bad


# ---------------------------------------------------------------------------------------------
# Fused whole-stream replay (the pure cache driver without pinning), over one array hash table.
#
# ``replay_keys`` above runs the policy's own kernels with 1-element arrays, and keeps the
# key -> block map in a numba typed Dict and the ghost in its own ring and table.
# ``replay_keys_fused`` makes the same
# decisions (tested equal, request for request and state for state) with the miss path inlined
# and one open-addressing table ``tab`` for both maps: a key is either cached or a ghost (under
# the pure driver a key leaves the ghost when it is cached again, and enters it only when its
# block is reclaimed), so one entry per key carries its state in its value:
#
# * ``v >= 0``: the key is cached in block ``v`` (``slot_of[v]`` is the entry's slot);
# * ``v <= -2``: the key is a ghost appended at absolute ghost position ``p = -2 - v``; the
#   ghost FIFO is the ring ``ring[p & rmask]`` = the entry's slot. A ring position is live iff
#   the slot it names still holds ``-2 - p``; a ghost hit or a deletion leaves a stale position
#   that trimming skips, and a full ring is compacted in place (amortized O(1)).
#
# A miss then costs one probe for its key (the hit test and the ghost lookup at once), the
# victim's entry is found through ``slot_of`` and turned into a ghost in place (or deleted when
# the victim came from main), and trimming reaches its entry through the ring: the two maps'
# separate look-up, insert and delete are gone, and no probe is made for a key whose slot is
# known. Keys and values are interleaved (``tab[2j]``, ``tab[2j + 1]``) so that a hit reads its
# block from the cache line its probe already brought in. The policy's ``key`` and the
# driver's ``key_of`` follow from the table and are written once, at the end, with
# ``block_of`` and the policy's ghost (its ring restarting at position 0).
#
# Preconditions, checked before anything is written (else the kernel returns -1 and the
# wrapper runs ``replay_keys``): every key >= 0 and no block pinned (the wrapper), and a state
# the pure driver could have left -- ``block_of`` maps exactly the queued blocks to their own
# keys, and no ghost key is cached or >= 2**63.

@njit(cache=True, inline="always")
def _tab_delete(tab, i, shift, mask, slot_of, ring, rmask):
    """Empty slot ``i`` by backward-shift deletion (as ``hashtable.delete``), repointing
    ``slot_of`` / ``ring`` at every entry it moves; the emptied slot's value is -1."""
    j = i
    while True:
        j = (j + 1) & mask
        x = tab[2 * j]
        if x == _EMPTY:
            break
        if _ht_moves_back(_ht_slot(x, shift), i, j):
            v = tab[2 * j + 1]
            tab[2 * i] = x
            tab[2 * i + 1] = v
            if v >= 0:
                slot_of[v] = i
            else:
                ring[(-2 - v) & rmask] = i
            i = j
    tab[2 * i] = _EMPTY
    tab[2 * i + 1] = -1


@njit(cache=True, inline="always")
def _ghost_trim(tab, shift, mask, slot_of, ring, rmask, head, tail, live, ghost_size):
    """Delete the oldest live ghost entries until at most ``ghost_size`` are live (stale ring
    positions are skipped); returns the new ``(head, live)``."""
    while live > ghost_size and head < tail:
        p = head
        head += 1
        s = ring[p & rmask]
        if tab[2 * s + 1] == -2 - p:
            _tab_delete(tab, s, shift, mask, slot_of, ring, rmask)
            live -= 1
    return head, live


def fused_table_sizes(num_blocks: int, ghost_size: int, ghost_keys: int) -> tuple[int, int]:
    """(log2 of ``tab``'s slots, ``ring`` length) for `replay_keys_fused`: at most
    ``num_blocks`` cached keys and ``max(ghost_keys, ghost_size + 1)`` ghosts are live at once
    (one reclamation's key is appended before trimming), at load <= 1/4; the ring is a power
    of two > twice the live ghosts, so a compaction (a pass over the ring) frees at least half
    of it."""
    live_ghosts = max(ghost_keys, ghost_size + 1)
    # load 1/4 rather than table_bits' 1/2: every miss deletes one entry (trim or main
    # reclamation) and backward shifting walks the whole run after it; the shorter runs made
    # the replay 10-30% faster at 4,096 objects and cost nothing measurable at 65,536
    return table_bits(2 * (num_blocks + live_ghosts)), 1 << table_bits(live_ghosts)


@njit(cache=True)
def replay_keys_fused(keys, hits, block_of, key_of, lists, num_blocks, freq, key, cnt, params,
                      ghost, scratch, bits):
    """`replay_keys` with the miss path fused over one table (see the comment above).

    ``lists`` and ``ghost`` as `select_victims` takes them. ``scratch`` is ``(tab, slot_of,
    ring)``: ``tab`` (int64, ``2 * 2**bits``, filled with -1), ``slot_of`` (int64,
    ``num_blocks``) and ``ring`` (int64, a power of two), sized by `fused_table_sizes`.
    Returns the number of illegal calls met (0 when the state was consistent), or -1, having
    changed nothing, when the state is not one the pure driver leaves (the caller then runs
    `replay_keys`)."""
    prev, nxt, member, length = lists
    gkeys, gtab, gpos = ghost
    tab, slot_of, ring = scratch
    small_size = params[P_SMALL_SIZE]
    main_size = params[P_MAIN_SIZE]
    ghost_size = params[P_GHOST_SIZE]
    threshold = params[P_THRESHOLD]
    freq_cap = params[P_FREQ_CAP]
    shift = np.uint64(64 - bits)
    mask = (1 << bits) - 1
    rmask = ring.shape[0] - 1
    # load block_of and the ghost into the table, checking the preconditions on the way
    queued = 0
    for kk, b in block_of.items():
        m = member[b]
        if kk < 0 or key_of[b] != kk or key[b] != np.uint64(kk) or not (m == SMALL or m == MAIN):
            return -1
        j = _ht_probe_pairs(tab, kk, shift, mask)
        tab[2 * j] = kk
        tab[2 * j + 1] = b
        slot_of[b] = j
        queued += 1
    if queued != length[SMALL] + length[MAIN]:
        return -1
    for b in range(num_blocks):
        if key_of[b] >= 0 and not (member[b] == SMALL or member[b] == MAIN):
            return -1
    head = 0  # ghost ring positions: oldest, one past the newest (absolute)
    tail = 0
    cap = gkeys.shape[0]
    gshift, gmask = _g_shift_mask(gtab, gpos)
    for p in range(gpos[G_HEAD], gpos[G_TAIL]):
        gi = p % cap
        k = gkeys[gi]
        if gtab[_g_probe(gkeys, gtab, gshift, gmask, k)] == gi:
            if k >= np.uint64(1 << 63):
                return -1
            kk = np.int64(k)
            j = _ht_probe_pairs(tab, kk, shift, mask)
            if tab[2 * j] == kk:
                return -1
            tab[2 * j] = kk
            tab[2 * j + 1] = -2 - tail
            ring[tail & rmask] = j
            tail += 1
    live = tail  # live ghost keys
    free_head = num_blocks + 2 * FREE
    small_head = num_blocks + 2 * SMALL
    main_head = num_blocks + 2 * MAIN
    bad = 0
    for i in range(keys.shape[0]):
        kk = keys[i]
        j = _ht_probe_pairs(tab, kk, shift, mask)
        v = tab[2 * j + 1]
        known = tab[2 * j] == kk  # cached (v >= 0) or a ghost
        if known and v >= 0:
            # hit: on_hit; acquire + release of a cached block change nothing else (every
            # cached block is queued, checked at load and kept below)
            hits[i] = True
            f = freq[v]
            if f < freq_cap:
                freq[v] = f + 1
            continue
        if live > ghost_size:  # select_victims' trim: only slack left before this replay
            head, live = _ghost_trim(tab, shift, mask, slot_of, ring, rmask, head, tail, live,
                                     ghost_size)
            j = _ht_probe_pairs(tab, kk, shift, mask)
            known = tab[2 * j] == kk
        # select_victims(1): truly free first, else one S3-FIFO eviction
        src = FREE
        if length[FREE] > 0:
            b = nxt[free_head]
            _unlink1(prev, nxt, member, length, b)
            cnt[C_TRULY_FREE_TAKEN] += 1
        else:
            b = -1
            while b < 0:
                if length[SMALL] + length[MAIN] <= 0:
                    break
                cnt[C_HAS_EVICTED] = 1
                if length[MAIN] > main_size or length[SMALL] == 0:
                    while True:  # evict from main
                        c = nxt[main_head]
                        f = freq[c]
                        if f >= 1:
                            _move_to_tail1(prev, nxt, member, length, num_blocks, MAIN, c)
                            freq[c] = min(f, 3) - 1
                            cnt[C_MAIN_REINSERTS] += 1
                        else:
                            _unlink1(prev, nxt, member, length, c)
                            cnt[C_EVICTED_MAIN] += 1
                            b = c
                            src = MAIN
                            break
                else:
                    while length[SMALL] > 0:  # evict from small
                        c = nxt[small_head]
                        if freq[c] >= threshold:
                            _move_to_tail1(prev, nxt, member, length, num_blocks, MAIN, c)
                            freq[c] = 0
                            cnt[C_PROMOTIONS] += 1
                        else:
                            _unlink1(prev, nxt, member, length, c)
                            cnt[C_EVICTED_SMALL] += 1
                            b = c
                            src = SMALL
                            break
            if b < 0:
                bad += 1
                break
        old = slot_of[b]  # the victim's entry (read before kk's entry takes it over)
        # on_materialize: ghost hit -> main; small full before any eviction -> main; else small.
        # kk's entry is written before the victim's is touched, so slot j is still its slot.
        q = SMALL
        if known:  # a ghost: the entry becomes b's, its ring position goes stale
            tab[2 * j + 1] = b
            live -= 1
            q = MAIN
            cnt[C_GHOST_HITS] += 1
        else:
            tab[2 * j] = kk
            tab[2 * j + 1] = b
            if cnt[C_HAS_EVICTED] == 0 and length[SMALL] >= small_size:
                q = MAIN
                cnt[C_WARMUP_MAIN_INSERTS] += 1
        slot_of[b] = j
        freq[b] = 0
        _push_tail1(prev, nxt, member, length, num_blocks, q, b)
        if src == SMALL and ghost_size > 0:  # the victim's key joins the ghost, in place
            if tail - head > rmask:  # ring full of live and stale positions: compact
                w = head
                for p in range(head, tail):
                    s = ring[p & rmask]
                    if tab[2 * s + 1] == -2 - p:
                        ring[w & rmask] = s
                        tab[2 * s + 1] = -2 - w
                        w += 1
                tail = w
            tab[2 * old + 1] = -2 - tail
            ring[tail & rmask] = old
            tail += 1
            live += 1
        elif src != FREE:
            _tab_delete(tab, old, shift, mask, slot_of, ring, rmask)
        head, live = _ghost_trim(tab, shift, mask, slot_of, ring, rmask, head, tail, live,
                                 ghost_size)
    # write the table back into the typed-Dict block_of, the per-block keys and the ghost
    block_of.clear()
    for j in range(mask + 1):
        kk = tab[2 * j]
        v = tab[2 * j + 1]
        if kk != _EMPTY and v >= 0:
            block_of[kk] = np.int32(v)
            key_of[v] = kk
            key[v] = np.uint64(kk)
    gtab[:] = -1
    n = 0
    for p in range(head, tail):
        s = ring[p & rmask]
        if tab[2 * s + 1] == -2 - p:
            k = np.uint64(tab[2 * s])
            gkeys[n] = k
            gtab[_g_probe(gkeys, gtab, gshift, gmask, k)] = n
            n += 1
    gpos[G_HEAD] = 0
    gpos[G_TAIL] = n
    gpos[G_LIVE] = n
    return bad
