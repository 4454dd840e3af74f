"""S3-FIFO's fused whole-stream replay (array hash tables, miss path inlined) makes the decisions
of the call-by-call replay kernel, request for request, and leaves the same state."""

import numpy as np
import pytest
from numba import types
from numba.typed import Dict

from prefixshield.policies import make_policy
from prefixshield.traces.contracts import DEFAULT_CONTRACTS


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
