"""LRU's whole-stream table replay (one interleaved key/block table, ``slot_of``, interleaved
links) makes the typed-Dict replay's decisions and leaves the same state, bit for bit;
a state it does not take is left to the typed-Dict kernel untouched."""

import numpy as np
import pytest
from numba import njit, types
from numba.typed import Dict

from prefixshield.policies import lru, make_policy
from prefixshield.policies.kernels import hashtable as ht
from prefixshield.policies.kernels import linkedlist as ll


def fresh(capacity: int, compat: str = "current"):
    return (make_policy("lru", capacity + 1, vllm_compat=compat),
            Dict.empty(key_type=types.int64, value_type=types.int32),
            np.full(capacity + 1, -1, dtype=np.int64))


def assert_same_state(a, bo_a, ko_a, b, bo_b, ko_b) -> None:
    assert dict(bo_a) == dict(bo_b)
    assert np.array_equal(ko_a, ko_b)
    qa, qb = a._queue, b._queue
    for x, y in ((qa.prev, qb.prev), (qa.nxt, qb.nxt), (qa.member, qb.member),
                 (qa.length, qb.length)):
        assert np.array_equal(x, y)
    assert np.array_equal(a.free_order(), b.free_order())


def table_kernel(p, keys, bo, ko, hits):
    """Call the table kernel itself, scratch sized as the wrapper does; returns its status."""
    q = p._queue
    bits = lru._table_bits(int(q.length[0]))
    return lru._replay_keys_table(keys, hits, bo, ko, q.prev, q.nxt, q.member, q.length,
                                  q.num_blocks, np.full(2 << bits, ht.EMPTY, dtype=np.int64),
                                  bits, np.full(p.num_blocks, -1, dtype=np.int64),
                                  np.empty(2 * q.prev.shape[0], dtype=np.int32))


# capacities on both sides of _table_bits' switch from load 1/8 to load 1/4 (2**15 slots)
@pytest.mark.parametrize("compat", ["current", "0.10"])
@pytest.mark.parametrize("capacity", [1, 7, 300, 4096, 4097, 6000])
def test_table_replay_equals_the_typed_dict_replay_state_for_state(capacity, compat):
    rng = np.random.default_rng(capacity)
    fast, bo_f, ko_f = fresh(capacity, compat)
    slow, bo_s, ko_s = fresh(capacity, compat)
    for round_ in range(3):  # later replays start from the state the earlier ones left
        n = (30_000, 5, 20_000)[round_]  # a 5-request stream too
        keys = (rng.zipf(1.1 + 0.1 * round_, n) % ((4 + round_) * capacity + 3)).astype(np.int64)
        if round_ == 2:  # a scan of never-seen keys in the middle
            keys[5000:5000 + 2 * capacity] = 10**12 + np.arange(2 * capacity)
        hf = fast.replay_keys(keys, bo_f, ko_f, table=True)
        hs = slow.replay_keys(keys, bo_s, ko_s, table=False)
        assert np.array_equal(hf, hs), f"round {round_}: first divergence at " \
                                       f"{np.flatnonzero(hf != hs)[:1]}"
        assert_same_state(fast, bo_f, ko_f, slow, bo_s, ko_s)


def test_an_empty_stream_changes_nothing():
    p, bo, ko = fresh(10)
    before = (p._queue.prev.copy(), p._queue.nxt.copy())
    assert p.replay_keys(np.empty(0, dtype=np.int64), bo, ko).shape == (0,)
    assert len(bo) == 0 and (ko == -1).all()
    assert np.array_equal(before[0], p._queue.prev) and np.array_equal(before[1], p._queue.nxt)


def _driver_state(capacity: int):
    p, bo, ko = fresh(capacity)
    p.replay_keys(np.arange(3 * capacity, dtype=np.int64) % (2 * capacity), bo, ko)
    return p, bo, ko


def _forget_a_key(p, bo, ko):
    del bo[int(ko[p.free_order()[-1]])]  # key_of says cached, block_of does not know it


def _block_of_points_elsewhere(p, bo, ko):
    k = int(ko[p.free_order()[-1]])
    bo[k] = p.free_order()[0]  # key_of of that block is another key


def _a_cached_block_is_pinned(p, bo, ko):
    p.on_acquire(p.free_order()[-1:].copy())  # in use: out of the queue


@pytest.mark.parametrize("spoil", [_forget_a_key, _block_of_points_elsewhere,
                                   _a_cached_block_is_pinned])
def test_the_table_kernel_refuses_a_state_the_pure_driver_did_not_leave(spoil):
    p, bo, ko = _driver_state(20)
    spoil(p, bo, ko)
    q = p._queue
    before = [a.copy() for a in (q.prev, q.nxt, q.member, q.length, ko)]
    map_before = dict(bo)
    keys = np.arange(100, 160, dtype=np.int64) % 30
    hits = np.zeros(keys.shape[0], dtype=np.bool_)
    assert table_kernel(p, keys, bo, ko, hits) == -1
    assert not hits.any() and dict(bo) == map_before
    assert all(np.array_equal(x, y) for x, y in zip(before, (q.prev, q.nxt, q.member, q.length,
                                                             ko)))


def test_a_refused_state_runs_the_typed_dict_kernel():
    a, bo_a, ko_a = _driver_state(20)
    b, bo_b, ko_b = _driver_state(20)
    for p, bo, ko in ((a, bo_a, ko_a), (b, bo_b, ko_b)):
        _block_of_points_elsewhere(p, bo, ko)
    keys = np.arange(100, 160, dtype=np.int64) % 30
    assert np.array_equal(a.replay_keys(keys, bo_a, ko_a, table=True),
                          b.replay_keys(keys, bo_b, ko_b, table=False))
    assert_same_state(a, bo_a, ko_a, b, bo_b, ko_b)


@pytest.mark.parametrize("queued", [1, 2, 3, 100, 4096, 4097, 8192, 10_000, 65_536, 100_000])
def test_the_table_load_is_at_most_a_quarter(queued):
    bits = lru._table_bits(queued)
    assert 4 * queued <= 1 << bits
    assert bits == 4 or (1 << (bits - 1)) < 8 * queued  # never sparser than load 1/8 needs


@njit(cache=False)
def _move_unchecked(prev, nxt, num_blocks, blocks):
    for b in blocks:
        if b != prev[num_blocks + 1]:
            ll.move_to_tail_unchecked(prev, nxt, num_blocks, 0, b)


def test_move_to_tail_unchecked_orders_the_list_as_move_to_tail_one():
    rng = np.random.default_rng(3)
    n = 50
    a, b = ll.LinkedLists(n, 1), ll.LinkedLists(n, 1)
    for q in (a, b):
        ll.push_tail(q.prev, q.nxt, q.member, q.length, n, 0, rng.permutation(n).astype(np.int32))
    moves = rng.integers(0, n, 2000).astype(np.int32)
    _move_unchecked(a.prev, a.nxt, n, moves)
    for m in moves:
        ll.move_to_tail_one(b.prev, b.nxt, b.member, b.length, n, 0, m)
    assert np.array_equal(a.to_array(0), b.to_array(0))
    assert np.array_equal(a.prev, b.prev) and np.array_equal(a.nxt, b.nxt)
    assert np.array_equal(a.member, b.member) and np.array_equal(a.length, b.length)
