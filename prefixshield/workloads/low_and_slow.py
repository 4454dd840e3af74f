"""``low_and_slow``: unseen prefixes spread evenly over time, creation just above refill."""

from __future__ import annotations

from dataclasses import dataclass

from prefixshield.traces.schema import Trace
from prefixshield.workloads.attack import AttackParams, fresh_prefix_attack
from prefixshield.workloads.registry import register


@dataclass(frozen=True)
class LowAndSlowParams(AttackParams):
    """``low_and_slow``: the attacker rotates through unseen prefixes at a rate spread evenly
    over the run, its creation just above its refill (reference: "creation just above its
    refill", accumulating pressure without bursts).

    Attributes:
        pressure_ratio: attacker creation rate (prompt and decode blocks) / its contract's
            refill; default 1.25, "just above" refill: the attacker's debt grows by a quarter of
            its refill per second once its burst allowance is spent.
        duration_s: 120 s by default: slow pressure needs time to accumulate (at 1.25 the
            best-effort burst of 128 blocks is spent after 32 s).
    """

    duration_s: float = 120.0
    pressure_ratio: float | None = 1.25


@register("low_and_slow", LowAndSlowParams)
def low_and_slow(params: LowAndSlowParams | None = None) -> Trace:
    """Low-and-slow: never-seen prefixes at ``pressure_ratio * rho / blocks per request``
    requests/s, evenly spaced through the pressure window; victim as in ``one_touch``."""
    return fresh_prefix_attack("low_and_slow", params or LowAndSlowParams())
