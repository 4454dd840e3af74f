"""`HookLRU`: a policy written as another package would write it, run by compiled hooks
(`prefixshield.policies.hooks`); the subject of tests/policies/test_policy_hooks.py and of the
example in docs/writing-a-policy.md.

vLLM's free queue (the decisions of the package's ``lru``), its state one packed buffer
declared once (a `Record`), its events six cfuncs, which its Python methods call too
([`HookedPolicy`][prefixshield.policies.hooks.HookedPolicy]): every path of the engine runs
one implementation. It also counts the blocks hit and materialized per group
(its stats), which shows the events' ``group`` and ``n``.

Its own module, imported under this one name by every test and child process: numba's cache
entry of a cfunc records the module's name, and a module imported under two names (pytest's
``--import-mode=importlib`` names a test file after its folders) fails to load it.
"""

import numpy as np

from prefixshield.policies import hooks, lru
from prefixshield.policies.kernels import linkedlist as ll, packed

# --8<-- [start:policy]
STATE = packed.Record(prev=np.int32, nxt=np.int32, member=np.int32, length=np.int64,
                      hit_blocks=np.int64, materialized_blocks=np.int64, meta=np.int64)
_views = STATE.views  # a global: what the hooks read their state with


@hooks.hook
def on_hit(state, a, b, n, group, contract, prefix, now):
    _views(state).hit_blocks[group] += n
    return 0


@hooks.hook
def on_acquire(state, a, b, n, group, contract, prefix, now):
    s = _views(state)
    ll.unlink(s.prev, s.nxt, s.member, s.length, hooks.array(a, n, np.int32))
    return 0


@hooks.hook
def select_victims(state, a, b, n, group, contract, prefix, now):
    s = _views(state)
    ll.pop_head(s.prev, s.nxt, s.member, s.length, s.meta[0], 0, n, hooks.array(b, n, np.int32), 0)
    return 0


@hooks.hook
def on_materialize(state, a, b, n, group, contract, prefix, now):
    _views(state).materialized_blocks[group] += n
    return 0


@hooks.hook
def on_release(state, a, b, n, group, contract, prefix, now):
    s = _views(state)
    lru._release(hooks.array(a, n, np.int32), hooks.array(b, n, np.bool_), s.meta[1] != 0,
                 s.prev, s.nxt, s.member, s.length, s.meta[0])
    return 0


@hooks.hook
def available(state, a, b, n, group, contract, prefix, now):
    return _views(state).length[0]


class HookLRU(hooks.HookedPolicy):
    """vLLM's free queue run by compiled hooks; counts blocks hit and materialized per group."""

    name = "hook_lru"
    HOOKS = hooks.Hooks(STATE, on_hit=on_hit, on_acquire=on_acquire, select_victims=select_victims,
                        on_materialize=on_materialize, on_release=on_release, available=available)
    STATS = ("hit_blocks", "materialized_blocks")

    def initial_state(self) -> dict:
        N, G, q = self.num_blocks, max(len(self.groups), 1), ll.LinkedLists(self.num_blocks)
        ll.push_tail(q.prev, q.nxt, q.member, q.length, N, 0, np.arange(1, N, dtype=np.int32))
        return dict(prev=q.prev, nxt=q.nxt, member=q.member, length=q.length, hit_blocks=G,
                    materialized_blocks=G, meta=np.array([N, self.vllm_compat == "current"]))

    def num_free(self) -> int:
        return int(self.arrays["length"][0])

    def free_order(self) -> np.ndarray:
        return ll.list_to_array(self.arrays["nxt"], self.num_blocks, 0, self.num_free())
# --8<-- [end:policy]
