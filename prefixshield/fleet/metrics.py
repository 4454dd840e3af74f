"""Fleet tables: per replica and per tenant, beside the infinite-cache bound.

Populations as in :mod:`prefixshield.simulator.metrics`: a replica's and a tenant's figures are
over their *measured* requests; the load columns count every request routed.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from prefixshield.fleet.bound import bound_cached_tokens
from prefixshield.simulator.engine import RunResult
from prefixshield.simulator.metrics import _p, _time_weighted_mean, eviction_matrix


def _figures(m: pd.DataFrame) -> dict:
    """Hit, TTFT and queueing figures of the requests ``m`` (measured ones)."""
    has = len(m) > 0
    nan = float("nan")
    return {
        "hit_ratio": float(m["hit_fraction"].mean()) if has else nan,
        "token_hit_ratio": (float(m["cached_tokens"].sum() / m["prompt_tokens"].sum())
                            if has else nan),
        "bound_hit_ratio": float((m["bound_cached_tokens"] / m["prompt_tokens"]).mean())
        if has else nan,
        "bound_token_hit_ratio": (float(m["bound_cached_tokens"].sum()
                                        / m["prompt_tokens"].sum()) if has else nan),
        "p50_ttft_s": _p(m["ttft_s"], 50),
        "p95_ttft_s": _p(m["ttft_s"], 95),
        "mean_queue_s": float(m["queue_s"].mean()) if has else nan,
        "p95_queue_s": _p(m["queue_s"], 95),
    }


def with_bound(result: RunResult) -> pd.DataFrame:
    """The fleet run's records with ``bound_cached_tokens`` (see :mod:`.bound`)."""
    fl = result.fleet
    rec = result.records.copy()
    rec["bound_cached_tokens"] = bound_cached_tokens(rec, fl.hashes, fl.hash_offsets,
                                                     fl.block_size)
    return rec


def replica_table(result: RunResult, rec: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per replica: ``requests`` routed (load), ``measured``, the figures of its
    measured requests (hit ratio, token hit ratio, their infinite-cache bounds, P50/P95 TTFT,
    mean/P95 queueing in seconds), ``new_blocks`` created, ``mean_blocks`` (time-weighted
    occupancy of its pool over the fleet's span) and ``peak_blocks``, ``evictions`` and
    ``preemptions``."""
    fl = result.fleet
    rec = with_bound(result) if rec is None else rec
    end = float(np.nanmax(rec["arrival_s"] + rec["e2e_s"].fillna(0))) if len(rec) else 0.0
    rows = []
    for r, res in enumerate(fl.replicas):
        mine = rec[rec["replica"] == r]
        m = mine[mine["measured"]]
        total = res.occupancy.sum(axis=1)
        rows.append({"replica": r, "requests": int(len(mine)), "measured": int(len(m)),
                     **_figures(m),
                     "new_blocks": int(mine["new_blocks"].sum()),
                     "mean_blocks": _time_weighted_mean(res.occupancy_t, total, 0.0, end),
                     "peak_blocks": int(total.max()) if total.size else 0,
                     "evictions": int(res.evictions.sum()),
                     "preemptions": int(mine["preemptions"].sum())})
    return pd.DataFrame(rows)


def tenant_table(result: RunResult, rec: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per tenant (group) across the fleet: ``role``, ``requests`` (measured), the
    figures of :func:`replica_table`, ``replicas`` (how many served it) and ``top_share``
    (the share of its requests on its busiest replica: 1.0 = pinned to one)."""
    rec = with_bound(result) if rec is None else rec
    rows = []
    for g in result.groups:
        mine = rec[rec["group"] == g]
        m = mine[mine["measured"]]
        counts = np.bincount(mine["replica"].to_numpy(), minlength=1) if len(mine) else [0]
        rows.append({"group": g, "role": str(mine["role"].iloc[0]) if len(mine) else "",
                     "requests": int(len(m)), **_figures(m),
                     "replicas": int(np.count_nonzero(counts)),
                     "top_share": float(np.max(counts) / len(mine)) if len(mine) else 0.0})
    return pd.DataFrame(rows)


def replica_evictions(result: RunResult) -> dict[int, pd.DataFrame]:
    """Each replica's eviction matrix (requesting group x owner of the evicted block)."""
    return {r: eviction_matrix(res) for r, res in enumerate(result.fleet.replicas)}


def fleet_summary(result: RunResult, rec: pd.DataFrame | None = None) -> dict:
    """Fleet-wide headline numbers: ``replicas``, ``router``, ``mode``, ``ledger`` (``fleet``
    where the replicas shared PrefixShield's buckets) and ``ledger_staleness_s`` (s),
    ``bound_hit_ratio`` and ``bound_token_hit_ratio`` over the judged population (victims if
    any, else all measured), and the load spread ``max_over_mean_requests`` (1.0 = even)."""
    from prefixshield.simulator.metrics import population

    fl = result.fleet
    rec = with_bound(result) if rec is None else rec
    pop = population(rec)
    counts = np.bincount(rec["replica"].to_numpy(), minlength=fl.config.replicas)
    return {"replicas": fl.config.replicas, "router": fl.config.router.name, "mode": fl.mode,
            # "fleet" only where a ledger was shared (a PrefixShield run)
            "ledger": "fleet" if fl.ledger is not None else "replica",
            "ledger_staleness_s": fl.ledger.staleness_s if fl.ledger is not None else 0.0,
            "bound_hit_ratio": _figures(pop)["bound_hit_ratio"],
            "bound_token_hit_ratio": _figures(pop)["bound_token_hit_ratio"],
            "max_over_mean_requests": (float(counts.max() / counts.mean())
                                       if counts.sum() else float("nan"))}
