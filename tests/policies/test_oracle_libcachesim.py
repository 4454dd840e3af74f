"""Oracle: our S3-FIFO and LRU hit/miss on every request == libCacheSim's (``libcachesim``).

Both sides see the same key stream. Ours runs through the pure cache driver (``replay_keys``,
``num_blocks = capacity + 1``); libCacheSim counts capacity in bytes, so every object has size 1.
libCacheSim's S3-FIFO caches nothing below capacity 20 (small FIFO of 1 byte) and aborts below
10, hence the smallest capacity tested is 20.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import libcachesim  # noqa: E402  (a test dependency: missing means failing, not skipping)

from prefixshield.bench.keystream import scan_mix_keys, zipf_keys  # the bench's streams
from prefixshield.policies import make_policy  # noqa: E402
from prefixshield.simulator.cachedriver import replay_keys  # noqa: E402

# capacity -> (requests, key universe); the universe is wide enough for evictions at every alpha
SIZES = {20: (10_000, 200), 512: (30_000, 4_000), 4096: (60_000, 30_000),
         65536: (200_000, 300_000)}
ALPHAS = {20: (0.6, 0.8, 1.0), 512: (0.6, 0.8, 1.0), 4096: (0.6, 0.8, 1.0), 65536: (0.6, 0.8)}


def libcachesim_hits(cache, keys: np.ndarray) -> np.ndarray:
    """Per-request hit flags from ``cache.get`` (object size 1)."""
    req = libcachesim.Request()
    req.obj_size = 1
    hits = np.empty(keys.shape[0], dtype=np.bool_)
    get = cache.get
    for i, key in enumerate(keys.tolist()):
        req.obj_id = key
        hits[i] = get(req)
    return hits


def hashpower(capacity: int) -> int:
    """libCacheSim hash table size exponent for ``capacity`` objects."""
    return int(math.log2(capacity)) + 1


def assert_same_decisions(ours: np.ndarray, theirs: np.ndarray, label: str) -> None:
    """Equal hit flags on every request, else name the first divergent request."""
    diff = np.flatnonzero(ours != theirs)
    assert diff.size == 0, (f"{label}: first divergence at request {diff[0]} "
                            f"(ours hit={ours[diff[0]]}), {diff.size} in all; hit ratio ours "
                            f"{ours.mean():.5f} vs libCacheSim {theirs.mean():.5f}")


def traces_for(capacity: int):
    """(label, keys) of the Zipf and scan-mix traces used at ``capacity``."""
    n, num_keys = SIZES[capacity]
    for alpha in ALPHAS[capacity]:
        yield f"zipf{alpha}", zipf_keys(n, num_keys, alpha, seed=capacity)
    yield "scanmix1.0", scan_mix_keys(n, num_keys, 1.0, seed=capacity)


@pytest.mark.parametrize("capacity", sorted(SIZES))
def test_s3fifo_matches_libcachesim_on_every_request(capacity):
    for label, keys in traces_for(capacity):
        policy = make_policy("s3fifo", capacity + 1)
        ours = replay_keys(policy, keys)
        theirs = libcachesim_hits(libcachesim.S3FIFO(capacity, hashpower=hashpower(capacity)),
                                  keys)
        stats = policy.stats()
        print(f"s3fifo cap={capacity} {label}: ours {ours.mean():.5f} "
              f"libCacheSim {theirs.mean():.5f} ({keys.shape[0]} requests, "
              f"{stats['evictions_small']}+{stats['evictions_main']} evictions)")
        assert stats["evictions_small"] + stats["evictions_main"] > keys.shape[0] // 50, label
        assert_same_decisions(ours, theirs, f"s3fifo cap={capacity} {label}")
        policy.check_invariants()


@pytest.mark.parametrize("capacity", sorted(SIZES))
def test_lru_matches_libcachesim_on_every_request(capacity):
    for label, keys in traces_for(capacity):
        ours = replay_keys(make_policy("lru", capacity + 1), keys)
        theirs = libcachesim_hits(libcachesim.LRU(capacity, hashpower=hashpower(capacity)), keys)
        print(f"lru cap={capacity} {label}: ours {ours.mean():.5f} "
              f"libCacheSim {theirs.mean():.5f}")
        assert (~ours).sum() > capacity, f"{label}: too few misses to evict"
        assert_same_decisions(ours, theirs, f"lru cap={capacity} {label}")


@pytest.mark.parametrize("params", [
    dict(small_size_ratio=0.25, ghost_size_ratio=0.5, move_to_main_threshold=1),
    dict(small_size_ratio=0.05, ghost_size_ratio=1.5, move_to_main_threshold=3),
    dict(small_size_ratio=0.1, ghost_size_ratio=0.0, move_to_main_threshold=2),
])
def test_s3fifo_parameters_match_libcachesim(params):
    capacity = 512
    keys = scan_mix_keys(30_000, 4_000, 0.9, seed=7)
    ours = replay_keys(make_policy("s3fifo", capacity + 1, **params), keys)
    theirs = libcachesim_hits(libcachesim.S3FIFO(capacity, hashpower=hashpower(capacity),
                                                 **params), keys)
    assert_same_decisions(ours, theirs, f"s3fifo {params}")


@settings(max_examples=60, deadline=None)
@given(capacity=st.integers(20, 80), num_keys=st.integers(10, 300),
       small_size_ratio=st.sampled_from([0.1, 0.25, 0.5]),
       ghost_size_ratio=st.sampled_from([0.0, 0.5, 0.9, 2.0]),
       move_to_main_threshold=st.sampled_from([1, 2, 3]),
       keys=st.lists(st.integers(0, 10**6), min_size=1, max_size=2000))
def test_s3fifo_matches_libcachesim_on_random_streams(capacity, num_keys, small_size_ratio,
                                                      ghost_size_ratio, move_to_main_threshold,
                                                      keys):
    params = dict(small_size_ratio=small_size_ratio, ghost_size_ratio=ghost_size_ratio,
                  move_to_main_threshold=move_to_main_threshold)
    stream = np.asarray(keys, dtype=np.int64) % num_keys
    ours = replay_keys(make_policy("s3fifo", capacity + 1, **params), stream)
    theirs = libcachesim_hits(libcachesim.S3FIFO(capacity, hashpower=hashpower(capacity),
                                                 **params), stream)
    assert_same_decisions(ours, theirs, f"s3fifo cap={capacity} {params}")


def test_s3fifo_queue_sizes_truncate_like_libcachesim():
    # capacity 20: small (int)(20*0.1)=2, main 18, ghost (int)(20*0.9)=18
    p = make_policy("s3fifo", 21)
    assert (p.small_size, p.main_size, p.ghost_size) == (2, 18, 18)
    # capacity 511 (512 blocks): small int(51.1)=51, main 460, ghost int(459.9)=459
    p = make_policy("s3fifo", 512)
    assert (p.small_size, p.main_size, p.ghost_size) == (51, 460, 459)
    p = make_policy("s3fifo", 30, small_size_ratio=0.15)  # 29*0.15 = 4.35 -> 4
    assert (p.small_size, p.main_size) == (4, 25)
