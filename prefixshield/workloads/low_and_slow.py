"""``low_and_slow``: unseen prefixes spread evenly over time, creation just above refill."""

from __future__ import annotations

from dataclasses import dataclass

from prefixshield.traces.schema import Trace
from prefixshield.workloads.attack import AttackParams, fresh_prefix_attack, population_defaults
from prefixshield.workloads.registry import register


@dataclass(frozen=True)
class LowAndSlowParams(AttackParams):
    """``low_and_slow``: the attacker rotates through unseen prefixes at a rate spread evenly
    over the run, without bursts (reference: "creation just above its refill", accumulating
    pressure without bursts).

    Attributes:
        pressure_ratio: attacker creation rate (prompt and decode blocks) / its contract's
            refill (None: the population's). ``background``: 1.25, "just above its refill" as
            the reference describes the attacker; the victim's share of the base load is what
            was fitted to the reference's LRU victim hit ratio under this attack, 92.64%
            (92.66% here over 10 seeds). ``two_group``: 7.5, fitted to the same 92.64% when
            the victim sent the whole base load (a creation just above refill then cost LRU
            nothing; docs/fidelity.md).
        duration_s: the measured phase and attack window (None: the population's; 42 s under
            both). 42 s was fitted to the reference's creation-pressure sweep when it ran on
            low_and_slow (two-group reading); that sweep now runs on one_touch
            (`PRESSURE_SWEEP_DURATION_S`), and this
            window is kept, not refitted.
    """

    POPULATION_DEFAULTS = population_defaults(
        AttackParams.POPULATION_DEFAULTS,
        background={"duration_s": 42.0, "pressure_ratio": 1.25},
        two_group={"duration_s": 42.0, "pressure_ratio": 7.5})

    duration_s: float | None = None
    pressure_ratio: float | None = None


@register("low_and_slow", LowAndSlowParams)
def low_and_slow(params: LowAndSlowParams | None = None) -> Trace:
    """Low-and-slow: never-seen prefixes at ``pressure_ratio * rho / blocks per request``
    requests/s, evenly spaced through the pressure window; victim as in ``one_touch``."""
    return fresh_prefix_attack("low_and_slow", params or LowAndSlowParams())
