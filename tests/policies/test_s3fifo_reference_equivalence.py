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
from prefixshield.simulator.blockpool import BlockPool
from prefixshield.simulator.cachedriver import replay_keys

NUM_GROUPS = 3

# op codes: 0-3 allocate (+ materialize some at once), 4-5 hit, 6-8 release, 9 late materialize
OPS = (0, 0, 0, 0, 1, 1, 2, 2, 2, 3)
ops_strategy = st.lists(st.tuples(st.integers(0, 9), st.integers(0, 2**16),
                                  st.integers(0, 2**16), st.integers(0, 2**16)),
                        min_size=20, max_size=200)


class Twin:
    """Two pools driven identically; every decision of the fast policy is held to the reference.

    Args:
        fast, ref: fresh policies of ``num_blocks`` blocks.
        num_keys: content keys are drawn from ``1 .. num_keys`` (repeats reach the ghost and
            create duplicate content in two blocks).
        work_conserving: also assert that no cached block is reclaimed while a truly free one
            exists (S3-FIFO always; LRU only in ``"current"`` mode).
    """

    def __init__(self, fast, ref, num_blocks: int, num_keys: int,
                 work_conserving: bool) -> None:
        self.work_conserving = work_conserving
        self.fast = BlockPool(num_blocks, fast, NUM_GROUPS)
        self.ref = BlockPool(num_blocks, ref, NUM_GROUPS)
        self.num_keys = num_keys
        self.held: list[int] = []      # one entry per reference a "request" holds
        self.uncached: list[int] = []  # held blocks not materialized yet
        self.num_allocations = 0
        self.num_reclaimed = 0

    def _materialize(self, blocks: list[int], seed: int, now: float) -> None:
        if not blocks:
            return
        arr = np.asarray(blocks, dtype=np.int32)
        hashes = np.array([1 + (seed + 7919 * i) % self.num_keys for i in range(len(blocks))],
                          dtype=np.uint64)
        group = seed % NUM_GROUPS
        for pool in (self.fast, self.ref):
            pool.cache_full_blocks(arr, hashes, group, 0, 0, now)
        for b in blocks:
            self.uncached.remove(b)

    def step(self, op: int, a: int, b: int, c: int, now: float) -> None:
        """Apply operation ``op`` (0 allocate, 1 hit, 2 release, 3 late materialize) to both
        pools; ``a``, ``b``, ``c`` pick sizes, blocks and keys deterministically."""
        fast, ref = self.fast, self.ref
        if op == 0:  # allocate k blocks, materialize the first m of them at once
            k = 1 + a % 4
            if k > fast.num_free_blocks(0):
                return
            truly_free = fast.num_free_blocks() - int(np.count_nonzero(
                fast.block_hash[fast.policy.free_order()]))
            v_fast = fast.get_new_blocks(k, b % NUM_GROUPS, now)
            v_ref = ref.get_new_blocks(k, b % NUM_GROUPS, now)
            assert v_fast.tolist() == v_ref.tolist(), "different victims"
            assert fast.last_evicted.tolist() == ref.last_evicted.tolist(), "different evictions"
            if self.work_conserving:  # cached state is reclaimed only beyond the truly free
                assert fast.last_evicted.shape[0] == max(0, k - truly_free)
                assert set(fast.last_evicted.tolist()) <= set(v_fast[min(k, truly_free):].tolist())
            self.num_allocations += 1
            self.num_reclaimed += fast.last_evicted.shape[0]
            self.held += v_fast.tolist()
            self.uncached += v_fast.tolist()
            self._materialize(v_fast.tolist()[:c % (k + 1)], c, now)
        elif op == 1:  # prefix hit on cached blocks (free ones are pinned, in-use ones shared)
            cached = np.flatnonzero(fast.block_hash != 0)
            if cached.size == 0:
                return
            pick = sorted({int(cached[(a + i * (b + 1)) % cached.size]) for i in range(1 + c % 3)})
            arr = np.asarray(pick, dtype=np.int32)
            for pool in (fast, ref):
                pool.touch(arr, c % NUM_GROUPS, 0, 0, now)
            self.held += pick
        elif op == 2:  # release some held references, in either order
            if not self.held:
                return
            r = 1 + a % min(len(self.held), 5)
            start = b % len(self.held)
            idx = [(start + i) % len(self.held) for i in range(r)]
            blocks = [self.held[i] for i in idx]
            for i in sorted(idx, reverse=True):
                del self.held[i]
            if c % 2:
                blocks.reverse()
            for blk in blocks:
                if blk in self.uncached and blk not in self.held:
                    self.uncached.remove(blk)
            arr = np.asarray(blocks, dtype=np.int32)
            for pool in (fast, ref):
                pool.free_blocks(arr, now)
        else:  # late materialization (a later chunk of the prompt)
            if not self.uncached:
                return
            m = 1 + a % min(len(self.uncached), 4)
            self._materialize(self.uncached[:m], b, now)

    def check(self) -> None:
        """Both pools agree on free count, free order and hashes; both pass their invariants."""
        fast, ref = self.fast, self.ref
        assert fast.num_free_blocks() == ref.num_free_blocks()
        assert fast.policy.free_order().tolist() == ref.policy.free_order().tolist()
        assert fast.block_hash.tolist() == ref.block_hash.tolist()
        fast.check_invariants()
        ref.check_invariants()


def run_twin(fast, ref, num_blocks, ops, num_keys, work_conserving):
    """Drive a :class:`Twin` through ``ops``, checking agreement after every one."""
    twin = Twin(fast, ref, num_blocks, num_keys, work_conserving)
    for t, (op, a, b, c) in enumerate(ops):
        twin.step(OPS[op], a, b, c, float(t))
        twin.check()
    return twin


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
