"""The validation matrix: ``validate`` over a grid of workloads x policies x modes, one table.

A cell is one `ValidationCell` (workload and its CPU-sized overrides, policy, serialized
or timed arrivals, engine size); `run_cell` is what ``prefixshield validate`` runs for
one, and `run_matrix` runs many on one live engine (the engine settings are the matrix's,
so start-up is paid once), writing each cell's full report under ``OUT/cells/<label>/`` and the
summary ``OUT/matrix.{md,csv,json}`` with the machine and versions it came from. A cell whose
report exists is not rerun (an interrupted matrix resumes); the summary is rebuilt from the
cells' JSON reports.

`DEFAULT_CELLS` is the matrix ``prefixshield validate-matrix`` runs by default: one_touch,
two_pass_replay, low_and_slow and sharegpt, each x lru, prefixshield x serialized, timed, on 64
blocks of 32 tokens. The workload sizes (prefix tokens, durations, rates) are set so that a
whole cell runs in well under a minute on two CPU cores with the tiny model; they are sizes for
a CPU check of the simulator against vLLM, not the reference's experiment sizes. Outputs stay
the workloads' own (real output-length distributions), clipped at ``max_output_tokens=512``
(vLLM's ``max_tokens``) so that every request fits the 2,016-token KV cache.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from prefixshield.atomic import write_text
from prefixshield.scheduling import SchedulerConfig


@dataclass(frozen=True)
class ValidationCell:
    """One ``validate`` run.

    Attributes:
        workload: a generated workload name or a trace ``.parquet`` file.
        policy: the policy spec installed live and simulated.
        timed: arrivals on the wall clock (True) or one request at a time.
        seed: trace seed.
        alpha: nominal load (used when ``base_rate`` is not among the overrides).
        overrides: workload parameters as ``KEY=VALUE`` strings (as ``--set`` takes them).
        num_blocks, block_size, max_num_seqs, max_num_batched_tokens: the engine (blocks
            include the null block; tokens per block; scheduler limits).
        dtype: the model dtype vLLM runs (float32 for the tiny CPU model; bfloat16 on a GPU).
        scheduler: the scheduling policy and per-tenant limits, live and simulated (see
            `prefixshield.live.scheduling` for how the live engine runs them).
    """

    workload: str
    policy: str
    timed: bool = False
    seed: int = 0
    alpha: float = 0.6
    overrides: tuple[str, ...] = ()
    num_blocks: int = 64
    block_size: int = 32
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 8192
    dtype: str = "float32"
    scheduler: SchedulerConfig = SchedulerConfig()

    @property
    def label(self) -> str:
        """``workload-policy-mode``, a folder name."""
        name = Path(self.workload).stem if self.workload.endswith(".parquet") else self.workload
        policy = self.policy.replace(":", "_").replace(",", "_").replace("=", "-")
        sched = "" if self.scheduler.is_default else f"-{self.scheduler.name}"
        return f"{name}-{policy}{sched}-{'timed' if self.timed else 'serialized'}"

    def engine_key(self) -> tuple:
        """The live-engine settings; cells with equal keys can share one engine."""
        return (self.num_blocks, self.block_size, self.max_num_seqs, self.max_num_batched_tokens,
                self.dtype)


_CPU_ATTACK = ("prefix_tokens=256", "hot_fraction=0.5", "max_output_tokens=512")
_CPU_SHAREGPT = ("max_conversation_tokens=1024", "system_prompt_tokens=64", "warmup_s=0",
                 "think_time_s=2", "min_think_time_s=0.5")
MATRIX_WORKLOADS: dict[str, tuple[str, ...]] = {
    "one_touch": _CPU_ATTACK + ("duration_s=6",),
    "two_pass_replay": _CPU_ATTACK + ("duration_s=6",),
    "low_and_slow": _CPU_ATTACK + ("duration_s=8",),
    "sharegpt": _CPU_SHAREGPT + ("duration_s=12",),
}
"""The default matrix's workloads and their CPU sizes (see the module docstring)."""

MATRIX_POLICIES = ("lru", "prefixshield")
"""The default matrix's policies."""


def default_cells(workloads=None, policies=MATRIX_POLICIES, modes=("serialized", "timed"),
                  seed: int = 0, extra: tuple[str, ...] = (), alpha: float = 0.6,
                  **engine: Any) -> list[ValidationCell]:
    """The matrix over ``workloads`` (names of `MATRIX_WORKLOADS`; None: all) x
    ``policies`` x ``modes``; ``extra`` ``KEY=VALUE`` overrides go after each workload's own
    (the last of a key wins); a generated workload's rate is ``alpha`` x ``C_prefill`` of the
    profile the cell runs with (the calibrated one with ``--calibrate``); ``engine`` sets
    `ValidationCell` engine fields (``num_blocks``, ``block_size``, ``max_num_seqs``,
    ``max_num_batched_tokens``, ``dtype``)."""
    names = list(MATRIX_WORKLOADS) if workloads is None else list(workloads)
    for w in names:
        if w not in MATRIX_WORKLOADS:
            raise ValueError(f"unknown matrix workload {w!r}; known: "
                             f"{', '.join(MATRIX_WORKLOADS)}")
    for m in modes:
        if m not in ("serialized", "timed"):
            raise ValueError(f"unknown mode {m!r}; known: serialized, timed")
    return [ValidationCell(workload=w, policy=p, timed=(m == "timed"), seed=seed, alpha=alpha,
                           overrides=MATRIX_WORKLOADS[w] + tuple(extra), **engine)
            for w in names for p in policies for m in modes]


DEFAULT_CELLS = default_cells()
"""The default matrix: 4 workloads x 2 policies x 2 modes."""


def typed_overrides(cell: ValidationCell) -> dict:
    """``cell.overrides`` typed against its workload's parameters (``ValueError`` naming the
    bad item)."""
    from prefixshield.experiments.overrides import parse_overrides
    from prefixshield.experiments.single import is_trace_file
    from prefixshield.workloads import WORKLOADS

    if is_trace_file(cell.workload):
        if cell.overrides:
            raise ValueError(f"{cell.label}: overrides apply to generated workloads, not trace "
                             "files")
        return {}
    if cell.workload not in WORKLOADS:
        raise ValueError(f"unknown workload {cell.workload!r}; known: "
                         f"{', '.join(sorted(WORKLOADS))} (or a .parquet trace file)")
    return parse_overrides(WORKLOADS[cell.workload].params_type, cell.overrides)


def _build_trace(cell: ValidationCell, profile):
    from prefixshield.experiments.single import RunSpec, build_trace
    from prefixshield.simulator.config import EngineConfig

    typed = typed_overrides(cell)
    engine = EngineConfig(num_blocks=cell.num_blocks, block_size=cell.block_size,
                          max_num_seqs=cell.max_num_seqs,
                          max_num_batched_tokens=cell.max_num_batched_tokens,
                          vllm_compat="current")
    spec = RunSpec(workload=cell.workload, policies=(cell.policy,), engine=engine,
                   profile=profile, alpha=cell.alpha, seed=cell.seed, overrides=typed)
    trace, _info = build_trace(spec)
    return trace


def _policy(spec: str) -> tuple[str, dict]:
    from prefixshield.experiments.overrides import parse_policy_spec

    return parse_policy_spec(spec)


def start_engine(cell: ValidationCell, model_dir: str | Path, force_outputs: bool = True):
    """A [`LiveEngine`][prefixshield.live.engine.LiveEngine] with ``cell``'s engine settings."""
    from prefixshield.live.engine import LiveEngine, LiveEngineConfig

    return LiveEngine(LiveEngineConfig(model_dir=str(model_dir), num_blocks=cell.num_blocks,
                                       block_size=cell.block_size,
                                       max_num_seqs=cell.max_num_seqs,
                                       max_num_batched_tokens=cell.max_num_batched_tokens,
                                       dtype=cell.dtype, force_outputs=force_outputs))


def ensure_model(model_dir: str | Path | None, out_dir: str | Path) -> Path:
    """``model_dir``, or a tiny-qwen2 written once to ``out_dir/model``."""
    from prefixshield.live.tinymodel import write_tiny_model

    if model_dir is not None:
        return Path(model_dir)
    path = Path(out_dir) / "model"
    if not (path / "config.json").exists():
        write_tiny_model(path, overwrite=True)
    return path


def run_cell(cell: ValidationCell, out_dir: str | Path, profile: str | None = None,
             calibrate: bool = False, model_dir: str | Path | None = None,
             force_outputs: bool = True, check_invariants: bool = False, console=None,
             engine=None):
    """Run one cell: trace, (calibration,) live replay, both simulations, report in
    ``out_dir``; returns the [`ComparisonReport`][prefixshield.validate.compare.ComparisonReport].

    Args:
        cell: what to run.
        out_dir: the report folder (``sim_vs_live.*``; ``calibrated_profile.toml`` with
            ``calibrate``).
        profile: a shipped profile name or a ``.toml`` path (the simulated side's cost model,
            and the one that sizes a generated workload's rate); not with ``calibrate``.
        calibrate: measure the profile on the live engine right before the replay and use it
            for both.
        model_dir: the model (None: a tiny-qwen2 in ``out_dir/model``; ignored with ``engine``).
        force_outputs: the live model generates the simulator's output tokens.
        check_invariants: check pool/policy invariants after every pool call (slow).
        console: a rich console for status lines (None: quiet).
        engine: reuse this live engine (its settings must be ``cell``'s).
    """
    from prefixshield.simulator.costmodel import Profile, load_profile
    from prefixshield.validate.compare import calibrate_engine, compare_with_sim, write_report
    from prefixshield.live.engine import LiveError
    from prefixshield.live.plugin import PluginError

    if calibrate == (profile is not None):
        raise ValueError("give exactly one of a profile or calibrate=True")
    name, args = _policy(cell.policy)
    typed_overrides(cell)  # bad settings fail before vLLM starts
    prof = None if calibrate else load_profile(profile)
    from prefixshield.live.scheduling import check_supported

    check_supported(cell.scheduler)
    if prof is not None:
        trace = _build_trace(cell, prof)  # bad workload settings fail before vLLM starts
        cell.scheduler.resolve(trace.group_names())  # so does a group the trace lacks
    own = engine is None
    if own:
        model = ensure_model(model_dir, out_dir)
        _say(console, f"starting vLLM ({cell.num_blocks} blocks x {cell.block_size} tokens, "
                      f"model {model})")
        engine = start_engine(cell, model, force_outputs)
    elif tuple(engine.facts()[k] for k in ("num_gpu_blocks", "block_size", "max_num_seqs",
                                           "max_num_batched_tokens", "dtype")) \
            != cell.engine_key():
        raise ValueError(f"{cell.label}: the engine given has other settings than the cell")
    try:
        if calibrate:
            _say(console, "calibrating the cost model on this engine")
            fit, m, source = calibrate_engine(engine)
            prof = Profile(name="calibrated", cost=fit.cost,
                           provenance={"status": "measured", "how": source["how"]})
            from prefixshield.calibrate.fit import write_profile

            Path(out_dir).mkdir(parents=True, exist_ok=True)
            write_profile(str(Path(out_dir) / "calibrated_profile.toml"), "calibrated", fit,
                          m.facts, source["grid"])
            trace = _build_trace(cell, prof)
        else:
            source = {"name": prof.name, "how": prof.provenance.get("status", ""),
                      "provenance": prof.provenance}
        _say(console, f"{cell.label}: {len(trace)} requests; replaying on vLLM")
        live = engine.replay(trace, name, serialize=not cell.timed, policy_args=args,
                             check_invariants=check_invariants, scheduler=cell.scheduler)
    except (LiveError, PluginError) as e:
        raise ValueError(f"{cell.label}: {e}") from None
    finally:
        if own:
            engine.close()
    _say(console, f"{cell.label}: simulating (profile, then the live step times)")
    report = compare_with_sim(live, trace, prof.cost, policy_args=args,
                              check_invariants=check_invariants, cost_source=source)
    report.meta["cell"] = cell_dict(cell)
    report.meta["run"] = {"profile": profile, "calibrate": calibrate,
                          "force_outputs": bool(live.facts.get("forced_outputs"))}
    write_report(report, out_dir)
    return report


def cell_dict(cell: ValidationCell) -> dict:
    """``cell`` as a plain dict for reports; the scheduler only when it is not vLLM's default,
    so that cells stored before schedulers existed still match (and resume)."""
    d = asdict(cell)
    d["scheduler"] = cell.scheduler.to_dict()
    if cell.scheduler.is_default:
        del d["scheduler"]
    return d


def _say(console, text: str) -> None:
    if console is not None:
        console.print(f"[dim]{text}[/]")


# ------------------------------------------------------------------------------------ summary
def _metric(table: list[dict], name: str) -> dict:
    for r in table:
        if r["metric"] == name:
            return r
    return {}


def summary_row(cell_label: str, data: dict) -> dict[str, Any]:
    """One summary row from a cell's ``sim_vs_live.json``."""
    t = data["table"]
    a = data["agreement"]
    meta = data["meta"]
    steps = meta.get("steps") or {}
    res = steps.get("profile_residuals") or {}
    al = steps.get("alignment") or {}
    row: dict[str, Any] = {
        "cell": cell_label, "workload": meta.get("cell", {}).get("workload"),
        "policy": meta["policy"], "mode": "serialized" if meta["serialize"] else "timed",
        "requests": a["requests"],
        "cached_equal": a["equal"], "cached_equal_steps": a.get("equal_steps"),
    }
    for metric, key in (("P50 TTFT", "p50_ttft"), ("P95 TTFT", "p95_ttft"),
                        ("P50 e2e latency", "p50_e2e"), ("P95 e2e latency", "p95_e2e")):
        r = _metric(t, metric)
        row[f"{key}_live_ms"] = r.get("vllm")
        row[f"{key}_sim_pct"] = r.get("diff_pct")
        row[f"{key}_steps_pct"] = r.get("steps_diff_pct")
    row["steps_live"] = al.get("live_steps")
    row["steps_identical"] = al.get("identical")
    row["profile_median_abs_err"] = res.get("median_abs_rel_error")
    row["profile_p95_abs_err"] = res.get("p95_abs_rel_error")
    row["profile_median_err"] = res.get("median_rel_error")
    row["profile_prefill_err"] = res.get("prefill_median_rel_error")
    row["profile_decode_err"] = res.get("decode_median_rel_error")
    row["cost_source"] = (meta.get("cost_source") or {}).get("name")
    return row


def _pct(v) -> str:
    return "—" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:+.1f}%"


def _hundred(v):
    return None if v is None else 100 * v


def _num(v, fmt="{:.1f}") -> str:
    return "—" if v is None or (isinstance(v, float) and not math.isfinite(v)) else fmt.format(v)


def summary_markdown(rows: list[dict], machine: dict) -> str:
    """The matrix summary as Markdown (one row per cell), with the machine and versions."""
    lines = ["# Validation matrix: the simulator against vLLM", "",
             "Per cell: exact per-request cached-token agreement (simulator with the profile / "
             "with the live step times), and the simulator's P50/P95 TTFT and end-to-end "
             "latency against live, as Diff% = 100 x (sim - live) / live, for the simulator "
             "with the profile (prof) and replaying the live engine's own step times (steps); "
             "the profile's step-time error against the live steps (median and P95 of |relative "
             "error|, and the signed median: negative means the profile is faster than this "
             "machine was).", "",
             "| cell | requests | cached equal (prof / steps) | P50 TTFT live ms | P50 prof | "
             "P50 steps | P95 TTFT live ms | P95 prof | P95 steps | P50 e2e prof / steps | "
             "P95 e2e prof / steps | steps aligned | profile step err med / P95 / signed | "
             "profile err prefill / decode steps |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---|---|---|---|---|"]
    for r in rows:
        if r.get("error"):
            lines.append(f"| {r['cell']} | failed: {r['error']} |" + " |" * 12)
            continue
        n = r["requests"]
        eq = f"{r['cached_equal']}/{n} / " + (f"{r['cached_equal_steps']}/{n}"
                                              if r.get("cached_equal_steps") is not None else "—")
        al = (f"{r['steps_identical']}/{r['steps_live']}" if r.get("steps_live") is not None
              else "—")
        err = (f"{_num(100 * r['profile_median_abs_err'] if r.get('profile_median_abs_err') is not None else None)}% / "
               f"{_num(100 * r['profile_p95_abs_err'] if r.get('profile_p95_abs_err') is not None else None)}% / "
               f"{_pct(100 * r['profile_median_err'] if r.get('profile_median_err') is not None else None)}")
        lines.append(
            f"| {r['cell']} | {n} | {eq} | {_num(r['p50_ttft_live_ms'], '{:.2f}')} | "
            f"{_pct(r['p50_ttft_sim_pct'])} | {_pct(r['p50_ttft_steps_pct'])} | "
            f"{_num(r['p95_ttft_live_ms'], '{:.2f}')} | {_pct(r['p95_ttft_sim_pct'])} | "
            f"{_pct(r['p95_ttft_steps_pct'])} | {_pct(r['p50_e2e_sim_pct'])} / "
            f"{_pct(r['p50_e2e_steps_pct'])} | {_pct(r['p95_e2e_sim_pct'])} / "
            f"{_pct(r['p95_e2e_steps_pct'])} | {al} | {err} | "
            f"{_pct(_hundred(r.get('profile_prefill_err')))} / "
            f"{_pct(_hundred(r.get('profile_decode_err')))} |")
    lines += ["", "## Where it ran", "", "| | |", "|---|---|"]
    for k, v in machine.items():
        lines.append(f"| {k} | {v} |")
    lines.append("")
    return "\n".join(lines)


def machine_facts(engine_facts: dict | None) -> dict[str, Any]:
    """prefixshield version and commit, Python, platform, and the live engine's facts."""
    import subprocess

    from prefixshield import __version__

    commit = None
    try:
        here = Path(__file__).resolve().parent
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, cwd=here, timeout=10).stdout.strip() or None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, cwd=here, timeout=10).stdout
        if commit and dirty.strip():
            commit += " (with uncommitted changes)"
    except (OSError, subprocess.SubprocessError):
        pass
    import os

    try:
        load = "{:.1f} / {:.1f} / {:.1f}".format(*os.getloadavg())
    except OSError:
        load = None
    facts = {"prefixshield_version": __version__, "git_commit": commit,
             "python": platform.python_version(), "platform": platform.platform(),
             "cpu_count": os.cpu_count(), "load_average_1_5_15min_at_end": load,
             "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    for k in ("vllm_version", "torch_version", "device", "attention_backend", "model",
              "architecture", "dtype", "num_gpu_blocks", "block_size", "max_num_seqs",
              "max_num_batched_tokens", "forced_outputs"):
        if engine_facts and k in engine_facts:
            facts[k] = engine_facts[k]
    return facts


def _check_same_cell(path: Path, data: dict, cell: ValidationCell, profile, calibrate) -> None:
    """A stored cell is reused only if it ran with the same settings."""
    want = json.loads(json.dumps({"cell": cell_dict(cell),
                                  "run": {"profile": profile, "calibrate": calibrate}}))
    meta = data.get("meta", {})
    got = {"cell": meta.get("cell"),
           "run": {k: (meta.get("run") or {}).get(k) for k in ("profile", "calibrate")}}
    if got != want:
        raise ValueError(f"{path}: this cell was run with other settings ({got}); use another "
                         "--out or remove that folder to rerun it")


@dataclass
class MatrixResult:
    """What `run_matrix` wrote: the summary rows and the paths of its files."""

    rows: list[dict]
    paths: list[Path] = field(default_factory=list)
    ran: int = 0
    reused: int = 0
    failed: int = 0


def run_matrix(cells: list[ValidationCell], out_dir: str | Path, profile: str | None = None,
               calibrate: bool = False, model_dir: str | Path | None = None,
               console=None, on_cell: Callable[[int, int, str], None] | None = None
               ) -> MatrixResult:
    """Run every cell (reusing finished ones), then write ``matrix.{md,csv,json}``.

    Cells run on one live engine per distinct engine setting; with ``calibrate`` each cell is
    calibrated right before its replay. ``on_cell(done, total, label)`` reports progress.
    """
    out = Path(out_dir)
    engines: dict[tuple, Any] = {}
    model = ensure_model(model_dir, out)
    rows: list[dict] = []
    facts = None
    ran = reused = failed = 0
    try:
        for k, cell in enumerate(cells):
            cell_dir = out / "cells" / cell.label
            report_json = cell_dir / "sim_vs_live.json"
            if not report_json.exists():
                key = cell.engine_key()
                if key not in engines:
                    _say(console, f"starting vLLM ({cell.num_blocks} blocks x "
                                  f"{cell.block_size} tokens)")
                    engines[key] = start_engine(cell, model)
                try:
                    run_cell(cell, cell_dir, profile=profile, calibrate=calibrate,
                             engine=engines[key], console=console)
                except ValueError as e:
                    # One cell the policy cannot serve (e.g. a static quota smaller than a
                    # request) is a row of the matrix, not the end of it; it is tried again on
                    # a rerun.
                    _say(console, f"{cell.label}: failed: {e}")
                    rows.append({"cell": cell.label, "workload": cell.workload,
                                 "policy": cell.policy,
                                 "mode": "timed" if cell.timed else "serialized",
                                 "error": str(e)})
                    failed += 1
                    if on_cell:
                        on_cell(k + 1, len(cells), cell.label)
                    continue
                ran += 1
            else:
                reused += 1
            data = json.loads(report_json.read_text())
            _check_same_cell(report_json, data, cell, profile, calibrate)
            facts = facts or data.get("facts")
            rows.append(summary_row(cell.label, data))
            if on_cell:
                on_cell(k + 1, len(cells), cell.label)
    finally:
        for eng in engines.values():
            eng.close()
    machine = machine_facts(facts)
    paths = [out / "matrix.md", out / "matrix.csv", out / "matrix.json"]
    write_text(paths[0], summary_markdown(rows, machine))
    write_text(paths[1], pd.DataFrame(rows).to_csv(index=False))
    write_text(paths[2], json.dumps({"machine": machine, "cells": rows,
                                     "profile": profile, "calibrate": calibrate},
                                    indent=2, default=str) + "\n")
    return MatrixResult(rows=rows, paths=paths, ran=ran, reused=reused, failed=failed)
