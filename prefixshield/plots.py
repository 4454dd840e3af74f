"""Figures for run results (matplotlib, Agg backend; written atomically as PNG)."""

from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from prefixshield.atomic import atomic_path  # noqa: E402
from prefixshield.simulator.engine import RunResult  # noqa: E402
from prefixshield.simulator.metrics import summarize  # noqa: E402


def plot_policy_comparison(results: dict[str, RunResult], title: str,
                           path: str | os.PathLike, focus_group: str | None = None) -> None:
    """One PNG, three panels: hit ratio and P95 TTFT of the judged population per policy, and the
    blocks ``focus_group`` occupies over time under each policy."""
    names = list(results)
    summaries = [summarize(results[p]) for p in names]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2), gridspec_kw={"width_ratios": [1, 1, 2]})
    pop = summaries[0]["population"] if summaries else "all"
    x = np.arange(len(names))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    axes[0].bar(x, [100 * s["hit_ratio"] for s in summaries], color=colors[: len(names)])
    axes[0].set_ylabel(f"mean hit fraction of {pop} requests (%)")
    axes[0].set_ylim(0, 100)
    axes[1].bar(x, [s["p95_ttft_s"] for s in summaries], color=colors[: len(names)])
    axes[1].set_ylabel(f"P95 TTFT of {pop} requests (s)")
    for ax in axes[:2]:
        ax.set_xticks(x, names)
    # every run has the trace's groups, in the same order
    groups = results[names[0]].groups if names else []
    if focus_group not in groups:
        focus_group = groups[0] if groups else ""
    for i, p in enumerate(names):
        r = results[p]
        gi = r.groups.index(focus_group)
        axes[2].step(r.occupancy_t, r.occupancy[:, gi], where="post", label=p,
                     color=colors[i % len(colors)])
    axes[2].set_xlabel("simulated time (s)")
    axes[2].set_ylabel(f"blocks held by group '{focus_group}'")
    axes[2].set_ylim(0, None)
    axes[2].legend(title="policy")
    fig.suptitle(title)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
