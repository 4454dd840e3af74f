"""The figures of the project (matplotlib, Agg; PNG written atomically): a run's policies side by
side (``prefixshield run --out``) and the figures of a results store's report.

Each function takes plain data (means and CIs, sampled series, matrices), draws one figure meant
to be read without the text around it (title, axis labels with units, legend), and writes it.
"""

from __future__ import annotations

import os
from typing import Mapping, Sequence

import numpy as np

from prefixshield.atomic import atomic_path


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    # Labels are names from traces and specs (groups, policies, experiments): drawn as written.
    # With math text on, a '$' in a group name starts a formula and an unmatched one aborts the
    # whole figure (the run then wrote nothing).
    matplotlib.rcParams["text.parse_math"] = False
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: str | os.PathLike) -> None:
    plt = _plt()
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)


def bars_with_ci(path, title: str, categories: Sequence[str],
                 values: Mapping[str, Sequence[tuple[float, float, float]]], ylabel: str,
                 scale: float = 100.0, note: str = "") -> None:
    """Grouped bars: one group per category, one bar per series (policy), height = mean and
    whiskers = 95% CI (``(mean, low, high)`` per category)."""
    plt = _plt()
    names = list(values)
    fig, ax = plt.subplots(figsize=(max(6, 1.8 * len(categories) + 2), 4.4))
    width = 0.8 / max(1, len(names))
    x = np.arange(len(categories))
    for i, name in enumerate(names):
        m = np.array([v[0] for v in values[name]], dtype=float) * scale
        lo = np.array([v[1] for v in values[name]], dtype=float) * scale
        hi = np.array([v[2] for v in values[name]], dtype=float) * scale
        err = np.vstack([np.nan_to_num(m - lo), np.nan_to_num(hi - m)])
        ax.bar(x + (i - (len(names) - 1) / 2) * width, np.nan_to_num(m), width, yerr=err,
               capsize=3, label=name)
    ax.set_xticks(x, categories)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(title="policy", fontsize=8)
    if note:
        fig.text(0.01, 0.01, note, fontsize=7, color="0.35")
    _save(fig, path)


def sweep_curves(path, title: str, x_label: str, x_values: Sequence[str],
                 series: Mapping[str, Sequence[tuple[float, float, float]]], ylabel: str,
                 scale: float = 100.0, note: str = "") -> None:
    """Paired gain against a swept field: one line per series, CI whiskers at each point; a
    dashed zero line (no difference from the baseline)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.4))
    x = np.arange(len(x_values))
    offsets = (np.arange(len(series)) - (len(series) - 1) / 2) * min(0.08, 0.3 / max(1, len(series)))
    for off, (name, pts) in zip(offsets, series.items()):
        m = np.array([p[0] for p in pts], dtype=float) * scale
        lo = np.array([p[1] for p in pts], dtype=float) * scale
        hi = np.array([p[2] for p in pts], dtype=float) * scale
        ax.errorbar(x + off, m, yerr=np.vstack([np.nan_to_num(m - lo), np.nan_to_num(hi - m)]),
                    marker="o", capsize=4, label=name)
    ax.axhline(0, color="0.5", lw=1, ls="--")
    ax.set_xticks(x, x_values)
    ax.set_xlabel(x_label)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    if note:
        fig.text(0.01, 0.01, note, fontsize=7, color="0.35")
    _save(fig, path)


def stacked_occupancy(path, title: str, panels: Mapping[str, dict], capacity: int | None = None
                      ) -> None:
    """Per policy, the blocks each group holds over time, stacked (``panels[policy]`` is a
    stored occupancy sample: ``t_s``, ``groups``, ``blocks``)."""
    plt = _plt()
    names = list(panels)
    cols = min(2, len(names)) or 1
    rows = (len(names) + cols - 1) // cols or 1
    fig, axes = plt.subplots(rows, cols, figsize=(6.5 * cols, 3.4 * rows), squeeze=False,
                             sharey=True)
    for ax, name in zip(axes.flat, names):
        occ = panels[name]
        ys = [occ["blocks"][g] for g in occ["groups"]]
        ax.stackplot(occ["t_s"], *ys, labels=occ["groups"], step="post")
        if capacity:
            ax.axhline(capacity, color="k", lw=0.8, ls=":")
        ax.set_title(name)
        ax.set_xlabel("simulated time (s)")
        ax.set_ylabel("blocks held")
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    axes.flat[0].legend(title="group", fontsize=8, loc="upper left")
    fig.suptitle(title)
    _save(fig, path)


def eviction_heatmaps(path, title: str, matrices: Mapping[str, "object"]) -> None:
    """Per policy, the eviction matrix (rows: requesting group, columns: owner of the evicted
    block), cells annotated with counts; ``matrices[policy]`` is a DataFrame."""
    plt = _plt()
    names = list(matrices)
    fig, axes = plt.subplots(1, len(names), figsize=(3.6 * len(names) + 1, 3.8), squeeze=False)
    vmax = max((float(np.asarray(m).max()) for m in matrices.values()), default=1.0) or 1.0
    im = None
    for k, (ax, name) in enumerate(zip(axes.flat, names)):
        m = matrices[name]
        arr = np.asarray(m, dtype=float)
        im = ax.imshow(arr, cmap="Reds", vmin=0, vmax=vmax)
        ax.set_xticks(range(arr.shape[1]), list(m.columns), rotation=45, ha="right")
        ax.set_yticks(range(arr.shape[0]), list(m.index) if k == 0 else [])
        for i in range(arr.shape[0]):
            for j in range(arr.shape[1]):
                ax.text(j, i, f"{int(arr[i, j])}", ha="center", va="center", fontsize=7,
                        color="white" if arr[i, j] > 0.6 * vmax else "black")
        ax.set_title(name)
        ax.set_xlabel("owner of evicted block")
        if k == 0:
            ax.set_ylabel("requesting group")
    if im is not None:
        fig.colorbar(im, ax=list(axes.flat), shrink=0.8, label="evicted blocks")
    fig.suptitle(title)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png", bbox_inches="tight")
    plt.close(fig)


def ttft_cdfs(path, title: str, quantiles: Mapping[str, Sequence[float]],
              percentiles: Sequence[float], xlabel: str = "TTFT (s)") -> None:
    """TTFT CDFs, one line per policy, from stored quantiles (``quantiles[policy][i]`` is the
    ``percentiles[i]``-th percentile), log time axis."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.4))
    for name, q in quantiles.items():
        q = np.asarray(q, dtype=float)
        if q.size:
            ax.plot(q, np.asarray(percentiles) / 100.0, label=name)
    ax.set_xscale("log")
    # math text is off (names are drawn as written), so the log axis's default 10^k labels
    # would show as raw TeX: plain numbers instead
    from matplotlib.ticker import FuncFormatter, NullFormatter

    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1)
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(title)
    ax.legend(title="policy", fontsize=8)
    _save(fig, path)


def policy_comparison(path, title: str, summaries: Mapping[str, Mapping[str, float]],
                      occupancy: Mapping[str, tuple[np.ndarray, np.ndarray]],
                      focus_group: str, tenants=None, max_tenants: int = 16) -> None:
    """One run's policies side by side: hit ratio and P95 TTFT of the judged population per
    policy, and the blocks ``focus_group`` occupies over time under each policy; with
    ``tenants``, a second row: each tenant's hit ratio and P95 TTFT under each policy.

    Args:
        summaries: policy -> its run summary (`prefixshield.simulator.metrics.summarize`:
            ``population``, ``hit_ratio``, ``p95_ttft_s``).
        occupancy: policy -> ``(times, blocks)``: the blocks ``focus_group`` held, a step
            function over simulated time.
        tenants: a per-tenant frame (`prefixshield.experiments.tenant_view.tenant_frame`:
            ``policy``, ``group``, ``requests``, ``hit_ratio``, ``p95_ttft_s``), or None; the
            tenants are drawn in the order of their first rows (``by_tenant``'s order: this
            module draws, it does not read the experiments' tables).
        max_tenants: the busiest tenants drawn (the title says how many are left out).
    """
    plt = _plt()
    names = list(summaries)
    rows = 2 if tenants is not None and len(tenants) else 1
    fig = plt.figure(figsize=(15, 4.2 * rows))
    grid = fig.add_gridspec(rows, 4)
    axes = [fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1]),
            fig.add_subplot(grid[0, 2:])]
    pop = summaries[names[0]]["population"] if names else "all"
    x = np.arange(len(names))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    axes[0].bar(x, [100 * summaries[p]["hit_ratio"] for p in names], color=colors[: len(names)])
    axes[0].set_ylabel(f"mean hit fraction of {pop} requests (%)")
    axes[0].set_ylim(0, 100)
    axes[1].bar(x, [summaries[p]["p95_ttft_s"] for p in names], color=colors[: len(names)])
    axes[1].set_ylabel(f"P95 TTFT of {pop} requests (s)")
    long = sum(len(p) for p in names) > 24  # names that would run into each other
    for ax in axes[:2]:
        ax.set_xticks(x, names, rotation=25 if long else 0, ha="right" if long else "center")
    for i, p in enumerate(names):
        t, blocks = occupancy[p]
        axes[2].step(t, blocks, where="post", label=p, color=colors[i % len(colors)])
    axes[2].set_xlabel("simulated time (s)")
    axes[2].set_ylabel(f"blocks held by group '{focus_group}'")
    axes[2].set_ylim(0, None)
    axes[2].legend(title="policy")
    if rows == 2:
        _tenant_bars(fig, grid, tenants, names, colors, max_tenants)
    fig.suptitle(title)
    _save(fig, path)


def _tenant_bars(fig, grid, tenants, names, colors, max_tenants: int) -> None:
    """The per-tenant row of `policy_comparison`: grouped bars, one group per tenant
    (the busiest ``max_tenants``), one bar per policy."""
    req = tenants.groupby("group", sort=False)["requests"].max()
    order = list(dict.fromkeys(tenants["group"]))
    if len(order) > max_tenants:
        keep = set(req.sort_values(ascending=False, kind="stable").index[:max_tenants])
        order = [g for g in order if g in keep]
    left = len(req) - len(order)
    w = 0.8 / max(len(names), 1)
    xs = np.arange(len(order))
    for j, (metric, label, scale) in enumerate((("hit_ratio", "hit ratio (%)", 100.0),
                                                ("p95_ttft_s", "P95 TTFT (s)", 1.0))):
        ax = fig.add_subplot(grid[1, 2 * j:2 * j + 2])
        for i, p in enumerate(names):
            sub = tenants[tenants["policy"] == p].set_index("group")
            vals = [scale * float(sub[metric].get(g, np.nan)) for g in order]
            ax.bar(xs + (i - (len(names) - 1) / 2) * w, vals, w, label=p,
                   color=colors[i % len(colors)])
        ax.set_xticks(xs, order, rotation=30 if len(order) > 6 else 0, ha="right"
                      if len(order) > 6 else "center")
        ax.set_ylabel(f"{label} of the tenant's measured requests")
        ax.set_title(f"per tenant: {label}" + (f" ({left} smaller tenants not drawn)"
                                               if left else ""))
        if metric == "hit_ratio":
            ax.set_ylim(0, 100)
        # beside the axes: bars of every height stay visible
        ax.legend(title="policy", fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
