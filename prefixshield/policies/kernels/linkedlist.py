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
def _link_after(prev, nxt, at, b):
    after = nxt[at]
    prev[b] = at
    nxt[b] = after
    prev[after] = b
    nxt[at] = b


@njit(cache=True)
def push_tail(prev, nxt, member, length, num_blocks, k, blocks):
    """Append ``blocks`` in order at the tail of list k."""
    tail = num_blocks + 2 * k + 1
    for b in blocks:
        _link_after(prev, nxt, prev[tail], b)
        member[b] = k
    length[k] += blocks.shape[0]


@njit(cache=True)
def push_head(prev, nxt, member, length, num_blocks, k, blocks):
    """Insert ``blocks`` at the head of list k so that they read in the given order from the head."""
    head = num_blocks + 2 * k
    for i in range(blocks.shape[0] - 1, -1, -1):
        b = blocks[i]
        _link_after(prev, nxt, head, b)
        member[b] = k
    length[k] += blocks.shape[0]


@njit(cache=True)
def unlink(prev, nxt, member, length, blocks):
    """Remove ``blocks`` from whatever list holds each (each must be in one)."""
    for b in blocks:
        p = prev[b]
        q = nxt[b]
        nxt[p] = q
        prev[q] = p
        prev[b] = -1
        nxt[b] = -1
        length[member[b]] -= 1
        member[b] = -1


@njit(cache=True)
def pop_head(prev, nxt, member, length, num_blocks, k, n, out, out_start):
    """Remove the first ``n`` blocks of list k into ``out[out_start:out_start+n]``."""
    head = num_blocks + 2 * k
    for i in range(n):
        b = nxt[head]
        q = nxt[b]
        nxt[head] = q
        prev[q] = head
        prev[b] = -1
        nxt[b] = -1
        member[b] = -1
        out[out_start + i] = b
    length[k] -= n


@njit(cache=True)
def list_to_array(nxt, num_blocks, k, length):
    out = np.empty(length, dtype=np.int32)
    b = nxt[num_blocks + 2 * k]
    for i in range(length):
        out[i] = b
        b = nxt[b]
    return out
