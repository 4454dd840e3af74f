"""Run summaries and paired statistics over per-request records.

Populations: attack traces are judged by their *measured victim* requests; traces without a
victim role by all measured requests. ``hit_fraction`` is vLLM's: cached tokens at first
scheduling / prompt tokens. TTFT is first-token time minus arrival, in seconds.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from prefixshield.simulator.creation import group_creation
from prefixshield.simulator.engine import RunResult


def population(records: pd.DataFrame) -> pd.DataFrame:
    """The measured requests a run is judged by: victims if the trace has any, else all."""
    measured = records[records["measured"]]
    victims = measured[measured["role"] == "victim"]
    return victims if len(victims) else measured


def _p(x: pd.Series, q: float) -> float:
    x = x.dropna()
    return float(np.percentile(x, q)) if len(x) else float("nan")


def measured_window(result: RunResult) -> tuple[float, float]:
    """The measured phase in seconds: the trace's ``measure_start_s``/``measure_end_s``, else
    the span of the measured arrivals."""
    meta = result.trace_meta
    if "measure_start_s" in meta and "measure_end_s" in meta:
        return float(meta["measure_start_s"]), float(meta["measure_end_s"])
    arr = result.records.loc[result.records["measured"], "arrival_s"]
    return (float(arr.min()), float(arr.max())) if len(arr) else (0.0, 0.0)


def attacker_group(result: RunResult) -> str | None:
    """The attack trace's attacker group (configured, possibly silent), or None."""
    name = result.trace_meta.get("attacker_group")
    if name in result.groups:
        return name
    att = result.records.loc[result.records["role"] == "attacker", "group"]
    return str(att.iloc[0]) if len(att) else None


def creation(result: RunResult, group: str, window: tuple[float, float]) -> dict[str, float]:
    """``created_blocks``, ``pressure_ratio`` and ``mean_debt_blocks`` of ``group`` over
    ``window`` (see `prefixshield.simulator.creation.group_creation`)."""
    return group_creation(result.creations, result.groups.index(group), result.contract_rho,
                          result.contract_beta, window)


def summarize(result: RunResult) -> dict:
    """Headline numbers of one run.

    Returns a dict with ``population`` (``victim`` or ``all``), ``requests``, ``hit_ratio`` (mean
    hit fraction), ``token_hit_ratio`` (cached / prompt tokens, summed over the population, the
    figure trace studies publish), ``p50_ttft_s``, ``p95_ttft_s``, ``mean_e2e_s``,
    ``preemptions``, ``evictions`` (cached blocks reclaimed), ``attacker_pressure_ratio`` and
    ``attacker_mean_debt_blocks`` (measured over the pressure window; NaN without an attacker),
    ``sim_steps`` and ``sim_events``.

    Queueing beside the cache: ``mean_queue_s`` and ``p95_queue_s`` (arrival to first
    admission, seconds) and ``arrival_hit_ratio`` (mean hit fraction of the prefix cached when
    each request *arrived*; ``hit_ratio`` is at admission, so their difference is what the cache
    lost while the population queued). KV consumption: ``attacker_block_s`` (KV block-seconds
    held by the attacker's requests, NaN without an attacker) and ``attacker_kv_share`` (its
    share of every request's block-seconds).
    """
    rec = result.records
    pop = population(rec)
    att = attacker_group(result)
    if att is None:
        pressure = {"pressure_ratio": float("nan"), "mean_debt_blocks": float("nan")}
        kv = None
    else:
        window = result.trace_meta.get("pressure_window_s") or measured_window(result)
        pressure = creation(result, att, tuple(window))
        kv = (rec["block_s"][rec["group"] == att], rec["block_s"])
    return summary_of(pop.__getitem__, len(pop), bool((pop["role"] == "victim").any()),
                      int(rec["preemptions"].sum()), kv, pressure, int(result.evictions.sum()),
                      result.num_steps, result.num_events)


def summary_of(column, count: int, victims: bool, preemptions: int,
               kv: tuple[pd.Series, pd.Series] | None, pressure: dict, evictions: int,
               num_steps: int, num_events: int) -> dict:
    """`summarize`'s dict from its parts, for runs whose records are in memory and for
    streamed runs that read them from a file a column at a time
    (`prefixshield.simulator.stream`): the same expressions on the same values.

    Args:
        column: name -> that column of the judged population (`population`), a Series.
        count: requests in the population; ``victims``: whether it is the measured victims.
        preemptions: preemptions of every request.
        kv: the attacker's requests' ``block_s`` and every request's (Series), None without
            an attacker.
        pressure: the attacker's ``pressure_ratio`` and ``mean_debt_blocks`` (NaN without).
        evictions: cached blocks reclaimed; ``num_steps``, ``num_events``: the run's counts.
    """
    if kv is None:
        kv_stats = {"attacker_block_s": float("nan"), "attacker_kv_share": float("nan")}
    else:
        att_bs = float(kv[0].sum())
        total = float(kv[1].sum())
        kv_stats = {"attacker_block_s": att_bs,
                    "attacker_kv_share": att_bs / total if total > 0 else float("nan")}
    some = count > 0
    return {
        "population": "victim" if victims else "all",
        "requests": int(count),
        "hit_ratio": float(column("hit_fraction").mean()) if some else float("nan"),
        "token_hit_ratio": (float(column("cached_tokens").sum()
                                  / column("prompt_tokens").sum())
                            if some else float("nan")),
        "p50_ttft_s": _p(column("ttft_s"), 50),
        "p95_ttft_s": _p(column("ttft_s"), 95),
        "mean_e2e_s": float(column("e2e_s").mean()) if some else float("nan"),
        "preemptions": int(preemptions),
        "evictions": int(evictions),
        "attacker_pressure_ratio": pressure["pressure_ratio"],
        "attacker_mean_debt_blocks": pressure["mean_debt_blocks"],
        "mean_queue_s": float(column("queue_s").mean()) if some else float("nan"),
        "p95_queue_s": _p(column("queue_s"), 95),
        "arrival_hit_ratio": (float(column("arrival_hit_fraction").mean()) if some
                              else float("nan")),
        **kv_stats,
        "sim_steps": int(num_steps),
        "sim_events": int(num_events),
    }


def occupancy_frame(result: RunResult) -> pd.DataFrame:
    """Occupancy over time, long form: ``t_s, group, blocks`` (a row per change per group)."""
    t = np.repeat(result.occupancy_t, len(result.groups))
    g = np.tile(np.asarray(result.groups, dtype=object), len(result.occupancy_t))
    return pd.DataFrame({"t_s": t, "group": g, "blocks": result.occupancy.reshape(-1)})


def group_table(result: RunResult) -> pd.DataFrame:
    """Per-group view: measured requests, hit ratio, TTFT percentiles, blocks created, occupancy
    (peak, and time-weighted mean over the measured window), evictions caused and suffered, and
    creation pressure and mean debt over the measured window; queueing (mean and P95 seconds from
    arrival to first admission, hit ratio at arrival beside the one at admission) and KV held by
    running requests (``block_s``: block-seconds of all the group's requests; ``held_blocks``:
    that over the run's span, the mean blocks its running requests held; ``peak_held_blocks``:
    the most they held at once); ``token_hit_ratio``: cached over prompt tokens summed over the
    group's measured requests."""
    rec = result.records
    measured = rec[rec["measured"]]
    t = result.occupancy_t
    occ = result.occupancy
    start = float(measured["arrival_s"].min()) if len(measured) else 0.0
    end = float(np.nanmax(rec["arrival_s"].to_numpy() + rec["e2e_s"].fillna(0).to_numpy())) \
        if len(rec) else 0.0
    window = measured_window(result)
    rows = []
    for gi, g in enumerate(result.groups):
        made = creation(result, g, window)
        m = measured[measured["group"] == g]
        role = rec.loc[rec["group"] == g, "role"].iloc[0] if (rec["group"] == g).any() else ""
        rows.append({
            "group": g,
            "role": role,
            "requests": int(len(m)),
            "hit_ratio": float(m["hit_fraction"].mean()) if len(m) else float("nan"),
            "p50_ttft_s": _p(m["ttft_s"], 50),
            "p95_ttft_s": _p(m["ttft_s"], 95),
            "new_blocks": int(rec.loc[rec["group"] == g, "new_blocks"].sum()),
            "peak_blocks": int(occ[:, gi].max()) if len(occ) else 0,
            "mean_blocks": _time_weighted_mean(t, occ[:, gi], start, end),
            "evictions_caused": int(result.evictions[gi, :].sum()),
            "evictions_suffered": int(result.evictions[:, gi].sum()),
            "pressure_ratio": made["pressure_ratio"],
            "mean_debt_blocks": made["mean_debt_blocks"],
            "mean_queue_s": float(m["queue_s"].mean()) if len(m) else float("nan"),
            "p95_queue_s": _p(m["queue_s"], 95),
            "arrival_hit_ratio": (float(m["arrival_hit_fraction"].mean()) if len(m)
                                  else float("nan")),
            "block_s": float(rec.loc[rec["group"] == g, "block_s"].sum()),
            "held_blocks": (float(rec.loc[rec["group"] == g, "block_s"].sum()) / (end - start)
                            if end > start else float("nan")),
            "peak_held_blocks": int(result.held[:, gi].max()) if result.held.size else 0,
            "token_hit_ratio": (float(m["cached_tokens"].sum() / m["prompt_tokens"].sum())
                                if len(m) and m["prompt_tokens"].sum() > 0 else float("nan")),
        })
    return pd.DataFrame(rows)


def _time_weighted_mean(t: np.ndarray, v: np.ndarray, start: float, end: float) -> float:
    """Mean of the step function ``v`` (value v[i] from t[i] on) over ``[start, end]``."""
    if end <= start:
        return float(v[-1]) if len(v) else float("nan")
    edges = np.clip(np.append(t, end), start, end)
    widths = np.diff(edges)
    return float(np.sum(widths * v) / (end - start))


def held_frame(result: RunResult) -> pd.DataFrame:
    """Blocks held by running requests over time, long form: ``t_s, group, blocks`` (a row per
    change per group; the series `RunResult.held` records)."""
    t = np.repeat(result.held_t, len(result.groups))
    g = np.tile(np.asarray(result.groups, dtype=object), len(result.held_t))
    return pd.DataFrame({"t_s": t, "group": g, "blocks": result.held.reshape(-1)})


def eviction_matrix(result: RunResult) -> pd.DataFrame:
    """Cached blocks reclaimed: rows = requesting group, columns = owner of the evicted block."""
    return pd.DataFrame(result.evictions, index=pd.Index(result.groups, name="requester"),
                        columns=pd.Index(result.groups, name="owner"))


def paired_difference(a: np.ndarray, b: np.ndarray, n_resamples: int = 10_000,
                      seed: int = 0, confidence: float = 0.95) -> dict:
    """Mean of run-level paired differences ``a - b`` with a percentile bootstrap CI.

    ``a[i]`` and ``b[i]`` come from the same trace (seed i). Fixed bootstrap seed: deterministic.
    """
    # scipy costs ~0.5 s to import; only this function needs it, so a run that never compares
    # policies (or a CLI start-up) does not pay for it.
    from scipy import stats

    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    if d.size < 2 or np.all(d == d[0]):
        return {"mean_diff": float(d.mean()) if d.size else float("nan"),
                "ci_low": float(d.min()) if d.size else float("nan"),
                "ci_high": float(d.max()) if d.size else float("nan"), "runs": int(d.size)}
    res = stats.bootstrap((d,), np.mean, n_resamples=n_resamples, confidence_level=confidence,
                          method="percentile", random_state=np.random.default_rng(seed))
    return {"mean_diff": float(d.mean()), "ci_low": float(res.confidence_interval.low),
            "ci_high": float(res.confidence_interval.high), "runs": int(d.size)}
