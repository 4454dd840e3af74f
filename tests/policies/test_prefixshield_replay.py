"""PrefixShield's one-kernel key-stream replay makes the generic driver's decisions, and the
packed state keeps the per-request path's semantics at its narrow-dtype bounds."""

import numpy as np
import pytest
from numba import types
from numba.typed import Dict

from prefixshield.policies import make_policy
from prefixshield.policies.kernels import prefixshield_kernels as K
from prefixshield.policies.reference.prefixshield import ReferencePrefixShield
from prefixshield.simulator.cachedriver import replay_keys
from prefixshield.tenancy import DEFAULT_CONTRACTS, Contract

from policies.test_prefixshield_random import ADVANCE, REQUEST, assert_same_state, run_ops

TIGHT = [Contract("tight", 0.02, 2.0), Contract("loose", 0.2, 8.0)]
"""Refill slow against one request per second, so groups go into debt and selection ranks them."""


def _stream(seed: int, n: int, num_keys: int, scan: bool) -> np.ndarray:
    rng = np.random.default_rng(seed)
    keys = (rng.zipf(1.2, n) % num_keys).astype(np.int64)
    if scan:  # runs of never-seen keys
        for start in rng.integers(0, n - 50, n // 400):
            keys[start:start + 40] = num_keys + start + np.arange(40)
    return keys


def _batch(policy, keys, groups, contract=0):
    block_of = Dict.empty(key_type=types.int64, value_type=types.int32)
    key_of = np.full(policy.num_blocks, -1, dtype=np.int64)
    return policy.replay_keys(keys, block_of, key_of, groups=groups, contract=contract), block_of


@pytest.mark.parametrize("contracts", [list(DEFAULT_CONTRACTS.values()), TIGHT],
                         ids=["default", "tight"])
@pytest.mark.parametrize("flags", [{}, dict(segmentation=False), dict(responsibility=False),
                                   dict(debt_gate=False, history_factor=0.05)])
@pytest.mark.parametrize("capacity,num_groups,scan", [(20, 3, False), (200, 8, True),
                                                      (1000, 32, True)])
def test_batch_replay_equals_one_call_at_a_time(capacity, num_groups, scan, flags, contracts):
    _assert_batch_equals_generic(capacity, num_groups, scan, flags, contracts)


@pytest.mark.parametrize("contracts", [list(DEFAULT_CONTRACTS.values()), TIGHT],
                         ids=["default", "tight"])
@pytest.mark.parametrize("max_debt_samples", [5, 0])
def test_batch_replay_keeps_the_debt_log_of_one_call_at_a_time(max_debt_samples, contracts):
    # a log that halves (its stride doubles) many times, and a log that keeps nothing
    _assert_batch_equals_generic(200, 8, True, dict(max_debt_samples=max_debt_samples),
                                 contracts)


def _assert_batch_equals_generic(capacity, num_groups, scan, flags, contracts):
    keys = _stream(capacity, 6000, 5 * capacity, scan)
    groups = (keys * 7 + 3) % num_groups
    contract = len(contracts) - 1
    names = tuple(f"g{i}" for i in range(num_groups))
    fast, slow = (make_policy("prefixshield", capacity + 1, **flags) for _ in range(2))
    for p in (fast, slow):
        p.bind_tenants(names, contracts)
    got, block_of = _batch(fast, keys, groups, contract)
    want, want_map = _generic(slow, keys, groups, contract)
    assert np.array_equal(got, want)
    assert dict(block_of) == want_map
    assert np.array_equal(fast.free_order(), slow.free_order())
    assert fast.stats() == slow.stats()  # counters, debts, classes and debt-log samples
    assert ((fast.debt_log.size, fast.debt_log.stride, fast.debt_log.num_charges)
            == (slow.debt_log.size, slow.debt_log.stride, slow.debt_log.num_charges))
    for name in ("owner", "contract", "prefix", "klass", "cached", "hits", "seq"):
        assert np.array_equal(getattr(fast, name), getattr(slow, name)), name
    fast.check_invariants()


def _generic(policy, keys, groups, contract, maps=None):
    """The cache driver's per-request calls (:func:`replay_keys` with ``batch=False``), with
    the tenants already bound; returns the hits and the key -> block map."""
    block_of, key_of = maps or ({}, np.full(policy.num_blocks, -1, dtype=np.int64))
    hits = np.zeros(keys.shape[0], dtype=np.bool_)
    one, key_arr, yes = np.empty(1, np.int32), np.empty(1, np.uint64), np.ones(1, np.bool_)
    for i, key in enumerate(keys.tolist()):
        g, now = int(groups[i]), float(i)
        if key in block_of:
            hits[i] = True
            one[0] = block_of[key]
            policy.on_hit(one, g, contract, key, now)
            policy.on_acquire(one)
            policy.on_release(one, yes, now)
            continue
        victim = int(policy.select_victims(1, now, g)[0])
        if key_of[victim] >= 0:
            del block_of[int(key_of[victim])]
        key_of[victim], block_of[key] = key, victim
        one[0], key_arr[0] = victim, key
        policy.on_materialize(one, key_arr, g, contract, key, now)
        policy.on_release(one, yes, now)
    return hits, block_of


def test_batch_replay_continues_from_the_state_a_first_replay_left():
    names = tuple(f"g{i}" for i in range(4))
    fast = make_policy("prefixshield", 101)
    slow = make_policy("prefixshield", 101)
    for p in (fast, slow):
        p.bind_tenants(names, TIGHT)
    block_of = Dict.empty(key_type=types.int64, value_type=types.int32)
    key_of = np.full(101, -1, dtype=np.int64)
    keys = _stream(1, 4000, 400, True)
    groups = keys % 4
    fast.replay_keys(keys[:1500], block_of, key_of, groups=groups[:1500])
    # the second replay restarts its clock at 0 (a clock that stepped back: full scoring)
    fast.replay_keys(keys[1500:], block_of, key_of, groups=groups[1500:])
    maps = ({}, np.full(101, -1, dtype=np.int64))
    _generic(slow, keys[:1500], groups[:1500], 0, maps)
    _generic(slow, keys[1500:], groups[1500:], 0, maps)
    assert np.array_equal(fast.free_order(), slow.free_order())
    assert fast.stats() == slow.stats()
    assert dict(block_of) == maps[0]
    assert np.array_equal(key_of, maps[1])


def test_the_cache_driver_batch_path_uses_prefixshield_replay():
    keys = _stream(2, 5000, 300, True)
    fast = make_policy("prefixshield", 61)
    slow = make_policy("prefixshield", 61)
    assert np.array_equal(replay_keys(fast, keys, batch=True), replay_keys(slow, keys, batch=False))
    assert fast.stats() == slow.stats()


def test_native_order_stamps_renumber_at_the_int32_limit_without_changing_a_decision():
    """``seq`` is int32: near its limit the stamps are renumbered, every later decision equal to
    the reference's."""
    rng = np.random.default_rng(5)
    contracts = [Contract("a", 1.0, 4.0), Contract("b", 3.0, 2.0)]
    G, N = 3, 24
    ops = [(int(rng.choice([ADVANCE, REQUEST, REQUEST, REQUEST])), int(rng.integers(2**31)),
            int(rng.integers(2**31)), 0.05) for _ in range(600)]
    fast = make_policy("prefixshield", N)
    ref = ReferencePrefixShield(N)
    names = [f"g{i}" for i in range(G)]
    fast.bind_tenants(names, contracts)
    ref.bind_tenants(names, contracts)
    fast._ctl[K.C_SEQ] = K.SEQ_LIMIT - 200  # renumbered within the first few hundred releases

    def check(kind, info):
        if kind == "select":
            assert info["victims"][0].tolist() == info["victims"][1].tolist()

    m = run_ops([fast, ref], G, contracts, N, ops, check)
    assert int(fast._ctl[K.C_SEQ]) < K.SEQ_LIMIT - 200  # it did renumber
    assert_same_state(fast, ref, m.t)
    fast.check_invariants()


def test_more_groups_than_the_owner_dtype_holds_are_refused():
    p = make_policy("prefixshield", 8)
    with pytest.raises(ValueError, match="at most"):
        p.bind_tenants([f"g{i}" for i in range(K.MAX_GROUPS + 1)],
                       list(DEFAULT_CONTRACTS.values()))


def test_a_copied_policy_decides_on_its_own_state():
    """The packed state survives deepcopy/pickle: the copy's views, addresses and selection
    entry are over its own buffer (the original is not touched by the copy's events)."""
    import copy
    import pickle

    names = tuple(f"g{i}" for i in range(4))
    p = make_policy("prefixshield", 61)
    p.bind_tenants(names, TIGHT)
    keys = _stream(3, 3000, 200, True)
    _generic(p, keys[:1000], keys[:1000] % 4, 0)
    for clone in (copy.deepcopy(p), pickle.loads(pickle.dumps(p))):
        before = p.free_order().copy()
        assert np.array_equal(clone.free_order(), before)
        assert clone.stats() == p.stats()
        _generic(clone, keys[1000:], keys[1000:] % 4, 0)
        clone.check_invariants()
        assert np.array_equal(p.free_order(), before)
