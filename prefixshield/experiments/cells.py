"""Cells: one (experiment, point, policy, seed) result, and the tasks that compute them.

A *task* is one trace (a point's settings and a seed) under the policies that still need it; it
is a pure function of its inputs (no wall clock, no global state inside the simulation), so any
executor — in-process, a process pool, Ray — returns bit-identical cells for it. Cells whose
resolved run is the same (e.g. the default point of a capacity sweep and of a load sweep) share
one task and are written under each experiment.

A cell is one row: the identity columns, ``status`` (``ok`` or ``failed`` with ``error``: a policy
that cannot serve the trace fails that cell alone), the `summarize`
metrics, and JSON details the report draws its figures from (per-group table, eviction
matrix, policy counters, occupancy over time sampled at ``OCCUPANCY_SAMPLES`` times, TTFT
quantiles of the judged population). ``wall_s`` is the only measured (non-simulated) column.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from prefixshield.experiments.spec import (ENGINE_KEYS, FLEET_KEYS, RUN_KEYS, SCHEDULER_KEYS,
                                           Experiment, Point, fleet_of, jsonable,
                                           resolve_contracts, scheduler_of, value_text)

OCCUPANCY_SAMPLES = 200
"""Occupancy is stored per cell at this many evenly spaced times (a step function sampled)."""

TTFT_QUANTILES = np.linspace(0, 100, 101)
"""Percentiles of the judged population's TTFT stored per cell (for CDF figures)."""

DROPPED_STATS = ("debt_samples", "class_samples")
"""Per-charge series of PrefixShield's counters, too long to keep per cell."""

@dataclass(frozen=True)
class ResolvedCell:
    """Where a cell's result goes and what runs it: the experiment's policy ``label`` (as listed)
    and the resolved ``policy_spec`` it runs at this point (grid policy fields applied)."""

    experiment: str
    point: str
    label: str
    seed: int
    policy_spec: str


@dataclass(frozen=True)
class Task:
    """One trace and the resolved policy specs to run on it.

    Attributes:
        key: identity of the trace (hash of the resolved run settings and the seed).
        kind: ``simulate`` or ``overhead``.
        settings: the point's trace and engine fields (typed; policy fields are in the specs).
        workload: the workload name.
        seed: the trace seed.
        policy_specs: resolved specs to run, in order.
        records: also return per-request records.
    """

    key: str
    kind: str
    workload: str
    settings: Mapping[str, Any]
    seed: int
    policy_specs: tuple[str, ...]
    records: bool = False


@dataclass
class CellOutcome:
    """What a task returns for one resolved policy spec."""

    policy_spec: str
    row: dict
    records: Any = None  # pandas DataFrame when asked for


# ------------------------------------------------------------------------------ resolution
def resolve_policy(label: str, settings: Mapping[str, Any]) -> str:
    """``label`` with the point's ``POLICY.PARAM`` fields applied, canonical (sorted keys):
    ``prefixshield`` + ``{"prefixshield.rho_scale": 2.0}`` -> ``prefixshield:rho_scale=2.0``."""
    from prefixshield.experiments.overrides import parse_policy_spec

    name, kwargs = parse_policy_spec(label)
    for key, v in settings.items():
        pol, dot, param = key.partition(".")
        if dot and pol == name:
            kwargs[param] = v
    if not kwargs:
        return name
    return name + ":" + ",".join(f"{k}={value_text(kwargs[k])}" for k in sorted(kwargs))


def run_spec(workload: str, settings: Mapping[str, Any], seed: int, policy_specs: tuple[str, ...]):
    """The [`RunSpec`][prefixshield.experiments.single.RunSpec] of a point's settings and a seed."""
    from prefixshield.experiments.single import RunSpec
    from prefixshield.simulator.costmodel import load_profile

    overrides = {k: v for k, v in settings.items()
                 if k not in ENGINE_KEYS and k not in RUN_KEYS and k not in SCHEDULER_KEYS
                 and k not in FLEET_KEYS and "." not in k}
    return RunSpec(workload=workload, policies=policy_specs, engine=engine_config(settings),
                   profile=load_profile(settings.get("profile", "l4-qwen2.5-1.5b")),
                   alpha=float(settings.get("alpha", 0.6)), seed=seed, overrides=overrides,
                   contracts=resolve_contracts(settings),
                   c_prefill_basis=settings.get("c_prefill_basis", "reference"),
                   fleet=fleet_of(settings))


def engine_config(settings: Mapping[str, Any]):
    """The [`EngineConfig`][prefixshield.simulator.config.EngineConfig] of a point's engine and
    scheduler fields."""
    from prefixshield.simulator.config import EngineConfig

    engine_kw = {ENGINE_KEYS[k]: v for k, v in settings.items() if k in ENGINE_KEYS}
    return EngineConfig(**engine_kw, scheduler=scheduler_of(settings))


def trace_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The fields that shape the trace and engine (everything but policy constructor fields)."""
    return {k: v for k, v in settings.items()
            if not ("." in k and not k.startswith("contract."))}


def task_key(kind: str, workload: str, settings: Mapping[str, Any], seed: int) -> str:
    """Hash identifying a trace and engine by what they *resolve* to: the full engine config,
    the profile's coefficients, alpha, the workload's complete params (defaults filled in) and
    the contract table. So two cells that spell the same run differently (``blocks=512`` in a
    capacity sweep, nothing in an attack table) share one simulation."""
    d = {**_resolved_run(kind, workload, settings), "seed": seed}
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:20]


_RESOLVED: dict[str, dict] = {}
"""What a point's settings resolve to, by their canonical JSON (one resolution per point, not
per seed: the seed is the only difference between a point's tasks)."""


def _resolved_run(kind: str, workload: str, settings: Mapping[str, Any]) -> dict:
    canonical = {k: jsonable(v) for k, v in sorted(trace_settings(settings).items())}
    memo = json.dumps([kind, workload, canonical], sort_keys=True, default=str)
    if memo in _RESOLVED:
        return _RESOLVED[memo]
    if kind != "simulate":
        d: dict[str, Any] = {"kind": kind, "workload": workload, "settings": canonical}
    else:
        from prefixshield.workloads import make_params, params_to_dict

        spec = run_spec(workload, trace_settings(settings), 0, ("lru",))
        params = dict(seed=0, alpha=spec.alpha, block_size=spec.engine.block_size,
                      num_blocks=spec.engine.num_blocks, **spec.overrides)
        if spec.contracts is not None:
            params["contracts"] = spec.contracts
        try:
            resolved = params_to_dict(make_params(workload, **params))
            del resolved["seed"]  # the task's seed enters the key beside it
        except (ValueError, TypeError):
            resolved = {k: jsonable(v) for k, v in sorted(spec.overrides.items())}
        d = {"kind": kind, "workload": workload,
             "engine": spec.engine.to_dict(), "cost": dataclasses.asdict(spec.profile.cost),
             "alpha": spec.alpha, "params": resolved,
             "contracts": {k: dataclasses.asdict(c) for k, c in spec.contract_table.items()}}
        if spec.fleet is not None:  # absent for one engine: its keys stay as they were
            d["fleet"] = dataclasses.asdict(spec.fleet)
    _RESOLVED[memo] = d
    return d


def check_experiments(experiments: list[Experiment]) -> None:
    """Raise [`SpecError`][prefixshield.experiments.spec.SpecError] (one line naming the experiment
    and the point) unless every cell of ``experiments`` can be set up.

    Typing a field checks it alone; this checks each point's settings together, as a task
    would resolve them: the engine (with its scheduler), profile and contracts, the workload's
    params, the trace of the first seed (generators refuse some combinations of valid fields;
    the scheduler's limits are checked against the trace's groups and requests) and one
    instance of every resolved policy spec. Called before a store is created: an error found
    only once cells ran would leave a store whose spec the corrected command may not reuse.
    Later seeds can still fail alone (a policy that cannot serve that trace): a failed cell.
    """
    from prefixshield.experiments.spec import SpecError

    policies_seen: set[tuple] = set()
    traces_seen: set[str] = set()
    for exp in experiments:
        if exp.kind != "simulate":
            continue
        for point in exp.points():
            where = f"experiment {exp.name}" + (f", point {point.label()}" if exp.grid else "")
            try:
                _check_point(exp, point.settings, traces_seen, policies_seen)
            except (ValueError, TypeError, KeyError) as e:
                msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
                raise SpecError(f"{where}: {msg}") from None


def _check_point(exp: Experiment, settings: Mapping[str, Any], traces_seen: set[str],
                 policies_seen: set[tuple]) -> None:
    """`check_experiments` for one point (raises what the run would raise)."""
    from prefixshield.experiments.single import build_trace
    from prefixshield.simulator.engine import EngineError

    spec = run_spec(exp.workload, trace_settings(settings), exp.seeds[0], ("lru",))
    memo = json.dumps([exp.workload, exp.seeds[0],
                       {k: jsonable(v) for k, v in sorted(trace_settings(settings).items())}],
                      sort_keys=True, default=str)
    if memo not in traces_seen:  # one trace per distinct run, not per policy or grid field
        try:
            build_trace(spec)  # the workload's params, the generator, the scheduler's limits
        except EngineError as e:
            raise ValueError(str(e)) from None
        traces_seen.add(memo)
    check_policy_specs(exp.policies, settings, policies_seen)


def check_policy_specs(labels, settings: Mapping[str, Any],
                       seen: set[tuple] | None = None) -> None:
    """Build one instance of each policy of ``labels`` as a point with ``settings`` resolves it
    (its ``POLICY.PARAM`` fields applied, at the point's pool and compat mode): a constructor's
    own bounds (``rho_scale > 0``) raise ``ValueError`` here, not in every cell. ``seen`` skips
    what was built before."""
    from prefixshield.experiments.overrides import parse_policy_spec
    from prefixshield.policies import make_policy

    engine = engine_config(settings)
    seen = set() if seen is None else seen
    for label in labels:
        pspec = resolve_policy(label, settings)
        key = (pspec, engine.num_blocks, engine.vllm_compat)
        if key in seen:
            continue
        name, kwargs = parse_policy_spec(pspec)
        make_policy(name, engine.num_blocks, vllm_compat=engine.vllm_compat, **kwargs)
        seen.add(key)


def plan_tasks(experiments: list[Experiment], done: set[tuple]) -> tuple[list[Task],
                                                                         dict[tuple, list]]:
    """Tasks for every cell not in ``done`` (identity tuples), sharing traces between cells.

    Returns the tasks and, per ``(task key, policy_spec)``, the cells it fills (a list of
    `ResolvedCell`)."""
    by_key: dict[str, dict] = {}
    dest: dict[tuple, list] = {}
    for exp in experiments:
        for point in exp.points():
            for seed in exp.seeds:
                key = task_key(exp.kind, exp.workload, point.settings, seed)
                for label in exp.policies:
                    if (exp.name, point.id, label, seed) in done:
                        continue
                    spec = (resolve_policy(label, point.settings) if exp.kind == "simulate"
                            else label)
                    entry = by_key.setdefault(key, {
                        "kind": exp.kind, "workload": exp.workload,
                        "settings": trace_settings(point.settings), "seed": seed,
                        "specs": [], "records": False})
                    if spec not in entry["specs"]:
                        entry["specs"].append(spec)
                    entry["records"] = entry["records"] or exp.records
                    dest.setdefault((key, spec), []).append(
                        ResolvedCell(exp.name, point.id, label, seed, spec))
    tasks = []
    for key, e in by_key.items():
        tasks.append(Task(key=key, kind=e["kind"], workload=e["workload"],
                          settings=e["settings"], seed=e["seed"],
                          policy_specs=tuple(e["specs"]), records=e["records"]))
    return tasks, dest


# ------------------------------------------------------------------------------ running
def run_task(task: Task) -> list[CellOutcome]:
    """Run one task; one outcome per resolved policy spec (failures recorded, never raised for
    one policy: the others still run). Pure: the same task gives the same outcomes."""
    if task.kind == "overhead":
        from prefixshield.experiments.overhead import measure_overhead

        return [CellOutcome(spec, {"status": "ok", "error": "",
                                   **measure_overhead(spec, int(task.settings["blocks"]),
                                                      int(task.settings["groups"]))})
                for spec in task.policy_specs]
    from prefixshield.experiments.single import _run_one, build_trace
    from prefixshield.simulator.engine import EngineError
    from prefixshield.experiments.overrides import parse_policy_spec

    try:
        spec = run_spec(task.workload, task.settings, task.seed, task.policy_specs)
        trace, info = build_trace(spec)
    except (ValueError, EngineError, KeyError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        return [CellOutcome(s, failed_row(f"trace: {msg}")) for s in task.policy_specs]
    out = []
    for pspec in task.policy_specs:
        t0 = time.perf_counter()
        try:
            name, kwargs = parse_policy_spec(pspec)
            # one engine, or the point's fleet; its replicas run here, one after another: a
            # sweep already runs its cells in parallel, and a pool inside a worker would nest
            result = _run_one(trace, spec, name, kwargs)
        except (ValueError, EngineError) as e:
            out.append(CellOutcome(pspec, failed_row(str(e))))
            continue
        row = cell_row(result)
        row["c_prefill_req_per_s"] = info.get("c_prefill_req_per_s")
        row["base_rate_req_per_s"] = info.get("base_rate_req_per_s")
        row["wall_s"] = time.perf_counter() - t0
        out.append(CellOutcome(pspec, row, records=result.records if task.records else None))
    return out


def failed_row(error: str) -> dict:
    """The row of a cell whose policy could not serve its trace."""
    return {"status": "failed", "error": error}


def cell_row(result) -> dict:
    """Summary metrics and JSON details of one run (see the module docstring)."""
    from prefixshield.simulator.metrics import group_table, population, summarize

    s = summarize(result)
    groups = group_table(result)
    stats = {k: v for k, v in result.policy_stats.items() if k not in DROPPED_STATS}
    ttft = population(result.records)["ttft_s"].dropna().to_numpy()
    q = np.percentile(ttft, TTFT_QUANTILES).tolist() if ttft.size else []
    return {"status": "ok", "error": "", **s,
            "groups_json": _dumps(groups.to_dict(orient="records")),
            "evictions_json": _dumps({"groups": list(result.groups),
                                      "matrix": result.evictions.tolist()}),
            "policy_stats_json": _dumps(stats),
            "occupancy_json": _dumps(sample_occupancy(result)),
            "ttft_quantiles_json": _dumps(q)}


def sample_occupancy(result, n: int = OCCUPANCY_SAMPLES) -> dict:
    """Blocks held per group at ``n`` evenly spaced times over the run (step function)."""
    t, occ = result.occupancy_t, result.occupancy
    end = float(t[-1]) if len(t) else 0.0
    times = np.linspace(0.0, end, n)
    idx = np.searchsorted(t, times, side="right") - 1
    vals = np.where(idx[:, None] >= 0, occ[np.maximum(idx, 0)], 0) if len(t) else \
        np.zeros((n, len(result.groups)), dtype=np.int64)
    return {"t_s": times.tolist(), "groups": list(result.groups),
            "blocks": {g: vals[:, i].astype(int).tolist() for i, g in enumerate(result.groups)}}


def _default(x: Any) -> Any:
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.floating):
        return float(x)
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(f"not JSON-serializable: {type(x).__name__}")


def _dumps(x: Any) -> str:
    return json.dumps(_nan_to_none(x), sort_keys=True, default=_default)


def _nan_to_none(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _nan_to_none(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_nan_to_none(v) for v in x]
    return x


def point_columns(point: Point) -> dict:
    """The swept values of a point as ``grid.KEY`` columns (text, so mixed types stay exact)."""
    return {f"grid.{k}": value_text(v) for k, v in point.values.items()}
