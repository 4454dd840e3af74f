"""Sim-vs-live: the same trace through the simulator and a real vLLM, side by side.

:func:`simulate` runs the trace in :class:`prefixshield.simulator.engine.Engine` with the live
engine's settings (blocks, block size, ``max_num_seqs``, ``max_num_batched_tokens``, compat
``"current"``, the same policy) and a caller-given :class:`CostModel`. :func:`compare` joins the
two per-request record sets and builds the report table ``Metric / vLLM / Sim / Diff%``
(``Diff% = 100 * (Sim - vLLM) / vLLM``): mean hit ratio (all, measured, per group), per-request
cached-token agreement (exact equality, with the list of disagreeing requests), P50/P95 TTFT,
mean end-to-end latency, evictions caused and suffered per group, plus the engine facts.
:func:`write_report` writes it as Markdown, CSV and JSON (atomically, :mod:`prefixshield.atomic`).

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
from typing import Any

import numpy as np
import pandas as pd

from prefixshield.atomic import write_text
from prefixshield.policies import make_policy
from prefixshield.simulator.config import EngineConfig
from prefixshield.simulator.costmodel import CostModel
from prefixshield.simulator.engine import Engine, RunResult
from prefixshield.traces.schema import Trace

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


def simulate(trace: Trace, policy_name: str, config: EngineConfig, cost: CostModel,
             serialize: bool = True, policy_args: dict | None = None,
             not_before: np.ndarray | None = None) -> RunResult:
    """Run ``trace`` in the simulator under ``policy_name`` (serialized arrivals if asked).

    Args:
        trace: the trace.
        policy_name: registered policy.
        config: engine settings (use ``vllm_compat="current"`` to compare with vLLM >= 0.28).
        cost: step-time model.
        serialize: rewrite arrivals with :func:`serialize_trace` first.
        policy_args: keyword arguments for ``make_policy``.
        not_before: see :func:`serialize_trace`.
    """
    tr = serialize_trace(trace, cost, config, not_before) if serialize else trace
    policy = make_policy(policy_name, config.num_blocks, vllm_compat=config.vllm_compat,
                         **(policy_args or {}))
    return Engine(tr, policy, cost, config).run()


@dataclass
class ComparisonReport:
    """One sim-vs-live comparison.

    Attributes:
        table: rows ``metric, vllm, sim, diff_pct, unit`` (numbers; NaN where not applicable).
        requests: per request: identity, ``prompt_tokens``, ``cached_vllm``, ``cached_sim``,
            ``ttft_vllm_s``, ``ttft_sim_s``, ``e2e_vllm_s``, ``e2e_sim_s``, ``agree``.
        agreement: ``{"requests", "equal", "fraction"}`` of exact cached-token agreement.
        facts: engine facts of the live run.
        meta: policy, mode, simulated engine config, cost model, pool and policy stats.
    """

    table: pd.DataFrame
    requests: pd.DataFrame
    agreement: dict
    facts: dict
    meta: dict = field(default_factory=dict)

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


def compare(live, sim: RunResult, config: EngineConfig, cost: CostModel) -> ComparisonReport:
    """Build the report from a :class:`~prefixshield.validate.live.LiveResult` and the
    simulator's :class:`RunResult` of the same trace (rows matched by ``request_id``)."""
    lv = live.records.set_index("request_id")
    sm = sim.records.set_index("request_id")
    if set(lv.index) != set(sm.index):
        raise ValueError("live and simulated runs hold different request ids")
    sm = sm.loc[lv.index]
    req = pd.DataFrame({
        "request_id": lv.index.to_numpy(),
        "group": lv["group"].to_numpy(),
        "role": lv["role"].to_numpy(),
        "measured": lv["measured"].to_numpy(),
        "prompt_tokens": lv["prompt_tokens"].to_numpy(),
        "cached_vllm": lv["cached_tokens"].to_numpy(),
        "cached_sim": sm["cached_tokens"].to_numpy(),
        "ttft_vllm_s": lv["ttft_s"].to_numpy(),
        "ttft_sim_s": sm["ttft_s"].to_numpy(),
        "e2e_vllm_s": lv["e2e_s"].to_numpy(),
        "e2e_sim_s": sm["e2e_s"].to_numpy(),
    })
    req["agree"] = req["cached_vllm"] == req["cached_sim"]
    n = len(req)
    equal = int(req["agree"].sum())
    agreement = {"requests": n, "equal": equal, "fraction": equal / n if n else float("nan")}
    rows: list[dict[str, Any]] = []

    def row(metric: str, v: float, s: float, unit: str = "") -> None:
        rows.append({"metric": metric, "vllm": float(v), "sim": float(s),
                     "diff_pct": _diff_pct(float(v), float(s)), "unit": unit})

    hit_v = req["cached_vllm"] / req["prompt_tokens"]
    hit_s = req["cached_sim"] / req["prompt_tokens"]
    row("requests", n, n)
    row("mean hit ratio (all requests)", hit_v.mean(), hit_s.mean())
    m = req["measured"].to_numpy(bool)
    if m.any() and not m.all():
        row("mean hit ratio (measured)", hit_v[m].mean(), hit_s[m].mean())
    for g in dict.fromkeys(req["group"]):
        k = (req["group"] == g).to_numpy()
        row(f"mean hit ratio [{g}]", hit_v[k].mean(), hit_s[k].mean())
    row("total cached tokens", req["cached_vllm"].sum(), req["cached_sim"].sum(), "tokens")
    rows.append({"metric": "cached-token agreement (exact, per request)",
                 "vllm": agreement["fraction"], "sim": agreement["fraction"],
                 "diff_pct": float("nan"), "unit": f"{equal}/{n} requests"})
    row("P50 TTFT", 1e3 * _pct(req["ttft_vllm_s"], 50), 1e3 * _pct(req["ttft_sim_s"], 50), "ms")
    row("P95 TTFT", 1e3 * _pct(req["ttft_vllm_s"], 95), 1e3 * _pct(req["ttft_sim_s"], 95), "ms")
    row("mean e2e latency", 1e3 * req["e2e_vllm_s"].mean(), 1e3 * req["e2e_sim_s"].mean(), "ms")
    ps = live.pool_stats or {}
    sim_caused, sim_suffered = _sim_eviction_counts(sim)
    row("evictions (cached blocks reclaimed)", ps.get("num_evictions", float("nan")),
        int(sim.evictions.sum()), "blocks")
    for g in sim.groups:
        row(f"evictions caused by [{g}]", ps.get("evictions_caused", {}).get(g, 0),
            sim_caused.get(g, 0), "blocks")
        row(f"evictions suffered by [{g}]", ps.get("evictions_suffered", {}).get(g, 0),
            sim_suffered.get(g, 0), "blocks")
    table = pd.DataFrame(rows, columns=["metric", "vllm", "sim", "diff_pct", "unit"])
    meta = {
        "policy": live.policy,
        "serialize": live.serialize,
        "live_wall_s": live.wall_s,
        "sim_engine": config.to_dict(),
        "cost_model": dataclasses.asdict(cost),
        "live_pool_stats": ps,
        "sim_policy_stats": sim.policy_stats,
        "sim_evictions": {"groups": list(sim.groups), "matrix": sim.evictions.tolist()},
    }
    return ComparisonReport(table=table, requests=req, agreement=agreement, facts=live.facts,
                            meta=meta)


def sim_config_for(live_facts: dict, check_invariants: bool = False) -> EngineConfig:
    """The simulated engine matching a live engine's resolved facts (compat ``"current"``)."""
    return EngineConfig(num_blocks=int(live_facts["num_gpu_blocks"]),
                        block_size=int(live_facts["block_size"]),
                        max_num_seqs=int(live_facts["max_num_seqs"]),
                        max_num_batched_tokens=int(live_facts["max_num_batched_tokens"]),
                        vllm_compat="current", check_invariants=check_invariants)


def compare_with_sim(live, trace: Trace, cost: CostModel, policy_args: dict | None = None,
                     check_invariants: bool = False) -> ComparisonReport:
    """Simulate ``trace`` like the live run ``live`` (same policy, engine facts and mode; live
    submission times as ``not_before`` when serialized) and build the report."""
    config = sim_config_for(live.facts, check_invariants)
    nb = None
    if live.serialize:
        sub = live.records.set_index("request_id")["submit_s"]
        nb = sub.loc[trace.requests["request_id"].to_numpy()].to_numpy(np.float64)
    sim = simulate(trace, live.policy, config, cost, serialize=live.serialize,
                   policy_args=policy_args, not_before=nb)
    return compare(live, sim, config, cost)


# ------------------------------------------------------------------------------------ output
def _fmt(v: float, unit: str) -> str:
    if not np.isfinite(v):
        return "—"
    if unit == "ms":
        return f"{v:.2f}"
    if float(v).is_integer() and abs(v) >= 1:
        return f"{int(v)}"
    return f"{v:.4f}"


def to_markdown(report: ComparisonReport) -> str:
    """The report as Markdown: metrics table, disagreeing requests, engine facts."""
    m = report.meta
    lines = [f"# sim vs live: policy `{m.get('policy')}`, "
             f"{'serialized' if m.get('serialize') else 'timed'} arrivals", "",
             "| Metric | vLLM | Sim | Diff% |", "|---|---:|---:|---:|"]
    for r in report.table.itertuples(index=False):
        unit = r.unit
        label = f"{r.metric} ({unit})" if unit and unit not in ("",) else r.metric
        if r.metric.startswith("cached-token agreement"):
            lines.append(f"| {r.metric} | {unit} ({100 * r.vllm:.1f}%) | | |")
            continue
        diff = "—" if not np.isfinite(r.diff_pct) else f"{r.diff_pct:+.1f}"
        lines.append(f"| {label} | {_fmt(r.vllm, unit)} | {_fmt(r.sim, unit)} | {diff} |")
    dis = report.disagreements
    lines += ["", f"## Cached-token disagreements: {len(dis)} of {report.agreement['requests']}"]
    if len(dis):
        lines += ["", "| request_id | group | role | prompt tokens | vLLM cached | Sim cached |",
                  "|---:|---|---|---:|---:|---:|"]
        for r in dis.itertuples(index=False):
            lines.append(f"| {r.request_id} | {r.group} | {r.role} | {r.prompt_tokens} | "
                         f"{r.cached_vllm} | {r.cached_sim} |")
    lines += ["", "## Engine facts (live)", "", "| fact | value |", "|---|---|"]
    for k, v in report.facts.items():
        lines.append(f"| {k} | {v} |")
    c = m.get("cost_model", {})
    lines += ["", "## Simulator", "",
              f"- engine: {json.dumps(m.get('sim_engine', {}), sort_keys=True)}",
              f"- cost model: {json.dumps(c, sort_keys=True)}",
              f"- live replay wall time: {m.get('live_wall_s', float('nan')):.2f} s", ""]
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
        "disagreements": report.disagreements.drop(columns=["agree"]).to_dict(orient="records"),
        "facts": report.facts,
        "meta": report.meta,
    }
    return json.dumps(_clean(json.loads(json.dumps(data, default=_jsonable))), indent=2) + "\n"


def write_report(report: ComparisonReport, out_dir: str | Path,
                 stem: str = "sim_vs_live") -> list[Path]:
    """Write ``<stem>.md``, ``<stem>.csv`` (the metric table), ``<stem>.json`` and
    ``<stem>_requests.csv`` into ``out_dir``, each atomically; returns the paths."""
    out = Path(out_dir)
    paths = [out / f"{stem}.md", out / f"{stem}.csv", out / f"{stem}.json",
             out / f"{stem}_requests.csv"]
    write_text(paths[0], to_markdown(report))
    write_text(paths[1], report.table.to_csv(index=False))
    write_text(paths[2], to_json(report))
    write_text(paths[3], report.requests.to_csv(index=False))
    return paths


def validate(trace: Trace, policy_name: str, model_dir: str, num_blocks: int, cost: CostModel,
             block_size: int = 32, serialize: bool = True, max_num_seqs: int = 256,
             max_num_batched_tokens: int = 8192, policy_args: dict | None = None,
             check_invariants: bool = False, out_dir: str | Path | None = None,
             engine=None) -> ComparisonReport:
    """Replay ``trace`` live (:func:`~prefixshield.validate.live.replay_live`) and in the
    simulator, build the report and write it to ``out_dir`` if given. ``engine`` reuses a
    :class:`~prefixshield.validate.live.LiveEngine` (its own engine settings then apply)."""
    from prefixshield.validate.live import replay_live

    live = replay_live(trace, policy_name, model_dir, num_blocks, block_size=block_size,
                       serialize=serialize, max_num_seqs=max_num_seqs,
                       max_num_batched_tokens=max_num_batched_tokens, policy_args=policy_args,
                       check_invariants=check_invariants, engine=engine)
    report = compare_with_sim(live, trace, cost, policy_args=policy_args,
                              check_invariants=check_invariants)
    if out_dir is not None:
        write_report(report, out_dir)
    return report
