"""One workload (generated or read from a file) under one or more policies, same trace for all.

This is what ``prefixshield run`` does; the CLI only parses options and calls in here.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import json
import os
import platform
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import pandas as pd

from prefixshield import __version__
from prefixshield.atomic import write_text, write_with
from prefixshield.machine import physical_memory_bytes
from prefixshield.experiments.options import C_PREFILL_BASES, DEFAULT_ALPHA, check_one_of
from prefixshield.experiments.overrides import parse_policy_spec
from prefixshield.policies import make_policy
from prefixshield.simulator.capacity import C_PREFILL_REQUESTS, measure_c_prefill
from prefixshield.simulator.config import EngineConfig
from prefixshield.simulator.costmodel import Profile
from prefixshield.simulator.engine import Engine, EngineError, RunResult
from prefixshield.simulator.metrics import (eviction_matrix, group_table, held_frame,
                                            occupancy_frame, summarize)
from prefixshield.tenancy import DEFAULT_CONTRACTS, Contract
from prefixshield.traces.schema import Trace
from prefixshield.workloads import WORKLOADS, make_params, params_to_dict


REFERENCE_BLOCKS = 512
"""The reference configuration's pool (511 usable blocks), where ``C_prefill`` is measured."""
RESAMPLES = (None, "sessions")
"""How a trace file's replicates are drawn (`RunSpec.resample`)."""


@dataclass(frozen=True)
class RunSpec:
    """What to run.

    Attributes:
        workload: a registered workload name, or the path of a trace Parquet file.
        policies: policy specs ``name`` or ``name:key=value,...`` (constructor arguments, e.g.
            ``prefixshield:debt_gate=false``), each run on the identical trace.
        engine: engine settings (blocks, block size, scheduler limits, compat mode).
        profile: the cost-model profile.
        alpha: nominal load; a generated workload's base rate is ``alpha * C_prefill``.
        seed: trace seed (generated workloads).
        overrides: workload parameter overrides (typed values).
        contracts: the contract table (name -> entitlement) for the trace's attack sizing and
            the engine's policies; None: ``DEFAULT_CONTRACTS``.
        scale_to_load: for a trace file: rescale its arrivals so that its mean rate is this
            fraction of ``C_prefill`` measured on this profile and engine with 32 of the trace's
            own request shapes (`prefixshield.traces.transform.scale_to_rate` says what
            that preserves and changes); None: the trace's own times.
        c_prefill_basis: where a generated workload's ``C_prefill`` is measured:
            ``"reference"`` (default) on the reference pool of `REFERENCE_BLOCKS` blocks,
            once per deployment profile, so that arrival rates and the attack are the same at
            every capacity (a capacity sweep then varies the cache alone, as the reference
            study's does); ``"capacity"`` on this run's own pool (rates grow with the cache).
        fleet: replicas and router (`prefixshield.fleet.config.FleetConfig`); None:
            one engine, as before fleets existed.
        resample: for a trace file: ``"sessions"`` makes the trace replicate ``seed`` of a
            bootstrap over its sessions (`prefixshield.traces.bootstrap`; what
            ``compare TRACE.parquet``'s seeds are), after any ``scale_to_load``; None: the
            file's trace as it is (``seed`` unused).
    """

    workload: str
    policies: tuple[str, ...]
    engine: EngineConfig
    profile: Profile
    alpha: float = DEFAULT_ALPHA
    seed: int = 0
    overrides: dict[str, Any] = field(default_factory=dict)
    contracts: Mapping[str, Contract] | None = None
    scale_to_load: float | None = None
    c_prefill_basis: str = C_PREFILL_BASES[0]
    fleet: Any = None
    resample: str | None = None

    def __post_init__(self) -> None:
        check_one_of("resample", self.resample, RESAMPLES)
        check_one_of("c_prefill_basis", self.c_prefill_basis, C_PREFILL_BASES)
        for spec in self.policies:
            parse_policy_spec(spec)  # raises on an unknown name or parameter
        if not self.policies:
            raise ValueError("no policy given")
        if not self.alpha > 0:
            raise ValueError(f"alpha must be > 0, got {self.alpha}")
        # every replica of a fleet holds a whole pool
        replicas = 1 if self.fleet is None else self.fleet.replicas
        check_memory(self.engine.num_blocks * replicas, len(self.policies))

    @property
    def contract_table(self) -> Mapping[str, Contract]:
        """``contracts``, or ``DEFAULT_CONTRACTS`` when None."""
        return DEFAULT_CONTRACTS if self.contracts is None else self.contracts


BYTES_PER_BLOCK = 1024
"""Upper estimate of simulator memory per configured block and policy: the pool's arrays (ref
counts, hashes, hash table, owners, occupancy), a policy's state (PrefixShield's is the largest:
about 200 bytes a block plus its admission history), and the per-run logs that grow with it."""


def check_memory(num_blocks: int, num_policies: int = 1) -> None:
    """Refuse, before allocating anything, a pool whose estimated memory
    (``BYTES_PER_BLOCK x num_blocks``; one policy's state at a time) exceeds 80% of this
    machine's physical memory."""
    need = BYTES_PER_BLOCK * int(num_blocks)
    have = physical_memory_bytes()
    if have is None:
        return
    if need > 0.8 * have:
        raise ValueError(f"{num_blocks:,} blocks need about {need / 2 ** 30:.1f} GiB "
                         f"({BYTES_PER_BLOCK} bytes a block, estimated) but this machine has "
                         f"{have / 2 ** 30:.1f} GiB; use fewer --blocks")


def is_trace_file(workload: str) -> bool:
    """Whether ``workload`` names a file rather than a registered workload."""
    return workload not in WORKLOADS and (
        workload.endswith(".parquet") or Path(workload).exists() or "/" in workload)


def resolve_params(spec: RunSpec) -> tuple[Any, dict]:
    """The workload params of ``spec`` with the load sized, and how it was sized.

    ``base_rate = alpha * C_prefill``, with ``C_prefill`` measured on this profile and engine
    with 32 distinct-prefix requests shaped like the workload's own (``probe_shapes``), unless
    the overrides give ``base_rate`` (requests/s) directly. Returns the params and a dict for
    ``config.json`` and headers (``c_prefill_req_per_s``, ``c_prefill_probe``,
    ``base_rate_req_per_s``, ``params``).
    """
    if spec.workload not in WORKLOADS:
        raise ValueError(f"unknown workload {spec.workload!r}; known: "
                         f"{', '.join(sorted(WORKLOADS))} (or a .parquet trace file)")
    params = dict(seed=spec.seed, alpha=spec.alpha, block_size=spec.engine.block_size,
                  num_blocks=spec.engine.num_blocks)
    params.update(spec.overrides)
    if spec.contracts is not None and "contracts" in {
            f.name for f in dataclasses.fields(WORKLOADS[spec.workload].params_type)}:
        params["contracts"] = spec.contracts
    p = make_params(spec.workload, **params)
    info: dict[str, Any] = {"workload": spec.workload}
    if "base_rate" in spec.overrides:
        info["c_prefill_req_per_s"] = None
        info["c_prefill_probe"] = "not measured: base_rate given"
    else:
        prompt, output = p.probe_shapes(C_PREFILL_REQUESTS)
        probe_engine, basis = _probe_engine(spec, int(np.max(prompt + output)))
        try:
            c_prefill = measure_c_prefill(spec.profile.cost, probe_engine, prompt, output)
        except EngineError as e:
            raise ValueError(f"cannot measure C_prefill for {spec.workload!r} on this engine "
                             f"({e}); give the rate with --set base_rate=R (requests/s) or "
                             f"shorter requests") from None
        p = replace(p, base_rate=spec.alpha * c_prefill)
        info["c_prefill_req_per_s"] = c_prefill
        info["c_prefill_basis"] = basis
        info["c_prefill_probe"] = (f"LRU, {C_PREFILL_REQUESTS} distinct-prefix requests at "
                                   f"t=0 on {basis}: {p.shape_summary()}; mean prompt "
                                   f"{prompt.mean():.0f}, mean output {output.mean():.0f} "
                                   f"tokens")
    info["base_rate_req_per_s"] = p.base_rate
    info["params"] = params_to_dict(p)
    return p, info


def _probe_engine(spec: RunSpec, longest_tokens: int) -> tuple[EngineConfig, str]:
    """The engine the ``C_prefill`` probe runs on, and the basis in words for the header.

    The reference basis is this run's engine with the reference pool of
    `REFERENCE_BLOCKS` blocks, unless one probe request (``longest_tokens``, prompt and
    output) cannot fit it: then the run's own pool, said so."""
    if spec.c_prefill_basis == "capacity" or spec.engine.num_blocks == REFERENCE_BLOCKS:
        where = "this run's pool" if spec.c_prefill_basis == "capacity" else "the reference pool"
        return spec.engine, f"{where} of {spec.engine.num_blocks:,} blocks"
    if -(-longest_tokens // spec.engine.block_size) > REFERENCE_BLOCKS - 1:
        return spec.engine, (f"this run's pool of {spec.engine.num_blocks:,} blocks (a probe "
                             f"request does not fit the reference pool of {REFERENCE_BLOCKS})")
    return (replace(spec.engine, num_blocks=REFERENCE_BLOCKS),
            f"the reference pool of {REFERENCE_BLOCKS} blocks (the same rates at every capacity)")


def build_trace(spec: RunSpec) -> tuple[Trace, dict]:
    """The trace for ``spec`` and a dict saying how it was obtained (written with the results)."""
    if is_trace_file(spec.workload):
        # Parquet I/O (pyarrow.parquet, its file systems, ssl) only when a file is read/written:
        # ~10 ms of every generated-workload run otherwise.
        from prefixshield.traces.io import read_trace

        trace, info = read_trace(spec.workload), {"trace_file": str(spec.workload)}
        if spec.scale_to_load is not None:
            trace, info = _scale_to_engine(trace, spec, info)
        if spec.resample == "sessions":
            from prefixshield.traces.bootstrap import session_bootstrap

            trace = session_bootstrap(trace, spec.seed)
            info = {**info, "bootstrap": trace.meta["bootstrap"]}
    elif spec.resample is not None:
        raise ValueError("resampling is for trace files; a generated workload's replicates "
                         "are its seeds")
    elif spec.scale_to_load is not None:
        raise ValueError("scaling to the engine is for trace files; a generated workload's "
                         "load is its alpha")
    else:
        p, info = resolve_params(spec)
        trace = WORKLOADS[spec.workload](p)
    if len(trace) == 0:
        raise ValueError(f"{spec.workload}: the trace has no requests; nothing to simulate")
    if not trace.requests["measured"].any():
        raise ValueError(f"{spec.workload}: no request of the trace is measured (all warm-up); "
                         "no hit ratio or TTFT could be judged")
    check_scheduler(trace, spec.engine, spec.workload)
    return trace, info


def check_scheduler(trace: Trace, engine: EngineConfig, source: str) -> None:
    """Raise ``ValueError`` (one line, before any run) if ``engine``'s scheduler names a group
    ``trace`` does not have, or its ``max_blocks`` limit could hold a request back for ever."""
    from prefixshield.scheduling.config import capped_outputs, over_block_limit

    sched = engine.scheduler
    groups = trace.group_names()
    try:
        _, limits = sched.resolve(groups)
    except ValueError as e:
        raise ValueError(f"{source}: scheduler {sched.name}: {e}") from None
    df = trace.requests
    gid = df["group"].astype(str).map({g: i for i, g in enumerate(groups)}).to_numpy(np.int64)
    total = trace.prompt_lengths() + capped_outputs(limits, gid,
                                                    df["output_tokens"].to_numpy(np.int64))
    over = over_block_limit(limits, gid, total, engine.block_size)
    if over is not None:
        i, need, cap = over
        raise ValueError(f"{source}: the max_blocks limit of group {groups[gid[i]]!r} ({cap}) "
                         f"is below what request {int(df['request_id'].iloc[i])} needs ({need} "
                         f"blocks of prompt and output): it would wait for ever")


def run_policies(trace: Trace, spec: RunSpec,
                 on_done: Callable[[str, RunResult], None] | None = None,
                 failures: dict[str, str] | None = None,
                 executor: Any = None,
                 on_start: Callable[[str], None] | None = None) -> dict[str, RunResult]:
    """Run ``trace`` once per policy of ``spec`` (a fresh policy and engine each time);
    ``on_start(label)`` before each, ``on_done(label, result)`` after each that served it.

    A policy that cannot serve the trace (e.g. a request larger than what a static quota may
    ever give its group) raises [`EngineError`][prefixshield.simulator.engine.EngineError]; with a
    ``failures`` dict, its reason is recorded there under the policy's label instead and the
    other policies still run (a comparison never sinks with one policy). ``executor``: where a
    split fleet's replicas run (see `prefixshield.fleet.run.run_fleet`; None: here, one
    after another); single engines and lockstep fleets always run here."""
    results = {}
    for label in spec.policies:
        name, kwargs = parse_policy_spec(label)
        if on_start is not None:
            on_start(label)
        try:
            results[label] = _run_one(trace, spec, name, kwargs, executor)
        except EngineError as e:
            if failures is None:
                raise
            failures[label] = str(e)
            continue
        if on_done is not None:
            on_done(label, results[label])
    return results


def _run_one(trace: Trace, spec: RunSpec, name: str, kwargs: dict,
             executor: Any = None) -> RunResult:
    """One policy's run: one engine, or the fleet of ``spec.fleet`` (split replicas on
    ``executor``, None: here)."""
    # a partial of a module function, not a closure: an executor's workers unpickle it
    fresh = functools.partial(make_policy, name, spec.engine.num_blocks,
                              vllm_compat=spec.engine.vllm_compat, **kwargs)
    if spec.fleet is None:
        return Engine(trace, fresh(), spec.profile.cost, spec.engine,
                      contracts=spec.contract_table).run()
    from prefixshield.fleet.run import run_fleet

    return run_fleet(trace, fresh, spec.profile.cost, spec.engine, spec.contract_table,
                     spec.fleet, executor)


def _scale_to_engine(trace: Trace, spec: RunSpec, info: dict) -> tuple[Trace, dict]:
    from prefixshield.traces.transform import probe_shapes_of, scale_to_rate

    load = spec.scale_to_load
    if not (load > 0 and load < 10):
        raise ValueError(f"--scale-to-engine must be a load in (0, 10), got {load}")
    prompt, output = probe_shapes_of(trace, C_PREFILL_REQUESTS)
    try:
        c_prefill = measure_c_prefill(spec.profile.cost, spec.engine, prompt, output)
    except EngineError as e:
        raise ValueError(f"cannot measure C_prefill with this trace's request shapes ({e}); "
                         "use more --blocks or a trace with shorter requests") from None
    trace, factor = scale_to_rate(trace, load * c_prefill)
    return trace, {**info, "c_prefill_req_per_s": c_prefill, "scale_to_load": load,
                   "time_factor": factor, "base_rate_req_per_s": load * c_prefill,
                   "c_prefill_probe": f"LRU, {C_PREFILL_REQUESTS} of the trace's requests at "
                                      f"evenly spaced ranks; mean prompt {prompt.mean():.0f}, "
                                      f"mean output {output.mean():.0f} tokens"}


def label_dir(label: str) -> str:
    """A folder name for a policy spec (``prefixshield:debt_gate=false`` ->
    ``prefixshield-debt_gate-false``)."""
    return label.replace(":", "-").replace("=", "-").replace(",", "_").replace("/", "_")


def summary_frame(results: dict[str, RunResult],
                  failures: dict[str, str] | None = None) -> pd.DataFrame:
    """One row per policy: ``status`` (``ok`` or ``failed``), ``error`` and the
    `summarize` metrics of each run (empty if failed)."""
    return summary_table({p: summarize(r) for p, r in results.items()}, failures)


def summary_table(summaries: dict[str, dict],
                  failures: dict[str, str] | None = None) -> pd.DataFrame:
    """`summary_frame` from each run's summary dict (policy label -> dict)."""
    rows = [{"policy": p, "status": "ok", "error": "", **s} for p, s in summaries.items()]
    rows += [{"policy": p, "status": "failed", "error": e} for p, e in (failures or {}).items()]
    df = pd.DataFrame(rows)
    for col in ("requests", "preemptions", "evictions", "sim_steps", "sim_events"):
        if col in df:  # stay integers beside a failed policy's empty row
            df[col] = df[col].astype("Int64")
    return df


def config_record(spec: RunSpec, trace_info: dict) -> dict:
    """The exact configuration of a run, for ``config.json`` beside its results."""
    return {
        "prefixshield_version": __version__,
        "python": platform.python_version(),
        "workload": spec.workload,
        "policies": list(spec.policies),
        "seed": spec.seed,
        "alpha": spec.alpha,
        "c_prefill_basis": spec.c_prefill_basis,
        "engine": spec.engine.to_dict(),
        "profile": {"name": spec.profile.name, "source": spec.profile.source,
                    "cost": dataclasses.asdict(spec.profile.cost),
                    "provenance": spec.profile.provenance},
        "contracts": {k: dataclasses.asdict(c) for k, c in spec.contract_table.items()},
        "trace": trace_info,
        **({"fleet": dataclasses.asdict(spec.fleet)} if spec.fleet is not None else {}),
    }


def _jsonable(x: Any) -> Any:
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return float(x)
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(f"not JSON-serializable: {type(x).__name__}")


def check_out_dir(out_dir: str | Path, inputs: Sequence[str | Path] = ()) -> Path:
    """Check ``--out`` before simulating: it must be new, empty, or a results folder of an
    earlier ``run`` (``config.json`` and ``summary.csv`` inside, which a new run replaces
    whole), and its parent writable; no file of ``inputs`` (the run's trace file) may lie
    inside it, since the run replaces the folder whole. Raises ValueError naming the folder."""
    out = Path(out_dir)
    for path in inputs:
        if Path(path).resolve().is_relative_to(out.resolve()):
            raise ValueError(f"--out {out}: holds the input {path}, and a run replaces its "
                             "folder whole; choose another folder (or move the trace)")
    if out.is_symlink():  # the folder swap would replace the link, not what it points at
        raise ValueError(f"--out {out}: is a symbolic link; give the folder itself")
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out}: exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not (
            (out / "config.json").is_file() and (out / "summary.csv").is_file()):
        raise ValueError(f"--out {out}: not empty and not the results of an earlier run; "
                         "choose a new folder")
    parent = out.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"--out {out}: cannot create it ({parent} is not a writable folder)")
    if out.is_dir() and not os.access(out.parent, os.W_OK | os.X_OK):
        raise ValueError(f"--out {out}: cannot replace it ({out.parent} is not writable)")
    return out


def write_outputs(out_dir: str | Path, spec: RunSpec, trace: Trace, trace_info: dict,
                  results: dict[str, RunResult], failures: dict[str, str] | None = None,
                  extra: Callable[[Path], list[Path]] | None = None) -> list[Path]:
    """Write config, trace, per-policy records/groups/evictions/occupancy and the summary.

    Everything is written into a fresh folder beside ``out_dir`` that then replaces it, so an
    earlier or interrupted run never leaves files that look current (a narrower rerun does not
    keep the old policies' folders); ``summary.csv`` lists failed policies with their reason.
    ``extra(tmp_folder)`` may add files (e.g. figures) before the swap. Returns the final paths.
    """
    from prefixshield.traces.io import write_trace

    written: list[Path] = []
    with staged(out_dir) as stage:
        def put_text(name: str, text: str) -> None:
            write_text(stage / name, text)
            written.append(Path(name))

        def put_parquet(name: str, df: pd.DataFrame) -> None:
            write_with(stage / name, lambda tmp: df.to_parquet(tmp, index=False))
            written.append(Path(name))

        put_text("config.json", json.dumps(config_record(spec, trace_info), indent=2,
                                           default=_jsonable) + "\n")
        write_trace(trace, stage / "trace.parquet")
        written.append(Path("trace.parquet"))
        for label, r in results.items():
            d = label_dir(label)
            put_parquet(f"{d}/records.parquet", r.records)
            put_parquet(f"{d}/occupancy.parquet", occupancy_frame(r))
            put_parquet(f"{d}/held.parquet", held_frame(r))
            put_text(f"{d}/groups.csv", csv_safe(group_table(r)).to_csv(index=False))
            put_run_tables(put_text, d, r)
            if r.fleet is not None:
                for name, df in fleet_tables(r).items():
                    put_text(f"{d}/fleet/{name}.csv", csv_safe(df).to_csv(
                        index=name.startswith("evictions")))
        put_text("summary.csv", summary_frame(results, failures).to_csv(index=False))
        if extra is not None:
            written += [p.relative_to(stage) for p in extra(stage)]
    return [Path(out_dir) / p for p in written]


def put_run_tables(put_text: Callable[[str, str], None], folder: str, result) -> None:
    """A run's ``evictions.csv`` and ``policy_stats.json`` into ``folder`` (``result``: a
    `RunResult` or a streamed run's result: ``groups``, ``evictions``,
    ``policy_stats``)."""
    put_text(f"{folder}/evictions.csv", csv_safe(eviction_matrix(result)).to_csv())
    put_text(f"{folder}/policy_stats.json", json.dumps(result.policy_stats, indent=2,
                                                       default=_jsonable) + "\n")


@contextmanager
def staged(out_dir: str | Path) -> Iterator[Path]:
    """A fresh folder beside ``out_dir`` to write a run's outputs into, which then replaces
    ``out_dir`` whole (an earlier or interrupted run never leaves files that look current);
    on an error it is removed and ``out_dir`` is left as it was."""
    out = check_out_dir(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    # A killed earlier run into the same --out left its staging (or swapped-out) folder.
    for left in [*out.parent.glob(f".{glob.escape(out.name)}.*.new"),
                 *out.parent.glob(f".{glob.escape(out.name)}.old-*")]:
        shutil.rmtree(left, ignore_errors=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".new", dir=out.parent))
    try:
        os.chmod(stage, 0o777 & ~_umask())
        yield stage
        old = None
        if out.exists():
            old = out.parent / f".{out.name}.old-{stage.name}"
            os.replace(out, old)
        os.replace(stage, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise


_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def fleet_tables(result: RunResult) -> dict[str, pd.DataFrame]:
    """A fleet run's tables by file stem: ``replicas``, ``tenants``, ``summary`` and
    ``evictions_replica<r>`` (see `prefixshield.fleet.metrics`)."""
    from prefixshield.fleet.metrics import (fleet_summary, replica_evictions, replica_table,
                                            tenant_table, with_bound)

    rec = with_bound(result)
    tables = {"replicas": replica_table(result, rec), "tenants": tenant_table(result, rec),
              "summary": pd.DataFrame([fleet_summary(result, rec)])}
    for r, m in replica_evictions(result).items():
        tables[f"evictions_replica{r}"] = m
    return tables


def csv_safe(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with text cells and labels that a spreadsheet would run as a formula (group names
    from a trace, e.g. ``=cmd|...``) prefixed with ``'``; numbers are left alone."""
    def fix(x):
        return "'" + x if isinstance(x, str) and x.startswith(_FORMULA_START) else x

    out = df.copy()
    for col in out.columns:
        if out[col].dtype == object:
            out[col] = out[col].map(fix)
    out.index = out.index.map(fix)
    out.columns = out.columns.map(fix)
    return out


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
