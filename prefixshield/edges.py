"""The typed edge: the declared types and bounds every user-given value is checked against.

Values enter from CLI options (click types declared here), ``--set`` / ``--grid`` / spec fields
and policy parameters (typed from their dataclass or constructor annotations by
`prefixshield.experiments.overrides`, bounded here), importer options and names (experiment
names, group names). Each is checked before any work is done or any file is written:

* integers lie within C's int64 range and, unless a type declares otherwise, within
  `MAX_INT` (every count, length and limit of the simulator fits a C ``int``);
* floats are finite;
* sizes that allocate are estimated before the allocation: requests of a trace
  (`check_requests`: rate x duration), cells of a store (seeds x points x policies,
  `check_cells`), points of a grid (`check_points`);
* names use `NAME_ALPHABET` (they become folder names and figure labels: no ``/``, no
  ``..``, no matplotlib ``$...$``).

A CLI option declares its bound by its click type: `count` and `finite` build them.
``tests/test_cli_fuzz.py`` walks the click group and fails on any integer or float option
whose type has no upper bound, so an option added later is bounded from its first commit.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import click

INT64_MIN = -(2 ** 63)
INT64_MAX = 2 ** 63 - 1
MAX_INT = 2 ** 31 - 1
"""The largest integer an undeclared integer field or option takes (a C ``int``)."""
MAX_REQUESTS = 5_000_000
"""The most requests one generated trace may hold (~1 GiB of rows and per-request records)."""
MAX_CELLS = 200_000
"""The most cells (point x policy x seed) one results store may define (a file each)."""
MAX_POINTS = 10_000
"""The most points a grid may expand to (each point is run on every seed and policy)."""
MAX_SEEDS = 100_000
"""The most paired seeds one comparison, experiment or search may name."""
MAX_TRIALS = 100_000
"""The most trials per policy an attack search may run."""
MAX_WORKERS = 4096
"""The most executor workers (processes or local Ray CPUs)."""
NAME_ALPHABET = "letters, digits, '-', '_', '.' (starting with a letter or digit, <= 64)"
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


DEFAULT_AUTO_FRACTION = 0.25
"""``--blocks auto``'s fraction of the trace's unique blocks: a pool a quarter of what an
infinite cache would hold, so that the replacement policy decides what stays."""


@dataclass(frozen=True)
class AutoBlocks:
    """``--blocks auto[:FRACTION]``: size the pool as ``fraction`` (0 < fraction <= 1) of the
    trace's unique blocks ([`prefixshield.experiments.sizing`][prefixshield.experiments.sizing])."""

    fraction: float = DEFAULT_AUTO_FRACTION

    def __post_init__(self) -> None:
        if not (math.isfinite(self.fraction) and 0 < self.fraction <= 1):
            raise ValueError(f"auto:FRACTION must be in (0, 1], got {self.fraction:g}")


class EdgeError(ValueError):
    """A user-given value is outside its declared type or bound (the message names it)."""


# ------------------------------------------------------------------------------ click types
class _FiniteFloat(click.FloatRange):
    """`click.FloatRange` that also refuses ``nan`` (which compares false with every
    bound, so a plain range lets it through) and infinities."""

    name = "float range"

    def convert(self, value, param, ctx):
        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return rv


def count(lo: int = 1, hi: int = MAX_INT) -> click.IntRange:
    """An integer option in ``[lo, hi]`` (``hi`` at most int64)."""
    return click.IntRange(lo, min(hi, INT64_MAX))


def finite(lo: float | None = None, hi: float = 1e12, min_open: bool = False) -> click.FloatRange:
    """A finite float option in ``[lo, hi]`` (``(lo, hi]`` with ``min_open``)."""
    return _FiniteFloat(lo, hi, min_open=min_open)


SEED = count(0, INT64_MAX)
"""Seeds are non-negative 64-bit integers (numpy's seed sequences and the token hash take them)."""


def unbounded_options(group: click.Command, path: str | None = None) -> list[str]:
    """``command --option`` for every integer or float option (or argument) under ``group``
    whose declared type has no upper bound or lets a non-finite float through."""
    out = []
    name = "" if path is None else f"{path} {group.name}".strip()
    for p in group.params:
        t = p.type
        label = f"{name} {p.opts[0] if p.opts else p.name}".strip()
        if t in (click.INT, click.FLOAT):
            out.append(label)
        elif isinstance(t, click.IntRange) and t.max is None:
            out.append(label)
        elif isinstance(t, click.FloatRange) and not isinstance(t, _FiniteFloat):
            out.append(label)
    if isinstance(group, click.Group):
        for sub in group.commands.values():
            out += unbounded_options(sub, name)
    return out


# ------------------------------------------------------------------------------ fields
def check_int(value: int, where: str, lo: int = INT64_MIN, hi: int = MAX_INT) -> int:
    """``value`` if it is an integer in ``[lo, hi]``, else `EdgeError` naming ``where``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise EdgeError(f"{where}: expected an integer, got {value!r}")
    if not lo <= value <= hi:
        raise EdgeError(f"{where}: must be in [{lo}, {hi}], got {value}")
    return value


def check_float(value: float, where: str) -> float:
    """``value`` if it is a finite number, else `EdgeError` naming ``where``."""
    if not math.isfinite(value):
        raise EdgeError(f"{where}: expected a finite number, got {value!r}")
    return value


def check_name(text: Any, where: str) -> str:
    """``text`` if it is a safe name (see `NAME_ALPHABET`), else `EdgeError`."""
    if not isinstance(text, str) or not _NAME_RE.fullmatch(text):
        raise EdgeError(f"{where} {text!r}: use {NAME_ALPHABET}")
    return text


def safe_label(text: str) -> str:
    """``text`` as matplotlib draws it literally: a ``$`` would start math mode (an unmatched
    one aborts the figure), so it is escaped. For names from files (trace group names)."""
    return str(text).replace("$", r"\$")


# ------------------------------------------------------------------------------ sizes
def check_requests(rate: float, span_s: float, what: str) -> None:
    """Refuse ``rate`` requests/s over ``span_s`` seconds when it asks for more than
    `MAX_REQUESTS` requests (checked before the arrival times are drawn)."""
    n = rate * span_s
    if not n <= MAX_REQUESTS:  # also catches nan
        raise EdgeError(f"{what}: {rate:.3g} requests/s over {span_s:.3g} s is ~{n:.3g} "
                        f"requests, more than the {MAX_REQUESTS:,} a trace may hold; shorten "
                        "duration_s or lower the rate")


def check_count(n: int, limit: int, what: str) -> None:
    """Refuse a size ``n`` above ``limit`` before it is allocated (``what`` names it)."""
    if n > limit:
        raise EdgeError(f"{what}: {n:,} is more than the {limit:,} allowed")


def check_cells(n: int, what: str) -> None:
    """Refuse a store of more than `MAX_CELLS` cells."""
    if n > MAX_CELLS:
        raise EdgeError(f"{what}: {n:,} cells (points x policies x seeds) is more than the "
                        f"{MAX_CELLS:,} one results store may hold; fewer seeds or points")


def check_points(sizes: list[int], what: str) -> None:
    """Refuse a grid whose axes (``sizes`` values each) expand to more than
    `MAX_POINTS` points, before the points are built."""
    n = math.prod(sizes)
    if n > MAX_POINTS:
        raise EdgeError(f"{what}: the grid has {n:,} points, more than the {MAX_POINTS:,} "
                        "allowed")
