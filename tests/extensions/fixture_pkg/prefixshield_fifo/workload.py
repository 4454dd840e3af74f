"""``short_one_touch``: prefixshield's ``one_touch`` over 10 seconds instead of 60."""

from __future__ import annotations

from dataclasses import dataclass

from prefixshield.workloads.one_touch import OneTouchParams, one_touch
from prefixshield.workloads.registry import register


@dataclass(frozen=True)
class ShortOneTouchParams(OneTouchParams):
    """``one_touch``'s parameters; ``duration_s`` 10 by default."""

    duration_s: float = 10.0


@register("short_one_touch", ShortOneTouchParams)
def short_one_touch(params: ShortOneTouchParams | None = None):
    """One-touch flooding, short: see :func:`prefixshield.workloads.one_touch.one_touch`."""
    return one_touch(params or ShortOneTouchParams())
