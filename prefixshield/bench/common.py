"""What every benchmark section shares: its result type, timing helpers, the progress callback.

A section measures something *and its anchor in the same run* (the reference it is a ratio
against: the step-by-step engine, libCacheSim's C path, vLLM's own pool, ...), because the
machines these run on are shared and noisy: absolute times are printed and written, never
asserted; the ratio is what to compare across runs and machines.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

Tick = Callable[[str], None]
"""Progress callback: called with a short description once per step a section announced."""


def no_progress(_description: str) -> None:
    """A `Tick` that shows nothing."""


@dataclass
class Column:
    """One column of a section's table.

    Attributes:
        key: the row dict key.
        header: the table header.
        fmt: ``format`` spec for numbers (``","``, ``".2f"``...); strings print as they are.
        suffix: appended after a formatted number (``"x"`` for ratios).
    """

    key: str
    header: str
    fmt: str = ""
    suffix: str = ""

    def render(self, value: Any) -> str:
        """The cell text of ``value`` (``-`` for None)."""
        if value is None:
            return "-"
        if isinstance(value, bool):
            return "yes" if value else "no"
        if isinstance(value, (int, float)):
            return format(value, self.fmt) + self.suffix
        return str(value)


@dataclass
class SectionResult:
    """The outcome of one benchmark section.

    Attributes:
        name: short machine name (the ``--json`` key, ``--section`` value).
        title: the table title.
        columns: the table columns, in order.
        rows: one dict per table row; values are str, bool, int or finite float (or None for
            "not measured"), every number also written to ``--json``.
        notes: lines printed under the table (what each ratio is measured against, targets).
        skipped: why the section did not run (then ``rows`` is empty), or None.
        extra: further machine-readable numbers (written to ``--json`` only).
    """

    name: str
    title: str
    columns: list[Column] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    skipped: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """JSON-able dict of everything measured (raises ``ValueError`` on a non-finite
        number, naming the row and key: a benchmark never writes NaN or inf)."""
        for i, row in enumerate(self.rows):
            for k, v in row.items():
                if isinstance(v, float) and not math.isfinite(v):
                    raise ValueError(f"bench section {self.name!r}: row {i} has {k} = {v}")
        return {"title": self.title, "rows": self.rows, "notes": self.notes,
                "skipped": self.skipped, "extra": self.extra}


def vllm_skip_reason(quick: bool, section: str) -> str | None:
    """Why a section that drives vLLM does not run (under ``--quick``, or without vLLM), or
    None when it runs."""
    import importlib.util

    if quick:
        return ("skipped under --quick (importing vLLM takes several CPU-seconds here); "
                f"run `prefixshield bench --section {section}`")
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed (make install-vllm)"
    return None


def wall(fn: Callable[[], Any]) -> tuple[Any, float]:
    """``(fn(), wall seconds)`` with ``time.perf_counter``."""
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def best_of_interleaved(fns: dict[str, Callable[[], Any]], repeats: int,
                        outputs: dict[str, Any] | None = None) -> dict[str, float]:
    """Least wall seconds of each of ``fns`` over ``repeats`` rounds, the functions interleaved
    within each round (so a burst of load on a shared machine hits all of them alike).

    ``outputs``, when given, receives each function's return value of the first round; a later
    round that returns another value raises ``AssertionError`` (timed work must be
    deterministic, or the rounds did not time the same thing)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    best = {k: math.inf for k in fns}
    for round_no in range(repeats):
        for k, fn in fns.items():
            out, dt = wall(fn)
            best[k] = min(best[k], dt)
            if outputs is None:
                continue
            if round_no == 0:
                outputs[k] = out
            elif out != outputs[k]:
                raise AssertionError(f"{k}: round {round_no + 1} returned {out!r}, round 1 "
                                     f"{outputs[k]!r}")
    return best


def ratio(num: float, den: float) -> float:
    """``num / den``; raises ``ValueError`` when ``den`` is not positive (a timing of 0 s means
    the clock is too coarse for the work measured)."""
    if not den > 0:
        raise ValueError(f"cannot form a ratio over {den!r} (timed work too short for the clock)")
    return num / den


def child_json(code: str, timeout_s: float) -> dict:
    """Run ``python -c code`` in a fresh process (its own peak RSS) and parse the JSON object
    its last line of output prints; ``{"error": why}`` when it failed or ran past
    ``timeout_s`` seconds (the row then says why, nothing is extrapolated)."""
    import json
    import subprocess
    import sys

    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"abandoned past {timeout_s:g} s (not extrapolated)"}
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"failed (exit {out.returncode}): {last}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def peak_rss() -> int:
    """This process's peak resident set size so far, bytes: ``VmHWM`` of
    ``/proc/self/status`` where there is one (Linux), else ``ru_maxrss``. On Linux
    ``ru_maxrss`` survives ``exec``: a child started by a process holding 1.3 GiB reads 1.3
    GiB before it allocates anything, where ``VmHWM`` belongs to the new program's memory."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource
    import sys

    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(kib) * (1 if sys.platform == "darwin" else 1024)
