"""The numba policies make the same decisions as their pure-Python references (hypothesis).

Two block pools, one over the fast policy and one over the reference, receive the same random
pool-level operations (allocate n>1 blocks, materialize now or later with repeated and duplicate
content keys, prefix hits that pin free and in-use blocks, releases of any held references in
any order, so truly free and cached blocks are freed together). After every operation the
victims, the evicted blocks, the free counts and the full free order must be identical. The
S3-FIFO twin also checks work conservation: an allocation reclaims cached state only for the
blocks that truly free ones could not cover. (LRU's reference equivalence lives here too.)
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from prefixshield.policies import make_policy
from prefixshield.policies.reference import ReferenceLRU, ReferenceS3FIFO
from prefixshield.simulator.cachedriver import replay_keys
from prefixshield.testing import run_twin

ops_strategy = st.lists(st.tuples(st.integers(0, 9), st.integers(0, 2**16),
                                  st.integers(0, 2**16), st.integers(0, 2**16)),
                        min_size=20, max_size=200)


@settings(max_examples=150, deadline=None)
@given(num_blocks=st.integers(2, 24), compat=st.sampled_from(["current", "0.10"]),
       small_ratio=st.sampled_from([0.1, 0.25, 0.5]),
       ghost_ratio=st.sampled_from([0.0, 0.5, 0.9, 2.0]),
       threshold=st.sampled_from([1, 2, 3]), ops=ops_strategy)
def test_s3fifo_matches_reference_under_random_pool_operations(num_blocks, compat, small_ratio,
                                                                ghost_ratio, threshold, ops):
    params = dict(small_size_ratio=small_ratio, ghost_size_ratio=ghost_ratio,
                  move_to_main_threshold=threshold)
    fast = make_policy("s3fifo", num_blocks, compat, **params)
    ref = ReferenceS3FIFO(num_blocks, compat, **params)
    twin = run_twin(fast, ref, num_blocks, ops, num_keys=2 * num_blocks, work_conserving=True)
    s_fast, s_ref = fast.stats(), ref.stats()
    for name in s_ref:
        assert s_fast[name] == s_ref[name], name
    if twin.num_allocations:
        assert fast.stats()["truly_free_taken"] + twin.num_reclaimed >= twin.num_allocations


@settings(max_examples=100, deadline=None)
@given(num_blocks=st.integers(2, 24), compat=st.sampled_from(["current", "0.10"]),
       ops=ops_strategy)
def test_lru_matches_reference_under_random_pool_operations(num_blocks, compat, ops):
    run_twin(make_policy("lru", num_blocks, compat), ReferenceLRU(num_blocks, compat),
             num_blocks, ops, num_keys=2 * num_blocks, work_conserving=compat == "current")


@settings(max_examples=100, deadline=None)
@given(capacity=st.integers(1, 60), num_keys=st.integers(1, 120),
       keys=st.lists(st.integers(0, 10**6), min_size=1, max_size=400))
def test_s3fifo_matches_reference_on_key_streams(capacity, num_keys, keys):
    stream = np.asarray(keys, dtype=np.int64) % num_keys
    fast, ref = make_policy("s3fifo", capacity + 1), ReferenceS3FIFO(capacity + 1)
    assert replay_keys(fast, stream).tolist() == replay_keys(ref, stream).tolist()
    assert fast.ghost_keys().tolist() == list(ref.ghost)
    fast.check_invariants()
