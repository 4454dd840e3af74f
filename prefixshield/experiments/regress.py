"""``regress``: rerun a baseline store's spec with the code of now and say what moved.

Per (experiment, point, policy) and metric, the rerun's cells are paired with the baseline's by
seed (the same trace when trace generation did not change) and the paired difference now -
baseline is taken. A metric has *moved* when

* an explicit tolerance is given for it (``--tol hit_ratio=0.005``): ``|mean difference| > tol``;
* otherwise: its 95% paired bootstrap CI excludes 0 (any systematic change; with unchanged code
  every difference is exactly 0 and nothing moves).

A cell that was ``ok`` and now fails (or the reverse) has moved too. Measured (non-simulated)
columns — wall times, the overhead experiment's latencies — are never compared.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

REGRESS_METRICS = ("hit_ratio", "token_hit_ratio", "p50_ttft_s", "p95_ttft_s", "mean_e2e_s",
                   "evictions", "preemptions", "attacker_pressure_ratio",
                   "attacker_mean_debt_blocks")
"""Simulated metrics compared by default (``overhead`` cells: ``state_bytes_per_block``)."""
OVERHEAD_METRICS = ("state_bytes_per_block", "hash_entries")


@dataclass
class RegressResult:
    """``table``: one row per compared (experiment, point, policy, metric) with baseline and
    current means, the paired difference and CI, the rule used and ``moved``; ``moved``: its
    moved rows."""

    table: pd.DataFrame

    @property
    def moved(self) -> pd.DataFrame:
        return self.table[self.table["moved"]]

    @property
    def ok(self) -> bool:
        return self.moved.empty


def parse_tolerances(items: tuple[str, ...]) -> dict[str, float]:
    """``["hit_ratio=0.005", ...]`` -> ``{metric: tolerance}`` (finite, >= 0)."""
    out = {}
    for item in items:
        key, sep, val = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"--tol {item!r}: expected METRIC=TOLERANCE")
        if key not in REGRESS_METRICS + OVERHEAD_METRICS:
            raise ValueError(f"--tol {key}: not a compared metric; known: "
                             f"{', '.join(REGRESS_METRICS + OVERHEAD_METRICS)}")
        try:
            tol = float(val)
        except ValueError:
            raise ValueError(f"--tol {key}: expected a number, got {val!r}") from None
        if not (math.isfinite(tol) and tol >= 0):
            raise ValueError(f"--tol {key}: must be a finite number >= 0, got {val!r}")
        out[key] = tol
    return out


def compare_stores(baseline: pd.DataFrame, current: pd.DataFrame, experiments,
                   tolerances: dict[str, float] | None = None) -> RegressResult:
    """Compare two stores' cells of the same spec (see the module docstring)."""
    from prefixshield.simulator.metrics import paired_difference

    tolerances = tolerances or {}
    rows = []
    key = ["experiment", "point", "policy"]
    for exp in experiments:
        metrics = OVERHEAD_METRICS if exp.kind == "overhead" else REGRESS_METRICS
        b_all = baseline[baseline["experiment"] == exp.name]
        c_all = current[current["experiment"] == exp.name]
        for point in exp.points():
            for label in exp.policies:
                sel = (lambda df: df[(df["point"] == point.id) & (df["policy"] == label)]
                       .set_index("seed"))
                b, c = sel(b_all), sel(c_all)
                ident = {"experiment": exp.name, "point": point.label(), "policy": label}
                seeds = sorted(set(b.index) & set(c.index))
                status_moved = [s for s in seeds if b.loc[s, "status"] != c.loc[s, "status"]]
                missing = sorted(set(b.index) ^ set(c.index))
                if status_moved or missing:
                    rows.append({**ident, "metric": "status", "baseline": _statuses(b),
                                 "current": _statuses(c), "diff": np.nan, "ci_low": np.nan,
                                 "ci_high": np.nan, "rule": "same status", "moved": True})
                ok = [s for s in seeds if b.loc[s, "status"] == "ok" == c.loc[s, "status"]]
                if not ok:
                    continue
                for m in metrics:
                    if m not in b or m not in c:
                        continue
                    bv = b.loc[ok, m].to_numpy(float)
                    cv = c.loc[ok, m].to_numpy(float)
                    nan_b, nan_c = ~np.isfinite(bv), ~np.isfinite(cv)
                    if (nan_b != nan_c).any():
                        rows.append({**ident, "metric": m, "baseline": _mean(bv),
                                     "current": _mean(cv), "diff": np.nan, "ci_low": np.nan,
                                     "ci_high": np.nan, "rule": "same finiteness",
                                     "moved": True})
                        continue
                    keep = ~nan_b
                    if not keep.any():
                        continue
                    d = paired_difference(cv[keep], bv[keep], n_resamples=10_000, seed=0)
                    if m in tolerances:
                        tol = tolerances[m]
                        moved = abs(d["mean_diff"]) > tol
                        rule = f"|diff| <= {tol:g}"
                    else:
                        moved = d["ci_low"] > 0 or d["ci_high"] < 0
                        rule = "95% CI contains 0"
                    rows.append({**ident, "metric": m, "baseline": float(bv[keep].mean()),
                                 "current": float(cv[keep].mean()), "diff": d["mean_diff"],
                                 "ci_low": d["ci_low"], "ci_high": d["ci_high"], "rule": rule,
                                 "moved": bool(moved)})
    cols = key + ["metric", "baseline", "current", "diff", "ci_low", "ci_high", "rule", "moved"]
    return RegressResult(pd.DataFrame(rows, columns=cols))


def _mean(v: np.ndarray) -> float:
    v = v[np.isfinite(v)]
    return float(v.mean()) if v.size else float("nan")


def _statuses(df: pd.DataFrame) -> str:
    if df.empty:
        return "missing"
    counts = df["status"].value_counts()
    return ", ".join(f"{n} {s}" for s, n in counts.items())
