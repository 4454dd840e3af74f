"""StaticQuota: a hard, equal partition of the usable blocks among the configured groups.

Each group may own at most ``quota = floor(usable / G)`` blocks (in use plus cached), where ``G`` is
the number of groups bound with `bind_tenants`. A group below its quota takes truly free
blocks; a group at its quota reclaims its own oldest cached candidate (native free order), and if
it has none, its request waits (``available`` says so, the pool refuses the allocation). There is
no borrowing: an idle group's share stays empty.

Because the quotas sum to at most the usable blocks, a group below its quota always finds a truly
free block, so a group never needs to reclaim another group's cached block.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from prefixshield.policies.base import FusedArrays, Policy, register_policy
from prefixshield.policies.kernels import linkedlist as ll

# list 0: truly free blocks (LIFO at the head, like vLLM's unhashed blocks); list 1+g: group g's
# free cached blocks in release order (oldest at the head).
_TRULY_FREE = 0


@njit(cache=True)
def _release(prev, nxt, member, length, num_blocks, owner, occupancy, blocks, cached):
    """``on_release``: cached blocks join their owner's list at the tail, in the given order;
    the others lose their owner and join the truly free list at its head, reading in the given
    order (reused first, as vLLM does). Allocates nothing (the fused engine loop calls it
    without numba's runtime)."""
    for i in range(blocks.shape[0]):
        b = blocks[i]
        if cached[i]:
            ll.push_tail_one(prev, nxt, member, length, num_blocks, 1 + owner[b], b)
        else:
            occupancy[owner[b]] -= 1
            owner[b] = -1
    for i in range(blocks.shape[0] - 1, -1, -1):
        if not cached[i]:
            ll.push_head_one(prev, nxt, member, length, num_blocks, _TRULY_FREE, blocks[i])


@njit(cache=True)
def _select(prev, nxt, member, length, num_blocks, owner, occupancy, quota, n, requester, out):
    """``select_victims`` into ``out[:n]``: truly free blocks while the requester is below its
    quota, then the requester's own oldest cached candidates (the caller checked ``n`` against
    `_available`)."""
    take_free = min(n, quota - occupancy[requester], length[_TRULY_FREE])
    if take_free < 0:
        take_free = 0
    ll.pop_head(prev, nxt, member, length, num_blocks, _TRULY_FREE, take_free, out, 0)
    ll.pop_head(prev, nxt, member, length, num_blocks, 1 + requester, n - take_free, out, take_free)
    for i in range(take_free):
        owner[out[i]] = requester
        occupancy[requester] += 1


@njit(cache=True, inline="always")
def _available(length, occupancy, quota, requester):
    """Free blocks ``requester`` may take: truly free ones up to its quota, plus its own free
    cached candidates."""
    return (min(max(0, quota - occupancy[requester]), length[_TRULY_FREE])
            + length[1 + requester])


@register_policy
class StaticQuotaPolicy(Policy):
    """Equal hard per-group partition (see module docstring)."""

    name = "static_quota"

    def __init__(self, num_blocks: int, vllm_compat: str = "current") -> None:
        super().__init__(num_blocks, vllm_compat)
        self.quota = 0
        self._lists: ll.LinkedLists | None = None

    @classmethod
    def group_capacity(cls, num_blocks: int, num_groups: int) -> int:
        """A group's quota: ``floor((num_blocks - 1) / num_groups)`` blocks."""
        return (int(num_blocks) - 1) // max(1, int(num_groups))

    @classmethod
    def pool_for(cls, need_blocks: int, num_groups: int) -> int:
        """``need_blocks x num_groups + 1``: the smallest pool whose quota is ``need_blocks``."""
        return max(2, int(need_blocks) * max(1, int(num_groups)) + 1)

    def bind_tenants(self, groups, contracts) -> None:
        super().bind_tenants(groups, contracts)
        if not self.groups:
            raise ValueError("static_quota needs at least one group")
        self.quota = (self.num_blocks - 1) // len(self.groups)
        self._lists = ll.LinkedLists(self.num_blocks, 1 + len(self.groups))
        q = self._lists
        ll.push_tail(q.prev, q.nxt, q.member, q.length, q.num_blocks, _TRULY_FREE,
                     np.arange(1, self.num_blocks, dtype=np.int32))
        self.owner = np.full(self.num_blocks, -1, dtype=np.int32)
        self.occupancy = np.zeros(len(self.groups), dtype=np.int64)

    def fused_arrays(self) -> FusedArrays:
        """The loop's ``static_quota`` kernels on its lists (truly free, then one per group),
        owners, occupancy and quota."""
        q = self._lists
        return FusedArrays("static_quota", lists=(q.prev, q.nxt, q.member, q.length),
                           quota=self.quota, quota_state=(self.owner, self.occupancy))

    def on_release(self, blocks: np.ndarray, cached: np.ndarray, now: float) -> None:
        q = self._lists
        _release(q.prev, q.nxt, q.member, q.length, q.num_blocks, self.owner, self.occupancy,
                 blocks, cached)

    def on_acquire(self, blocks: np.ndarray) -> None:
        q = self._lists
        ll.unlink(q.prev, q.nxt, q.member, q.length, blocks)

    def select_victims(self, n: int, now: float, requester: int) -> np.ndarray:
        q = self._lists
        out = np.empty(n, dtype=np.int32)
        _select(q.prev, q.nxt, q.member, q.length, q.num_blocks, self.owner, self.occupancy,
                self.quota, n, requester, out)
        return out

    def num_free(self) -> int:
        return int(self._lists.length.sum())

    def available(self, requester: int) -> int:
        return int(_available(self._lists.length, self.occupancy, self.quota, requester))

    def free_order(self) -> np.ndarray:
        q = self._lists
        return np.concatenate([q.to_array(k) for k in range(q.num_lists)])

    def stats(self) -> dict:
        q = self._lists
        return {"quota_blocks": int(self.quota),
                "occupancy": {g: int(self.occupancy[i]) for i, g in enumerate(self.groups)},
                "free_cached": {g: int(q.length[1 + i]) for i, g in enumerate(self.groups)},
                "truly_free": int(q.length[_TRULY_FREE])}

    def check_invariants(self) -> None:
        over = np.flatnonzero(self.occupancy > self.quota)
        if over.size:
            g = int(over[0])
            raise AssertionError(f"group {self.groups[g]!r} owns {int(self.occupancy[g])} blocks, "
                                 f"over its quota of {self.quota}")
