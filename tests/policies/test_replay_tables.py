"""The array hash table of the key-stream replays behaves as a dict under random insert/delete,
and LRU's table replay makes the typed-Dict replay's decisions and leaves the same state."""

import numpy as np
import pytest
from numba import njit, types
from numba.typed import Dict

from prefixshield.policies import make_policy
from prefixshield.policies.kernels import hashtable as ht


@njit(cache=False)
def _apply(ops, keys, vals, tk, tv, bits):
    shift = np.uint64(64 - bits)
    mask = (1 << bits) - 1
    found = np.full(ops.shape[0], -2, dtype=np.int64)
    for i in range(ops.shape[0]):
        j = ht.find(tk, keys[i], shift, mask)
        if ops[i] == 0:
            ht.insert(tk, tv, keys[i], vals[i], shift, mask)
        elif ops[i] == 1:
            if j >= 0:
                ht.delete(tk, tv, j, shift, mask)
        else:
            found[i] = tv[j] if j >= 0 else -1
    return found


@pytest.mark.parametrize("seed", range(4))
def test_the_table_answers_like_a_dict_under_random_inserts_and_deletes(seed):
    rng = np.random.default_rng(seed)
    n, universe = 50_000, 300  # a small universe: long probe chains, many backward shifts
    ops = rng.integers(0, 3, n)
    keys = rng.integers(0, universe, n).astype(np.int64) * 1_000_003  # clustered homes
    vals = rng.integers(0, 1 << 30, n)
    bits = ht.table_bits(universe)
    tk, tv = ht.new_table(bits)
    found = _apply(ops, keys, vals, tk, tv, bits)
    model: dict[int, int] = {}
    for i in range(n):
        k = int(keys[i])
        if ops[i] == 0:
            model[k] = int(vals[i])
        elif ops[i] == 1:
            model.pop(k, None)
        else:
            assert found[i] == model.get(k, -1), f"op {i}"
    live = {int(k): int(v) for k, v in zip(tk, tv) if k != ht.EMPTY}
    assert live == model


@pytest.mark.parametrize("compat", ["current", "0.10"])
@pytest.mark.parametrize("capacity", [20, 300, 5000])
def test_lru_table_replay_equals_the_typed_dict_replay(capacity, compat):
    rng = np.random.default_rng(capacity)
    fast, slow = (make_policy("lru", capacity + 1, vllm_compat=compat) for _ in range(2))
    maps = [(Dict.empty(key_type=types.int64, value_type=types.int32),
             np.full(capacity + 1, -1, dtype=np.int64)) for _ in range(2)]
    for round_ in range(2):  # the second replay starts from the state the first left
        keys = (rng.zipf(1.2, 40_000) % ((4 + round_) * capacity)).astype(np.int64)
        hf = fast.replay_keys(keys, *maps[0], table=True)
        hs = slow.replay_keys(keys, *maps[1], table=False)
        assert np.array_equal(hf, hs)
        assert dict(maps[0][0]) == dict(maps[1][0])
        assert np.array_equal(maps[0][1], maps[1][1])
        assert np.array_equal(fast.free_order(), slow.free_order())
