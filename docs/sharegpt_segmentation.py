"""Why PrefixShield's retention classes cost hits on benign multi-turn ShareGPT traffic.

Usage (from the repository root, after ``make install``)::

    .venv/bin/python docs/sharegpt_segmentation.py [--seeds 10] [--blocks 512] [--alpha 0.6]

Runs the ``sharegpt`` workload at its defaults under LRU, S3-FIFO, PrefixShield and PrefixShield
without segmentation (paired seeds, identical traces), and for PrefixShield samples its free
cached blocks every simulated second: how many sit in each retention class, how many of those
belong to a conversation that will never send another turn ("dead": the trace has no later turn
of it), and how long ago they were last materialized or hit. It also prints the evictions per
class, the promotions granted and gated, and the groups' debt. ``docs/sharegpt_segmentation.md``
explains the numbers.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np
import pandas as pd

from prefixshield.experiments.paired import paired_table
from prefixshield.experiments.single import RunSpec, build_trace, run_policies
from prefixshield.policies.prefixshield import CLASS_NAMES
from prefixshield.simulator.config import EngineConfig
from prefixshield.simulator.costmodel import load_profile
from prefixshield.simulator.engine import Engine
from prefixshield.simulator.metrics import summarize

POLICIES = ("lru", "s3fifo", "prefixshield", "prefixshield:segmentation=false")


def class_census(trace, spec) -> tuple[pd.DataFrame, dict]:
    """PrefixShield on ``trace``: per-second samples of free cached blocks per class (all and
    dead), and its end-of-run stats."""
    from prefixshield.policies import make_policy

    df = trace.requests
    last_turn = df.groupby("prefix_id")["arrival_s"].max()
    last_of = np.full(int(df["prefix_id"].max()) + 1, -np.inf)
    last_of[last_turn.index.to_numpy()] = last_turn.to_numpy()
    measure_start = trace.meta["measure_start_s"]
    rows = []

    def observe(engine, t):
        if t < measure_start:
            return
        pol = engine.pool.policy
        candidate = pol.free_mask() & pol.cached
        for k, name in enumerate(CLASS_NAMES):
            mine = candidate & (pol.klass == k)
            dead = last_of[pol.prefix[mine]] < t
            age = t - pol.last_access[mine]
            rows.append({"t_s": t, "class": name, "blocks": int(mine.sum()),
                         "dead_blocks": int(dead.sum()),
                         "age_s": float(age.mean()) if age.size else np.nan})

    policy = make_policy("prefixshield", spec.engine.num_blocks)
    result = Engine(trace, policy, spec.profile.cost, spec.engine).run(observe=observe)
    return pd.DataFrame(rows), result.policy_stats


def main() -> None:
    """Print the paired comparison and PrefixShield's class census (see the module doc)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--blocks", type=int, default=512)
    ap.add_argument("--alpha", type=float, default=0.6)
    args = ap.parse_args()
    spec = RunSpec("sharegpt", POLICIES, EngineConfig(num_blocks=args.blocks),
                   load_profile("l4-qwen2.5-1.5b"), alpha=args.alpha)
    runs, census, stats = [], [], []
    for seed in range(args.seeds):
        s = replace(spec, seed=seed)
        trace, _ = build_trace(s)
        for label, r in run_policies(trace, s).items():
            runs.append({"seed": seed, "policy": label, **summarize(r)})
        c, st = class_census(trace, s)
        census.append(c.assign(seed=seed))
        stats.append(st)
    table = paired_table(pd.DataFrame(runs), baseline="lru", metrics=("hit_ratio",))
    print(f"sharegpt, {args.blocks} blocks, alpha {args.alpha}, {args.seeds} paired seeds")
    for _, r in table.iterrows():
        print(f"  {r['policy']:34s} hit ratio {100 * r['hit_ratio_mean']:6.2f}%   vs lru "
              f"{100 * r['hit_ratio_diff']:+6.2f} pp [{100 * r['hit_ratio_ci_low']:+.2f}, "
              f"{100 * r['hit_ratio_ci_high']:+.2f}]")
    c = pd.concat(census)
    mean = c.groupby("class", sort=False)[["blocks", "dead_blocks", "age_s"]].mean()
    print("PrefixShield, free cached blocks per class (mean of per-second samples, measured "
          "phase):")
    for name, r in mean.iterrows():
        share = r["dead_blocks"] / r["blocks"] if r["blocks"] else float("nan")
        print(f"  {name:13s} {r['blocks']:6.1f} blocks, {r['dead_blocks']:6.1f} of their "
              f"conversations have ended ({100 * share:.0f}%); last materialized or hit "
              f"{r['age_s']:.1f} s ago on average")
    evicted = {k: sum(st["evicted_by_class"][g][k] for st in stats
                      for g in st["evicted_by_class"]) for k in CLASS_NAMES}
    print("PrefixShield, evictions by the class of the evicted block (all seeds): "
          + ", ".join(f"{k} {v}" for k, v in evicted.items()))
    granted = sum(sum(st["promotions_granted"].values()) for st in stats)
    gated = sum(sum(st["promotions_gated"].values()) for st in stats)
    debt = max(max(st["debt_blocks"].values()) for st in stats)
    samples = max(max(st["debt_samples"]["debt_blocks"], default=0.0) for st in stats)
    print(f"PrefixShield, promotions granted {granted}, gated {gated}; largest debt of any "
          f"group at the end {debt:.1f} blocks, at any charge {samples:.1f} blocks")


if __name__ == "__main__":
    main()
