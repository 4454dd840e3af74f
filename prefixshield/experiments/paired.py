"""Paired comparison: R seeds, every policy on the identical trace per seed."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Mapping

import pandas as pd

from prefixshield.experiments.single import RunSpec, build_trace, run_policies
from prefixshield.simulator.metrics import paired_difference, summarize


def run_paired(spec: RunSpec, seeds: list[int],
               on_seed: Callable[[int], None] | None = None,
               contracts: Mapping | None = None, executor: Any = None,
               on_results: Callable[[int, dict], None] | None = None) -> pd.DataFrame:
    """Run ``spec`` once per seed (the seed replaces ``spec.seed``); one row per (seed, policy)
    with ``status`` (``ok``, or ``failed`` with ``error`` when the policy cannot serve that
    seed's trace; its metrics are then NaN) and the
    [`summarize`][prefixshield.simulator.metrics.summarize] columns. ``contracts``, when given, are
    what the policies meter by; each seed's trace is still built with ``spec``'s own (so an
    attack keeps its size). ``executor``: where a split fleet's replicas run (None: here).
    ``on_results(seed, results)``: each seed's runs (policy label -> ``RunResult``) as they end,
    before they are dropped (the contract guard reads them); ``on_seed(seed)`` after it.

    For a trace file the seeds are what ``spec.resample`` makes them (``"sessions"``: each a
    bootstrap replicate of the file's trace, `prefixshield.traces.bootstrap`)."""
    rows = []
    for seed in seeds:
        s = replace(spec, seed=seed)
        trace, _info = build_trace(s)
        failures: dict[str, str] = {}
        policy_spec = s if contracts is None else replace(s, contracts=contracts)
        results = run_policies(trace, policy_spec, failures=failures, executor=executor)
        if on_results is not None:
            on_results(seed, results)
        for label in s.policies:
            if label in results:
                rows.append({"seed": seed, "policy": label, "status": "ok", "error": "",
                             **summarize(results[label])})
            else:
                rows.append({"seed": seed, "policy": label, "status": "failed",
                             "error": failures[label]})
        if on_seed is not None:
            on_seed(seed)
    return pd.DataFrame(rows)


def paired_table(runs: pd.DataFrame, baseline: str, metrics=("hit_ratio", "p95_ttft_s"),
                 n_resamples: int = 10_000, seed: int = 0) -> pd.DataFrame:
    """Per policy: runs served (``runs``, ``failed`` and the first ``error``), the mean of each
    metric over them, and its paired difference to ``baseline`` with a 95% percentile-bootstrap
    CI over run-level differences (fixed bootstrap seed), on the seeds both served."""
    out = []
    runs = runs.assign(**{m: float("nan") for m in metrics if m not in runs})
    wide = {m: runs.pivot(index="seed", columns="policy", values=m) for m in metrics}
    status = runs["status"] if "status" in runs else pd.Series("ok", index=runs.index)
    for policy in dict.fromkeys(runs["policy"]):
        mine = runs["policy"] == policy
        bad = runs[mine & (status != "ok")]
        row = {"policy": policy, "runs": int((mine & (status == "ok")).sum()),
               "failed": len(bad), "error": str(bad["error"].iloc[0]) if len(bad) else ""}
        for m in metrics:
            w = wide[m]
            row[f"{m}_mean"] = float(w[policy].mean())
            both = w[[policy, baseline]].dropna() if policy != baseline else w[[policy]]
            if policy != baseline and both.empty:
                row[f"{m}_diff"] = row[f"{m}_ci_low"] = row[f"{m}_ci_high"] = float("nan")
            elif policy != baseline:
                d = paired_difference(both[policy].to_numpy(), both[baseline].to_numpy(),
                                      n_resamples=n_resamples, seed=seed)
                row[f"{m}_diff"] = d["mean_diff"]
                row[f"{m}_ci_low"] = d["ci_low"]
                row[f"{m}_ci_high"] = d["ci_high"]
            else:
                row[f"{m}_diff"] = row[f"{m}_ci_low"] = row[f"{m}_ci_high"] = 0.0
        out.append(row)
    return pd.DataFrame(out)
