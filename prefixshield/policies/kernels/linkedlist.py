"""Intrusive doubly linked lists over block ids, in numpy arrays (numba kernels).

``prev``/``nxt`` have ``num_blocks + 2 * num_lists`` entries: entry ``b < num_blocks`` is block b;
list k has a head sentinel at ``num_blocks + 2k`` and a tail sentinel at ``num_blocks + 2k + 1``.
A block is in at most one list; ``member[b]`` is that list or -1. Every operation is O(1) per block
(vLLM's ``FreeKVCacheBlockQueue`` is exactly one such list).
"""

from __future__ import annotations

import numpy as np
from numba import njit


class LinkedLists:
    """Struct-of-arrays state of ``num_lists`` intrusive lists over ``num_blocks`` block ids."""

    def __init__(self, num_blocks: int, num_lists: int = 1) -> None:
        self.num_blocks = num_blocks
        self.num_lists = num_lists
        size = num_blocks + 2 * num_lists
        self.prev = np.full(size, -1, dtype=np.int32)
        self.nxt = np.full(size, -1, dtype=np.int32)
        self.member = np.full(num_blocks, -1, dtype=np.int32)
        self.length = np.zeros(num_lists, dtype=np.int64)
        for k in range(num_lists):
            head, tail = num_blocks + 2 * k, num_blocks + 2 * k + 1
            self.nxt[head] = tail
            self.prev[tail] = head

    def to_array(self, k: int = 0) -> np.ndarray:
        """Block ids of list ``k`` from head to tail (int32)."""
        return list_to_array(self.nxt, self.num_blocks, k, self.length[k])


@njit(cache=True, inline="always")
def insert_after(prev, nxt, member, length, at, k, b):
    """Link block ``b`` into list ``k`` right after node ``at`` (a block or a sentinel)."""
    after = nxt[at]
    prev[b] = at
    nxt[b] = after
    prev[after] = b
    nxt[at] = b
    member[b] = k
    length[k] += 1


@njit(cache=True, inline="always")
def push_tail_one(prev, nxt, member, length, num_blocks, k, b):
    """Append block ``b`` at the tail of list ``k``."""
    insert_after(prev, nxt, member, length, prev[num_blocks + 2 * k + 1], k, b)


@njit(cache=True, inline="always")
def push_head_one(prev, nxt, member, length, num_blocks, k, b):
    """Insert block ``b`` at the head of list ``k``."""
    insert_after(prev, nxt, member, length, num_blocks + 2 * k, k, b)


@njit(cache=True, inline="always")
def unlink_one(prev, nxt, member, length, b):
    """Remove block ``b`` from the list that holds it."""
    p = prev[b]
    q = nxt[b]
    nxt[p] = q
    prev[q] = p
    prev[b] = -1
    nxt[b] = -1
    length[member[b]] -= 1
    member[b] = -1


@njit(cache=True, inline="always")
def move_to_tail_one(prev, nxt, member, length, num_blocks, k, b):
    """Move block ``b`` (in any list) to the tail of list ``k``."""
    unlink_one(prev, nxt, member, length, b)
    push_tail_one(prev, nxt, member, length, num_blocks, k, b)


@njit(cache=True, inline="always")
def move_to_tail_unchecked(prev, nxt, num_blocks, k, b):
    """Move block ``b`` of list ``k``, not its last block, to the tail of ``k``.

    ``member`` and ``length`` are not read or written: they stay right (``b`` neither leaves
    nor joins ``k``). For hot loops that know ``b``'s list and test ``b != prev[tail]``
    themselves; a block in another list, in none, or already last corrupts the lists, unlike
    `move_to_tail_one`. NOTE: branch-free on purpose -- numba does not prune the array
    reference counting of an inlined helper with its own control flow, which doubled the
    LRU key-stream replay's time per request when the tail test lived here."""
    tail = num_blocks + 2 * k + 1
    last = prev[tail]
    p = prev[b]
    q = nxt[b]
    nxt[p] = q
    prev[q] = p
    prev[b] = last
    nxt[b] = tail
    nxt[last] = b
    prev[tail] = b


@njit(cache=True)
def push_tail(prev, nxt, member, length, num_blocks, k, blocks):
    """Append ``blocks`` in order at the tail of list k."""
    for b in blocks:
        push_tail_one(prev, nxt, member, length, num_blocks, k, b)


@njit(cache=True)
def push_head(prev, nxt, member, length, num_blocks, k, blocks):
    """Insert ``blocks`` at the head of list k so that they read in the given order from the head."""
    for i in range(blocks.shape[0] - 1, -1, -1):
        push_head_one(prev, nxt, member, length, num_blocks, k, blocks[i])


@njit(cache=True)
def unlink(prev, nxt, member, length, blocks):
    """Remove ``blocks`` from whatever list holds each (each must be in one)."""
    for b in blocks:
        unlink_one(prev, nxt, member, length, b)


@njit(cache=True)
def pop_head(prev, nxt, member, length, num_blocks, k, n, out, out_start):
    """Remove the first ``n`` blocks of list k into ``out[out_start:out_start+n]``."""
    head = num_blocks + 2 * k
    for i in range(n):
        b = nxt[head]
        unlink_one(prev, nxt, member, length, b)
        out[out_start + i] = b


@njit(cache=True)
def list_to_array(nxt, num_blocks, k, length):
    out = np.empty(length, dtype=np.int32)
    b = nxt[num_blocks + 2 * k]
    for i in range(length):
        out[i] = b
        b = nxt[b]
    return out
