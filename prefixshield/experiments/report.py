"""Tables (Markdown and CSV), figures (PNG) and ``index.md``, rebuilt from a store's cells alone.

``build_report(store)`` is what ``prefixshield report DIR`` runs and what ``sweep`` and
``reproduce`` run when their cells are done. A store made by ``reproduce`` gets the evaluation's
sections (attack, benign, borrowing, sweeps, ablations, overhead); any other store one section per
experiment (paired table, gain against each swept field, occupancy, evictions, TTFT CDF).
CSV files hold the numbers (fractions, seconds); Markdown files the same rounded for reading.
"hit ratio" is the mean over the judged requests of cached / prompt tokens (vLLM's per-request
definition); "token hit ratio" is cached over prompt tokens summed over them (what trace studies
publish).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from prefixshield.atomic import write_text, write_with
from prefixshield.experiments import analysis as A
from prefixshield.experiments.cells import TTFT_QUANTILES
from prefixshield.experiments.spec import Experiment
from prefixshield.experiments.store import ResultsStore


@dataclass
class Table:
    """A report table: ``display`` (strings, for Markdown and the terminal) and ``data`` (the
    numbers, for CSV)."""

    name: str
    title: str
    display: pd.DataFrame
    data: pd.DataFrame
    notes: list[str] = field(default_factory=list)


@dataclass
class Section:
    """A report section: its tables and figures (paths relative to the store)."""

    name: str
    title: str
    tables: list[Table] = field(default_factory=list)
    figures: list[tuple[str, str]] = field(default_factory=list)  # (relative path, caption)
    notes: list[str] = field(default_factory=list)


def markdown_table(df: pd.DataFrame) -> str:
    """A GitHub-flavoured Markdown table of ``df`` (strings as they are)."""
    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for _, r in df.iterrows():
        lines.append("| " + " | ".join(str(v).replace("|", "\\|") for v in r.tolist()) + " |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------ helpers
def _title(exp: Experiment) -> str:
    return exp.title or f"{exp.name}: {exp.workload}"


def _first_point(exp: Experiment):
    return exp.points()[0]


def _cells_at(cells: pd.DataFrame, exp: Experiment, point_id: str) -> pd.DataFrame:
    sub = cells[(cells["experiment"] == exp.name) & (cells["point"] == point_id)]
    return A.ok_cells(sub)


def _diff_str(row: pd.Series, m: str, base: bool, scale=100.0, digits=2) -> str:
    if base:
        return "baseline"
    return A.fmt_ci(row[f"{m}_diff"], row[f"{m}_ci_low"], row[f"{m}_ci_high"], scale, digits)


def _failed_note(row: pd.Series) -> str:
    return f"failed ({int(row['failed'])} runs): {row['error']}" if row["failed"] else ""


def _occupancy_fig(root: Path, cells: pd.DataFrame, exp: Experiment, name: str,
                   section: Section, point=None) -> None:
    from prefixshield.figures import stacked_occupancy

    point = point or _first_point(exp)
    at = _cells_at(cells, exp, point.id)
    if at.empty:
        return
    seed = int(at["seed"].min())
    panels = {r["policy"]: A.detail(r, "occupancy_json")
              for _, r in at[at["seed"] == seed].iterrows()}
    blocks = point.settings.get("blocks", 512)
    rel = f"figures/{name}-occupancy.png"
    stacked_occupancy(root / rel, f"{_title(exp)}: blocks held per group, seed {seed}"
                      + (f" ({point.label()})" if point.values else ""), panels,
                      capacity=int(blocks) - 1)
    section.figures.append((rel, f"Blocks each group holds over time under each policy "
                                 f"(stacked; dotted line: {int(blocks) - 1} usable blocks), "
                                 f"seed {seed}."))


def _evictions_fig(root: Path, cells: pd.DataFrame, exp: Experiment, name: str,
                   section: Section, point=None) -> None:
    from prefixshield.figures import eviction_heatmaps

    point = point or _first_point(exp)
    at = _cells_at(cells, exp, point.id)
    if at.empty:
        return
    mats = {}
    for label in exp.policies:
        rows = at[at["policy"] == label]
        if len(rows):
            mats[label] = sum(A.evictions_of(r) for _, r in rows.iterrows())
    rel = f"figures/{name}-evictions.png"
    eviction_heatmaps(root / rel, f"{_title(exp)}: who evicted whose blocks "
                                  f"(summed over {at['seed'].nunique()} seeds)", mats)
    section.figures.append((rel, "Eviction matrix per policy: cached blocks reclaimed by each "
                                 "requesting group (rows) from each owner (columns), summed "
                                 "over seeds."))


def _ttft_fig(root: Path, cells: pd.DataFrame, exp: Experiment, name: str,
              section: Section, point=None) -> None:
    from prefixshield.figures import ttft_cdfs

    point = point or _first_point(exp)
    at = _cells_at(cells, exp, point.id)
    if at.empty:
        return
    qs = {}
    for label in exp.policies:
        rows = [A.detail(r, "ttft_quantiles_json") for _, r in at[at["policy"] == label].iterrows()]
        rows = [np.array([np.nan if v is None else v for v in q], dtype=float)
                for q in rows if q]
        if rows:
            qs[label] = np.nanmean(np.vstack(rows), axis=0)
    pop = at["population"].iloc[0]
    rel = f"figures/{name}-ttft-cdf.png"
    ttft_cdfs(root / rel, f"{_title(exp)}: TTFT of {pop} requests "
                          f"(quantiles averaged over {at['seed'].nunique()} seeds)", qs,
              TTFT_QUANTILES)
    section.figures.append((rel, f"TTFT distribution of the judged ({pop}) requests per "
                                 "policy; each quantile is the mean of that quantile over "
                                 "seeds."))


def _bars_fig(root: Path, rel: str, title: str, cats: list[str],
              per_cat_cells: list[pd.DataFrame], policies, metric="hit_ratio",
              ylabel="mean hit fraction of judged requests (%)") -> None:
    from prefixshield.figures import bars_with_ci

    values = {}
    for label in policies:
        values[label] = [A.mean_ci(c.loc[c["policy"] == label, metric].to_numpy(float))
                         for c in per_cat_cells]
    bars_with_ci(root / rel, title, cats, values, ylabel,
                 note="bars: mean over seeds; whiskers: 95% bootstrap CI of the mean")


# ------------------------------------------------------------------------------ generic
def experiment_section(root: Path, cells: pd.DataFrame, exp: Experiment) -> Section:
    """The generic section of one experiment: paired table, gain against each swept field (or
    bars without a grid), occupancy, evictions and TTFT CDF at the first point."""
    if exp.kind == "overhead":
        return overhead_section(root, cells, [exp])
    sec = Section(exp.name, _title(exp))
    g = A.paired_gains(cells, exp)
    base = exp.baseline_policy
    disp = pd.DataFrame({
        "point": g["point_label"], "policy": g["policy"], "runs": g["runs"],
        "hit ratio": g["hit_ratio_mean"].map(A.fmt_pct),
        f"vs {base} (pp)": [_diff_str(r, "hit_ratio", r["policy"] == base)
                            for _, r in g.iterrows()],
        "token hit ratio": g["token_hit_ratio_mean"].map(A.fmt_pct),
        "P95 TTFT (s)": g["p95_ttft_s_mean"].map(A.fmt_num),
        f"vs {base} (s)": [_diff_str(r, "p95_ttft_s", r["policy"] == base, 1.0, 3)
                           for _, r in g.iterrows()],
        "note": [_failed_note(r) for _, r in g.iterrows()],
    })
    if not exp.grid:
        disp = disp.drop(columns=["point"])
    sec.tables.append(Table(exp.name, sec.title, disp, g))
    if exp.grid:
        from prefixshield.figures import sweep_curves

        for key, values in exp.grid:
            others = [k for k in exp.grid_keys if k != key]
            series = {}
            for label in exp.policies:
                if label == base:
                    continue
                sub = g[g["policy"] == label]
                combos = sub.groupby([f"grid.{k}" for k in others], sort=False) if others \
                    else [((), sub)]
                for combo, rows in combos:
                    combo = combo if isinstance(combo, tuple) else (combo,)
                    tag = ", ".join(f"{k}={v}" for k, v in zip(others, combo))
                    series[label + (f" ({tag})" if tag else "")] = [
                        (r["hit_ratio_diff"], r["hit_ratio_ci_low"], r["hit_ratio_ci_high"])
                        for _, r in rows.iterrows()]
            from prefixshield.experiments.spec import value_text

            if not series:
                continue  # only the baseline: no difference to draw
            rel = f"figures/{exp.name}-gain-vs-{key}.png"
            sweep_curves(root / rel, f"{_title(exp)}: hit-ratio gain vs {base}",
                         key, [value_text(v) for v in values], series,
                         f"paired hit-ratio difference vs {base} (pp)",
                         note=f"mean over {len(exp.seeds)} paired seeds; whiskers: 95% "
                              "bootstrap CI")
            sec.figures.append((rel, f"Paired hit-ratio difference of each policy to {base} "
                                     f"against {key}, with 95% CIs."))
    else:
        at = A.ok_cells(cells[cells["experiment"] == exp.name])
        rel = f"figures/{exp.name}-hit-ratio.png"
        _bars_fig(root, rel, f"{_title(exp)}: hit ratio", [exp.workload], [at],
                  exp.policies)
        sec.figures.append((rel, "Mean hit ratio per policy with 95% CI whiskers."))
    _occupancy_fig(root, cells, exp, exp.name, sec)
    _evictions_fig(root, cells, exp, exp.name, sec)
    _ttft_fig(root, cells, exp, exp.name, sec)
    return sec


# ------------------------------------------------------------------------------ reproduce
def attack_section(root: Path, cells: pd.DataFrame, exps: list[Experiment]) -> Section:
    """Attack table: hit ratio and P95 TTFT of the victim under attack and in the no-attack
    control, paired differences to LRU, measured attacker pressure and debt."""
    sec = Section("attack", "Attack workloads (victim requests), with no-attack controls")
    disp_rows, data_rows, cats, per_cat = [], [], [], []
    for exp in exps:
        g = A.paired_gains(cells, exp, metrics=A.HEADLINE + ("attacker_pressure_ratio",
                                                              "attacker_mean_debt_blocks"))
        att = g[g["grid.attack"] == True]  # noqa: E712
        ctl = g[g["grid.attack"] == False]  # noqa: E712
        base = exp.baseline_policy
        for (_, a), (_, c) in zip(att.iterrows(), ctl.iterrows()):
            is_base = a["policy"] == base
            disp_rows.append({
                "workload": exp.workload, "policy": a["policy"],
                "hit ratio": A.fmt_pct(a["hit_ratio_mean"]),
                f"vs {base} (pp)": _diff_str(a, "hit_ratio", is_base),
                "token hit ratio": A.fmt_pct(a["token_hit_ratio_mean"]),
                "P95 TTFT (s)": A.fmt_num(a["p95_ttft_s_mean"]),
                f"vs {base} (s)": _diff_str(a, "p95_ttft_s", is_base, 1.0, 3),
                "control hit ratio": A.fmt_pct(c["hit_ratio_mean"]),
                f"control vs {base} (pp)": _diff_str(c, "hit_ratio", is_base),
                "attacker pressure": A.fmt_num(a["attacker_pressure_ratio_mean"], ".2f"),
                "attacker debt (blocks)": A.fmt_num(a["attacker_mean_debt_blocks_mean"], ".0f"),
                "note": _failed_note(a) or _failed_note(c)})
            data_rows.append({"workload": exp.workload, **{f"attack.{k}": v for k, v in a.items()},
                              **{f"control.{k}": v for k, v in c.items()}})
        cats.append(exp.workload)
        pt = [p for p in exp.points() if p.values["attack"]][0]
        per_cat.append(_cells_at(cells, exp, pt.id))
    sec.tables.append(Table("attack", sec.title, pd.DataFrame(disp_rows),
                            pd.DataFrame(data_rows), notes=[
        "attacker pressure: blocks the attacker materialized per second of the pressure window "
        "over its contract's refill (measured); debt: its time-weighted mean token-bucket debt "
        "over the window. Control: the same trace with the attacker silent (still configured)."]))
    if exps:
        _bars_fig(root, "figures/attack-hit-ratio.png", "Victim hit ratio under attack", cats,
                  per_cat, exps[0].policies)
        sec.figures.append(("figures/attack-hit-ratio.png",
                            "Victim hit ratio per attack workload and policy (mean over seeds, "
                            "95% CI whiskers)."))
        first = exps[0]
        pt = [p for p in first.points() if p.values["attack"]][0]
        _occupancy_fig(root, cells, first, "attack-" + first.workload, sec, pt)
        _evictions_fig(root, cells, first, "attack-" + first.workload, sec, pt)
        _ttft_fig(root, cells, first, "attack-" + first.workload, sec, pt)
    return sec


def benign_section(root: Path, cells: pd.DataFrame, exps: list[Experiment]) -> Section:
    """Benign table: mean hit ratio (all measured requests), token-weighted hit ratio, P95 TTFT,
    paired differences to LRU; a policy that cannot serve the trace is listed with its reason."""
    sec = Section("benign", "Benign multi-tenant workloads (all measured requests)")
    disp_rows, data, cats, per_cat = [], [], [], []
    for exp in exps:
        g = A.paired_gains(cells, exp)
        base = exp.baseline_policy
        for _, r in g.iterrows():
            is_base = r["policy"] == base
            disp_rows.append({
                "workload": exp.workload, "policy": r["policy"],
                "hit ratio": A.fmt_pct(r["hit_ratio_mean"]),
                f"vs {base} (pp)": _diff_str(r, "hit_ratio", is_base),
                "token hit ratio": A.fmt_pct(r["token_hit_ratio_mean"]),
                "P95 TTFT (s)": A.fmt_num(r["p95_ttft_s_mean"]),
                f"vs {base} (s)": _diff_str(r, "p95_ttft_s", is_base, 1.0, 3),
                "note": _failed_note(r)})
        data.append(g.assign(workload=exp.workload))
        cats.append(exp.workload)
        per_cat.append(A.ok_cells(cells[cells["experiment"] == exp.name]))
    sec.tables.append(Table("benign", sec.title, pd.DataFrame(disp_rows),
                            pd.concat(data, ignore_index=True) if data else pd.DataFrame()))
    if exps:
        _bars_fig(root, "figures/benign-hit-ratio.png", "Benign hit ratio", cats, per_cat,
                  exps[0].policies)
        sec.figures.append(("figures/benign-hit-ratio.png",
                            "Hit ratio of all measured requests per benign workload and policy "
                            "(mean over seeds, 95% CI whiskers)."))
        _ttft_fig(root, cells, exps[0], "benign-" + exps[0].workload, sec)
    return sec


def borrowing_section(root: Path, cells: pd.DataFrame, exps: list[Experiment]) -> Section:
    """Borrowing table: the active group's hit ratio, steady (time-weighted mean over the
    measured window) and peak occupancy in blocks, for every policy, LRU included."""
    sec = Section("borrowing", "Borrowing: an active tenant beside an idle one")
    for exp in exps:
        g = A.paired_gains(cells, exp)
        base = exp.baseline_policy
        rows, data = [], []
        for _, r in g.iterrows():
            at = _cells_at(cells, exp, r["point"])
            mine = at[at["policy"] == r["policy"]]
            active = [A.group_row(c, "active") for _, c in mine.iterrows()]
            idle = [A.group_row(c, "idle") for _, c in mine.iterrows()]
            steady = float(np.mean([a["mean_blocks"] for a in active])) if active else np.nan
            peak = float(np.mean([a["peak_blocks"] for a in active])) if active else np.nan
            idle_peak = float(np.mean([a["peak_blocks"] for a in idle])) if idle else np.nan
            rows.append({"policy": r["policy"], "hit ratio": A.fmt_pct(r["hit_ratio_mean"]),
                         f"vs {base} (pp)": _diff_str(r, "hit_ratio", r["policy"] == base),
                         "token hit ratio": A.fmt_pct(r["token_hit_ratio_mean"]),
                         "active steady occupancy (blocks)": A.fmt_num(steady, ".0f"),
                         "active peak occupancy (blocks)": A.fmt_num(peak, ".0f"),
                         "idle peak occupancy (blocks)": A.fmt_num(idle_peak, ".0f"),
                         "note": _failed_note(r)})
            data.append({**r.to_dict(), "active_steady_blocks": steady,
                         "active_peak_blocks": peak, "idle_peak_blocks": idle_peak})
        sec.tables.append(Table("borrowing", sec.title, pd.DataFrame(rows), pd.DataFrame(data),
                                notes=["steady occupancy: time-weighted mean of the active "
                                       "group's blocks over the measured window, averaged over "
                                       "seeds; peak: its maximum, averaged over seeds."]))
        _occupancy_fig(root, cells, exp, "borrowing", sec)
    return sec


def sweeps_section(root: Path, cells: pd.DataFrame, exps: list[Experiment]) -> Section:
    """The capacity, pressure, load and profile sweeps: per point, each policy's hit ratio and
    paired gain to LRU, and (pressure) the measured pressure ratio; one gain curve per sweep."""
    from prefixshield.experiments.spec import value_text
    from prefixshield.figures import sweep_curves

    sec = Section("sweeps", "Sweeps: capacity, creation pressure, load, profile")
    for exp in exps:
        metrics = A.HEADLINE + ("attacker_pressure_ratio", "attacker_mean_debt_blocks")
        g = A.paired_gains(cells, exp, metrics=metrics)
        key = exp.grid_keys[0]
        base = exp.baseline_policy
        rows = []
        for _, r in g.iterrows():
            row = {key: r[f"grid.{key}"] if not isinstance(r[f"grid.{key}"], float)
                   else value_text(r[f"grid.{key}"]),
                   "policy": r["policy"], "hit ratio": A.fmt_pct(r["hit_ratio_mean"]),
                   f"gain vs {base} (pp)": _diff_str(r, "hit_ratio", r["policy"] == base),
                   "token hit ratio": A.fmt_pct(r["token_hit_ratio_mean"]),
                   "P95 TTFT (s)": A.fmt_num(r["p95_ttft_s_mean"]),
                   "measured pressure": A.fmt_num(r["attacker_pressure_ratio_mean"], ".2f")}
            if key == "pressure_ratio":  # the reference's sweep reports the attacker's debt
                row["attacker mean debt (blocks)"] = A.fmt_num(
                    r["attacker_mean_debt_blocks_mean"], ".1f")
            rows.append({**row, "note": _failed_note(r)})
        sec.tables.append(Table(exp.name, exp.title, pd.DataFrame(rows), g))
        series = {label: [(r["hit_ratio_diff"], r["hit_ratio_ci_low"], r["hit_ratio_ci_high"])
                          for _, r in g[g["policy"] == label].iterrows()]
                  for label in exp.policies if label != base}
        rel = f"figures/{exp.name}.png"
        sweep_curves(root / rel, f"{exp.title}: hit-ratio gain vs {base}", key,
                     [value_text(v) for v in dict(exp.grid)[key]], series,
                     f"paired victim hit-ratio difference vs {base} (pp)",
                     note=f"mean over {len(exp.seeds)} paired seeds; whiskers: 95% bootstrap CI")
        sec.figures.append((rel, f"{exp.title}: paired gain of each policy over {base}, "
                                 "with 95% CIs."))
    return sec


def segmentation_section(root: Path, cells: pd.DataFrame, exps: list[Experiment]) -> Section:
    """Segmentation ablation per workload: PrefixShield with and without retention classes,
    each against LRU and against each other (paired, 95% CI)."""
    from prefixshield.simulator.metrics import paired_difference

    sec = Section("ablation-segmentation", "Ablation: PrefixShield's retention classes")
    rows, data = [], []
    for exp in exps:
        pt = _first_point(exp)
        at = _cells_at(cells, exp, pt.id)
        piv = at.pivot(index="seed", columns="policy", values="hit_ratio")
        ps, nos = "prefixshield", "prefixshield:segmentation=false"
        rec = {"workload": exp.workload}
        disp = {"workload": exp.workload}
        for label in exp.policies:
            v = piv[label].mean() if label in piv else np.nan
            rec[f"{label}_hit_ratio"] = v
            disp[f"{label} hit ratio"] = A.fmt_pct(v)
        for a, b in ((ps, "lru"), (nos, "lru"), (ps, nos)):
            key = f"{a} - {b}"
            if a in piv and b in piv:
                both = piv[[a, b]].dropna()
                d = paired_difference(both[a].to_numpy(), both[b].to_numpy(),
                                      n_resamples=A.N_RESAMPLES)
                rec[key] = d["mean_diff"]
                rec[key + " ci_low"] = d["ci_low"]
                rec[key + " ci_high"] = d["ci_high"]
                disp[f"{key} (pp)"] = A.fmt_ci(d["mean_diff"], d["ci_low"], d["ci_high"])
            else:
                disp[f"{key} (pp)"] = "-"
        rows.append(disp)
        data.append(rec)
    sec.tables.append(Table("ablation-segmentation", sec.title, pd.DataFrame(rows),
                            pd.DataFrame(data), notes=[
        "prefixshield:segmentation=false keeps debt, gate and responsibility but one retention "
        "class (plain LRU within a group). Differences are paired over seeds, 95% CI."]))
    return sec


def delayed_replay_section(root: Path, cells: pd.DataFrame, exps: list[Experiment]) -> Section:
    """Delayed-replay ablation: at each wait (x the designed clearance time), the attacker's
    promoted and gated blocks, the evictions the neutral phase caused by owner (attacker,
    victim, background groups), with the gate on and off, and the victim's hit ratio on the
    judged population (the measured pass after the neutral phase), on, off and on - off
    (paired, 95% CI)."""
    from prefixshield.simulator.metrics import paired_difference
    from prefixshield.workloads import make_params

    sec = Section("ablation-delayed-replay", "Ablation: the debt gate under delayed replay")
    on, off = "prefixshield", "prefixshield:debt_gate=false"
    rows, data = [], []
    for exp in exps:
        p = make_params("delayed_replay")
        neutral, victim, attacker = p.neutral_group, p.victim_group, p.attacker_group
        for pt in exp.points():
            at = _cells_at(cells, exp, pt.id)
            rec = {"wait_factor": pt.values["wait_factor"]}

            def per(label, what):
                vals = []
                for _, c in at[at["policy"] == label].iterrows():
                    st = A.detail(c, "policy_stats_json")
                    if what == "promoted":
                        vals.append(st.get("promotions_granted", {}).get(attacker, np.nan))
                        continue
                    if what == "gated":
                        vals.append(st.get("promotions_gated", {}).get(attacker, np.nan))
                        continue
                    ev = A.evictions_of(c)
                    if neutral not in ev.index:
                        continue
                    row = ev.loc[neutral]  # what the neutral phase's requests evicted
                    if what == "background":
                        vals.append(float(row.drop([g for g in (neutral, victim, attacker)
                                                    if g in row.index]).sum()))
                    elif what in row.index:
                        vals.append(float(row[what]))
                return float(np.mean(vals)) if vals else np.nan

            for label, tag in ((on, "gate on"), (off, "gate off")):
                for what in ("promoted", "gated", "attacker", "victim", "background"):
                    rec[f"{tag} {what}"] = per(label, what)
            piv = at.pivot(index="seed", columns="policy", values="hit_ratio")
            for label, tag in ((on, "gate on"), (off, "gate off"), ("lru", "lru")):
                rec[f"{tag} victim hit"] = float(piv[label].mean()) if label in piv else np.nan
            if on in piv and off in piv:
                both = piv[[on, off]].dropna()
                d = paired_difference(both[on].to_numpy(), both[off].to_numpy(),
                                      n_resamples=A.N_RESAMPLES)
            else:
                d = {"mean_diff": np.nan, "ci_low": np.nan, "ci_high": np.nan}
            rec.update({"victim gap": d["mean_diff"], "victim gap ci_low": d["ci_low"],
                        "victim gap ci_high": d["ci_high"]})
            data.append(rec)

            def two(what, fmt=".1f"):
                return (f"{A.fmt_num(rec['gate on ' + what], fmt)} / "
                        f"{A.fmt_num(rec['gate off ' + what], fmt)}")
            rows.append({"wait (x clearance)": f"{pt.values['wait_factor']:g}",
                         "promoted, on / off": two("promoted", ".1f"),
                         "gated, on / off": two("gated", ".1f"),
                         "neutral phase evicted: attacker-owned, on / off": two("attacker"),
                         "victim-owned, on / off": two("victim"),
                         "background-owned, on / off": two("background"),
                         "victim hit on the pass, on / off / LRU":
                             f"{A.fmt_pct(rec['gate on victim hit'])} / "
                             f"{A.fmt_pct(rec['gate off victim hit'])} / "
                             f"{A.fmt_pct(rec['lru victim hit'])}",
                         "victim hit ratio, on - off (pp)":
                             A.fmt_ci(d["mean_diff"], d["ci_low"], d["ci_high"])})
    sec.tables.append(Table("ablation-delayed-replay", sec.title, pd.DataFrame(rows),
                            pd.DataFrame(data), notes=[
        "promoted / gated: the attacker's reuse promotions granted / refused by the gate (mean "
        "blocks per run); neutral phase evicted: cached blocks the neutral group's requests "
        "reclaimed, by owner (mean per run); victim hit: over the judged population, the "
        "victim's measured pass over its hot prefixes after the neutral phase (its requests "
        "before are not measured)."]))
    return sec


def _reading_cases(cells: pd.DataFrame, exp: Experiment) -> list[tuple[str, pd.DataFrame, str]]:
    """``(case label, hit-ratio pivot (seed x policy), baseline policy)`` per point of ``exp``."""
    out = []
    for pt in exp.points():
        at = _cells_at(cells, exp, pt.id)
        blocks = pt.settings.get("blocks", exp.base.get("blocks", 512))
        out.append((f"{exp.workload} {blocks:,} blocks",
                    at.pivot(index="seed", columns="policy", values="hit_ratio"),
                    exp.policies[0]))
    return out


def _reading_gap(piv: pd.DataFrame, spec: str, other: str, data: list, reading: str,
                 case: str) -> str:
    """``spec - other`` on the seeds of ``piv`` both served (paired, 95% CI), its row appended
    to ``data`` as ``reading``/``case``; the CI as the table shows it."""
    from prefixshield.simulator.metrics import paired_difference

    both = piv[[spec, other]].dropna()
    d = paired_difference(both[spec].to_numpy(), both[other].to_numpy(),
                          n_resamples=A.N_RESAMPLES)
    data.append({"reading": reading, "case": case, "against": other,
                 "mean_diff": d["mean_diff"], "ci_low": d["ci_low"], "ci_high": d["ci_high"],
                 "seeds": len(both)})
    return A.fmt_ci(d["mean_diff"], d["ci_low"], d["ci_high"])


def readings_section(root: Path, cells: pd.DataFrame, exps: list[Experiment]) -> Section:
    """How much each reading of PrefixShield's open choices moves the results: per case (a
    workload at a pool size), every reading's hit-ratio difference to the case's baseline, and
    to the default reading, paired over seeds (95% CI)."""
    from prefixshield.experiments.reproduce import READINGS, WORKLOAD_READINGS

    sec = Section("readings", "PrefixShield's readings: which open choices move the results")
    default = READINGS[0][0]
    columns: list[tuple[str, pd.DataFrame, str]] = []   # (case label, hit pivot, baseline)
    workload_cols: dict[str, list] = {}                 # reading key -> its columns
    for exp in exps:
        if exp.name.startswith("readings-workload-"):
            key = next(k for k, _, _ in WORKLOAD_READINGS
                       if exp.name.startswith(f"readings-workload-{k}-"))
            workload_cols.setdefault(key, []).extend(_reading_cases(cells, exp))
        else:
            columns.extend(_reading_cases(cells, exp))
    rows, data = [], []
    for spec, what in READINGS:
        disp = {"reading": what, "policy spec": spec}
        for label, piv, baseline in columns:
            for other, key in ((baseline, f"{label}: - {baseline}"),
                               (default, f"{label}: - default")):
                if spec == other:
                    continue
                disp[f"{key} (pp)"] = (_reading_gap(piv, spec, other, data, spec, label)
                                       if spec in piv and other in piv else "-")
        rows.append(disp)
    for key, _, what in WORKLOAD_READINGS:
        disp = {"reading": what, "policy spec": default}
        for label, piv, baseline in workload_cols.get(key, []):
            if default in piv and baseline in piv:
                disp[f"{label}: - {baseline} (pp)"] = _reading_gap(
                    piv, default, baseline, data, f"workload:{key}", label)
        if workload_cols.get(key):
            rows.append(disp)
    sec.tables.append(Table("readings", sec.title, pd.DataFrame(rows).fillna("-"),
                            pd.DataFrame(data), notes=[
        "Each row runs PrefixShield under one reading of a choice its design leaves open; every "
        "other parameter is the default. '- baseline' is the hit-ratio difference to the case's "
        "baseline policy (LRU under attack, S3-FIFO on ShareGPT: the victim's mean hit ratio, "
        "all requests' on ShareGPT); '- default' the difference to the default reading (first "
        "row). Percentage points, paired over seeds, 95% bootstrap CI. A 'workload:' row "
        "runs the default PrefixShield and the baseline on another reading of the workload "
        "(its traces differ from the default's, so it has no '- default' column)."]))
    return sec


def capacity_readings_section(root: Path, cells: pd.DataFrame,
                              exps: list[Experiment]) -> Section:
    """How the capacity sweep's hot set grows, read several ways: per reading, the victim
    working set (% of usable blocks), LRU's and PrefixShield's hit ratios and PrefixShield -
    LRU (paired, 95% CI) at every capacity."""
    from prefixshield.experiments.reproduce import CAPACITY_READINGS
    from prefixshield.workloads import make_params

    sec = Section("readings-capacity", "Capacity readings: how the hot set grows with the cache")
    what = {f"readings-capacity-{k}": (k, fields, w) for k, fields, w in CAPACITY_READINGS}
    rows, data = [], []
    for exp in exps:
        key, fields, label = what[exp.name]
        g = A.paired_gains(cells, exp)
        disp = {"reading": label}
        for _, r in g[g["policy"] == "prefixshield"].iterrows():
            blocks = int(r["grid.blocks"])
            p = make_params("one_touch", num_blocks=blocks, **fields)
            hot = p.hot_prefixes * ((p.prefix_tokens + p.template_tokens) // p.block_size)
            lru = g[(g["policy"] == "lru") & (g["grid.blocks"] == r["grid.blocks"])]
            lru_hit = float(lru["hit_ratio_mean"].iloc[0]) if len(lru) else np.nan
            data.append({"reading": key, "blocks": blocks,
                         "working_set_pct": 100 * hot / p.usable_blocks,
                         "lru_hit_ratio": lru_hit, "prefixshield_hit_ratio": r["hit_ratio_mean"],
                         "mean_diff": r["hit_ratio_diff"], "ci_low": r["hit_ratio_ci_low"],
                         "ci_high": r["hit_ratio_ci_high"]})
            disp[f"{blocks:,}: working set"] = f"{100 * hot / p.usable_blocks:.1f}%"
            disp[f"{blocks:,}: LRU / PS"] = (f"{A.fmt_pct(lru_hit)} / "
                                            f"{A.fmt_pct(r['hit_ratio_mean'])}")
            disp[f"{blocks:,}: PS - LRU (pp)"] = _diff_str(r, "hit_ratio", False)
        rows.append(disp)
    sec.tables.append(Table("readings-capacity", sec.title, pd.DataFrame(rows),
                            pd.DataFrame(data), notes=[
        "one_touch at each capacity with C_prefill of the reference pool (the same rates and "
        "attack window at every size); working set: the victim's hot blocks over the usable "
        "ones (the reference: 76.6% at 1,024-4,096). PS - LRU: paired over seeds, 95% "
        "bootstrap CI."]))
    return sec


def overhead_section(root: Path, cells: pd.DataFrame, exps: list[Experiment]) -> Section:
    """Overhead table: victim-selection latency (mean, P95; microseconds per select_victims(1)
    call on this machine) and policy-state bytes per block."""
    sec = Section("overhead", "Overhead: victim selection and policy state")
    rows, data = [], []
    for exp in exps:
        sub = A.ok_cells(cells[cells["experiment"] == exp.name])
        for _, r in sub.sort_values(["blocks", "groups"]).iterrows():
            rows.append({"blocks": int(r["blocks"]), "groups": int(r["groups"]),
                         "policy": r["policy"],
                         "select mean (us)": A.fmt_num(r["select_mean_us"], ".2f"),
                         "select median (us)": A.fmt_num(r["select_median_us"], ".2f"),
                         "select P95 (us)": A.fmt_num(r["select_p95_us"], ".2f"),
                         "state bytes / block": A.fmt_num(r["state_bytes_per_block"], ".1f"),
                         "hash-map entries": int(r["hash_entries"]),
                         "observability buffers (bytes)": int(r["observability_bytes"])})
            data.append({"blocks": int(r["blocks"]), "groups": int(r["groups"]),
                         "policy": r["policy"], "select_mean_us": r["select_mean_us"],
                         "select_median_us": r["select_median_us"],
                         "select_p95_us": r["select_p95_us"],
                         "state_bytes_per_block": r["state_bytes_per_block"],
                         "hash_entries": int(r["hash_entries"]),
                         "observability_bytes": int(r["observability_bytes"])})
    sec.tables.append(Table("overhead", sec.title, pd.DataFrame(rows),
                            pd.DataFrame(data), notes=[
        "Latency: wall time of one select_victims(1) call (wrapper, dispatch, kernel) on a full "
        "pool, measured on the machine that ran the cells while other cells ran beside it (not "
        "simulated; never regressed; the mean is sensitive to a busy machine, the median is "
        "not). "
        "State: numpy arrays the policy holds / configured blocks; PrefixShield's debt-over-time "
        "series is an observability buffer, listed apart."]))
    return sec


def schedulers_section(root: Path, cells: pd.DataFrame, exps: list[Experiment]) -> Section:
    """What each scheduler costs benign traffic: ShareGPT and borrowing under fcfs (the benign
    and borrowing tables' runs), vtc, the per-tenant cap and kvtc, per policy: hit ratio, P95
    TTFT and P95 queueing delay (all measured requests), and the change from fcfs with the
    same policy (mean over seeds; the traces are identical per seed)."""
    from prefixshield.experiments.reproduce import SCHEDULER_SETTINGS

    sec = Section("schedulers", "Schedulers on benign traffic (all measured requests)")
    by_name = {e.name: e for e in exps}
    rows, data = [], []
    for w, fcfs_name in (("sharegpt", "benign-sharegpt"), ("borrowing", "borrowing")):
        means = {}
        for key, label, _ in SCHEDULER_SETTINGS:
            name = fcfs_name if key == "fcfs" else f"sched-{key}-{w}"
            if name not in by_name:
                continue
            ok = A.ok_cells(cells[cells["experiment"] == name])
            means[key] = ok.groupby("policy")[["hit_ratio", "p95_ttft_s", "p95_queue_s"]].mean()
            for pol in by_name[name].policies:
                if pol not in means[key].index:
                    rows.append({"workload": w, "scheduler": label, "policy": pol,
                                 "hit ratio": "failed"})
                    continue
                m = means[key].loc[pol]
                f = means["fcfs"].loc[pol] if "fcfs" in means and pol in means["fcfs"].index \
                    else None
                rows.append({
                    "workload": w, "scheduler": label, "policy": pol,
                    "hit ratio": A.fmt_pct(m["hit_ratio"]),
                    "vs fcfs (pp)": "-" if f is None or key == "fcfs"
                    else f"{100 * (m['hit_ratio'] - f['hit_ratio']):+.2f}",
                    "P95 TTFT (s)": A.fmt_num(m["p95_ttft_s"]),
                    "vs fcfs (s)": "-" if f is None or key == "fcfs"
                    else f"{m['p95_ttft_s'] - f['p95_ttft_s']:+.3f}",
                    "P95 queue (s)": A.fmt_num(m["p95_queue_s"])})
                data.append({"workload": w, "scheduler": key, "policy": pol,
                             **{c: float(m[c]) for c in m.index}})
    sec.tables.append(Table("schedulers-benign", sec.title, pd.DataFrame(rows),
                            pd.DataFrame(data), notes=[
                                "queue: arrival to first admission. The cap: every tenant at "
                                "most that many running requests (fcfs order otherwise)."]))
    return sec


def worst_cases_section(root: Path) -> Section | None:
    """Each policy's worst case per scheduler, from the attack searches stored under
    ``root/attack-search/<key>/`` (see `worst_case_searches`):
    worst loss, held out, the victim's P95 TTFT and queueing delay, and
    per scheduler the transfer matrix (held-out seeds). None when no search is stored."""
    from prefixshield.experiments import attack_search as AS
    from prefixshield.experiments.reproduce import SCHEDULER_SETTINGS

    sec = Section("worst-cases", "Worst cases per scheduler and policy (attack search)")
    rows, budgets = [], []
    for key, label, _ in SCHEDULER_SETTINGS:
        folder = root / "attack-search" / key
        if not (folder / "store.json").exists():
            continue
        res = AS.load_result(folder)
        rows += AS.worst_case_rows(label, res)
        budgets.append(f"{label}: {AS.budget_line(res.config, res.resolved)}")
        tr = AS.transfer_table(res)
        sec.tables.append(Table(f"worst-cases-transfer-{key}",
                                f"Transfer under {label}: worst attack found against ROW, run "
                                f"against COLUMN (held-out seeds, "
                                f"{AS.loss_unit(res.config.objective)})", tr, tr))
    if not rows:
        return None
    df = pd.DataFrame(rows)
    sec.tables.insert(0, Table("worst-cases", sec.title, df, df, notes=[
        "worst loss: the victim's paired hit-ratio loss under the worst feasible attack found "
        "(search seeds; the maximum of many noisy trials is biased upwards), held-out: the same "
        "attack on held-out seeds. Per-search tables and figures: attack-search/<scheduler>/.",
        *budgets]))
    return sec


def fleet_section(root: Path, cells: pd.DataFrame, exps: list[Experiment]) -> Section:
    """Fleet table: per router and policy, the victim's hit ratio and P95 TTFT with no attack,
    under an attacker aimed at what that router reads (``fleet-aimed-<aim>``: session ids, or
    the victim's leading blocks in its prompts) and under one spreading as the router spreads
    anyone (paired seeds: the three share victim traffic; aimed and spread differ only in the
    attacker's ids or prompts). Routers no aim is run against show "-" for aimed."""
    sec = Section("fleet", "A fleet of replicas: routers against aimed and spread attackers")
    by_name = {e.name: e for e in exps}
    att, ctl = by_name.get("fleet-attack"), by_name.get("fleet-control")
    if att is None or ctl is None:
        return sec
    ga = A.paired_gains(cells, att)
    gc = A.paired_gains(cells, ctl)
    aimed_by: dict[str, tuple[str, pd.DataFrame]] = {}  # router -> (aim, its gains)
    for e in exps:
        if e.name.startswith("fleet-aimed-"):
            g = A.paired_gains(cells, e)
            for router in dict.fromkeys(g["grid.router"]):
                aimed_by[str(router)] = (str(e.base.get("aim")), g[g["grid.router"] == router])
    disp_rows, data_rows = [], []
    for _, c in gc.iterrows():
        router, pol = c["grid.router"], c["policy"]
        spread = ga[(ga["grid.router"] == router) & (ga["policy"] == pol)].iloc[0]
        aim, g = aimed_by.get(str(router), ("-", None))
        aimed = None if g is None else g[g["policy"] == pol].iloc[0]
        disp_rows.append({
            "router": router, "policy": pol, "aim": aim,
            "no attack hit": A.fmt_pct(c["hit_ratio_mean"]),
            "aimed hit": "-" if aimed is None else A.fmt_pct(aimed["hit_ratio_mean"]),
            "spread hit": A.fmt_pct(spread["hit_ratio_mean"]),
            "no attack P95 TTFT (s)": A.fmt_num(c["p95_ttft_s_mean"]),
            "aimed P95 TTFT (s)": "-" if aimed is None else A.fmt_num(aimed["p95_ttft_s_mean"]),
            "spread P95 TTFT (s)": A.fmt_num(spread["p95_ttft_s_mean"]),
            "note": _failed_note(c) or (aimed is not None and _failed_note(aimed))
            or _failed_note(spread)})
        data_rows.append({"router": router, "policy": pol, "aim": aim,
                          **{f"control.{k}": v for k, v in c.items()},
                          **({} if aimed is None else
                             {f"aimed.{k}": v for k, v in aimed.items()}),
                          **{f"spread.{k}": v for k, v in spread.items()}})
    replicas = att.base.get("replicas")
    routers = ", ".join(dict.fromkeys(str(r) for r in gc["grid.router"]))
    sec.tables.append(Table("fleet", sec.title, pd.DataFrame(disp_rows),
                            pd.DataFrame(data_rows), notes=[
        f"one_touch at its single-engine defaults served by {replicas} replicas of the "
        f"point's pool each; routers: {routers}; {len(att.seeds)} paired seeds (mean). Victim "
        "requests. spread: the attacker's own ids and prompts. aimed: session, prefix ids that "
        "the session ring sends to the victim's replicas; prefix, every prompt led by the "
        "victim's first blocks (what prefix_affinity's content tree matches; kv_aware reads "
        "the tenant-salted caches, where the lead is the attacker's own copy). '-': the router "
        "reads neither ids nor prompts, so no aim steers it: an aimed attacker is the spread "
        "one."]))
    return sec


SECTION_BUILDERS = {
    "attack": attack_section, "benign": benign_section, "borrowing": borrowing_section,
    "sweeps": sweeps_section, "ablation-segmentation": segmentation_section,
    "ablation-delayed-replay": delayed_replay_section, "readings": readings_section,
    "readings-capacity": capacity_readings_section,
    "overhead": overhead_section, "schedulers": schedulers_section, "fleet": fleet_section,
}


# ------------------------------------------------------------------------------ writing
def build_sections(store: ResultsStore, cells: pd.DataFrame | None = None) -> list[Section]:
    """The report's sections for ``store`` (figures are written as they are built); ``cells``:
    the store's cells if already loaded."""
    cells = store.load() if cells is None else cells
    root = store.root
    if store.meta.get("kind") == "reproduce":
        from prefixshield.experiments.reproduce import REPRODUCE_SECTIONS

        by_name = {e.name: e for e in store.experiments}
        out = []
        for name, exp_names in REPRODUCE_SECTIONS.items():
            exps = [by_name[n] for n in exp_names if n in by_name]
            if exps:
                out.append(SECTION_BUILDERS[name](root, cells, exps))
        worst = worst_cases_section(root)
        if worst is not None:
            out.insert(len(out) - 1 if out and out[-1].name == "overhead" else len(out), worst)
        return out
    return [experiment_section(root, cells, e) for e in store.experiments]


def build_report(store: ResultsStore) -> list[Section]:
    """Write every table (``tables/NAME.md``, ``tables/NAME.csv``), figure (``figures/``),
    ``index.md`` and the self-contained ``report.html``
    (`store_report`) of ``store`` from its cells;
    returns the sections."""
    cells = store.load()
    sections = build_sections(store, cells)
    root = store.root
    for sec in sections:
        for t in sec.tables:
            md = f"## {t.title}\n\n{markdown_table(t.display)}\n"
            if t.notes:
                md += "\n" + "\n".join(f"_{n}_" for n in t.notes) + "\n"
            write_text(root / "tables" / f"{t.name}.md", md)
            write_with(root / "tables" / f"{t.name}.csv",
                       lambda tmp, d=t.data: d.to_csv(tmp, index=False))
    write_text(root / "index.md", index_markdown(store, sections, cells))
    from prefixshield.experiments.html_report import store_report

    store_report(store, sections, cells)
    return sections


def index_markdown(store: ResultsStore, sections: list[Section], cells: pd.DataFrame) -> str:
    """``index.md``: setup, provenance, and every section's tables (inline) and figures;
    ``cells`` are the store's cells (for the counts)."""
    meta = store.meta
    prov = meta.get("provenance", {})
    n_ok = int((cells["status"] == "ok").sum()) if len(cells) else 0
    n_failed = int((cells["status"] == "failed").sum()) if len(cells) else 0
    lines = [f"# prefixshield {meta.get('kind', 'results')}", ""]
    if meta.get("command"):
        lines += [f"Command: `{meta['command']}`", ""]
    lines += [f"Cells: {n_ok} ok, {n_failed} failed (a policy that cannot serve a trace), "
              f"{store.num_cells() - n_ok - n_failed} missing, of {store.num_cells()}.", "",
              f"prefixshield {prov.get('prefixshield_version')} (git "
              f"{prov.get('git_commit') or 'unknown'}), Python {prov.get('python')}, numpy "
              f"{prov.get('numpy')}, numba {prov.get('numba')}; profiles: "
              + ", ".join(f"{k} ({v['provenance'].get('status', '?')})"
                          for k, v in meta.get("profiles", {}).items())
              + ". The exact spec and resolved config: `store.json`.", "",
              "Hit ratio: the mean over the judged requests (attack workloads: the victim's "
              "measured requests; others: all measured) of cached / prompt tokens, vLLM's "
              "per-request definition. Token hit ratio: cached over prompt tokens summed over "
              "the same requests. Differences are paired over seeds (the identical trace per "
              "seed) with 95% bootstrap CIs; `pp` = percentage points.", ""]
    lines += ["## Contents", ""]
    for sec in sections:
        lines.append(f"- [{sec.title}](#{_anchor(sec.title)})")
    lines.append("")
    for sec in sections:
        lines += [f"## {sec.title}", ""]
        for t in sec.tables:
            if len(sec.tables) > 1 or t.title != sec.title:
                lines += [f"### {t.title}", ""]
            lines += [markdown_table(t.display), "",
                      f"CSV: [tables/{t.name}.csv](tables/{t.name}.csv)", ""]
            lines += [f"_{n}_" for n in t.notes] + ([""] if t.notes else [])
        for rel, caption in sec.figures:
            lines += [f"![{caption}]({rel})", "", caption, ""]
    return "\n".join(lines)


def _anchor(title: str) -> str:
    keep = "".join(c.lower() if (c.isalnum() or c == "_") else ("-" if c in " -" else "") for c in title)
    return keep.strip("-")
