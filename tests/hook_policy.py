"""`HookLRU`: a policy written as another package would write it, run by compiled hooks
(`prefixshield.policies.hooks`); the subject of tests/policies/test_policy_hooks.py and of the
example in docs/writing-a-policy.md.

vLLM's free queue (the decisions of the package's ``lru``), its state one packed buffer, its
events six cfuncs, which its Python methods call too
([`HookedPolicy`][prefixshield.policies.hooks.HookedPolicy]): every path of the engine runs
one implementation. It also counts the blocks hit and materialized per group
(its stats), which shows the events' ``group`` and ``n``.

Its own module, imported under this one name by every test and child process: numba's cache
entry of a cfunc records the module's name, and a module imported under two names (pytest's
``--import-mode=importlib`` names a test file after its folders) fails to load it.
"""

from collections import namedtuple

import numpy as np

from prefixshield.policies import hooks, lru
from prefixshield.policies.kernels import linkedlist as ll
from prefixshield.policies.kernels.packed import Packed, views

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


class HookLRU(hooks.HookedPolicy):
    """vLLM's free queue run by compiled hooks; counts blocks hit and materialized per group."""

    name = "hook_lru"
    HOOKS = hooks.Hooks(_on_hit, _on_acquire, _select_victims, _on_materialize, _on_release,
                        _available)

    def __init__(self, num_blocks: int, vllm_compat: str = "current") -> None:
        super().__init__(num_blocks, vllm_compat)
        self.bind_tenants(["default"], [])

    def bind_tenants(self, groups, contracts) -> None:
        super().bind_tenants(groups, contracts)
        N = self.num_blocks
        packed = Packed([("prev", np.int32, (N + 2,)), ("nxt", np.int32, (N + 2,)),
                         ("member", np.int32, (N,)), ("length", np.int64, (1,)),
                         ("seen", np.int64, (2, max(len(groups), 1))), ("meta", np.int64, (2,))])
        q, self.arrays, self.state = ll.LinkedLists(N), packed.arrays, packed.buffer
        ll.push_tail(q.prev, q.nxt, q.member, q.length, N, 0, np.arange(1, N, dtype=np.int32))
        for k in ("prev", "nxt", "member", "length"):
            self.arrays[k][:] = getattr(q, k)
        self.arrays["meta"][:] = N, self.vllm_compat == "current"

    def num_free(self) -> int:
        return int(self.arrays["length"][0])

    def free_order(self) -> np.ndarray:
        return ll.list_to_array(self.arrays["nxt"], self.num_blocks, 0, self.num_free())

    def stats(self) -> dict:
        seen = self.arrays["seen"]
        return {"hit_blocks": seen[0].tolist(), "materialized_blocks": seen[1].tolist()}
# --8<-- [end:policy]
