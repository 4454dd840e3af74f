"""Open-addressing hash tables of int64 keys in numpy arrays, for numba kernels.

``keys`` (int64, ``2**bits`` slots, empty slots hold `EMPTY` = -1, so keys must be >= 0)
and ``vals`` (any integer dtype, same length) are plain arrays the caller allocates once;
linear probing, Fibonacci hashing (``(k * 0x9E3779B97F4A7C15) >> (64 - bits)``) and
backward-shift deletion (no tombstones, so probe chains never degrade). Sized by
`table_bits` for a load factor <= 1/2, every operation is O(1) expected and allocates
nothing -- the point, against numba's typed Dict, on the key-stream replay's miss path.
"""

from __future__ import annotations

import numpy as np
from numba import njit

EMPTY = -1
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def table_bits(live: int) -> int:
    """log2 of the slots of a table holding at most ``live`` keys at load <= 1/2 (>= 16 slots)."""
    bits = 4
    while (1 << bits) < 2 * live + 2:
        bits += 1
    return bits


def new_table(bits: int, val_dtype=np.int64) -> tuple[np.ndarray, np.ndarray]:
    """Empty ``(keys, vals)`` arrays of ``2**bits`` slots."""
    return np.full(1 << bits, EMPTY, dtype=np.int64), np.zeros(1 << bits, dtype=val_dtype)


@njit(cache=True, inline="always")
def slot(k, shift):
    """Home slot of key ``k`` (``shift = uint64(64 - bits)``)."""
    return np.int64((np.uint64(k) * _GOLDEN) >> shift)


@njit(cache=True, inline="always")
def find(tk, k, shift, mask):
    """Slot of key ``k`` in ``tk``, or -1 (``mask = 2**bits - 1``)."""
    i = slot(k, shift)
    while True:
        x = tk[i]
        if x == k:
            return i
        if x == EMPTY:
            return -1
        i = (i + 1) & mask


@njit(cache=True, inline="always")
def insert(tk, tv, k, v, shift, mask):
    """Set ``k -> v`` (``k`` absent or present)."""
    i = slot(k, shift)
    while tk[i] != EMPTY and tk[i] != k:
        i = (i + 1) & mask
    tk[i] = k
    tv[i] = v


@njit(cache=True, inline="always")
def delete(tk, tv, i, shift, mask):
    """Remove the key in slot ``i`` (backward-shift deletion keeps probe chains whole)."""
    j = i
    while True:
        j = (j + 1) & mask
        x = tk[j]
        if x == EMPTY:
            break
        if moves_back(slot(x, shift), i, j):
            tk[i] = x
            tv[i] = tv[j]
            i = j
    tk[i] = EMPTY


@njit(cache=True, inline="always")
def moves_back(h, i, j):
    """Backward-shift deletion: whether the key in slot ``j``, home slot ``h``, moves back into
    the hole at ``i`` (it does unless ``h`` lies cyclically in ``(i, j]``)."""
    return (i <= j and (h <= i or h > j)) or (i > j and h <= i and h > j)


@njit(cache=True, inline="always")
def probe_pairs(tab, k, shift, mask):
    """Slot holding key ``k`` in an *interleaved* table (slot j's key at ``tab[2j]``, its value
    at ``tab[2j + 1]``, so a hit reads its value from the line its probe loaded), else the empty
    slot where ``k``'s probe ends."""
    j = slot(k, shift)
    while True:
        x = tab[2 * j]
        if x == k or x == EMPTY:
            return j
        j = (j + 1) & mask
