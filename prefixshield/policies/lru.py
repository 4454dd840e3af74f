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

from prefixshield.policies.base import Policy, register_policy
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


@njit(cache=True)
def _replay_keys_table(keys, hits, block_of, key_of, prev, nxt, member, length, num_blocks, tk, tv,
                       bits):
    # _replay_keys with the key -> block map in an array hash table (``tk``/``tv``, 2**bits
    # slots, empty) instead of the typed Dict, which is written back at the end. Keys >= 0.
    shift = np.uint64(64 - bits)
    mask = (1 << bits) - 1
    for kk, b in block_of.items():
        ht.insert(tk, tv, kk, b, shift, mask)
    head = num_blocks
    tail = num_blocks + 1
    for i in range(keys.shape[0]):
        kk = keys[i]
        j = ht.find(tk, kk, shift, mask)
        if j >= 0:
            hits[i] = True
            b = tv[j]
        else:
            b = nxt[head]
            old = key_of[b]
            if old >= 0:
                ht.delete(tk, tv, ht.find(tk, old, shift, mask), shift, mask)
            key_of[b] = kk
            ht.insert(tk, tv, kk, b, shift, mask)
        # unlink + push to the tail of the one list, without its member/length bookkeeping
        # (b stays in list 0, the length is unchanged); a block already at the tail stays
        last = prev[tail]
        if b != last:
            p = prev[b]
            q = nxt[b]
            nxt[p] = q
            prev[q] = p
            prev[b] = last
            nxt[b] = tail
            nxt[last] = b
            prev[tail] = b
    block_of.clear()
    for j in range(tk.shape[0]):
        if tk[j] != ht.EMPTY:
            block_of[tk[j]] = tv[j]


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
        :func:`prefixshield.simulator.cachedriver.replay_keys`); same decisions, no Python per key.

        Args:
            keys: int64 content keys, one per request.
            block_of: numba typed Dict content key -> block (updated).
            key_of: int64 per block, its content key or -1 (updated).
            table: keep the key -> block map in an array hash table during the replay
                (:mod:`~prefixshield.policies.kernels.hashtable`; needs every key >= 0, else the
                typed-Dict kernel runs); False always runs the typed-Dict kernel, the oracle the
                table kernel is tested equal to.

        Returns:
            bool per request, True where it hit.
        """
        q = self._queue
        hits = np.zeros(keys.shape[0], dtype=np.bool_)
        if table and (keys.shape[0] == 0 or int(keys.min()) >= 0):
            bits = ht.table_bits(self.num_blocks + len(block_of))
            tk, tv = ht.new_table(bits, np.int32)
            _replay_keys_table(keys, hits, block_of, key_of, q.prev, q.nxt, q.member, q.length,
                               q.num_blocks, tk, tv, bits)
        else:
            _replay_keys(keys, hits, block_of, key_of, q.prev, q.nxt, q.member, q.length,
                         q.num_blocks)
        return hits

    def num_free(self) -> int:
        return int(self._queue.length[0])

    def free_order(self) -> np.ndarray:
        return self._queue.to_array(0)
