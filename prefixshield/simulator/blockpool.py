"""vLLM-faithful KV block pool: reference counts, the hash map, ownership, evictions.

A port of vLLM v1's ``BlockPool`` (vllm/v1/core/block_pool.py) over struct-of-arrays state with
numba kernels. What is reproduced on purpose:

* block 0 is the null block: never free, never allocated (``num_blocks=512`` -> 511 usable);
* the hash map may hold several blocks with one hash (vLLM does not de-duplicate a block that two
  requests computed concurrently); lookup returns the earliest inserted one still cached;
* taking a free block that still has a hash evicts it: the hash is dropped there and then;
* ``free_blocks`` receives blocks in eviction-priority order (the caller reverses a request's
  blocks) and hands the ones reaching ref_cnt 0 to the policy in that order.

Where the pool differs from vLLM: the order of free blocks is the policy's (for LRU it is vLLM's
free queue exactly), and the pool additionally tracks the group that holds or owns every block, so
any policy, LRU included, reports per-group occupancy and an eviction attribution matrix.

The hash map (vLLM's ``cached_block_hash_to_block``, hash -> first block) is an open-addressing
table in two numpy arrays (linear probing, backward-shift deletion, key 0 = empty slot, which no
block hash is) rather than a ``numba.typed.Dict``: every pool call passes it to a kernel, and
unboxing a typed dict costs more than the call's work.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from prefixshield.policies.base import Policy
from prefixshield.simulator.creation import CreationLog

NO_HASH = np.uint64(0)
NULL_BLOCK = 0
_NO_BLOCKS = np.empty(0, dtype=np.int32)
_NO_BLOCKS.flags.writeable = False


@njit(cache=True, inline="always")
def _slot(keys, h):
    """Slot of key ``h`` in the table ``keys``, or the empty slot where it would go."""
    mask = np.uint64(keys.shape[0] - 1)
    i = np.int64(h & mask)
    while True:
        k = keys[i]
        if k == h or k == 0:
            return i
        i = np.int64(np.uint64(i + 1) & mask)


@njit(cache=True, inline="always")
def _remove_slot(keys, vals, i):
    """Empty slot ``i`` and shift later entries of its probe run back (no tombstones)."""
    mask = keys.shape[0] - 1
    j = i
    while True:
        j = (j + 1) & mask
        k = keys[j]
        if k == 0:
            break
        home = np.int64(k & np.uint64(mask))
        # the entry at j may move to i unless its home lies cyclically in (i, j]
        if i <= j:
            stays = i < home <= j
        else:
            stays = home > i or home <= j
        if not stays:
            keys[i] = k
            vals[i] = vals[j]
            i = j
    keys[i] = 0


@njit(cache=True)
def _find_hits(map_keys, map_vals, req_hashes, max_blocks, out):
    n = min(max_blocks, req_hashes.shape[0])
    for i in range(n):
        s = _slot(map_keys, req_hashes[i])
        if map_keys[s] == 0:
            return i
        out[i] = map_vals[s]
    return n


@njit(cache=True)
def _touch(ref_cnt, blocks, was_free):
    num_free = 0
    for i in range(blocks.shape[0]):
        b = blocks[i]
        if ref_cnt[b] == 0:
            was_free[num_free] = b
            num_free += 1
        ref_cnt[b] += 1
    return num_free


@njit(cache=True)
def _claim(victims, ref_cnt, block_hash, map_keys, map_vals, map_size, hash_next, owner,
           occupancy, evictions, requester, evicted_out):
    """Take ``victims`` into use by ``requester``; evict the ones that still carry a hash."""
    num_evicted = 0
    for b in victims:
        h = block_hash[b]
        if h != 0:
            s = _slot(map_keys, h)
            head = map_vals[s]
            if head == b:
                if hash_next[b] < 0:
                    _remove_slot(map_keys, map_vals, s)
                    map_size[0] -= 1
                else:
                    map_vals[s] = hash_next[b]
            else:
                p = head
                while hash_next[p] != b:
                    p = hash_next[p]
                hash_next[p] = hash_next[b]
            hash_next[b] = -1
            block_hash[b] = 0
            evictions[requester, owner[b]] += 1
            evicted_out[num_evicted] = b
            num_evicted += 1
        if owner[b] >= 0:
            occupancy[owner[b]] -= 1
        owner[b] = requester
        occupancy[requester] += 1
        ref_cnt[b] = 1
    return num_evicted


@njit(cache=True)
def _cache(blocks, hashes, block_hash, map_keys, map_vals, map_size, hash_next):
    for i in range(blocks.shape[0]):
        b = blocks[i]
        h = hashes[i]
        block_hash[b] = h
        hash_next[b] = -1
        s = _slot(map_keys, h)
        if map_keys[s] == 0:
            map_keys[s] = h
            map_vals[s] = b
            map_size[0] += 1
        else:
            p = map_vals[s]
            while hash_next[p] >= 0:
                p = hash_next[p]
            hash_next[p] = b


@njit(cache=True)
def _release(ordered_blocks, ref_cnt, block_hash, owner, occupancy, freed, cached):
    num_freed = 0
    for b in ordered_blocks:
        ref_cnt[b] -= 1
        if ref_cnt[b] == 0 and b != 0:
            freed[num_freed] = b
            cached[num_freed] = block_hash[b] != 0
            if block_hash[b] == 0:
                occupancy[owner[b]] -= 1
                owner[b] = -1
            num_freed += 1
    return num_freed


class BlockPool:
    """The KV block pool of one engine (vLLM's ``BlockPool`` with a pluggable policy).

    Args:
        num_blocks: configured blocks, null block included (usable = ``num_blocks - 1``).
        policy: the replacement policy; it holds the free blocks.
        num_groups: accounting groups that may allocate (ids ``0 .. num_groups-1``).
        hash_map_slots: slots of the hash map, a power of two >= ``2 * num_blocks`` (the most
            hashes it holds is one per block); None sizes it by `default_hash_map_slots`.
            Only speed depends on it.

    Attributes:
        ref_cnt: int32 per block; number of running requests using the block.
        block_hash: uint64 per block; 0 = no hash (not cached).
        owner_group: int32 per block; group using it, or owning its cached content; -1 if truly free.
        occupancy: int64 per group; blocks whose ``owner_group`` is that group.
        evictions: int64 ``[requesting group, owner group]``; cached blocks reclaimed.
        creations: every materialization (seconds, group, contract, blocks), for creation
            pressure and debt reports under any policy.
    """

    SPARSE_MAP_BLOCKS = 1 << 16
    """Pools of at most this many blocks get a hash map 8x their size, larger ones 2x."""

    @classmethod
    def default_hash_map_slots(cls, num_blocks: int) -> int:
        """Slots of the hash map by default: a power of two at least 8x ``num_blocks`` (at most
        1/8 full: probe runs and backward shifts stay short, which more than halves the cost of
        an insert plus an eviction against a half-full table) up to
        `SPARSE_MAP_BLOCKS` blocks, 2x above (16 bytes a slot)."""
        factor = 8 if num_blocks <= cls.SPARSE_MAP_BLOCKS else 2
        return 1 << max(4, int(factor * num_blocks - 1).bit_length())

    def __init__(self, num_blocks: int, policy: Policy, num_groups: int,
                 hash_map_slots: int | None = None) -> None:
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be >= 2 (block 0 is the null block), got {num_blocks}")
        if policy.num_blocks != num_blocks:
            raise ValueError(f"policy sized for {policy.num_blocks} blocks, pool for {num_blocks}")
        self.num_blocks = num_blocks
        self.policy = policy
        self.num_groups = num_groups
        self.ref_cnt = np.zeros(num_blocks, dtype=np.int32)
        self.block_hash = np.zeros(num_blocks, dtype=np.uint64)
        self.hash_next = np.full(num_blocks, -1, dtype=np.int32)
        self.owner_group = np.full(num_blocks, -1, dtype=np.int32)
        self.occupancy = np.zeros(num_groups, dtype=np.int64)
        self.evictions = np.zeros((num_groups, num_groups), dtype=np.int64)
        self.num_evicted_total = 0
        self.creations = CreationLog()
        # hash -> first block with it; capacity a power of two >= 2x the most hashes (one per
        # block), so probe runs stay short
        cap = (self.default_hash_map_slots(num_blocks) if hash_map_slots is None
               else int(hash_map_slots))
        if cap & (cap - 1) or cap < 2 * num_blocks:
            raise ValueError(f"hash_map_slots must be a power of two >= 2 x num_blocks "
                             f"({2 * num_blocks}), got {hash_map_slots}")
        self._map_keys = np.zeros(cap, dtype=np.uint64)
        self._map_vals = np.zeros(cap, dtype=np.int64)
        self._map_size = np.zeros(1, dtype=np.int64)
        self._scratch = np.empty(num_blocks, dtype=np.int32)
        self._scratch2 = np.empty(num_blocks, dtype=np.int32)
        self._cached_scratch = np.empty(num_blocks, dtype=np.bool_)
        self.last_evicted = _NO_BLOCKS

    @property
    def usable_blocks(self) -> int:
        """Blocks that can ever hold KV state (the null block excluded)."""
        return self.num_blocks - 1

    def num_free_blocks(self, requester: int | None = None) -> int:
        """Free blocks (ref_cnt 0), as the policy lets ``requester`` take them."""
        if requester is None:
            return self.policy.num_free()
        return self.policy.available(requester)

    def find_cached_prefix(self, block_hashes: np.ndarray, max_blocks: int) -> np.ndarray:
        """Blocks of the longest cached chain among the first ``max_blocks`` hashes. No side effect."""
        n = _find_hits(self._map_keys, self._map_vals, block_hashes, max_blocks, self._scratch)
        return self._scratch[:n].copy()

    def cached_prefix_length(self, block_hashes: np.ndarray, max_blocks: int) -> int:
        """How many blocks `find_cached_prefix` would return (no copy, no side effect):
        what a router reads for every replica at every arrival."""
        return int(_find_hits(self._map_keys, self._map_vals, block_hashes, max_blocks,
                              self._scratch))

    def touch(self, blocks: np.ndarray, group: int, contract: int, prefix_id: int,
              now: float, root=None) -> None:
        """Reuse cached ``blocks`` for a request (``root``: the content key of its first full
        block): ref_cnt += 1; ref_cnt-0 ones leave the free set."""
        if blocks.shape[0] == 0:
            return
        self.policy.on_hit(blocks, group, contract, prefix_id, now, root=root)
        n = _touch(self.ref_cnt, blocks, self._scratch2)
        if n:
            self.policy.on_acquire(self._scratch2[:n].copy())

    def get_new_blocks(self, n: int, requester: int, now: float) -> np.ndarray:
        """Take ``n`` free blocks for ``requester`` (ref_cnt 1), evicting cached content as needed."""
        if n > self.policy.available(requester):
            raise ValueError(f"cannot get {n} free blocks for group {requester}: "
                             f"{self.policy.available(requester)} available")
        return self.take_new_blocks(n, requester, now)

    def take_new_blocks(self, n: int, requester: int, now: float) -> np.ndarray:
        """`get_new_blocks` for a caller that has just checked ``n <= available``
        (the cache manager's allocation): the same take, without counting free blocks again."""
        victims = self.policy.select_victims(n, now, requester)
        k = _claim(victims, self.ref_cnt, self.block_hash, self._map_keys, self._map_vals,
                   self._map_size, self.hash_next, self.owner_group, self.occupancy,
                   self.evictions, requester, self._scratch2)
        self.num_evicted_total += k
        # most takes evict nothing (truly free blocks first): share one empty array for them
        self.last_evicted = self._scratch2[:k].copy() if k else _NO_BLOCKS
        return victims

    def cache_full_blocks(self, blocks: np.ndarray, hashes: np.ndarray, group: int, contract: int,
                          prefix_id: int, now: float, request_id: int = -1, root=None,
                          num_decode: int = 0) -> None:
        """Give newly computed full ``blocks`` of request ``request_id`` their ``hashes`` so
        later requests can hit them (``root``, ``num_decode``: see
        [`on_materialize`][prefixshield.policies.base.Policy.on_materialize])."""
        if blocks.shape[0] == 0:
            return
        _cache(blocks, hashes, self.block_hash, self._map_keys, self._map_vals, self._map_size,
               self.hash_next)
        self.creations.append(now, group, contract, blocks.shape[0])
        self.policy.on_materialize(blocks, hashes, group, contract, prefix_id, now,
                                   request_id=request_id, root=root, num_decode=num_decode)

    def request_finished(self, request_id: int) -> None:
        """Request ``request_id`` ended (the policy forgets it)."""
        self.policy.on_request_finished(request_id)

    def free_blocks(self, ordered_blocks: np.ndarray, now: float) -> None:
        """Drop one reference from each block; blocks reaching 0 go to the policy in this order."""
        n = _release(ordered_blocks, self.ref_cnt, self.block_hash, self.owner_group,
                     self.occupancy, self._scratch2, self._cached_scratch)
        if n:
            self.policy.on_release(self._scratch2[:n].copy(), self._cached_scratch[:n].copy(), now)

    def num_hashes(self) -> int:
        """Distinct hashes in the hash map (each names at least one cached block)."""
        return int(self._map_size[0])

    def num_cached_blocks(self) -> int:
        """Blocks that carry a hash (in use or free)."""
        return int(np.count_nonzero(self.block_hash))

    def check_invariants(self) -> None:
        """Raise ``AssertionError`` naming the first broken invariant (tests, --check-invariants)."""
        free = self.policy.free_order()
        should = np.flatnonzero(self.ref_cnt[1:] == 0) + 1
        if free.shape[0] != self.policy.num_free():
            raise AssertionError(f"policy reports {self.policy.num_free()} free blocks but holds "
                                 f"{free.shape[0]}")
        if not np.array_equal(np.sort(free), should):
            extra = np.setdiff1d(free, should)
            lost = np.setdiff1d(should, free)
            raise AssertionError(f"free set != ref_cnt-0 blocks: in use but free {extra[:5]}, "
                                 f"free but not held {lost[:5]}")
        if self.ref_cnt[0] != 0 or 0 in free:
            raise AssertionError("the null block was allocated or freed")
        counts = np.bincount(self.owner_group[self.owner_group >= 0], minlength=self.num_groups)
        if not np.array_equal(counts, self.occupancy):
            raise AssertionError(f"occupancy {self.occupancy} != owner counts {counts}")
        if self.num_hashes() > self.num_cached_blocks():
            raise AssertionError("hash map holds more hashes than cached blocks")
        if int(np.count_nonzero(self._map_keys)) != self.num_hashes():
            raise AssertionError("hash map size counter disagrees with its table")
        self.policy.check_invariants()
