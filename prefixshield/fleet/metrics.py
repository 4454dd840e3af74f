"""Fleet tables: per replica and per tenant, beside the infinite-cache bound.

Populations as in `prefixshield.simulator.metrics`: a replica's and a tenant's figures are
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
    """The fleet run's records with ``bound_cached_tokens`` (see `bound`)."""
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
    figures of `replica_table`, ``replicas`` (how many served it) and ``top_share``
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


LOAD_WARN = 1.5
"""A fleet run warns when its load spread (requests on the busiest replica over the mean per
replica) is above this, or when a replica received no request."""


IDLE_NAMED = 16
"""The idle replicas `routing_warning` names (the rest are counted): a fleet of a thousand
replicas and twenty requests would otherwise print a thousand numbers."""


def routing_warning(result: RunResult) -> str | None:
    """None when every replica received requests and the load spread is at most
    `LOAD_WARN`; else one line naming the router, the idle replicas and the spread, and
    the cause where the router's rule gives one: under ``session``, how many distinct keys the
    trace has for the replicas and the share of the busiest key (a tenant whose requests all
    share one ``prefix_id`` -- one root -- is one key, pinned to one replica); under
    ``prefix_affinity`` and ``kv_aware``, the share of the busiest ``prefix_id`` (requests follow
    the replica that holds their prefix)."""
    fl = result.fleet
    rec = result.records
    n = fl.config.replicas
    counts = np.bincount(rec["replica"].to_numpy(), minlength=n)
    if not counts.sum():
        return None
    idle = np.flatnonzero(counts == 0)
    spread = float(counts.max() / counts.mean())
    if not idle.size and spread <= LOAD_WARN:
        return None
    router = fl.config.router
    what = []
    if idle.size:
        named = ", ".join(map(str, idle[:IDLE_NAMED].tolist()))
        more = f" and {idle.size - IDLE_NAMED} more" if idle.size > IDLE_NAMED else ""
        what.append(f"{idle.size} of {n} replicas received no request (replica {named}{more})")
    what.append(f"load max/mean {spread:.2f}" + (f" > {LOAD_WARN:g}" if spread > LOAD_WARN
                                                 else ""))
    cause = _routing_cause(rec, router, n)
    return (f"router {router.name}: " + "; ".join(what) + (f". Cause: {cause}" if cause else "")
            + ".")


def _routing_cause(rec: pd.DataFrame, router, n: int) -> str:
    """The cause of an uneven routing in words, '' where the router's rule names none."""
    total = len(rec)
    if router.name == "session":
        by_group = router.session_key == "group"
        key = (rec["group"].astype(str) if by_group else
               rec["group"].astype(str) + "\0" + rec["prefix_id"].astype(str))
        sizes = key.value_counts()
        top = sizes.index[0]
        mine = rec[key == top]
        where = np.bincount(mine["replica"].to_numpy(), minlength=n).argmax()
        g = str(mine["group"].iloc[0])
        who = (f"tenant {g!r}" if by_group else
               f"tenant {g!r}, prefix_id {int(mine['prefix_id'].iloc[0])}")
        keys = "tenant" if by_group else "(tenant, prefix_id)"
        out = (f"session hashes each request's {keys}; the trace has {len(sizes):,} distinct "
               f"keys for {n} replicas")
        return out + (f", and its busiest key ({who}) carries {int(sizes.iloc[0]):,} of "
                      f"{total:,} requests ({100 * sizes.iloc[0] / total:.0f}%), all on "
                      f"replica {int(where)}; a router that reads the replicas' load "
                      "(least_loaded, kv_aware) does not pin a key to one replica")
    if router.name in ("prefix_affinity", "kv_aware"):
        sizes = rec["prefix_id"].value_counts()
        return (f"{router.name} sends a request to the replica holding its prefix; the busiest "
                f"prefix_id ({int(sizes.index[0])}) carries {int(sizes.iloc[0]):,} of {total:,} "
                f"requests ({100 * sizes.iloc[0] / total:.0f}%)")
    return ""
