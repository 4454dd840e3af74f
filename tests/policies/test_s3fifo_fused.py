"""S3-FIFO's fused whole-stream replay (one array hash table for cached and ghost keys, miss path
inlined) makes the decisions of the call-by-call replay kernel, request for request, and leaves
the same state; a state it does not take is left to the call-by-call kernel untouched."""

import numpy as np
import pytest
from numba import types
from numba.typed import Dict

from prefixshield.policies import make_policy
from prefixshield.tenancy import DEFAULT_CONTRACTS


def fresh(capacity: int, compat: str = "current", **kw):
    p = make_policy("s3fifo", capacity + 1, vllm_compat=compat, **kw)
    p.bind_tenants(["g0"], list(DEFAULT_CONTRACTS.values()))
    return p, Dict.empty(key_type=types.int64, value_type=types.int32), \
        np.full(capacity + 1, -1, dtype=np.int64)


def assert_same_state(a, b) -> None:
    assert a.stats() == b.stats()
    assert a.ghost_keys().tolist() == b.ghost_keys().tolist()
    for q in ("free", "small", "main"):
        assert a.queue(q).tolist() == b.queue(q).tolist(), q
    assert np.array_equal(a._freq, b._freq) and np.array_equal(a._key, b._key)
    assert np.array_equal(a.free_order(), b.free_order())
    a.check_invariants()


@pytest.mark.parametrize("compat", ["current", "0.10"])
@pytest.mark.parametrize("capacity,ghost_ratio", [(20, 0.9), (100, 0.9), (1000, 0.9),
                                                  (1000, 0.0), (300, 3.0)])
def test_fused_replay_equals_the_call_by_call_kernel(capacity, ghost_ratio, compat):
    rng = np.random.default_rng(capacity)
    fast, bo_f, ko_f = fresh(capacity, compat, ghost_size_ratio=ghost_ratio)
    slow, bo_s, ko_s = fresh(capacity, compat, ghost_size_ratio=ghost_ratio)
    for round_ in range(3):  # the second and third replays start from the state left behind
        keys = (rng.zipf(1.1 + 0.1 * round_, 30_000) % ((5 + round_) * capacity)).astype(np.int64)
        hf = fast.replay_keys(keys, bo_f, ko_f, fused=True)
        hs = slow.replay_keys(keys, bo_s, ko_s, fused=False)
        assert np.array_equal(hf, hs), f"round {round_}: first divergence at " \
                                       f"{np.flatnonzero(hf != hs)[:1]}"
        assert dict(bo_f) == dict(bo_s) and np.array_equal(ko_f, ko_s)
        assert_same_state(fast, slow)


def test_fused_replay_grows_its_ghost_ring_past_stale_entries():
    # ghost hits delete keys from the middle of the ring: compaction must keep the FIFO order
    capacity = 50
    keys = np.random.default_rng(1).integers(0, 90, 40_000).astype(np.int64)
    fast, bo_f, ko_f = fresh(capacity)
    slow, bo_s, ko_s = fresh(capacity)
    assert np.array_equal(fast.replay_keys(keys, bo_f, ko_f), slow.replay_keys(keys, bo_s, ko_s,
                                                                               fused=False))
    assert fast.stats()["ghost_hits"] > 0
    assert_same_state(fast, slow)


def test_a_pinned_block_or_a_negative_key_falls_back_to_the_call_by_call_kernel():
    p, bo, ko = fresh(20)
    b = p.select_victims(1, 0.0, 0)
    p.on_materialize(b, np.array([7], dtype=np.uint64), 0, 0, 0, 0.0)  # pinned, in small
    hits = p.replay_keys(np.arange(100, 150, dtype=np.int64), bo, ko)
    assert not hits.any() and p.stats()["pinned_small"] == 1
    p.check_invariants()
    q, bo, ko = fresh(20)
    r, bo2, ko2 = fresh(20)
    keys = np.array([-5, 3, -5, 4, 3], dtype=np.int64)
    assert np.array_equal(q.replay_keys(keys, bo, ko), r.replay_keys(keys, bo2, ko2, fused=False))


def test_fused_replay_trims_the_ghost_slack_an_uncached_allocation_left():
    # select_victims appends the reclaimed keys untrimmed; released uncached, their blocks are
    # truly free again and the ghost holds more than ghost_size keys until the next miss trims it
    capacity = 100
    keys = (np.random.default_rng(5).zipf(1.2, 20_000) % (5 * capacity)).astype(np.int64)
    runs = []
    for fused in (True, False):
        p, bo, ko = fresh(capacity)
        p.replay_keys(keys[:10_000], bo, ko, fused=False)
        taken = p.select_victims(10, 0.0, 0)
        p.on_release(taken, np.zeros(10, dtype=np.bool_), 0.0)
        for b in taken:  # the driver forgets the reclaimed content
            del bo[int(ko[b])]
            ko[b] = -1
        assert p.stats()["ghost_keys"] > p.ghost_size
        runs.append((p.replay_keys(keys[10_000:], bo, ko, fused=fused), p, bo, ko))
    (hf, fast, bo_f, ko_f), (hs, slow, bo_s, ko_s) = runs
    assert np.array_equal(hf, hs)
    assert dict(bo_f) == dict(bo_s) and np.array_equal(ko_f, ko_s)
    assert_same_state(fast, slow)


def test_the_fused_kernel_refuses_a_state_the_pure_driver_did_not_leave_and_changes_nothing():
    # content cached through the per-request calls is absent from block_of: the one-table
    # kernel cannot know the key of that queued block, so it returns -1 and the wrapper runs
    # the call-by-call kernel
    from prefixshield.policies.kernels import s3fifo_kernels as k

    def setup():
        p, bo, ko = fresh(20)
        for key in (7, 8):
            b = p.select_victims(1, 0.0, 0)
            p.on_materialize(b, np.array([key], dtype=np.uint64), 0, 0, 0, 0.0)
            p.on_release(b, np.ones(1, dtype=np.bool_), 0.0)
        return p, bo, ko

    p, bo, ko = setup()
    q = p._lists
    before = [a.copy() for a in (q.prev, q.nxt, q.member, q.length, p._freq, p._key, p._cnt,
                                 p._gkeys, p._gtab, p._gpos)]
    keys = np.arange(100, 160, dtype=np.int64) % 30
    hits = np.zeros(keys.shape[0], dtype=np.bool_)
    bits, ring_len = k.fused_table_sizes(p.num_blocks, p.ghost_size, int(p._gpos[k.G_LIVE]))
    scratch = (np.full(2 << bits, -1, dtype=np.int64), np.zeros(p.num_blocks, dtype=np.int64),
               np.zeros(ring_len, dtype=np.int64))
    got = k.replay_keys_fused(keys, hits, bo, ko, (q.prev, q.nxt, q.member, q.length),
                              q.num_blocks, p._freq, p._key, p._cnt, p._params,
                              (p._gkeys, p._gtab, p._gpos), scratch, bits)
    assert got == -1 and not hits.any() and len(bo) == 0 and (ko == -1).all()
    after = (q.prev, q.nxt, q.member, q.length, p._freq, p._key, p._cnt, p._gkeys, p._gtab,
             p._gpos)
    assert all(np.array_equal(x, y) for x, y in zip(before, after))
    slow, bo_s, ko_s = setup()
    assert np.array_equal(p.replay_keys(keys, bo, ko), slow.replay_keys(keys, bo_s, ko_s,
                                                                        fused=False))
    assert dict(bo) == dict(bo_s) and np.array_equal(ko, ko_s)
    assert_same_state(p, slow)
