"""vLLM's native replacement: the free-block queue of ``BlockPool``, reproduced exactly.

The queue starts as blocks ``1 .. num_blocks-1`` (block 0 is the null block). Victims are taken
from the head. Freed blocks arrive in vLLM's free order (a request frees its blocks tail-first, so
chain tails are evicted before chain heads). In ``"0.10"`` mode all of them go to the tail; in
``"current"`` mode the ones without a hash go to the head (truly free blocks are reused before any
cached state is reclaimed) and the hashed ones to the tail.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from prefixshield.policies.base import FusedArrays, Policy, register_policy
from prefixshield.policies.kernels import hashtable as ht
from prefixshield.policies.kernels import linkedlist as ll


@njit(cache=True)
def _replay_keys(keys, hits, block_of, key_of, prev, nxt, member, length, num_blocks):
    # A hit re-releases its cached block (to the tail, in both compat modes); a miss takes the
    # head, caches the key there and releases it to the tail: the cache driver's calls, inlined.
    head = num_blocks
    for i in range(keys.shape[0]):
        kk = keys[i]
        if kk in block_of:
            hits[i] = True
            b = block_of[kk]
        else:
            b = nxt[head]
            old = key_of[b]
            if old >= 0:
                del block_of[old]
            key_of[b] = kk
            block_of[kk] = b
        ll.unlink_one(prev, nxt, member, length, b)
        ll.push_tail_one(prev, nxt, member, length, num_blocks, 0, b)


# ---------------------------------------------------------------------------------------------
# Whole-stream replay over one array hash table (the pure cache driver, LRU's decisions).
#
# ``_replay_keys`` above keeps the key -> block map in the driver's typed Dict and the driver's
# ``key_of`` up to date at every miss. ``_replay_keys_table`` makes the same decisions (tested
# equal, request for request and state for state) over scratch arrays:
#
# * ``tab``: one open-addressing table (linear probing, Fibonacci hashing, backward-shift
#   deletion, as `hashtable`) with each key and its block
#   side by side (``tab[2j]``, ``tab[2j + 1]``), so that a hit reads its block from the cache
#   line its probe loaded; sized by `_table_bits`.
# * ``slot_of``: per block, the slot of its key's entry or -1 (a block never given content), so
#   the victim's old key is deleted without a probe; the deletion repoints ``slot_of`` at every
#   entry it moves.
# * ``pn``: the queue's ``prev``/``nxt`` interleaved (``pn[2b]``, ``pn[2b + 1]``), so that
#   unlinking a block reads both its links from one cache line; copied in after the checks and
#   back at the end.
#
# A miss is one probe (it ends at the empty slot the new key takes), the victim's entry is
# emptied through ``slot_of``, and ``key_of`` is not touched in the loop; ``block_of`` and
# ``key_of`` are written once, at the end (every block that ever had content still has: LRU
# reuses a victim for the new key at once). The move to the tail skips the list's
# member/length bookkeeping (``linkedlist.move_to_tail_unchecked``): under the pure driver every
# block stays in the one list. (Prefetching the slot of a key 8 requests ahead, through an
# LLVM intrinsic, measured within noise of none -- 5-8% at best at 65,536 objects -- so there is
# none: it would tie the kernel to llvmlite's intrinsic naming.)
#
# Preconditions, checked before anything is written (else the kernel returns -1, having changed
# nothing, and the wrapper runs ``_replay_keys``): every key >= 0 (the wrapper), and a state the
# pure driver could have left -- ``block_of`` maps keys >= 0 to distinct queued blocks whose
# ``key_of`` is that key, every block with a ``key_of`` is in ``block_of``, and the queue is
# not empty. The table then never holds more keys than the queue has blocks.


def _table_bits(queued: int) -> int:
    """log2 of ``tab``'s slots for `_replay_keys_table`, the table holding at most
    ``queued`` keys (the blocks in the queue): load <= 1/8 while that takes at most 2**15 slots
    (512 KiB), else load <= 1/4. Measured on the key-stream bench: at 4,096 objects load 1/8
    ran ~15% faster than 1/4 (shorter probes and backward shifts, the table still in L2); at
    65,536 objects the 8 MiB table of load 1/8 ran 20-30% slower than the 4 MiB one of 1/4."""
    bits = 4
    while (1 << bits) < 8 * queued:
        bits += 1
    if bits <= 15:
        return bits
    while (1 << (bits - 1)) >= 4 * queued:
        bits -= 1
    return bits


@njit(cache=True, inline="always")
def _tab_delete(tab, i, shift, mask, slot_of):
    """Empty slot ``i`` by backward-shift deletion (as ``hashtable.delete``), repointing
    ``slot_of`` at every entry it moves."""
    j = i
    while True:
        j = (j + 1) & mask
        x = tab[2 * j]
        if x == ht.EMPTY:
            break
        if ht.moves_back(ht.slot(x, shift), i, j):
            v = tab[2 * j + 1]
            tab[2 * i] = x
            tab[2 * i + 1] = v
            slot_of[v] = i
            i = j
    tab[2 * i] = ht.EMPTY


@njit(cache=True)
def _replay_keys_table(keys, hits, block_of, key_of, prev, nxt, member, length, num_blocks, tab,
                       bits, slot_of, pn):
    """`_replay_keys` over one array hash table (see the comment above).

    Scratch: ``tab`` (int64, ``2 * 2**bits``, filled with -1; ``bits`` from
    `_table_bits` of ``length[0]``), ``slot_of`` (int64, ``num_blocks``, filled with -1)
    and ``pn`` (int32, ``2 * prev.shape[0]``). Returns 0, or -1, having changed nothing but the
    scratch, when the state is not one the pure driver leaves (the caller then runs
    `_replay_keys`)."""
    shift = np.uint64(64 - bits)
    mask = (1 << bits) - 1
    n = keys.shape[0]
    # load the typed Dict into the table, checking the preconditions on the way
    if n > 0 and length[0] <= 0:
        return -1
    for kk, b in block_of.items():
        if kk < 0 or b < 0 or b >= num_blocks or key_of[b] != kk or member[b] != 0 \
                or slot_of[b] >= 0:
            return -1
        j = ht.probe_pairs(tab, kk, shift, mask)
        tab[2 * j] = kk
        tab[2 * j + 1] = b
        slot_of[b] = j
    keyed = 0
    for b in range(num_blocks):
        if key_of[b] >= 0:
            keyed += 1
    if keyed != len(block_of) or len(block_of) > length[0] or 4 * length[0] > mask + 1:
        return -1
    for b in range(prev.shape[0]):
        pn[2 * b] = prev[b]
        pn[2 * b + 1] = nxt[b]
    lprev = pn[0::2]  # strided views: the list helpers run on the interleaved links
    lnxt = pn[1::2]
    head = num_blocks
    tail = num_blocks + 1
    for i in range(n):
        kk = keys[i]
        j = ht.probe_pairs(tab, kk, shift, mask)
        if tab[2 * j] == kk:
            hits[i] = True
            b = tab[2 * j + 1]
        else:
            # the head block takes kk (written first: slot j is the end of kk's probe only
            # until the victim's entry is deleted); the victim's old key, if any, goes
            b = lnxt[head]
            old = slot_of[b]
            tab[2 * j] = kk
            tab[2 * j + 1] = b
            slot_of[b] = j
            if old >= 0:
                _tab_delete(tab, old, shift, mask, slot_of)
        if b != lprev[tail]:  # a block already last stays
            ll.move_to_tail_unchecked(lprev, lnxt, num_blocks, 0, b)
    for b in range(prev.shape[0]):
        prev[b] = pn[2 * b]
        nxt[b] = pn[2 * b + 1]
    block_of.clear()
    for j in range(mask + 1):
        kk = tab[2 * j]
        if kk != ht.EMPTY:
            b = tab[2 * j + 1]
            block_of[kk] = np.int32(b)
            key_of[b] = kk
    return 0


@njit(cache=True)
def _release(blocks, cached, current_mode, prev, nxt, member, length, num_blocks):
    # "current": blocks without a hash to the head, reading in the given order, hashed ones to
    # the tail in order; "0.10": all to the tail in order. One kernel call either way.
    if current_mode:
        for i in range(blocks.shape[0] - 1, -1, -1):
            if not cached[i]:
                ll.push_head_one(prev, nxt, member, length, num_blocks, 0, blocks[i])
        for i in range(blocks.shape[0]):
            if cached[i]:
                ll.push_tail_one(prev, nxt, member, length, num_blocks, 0, blocks[i])
    else:
        for i in range(blocks.shape[0]):
            ll.push_tail_one(prev, nxt, member, length, num_blocks, 0, blocks[i])


@register_policy
class LRUPolicy(Policy):
    """vLLM's ``FreeKVCacheBlockQueue`` as a policy (LRU by time of free)."""

    name = "lru"

    def __init__(self, num_blocks: int, vllm_compat: str = "current") -> None:
        super().__init__(num_blocks, vllm_compat)
        self._queue = ll.LinkedLists(self.num_blocks, 1)
        q = self._queue
        ll.push_tail(q.prev, q.nxt, q.member, q.length, q.num_blocks, 0,
                     np.arange(1, self.num_blocks, dtype=np.int32))

    def fused_arrays(self) -> FusedArrays:
        """vLLM's free queue: the loop's ``lru`` kernels on its linked list."""
        q = self._queue
        return FusedArrays("lru", lists=(q.prev, q.nxt, q.member, q.length))

    def on_release(self, blocks: np.ndarray, cached: np.ndarray, now: float) -> None:
        """Free ``blocks`` (vLLM's free order): ``"current"`` puts those without a hash at the
        head (reading in the given order) and hashed ones at the tail; ``"0.10"`` puts all at
        the tail."""
        q = self._queue
        _release(blocks, cached, self.vllm_compat == "current", q.prev, q.nxt, q.member,
                 q.length, q.num_blocks)

    def on_acquire(self, blocks: np.ndarray) -> None:
        q = self._queue
        ll.unlink(q.prev, q.nxt, q.member, q.length, blocks)

    def select_victims(self, n: int, now: float, requester: int) -> np.ndarray:
        q = self._queue
        out = np.empty(n, dtype=np.int32)
        ll.pop_head(q.prev, q.nxt, q.member, q.length, q.num_blocks, 0, n, out, 0)
        return out

    def replay_keys(self, keys: np.ndarray, block_of, key_of: np.ndarray,
                    table: bool = True) -> np.ndarray:
        """The pure cache driver's loop in one kernel (see
        `prefixshield.simulator.cachedriver.replay_keys`); same decisions, no Python per key.

        Args:
            keys: int64 content keys, one per request.
            block_of: numba typed Dict content key -> block (updated).
            key_of: int64 per block, its content key or -1 (updated).
            table: run `_replay_keys_table` (one array hash table of keys and blocks,
                the victim's entry found through a per-block slot; the maps written once, at
                the end) when its preconditions hold (every key >= 0, a state the pure driver
                leaves: ``block_of`` maps exactly the blocks with a ``key_of``, all queued);
                False (or preconditions unmet) runs the typed-Dict kernel, the oracle the table
                kernel is tested equal to. Scratch during the call: 16 bytes per table slot
                (2 ** `_table_bits` slots, 4-8 per queued block) plus 16 per block.

        Returns:
            bool per request, True where it hit.
        """
        q = self._queue
        hits = np.zeros(keys.shape[0], dtype=np.bool_)
        done = -1
        if table and (keys.shape[0] == 0 or int(keys.min()) >= 0):
            bits = _table_bits(int(q.length[0]))
            done = _replay_keys_table(keys, hits, block_of, key_of, q.prev, q.nxt, q.member,
                                      q.length, q.num_blocks,
                                      np.full(2 << bits, ht.EMPTY, dtype=np.int64), bits,
                                      np.full(self.num_blocks, -1, dtype=np.int64),
                                      np.empty(2 * q.prev.shape[0], dtype=np.int32))
        if done < 0:  # not table, or a state the table kernel does not take (it changed nothing)
            _replay_keys(keys, hits, block_of, key_of, q.prev, q.nxt, q.member, q.length,
                         q.num_blocks)
        return hits

    def num_free(self) -> int:
        return int(self._queue.length[0])

    def free_order(self) -> np.ndarray:
        return self._queue.to_array(0)
