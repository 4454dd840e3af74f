"""The pure cache driver: a policy under a plain key stream (no time, no pinning, no pool).

Each request is one key (one block's content). A hit reuses the key's block: the policy sees
``on_hit``, then the block is taken into use and released again (``on_acquire``,
``on_release``), exactly what a one-block request does in the pool. A miss takes a block
(``select_victims(1)``: a truly free one while any is left, else an eviction), materializes the
key there and releases it. Capacity is counted in objects: ``capacity`` keys need
``capacity + 1`` blocks (block 0 is the null block). This is the driver the oracle tests hold
against libCacheSim, whose capacity is in bytes with every object of size 1.
"""

from __future__ import annotations

import numpy as np
from numba import types
from numba.typed import Dict

from prefixshield.policies.base import Policy
from prefixshield.tenancy import DEFAULT_CONTRACTS

_TRUE = np.ones(1, dtype=np.bool_)


def replay_keys(policy: Policy, keys: np.ndarray, groups: np.ndarray | None = None,
                group_names: tuple[str, ...] = ("g0",), contract: int = 0,
                batch: bool = True) -> np.ndarray:
    """Replay ``keys`` through ``policy``; returns a bool array, True where the request hit.

    Args:
        policy: a fresh policy with ``num_blocks = capacity + 1``.
        keys: int64 object ids (>= 0), one per request.
        groups: optional group id per request (default: all group 0).
        group_names: names of the groups (``groups`` indexes them).
        contract: contract id of every request (index into the default contracts).
        batch: use the policy's one-kernel ``replay_keys`` when it has one (LRU, S3-FIFO; same
            decisions, tested) and no per-request groups are given; False always runs the
            generic loop below, one interface call at a time.
    """
    policy.bind_tenants(group_names, list(DEFAULT_CONTRACTS.values()))
    fast = getattr(policy, "replay_keys", None)
    if batch and fast is not None and groups is None:
        block_of = Dict.empty(key_type=types.int64, value_type=types.int32)
        key_of = np.full(policy.num_blocks, -1, dtype=np.int64)
        return fast(np.ascontiguousarray(keys, dtype=np.int64), block_of, key_of)
    block_of: dict[int, int] = {}
    key_of = np.full(policy.num_blocks, -1, dtype=np.int64)
    hits = np.zeros(len(keys), dtype=np.bool_)
    one = np.empty(1, dtype=np.int32)
    key_arr = np.empty(1, dtype=np.uint64)
    for i, key in enumerate(np.asarray(keys, dtype=np.int64).tolist()):
        g = 0 if groups is None else int(groups[i])
        now = float(i)
        b = block_of.get(key)
        if b is not None:
            hits[i] = True
            one[0] = b
            policy.on_hit(one, g, contract, key, now)
            policy.on_acquire(one)
            policy.on_release(one, _TRUE, now)
            continue
        victim = int(policy.select_victims(1, now, g)[0])
        old = key_of[victim]
        if old >= 0:
            del block_of[int(old)]
        key_of[victim] = key
        block_of[key] = victim
        one[0] = victim
        key_arr[0] = key
        policy.on_materialize(one, key_arr, g, contract, key, now)
        policy.on_release(one, _TRUE, now)
    return hits
