"""``prefixshield bench``: every speed figure of the project, each against its anchor, one run.

Sections (one module each, in the order they run):

* `engine`: simulated requests/s, batched vs step-by-step engine;
* `schedulers`: simulated requests/s of each scheduler vs FCFS (fused);
* `startup`: CPU seconds of a whole ``prefixshield run`` process vs the
  import floor;
* `keystream`: key-stream replay vs libCacheSim's C path;
* `selector`: victim-selection latency vs LRU's call;
* `state`: policy-state bytes per block vs LRU;
* `pool`: the simulator's block pool vs vLLM's ``KVCacheManager``;
* `plugin`: the vLLM plugin vs native vLLM per operation;
* `scale`: engine time per request and pool memory per block, by size;
* `traces`: building a generated trace vs simulating it under LRU, and
  the peak RSS of a long (8 x 10^6-request) run;
* `fleet`: split and lockstep fleet runs (10^6 requests, 16 replicas)
  vs one engine on the same trace, time per request and peak RSS.

Each section exposes ``steps(quick) -> int`` (progress steps it announces) and
``run(quick, tick) -> SectionResult``. Absolute times are printed and written, never asserted.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import sys
from importlib import import_module
from typing import Any, Callable, Sequence

from prefixshield.bench.common import SectionResult

SECTION_NAMES = ("engine", "schedulers", "startup", "keystream", "selector", "state", "pool",
                 "plugin", "scale", "traces", "fleet")
"""Every section, in run order (module names under `prefixshield.bench`)."""


def section_module(name: str):
    """The module of section ``name``; ``ValueError`` naming the known ones otherwise."""
    if name not in SECTION_NAMES:
        raise ValueError(f"unknown bench section {name!r}; known: {', '.join(SECTION_NAMES)}")
    return import_module(f"prefixshield.bench.{name}")


def machine() -> dict[str, Any]:
    """What the numbers were measured on (written with them)."""
    from prefixshield import __version__

    try:
        load = os.getloadavg()[0]
    except OSError:
        load = None
    return {"prefixshield_version": __version__, "python": sys.version.split()[0],
            "platform": platform.platform(), "cpu_count": os.cpu_count(),
            "load_average_1min_at_start": load,
            "started_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}


def run_sections(names: Sequence[str], quick: bool,
                 on_section_start: Callable[[str, int], Callable[[str], None]] | None = None,
                 on_section_done: Callable[[SectionResult], None] | None = None
                 ) -> dict[str, Any]:
    """Run the sections ``names`` in `SECTION_NAMES` order; returns the JSON-able report
    ``{"machine": ..., "quick": bool, "sections": {name: SectionResult.to_json()}}``.

    Args:
        names: sections to run (each in `SECTION_NAMES`).
        quick: the small variant of every section (a smoke run; the plugin section skips).
        on_section_start: called with (name, steps) before a section; returns its tick callback.
        on_section_done: called with each section's result as soon as it is measured.
    """
    modules = [(n, section_module(n)) for n in SECTION_NAMES if n in set(names)]
    for n in names:
        section_module(n)  # unknown names fail before anything runs
    report: dict[str, Any] = {"machine": machine(), "quick": bool(quick), "sections": {}}
    for name, mod in modules:
        tick = on_section_start(name, mod.steps(quick)) if on_section_start else None
        result = mod.run(quick=quick, tick=tick) if tick else mod.run(quick=quick)
        report["sections"][name] = result.to_json()
        if on_section_done:
            on_section_done(result)
    return report
