"""``regress``: rerun a baseline store's spec with the code of now and say what changed.

The simulator is deterministic: the same code, spec and seed give the same numbers. So the
check is exact, cell by cell: a cell (experiment, point, policy, seed) has *changed* when any
compared metric differs from the baseline's at all (NaN equals NaN), when its status changed,
or when it is missing on one side; any changed cell fails the check, whatever its size (a
+30 pp change on one of two seeds is caught). Each changed metric is reported with its seed,
both values and the change.

The paired rule is kept as a second opinion, per (experiment, point, policy) and metric: the
rerun's cells are paired with the baseline's by seed and the paired difference now - baseline
is taken; the metric's change is *significant* when

* an explicit tolerance is given for it (``--tol hit_ratio=0.005``): ``|mean difference| > tol``
  (such a tolerance also relaxes the exact check of that metric: a cell changed by at most
  ``tol`` passes);
* otherwise: its 95% paired bootstrap CI excludes 0 (any systematic change; with unchanged code
  every difference is exactly 0 and nothing moves).

A cell that was ``ok`` and now fails (or the reverse) has moved too. Measured (non-simulated)
columns — wall times, the overhead experiment's latencies — are never compared.

An intended change is accepted with `accept_rerun` (``regress --accept``): the rerun's
cells replace the baseline's.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np
import pandas as pd

REGRESS_METRICS = ("hit_ratio", "token_hit_ratio", "p50_ttft_s", "p95_ttft_s", "mean_e2e_s",
                   "evictions", "preemptions", "attacker_pressure_ratio",
                   "attacker_mean_debt_blocks")
"""Simulated metrics compared by default (``overhead`` cells: ``state_bytes_per_block``)."""
OVERHEAD_METRICS = ("state_bytes_per_block", "hash_entries")


CELL_COLUMNS = ["experiment", "point", "policy", "seed", "cell", "metric", "baseline",
                "current", "change", "significant"]


@dataclass
class RegressResult:
    """``table``: one row per compared (experiment, point, policy, metric) with baseline and
    current means, the paired difference and CI, the rule used and ``moved`` (the paired rule);
    ``cells``: one row per changed metric of a changed cell (exact comparison), with the seed,
    both values, the change and whether the paired rule calls it ``significant``;
    ``cells_compared``: cells present in either store."""

    table: pd.DataFrame
    cells: pd.DataFrame
    cells_compared: int = 0

    @property
    def moved(self) -> pd.DataFrame:
        """Rows of ``table`` whose paired rule says the metric moved."""
        return self.table[self.table["moved"]]

    @property
    def changed(self) -> pd.DataFrame:
        """Rows of ``cells``: every metric of every cell that differs from the baseline."""
        return self.cells

    @property
    def ok(self) -> bool:
        """True when no cell changed (beyond an explicit tolerance)."""
        return self.cells.empty


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
    cell_rows: list[dict] = []
    n_cells = 0
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
                n_cells += len(set(b.index) | set(c.index))
                cell_rows += _exact_changes(ident, b, c, metrics, tolerances)
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
    table = pd.DataFrame(rows, columns=cols)
    cells = pd.DataFrame(cell_rows, columns=CELL_COLUMNS)
    if len(cells):
        # the paired rule's verdict on the changed cell's (experiment, point, policy, metric)
        verdict = {(r["experiment"], r["point"], r["policy"], r["metric"]):
                   f"{'yes' if r['moved'] else 'no'} ({r['rule']})" for _, r in table.iterrows()}
        cells["significant"] = [verdict.get((r["experiment"], r["point"], r["policy"],
                                             r["metric"]), "-") for _, r in cells.iterrows()]
    return RegressResult(table, cells, n_cells)


def _exact_changes(ident: dict, b: pd.DataFrame, c: pd.DataFrame, metrics,
                   tolerances: dict[str, float]) -> list[dict]:
    """Rows for every metric of every seed whose value in ``c`` differs from ``b`` (exactly,
    NaN equals NaN; by more than its ``tolerances`` entry, when the user gave one), whose
    status differs, or that is missing on one side."""
    out = []
    for seed in sorted(set(b.index) | set(c.index)):
        row = {**ident, "seed": int(seed), "cell": (ident["experiment"], ident["point"],
                                                    ident["policy"], int(seed))}
        if seed not in b.index or seed not in c.index:
            out.append({**row, "metric": "cell", "baseline": "present" if seed in b.index
                        else "missing", "current": "present" if seed in c.index else "missing",
                        "change": "-", "significant": "-"})
            continue
        sb, sc = b.loc[seed, "status"], c.loc[seed, "status"]
        if sb != sc:
            out.append({**row, "metric": "status", "baseline": sb, "current": sc,
                        "change": "-", "significant": "-"})
            continue
        for m in metrics:
            if m not in b or m not in c:
                continue
            vb, vc = float(b.loc[seed, m]), float(c.loc[seed, m])
            if vb == vc or (math.isnan(vb) and math.isnan(vc)):
                continue
            if m in tolerances and abs(vc - vb) <= tolerances[m]:
                continue
            out.append({**row, "metric": m, "baseline": vb, "current": vc,
                        "change": vc - vb if math.isfinite(vb) and math.isfinite(vc) else "-",
                        "significant": "-"})
    return out


def accept_rerun(baseline, rerun) -> None:
    """Make ``rerun``'s cells the baseline's: its ``cells/`` is copied beside the baseline's
    and swapped in (the old one removed after), and ``store.json`` records the provenance of
    the code that computed them. Both stores must share the spec (``regress`` makes them so);
    the caller holds the baseline's lock."""
    import json
    import shutil
    import tempfile
    from pathlib import Path

    from prefixshield.atomic import write_text
    from prefixshield.experiments.store import CELLS, STORE_FILE, provenance

    if baseline.meta.get("spec_digest") != rerun.meta.get("spec_digest"):
        raise ValueError(f"{rerun.root}: another spec than the baseline {baseline.root}")
    root = Path(baseline.root)
    stage = Path(tempfile.mkdtemp(prefix=f".{CELLS}.", suffix=".new", dir=root))
    shutil.copytree(Path(rerun.root) / CELLS, stage / CELLS)
    old = root / f".{CELLS}.old"
    shutil.rmtree(old, ignore_errors=True)
    if (root / CELLS).exists():
        os.replace(root / CELLS, old)
    os.replace(stage / CELLS, root / CELLS)
    shutil.rmtree(stage, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)
    baseline.meta["provenance"] = provenance()
    write_text(root / STORE_FILE, json.dumps(baseline.meta, indent=2, sort_keys=True) + "\n")


def _mean(v: np.ndarray) -> float:
    v = v[np.isfinite(v)]
    return float(v.mean()) if v.size else float("nan")


def _statuses(df: pd.DataFrame) -> str:
    if df.empty:
        return "missing"
    counts = df["status"].value_counts()
    return ", ".join(f"{n} {s}" for s, n in counts.items())
