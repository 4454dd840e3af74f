"""Fit the workload parameters the reference study leaves unstated to what it observed.

Usage (from the repository root, with the project's virtual environment)::

    .venv/bin/python docs/fit_workloads.py                 # the fit behind docs/fidelity.md
    .venv/bin/python docs/fit_workloads.py --quick         # coarse grids, fewer seeds (CI-sized)
    .venv/bin/python docs/fit_workloads.py --out fit.md    # also write the final table

The reference states its setup (vLLM 0.10.2, Qwen2.5-1.5B on an L4, 512 blocks of 16 tokens,
four 1,536-token hot prefixes, alpha 0.6, the contracts, the one-touch attacker rate) but not
every workload parameter. This script searches each unstated parameter over a grid, on the
shipped ``l4-qwen2.5-1.5b`` profile with the engine settings ``prefixshield reproduce`` uses
(``compat 0.10``, 512 blocks unless a capacity is named, default scheduler limits), and picks
the grid value whose simulated result is closest to the reference's observation. Only
unprotected baselines are fitted to: LRU results, and S3-FIFO on the benign ShareGPT traces.
No other policy is run.

Stages, in order (each uses the values fitted before it; stages 1 and 2 alternate until
neither moves, as the suffix is part of the C_prefill probe's prompts):

1. ``max_output_tokens`` (every prefix workload): the one-touch request shape's
   ``0.6 x C_prefill`` against the ~5.955 requests/s LRU sustained at 60% load.
2. ``suffix_tokens = (1, hi)``: LRU's no-attack hit ratio of low_and_slow (99.19%) and
   borrowing's LRU hit ratio (99.33%), least squares.
3. one_touch ``duration_s`` (its attack window): the full-cache turnovers of the 4,096-block run
   (5.64), at the 512-block base rate (C_prefill is a property of the deployment, not of the
   cache size).
4. low_and_slow ``duration_s``: the creation-pressure sweep's mean attacker debt at pressure 2
   and 4 (260.90 and 901.91 blocks), least squares on log debt.
5. low_and_slow ``pressure_ratio``: LRU's victim hit ratio under attack (92.64%).
6. two_pass_replay ``pressure_ratio``: LRU's victim hit ratio under attack (92.87%).
7. delayed_replay ``neutral_duration_s``: the evictions the neutral group causes (about 74).
8. sharegpt ``system_prompt_tokens`` and ``think_time_s``: S3-FIFO's hit ratio (38.85%).
9. bursty_sharegpt ``cv``: S3-FIFO's P95 TTFT (185.5 ms).
10. borrowing ``working_set_fraction``: the active group's peak occupancy (509-510 blocks).

Then every observation is evaluated at the fitted values (``--defaults``: at the package's
defaults instead, which are the fitted values) over 10 seeds (3 with ``--quick``) and printed
as one Markdown table: the simulator's mean, its spread across seeds (standard deviation), the
95% confidence interval of the mean, and the residual (simulated minus observed). Everything
is seeded (seeds 100-104 while searching, 100-109 for the bursty trace's P95, 0-9 for the
table), so two runs print the same numbers. Runtime on a 2-core machine: about 40-65 s, 6 s
with ``--quick``, 10 s with ``--defaults``.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from prefixshield.experiments.single import RunSpec, build_trace, resolve_params, run_policies
from prefixshield.simulator.config import EngineConfig
from prefixshield.simulator.costmodel import load_profile
from prefixshield.simulator.metrics import group_table, summarize
from prefixshield.workloads import make_params

PROFILE = "l4-qwen2.5-1.5b"
COMPAT = "0.10"
ALPHA = 0.6

# The reference's observations (REFERENCE-BASELINES): what the fit aims at.
OBS_RATE = 5.955                 # LRU requests/s at 60% load (overhead run)
OBS_CONTROL = 99.19              # low_and_slow / two_pass_replay LRU no-attack hit, %
OBS_BORROW_HIT = 99.33           # borrowing LRU hit, %
OBS_BORROW_PEAK = 509.5          # borrower's blocks of 511 (509-510)
OBS_OT_HIT, OBS_OT_P95 = 5.54, 1440.0          # one_touch LRU at 512 blocks (%, ms)
OBS_CAP_HIT, OBS_CAP_TURN = 4.92, 5.64         # one_touch LRU at 4,096 blocks
OBS_LS_HIT, OBS_TP_HIT = 92.64, 92.87          # LRU under attack, %
OBS_SWEEP = {0.5: (0.54, 0.0), 1.0: (1.02, 5.69), 2.0: (2.14, 260.90), 4.0: (4.23, 901.91)}
OBS_DR_ELIGIBLE, OBS_DR_NEUTRAL_EVICT = 193.0, 74.0
OBS_SG_HIT, OBS_SG_P95 = 38.85, 96.5           # sharegpt S3-FIFO
OBS_BSG_HIT, OBS_BSG_P95 = 38.72, 185.5        # bursty_sharegpt S3-FIFO
OBS_WORKING_SET = 76.6                          # victim working set, % of usable, 1,024-4,096
ATTACKS = ("one_touch", "low_and_slow", "two_pass_replay", "delayed_replay")
LS_NEAR_REFILL = 1.25          # "creation just above its refill": the low-and-slow attacker


@dataclass
class Ctx:
    """Search settings and the values fitted so far (workload -> overrides)."""

    search_seeds: tuple[int, ...]
    final_seeds: tuple[int, ...]
    quick: bool
    fit: dict[str, dict] = field(default_factory=dict)
    profile: object = None
    population: str = "background"

    def shape(self) -> dict:
        """The fitted request shape shared by every prefix workload."""
        return dict(self.fit.get("shape", {}))

    def attack(self, workload: str) -> dict:
        """Overrides of an attack workload: the population, the shape, the victim's share
        and the workload's own fitted values."""
        return {"population": self.population, **self.shape(), **self.fit.get("population", {}),
                **self.fit.get(workload, {})}


def spec_for(ctx: Ctx, workload: str, policy: str, seed: int, blocks: int, ov: dict) -> RunSpec:
    return RunSpec(workload=workload, policies=(policy,),
                   engine=EngineConfig(num_blocks=blocks, vllm_compat=COMPAT),
                   profile=ctx.profile, alpha=ALPHA, seed=seed, overrides=dict(ov))


def runs(ctx: Ctx, workload: str, seeds, policy: str = "lru", blocks: int = 512,
         **ov) -> list[dict]:
    """One run per seed; per run a dict of the numbers the fit uses."""
    out = []
    for seed in seeds:
        spec = spec_for(ctx, workload, policy, seed, blocks, ov)
        trace, info = build_trace(spec)
        res = run_policies(trace, spec)[policy]
        s = summarize(res)
        gt = group_table(res).set_index("group")
        rec = res.records
        row = {"hit": 100 * s["hit_ratio"], "p95_ms": 1000 * s["p95_ttft_s"],
               "pressure": s["attacker_pressure_ratio"], "debt": s["attacker_mean_debt_blocks"],
               "turnovers": float(rec["new_blocks"].sum()) / (blocks - 1),
               "base_rate": info["base_rate_req_per_s"], "meta": res.trace_meta,
               "gt": gt, "evictions": res.evictions, "groups": res.groups, "records": rec}
        out.append(row)
    return out


def mean(rows: list[dict], key: str) -> float:
    return float(np.mean([r[key] for r in rows]))


def base_rate(ctx: Ctx, workload: str = "one_touch", **ov) -> float:
    """``alpha x C_prefill`` of a workload's request shape at 512 blocks (deterministic)."""
    p, _ = resolve_params(spec_for(ctx, workload, "lru", 0, 512, ov))
    return float(p.base_rate)


def pick(grid, score) -> tuple[object, list[tuple[object, float]]]:
    """The grid value with the smallest score (first on ties), and every score."""
    scored = [(g, score(g)) for g in grid]
    best = min(scored, key=lambda x: x[1])[0]
    return best, scored


def say(msg: str) -> None:
    print(msg, flush=True)


# ---------------------------------------------------------------------------------- stages

def fit_outputs(ctx: Ctx) -> None:
    grid = range(4, 17) if not ctx.quick else (4, 6, 8, 12, 16)
    suffix = ctx.shape().get("suffix_tokens")
    extra = {} if suffix is None else {"suffix_tokens": suffix}

    def score(m):
        r = base_rate(ctx, max_output_tokens=m, **extra)
        say(f"  max_output_tokens={m:>3}: 0.6 x C_prefill = {r:.3f} req/s")
        return abs(r - OBS_RATE)
    best, _ = pick(grid, score)
    ctx.fit.setdefault("shape", {})["max_output_tokens"] = best
    say(f"=> max_output_tokens = {best}")


def fit_suffix(ctx: Ctx) -> None:
    grid = range(12, 33, 2) if not ctx.quick else (16, 20, 24, 28)

    def score(hi):
        sh = {**ctx.shape(), "suffix_tokens": (1, hi)}
        c = mean(runs(ctx, "low_and_slow", ctx.search_seeds,
                      **{**ctx.attack("low_and_slow"), **sh, "attack": False}), "hit")
        b = mean(runs(ctx, "borrowing", ctx.search_seeds, **sh), "hit")
        say(f"  suffix_tokens=(1,{hi}): control {c:.2f}%  borrowing {b:.2f}%")
        return (c - OBS_CONTROL) ** 2 + (b - OBS_BORROW_HIT) ** 2
    best, _ = pick(grid, score)
    ctx.fit["shape"]["suffix_tokens"] = (1, best)
    say(f"=> suffix_tokens = (1, {best})")


def fit_victim_share(ctx: Ctx) -> None:
    """The victim's share of the base load: LRU's victim hit ratio under the low-and-slow
    attacker just above its refill (pressure 1.25), 92.64%; the no-attack control is shown."""
    grid = tuple(np.round(np.arange(0.40, 1.0001, 0.025), 3)) if not ctx.quick \
        else (0.4, 0.5, 0.6, 0.8, 1.0)

    def score(v):
        ov = {**ctx.attack("low_and_slow"), "victim_share": float(v),
              "pressure_ratio": LS_NEAR_REFILL}
        h = mean(runs(ctx, "low_and_slow", ctx.search_seeds, **ov), "hit")
        c = mean(runs(ctx, "low_and_slow", ctx.search_seeds, **ov, attack=False), "hit")
        say(f"  victim_share={v:g}: LRU under attack {h:.2f}%, control {c:.2f}%")
        return abs(h - OBS_LS_HIT)
    best, _ = pick(grid, score)
    ctx.fit["population"] = {"victim_share": float(best)}
    ctx.fit.setdefault("low_and_slow", {})["pressure_ratio"] = LS_NEAR_REFILL
    say(f"=> victim_share = {best}")


def fit_one_touch_window(ctx: Ctx) -> None:
    rate = base_rate(ctx, **ctx.shape())
    grid = range(4, 31) if not ctx.quick else (5, 10, 15, 20, 25, 30)
    ov = {k: v for k, v in ctx.attack("one_touch").items() if k != "duration_s"}

    def score(d):
        rows = runs(ctx, "one_touch", ctx.search_seeds, blocks=4096, duration_s=float(d),
                    base_rate=rate, **ov)
        t = mean(rows, "turnovers")
        # shown, not scored: the 512-block observations at the same window
        small = runs(ctx, "one_touch", ctx.search_seeds, duration_s=float(d), **ov)
        say(f"  duration_s={d}: 4,096 blocks: turnovers {t:.2f}, LRU hit {mean(rows, 'hit'):.2f}%"
            f" | 512 blocks: LRU hit {mean(small, 'hit'):.2f}%, P95 {mean(small, 'p95_ms'):.0f} ms")
        return abs(t - OBS_CAP_TURN)
    best, _ = pick(grid, score)
    ctx.fit["one_touch"] = {"duration_s": float(best)}
    say(f"=> one_touch duration_s = {best}")


def measured_pressure(ctx: Ctx, workload: str, ov: dict, pressure: float) -> float:
    """The attacker's measured creation pressure under LRU at a designed ``pressure`` (first
    search seed: it hardly varies with the seed)."""
    return mean(runs(ctx, workload, ctx.search_seeds[:1], **ov, pressure_ratio=pressure),
                "pressure")


def sweep_rates(ctx: Ctx, workload: str, ov: dict) -> dict[float, float]:
    """Per sweep point (nominal 0.5/1/2/4), the designed pressure whose measured pressure over
    the window of ``ov`` is the reference's measured ratio (0.54/1.02/2.14/4.23): three
    multiplicative corrections from the measured ratio itself."""
    out = {}
    for nominal, (target, _) in OBS_SWEEP.items():
        pr = target
        for _ in range(3):
            m = measured_pressure(ctx, workload, ov, pr)
            pr = pr * target / m
        out[nominal] = round(float(pr), 4)
    return out


def fit_sweep(ctx: Ctx) -> None:
    """The creation-pressure sweep on one_touch: its window, fitted to the attacker's mean
    debt at the reference's measured ratios 2.14 and 4.23 (260.90 and 901.91 blocks, least
    squares on log debt), each point's attacker rate solved for its measured ratio."""
    grid = range(30, 57, 2) if not ctx.quick else (30, 40, 50)
    base = {k: v for k, v in ctx.attack("one_touch").items() if k != "duration_s"}
    found = {}

    def score(d):
        ov = {**base, "duration_s": float(d)}
        rates = sweep_rates(ctx, "one_touch", ov)
        found[d] = rates
        err, msg = 0.0, []
        for nominal in (2.0, 4.0):
            rows = runs(ctx, "one_touch", ctx.search_seeds, **ov, pressure_ratio=rates[nominal])
            debt = mean(rows, "debt")
            err += math.log(max(debt, 1e-9) / OBS_SWEEP[nominal][1]) ** 2
            msg.append(f"designed {rates[nominal]:.3f}: measured {mean(rows, 'pressure'):.2f}, "
                       f"debt {debt:.1f}")
        say(f"  sweep duration_s={d}: " + "; ".join(msg))
        return err
    best, _ = pick(grid, score)
    ctx.fit["sweep"] = {"duration_s": float(best), "pressure_ratios": found[best]}
    say(f"=> one_touch sweep duration_s = {best}, designed pressures {found[best]}")


def fit_low_and_slow_window(ctx: Ctx) -> None:
    """The two-group reading's sweep (on low_and_slow, as it was run): its window."""
    grid = range(30, 61, 2) if not ctx.quick else (30, 40, 50)

    def score(d):
        err, msg = 0.0, []
        for pr in (2.0, 4.0):
            rows = runs(ctx, "low_and_slow", ctx.search_seeds, duration_s=float(d),
                        pressure_ratio=pr, **ctx.shape(), population=ctx.population)
            debt = mean(rows, "debt")
            err += math.log(max(debt, 1e-9) / OBS_SWEEP[pr][1]) ** 2
            msg.append(f"pressure {pr}: measured {mean(rows, 'pressure'):.2f}, debt {debt:.1f}")
        say(f"  duration_s={d}: " + "; ".join(msg))
        return err
    best, _ = pick(grid, score)
    ctx.fit["low_and_slow"] = {"duration_s": float(best)}
    say(f"=> low_and_slow duration_s = {best}")


def fit_pressure(ctx: Ctx, workload: str, obs: float, grid) -> None:
    fixed = ctx.attack(workload)

    def score(pr):
        h = mean(runs(ctx, workload, ctx.search_seeds, **{**fixed, "pressure_ratio": float(pr)}),
                 "hit")
        say(f"  pressure_ratio={pr:g}: LRU victim hit {h:.2f}%")
        return abs(h - obs)
    best, _ = pick(grid, score)
    ctx.fit.setdefault(workload, {})["pressure_ratio"] = float(best)
    say(f"=> {workload} pressure_ratio = {best}")


def neutral_evictions(rows: list[dict]) -> float:
    vals = []
    for r in rows:
        gi = r["groups"].index(r["meta"]["params"]["neutral_group"])
        vals.append(float(r["evictions"][gi].sum()))
    return float(np.mean(vals))


def replay_eligible(rows: list[dict], block_size: int = 16) -> float:
    """Blocks the replayed attacker prompts would hit had nothing been evicted: per replay
    request ``(prompt - 1) // block_size`` (vLLM's hit cap), summed (a property of the trace)."""
    vals = []
    for r in rows:
        att = r["records"][r["records"]["role"] == "attacker"].sort_values("arrival_s")
        rep = att.iloc[int(r["meta"]["replay_set"]):]
        vals.append(float(((rep["prompt_tokens"] - 1) // block_size).sum()))
    return float(np.mean(vals))


def _fit_neutral_field(ctx: Ctx, field: str, grid, cast) -> None:
    """delayed_replay's neutral phase: the ``field`` value of ``grid`` whose neutral-phase
    evictions (LRU) come closest to the ~74 observed."""
    def score(value):
        n = neutral_evictions(runs(ctx, "delayed_replay", ctx.search_seeds,
                                   **{**ctx.attack("delayed_replay"), field: value}))
        say(f"  {field}={value}: neutral-phase evictions {n:.1f}")
        return abs(n - OBS_DR_NEUTRAL_EVICT)
    best, _ = pick(grid, score)
    ctx.fit["delayed_replay"] = {field: cast(best)}
    say(f"=> delayed_replay {field} = {best}")


def fit_neutral_prompt(ctx: Ctx) -> None:
    """The phased delayed replay's neutral request (one, in the 0.1 s phase): its prompt,
    fitted to the ~74 evictions the neutral phase causes (LRU)."""
    _fit_neutral_field(ctx, "neutral_prefix_tokens",
                       range(800, 1537, 16) if not ctx.quick else (1024, 1200, 1536), int)


def fit_neutral(ctx: Ctx) -> None:
    """The two-group reading's neutral phase: its duration, fitted to the same evictions."""
    _fit_neutral_field(ctx, "neutral_duration_s",
                       (0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0) if not ctx.quick
                       else (0.1, 0.5, 1.0, 2.0), float)


def fit_sharegpt(ctx: Ctx) -> None:
    sps = (0, 8, 16, 32, 64) if not ctx.quick else (0, 32)
    tts = tuple(np.arange(2.0, 10.01, 0.5)) if not ctx.quick else (3.0, 5.0, 10.0)
    grid = [(sp, tt) for sp in sps for tt in tts]

    def score(g):
        rows = runs(ctx, "sharegpt", ctx.search_seeds, policy="s3fifo",
                    system_prompt_tokens=g[0], think_time_s=float(g[1]))
        h = mean(rows, "hit")
        say(f"  system_prompt_tokens={g[0]}, think_time_s={g[1]}: S3-FIFO hit {h:.2f}%, "
            f"P95 {mean(rows, 'p95_ms'):.1f} ms")
        return abs(h - OBS_SG_HIT)
    best, _ = pick(grid, score)
    ctx.fit["sharegpt"] = {"system_prompt_tokens": best[0], "think_time_s": float(best[1])}
    say(f"=> sharegpt system_prompt_tokens = {best[0]}, think_time_s = {best[1]}")


def fit_bursty(ctx: Ctx) -> None:
    grid = (1.0, 1.125, 1.25, 1.375, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0) if not ctx.quick \
        else (1.0, 1.5, 2.0, 3.0)
    # A burst that overloads the engine gives a run a P95 of seconds while most runs stay near
    # 60 ms, so the mean over runs (the reference's statistic) is noisy: it is taken over 10
    # search seeds here, and the median is printed beside it.
    seeds = tuple(range(100, 110)) if not ctx.quick else ctx.search_seeds

    def score(cv):
        rows = runs(ctx, "bursty_sharegpt", seeds, policy="s3fifo", cv=cv,
                    **ctx.fit["sharegpt"])
        p = mean(rows, "p95_ms")
        say(f"  cv={cv}: S3-FIFO P95 mean {p:.1f} ms (median "
            f"{float(np.median([r['p95_ms'] for r in rows])):.1f}), hit {mean(rows, 'hit'):.2f}%")
        return abs(p - OBS_BSG_P95)
    best, _ = pick(grid, score)
    ctx.fit["bursty_sharegpt"] = {**ctx.fit["sharegpt"], "cv": float(best)}
    say(f"=> bursty_sharegpt cv = {best}")


def fit_borrowing(ctx: Ctx) -> None:
    grid = (0.75, 0.95)  # 4 and 5 prefixes of 96 blocks at 511 usable; 6 exceed the pool

    def score(f):
        rows = runs(ctx, "borrowing", ctx.search_seeds, working_set_fraction=f, **ctx.shape())
        peak = float(np.mean([r["gt"].loc["active", "peak_blocks"] for r in rows]))
        say(f"  working_set_fraction={f}: peak {peak:.1f} blocks, LRU hit {mean(rows, 'hit'):.2f}%")
        return abs(peak - OBS_BORROW_PEAK)
    best, _ = pick(grid, score)
    ctx.fit["borrowing"] = {"working_set_fraction": float(best)}
    say(f"=> borrowing working_set_fraction = {best}")


# ------------------------------------------------------------------------ final evaluation

def stats(vals) -> tuple[float, float, float]:
    """Mean, standard deviation across seeds, half-width of the 95% t interval of the mean."""
    v = np.asarray(vals, dtype=float)
    n = len(v)
    sd = float(v.std(ddof=1)) if n > 1 else 0.0
    try:
        from scipy.stats import t as student_t
        q = float(student_t.ppf(0.975, n - 1)) if n > 1 else 0.0
    except ImportError:  # pragma: no cover
        q = 1.96
    return float(v.mean()), sd, q * sd / math.sqrt(n) if n > 1 else 0.0


def row(table: list, what: str, param: str, obs: float, vals, unit: str = "",
        fmt: str = "{:.2f}") -> None:
    m, sd, ci = stats(vals)
    res = m - obs
    met = "deterministic" if sd == 0 else ("yes" if abs(res) <= 2 * sd else "no")
    table.append((what, param, (fmt + unit).format(obs),
                  f"{fmt.format(m)}{unit} (sd {fmt.format(sd)}, CI ±{fmt.format(ci)})",
                  f"{res:+.2f}{' pp' if unit == '%' else unit}", met))


def sweep_settings(ctx: Ctx, use_defaults: bool) -> tuple[float, dict[float, float]]:
    """The one_touch pressure sweep's window and designed pressures: fitted, or the package's
    (``prefixshield.workloads.one_touch.PRESSURE_SWEEP``)."""
    if not use_defaults and "sweep" in ctx.fit:
        return ctx.fit["sweep"]["duration_s"], ctx.fit["sweep"]["pressure_ratios"]
    from prefixshield.workloads.one_touch import PRESSURE_SWEEP, PRESSURE_SWEEP_DURATION_S

    return PRESSURE_SWEEP_DURATION_S, dict(PRESSURE_SWEEP)


def evaluate(ctx: Ctx, use_defaults: bool) -> list:
    """Every observation at the fitted values (explicit overrides) or the package defaults,
    under ``ctx.population``."""
    S = ctx.final_seeds
    two = ctx.population == "two_group"

    def ov(workload: str) -> dict:
        if workload in ATTACKS:
            return {"population": ctx.population} if use_defaults else ctx.attack(workload)
        if use_defaults:
            return {}
        shape = ctx.shape() if workload not in ("sharegpt", "bursty_sharegpt") else {}
        return {**shape, **ctx.fit.get(workload, {})}
    t: list = []
    sh = ov("one_touch")
    fitted = ("max_output_tokens, suffix_tokens")
    r512 = base_rate(ctx, **sh)
    row(t, "overhead: LRU req/s at 60% load", fitted, OBS_RATE, [r512], " req/s", "{:.3f}")
    rows = runs(ctx, "one_touch", S, **sh)
    row(t, "one_touch 512: LRU victim hit", "one_touch duration_s", OBS_OT_HIT,
        [r["hit"] for r in rows], "%")
    row(t, "one_touch 512: LRU P95 TTFT", "one_touch duration_s", OBS_OT_P95,
        [r["p95_ms"] for r in rows], " ms", "{:.1f}")
    cap = runs(ctx, "one_touch", S, blocks=4096, base_rate=r512, **sh)
    row(t, "one_touch 4,096: LRU victim hit", "one_touch duration_s", OBS_CAP_HIT,
        [r["hit"] for r in cap], "%")
    row(t, "one_touch 4,096: full-cache turnovers", "one_touch duration_s", OBS_CAP_TURN,
        [r["turnovers"] for r in cap])
    for blocks in (1024, 2048, 4096):
        p = make_params("one_touch", num_blocks=blocks, **sh)
        full = (p.prefix_tokens + p.suffix_tokens[1]) // p.block_size
        t.append((f"one_touch {blocks:,}: victim working set, % of usable", "hot_fraction",
                  f"{OBS_WORKING_SET}%",
                  f"{100 * p.hot_prefixes * p.prefix_blocks / p.usable_blocks:.1f}% "
                  f"({p.hot_prefixes} x {p.prefix_blocks} prefix blocks; "
                  f"{100 * p.hot_prefixes * full / p.usable_blocks:.1f}% with the longest "
                  f"suffix's full blocks)", "-", "-"))

    def control_and_attack(workload: str, obs_attack: float, param: str) -> dict:
        """The rows of LRU's no-attack control and of LRU under attack; returns the
        workload's overrides."""
        o = ov(workload)
        ctl = runs(ctx, workload, S, **{**o, "attack": False})
        row(t, f"{workload}: LRU no-attack control", "suffix_tokens", OBS_CONTROL,
            [r["hit"] for r in ctl], "%")
        att = runs(ctx, workload, S, **o)
        row(t, f"{workload}: LRU under attack", param, obs_attack, [r["hit"] for r in att], "%")
        return o

    ls = control_and_attack("low_and_slow", OBS_LS_HIT, "low_and_slow pressure_ratio" if two
                            else f"victim_share (pressure {LS_NEAR_REFILL} held)")
    if two:  # the two-group reading ran the sweep on low_and_slow
        for pr, (m_obs, d_obs) in OBS_SWEEP.items():
            sw = runs(ctx, "low_and_slow", S, **{**ls, "pressure_ratio": pr})
            row(t, f"low_and_slow sweep {pr}: measured ratio", "low_and_slow duration_s", m_obs,
                [r["pressure"] for r in sw])
            row(t, f"low_and_slow sweep {pr}: attacker mean debt", "low_and_slow duration_s",
                d_obs, [r["debt"] for r in sw], " blocks", "{:.1f}")
    else:
        window, rates = sweep_settings(ctx, use_defaults)
        for nominal, (m_obs, d_obs) in OBS_SWEEP.items():
            sw = runs(ctx, "one_touch", S, **{**sh, "duration_s": window,
                                               "pressure_ratio": rates[nominal]})
            row(t, f"one_touch sweep {nominal}: measured ratio",
                f"designed pressure {rates[nominal]:g}", m_obs, [r["pressure"] for r in sw])
            row(t, f"one_touch sweep {nominal}: attacker mean debt",
                f"sweep window {window:g} s", d_obs, [r["debt"] for r in sw], " blocks",
                "{:.1f}")
    control_and_attack("two_pass_replay", OBS_TP_HIT, "two_pass_replay pressure_ratio")
    dr = runs(ctx, "delayed_replay", S, **ov("delayed_replay"))
    row(t, "delayed_replay: replay-eligible attacker blocks", "suffix_tokens", OBS_DR_ELIGIBLE,
        [replay_eligible([r]) for r in dr], " blocks", "{:.1f}")
    row(t, "delayed_replay: neutral-phase evictions (LRU)",
        "neutral_duration_s" if two else "neutral_prefix_tokens",
        OBS_DR_NEUTRAL_EVICT, [neutral_evictions([r]) for r in dr], "", "{:.1f}")
    sg = runs(ctx, "sharegpt", S, policy="s3fifo", **ov("sharegpt"))
    row(t, "sharegpt: S3-FIFO hit", "system_prompt_tokens, think_time_s", OBS_SG_HIT,
        [r["hit"] for r in sg], "%")
    row(t, "sharegpt: S3-FIFO P95 TTFT", "(not fitted)", OBS_SG_P95,
        [r["p95_ms"] for r in sg], " ms", "{:.1f}")
    bsg = runs(ctx, "bursty_sharegpt", S, policy="s3fifo", **ov("bursty_sharegpt"))
    row(t, "bursty_sharegpt: S3-FIFO hit", "(as sharegpt)", OBS_BSG_HIT,
        [r["hit"] for r in bsg], "%")
    row(t, "bursty_sharegpt: S3-FIFO P95 TTFT", "bursty_sharegpt cv", OBS_BSG_P95,
        [r["p95_ms"] for r in bsg], " ms", "{:.1f}")
    med = float(np.median([r["p95_ms"] for r in bsg]))
    t.append(("bursty_sharegpt: S3-FIFO P95 TTFT, median over seeds", "bursty_sharegpt cv",
              f"{OBS_BSG_P95:.1f} ms", f"{med:.1f} ms", f"{med - OBS_BSG_P95:+.2f} ms", "-"))
    bo = runs(ctx, "borrowing", S, **ov("borrowing"))
    row(t, "borrowing: LRU hit", "suffix_tokens", OBS_BORROW_HIT, [r["hit"] for r in bo], "%")
    row(t, "borrowing: borrower's peak blocks (of 511)", "working_set_fraction",
        OBS_BORROW_PEAK, [r["gt"].loc["active", "peak_blocks"] for r in bo], "", "{:.1f}")
    return t


def markdown(table: list) -> str:
    head = ("| observation | fitted parameter(s) | reference | simulator (mean over seeds) "
            "| residual | within 2 sd |\n|---|---|---|---|---|---|\n")
    return head + "\n".join("| " + " | ".join(str(c) for c in r) + " |" for r in table)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="coarse grids, 2 search seeds, "
                    "3 final seeds")
    ap.add_argument("--out", help="also write the final Markdown table to this file")
    ap.add_argument("--defaults", action="store_true",
                    help="skip the search: only evaluate the package's defaults")
    ap.add_argument("--population", choices=("background", "two_group"), default="background",
                    help="the attack workloads' traffic population (default: background)")
    ap.add_argument("--attacks-only", action="store_true",
                    help="search the attack workloads' stages only (the benign ones at the "
                         "package defaults: the population does not touch them)")
    a = ap.parse_args(argv)
    # Searching and reporting use different seeds, so the table is not scored on the runs the
    # search chose by.
    ctx = Ctx(search_seeds=(100, 101) if a.quick else (100, 101, 102, 103, 104),
              final_seeds=tuple(range(3 if a.quick else 10)), quick=a.quick,
              profile=load_profile(PROFILE), population=a.population)
    two = a.population == "two_group"
    t0 = time.time()
    if not a.defaults:
        # Output length, suffix and (background) the victim's share interact a little (the
        # suffix is part of the C_prefill probe's prompts and sets the control's ceiling; the
        # share moves the control): alternate until none moves.
        for _ in range(3):
            before = (ctx.shape(), dict(ctx.fit.get("population", {})))
            for stage in (fit_outputs, fit_suffix) + (() if two else (fit_victim_share,)):
                say(f"\n## {stage.__name__}")
                stage(ctx)
            if (ctx.shape(), ctx.fit.get("population", {})) == before:
                break
        for stage in (fit_one_touch_window, fit_low_and_slow_window if two else fit_sweep):
            say(f"\n## {stage.__name__}")
            stage(ctx)
        if two:
            say("\n## fit_pressure low_and_slow")
            fit_pressure(ctx, "low_and_slow", OBS_LS_HIT,
                         (1.25, 2.0, 3.0) + tuple(np.arange(4.0, 9.01, 0.25)) if not a.quick
                         else (1.25, 5.0, 6.5, 8.0))
        say("\n## fit_pressure two_pass_replay")
        fit_pressure(ctx, "two_pass_replay", OBS_TP_HIT,
                     tuple(np.arange(0.25, 6.01, 0.25)) if not a.quick
                     else (0.25, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0))
        for stage in (fit_neutral if two else fit_neutral_prompt,) + (() if a.attacks_only else
                                       (fit_sharegpt, fit_bursty, fit_borrowing)):
            say(f"\n## {stage.__name__}")
            stage(ctx)
        say("\nfitted values:")
        for k, v in ctx.fit.items():
            say(f"  {k}: {v}")
        say(f"\n## observations at the fitted values, seeds 0-{len(ctx.final_seeds) - 1}")
        table = evaluate(ctx, use_defaults=False)
    else:
        say(f"\n## observations at the package defaults, seeds 0-{len(ctx.final_seeds) - 1}")
        table = evaluate(ctx, use_defaults=True)
    md = markdown(table)
    say(md)
    if a.out:
        with open(a.out, "w") as f:
            f.write(md + "\n")
    say(f"\n({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
