"""Per-tenant answers: each policy's view of each tenant (group), for one run or over seeds.

The numbers are [`group_table`][prefixshield.simulator.metrics.group_table]'s (what a run's
``groups.csv`` holds): per group its measured requests, mean hit ratio at admission and at
arrival, token hit ratio, P50/P95 TTFT, P95 queueing delay, the cache blocks it holds
(time-weighted mean over the measured window), the blocks its running requests hold (mean over
the run) and its mean token-bucket debt over the measured window (blocks; the metering is the
same under every policy, so LRU shows the debt PrefixShield would charge).
"""

from __future__ import annotations

import re
from typing import Mapping

import numpy as np
import pandas as pd

TENANT_COLUMNS = ("requests", "hit_ratio", "arrival_hit_ratio", "token_hit_ratio",
                  "p50_ttft_s", "p95_ttft_s", "p95_queue_s", "mean_blocks", "held_blocks",
                  "mean_debt_blocks")
"""The per-tenant metrics, in the order the tables show them."""

TENANT_HEADERS = {"requests": "requests", "hit_ratio": "hit ratio",
                  "arrival_hit_ratio": "at arrival", "token_hit_ratio": "token hit ratio",
                  "p50_ttft_s": "P50 TTFT (s)", "p95_ttft_s": "P95 TTFT (s)",
                  "p95_queue_s": "P95 queue (s)", "mean_blocks": "cache blocks",
                  "held_blocks": "held blocks", "mean_debt_blocks": "debt (blocks)"}
"""Column headers of `TENANT_COLUMNS` for reading."""

TENANT_NOTE = ("hit ratio: mean over the tenant's measured requests of cached / prompt tokens at "
               "admission; at arrival: of the prefix cached when they arrived; token hit ratio: "
               "cached over prompt tokens summed; cache blocks: blocks the tenant owns in the "
               "pool (time-weighted mean over the measured window); held blocks: blocks its "
               "running requests hold (mean over the run); debt: its mean token-bucket debt "
               "over the measured window (the same metering under every policy).")


def tenant_frame(tables: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """Long form of per-policy group tables: one row per (policy, group), policies in the
    given order, groups in each table's order; columns ``policy``, ``group``, ``role`` and
    `TENANT_COLUMNS` (NaN where a table lacks one, e.g. an older ``groups.csv``).

    Args:
        tables: policy label -> its [`group_table`][prefixshield.simulator.metrics.group_table] (or
            a ``groups.csv`` read back).
    """
    parts = []
    for label, t in tables.items():
        t = t.copy()
        for c in TENANT_COLUMNS:
            if c not in t:
                t[c] = np.nan
        t.insert(0, "policy", label)
        parts.append(t[["policy", "group", "role", *TENANT_COLUMNS]])
    if not parts:
        return pd.DataFrame(columns=["policy", "group", "role", *TENANT_COLUMNS])
    df = pd.concat(parts, ignore_index=True)
    df["group"] = df["group"].astype(str)
    return df


def results_tenant_frame(results: Mapping) -> pd.DataFrame:
    """`tenant_frame` of runs (policy label -> ``RunResult``)."""
    from prefixshield.simulator.metrics import group_table

    return tenant_frame({label: group_table(r) for label, r in results.items()})


def mean_over_seeds(rows: pd.DataFrame) -> pd.DataFrame:
    """Per (policy, group) of per-seed tenant rows (a ``seed`` column beside
    `tenant_frame`'s): the mean of each metric over the seeds that served it, and
    ``seeds``, how many; policy and group order kept."""
    if rows.empty:
        return rows.assign(seeds=pd.Series(dtype=int))
    keys = ["policy", "group"]
    means = rows.groupby(keys, sort=False)[list(TENANT_COLUMNS)].mean()
    role = rows.groupby(keys, sort=False)["role"].first()
    seeds = rows.groupby(keys, sort=False)["seed"].nunique().rename("seeds")
    out = pd.concat([role, seeds, means], axis=1).reset_index()
    return out


def by_tenant(df: pd.DataFrame, max_tenants: int | None = None) -> tuple[pd.DataFrame, int]:
    """``df`` (a `tenant_frame`) reordered tenant by tenant (the tenants in order of
    their first row; within one, the policies in order), the ``max_tenants`` with the most
    requests kept; returns it and how many tenants were left out."""
    order = _natural(list(dict.fromkeys(df["group"])))
    left = 0
    if max_tenants is not None and len(order) > max_tenants:
        req = df.groupby("group", sort=False)["requests"].max()
        keep = set(req.sort_values(ascending=False, kind="stable").index[:max_tenants])
        left = len(order) - len(keep)
        order = [g for g in order if g in keep]
    pol = {p: i for i, p in enumerate(dict.fromkeys(df["policy"]))}
    grp = {g: i for i, g in enumerate(order)}
    sub = df[df["group"].isin(grp)]
    sub = sub.assign(_g=sub["group"].map(grp), _p=sub["policy"].map(pol))
    return sub.sort_values(["_g", "_p"], kind="stable").drop(columns=["_g", "_p"]), left


def _natural(names: list[str]) -> list[str]:
    """``names`` in numeric order when they are one stem with numbers (``group0``, ``group1``,
    ..., ``group10``), else as given (first arrival: ``victim`` before ``attacker``)."""
    parts = [re.fullmatch(r"(.*?)(\d+)", n) for n in names]
    if not all(parts) or len({m.group(1) for m in parts}) != 1:
        return names
    return [n for _, n in sorted(zip((int(m.group(2)) for m in parts), names))]


def display_frame(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` (a `tenant_frame`, optionally with ``seeds``) as strings for reading:
    ratios in percent, seconds to 3 decimals, blocks to whole blocks."""
    def pct(x):
        return "-" if x != x else f"{100 * x:.2f}%"

    def num(x, spec):
        return "-" if x != x else format(x, spec)

    out = pd.DataFrame({"tenant": df["group"].astype(str), "policy": df["policy"].astype(str)})
    if "seeds" in df:
        out["seeds"] = df["seeds"].astype(int).astype(str)
    out["requests"] = [num(x, ".0f") for x in df["requests"]]
    for c in ("hit_ratio", "arrival_hit_ratio", "token_hit_ratio"):
        out[TENANT_HEADERS[c]] = [pct(x) for x in df[c]]
    for c in ("p50_ttft_s", "p95_ttft_s", "p95_queue_s"):
        out[TENANT_HEADERS[c]] = [num(x, ".3f") for x in df[c]]
    for c in ("mean_blocks", "held_blocks", "mean_debt_blocks"):
        out[TENANT_HEADERS[c]] = [num(x, ".0f") for x in df[c]]
    return out.reset_index(drop=True)
