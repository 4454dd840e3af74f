"""Conformance checks a policy author reuses: a policy against its reference, operation for
operation, in vLLM's block pool.

A policy is checked the way the package's own are (``tests/policies/``): a short pure-Python
*reference* states what the policy decides, and `run_twin` drives two block pools -- one
over the policy, one over the reference -- through the same pool operations (allocations that
reclaim cached blocks, materializations with repeated content keys, prefix hits that pin free
and in-use blocks, releases in any order). After every operation it asserts the same victims,
evicted blocks, free count and free order, and both pools' invariants
(`check_invariants`: the policy's free set is
exactly the blocks with no reference, the hash map agrees with the blocks, plus the policy's own
[`check_invariants`][prefixshield.policies.base.Policy.check_invariants]).

The operations are tuples ``(op, a, b, c)`` of non-negative ints: draw them with hypothesis, as
the package's tests do, or with [`random_ops`][prefixshield.testing.random_ops]. Example::

    from prefixshield.testing import random_ops, run_twin

    def test_my_policy_matches_its_reference():
        for seed in range(20):
            run_twin(MyPolicy(16), MyReference(16), 16, random_ops(seed), num_keys=32,
                     work_conserving=True)
"""

from __future__ import annotations

import numpy as np

from prefixshield.simulator.blockpool import BlockPool

NUM_GROUPS = 3
"""Groups the twin pools serve; operations pick one from their arguments."""

OPS = (0, 0, 0, 0, 1, 1, 2, 2, 2, 3)
"""Op code (0-9, as drawn) -> operation (0 allocate, 1 hit, 2 release, 3 late materialize)."""


class Twin:
    """Two pools driven identically; every decision of the fast policy is held to the reference.

    Args:
        fast: a fresh policy of ``num_blocks`` blocks, the one under test.
        ref: a fresh reference policy of ``num_blocks`` blocks.
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
    """Drive a `Twin` through ``ops``, checking agreement after every one."""
    twin = Twin(fast, ref, num_blocks, num_keys, work_conserving)
    for t, (op, a, b, c) in enumerate(ops):
        twin.step(OPS[op], a, b, c, float(t))
        twin.check()
    return twin


def random_ops(seed: int, n: int = 200) -> list[tuple[int, int, int, int]]:
    """``n`` operations for `run_twin`, drawn from a seeded numpy generator."""
    rng = np.random.default_rng(seed)
    ops = np.column_stack([rng.integers(0, 10, n), rng.integers(0, 2**16, (n, 3))])
    return [tuple(int(x) for x in row) for row in ops]
