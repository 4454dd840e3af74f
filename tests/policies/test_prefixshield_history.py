"""PrefixShield's admission history (an LRU set over an open-addressing table whose slots carry
their displacement) answers "first admission?" exactly as an LRU set does, and its table stays
whole: every entry in one slot, on its key's probe chain, with its displacement right."""

from collections import OrderedDict

import numpy as np
from numba import njit

from prefixshield.policies import make_policy
from prefixshield.policies.kernels import prefixshield_kernels as K
from prefixshield.tenancy import DEFAULT_CONTRACTS


@njit
def _admit_all(st, gs, pids, out):
    s = K.state(st)
    for i in range(gs.shape[0]):
        out[i] = K._history_admit(s, gs[i], pids[i])


@njit
def _home(st, g, pid):
    return K._h_home(K.state(st), g, pid)


def _policy(num_blocks, history_factor, groups=3):
    p = make_policy("prefixshield", num_blocks, history_factor=history_factor)
    p.bind_tenants([f"g{i}" for i in range(groups)], list(DEFAULT_CONTRACTS.values()))
    return p


def _lru_set(capacity, gs, pids):
    seen, out = OrderedDict(), []
    for g, pid in zip(gs.tolist(), pids.tolist()):
        key = (g, pid)
        out.append(key not in seen)
        if key in seen:
            seen.move_to_end(key)
        else:
            if len(seen) == capacity:
                seen.popitem(last=False)
            seen[key] = None
    return out, seen


def _check_table(p, want_keys):
    a = p._packed.arrays
    hbits = int(p._ctl[K.C_HBITS])
    mask = (1 << hbits) - 1
    dmax = (1 << max(31 - hbits, 0)) - 1
    htab = a["htab"]
    slots = np.nonzero(htab)[0]
    entries = (htab[slots] & mask) - 1
    assert sorted(entries.tolist()) == sorted(set(entries.tolist()))  # each entry once
    got = {(int(a["hkey_g"][e]), int(a["hkey_p"][e])) for e in entries}
    assert got == set(want_keys)
    for i, e in zip(slots.tolist(), entries.tolist()):
        home = _home(p._state, a["hkey_g"][e], a["hkey_p"][e])
        d = (i - home) & mask
        assert int(htab[i]) >> hbits == min(d, dmax)
        for j in range(d):  # no empty slot between the home and the entry
            assert htab[(home + j) & mask] != 0


def test_history_admissions_equal_an_lru_set_under_heavy_eviction():
    rng = np.random.default_rng(7)
    p = _policy(64, 1.0)  # 64 entries, 128 slots
    n = 20000
    gs = rng.integers(0, 3, n).astype(np.int64)
    pids = rng.zipf(1.3, n).astype(np.int64) % 400
    pids[rng.random(n) < 0.3] += 10**12  # one-touch keys: chains shift on every eviction
    out = np.zeros(n, dtype=np.bool_)
    _admit_all(p._state, gs, pids, out)
    want, seen = _lru_set(p.history_capacity, gs, pids)
    assert out.tolist() == want
    _check_table(p, seen.keys())


def test_history_table_with_colliding_homes_keeps_every_key_findable():
    """Keys with the same home slot (found by search): long chains, entries moving back."""
    p = _policy(32, 0.5)  # 16 entries, 32 slots
    hbits = int(p._ctl[K.C_HBITS])
    by_home: dict = {}
    pid = 0
    while max((len(v) for v in by_home.values()), default=0) < 12:
        by_home.setdefault(_home(p._state, 1, pid), []).append(pid)
        pid += 1
    crowd = max(by_home.values(), key=len)
    rng = np.random.default_rng(3)
    pids = np.array(crowd + rng.integers(0, 1 << hbits, 200).tolist() + crowd[::-1],
                    dtype=np.int64)
    gs = np.ones(pids.shape[0], dtype=np.int64)
    out = np.zeros(pids.shape[0], dtype=np.bool_)
    _admit_all(p._state, gs, pids, out)
    want, seen = _lru_set(p.history_capacity, gs, pids)
    assert out.tolist() == want
    _check_table(p, seen.keys())
