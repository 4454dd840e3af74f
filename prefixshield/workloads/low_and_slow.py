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
            refill. 7.5 is fitted (the reference does not state the rate) to the reference's
            LRU victim hit ratio under this attack, 92.64% (90.65% here over 10 seeds). In the
            simulator a creation just above refill costs LRU nothing (99.2% at 1.25 to 4), so
            the observed loss needs a creation well above refill (docs/fidelity.md).
        duration_s: the measured phase and attack window. 42 s is fitted (the reference does
            not state it) to its creation-pressure sweep: the attacker's mean debt of 260.90
            and 901.91 blocks at measured pressures 2.14 and 4.23 is the debt a window of about
            40 s accumulates (261.3 and 929.6 here at pressures 2 and 4).
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
