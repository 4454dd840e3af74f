"""PrefixShield under random operation sequences (hypothesis).

* Differential: the numba policy and the pure-Python reference make identical decisions
  (victims in order, free order, classes, debts, counters) for every ablation flag combination.
* Properties: I1 (complete attribution, hits free, across contract switches), I2 (no promotion
  while the group owes), work conservation (no cached block reclaimed while a truly free one is
  left), the Proposition (the gate reopens after ``max_c(−B̂)/rho_c`` seconds).

The driver below plays the block pool: it only issues legal sequences (selected blocks are in
use; only in-use blocks are materialized and released; hits touch cached blocks and take the free
ones among them back into use, as ``BlockPool.touch`` does).
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

from prefixshield.policies import make_policy
from prefixshield.policies.reference.prefixshield import ReferencePrefixShield
from prefixshield.tenancy import Contract

ADVANCE, ALLOC, HIT, RELEASE, FOREIGN, REQUEST = range(6)


class PoolModel:
    """What the pool knows: blocks in use, blocks carrying a hash, the clock (s)."""

    def __init__(self, num_blocks: int) -> None:
        self.in_use: set[int] = set()
        self.hashed: set[int] = set()
        self.free: set[int] = set(range(1, num_blocks))
        self.t = 0.0


@st.composite
def scenarios(draw):
    """A tenant/contract setup, flags and a list of raw operations interpreted against state."""
    G = draw(st.integers(1, 5))
    C = draw(st.integers(1, 3))
    contracts = [Contract(f"c{i}", draw(st.sampled_from([0.25, 0.5, 1.0, 2.0, 3.0, 8.0])),
                          draw(st.sampled_from([0.0, 1.0, 2.0, 4.0, 8.0]))) for i in range(C)]
    num_blocks = draw(st.integers(3, 32))
    flags = dict(segmentation=draw(st.booleans()), debt_gate=draw(st.booleans()),
                 responsibility=draw(st.booleans()),
                 history_factor=draw(st.sampled_from([0.05, 0.3, 4.0])),
                 admission=draw(st.sampled_from(["request", "call"])),
                 charge_decode=draw(st.booleans()),
                 prefix_source=draw(st.sampled_from(["root", "declared", "tenant"])))
    compat = draw(st.sampled_from(["current", "0.10"]))
    op = st.tuples(st.sampled_from([ADVANCE, ALLOC, HIT, RELEASE, FOREIGN] + [REQUEST] * 5),
                   st.integers(0, 2**31), st.integers(0, 2**31),
                   st.sampled_from([0.0, 0.125, 0.25, 0.5, 1.0, 2.5, 0.3, 1.7]))
    ops = draw(st.lists(op, min_size=5, max_size=80))
    return G, contracts, num_blocks, flags, compat, ops


def _pick_subset(items: list[int], bits: int, max_len: int) -> list[int]:
    chosen = [b for i, b in enumerate(items) if (bits >> (i % 31)) & 1]
    return chosen[:max_len]


def run_ops(policies, G, contracts, num_blocks, ops, on_event=None):
    """Apply ``ops`` to every policy in ``policies`` (already bound) as the pool would.

    ``on_event(kind, info)`` is called around each event for property checks; ``info`` holds the
    event's arguments and results (``victims`` per policy for selections)."""
    m = PoolModel(num_blocks)
    C = len(contracts)
    for kind, a, b, x in ops:
        if kind == ADVANCE:
            m.t += x
            continue
        if kind == REQUEST:
            # one request as the pool runs it: hit its group's cached prefix blocks, take new
            # blocks, materialize them all, then release everything tail first
            g, c, pid = a % G, (a // 7) % C, (a // 101) % 3
            own = [i for i in sorted(m.hashed & m.free) if policies[0].owner[i] == g
                   and policies[0].prefix[i] == pid]  # (free ones: the model keeps no ref counts)
            hits = np.asarray(own[:b % 4], dtype=np.int32)
            need = 1 + (b // 4) % 6
            if need + int(np.isin(hits, list(m.free)).sum()) > len(m.free):
                continue
            if hits.size:
                if on_event:
                    on_event("before_hit", dict(g=g, c=c, pid=pid, t=m.t, blocks=hits))
                for p in policies:
                    p.on_hit(hits, g, c, pid, m.t)
                back = np.asarray([i for i in hits.tolist() if i in m.free], dtype=np.int32)
                for p in policies:
                    p.on_acquire(back)
                m.free -= set(back.tolist())
                if on_event:
                    on_event("hit", dict(g=g, c=c, pid=pid, t=m.t, blocks=hits))
            if on_event:
                on_event("before_select", dict(n=need, g=g, t=m.t))
            victims = [p.select_victims(need, m.t, g) for p in policies]
            if on_event:
                on_event("select", dict(n=need, g=g, t=m.t, victims=victims))
            v = victims[0]
            m.free -= set(v.tolist())
            m.hashed -= set(v.tolist())
            if on_event:
                on_event("before_materialize", dict(g=g, c=c, t=m.t, n=need))
            for p in policies:
                p.on_materialize(v.copy(), np.arange(need, dtype=np.uint64), g, c, pid, m.t)
            m.hashed |= set(v.tolist())
            if on_event:
                on_event("materialize", dict(g=g, c=c, t=m.t, n=need, blocks=v))
            order = np.concatenate([hits, v])[::-1].copy()
            mask = np.asarray([int(i) in m.hashed for i in order], dtype=np.bool_)
            for p in policies:
                p.on_release(order, mask, m.t)
            m.free |= set(order.tolist())
            if on_event:
                on_event("release", dict(t=m.t))
            continue
        if kind == ALLOC:
            if not m.free:
                continue
            g, c, pid = a % G, (a // 7) % C, (a // 101) % 5
            n = 1 + b % min(6, len(m.free))
            k = (b // 6) % (n + 1)               # how many of them get materialized
            if on_event:
                on_event("before_select", dict(n=n, g=g, t=m.t))
            victims = [p.select_victims(n, m.t, g) for p in policies]
            if on_event:
                on_event("select", dict(n=n, g=g, t=m.t, victims=victims))
            v = [int(i) for i in victims[0]]
            m.free -= set(v)
            m.hashed -= set(v)
            m.in_use |= set(v)
            if k:
                blocks = victims[0][:k].copy()
                hashes = np.arange(k, dtype=np.uint64)
                # a few requests materialize over several calls (chunks, decode blocks);
                # roots include keys past 2**63 (negative as int64 bits) and none at all
                rid = (a // 1013) % 3 - 1
                root = (None, 5, 2**63 + 3, 2**64 - 1)[(a // 7919) % 4]
                num_decode = (b // 37) % (k + 1)
                if on_event:
                    on_event("before_materialize", dict(g=g, c=c, t=m.t, n=k))
                for p in policies:
                    p.on_materialize(blocks, hashes, g, c, pid, m.t, request_id=rid, root=root,
                                     num_decode=num_decode)
                m.hashed |= set(v[:k])
                if on_event:
                    on_event("materialize", dict(g=g, c=c, t=m.t, n=k, blocks=blocks,
                                                 num_decode=num_decode))
        elif kind == HIT:
            cached = sorted(m.hashed)
            if not cached:
                continue
            blocks = np.asarray(_pick_subset(cached, a, 8) or cached[:1], dtype=np.int32)
            if b % 3:  # usually the identity of one of the hit blocks' requests (eligible)
                meta = _identity(policies[0], int(blocks[b % len(blocks)]))
                g, c, pid = meta if meta is not None else (a % G, b % C, b % 5)
            else:
                g, c, pid = a % G, (b // 3) % C, (b // 9) % 5
            acquire = (b // 17) % 8 != 0  # rarely a bare hit (legal, never done by the pool)
            if on_event:
                on_event("before_hit", dict(g=g, c=c, pid=pid, t=m.t, blocks=blocks))
            for p in policies:
                p.on_hit(blocks, g, c, pid, m.t)
            if acquire:
                back = np.asarray([i for i in blocks.tolist() if i in m.free], dtype=np.int32)
                for p in policies:
                    p.on_acquire(back)
                m.free -= set(back.tolist())
                m.in_use |= set(back.tolist())
            if on_event:
                on_event("hit", dict(g=g, c=c, pid=pid, t=m.t, blocks=blocks))
        elif kind == RELEASE:
            used = sorted(m.in_use)
            if not used:
                continue
            chosen = _pick_subset(used, a, 10) or used[:1]
            rng = np.random.default_rng(b)
            order = np.asarray(chosen, dtype=np.int32)[rng.permutation(len(chosen))]
            mask = np.asarray([int(i) in m.hashed for i in order], dtype=np.bool_)
            for p in policies:
                p.on_release(order, mask, m.t)
                if (a // 31) % 4 == 0:  # a request ends: its next call is a new admission
                    p.on_request_finished((a // 131) % 2)
            m.in_use -= set(chosen)
            m.free |= set(chosen)
            if on_event:
                on_event("release", dict(t=m.t))
        elif kind == FOREIGN:
            # the pool hashes an in-use block without telling the policy (unknown owner)
            cand = sorted(m.in_use - m.hashed)
            if cand:
                m.hashed.add(cand[a % len(cand)])
    return m


def _identity(policy, block):
    """(owner, contract, prefix_id) of a cached block, from the numba policy's labels."""
    if not policy.cached[block] or policy.owner[block] < 0:
        return None
    return int(policy.owner[block]), int(policy.contract[block]), int(policy.prefix[block])


def _pair(G, contracts, num_blocks, flags, compat):
    fast = make_policy("prefixshield", num_blocks, vllm_compat=compat, **flags)
    ref = ReferencePrefixShield(num_blocks, vllm_compat=compat, **flags)
    names = [f"g{i}" for i in range(G)]
    fast.bind_tenants(names, contracts)
    ref.bind_tenants(names, contracts)
    return fast, ref


# --------------------------------------------------------------------------------- differential
def assert_same_state(fast, ref, t):
    assert fast.num_free() == ref.num_free()
    assert np.array_equal(fast.free_order(), ref.free_order()), "free order"
    for b in range(1, fast.num_blocks):
        want = ref.block_class(b)
        assert bool(fast.cached[b]) == (want is not None), f"cached flag of block {b}"
        if want is not None:
            assert int(fast.klass[b]) == want, f"class of block {b}"
            assert int(fast.owner[b]) == ref.meta[b]["owner"], f"owner of block {b}"
            assert int(fast.hits[b]) == ref.meta[b]["hits"], f"hits of block {b}"
    for g in range(len(fast.groups)):
        assert fast.debt(g, t) == ref.debt(g, t), f"debt of group {g}"
        assert fast.normalized_debt(g, t) == ref.normalized_debt(g, t)
        for c in range(len(fast.contracts)):
            assert fast.effective_balance(g, c, t) == ref.effective_balance(g, c, t)
    assert fast.granted.tolist() == ref.granted
    assert fast.gated.tolist() == ref.gated
    assert fast.evictions.tolist() == ref.evictions
    assert fast.charged.tolist() == ref.charged
    assert fast.uncharged.tolist() == ref.uncharged


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_numba_policy_matches_reference_decision_for_decision(scn):
    G, contracts, num_blocks, flags, compat, ops = scn
    fast, ref = _pair(G, contracts, num_blocks, flags, compat)

    def check(kind, info):
        if kind == "select":
            v_fast, v_ref = info["victims"]
            assert v_fast.tolist() == v_ref.tolist(), "victims"
        if kind in ("select", "hit", "release", "materialize"):
            assert_same_state(fast, ref, info["t"])
            fast.check_invariants()

    m = run_ops([fast, ref], G, contracts, num_blocks, ops, check)
    assert_same_state(fast, ref, m.t + 0.5)
    fast.check_invariants()


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31), st.sampled_from([(8, 64), (32, 256), (97, 400)]),
       st.sampled_from([{}, dict(segmentation=False), dict(responsibility=False)]))
def test_reference_agrees_with_many_groups(seed, shape, flags):
    """Long random runs over 8 / 32 / 97 groups: the same victims in the same order (97: a max
    tree of debt bounds seven levels deep, not a power of two)."""
    G, N = shape
    rng = np.random.default_rng(seed)
    # the default tiers scaled down 16x so that debt builds up within a few hundred requests
    contracts = [Contract("critical", 4.0, 16.0), Contract("standard", 2.5, 12.0),
                 Contract("best_effort", 1.0, 8.0)]
    ops = [(int(rng.choice([ADVANCE, REQUEST, REQUEST, REQUEST, ALLOC, HIT, RELEASE])),
            int(rng.integers(2**31)), int(rng.integers(2**31)), float(rng.choice([0.01, 0.05])))
           for _ in range(400)]
    fast, ref = _pair(G, contracts, N, flags, "current")

    def check(kind, info):
        if kind == "select":
            assert info["victims"][0].tolist() == info["victims"][1].tolist()

    m = run_ops([fast, ref], G, contracts, N, ops, check)
    assert_same_state(fast, ref, m.t)
    fast.check_invariants()


# --------------------------------------------------------------------------------- properties
@settings(max_examples=200, deadline=None)
@given(scenarios())
def test_i1_every_new_block_is_charged_once_and_hits_charge_nothing(scn):
    G, contracts, num_blocks, flags, compat, ops = scn
    fast, _ = _pair(G, contracts, num_blocks, flags, compat)
    C = len(contracts)
    expected = np.zeros((G, C), dtype=np.int64)
    before = {}

    def check(kind, info):
        t = info.get("t", 0.0)
        balances = [[fast.effective_balance(g, c, t) for c in range(C)] for g in range(G)]
        if kind == "before_materialize":
            return
        if kind == "materialize":
            # decode blocks are charged unless the policy leaves them out (charge_decode)
            expected[info["g"], info["c"]] += info["n"] - (
                0 if fast.charge_decode else info.get("num_decode", 0))
        elif kind == "before_hit":
            before["hit"] = balances
        elif kind == "hit":
            assert balances == before["hit"], "a hit changed a bucket"
        assert np.array_equal(fast.charged, expected), "charged != materialized per (g, c)"
        # (decode blocks left uncharged are materialized all the same)
        assert np.array_equal(fast.materialized, expected.sum(axis=1) + fast.uncharged)

    run_ops([fast], G, contracts, num_blocks, ops, check)
    fast.check_invariants()


@settings(max_examples=200, deadline=None)
@given(scenarios())
def test_i2_no_block_is_promoted_while_its_group_owes(scn):
    G, contracts, num_blocks, flags, compat, ops = scn
    flags = dict(flags, debt_gate=True, segmentation=True)
    fast, _ = _pair(G, contracts, num_blocks, flags, compat)
    seen = {}

    def check(kind, info):
        if kind == "before_hit":
            seen["debt"] = fast.debt(info["g"], info["t"])
            seen["cls"] = fast.klass.copy()
            seen["granted"] = fast.granted.copy()
        elif kind == "hit":
            promoted = np.flatnonzero((fast.klass == 2) & (seen["cls"] != 2) & fast.cached)
            if seen["debt"] > fast.epsilon:
                assert promoted.size == 0, f"promoted {promoted} at debt {seen['debt']}"
                assert np.array_equal(fast.granted, seen["granted"])
            # ownership never migrates on a hit
            assert np.all(fast.owner[promoted] == info["g"])

    run_ops([fast], G, contracts, num_blocks, ops, check)
    fast.check_invariants()


@settings(max_examples=200, deadline=None)
@given(scenarios())
def test_work_conservation_no_cached_block_reclaimed_while_truly_free_left(scn):
    G, contracts, num_blocks, flags, compat, ops = scn
    fast, _ = _pair(G, contracts, num_blocks, flags, compat)
    seen = {}

    def check(kind, info):
        if kind == "before_select":
            seen["tf"] = fast.num_truly_free()
            seen["cached"] = fast.cached.copy()
            seen["evicted"] = int(fast.evictions.sum())
        elif kind == "select":
            v = info["victims"][0]
            n_tf = min(info["n"], seen["tf"])
            assert not seen["cached"][v[:n_tf]].any(), "a cached block went before a truly free one"
            assert seen["cached"][v[n_tf:]].all(), "a reclaimed block was not a cached candidate"
            assert int(fast.evictions.sum()) - seen["evicted"] == max(0, info["n"] - seen["tf"])

    run_ops([fast], G, contracts, num_blocks, ops, check)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(1, 40), st.sampled_from([0.0, 0.3, 1.0])),
                min_size=1, max_size=12))
def test_gate_reopens_after_clearance_time_for_any_charge_history(charges):
    """Proposition: after ``max_c(−B̂_{g,c}(t))/rho_c`` seconds of quiescence, ``D_g ≤ ε``."""
    contracts = [Contract("a", 4.0, 2.0), Contract("b", 8.0, 0.0), Contract("c", 0.5, 16.0)]
    p = make_policy("prefixshield", 41)
    p.bind_tenants(["g"], contracts)
    t = 0.0
    for c, n, dt in charges:
        t += dt
        blocks = p.select_victims(n, t, 0)
        p.on_materialize(blocks, np.zeros(n, dtype=np.uint64), 0, c, 0, t)
        p.on_release(blocks[::-1].copy(), np.ones(n, dtype=np.bool_), t)
    T = p.clearance_time_s(0, t)
    assert p.debt(0, t + T) <= p.epsilon
    if T > 0.01:  # the remaining debt rho_c*T*1e-6 is then > epsilon
        assert p.debt(0, t + T * (1 - 1e-6)) > p.epsilon
