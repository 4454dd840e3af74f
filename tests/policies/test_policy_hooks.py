"""A policy from outside the package runs in the fused loop through compiled hooks (issue 33).

`HookLRU` is written as another package would write it: a `Policy` subclass, not in the
package's registry, whose state is one packed buffer and whose events are `hooks` cfuncs. Its
Python methods call the same compiled hooks (through ctypes), so the step-by-step oracle, the
per-step batched path and the fused loop run one implementation: the tests pin that the loop
calls the hooks where the block pool calls the events, with the same arguments (its per-group
counters check ``group`` and ``n`` of ``on_hit`` and ``on_materialize``), and, since its
decisions are vLLM's free queue, that it evicts exactly as the package's own ``lru`` does.
"""

import dataclasses
import os
import subprocess
import sys
from collections import namedtuple
from pathlib import Path

import numpy as np
import pytest
from numba import njit

from helpers import assert_same_run, small_trace
from prefixshield.policies import hooks, lru, make_policy
from prefixshield.policies.base import FusedArrays, Policy
from prefixshield.policies.kernels import linkedlist as ll
from prefixshield.policies.kernels.packed import Packed, views
from prefixshield.simulator.config import EngineConfig
from prefixshield.simulator.costmodel import load_profile
from prefixshield.simulator.engine import Engine

COST = load_profile("l4-qwen2.5-1.5b").cost


# --8<-- [start:policy]
State = namedtuple("State", "prev nxt member length seen meta")
_views = views(State, [(np.int32, 1)] * 3 + [(np.int64, 1), (np.int64, 2), (np.int64, 1)])


@hooks.hook
def _on_hit(state, a, b, n, group, contract, prefix, now):
    _views(state).seen[0, group] += n  # blocks hit, per group
    return 0


@hooks.hook
def _on_acquire(state, a, b, n, group, contract, prefix, now):
    s = _views(state)
    ll.unlink(s.prev, s.nxt, s.member, s.length, hooks.array(a, n, np.int32))
    return 0


@hooks.hook
def _select_victims(state, a, b, n, group, contract, prefix, now):
    s = _views(state)
    ll.pop_head(s.prev, s.nxt, s.member, s.length, s.meta[0], 0, n,
                hooks.array(b, n, np.int32), 0)
    return 0


@hooks.hook
def _on_materialize(state, a, b, n, group, contract, prefix, now):
    _views(state).seen[1, group] += n  # blocks materialized, per group
    return 0


@hooks.hook
def _on_release(state, a, b, n, group, contract, prefix, now):
    s = _views(state)
    lru._release(hooks.array(a, n, np.int32), hooks.array(b, n, np.bool_), s.meta[1] != 0,
                 s.prev, s.nxt, s.member, s.length, s.meta[0])
    return 0


@hooks.hook
def _available(state, a, b, n, group, contract, prefix, now):
    return _views(state).length[0]


HOOKS = hooks.Hooks(_on_hit, _on_acquire, _select_victims, _on_materialize, _on_release,
                    _available)


def _ptr(x):
    return None if x is None else np.ascontiguousarray(x).ctypes.data


class HookLRU(Policy):
    """vLLM's free queue run by compiled hooks; counts blocks hit and materialized per group."""

    name = "hook_lru"

    def __init__(self, num_blocks: int, vllm_compat: str = "current") -> None:
        super().__init__(num_blocks, vllm_compat)
        self.bind_tenants(["default"], [])

    def bind_tenants(self, groups, contracts) -> None:
        super().bind_tenants(groups, contracts)
        N = self.num_blocks
        self.packed = Packed([("prev", np.int32, (N + 2,)), ("nxt", np.int32, (N + 2,)),
                              ("member", np.int32, (N,)), ("length", np.int64, (1,)),
                              ("seen", np.int64, (2, max(len(groups), 1))),
                              ("meta", np.int64, (2,))])
        q, s = ll.LinkedLists(N), self.packed.arrays
        ll.push_tail(q.prev, q.nxt, q.member, q.length, N, 0, np.arange(1, N, dtype=np.int32))
        for k in ("prev", "nxt", "member", "length"):
            s[k][:] = getattr(q, k)
        s["meta"][:] = N, self.vllm_compat == "current"

    def _call(self, hook, a=None, b=None, n=0, group=-1, contract=-1, prefix=-1, now=0.0):
        return hook.ctypes(self.packed.buffer.ctypes.data, _ptr(a), _ptr(b), n, group,
                           contract, prefix, now)

    def on_hit(self, blocks, group, contract, prefix_id, now, **kwargs) -> None:
        self._call(_on_hit, blocks.astype(np.int32), None, len(blocks), group, contract,
                   prefix_id, now)

    def on_acquire(self, blocks) -> None:
        self._call(_on_acquire, blocks.astype(np.int32), None, len(blocks))

    def select_victims(self, n, now, requester) -> np.ndarray:
        out = np.empty(n, dtype=np.int32)
        self._call(_select_victims, None, out, n, requester, now=now)
        return out

    def on_materialize(self, blocks, hashes, group, contract, prefix_id, now, **kwargs) -> None:
        self._call(_on_materialize, blocks.astype(np.int32), hashes.astype(np.uint64),
                   len(blocks), group, contract, prefix_id, now)

    def on_release(self, blocks, cached, now) -> None:
        self._call(_on_release, blocks.astype(np.int32), cached.astype(np.bool_), len(blocks),
                   now=now)

    def available(self, requester: int) -> int:
        return self._call(_available, group=requester)

    def num_free(self) -> int:
        return int(self.packed.arrays["length"][0])

    def free_order(self) -> np.ndarray:
        s = self.packed.arrays
        return ll.list_to_array(s["nxt"], self.num_blocks, 0, s["length"][0])

    def stats(self) -> dict:
        seen = self.packed.arrays["seen"]
        return {"hit_blocks": seen[0].tolist(), "materialized_blocks": seen[1].tolist()}

    def fused_arrays(self) -> FusedArrays:
        return FusedArrays("hooks", packed=self.packed.buffer, hooks=HOOKS.table())
# --8<-- [end:policy]


def _run(trace, config, policy, **kw):
    engine = Engine(trace, policy, COST, config, **kw)
    return engine, engine.run()


def three_runs(trace, config):
    """The oracle's, the per-step batched path's and the fused loop's runs of `HookLRU`
    (the last asserted to take the fused loop), checked bit-identical; the fused one's
    engine and result."""
    runs = []
    for kw in (dict(batched=False), dict(fused=False), dict()):
        engine = Engine(trace, HookLRU(config.num_blocks, config.vllm_compat), COST, config,
                        **kw)
        assert engine.fused_applies() == (kw == {})
        runs.append((engine, engine.run()))
    (e0, r0), *rest = runs
    for engine, result in rest:
        assert_same_run(r0, result)
        assert result.num_events == r0.num_events
        assert np.array_equal(engine.pool.policy.free_order(), e0.pool.policy.free_order())
        assert np.array_equal(engine.pool.policy.packed.buffer, e0.pool.policy.packed.buffer)
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


def test_hooks_reject_functions_of_another_signature():
    @njit
    def not_a_hook(state):
        return 0

    with pytest.raises(TypeError, match="hooks.SIG"):
        hooks.Hooks(*([not_a_hook] + [_on_hit] * 5))


def test_engine_rejects_a_hooks_policy_without_addresses():
    class Broken(HookLRU):
        def fused_arrays(self):
            return FusedArrays("hooks", packed=self.packed.buffer)

    trace = small_trace("two_pass_replay", seed=1)
    engine = Engine(trace, Broken(64), COST, EngineConfig(num_blocks=64))
    with pytest.raises(ValueError, match="Hooks.table"):
        engine.fused_applies()


_CACHE_PROBE = """
import sys
sys.path[:0] = [{tests!r}, {here!r}]
from test_policy_hooks import HookLRU, COST, small_trace
from prefixshield.simulator.config import EngineConfig
from prefixshield.simulator.engine import Engine
from prefixshield.simulator import fused as fz
engine = Engine(small_trace("two_pass_replay", seed=1), HookLRU(160), COST,
                EngineConfig(num_blocks=160))
assert engine.fused_applies()
engine.run()
print(sum(fz.run_loop.stats.cache_hits.values()), sum(fz.run_loop.stats.cache_misses.values()))
"""


def test_fused_loop_with_hooks_is_loaded_from_the_cache_in_a_new_process(tmp_path):
    # the first process may compile (the cache may be cold); the second must load run_loop
    here = Path(__file__).parent
    code = _CACHE_PROBE.format(tests=str(here.parent), here=str(here))
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))
    counts = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=env, check=True).stdout.split() for _ in range(2)]
    assert counts[1] == ["1", "0"], counts
