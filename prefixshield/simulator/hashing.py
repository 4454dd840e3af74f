"""Chained 64-bit block hashes, salted by accounting group.

vLLM hashes block i as ``hash(parent_hash_{i-1}, tokens_i, extra_keys)`` and puts the request's
``cache_salt`` into the first block's extra keys, so every later block of a salted request differs
too. We reproduce the chaining with a fast deterministic 64-bit mix (no ``os.urandom``), and make
collisions *across* groups impossible by construction: the top 16 bits of every hash hold
``group + 1``. Within a group, two different token chains collide with probability ~2^-48 per pair.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from prefixshield.traces.tokens import splitmix64

GROUP_SHIFT = np.uint64(48)
LOW_MASK = np.uint64((1 << 48) - 1)
MAX_GROUPS = (1 << 16) - 1
"""Group ids are ``0 .. MAX_GROUPS - 1``; hash value 0 never occurs (it means "no hash")."""


@njit(cache=True)
def chain_block_hashes(tokens, num_tokens, block_size, group, hash_seed):
    """Hashes of the full blocks among the first ``num_tokens`` tokens (uint64 array).

    Args:
        tokens: int64 token ids of the whole sequence (prompt, then output).
        num_tokens: only the first ``num_tokens`` tokens are hashed.
        block_size: tokens per block.
        group: accounting group id (the salt); enters the first block through the parent.
        hash_seed: fixed seed of the run (vLLM's NONE_HASH analogue).
    """
    num_full = num_tokens // block_size
    out = np.empty(num_full, dtype=np.uint64)
    tag = np.uint64(group + 1) << GROUP_SHIFT
    parent = splitmix64(np.uint64(hash_seed) ^ splitmix64(np.uint64(group) + np.uint64(0x5A17)))
    for b in range(num_full):
        h = parent
        base = b * block_size
        for i in range(block_size):
            h = splitmix64(h ^ np.uint64(tokens[base + i]))
        parent = h
        out[b] = tag | (h & LOW_MASK)
    return out
