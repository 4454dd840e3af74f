"""Paired comparison: R seeds, every policy on the identical trace per seed (DESIGN §8)."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

import pandas as pd

from prefixshield.experiments.single import RunSpec, build_trace, run_policies
from prefixshield.simulator.metrics import paired_difference, summarize


def run_paired(spec: RunSpec, seeds: list[int],
               on_seed: Callable[[int], None] | None = None) -> pd.DataFrame:
    """Run ``spec`` once per seed (the seed replaces ``spec.seed``); one row per (seed, policy)
    with the :func:`~prefixshield.simulator.metrics.summarize` columns."""
    rows = []
    for seed in seeds:
        s = replace(spec, seed=seed)
        trace, _info = build_trace(s)
        for label, result in run_policies(trace, s).items():
            rows.append({"seed": seed, "policy": label, **summarize(result)})
        if on_seed is not None:
            on_seed(seed)
    return pd.DataFrame(rows)


def paired_table(runs: pd.DataFrame, baseline: str, metrics=("hit_ratio", "p95_ttft_s"),
                 n_resamples: int = 10_000, seed: int = 0) -> pd.DataFrame:
    """Per policy: mean of each metric over seeds, and its paired difference to ``baseline``
    with a 95% percentile-bootstrap CI over run-level differences (fixed bootstrap seed)."""
    out = []
    wide = {m: runs.pivot(index="seed", columns="policy", values=m) for m in metrics}
    for policy in dict.fromkeys(runs["policy"]):
        row = {"policy": policy, "runs": int((runs["policy"] == policy).sum())}
        for m in metrics:
            w = wide[m]
            row[f"{m}_mean"] = float(w[policy].mean())
            if policy != baseline:
                d = paired_difference(w[policy].to_numpy(), w[baseline].to_numpy(),
                                      n_resamples=n_resamples, seed=seed)
                row[f"{m}_diff"] = d["mean_diff"]
                row[f"{m}_ci_low"] = d["ci_low"]
                row[f"{m}_ci_high"] = d["ci_high"]
            else:
                row[f"{m}_diff"] = row[f"{m}_ci_low"] = row[f"{m}_ci_high"] = 0.0
        out.append(row)
    return pd.DataFrame(out)
