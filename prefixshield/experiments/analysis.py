"""Tables over stored cells: means per policy and paired differences with bootstrap CIs.

Paired statistics: at each point, a policy is compared with the baseline on the
seeds where both cells succeeded (the identical trace per seed); the difference is the mean of the
run-level differences with a 95% percentile-bootstrap CI (10,000 resamples, fixed seed 0).
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from prefixshield.experiments.spec import Experiment

HEADLINE = ("hit_ratio", "token_hit_ratio", "p95_ttft_s")
N_RESAMPLES = 10_000


def ok_cells(cells: pd.DataFrame) -> pd.DataFrame:
    """The cells whose policy served the trace."""
    if "status" not in cells:
        return cells.iloc[0:0]
    return cells[cells["status"] == "ok"]


def paired_gains(cells: pd.DataFrame, exp: Experiment,
                 metrics: tuple[str, ...] = HEADLINE) -> pd.DataFrame:
    """One row per (point, policy): runs, failed cells, each metric's mean, and its paired
    difference to the baseline (``_diff``, ``_ci_low``, ``_ci_high``; 0 for the baseline)."""
    from prefixshield.simulator.metrics import paired_difference

    sub = cells[cells["experiment"] == exp.name]
    rows = []
    base = exp.baseline_policy
    for point in exp.points():
        at = sub[sub["point"] == point.id]
        good = ok_cells(at)
        for label in exp.policies:
            mine = good[good["policy"] == label].set_index("seed")
            theirs = good[good["policy"] == base].set_index("seed")
            failed = at[(at["policy"] == label) & (at["status"] != "ok")]
            row = {"point": point.id, **{f"grid.{k}": v for k, v in point.values.items()},
                   "point_label": point.label(), "policy": label, "runs": len(mine),
                   "failed": len(failed),
                   "error": str(failed["error"].iloc[0]) if len(failed) else ""}
            seeds = sorted(set(mine.index) & set(theirs.index))
            for m in metrics:
                vals = mine[m].astype(float) if m in mine else pd.Series(dtype=float)
                row[f"{m}_mean"] = float(vals.mean()) if len(vals) else float("nan")
                if label == base:
                    row[f"{m}_diff"] = row[f"{m}_ci_low"] = row[f"{m}_ci_high"] = 0.0
                    continue
                if not seeds:
                    row[f"{m}_diff"] = row[f"{m}_ci_low"] = row[f"{m}_ci_high"] = float("nan")
                    continue
                a = mine.loc[seeds, m].to_numpy(float)
                b = theirs.loc[seeds, m].to_numpy(float)
                keep = np.isfinite(a) & np.isfinite(b)
                if not keep.any():
                    row[f"{m}_diff"] = row[f"{m}_ci_low"] = row[f"{m}_ci_high"] = float("nan")
                    continue
                d = paired_difference(a[keep], b[keep], n_resamples=N_RESAMPLES, seed=0)
                row[f"{m}_diff"] = d["mean_diff"]
                row[f"{m}_ci_low"] = d["ci_low"]
                row[f"{m}_ci_high"] = d["ci_high"]
            rows.append(row)
    return pd.DataFrame(rows)


def mean_ci(values: np.ndarray, n_resamples: int = N_RESAMPLES) -> tuple[float, float, float]:
    """Mean of ``values`` with a 95% percentile-bootstrap CI (fixed seed) — bar whiskers."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return float("nan"), float("nan"), float("nan")
    if v.size < 2 or np.all(v == v[0]):
        return float(v.mean()), float(v.min()), float(v.max())
    rng = np.random.default_rng(0)
    means = v[rng.integers(0, v.size, size=(n_resamples, v.size))].mean(axis=1)
    return float(v.mean()), float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def detail(row: pd.Series, column: str):
    """A JSON detail column of a cell, decoded."""
    return json.loads(row[column])


def group_row(row: pd.Series, group: str) -> dict:
    """The per-group table row of ``group`` in one cell (``{}`` if absent)."""
    for g in detail(row, "groups_json"):
        if g["group"] == group:
            return g
    return {}


def evictions_of(row: pd.Series) -> pd.DataFrame:
    """The eviction matrix of one cell (rows: requesting group, columns: owner)."""
    ev = detail(row, "evictions_json")
    return pd.DataFrame(ev["matrix"], index=pd.Index(ev["groups"], name="requester"),
                        columns=pd.Index(ev["groups"], name="owner"))


def fmt_pct(x: float, signed: bool = False) -> str:
    """``12.34%`` (or ``+1.23``-style when ``signed``); ``-`` for NaN."""
    if x is None or x != x:
        return "-"
    return f"{100 * x:+.2f}" if signed else f"{100 * x:.2f}%"


def fmt_ci(d: float, lo: float, hi: float, scale: float = 100.0, digits: int = 2) -> str:
    """``+1.23 [+0.45, +2.01]`` (scaled, e.g. to percentage points); ``-`` for NaN."""
    if d != d:
        return "-"
    return f"{scale * d:+.{digits}f} [{scale * lo:+.{digits}f}, {scale * hi:+.{digits}f}]"


def fmt_num(x, spec: str = ".3f") -> str:
    """``format(x, spec)``; ``-`` for NaN or None."""
    if x is None or (isinstance(x, float) and x != x):
        return "-"
    return format(x, spec)
