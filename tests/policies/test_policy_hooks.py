"""A policy from outside the package runs in the fused loop through compiled hooks (issue 33).

`hook_policy.HookLRU` is written as another package would write it: a `Policy` subclass, not
in the package's registry, whose state is one packed buffer and whose events are `hooks`
cfuncs. Its Python methods call the same compiled hooks (through ctypes), so the step-by-step
oracle, the
per-step batched path and the fused loop run one implementation: the tests pin that the loop
calls the hooks where the block pool calls the events, with the same arguments (its per-group
counters check ``group`` and ``n`` of ``on_hit`` and ``on_materialize``), and, since its
decisions are vLLM's free queue, that it evicts exactly as the package's own ``lru`` does.
"""

import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from numba import njit

from helpers import assert_same_run, small_trace
import hook_policy
from hook_policy import HookLRU
from prefixshield.policies import hooks, make_policy
from prefixshield.policies.base import FusedArrays
from prefixshield.policies.kernels import packed
from prefixshield.simulator.config import EngineConfig
from prefixshield.simulator.costmodel import load_profile
from prefixshield.simulator.engine import Engine

COST = load_profile("l4-qwen2.5-1.5b").cost


def three_runs(trace, config, policy_class=HookLRU):
    """The oracle's, the per-step batched path's and the fused loop's runs of
    ``policy_class`` (a `HookLRU`; the last run asserted to take the fused loop), checked
    bit-identical; the fused one's engine and result."""
    runs = []
    for kw in (dict(batched=False), dict(fused=False), dict()):
        engine = Engine(trace, policy_class(config.num_blocks, config.vllm_compat), COST, config,
                        **kw)
        assert engine.fused_applies() == (kw == {})
        runs.append((engine, engine.run()))
    (e0, r0), *rest = runs
    for engine, result in rest:
        assert_same_run(r0, result)
        assert result.num_events == r0.num_events
        assert np.array_equal(engine.pool.policy.free_order(), e0.pool.policy.free_order())
        assert np.array_equal(engine.pool.policy.state, e0.pool.policy.state)
    return runs[-1]


@pytest.mark.parametrize("compat", ("0.10", "current"))
@pytest.mark.parametrize("num_blocks, check", ((512, False), (160, True)))
def test_hook_policy_runs_bit_identical_on_every_path(compat, num_blocks, check):
    trace = small_trace("two_pass_replay", seed=1)
    config = EngineConfig(num_blocks=num_blocks, vllm_compat=compat, check_invariants=check)
    engine, result = three_runs(trace, config)
    # the counters saw the events' groups and sizes: every materialized block is created
    assert sum(result.policy_stats["materialized_blocks"]) == int(result.creations["blocks"].sum())
    assert sum(result.policy_stats["hit_blocks"]) > 0
    # vLLM's free queue through hooks decides as the package's own LRU kernels do
    ref = Engine(trace, make_policy("lru", num_blocks, compat), COST, config)
    ref_result = ref.run()
    assert_same_run(ref_result, dataclasses.replace(result, policy_stats={}))
    assert np.array_equal(ref.pool.policy.free_order(), engine.pool.policy.free_order())


class QuietLRU(HookLRU):
    """`HookLRU` that follows neither hits nor materializations: those hooks left out."""

    HOOKS = hooks.Hooks(hook_policy.STATE, on_acquire=hook_policy.on_acquire,
                        select_victims=hook_policy.select_victims,
                        on_release=hook_policy.on_release, available=hook_policy.available)


def test_hooks_left_out_do_nothing_on_every_path():
    trace = small_trace("two_pass_replay", seed=1)
    config = EngineConfig(num_blocks=160, vllm_compat="current")
    engine, result = three_runs(trace, config, QuietLRU)
    zeros = [0] * len(engine.pool.policy.groups)
    assert result.policy_stats == {"hit_blocks": zeros, "materialized_blocks": zeros}
    ref = Engine(trace, make_policy("lru", 160, "current"), COST, config)
    assert_same_run(ref.run(), dataclasses.replace(result, policy_stats={}))
    assert np.array_equal(ref.pool.policy.free_order(), engine.pool.policy.free_order())


def test_hooks_reject_functions_of_another_signature():
    @njit
    def not_a_hook(state):
        return 0

    events = {name: getattr(hook_policy, name) for name in hooks.EVENTS}
    with pytest.raises(TypeError, match="hooks.SIG"):
        hooks.Hooks(hook_policy.STATE, **{**events, "on_hit": not_a_hook})
    with pytest.raises(TypeError, match="Record"):
        hooks.Hooks(None, **events)


def test_record_packs_arrays_and_shapes_into_its_fields():
    record = packed.Record(a=np.int32, b=(np.float64, 2))
    buf = record.pack(a=np.arange(3), b=(2, 4))
    assert buf.arrays["a"].dtype == np.int32 and buf.arrays["a"].tolist() == [0, 1, 2]
    assert buf.arrays["b"].shape == (2, 4) and not buf.arrays["b"].any()
    assert record.pack(a=5, b=np.ones((1, 2))).arrays["a"].shape == (5,)
    with pytest.raises(ValueError, match="one value per field"):
        record.pack(a=3)
    with pytest.raises(ValueError, match="dimension"):
        record.pack(a=3, b=4)


def test_engine_rejects_a_hooks_policy_without_addresses():
    class Broken(HookLRU):
        def fused_arrays(self):
            return FusedArrays("hooks", packed=self.state)

    trace = small_trace("two_pass_replay", seed=1)
    engine = Engine(trace, Broken(512), COST, EngineConfig(num_blocks=512))
    with pytest.raises(ValueError, match="Hooks.table"):
        engine.fused_applies()


_CACHE_PROBE = """
import sys
sys.path.insert(0, {tests!r})
from helpers import small_trace
from hook_policy import HookLRU
from prefixshield.simulator.config import EngineConfig
from prefixshield.simulator.costmodel import load_profile
from prefixshield.simulator.engine import Engine
from prefixshield.simulator import fused as fz
engine = Engine(small_trace("two_pass_replay", seed=1), HookLRU(160),
                load_profile("l4-qwen2.5-1.5b").cost, EngineConfig(num_blocks=160))
assert engine.fused_applies()
engine.run()
print(sum(fz.run_loop.stats.cache_hits.values()), sum(fz.run_loop.stats.cache_misses.values()))
"""


def test_fused_loop_with_hooks_is_loaded_from_the_cache_in_a_new_process():
    # the first child compiles run_loop if this suite has not yet (the package's kernel cache,
    # which the children inherit); the second must load it: (cache hits, misses) == (1, 0)
    code = _CACHE_PROBE.format(tests=str(Path(__file__).resolve().parents[1]))
    counts = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True).stdout.split() for _ in range(2)]
    assert counts[1] == ["1", "0"], counts
