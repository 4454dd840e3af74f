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
        q = self._queue
        if self.vllm_compat == "0.10":
            ll.push_tail(q.prev, q.nxt, q.member, q.length, q.num_blocks, 0, blocks)
            return
        ll.push_head(q.prev, q.nxt, q.member, q.length, q.num_blocks, 0, blocks[~cached])
        ll.push_tail(q.prev, q.nxt, q.member, q.length, q.num_blocks, 0, blocks[cached])

    def on_acquire(self, blocks: np.ndarray) -> None:
        q = self._queue
        ll.unlink(q.prev, q.nxt, q.member, q.length, blocks)

    def select_victims(self, n: int, now: float, requester: int) -> np.ndarray:
        q = self._queue
        out = np.empty(n, dtype=np.int32)
        ll.pop_head(q.prev, q.nxt, q.member, q.length, q.num_blocks, 0, n, out, 0)
        return out

    def replay_keys(self, keys: np.ndarray, block_of, key_of: np.ndarray) -> np.ndarray:
        """The pure cache driver's loop in one kernel (see
        :func:`prefixshield.simulator.cachedriver.replay_keys`); same decisions, no Python per key.
        """
        q = self._queue
        hits = np.zeros(keys.shape[0], dtype=np.bool_)
        _replay_keys(keys, hits, block_of, key_of, q.prev, q.nxt, q.member, q.length,
                     q.num_blocks)
        return hits

    def num_free(self) -> int:
        return int(self._queue.length[0])

    def free_order(self) -> np.ndarray:
        return self._queue.to_array(0)
