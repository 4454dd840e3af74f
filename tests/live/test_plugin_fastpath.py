"""The plugin's fast paths leave vLLM's observable steps as vLLM takes them: a victim without a
hash skips vLLM's ``_maybe_evict_cached_block`` only where that call does nothing (vLLM 0.32.0,
no metrics collector, no partial-prefix keys, the method not patched)."""

from __future__ import annotations

import pytest
from vllm_kv_driver import Side, run_stream

from prefixshield.live import plugin

GROUPS = ["default", "tenant-a", "tenant-b"]


class RecordingMetrics:
    """A stand-in for vLLM's ``KVCacheMetricsCollector``: logs every call it gets, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def on_block_allocated(self, block) -> None:
        self.calls.append(("allocated", block.block_id))

    def on_block_accessed(self, block) -> None:
        self.calls.append(("accessed", block.block_id))

    def on_block_evicted(self, block) -> None:
        self.calls.append(("evicted", block.block_id))


@pytest.mark.parametrize("seed", range(2))
def test_a_metrics_collector_sees_vllms_calls_block_for_block(seed):
    # with a collector set, every victim goes through vLLM's _maybe_evict_cached_block (which
    # reports it evicted), hashed or not, in vLLM's order
    native = Side(36, 16)
    ours = Side(36, 16, plugin.plugin_env("lru", groups=GROUPS, check_invariants=True))
    native.pool.metrics_collector = RecordingMetrics()
    ours.pool.metrics_collector = RecordingMetrics()
    assert run_stream(ours, seed) == run_stream(native, seed)
    assert ours.pool.metrics_collector.calls == native.pool.metrics_collector.calls
    assert any(c[0] == "evicted" for c in native.pool.metrics_collector.calls)
    assert ours.free_queue() == native.free_queue() == ours.pool.policy.free_order().tolist()


def test_a_patched_eviction_method_sees_every_victim():
    # a method patched on the pool (a spy) is called for every victim, as vLLM calls it
    def run(side):
        seen = []
        orig = side.pool._maybe_evict_cached_block

        def spy(blk):
            seen.append((blk.block_id, blk.block_hash is not None))
            return orig(blk)

        side.pool._maybe_evict_cached_block = spy
        run_stream(side, 0, num_ops=120)
        return seen

    native = run(Side(36, 16))
    ours = run(Side(36, 16, plugin.plugin_env("lru", groups=GROUPS, check_invariants=True)))
    assert ours == native
    assert any(not hashed for _, hashed in native) and any(hashed for _, hashed in native)


def test_unhashed_victims_skip_only_a_call_that_does_nothing():
    # without a collector, a victim without a hash is not passed to _maybe_evict_cached_block;
    # the pool still ends in vLLM's state (hash map, block hashes, ref counts, queue)
    assert plugin._NOOP_EVICT_KNOWN == (plugin.vllm.__version__ in plugin.TESTED_VLLM_VERSIONS)
    native = Side(36, 16)
    ours = Side(36, 16, plugin.plugin_env("lru", groups=GROUPS, check_invariants=True))
    assert run_stream(ours, 3) == run_stream(native, 3)
    assert ours.free_queue() == native.free_queue()
    assert [(b.block_id, b.ref_cnt, b.block_hash) for b in ours.pool.blocks] == \
        [(b.block_id, b.ref_cnt, b.block_hash) for b in native.pool.blocks]
    assert len(ours.pool.cached_block_hash_to_block) == \
        len(native.pool.cached_block_hash_to_block)
    assert ours.pool.cached_block_hashes_by_block == native.pool.cached_block_hashes_by_block
