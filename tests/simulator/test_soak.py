"""Soak, CI size: random pool operations (admissions with reservation, chunked steps, decode,
preemption, aborts, clock jumps; 4 groups, 3 contracts) with every invariant checked after each
one, for every policy and compat mode. ``python -m prefixshield.simulator.soak`` runs 10^6."""

import pytest

from prefixshield.policies import POLICIES
from prefixshield.policies.base import COMPAT_MODES
from prefixshield.simulator.soak import soak


@pytest.mark.parametrize("compat", COMPAT_MODES)
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_random_operations_keep_every_invariant(policy, compat):
    s = soak(policy, compat, 4000, seed=1)
    assert s.ops == 4000
    # the run exercised what it claims to: refusals, preemptions, evictions, a busy pool
    assert s.admissions > 100 and s.refused > 0 and s.preemptions > 0 and s.finishes > 0
    # more blocks in use at once than one group's quarter of the 47 usable (static_quota's cap)
    assert s.evictions > 0 and s.peak_in_use > 47 // 4
