"""The per-group debt bound that lets a one-victim selection skip scoring most debtors holds at
every clock, including clocks behind the latest one (a clock that steps back)."""

from hypothesis import given, settings

from policies.test_prefixshield_random import _pair, run_ops, scenarios


@settings(max_examples=200, deadline=None)
@given(scenarios())
def test_debt_bound_is_at_least_the_normalized_debt_at_any_clock(scn):
    G, contracts, num_blocks, flags, compat, ops = scn
    fast, _ = _pair(G, contracts, num_blocks, flags, compat)

    def check(kind, info):
        t = info.get("t", 0.0)
        for clock in (0.0, 0.5 * t, t, t + 0.25, t + 100.0):
            for g in range(G):
                debt, _w = fast.normalized_debt(g, clock)
                assert fast._ub[g] >= debt, (g, clock, float(fast._ub[g]), debt)

    run_ops([fast], G, contracts, num_blocks, ops, check)
    fast.check_invariants()

