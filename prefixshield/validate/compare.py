"""Sim-vs-live: the same trace through the simulator and a real vLLM, side by side.

`simulate` runs the trace in `prefixshield.simulator.engine.Engine` with the live
engine's settings (blocks, block size, ``max_num_seqs``, ``max_num_batched_tokens``, compat
``"current"``, the same policy) and a caller-given `CostModel`. `compare` joins the
two per-request record sets and builds the report table ``Metric / vLLM / Sim / Diff%``
(``Diff% = 100 * (Sim - vLLM) / vLLM``): mean hit ratio (all, measured, per group), per-request
cached-token agreement (exact equality, with the list of disagreeing requests), P50/P95 TTFT,
mean end-to-end latency, evictions caused and suffered per group, plus the engine facts.
`write_report` writes it as Markdown, CSV and JSON (atomically, `prefixshield.atomic`).

Serialized replays: the live mode submits one request at a time, each after the previous one
finished. The simulated trace is made serialized too by rewriting arrivals:
``arrival'_i = max(not_before_i, arrival'_{i-1} + bound_{i-1})`` where ``bound`` is an upper bound
of a request's service time alone on an idle engine under the cost model (every prefill chunk
and decode step priced at the largest step the request can make), so simulated requests never
overlap; ``not_before`` defaults to the live submission times, so the policy's accounting clock
sees (almost) the same times in both runs. TTFT and end-to-end latency are measured from each
request's own (rewritten) arrival on both sides, so they stay comparable.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from prefixshield.atomic import write_text
from prefixshield.policies import make_policy
from prefixshield.simulator.config import EngineConfig
from prefixshield.simulator.costmodel import CostModel
from prefixshield.simulator.engine import Engine, RunResult
from prefixshield.traces.schema import Trace

if TYPE_CHECKING:  # the live side loads only when a replay runs
    from prefixshield.live.engine import LiveEngine, LiveEngineConfig

MIN_GAP_S = 1e-6
"""Smallest gap between serialized simulated arrivals (seconds), for degenerate cost models."""


def service_bound_s(prompt_tokens: int, output_tokens: int, cost: CostModel,
                    config: EngineConfig) -> float:
    """Upper bound (seconds) of one request's time alone on an idle simulated engine.

    Every step is priced at the most a step of this request can cost (a full prefill chunk, one
    decoding sequence, its whole context attended); steps = prefill chunks + output tokens.
    """
    chunk = min(prompt_tokens, config.max_num_batched_tokens)
    steps = math.ceil(prompt_tokens / config.max_num_batched_tokens) + output_tokens
    step = cost.step_time(chunk, 1, prompt_tokens + output_tokens, 1)
    return max(MIN_GAP_S, steps * step * (1 + 1e-6) + 1e-9)


def serialize_trace(trace: Trace, cost: CostModel, config: EngineConfig,
                    not_before: np.ndarray | None = None) -> Trace:
    """A copy of ``trace`` whose arrivals never overlap in the simulator (see module docstring).

    Args:
        trace: the trace (rows in arrival order).
        cost: the cost model the simulation will use.
        config: the simulated engine.
        not_before: earliest arrival per row in seconds (e.g. live submission times); None: 0.
    """
    df = trace.requests.copy()
    lengths = trace.prompt_lengths()
    outs = df["output_tokens"].to_numpy(np.int64)
    n = len(df)
    arr = np.zeros(n)
    t = 0.0
    for i in range(n):
        if not_before is not None and np.isfinite(not_before[i]):
            t = max(t, float(not_before[i]))
        arr[i] = t
        t += service_bound_s(int(lengths[i]), int(outs[i]), cost, config)
    df["arrival_s"] = arr
    meta = dict(trace.meta)
    meta["serialized_for_comparison"] = True
    return Trace(df, seed=trace.seed, vocab_size=trace.vocab_size, meta=meta).validate(
        "<serialized trace>")


def at_arrivals(trace: Trace, arrival_s: np.ndarray) -> Trace:
    """A copy of ``trace`` whose row ``i`` arrives at ``arrival_s[i]`` seconds (non-decreasing,
    e.g. the live submission times of a serialized replay)."""
    df = trace.requests.copy()
    df["arrival_s"] = np.asarray(arrival_s, dtype=np.float64)
    meta = dict(trace.meta)
    meta["arrivals_from_live_submissions"] = True
    return Trace(df, seed=trace.seed, vocab_size=trace.vocab_size, meta=meta).validate(
        "<trace at live submission times>")


def simulate(trace: Trace, policy_name: str, config: EngineConfig, cost: CostModel,
             serialize: bool = True, policy_args: dict | None = None,
             not_before: np.ndarray | None = None, step_by_step: bool = False) -> RunResult:
    """Run ``trace`` in the simulator under ``policy_name`` (serialized arrivals if asked).

    Args:
        trace: the trace.
        policy_name: registered policy.
        config: engine settings (use ``vllm_compat="current"`` to compare with vLLM >= 0.28).
        cost: step-time model (a [`CostModel`][prefixshield.simulator.costmodel.CostModel], or a
            `RecordedStepTimes` with ``step_by_step``).
        serialize: rewrite arrivals with `serialize_trace` first (bounded with ``cost``:
            a plain [`CostModel`][prefixshield.simulator.costmodel.CostModel] then).
        policy_args: keyword arguments for ``make_policy``.
        not_before: see [`serialize_trace`][prefixshield.validate.compare.serialize_trace].
        step_by_step: run the step-by-step engine with no decode-step coalescing, so ``cost``
            is asked once per step, in order (same results as the default engine).
    """
    tr = serialize_trace(trace, cost, config, not_before) if serialize else trace
    policy = make_policy(policy_name, config.num_blocks, vllm_compat=config.vllm_compat,
                         **(policy_args or {}))
    if step_by_step:
        return Engine(tr, policy, cost, config, coalesce_decode=False, batched=False).run()
    return Engine(tr, policy, cost, config).run()


@dataclass
class ComparisonReport:
    """One sim-vs-live comparison.

    Attributes:
        table: rows ``metric, vllm, sim, diff_pct, sim_steps, steps_diff_pct, unit`` (numbers;
            NaN where not applicable): ``sim`` is the simulator with the profile, ``sim_steps``
            the simulator replaying the live step times (`prefixshield.validate.steptimes`).
        requests: per request: identity, ``prompt_tokens``, ``cached_vllm``, ``cached_sim``,
            ``cached_sim_steps``, ``ttft_vllm_s``, ``ttft_sim_s``, ``ttft_sim_steps_s``,
            ``e2e_vllm_s``, ``e2e_sim_s``, ``e2e_sim_steps_s``, ``agree`` (live = sim with the
            profile) and ``agree_steps`` (live = sim with the live step times).
        agreement: ``{"requests", "equal", "fraction"}`` of exact cached-token agreement.
        facts: engine facts of the live run.
        steps: the live engine's recorded steps (None: not recorded).
        meta: policy, mode, simulated engine config, cost model (and where it came from),
            pool and policy stats, and ``steps``: live and simulated step counts, how many
            line up, the profile's step-time residuals and the cost model fitted to the live
            steps.
    """

    table: pd.DataFrame
    requests: pd.DataFrame
    agreement: dict
    facts: dict
    meta: dict = field(default_factory=dict)
    steps: pd.DataFrame | None = None

    @property
    def disagreements(self) -> pd.DataFrame:
        """The requests whose cached tokens differ between vLLM and the simulator."""
        return self.requests[~self.requests["agree"]]


def _pct(x: pd.Series, q: float) -> float:
    x = x.dropna()
    return float(np.percentile(x, q)) if len(x) else float("nan")


def _diff_pct(live: float, sim: float) -> float:
    if not (np.isfinite(live) and np.isfinite(sim)) or live == 0:
        return 0.0 if live == sim else float("nan")
    return 100.0 * (sim - live) / live


def _sim_eviction_counts(result: RunResult) -> tuple[dict, dict]:
    ev = result.evictions
    caused = {g: int(ev[i].sum()) for i, g in enumerate(result.groups)}
    suffered = {g: int(ev[:, i].sum()) for i, g in enumerate(result.groups)}
    return caused, suffered


def compare(live, sim: RunResult, config: EngineConfig, cost: CostModel,
            sim_steps: RunResult | None = None, step_cost=None,
            cost_source: dict | None = None) -> ComparisonReport:
    """Build the report from a [`LiveResult`][prefixshield.live.engine.LiveResult] and the
    simulator's `RunResult` of the same trace (rows matched by ``request_id``).

    Args:
        live: the live replay.
        sim: the simulator with the profile ``cost``.
        config: the simulated engine.
        cost: the profile's cost model.
        sim_steps: the simulator replaying the live step times (None: not run; its columns
            are NaN).
        step_cost: the `RecordedStepTimes` that
            ``sim_steps`` ran with (for the step alignment).
        cost_source: where ``cost`` came from (profile name and provenance, or the
            calibration just made), recorded in the report.
    """
    from prefixshield.validate.steptimes import fit_live_steps, profile_residuals

    lv = live.records.set_index("request_id")
    sm = sim.records.set_index("request_id")
    if set(lv.index) != set(sm.index):
        raise ValueError("live and simulated runs hold different request ids")
    sm = sm.loc[lv.index]
    st = sim_steps.records.set_index("request_id").loc[lv.index] if sim_steps is not None \
        else None

    def steps_col(name: str) -> np.ndarray:
        return st[name].to_numpy() if st is not None else np.full(len(lv), np.nan)

    req = pd.DataFrame({
        "request_id": lv.index.to_numpy(),
        "group": lv["group"].to_numpy(),
        "role": lv["role"].to_numpy(),
        "measured": lv["measured"].to_numpy(),
        "prompt_tokens": lv["prompt_tokens"].to_numpy(),
        "cached_vllm": lv["cached_tokens"].to_numpy(),
        "cached_sim": sm["cached_tokens"].to_numpy(),
        "cached_sim_steps": steps_col("cached_tokens"),
        "ttft_vllm_s": lv["ttft_s"].to_numpy(),
        "ttft_sim_s": sm["ttft_s"].to_numpy(),
        "ttft_sim_steps_s": steps_col("ttft_s"),
        "e2e_vllm_s": lv["e2e_s"].to_numpy(),
        "e2e_sim_s": sm["e2e_s"].to_numpy(),
        "e2e_sim_steps_s": steps_col("e2e_s"),
    })
    req["agree"] = req["cached_vllm"] == req["cached_sim"]
    req["agree_steps"] = req["cached_vllm"] == req["cached_sim_steps"]
    n = len(req)
    equal = int(req["agree"].sum())
    agreement = {"requests": n, "equal": equal, "fraction": equal / n if n else float("nan")}
    if st is not None:
        eq_steps = int(req["agree_steps"].sum())
        agreement.update(equal_steps=eq_steps, fraction_steps=eq_steps / n if n else float("nan"))
    rows: list[dict[str, Any]] = []

    def row(metric: str, v: float, s: float, unit: str = "", s2: float = float("nan")) -> None:
        rows.append({"metric": metric, "vllm": float(v), "sim": float(s),
                     "diff_pct": _diff_pct(float(v), float(s)), "sim_steps": float(s2),
                     "steps_diff_pct": _diff_pct(float(v), float(s2)) if np.isfinite(s2)
                     else float("nan"), "unit": unit})

    hit_v = req["cached_vllm"] / req["prompt_tokens"]
    hit_s = req["cached_sim"] / req["prompt_tokens"]
    hit_t = req["cached_sim_steps"] / req["prompt_tokens"]
    row("requests", n, n)
    row("mean hit ratio (all requests)", hit_v.mean(), hit_s.mean(), s2=hit_t.mean())
    m = req["measured"].to_numpy(bool)
    if m.any() and not m.all():
        row("mean hit ratio (measured)", hit_v[m].mean(), hit_s[m].mean(), s2=hit_t[m].mean())
    for g in dict.fromkeys(req["group"]):
        k = (req["group"] == g).to_numpy()
        row(f"mean hit ratio [{g}]", hit_v[k].mean(), hit_s[k].mean(), s2=hit_t[k].mean())
    row("total cached tokens", req["cached_vllm"].sum(), req["cached_sim"].sum(), "tokens",
        s2=req["cached_sim_steps"].sum() if st is not None else float("nan"))
    rows.append({"metric": "cached-token agreement (exact, per request)",
                 "vllm": agreement["fraction"], "sim": agreement["fraction"],
                 "diff_pct": float("nan"),
                 "sim_steps": agreement.get("fraction_steps", float("nan")),
                 "steps_diff_pct": float("nan"), "unit": f"{equal}/{n} requests"})
    for label, col in (("TTFT", "ttft"), ("e2e latency", "e2e")):
        for q in (50, 95):
            row(f"P{q} {label}", 1e3 * _pct(req[f"{col}_vllm_s"], q),
                1e3 * _pct(req[f"{col}_sim_s"], q), "ms",
                s2=1e3 * _pct(req[f"{col}_sim_steps_s"], q))
    row("mean e2e latency", 1e3 * req["e2e_vllm_s"].mean(), 1e3 * req["e2e_sim_s"].mean(), "ms",
        s2=1e3 * req["e2e_sim_steps_s"].mean())
    ps = live.pool_stats or {}
    sim_caused, sim_suffered = _sim_eviction_counts(sim)
    if sim_steps is not None:
        st_caused, st_suffered = _sim_eviction_counts(sim_steps)
        st_total = int(sim_steps.evictions.sum())
    else:
        st_caused, st_suffered, st_total = {}, {}, float("nan")
    nan = float("nan")
    row("evictions (cached blocks reclaimed)", ps.get("num_evictions", nan),
        int(sim.evictions.sum()), "blocks", s2=st_total)
    for g in sim.groups:
        row(f"evictions caused by [{g}]", ps.get("evictions_caused", {}).get(g, 0),
            sim_caused.get(g, 0), "blocks", s2=st_caused.get(g, nan))
        row(f"evictions suffered by [{g}]", ps.get("evictions_suffered", {}).get(g, 0),
            sim_suffered.get(g, 0), "blocks", s2=st_suffered.get(g, nan))
    table = pd.DataFrame(rows, columns=["metric", "vllm", "sim", "diff_pct", "sim_steps",
                                        "steps_diff_pct", "unit"])
    steps = getattr(live, "steps", None)
    steps_meta: dict[str, Any] = {}
    if steps is not None and len(steps):
        steps_meta["profile_residuals"] = profile_residuals(steps, cost)
        fit = fit_live_steps(steps, cost)
        if fit is not None:
            steps_meta["live_fit"] = {"r2": fit.r2, "identifiable": fit.identifiable,
                                      "terms": fit.terms}
        if step_cost is not None:
            steps_meta["alignment"] = step_cost.comparison()
    meta = {
        "policy": live.policy,
        "serialize": live.serialize,
        "live_wall_s": live.wall_s,
        "sim_engine": config.to_dict(),
        "cost_model": dataclasses.asdict(cost),
        "cost_source": cost_source or {},
        "live_pool_stats": ps,
        "sim_policy_stats": sim.policy_stats,
        "sim_evictions": {"groups": list(sim.groups), "matrix": sim.evictions.tolist()},
        "steps": steps_meta,
    }
    return ComparisonReport(table=table, requests=req, agreement=agreement, facts=live.facts,
                            meta=meta, steps=steps)


def sim_config_for(live_facts: dict, check_invariants: bool = False) -> EngineConfig:
    """The simulated engine matching a live engine's resolved facts (compat ``"current"``),
    with the scheduler the live replay ran (``live_facts["scheduler"]``, vLLM's FCFS when
    absent)."""
    from prefixshield.scheduling import SchedulerConfig

    sched = live_facts.get("scheduler")
    return EngineConfig(num_blocks=int(live_facts["num_gpu_blocks"]),
                        block_size=int(live_facts["block_size"]),
                        max_num_seqs=int(live_facts["max_num_seqs"]),
                        max_num_batched_tokens=int(live_facts["max_num_batched_tokens"]),
                        vllm_compat="current", check_invariants=check_invariants,
                        scheduler=SchedulerConfig.from_dict(sched) if sched
                        else SchedulerConfig())


def compare_with_sim(live, trace: Trace, cost: CostModel, policy_args: dict | None = None,
                     check_invariants: bool = False, replay_steps: bool = True,
                     cost_source: dict | None = None) -> ComparisonReport:
    """Simulate ``trace`` like the live run ``live`` (same policy, engine facts and mode; live
    submission times as ``not_before`` when serialized) and build the report.

    With ``replay_steps`` (and steps recorded live) the trace is simulated a second time with
    the live step times as the cost model (`RecordedStepTimes`),
    which isolates the scheduler and queueing model from the profile.
    """
    from prefixshield.validate.steptimes import RecordedStepTimes

    config = sim_config_for(live.facts, check_invariants)
    nb = None
    if live.serialize:
        sub = live.records.set_index("request_id")["submit_s"]
        nb = sub.loc[trace.requests["request_id"].to_numpy()].to_numpy(np.float64)
    sim = simulate(trace, live.policy, config, cost, serialize=live.serialize,
                   policy_args=policy_args, not_before=nb)
    sim_steps = step_cost = None
    steps = getattr(live, "steps", None)
    if replay_steps and steps is not None and len(steps):
        step_cost = RecordedStepTimes(steps, fallback=cost)
        # Serialized: each request arrives exactly when it was submitted live. With the live
        # step times a request lasts as long as it did live, so it has finished before the
        # next submission -- unless the simulator schedules it in more steps, which the step
        # alignment then shows. (Bounds from the profile would not hold for live step times.)
        replayed = at_arrivals(trace, nb) if live.serialize else trace
        sim_steps = simulate(replayed, live.policy, config, step_cost, serialize=False,
                             policy_args=policy_args, step_by_step=True)
    return compare(live, sim, config, cost, sim_steps=sim_steps, step_cost=step_cost,
                   cost_source=cost_source)


# ------------------------------------------------------------------------------------ output
def _fmt(v: float, unit: str) -> str:
    if not np.isfinite(v):
        return "—"
    if unit == "ms":
        return f"{v:.2f}"
    if float(v).is_integer() and (abs(v) >= 1 or unit in ("tokens", "blocks")):
        return f"{int(v)}"
    return f"{v:.4f}"


def _pct_text(v: float) -> str:
    return "—" if not np.isfinite(v) else f"{100 * v:+.1f}%"


def _diff_cell(v: float) -> str:
    return "—" if not np.isfinite(v) else f"{v:+.1f}"


def _steps_markdown(m: dict) -> list[str]:
    steps = m.get("steps") or {}
    if not steps:
        return []
    lines = ["", "## Step times", ""]
    al = steps.get("alignment")
    if al:
        lines.append(f"- steps: live {al['live_steps']}, simulated {al['sim_steps']}; "
                     f"{al['identical']} of the {al['compared']} common positions schedule the "
                     "same batch (prefill tokens, decoding sequences, context, new requests)")
        d = al.get("first_difference")
        if d:
            lines.append(f"- first difference at step {d['step']}: live {d['live']}, "
                         f"simulated {d['sim']}")
    r = steps.get("profile_residuals") or {}
    if r.get("steps"):
        lines.append(f"- the profile against the {r['steps']} live steps: median |relative "
                     f"error| {100 * r['median_abs_rel_error']:.1f}%, P95 "
                     f"{100 * r['p95_abs_rel_error']:.1f}%, signed median "
                     f"{100 * r['median_rel_error']:+.1f}% (negative: the profile is faster "
                     f"than this machine); total {r['profile_total_s']:.3f} s predicted vs "
                     f"{r['live_total_s']:.3f} s live")
        if "prefill_steps" in r:
            lines.append(f"- by step kind (signed median): the {r['prefill_steps']} steps that "
                         f"prefill {_pct_text(r['prefill_median_rel_error'])} (TTFT is made of "
                         f"these), the {r['decode_steps']} pure-decode steps "
                         f"{_pct_text(r['decode_median_rel_error'])}")
    fit = steps.get("live_fit")
    if fit:
        note = "" if fit["identifiable"] else (" A feature did not vary over these steps, so "
                                                "its term is confounded with a: read the "
                                                "totals, not the terms.")
        lines += ["", f"Cost model fitted to the live steps (R² {fit['r2']:.3f}) against the "
                  f"profile.{note}", "",
                  "| term | per | profile | fitted on live steps | live / profile | "
                  "share of live step time |", "|---|---|---:|---:|---:|---:|"]
        for t in fit["terms"]:
            ratio = "—" if not np.isfinite(t["ratio"]) else f"{t['ratio']:.2f}x"
            lines.append(f"| {t['term']} | {t['per']} | {t['profile']:.4g} | "
                         f"{t['live_fit']:.4g} | {ratio} | {100 * t['share']:.0f}% |")

    return lines


def to_markdown(report: ComparisonReport) -> str:
    """The report as Markdown: metrics table (vLLM, the simulator with the profile, the
    simulator with the live step times), step-time analysis, disagreeing requests, engine
    facts."""
    m = report.meta
    src = m.get("cost_source") or {}
    lines = [f"# sim vs live: policy `{m.get('policy')}`, "
             f"{'serialized' if m.get('serialize') else 'timed'} arrivals", "",
             f"Sim: the simulator with the cost model {src.get('name', '(given)')}"
             f"{' (' + src['how'] + ')' if src.get('how') else ''}. Sim (live steps): the "
             "simulator pricing its k-th step with the live engine's k-th step (scheduler and "
             "queueing model alone).", "",
             "| Metric | vLLM | Sim | Diff% | Sim (live steps) | Diff% |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in report.table.itertuples(index=False):
        unit = r.unit
        label = f"{r.metric} ({unit})" if unit else r.metric
        if r.metric.startswith("cached-token agreement"):
            a = report.agreement
            steps = (f"{a['equal_steps']}/{a['requests']} ({100 * a['fraction_steps']:.1f}%)"
                     if "equal_steps" in a else "—")
            lines.append(f"| {r.metric} | | {unit} ({100 * r.vllm:.1f}%) | | {steps} | |")
            continue
        lines.append(f"| {label} | {_fmt(r.vllm, unit)} | {_fmt(r.sim, unit)} | "
                     f"{_diff_cell(r.diff_pct)} | {_fmt(r.sim_steps, unit)} | "
                     f"{_diff_cell(r.steps_diff_pct)} |")
    lines += _steps_markdown(m)
    dis = report.disagreements
    lines += ["", f"## Cached-token disagreements: {len(dis)} of {report.agreement['requests']}"]
    if len(dis):
        lines += ["", "| request_id | group | role | prompt tokens | vLLM cached | Sim cached | "
                  "Sim (live steps) cached |", "|---:|---|---|---:|---:|---:|---:|"]
        for r in dis.itertuples(index=False):
            lines.append(f"| {r.request_id} | {r.group} | {r.role} | {r.prompt_tokens} | "
                         f"{r.cached_vllm} | {r.cached_sim} | {_fmt(r.cached_sim_steps, 'tokens')} |")
    lines += ["", "## Engine facts (live)", "", "| fact | value |", "|---|---|"]
    for k, v in report.facts.items():
        lines.append(f"| {k} | {v} |")
    c = m.get("cost_model", {})
    lines += ["", "## Simulator", "",
              f"- engine: {json.dumps(m.get('sim_engine', {}), sort_keys=True)}",
              f"- cost model: {json.dumps(c, sort_keys=True)}"]
    if src:
        lines.append(f"- cost model source: {json.dumps(src, sort_keys=True, default=str)}")
    lines += [f"- live replay wall time: {m.get('live_wall_s', float('nan')):.2f} s", ""]
    return "\n".join(lines)


def _jsonable(x: Any) -> Any:
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return None if not np.isfinite(x) else float(x)
    if isinstance(x, np.bool_):
        return bool(x)
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    raise TypeError(f"not JSON-serializable: {type(x).__name__}")


def _clean(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def to_json(report: ComparisonReport) -> str:
    """The whole report (table, agreement, disagreements, facts, meta) as JSON text."""
    data = {
        "table": report.table.to_dict(orient="records"),
        "agreement": report.agreement,
        "disagreements": report.disagreements.drop(columns=["agree", "agree_steps"]).to_dict(
            orient="records"),
        "facts": report.facts,
        "meta": report.meta,
    }
    return json.dumps(_clean(json.loads(json.dumps(data, default=_jsonable))), indent=2) + "\n"


def write_report(report: ComparisonReport, out_dir: str | Path,
                 stem: str = "sim_vs_live") -> list[Path]:
    """Write ``<stem>.md``, ``<stem>.csv`` (the metric table), ``<stem>.json``,
    ``<stem>_requests.csv`` and (when recorded) ``<stem>_steps.csv`` (the live engine's steps)
    into ``out_dir``, each atomically; returns the paths."""
    out = Path(out_dir)
    paths = [out / f"{stem}.md", out / f"{stem}.csv", out / f"{stem}.json",
             out / f"{stem}_requests.csv"]
    write_text(paths[0], to_markdown(report))
    write_text(paths[1], report.table.to_csv(index=False))
    write_text(paths[2], to_json(report))
    write_text(paths[3], report.requests.to_csv(index=False))
    if report.steps is not None and len(report.steps):
        paths.append(out / f"{stem}_steps.csv")
        write_text(paths[4], report.steps.to_csv(index=False))
    return paths


def calibrate_engine(engine, grid=None, progress=None):
    """Measure a cost model on ``engine`` (a [`LiveEngine`][prefixshield.live.engine.LiveEngine])
    now, with `for_validation` unless
    ``grid`` is given; returns ``(fit, measurement, source)`` where ``source`` describes it for
    a report's ``cost_source``."""
    from prefixshield.calibrate.fit import fit_cost_model
    from prefixshield.calibrate.measure import CalibrationGrid, measure_step_times

    grid = grid or CalibrationGrid.for_validation()
    engine.native()  # the calibration's requests belong to no trace group
    m = measure_step_times(live=engine, grid=grid, progress=progress)
    fit = fit_cost_model(m)
    source = {"name": "calibrated on this engine before the replay",
              "how": f"validate --calibrate: {fit.num_samples} timed steps, R² {fit.r2:.3f}, "
                     f"median |relative error| {100 * fit.median_abs_rel_error:.1f}%",
              "grid": grid.describe(), "r2": fit.r2,
              "median_abs_rel_error": fit.median_abs_rel_error,
              "num_samples": fit.num_samples, "cost": dataclasses.asdict(fit.cost)}
    return fit, m, source


def validate(trace: Trace, policy_name: str, engine: LiveEngineConfig | LiveEngine,
             cost: CostModel | None,
             serialize: bool = True, policy_args: dict | None = None,
             check_invariants: bool = False, out_dir: str | Path | None = None,
             calibrate: bool = False, cost_source: dict | None = None) -> ComparisonReport:
    """Replay ``trace`` live and in the simulator, build the report and write it to
    ``out_dir`` if given.

    Args:
        engine: the live engine: a [`LiveEngineConfig`][prefixshield.live.engine.LiveEngineConfig]
            (model, pool, batching, forced outputs; an engine is started with it and closed
            after), or a running [`LiveEngine`][prefixshield.live.engine.LiveEngine] to reuse
            (its own settings apply).
        calibrate: measure the cost model on the engine right before the replay
            (`calibrate_engine`) and simulate with it instead of ``cost``.
        cost_source: where ``cost`` came from, recorded in the report.
    """
    from prefixshield.live.engine import LiveEngine, LiveEngineConfig

    own = isinstance(engine, LiveEngineConfig)
    if own:
        engine = LiveEngine(engine)
    try:
        if calibrate:
            fit, _m, cost_source = calibrate_engine(engine)
            cost = fit.cost
        if cost is None:
            raise ValueError("validate needs a cost model or calibrate=True")
        live = engine.replay(trace, policy_name, serialize=serialize, policy_args=policy_args,
                             check_invariants=check_invariants)
    finally:
        if own:
            engine.close()
    report = compare_with_sim(live, trace, cost, policy_args=policy_args,
                              check_invariants=check_invariants, cost_source=cost_source)
    if out_dir is not None:
        write_report(report, out_dir)
    return report
