"""Command line: ``prefixshield run | compare | trace ... | profiles | calibrate | validate``, and
``sweep | reproduce | report | regress`` (in :mod:`prefixshield.cli_experiments`).

The CLI parses options, calls the library and prints; it holds no simulation logic. Every user
error (unknown name, bad value, unreadable file) ends with one ``Error:`` line and exit code 1 or 2,
never a traceback.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import gc
import os
import sys
import time
from pathlib import Path

START_ENV: dict[str, str] = {"OPENBLAS_THREAD_TIMEOUT": "4"}
"""Environment the command line sets (unless the user already has) before anything loads numpy.

OpenBLAS -- numpy's copy, and scipy's, which numba loads at start-up to probe for BLAS -- starts a
worker thread per core that busy-waits 2**28 cycles (~0.1 s) for work before it sleeps. No command
hands BLAS work large enough to thread, so on a 2-core machine that spin was 0.06-0.15 CPU-s of
every command (measured per thread, more the idler the machine). ``OPENBLAS_THREAD_TIMEOUT=4``
(OpenBLAS's minimum, 2**4 cycles) only sends idle workers to sleep sooner: the thread count,
hence how BLAS splits any work and every result, is unchanged."""
for _name, _value in START_ENV.items():
    os.environ.setdefault(_name, _value)

import click  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from prefixshield import __version__  # noqa: E402


def _make_console() -> Console:
    """The CLI's console: piped output (CI logs, files) gets a wide fixed width so tables are not
    squeezed to 80 columns; without colours, no highlighting."""
    width = None if sys.stdout.isatty() else 160
    out = Console(width=width)
    if out.color_system is None:
        # Without a colour system highlighting only computes styles that are never written (the
        # text is identical); compiling rich's highlighter regexes and matching them cost ~5 ms
        # of the ~0.1 CPU-s our own code takes in `prefixshield run`.
        out = Console(width=width, highlight=False)
    return out


console = _make_console()

SEED = click.IntRange(0, 2 ** 63 - 1)
"""Seeds are non-negative 64-bit integers (numpy's seed sequences and the token hash take them)."""
POSITIVE = click.IntRange(min=1)

# Errors that are the user's input, not our bugs: shown as one line.
_USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, KeyError, FileNotFoundError,
                                                 OSError)


def _user_errors(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with _loading():  # numpy, pandas, simpy, numba
            from prefixshield.simulator.engine import EngineError

        try:
            return fn(*args, **kwargs)
        except (EngineError, *_USER_ERRORS) as e:
            msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
            raise click.ClickException(msg) from None
    return wrapper


def _policy_names(values: tuple[str, ...]) -> tuple[str, ...]:
    """Expand 'all' and comma-separated lists that mix plain names and specs with constructor
    arguments: ``lru,prefixshield:segmentation=false,debt_gate=false,s3fifo`` is three policies
    (a comma starts a new policy unless what follows is a ``key=value`` of the spec before)."""
    from prefixshield.policies import POLICIES

    names: list[str] = []
    for v in values:
        specs: list[str] = []
        for part in v.split(","):
            part = part.strip()
            if not part:
                continue
            head = part.partition(":")[0]
            if specs and ":" in specs[-1] and "=" in part and ":" not in part \
                    and head not in POLICIES:
                specs[-1] += "," + part  # another key=value of the previous spec
            else:
                specs.append(part)
        for name in specs:
            if name == "all":
                names.extend(sorted(POLICIES))
            else:
                names.append(name)
    return tuple(dict.fromkeys(names))


def _workload_overrides(workload: str, overrides: tuple[str, ...]) -> dict:
    """Check WORKLOAD (a generated workload or a trace file) and type its ``--set`` items."""
    from prefixshield.experiments.overrides import parse_overrides
    from prefixshield.experiments.single import is_trace_file
    from prefixshield.workloads import WORKLOADS

    if not is_trace_file(workload) and workload not in WORKLOADS:
        raise click.BadParameter(f"unknown workload {workload!r}; known: {_workload_names()} "
                                 "(or a .parquet trace file)", param_hint="WORKLOAD")
    if not overrides:
        return {}
    if is_trace_file(workload):
        raise click.BadParameter("--set applies to generated workloads, not trace files",
                                 param_hint="--set")
    return parse_overrides(WORKLOADS[workload].params_type, overrides)


def _workload_names() -> str:
    from prefixshield.workloads import WORKLOADS

    return ", ".join(sorted(WORKLOADS))


class _Program(click.Group):
    """The top-level group. Called as the program -- the console script and ``python -m
    prefixshield`` call ``main()``, :class:`click.testing.CliRunner` calls ``main.main()`` -- it
    also makes the interpreter's exit cheap.

    At exit CPython runs its collector over every live object several times while it tears the
    modules down; with numba, llvmlite, pandas and scipy loaded that was 0.35-0.45 CPU-s of every
    command, a third of ``prefixshield run``. ``gc.freeze()`` in an exit handler moves those
    objects out of the collector's reach first. Nothing is written later: atexit handlers
    (Ray's, multiprocessing's, logging's, ``weakref.finalize``) all still run, standard streams
    are still flushed, and memory goes back to the OS with the process; only ``__del__`` of
    objects left in reference cycles is skipped, which Python never promised at exit.
    """

    running = False
    """Set once the program runs: :func:`_loading` pauses the collector only then."""

    def __call__(self, *args, **kwargs):
        atexit.register(gc.freeze)
        _Program.running = True
        return super().__call__(*args, **kwargs)


@contextlib.contextmanager
def _loading():
    """Import a command's modules with the collector paused, then freeze what they built.

    Loading numpy, pandas, numba, simpy and our modules builds ~170,000 objects that live until
    the process exits; with the collector on, ``prefixshield run`` collected ~370 times while they
    loaded (twice over all of them), ~0.1 CPU-s, to find ~800 objects of garbage. Paused while
    they load and moved out of the collector's reach after (``gc.freeze()``), they cost no
    collection; what a command builds later is collected as usual. Only as the program (see
    :class:`_Program`); in-process callers such as CliRunner keep their collector as it is.
    """
    if not (_Program.running and gc.isenabled()):
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()


def _load_numba_target() -> None:
    """Load numba's CPU target, as a command's first kernel call (compiled or from the cache)
    would: its registries and the ``scipy.linalg`` it imports to probe BLAS are ~56,000 objects
    more, loaded here under :func:`_loading` (~110 collections fewer in `prefixshield run`)."""
    from numba.core.registry import cpu_target

    cpu_target.target_context.refresh()


@click.group(cls=_Program,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="prefixshield")
def main() -> None:
    """prefixshield: what a KV prefix-cache replacement policy does to each tenant.

    A trace-driven simulator of vLLM's Automatic Prefix Caching block pool. Start with
    `prefixshield run one_touch --policy all`.
    """


# ---------------------------------------------------------------------------------------- run
def _engine_options(fn):
    opts = [
        click.option("--blocks", "num_blocks", type=click.IntRange(min=2), default=512,
                     show_default=True,
                     help="KV blocks configured, null block included (usable = blocks - 1)."),
        click.option("--block-size", type=POSITIVE, default=16, show_default=True,
                     help="Tokens per KV block."),
        click.option("--compat", "vllm_compat", type=click.Choice(["0.10", "current"]),
                     default="current", show_default=True,
                     help="vLLM free-queue/admission semantics to reproduce."),
        click.option("--max-num-seqs", type=int, default=256, show_default=True,
                     help="Most running requests per step."),
        click.option("--max-num-batched-tokens", type=int, default=8192, show_default=True,
                     help="Token budget per step (chunked prefill)."),
        click.option("--profile", default="l4-qwen2.5-1.5b", show_default=True,
                     help="Cost-model profile: a shipped name (see `prefixshield profiles`) or "
                          "a .toml path."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


_C_PREFILL_BASIS = click.option(
    "--c-prefill-basis", type=click.Choice(["reference", "capacity"]), default="reference",
    show_default=True,
    help="Where C_prefill is measured: on the reference pool of 512 blocks, once per profile "
         "(the same arrival rates and attack at every --blocks), or on this run's own pool.")


def _workload_options(fn):
    """``--alpha`` and ``--set``: how a generated workload is sized and parameterized."""
    fn = click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
                      help="Override a workload parameter (repeatable); e.g. "
                           "--set duration_s=30.")(fn)
    return click.option("--alpha", type=float, default=0.6, show_default=True,
                        help="Nominal load: base arrival rate = alpha x C_prefill of the "
                             "profile.")(fn)


@main.command()
@click.argument("workload")
@click.option("--policy", "-p", "policies", multiple=True, default=("lru",), show_default=True,
              help="Policy to run: a name, 'all', or NAME:KEY=VALUE[,KEY=VALUE] with constructor "
                   "arguments (e.g. prefixshield:debt_gate=false). Repeat for several; every "
                   "policy gets the identical trace.")
@_engine_options
@click.option("--seed", type=SEED, default=0, show_default=True, help="Trace seed.")
@_workload_options
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Write records, summaries and config here.")
@click.option("--plot/--no-plot", default=True, show_default=True,
              help="With --out: write comparison.png.")
@click.option("--check-invariants", is_flag=True,
              help="Verify the block pool's invariants after every step (slow).")
@_C_PREFILL_BASIS
@click.option("--scale-to-engine", "scale_to_load", type=click.FloatRange(0, 10, min_open=True),
              default=None, metavar="LOAD",
              help="Trace files: rescale arrival times (one factor) so the trace's mean rate is "
                   "LOAD x C_prefill of this profile and engine, measured with the trace's own "
                   "request shapes (order, burstiness and prefixes kept; gaps scaled).")
@_user_errors
def run(workload, policies, num_blocks, block_size, vllm_compat, max_num_seqs,
        max_num_batched_tokens, profile, seed, alpha, overrides, out_dir, plot, check_invariants,
        c_prefill_basis, scale_to_load):
    """Simulate WORKLOAD under one or more policies and print a summary table.

    WORKLOAD is a generated workload name or a trace .parquet file (see `prefixshield trace`).
    """
    with _loading():
        from prefixshield.experiments.single import (RunSpec, build_trace, check_out_dir,
                                                     run_policies, write_outputs)
        from prefixshield.simulator.config import EngineConfig
        from prefixshield.simulator.costmodel import load_profile

        _load_numba_target()

    typed = _workload_overrides(workload, overrides)
    if out_dir:
        check_out_dir(out_dir)  # before minutes of simulation, not after
    engine = EngineConfig(num_blocks=num_blocks, block_size=block_size, max_num_seqs=max_num_seqs,
                          max_num_batched_tokens=max_num_batched_tokens, vllm_compat=vllm_compat,
                          check_invariants=check_invariants)
    spec = RunSpec(workload=workload, policies=_policy_names(policies), engine=engine,
                   profile=load_profile(profile), alpha=alpha, seed=seed, overrides=typed,
                   scale_to_load=scale_to_load, c_prefill_basis=c_prefill_basis)
    trace, info = build_trace(spec)
    _print_header(workload, trace, spec, info)
    if "time_factor" in info:
        console.print(f"arrivals scaled by {info['time_factor']:.3g} to {info['scale_to_load']:g}"
                      f" x C_prefill {info['c_prefill_req_per_s']:.3g} req/s = "
                      f"{info['base_rate_req_per_s']:.3g} req/s (measured: "
                      f"{info['c_prefill_probe']})")
    timings: dict[str, float] = {}
    failures: dict[str, str] = {}
    with console.status("simulating...") as status:
        t0 = [time.perf_counter()]

        def done(name, _result):
            timings[name] = time.perf_counter() - t0[0]
            t0[0] = time.perf_counter()
            status.update(f"simulated {name} in {timings[name]:.2f} s")

        results = run_policies(trace, spec, on_done=done, failures=failures)
    _print_summary(results, timings, failures)
    if out_dir:
        def figures(folder: Path) -> list[Path]:
            if not (plot and results):
                return []
            from prefixshield.plots import plot_policy_comparison

            focus = "victim" if "victim" in set(trace.requests["group"]) else None
            png = folder / "comparison.png"
            plot_policy_comparison(results, f"{workload} - {spec.profile.name}, {num_blocks} "
                                   f"blocks, seed {seed}", png, focus_group=focus)
            return [png]

        written = write_outputs(out_dir, spec, trace, info, results, failures, extra=figures)
        console.print(f"wrote {len(written)} files to {out_dir}/")
    if not results:
        raise click.ClickException("no policy could serve this trace (see the table)")


@main.command()
@click.argument("workload")
@click.option("--policy", "-p", "policies", multiple=True, default=("all",), show_default=True,
              help="Policies as for `run`; the first is the baseline of the paired differences.")
@_engine_options
@click.option("--seeds", type=int, default=10, show_default=True,
              help="Paired runs: seeds 0..N-1, every policy on the identical trace per seed.")
@_workload_options
@_C_PREFILL_BASIS
@click.option("--out", "out_csv", type=click.Path(dir_okay=False), default=None,
              help="Write per-run rows and the paired table as CSV (OUT and OUT.paired.csv).")
@_user_errors
def compare(workload, policies, num_blocks, block_size, vllm_compat, max_num_seqs,
            max_num_batched_tokens, profile, seeds, alpha, overrides, c_prefill_basis, out_csv):
    """Paired comparison of policies on a generated WORKLOAD over several seeds.

    Prints the mean hit ratio and P95 TTFT of the judged requests per policy, and the paired
    difference to the first policy with a 95% bootstrap CI (10,000 resamples, fixed seed).
    """
    from rich.progress import Progress

    from prefixshield.atomic import write_with
    from prefixshield.experiments.overrides import parse_overrides
    from prefixshield.experiments.analysis import fmt_ci
    from prefixshield.experiments.paired import paired_table, run_paired
    from prefixshield.experiments.single import RunSpec, build_trace
    from prefixshield.simulator.config import EngineConfig
    from prefixshield.simulator.costmodel import load_profile
    from prefixshield.workloads import WORKLOADS

    if workload not in WORKLOADS:
        raise click.BadParameter(f"unknown workload {workload!r}; known: {_workload_names()}",
                                 param_hint="WORKLOAD")
    if seeds < 1:
        raise click.BadParameter("must be >= 1", param_hint="--seeds")
    typed = parse_overrides(WORKLOADS[workload].params_type, overrides)
    engine = EngineConfig(num_blocks=num_blocks, block_size=block_size, max_num_seqs=max_num_seqs,
                          max_num_batched_tokens=max_num_batched_tokens, vllm_compat=vllm_compat)
    names = _policy_names(policies)
    spec = RunSpec(workload=workload, policies=names, engine=engine,
                   profile=load_profile(profile), alpha=alpha, overrides=typed,
                   c_prefill_basis=c_prefill_basis)
    trace0, info0 = build_trace(spec)
    _print_header(workload, trace0, spec, info0)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(f"{workload}: {len(names)} policies x {seeds} seeds",
                                 total=seeds)
        runs = run_paired(spec, list(range(seeds)),
                          on_seed=lambda _s: progress.advance(task))
    table_df = paired_table(runs, baseline=names[0],
                            metrics=("hit_ratio", "token_hit_ratio", "p95_ttft_s"))
    table = Table(title=f"{workload}: paired over {seeds} seeds; differences vs {names[0]} "
                        "(95% bootstrap CI)")
    attack = ("attacker_pressure_ratio" in runs
              and bool(runs["attacker_pressure_ratio"].notna().any()))
    cols = ["policy", "runs", "hit ratio", "diff (pp)", "token hit ratio", "P95 TTFT (s)",
            "diff (s)"]
    if attack:
        cols += ["attacker pressure", "attacker debt (blocks)"]
    for col in cols:
        table.add_column(col, justify="left" if col == "policy" else "right")
    means = runs.groupby("policy", sort=False)[["attacker_pressure_ratio",
                                                "attacker_mean_debt_blocks"]].mean() \
        if attack else None
    for _, r in table_df.iterrows():
        if r["runs"] == 0:
            table.add_row(r["policy"], f"0 of {seeds}", "[red]failed[/]", *[""] * (len(cols) - 3))
            continue
        row = [r["policy"], str(r["runs"]) if not r["failed"] else f"{r['runs']} of {seeds}",
               f"{100 * r['hit_ratio_mean']:.2f}%",
               fmt_ci(r['hit_ratio_diff'], r['hit_ratio_ci_low'], r['hit_ratio_ci_high']),
               f"{100 * r['token_hit_ratio_mean']:.2f}%",
               f"{r['p95_ttft_s_mean']:.3f}",
               fmt_ci(r['p95_ttft_s_diff'], r['p95_ttft_s_ci_low'], r['p95_ttft_s_ci_high'],
                      1.0, 3)]
        if attack:
            m = means.loc[r["policy"]]
            row += [_fmt(m["attacker_pressure_ratio"], ".2f"),
                    _fmt(m["attacker_mean_debt_blocks"], ".0f")]
        table.add_row(*row)
    console.print(table)
    console.print("hit ratio: mean over the judged requests of cached / prompt tokens (vLLM's "
                  "per-request definition); token hit ratio: cached over prompt tokens summed "
                  "over them (what trace studies publish).")
    for _, r in table_df[table_df["failed"] > 0].iterrows():
        console.print(f"[yellow]{r['policy']} failed on {r['failed']} of {seeds} seeds[/]: "
                      f"{r['error']}" + ("; its means and differences are over the seeds it "
                                         "served" if r["runs"] else ""))
    if out_csv:
        write_with(out_csv, lambda tmp: runs.to_csv(tmp, index=False))
        write_with(f"{out_csv}.paired.csv", lambda tmp: table_df.to_csv(tmp, index=False))
        console.print(f"wrote {out_csv} and {out_csv}.paired.csv")


def _print_header(workload, trace, spec, info) -> None:
    """What runs: the trace, the engine and profile, and how the load was sized."""
    e = spec.engine
    console.print(f"[bold]{workload}[/]: {len(trace)} requests, {len(trace.group_names())} "
                  f"groups; profile {spec.profile.name} ({spec.profile.provenance['status']}); "
                  f"{e.num_blocks} blocks x {e.block_size} tokens; vLLM compat {e.vllm_compat}")
    if "base_rate_req_per_s" not in info:
        return
    if info["c_prefill_req_per_s"] is None:
        console.print(f"load: base rate {info['base_rate_req_per_s']:.3g} req/s (given)")
    else:
        console.print(f"load: base rate {info['base_rate_req_per_s']:.3g} req/s = alpha "
                      f"{spec.alpha:g} x C_prefill {info['c_prefill_req_per_s']:.3g} req/s "
                      f"(measured: {info['c_prefill_probe']})")
    meta = trace.meta
    if "designed_pressure_ratio" in meta:
        console.print(f"attacker: {meta['attacker_rate']:.3g} req/s, designed creation pressure "
                      f"{meta['designed_pressure_ratio']:.2f} x its refill "
                      f"({meta['attacker_rho_blocks_per_s']:g} blocks/s)"
                      + ("" if meta["params"].get("attack", True) else "; silent (control)"))


def _fmt(x: float, spec: str) -> str:
    """``format(x, spec)``, or ``-`` for NaN."""
    return "-" if x != x else format(x, spec)


def _print_summary(results, timings, failures=None) -> None:
    from prefixshield.simulator.metrics import summarize

    failures = failures or {}
    pop = summarize(next(iter(results.values())))["population"] if results else "all"
    table = Table(title=f"judged population: {'measured victim' if pop == 'victim' else 'all measured'} requests")
    attack = pop == "victim"
    cols = ["policy", "requests", "hit ratio", "token hit ratio", "P50 TTFT (s)", "P95 TTFT (s)",
            "preemptions", "evictions"]
    if attack:
        cols += ["attacker pressure", "attacker debt (blocks)"]
    for col in cols + ["sim time (s)"]:
        table.add_column(col, justify="left" if col == "policy" else "right")
    for name, r in results.items():
        s = summarize(r)
        row = [name, str(s["requests"]), f"{100 * s['hit_ratio']:.2f}%",
               f"{100 * s['token_hit_ratio']:.2f}%", f"{s['p50_ttft_s']:.3f}",
               f"{s['p95_ttft_s']:.3f}", str(s["preemptions"]), str(s["evictions"])]
        if attack:
            row += [_fmt(s["attacker_pressure_ratio"], ".2f"),
                    _fmt(s["attacker_mean_debt_blocks"], ".0f")]
        table.add_row(*row, f"{timings.get(name, float('nan')):.2f}")
    for name in failures:
        table.add_row(name, "[red]failed[/]", *[""] * (len(cols) - 1))
    console.print(table)
    for name, err in failures.items():
        console.print(f"[red]{name} failed[/]: {err}")
    if attack:
        console.print("attacker pressure: blocks the attacker materialized per second of the "
                      "pressure window over its refill (measured); debt: its time-weighted mean "
                      "token-bucket debt (DESIGN §5.4) over the window.")


# ---------------------------------------------------------------------------------------- trace
@main.group()
def trace() -> None:
    """Generate, import and inspect request traces (Parquet)."""


@trace.command("generate")
@click.argument("workload")
@click.argument("out", type=click.Path(dir_okay=False))
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option("--profile", default="l4-qwen2.5-1.5b", show_default=True)
@click.option("--blocks", "num_blocks", type=click.IntRange(min=2), default=512,
              show_default=True)
@click.option("--block-size", type=POSITIVE, default=16, show_default=True)
@_workload_options
@_user_errors
def trace_generate(workload, out, seed, alpha, profile, num_blocks, block_size, overrides):
    """Generate WORKLOAD and write it to OUT (.parquet)."""
    from prefixshield.experiments.overrides import parse_overrides
    from prefixshield.experiments.single import RunSpec, build_trace
    from prefixshield.simulator.config import EngineConfig
    from prefixshield.simulator.costmodel import load_profile
    from prefixshield.traces.io import write_trace
    from prefixshield.workloads import WORKLOADS

    if workload not in WORKLOADS:
        raise click.BadParameter(f"unknown workload {workload!r}; known: {_workload_names()}",
                                 param_hint="WORKLOAD")
    typed = parse_overrides(WORKLOADS[workload].params_type, overrides)
    spec = RunSpec(workload=workload, policies=("lru",),
                   engine=EngineConfig(num_blocks=num_blocks, block_size=block_size),
                   profile=load_profile(profile), alpha=alpha, seed=seed, overrides=typed)
    tr, _info = build_trace(spec)
    write_trace(tr, out)
    console.print(f"wrote {len(tr)} requests to {out}")


@trace.command("import")
@click.argument("fmt", type=click.Choice(["mooncake", "sharegpt", "azure"]))
@click.argument("src", type=click.Path(dir_okay=False))
@click.argument("out", type=click.Path(dir_okay=False))
@click.option("--seed", type=SEED, default=0, show_default=True, help="Token seed.")
@click.option("--groups", "num_groups", type=POSITIVE, default=1, show_default=True,
              help="Spread requests over this many groups (see --assign).")
@click.option("--assign", type=click.Choice(["round_robin", "session", "prefix", "zipf",
                                            "servegen", "map"]),
              default="round_robin", show_default=True,
              help="Tenant model: round_robin (records in file order); session (keep a "
                   "conversation, or a Mooncake prefix root, in one group); prefix (Mooncake: "
                   "first hash id mod groups); zipf (units to groups with shares 1/(g+1)^skew: "
                   "heterogeneous tenants); servegen (shares of real production clients, "
                   "<= 8 groups); map (--tenant-map CSV record,group[,contract]).")
@click.option("--tenant-skew", type=click.FloatRange(min=0, min_open=True), default=1.0,
              show_default=True, help="--assign zipf: the exponent of the group shares.")
@click.option("--tenant-map", type=click.Path(dir_okay=False), default=None,
              help="--assign map: CSV with columns record,group[,contract].")
@click.option("--time-scale", type=click.FloatRange(min=0, min_open=True), default=1.0,
              show_default=True,
              help="mooncake, azure: multiply arrival times (2 = half the request rate).")
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), default=None,
              help="mooncake, azure: rescale arrival times (one factor, after --time-scale) to "
                   "this mean rate in requests/s.")
@click.option("--limit", type=POSITIVE, default=None, help="Import only the first N records.")
@click.option("--warmup-s", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="Requests arriving before this many seconds are not measured.")
@click.option("--system-prompt-tokens", type=click.IntRange(min=0), default=0,
              show_default=True,
              help="azure, sharegpt: a shared system prompt of this many tokens per group at the "
                   "head of every prompt (Azure's prompts are otherwise all unique).")
@click.option("--max-prompt-tokens", type=POSITIVE, default=None,
              help="Longest prompt kept (tokens); longer requests are handled by --over. Use "
                   "it to fit a trace to a pool: (blocks - 1) x block size minus the output.")
@click.option("--over", type=click.Choice(["drop", "clip"]), default="drop", show_default=True,
              help="With --max-prompt-tokens: drop longer requests, or keep their first tokens.")
@_user_errors
def trace_import(fmt, src, out, seed, num_groups, assign, tenant_skew, tenant_map, time_scale,
                 rate, limit, warmup_s, system_prompt_tokens, max_prompt_tokens, over):
    """Convert an external trace SRC (Mooncake JSONL, ShareGPT JSON, Azure CSV; plain or
    gzip-compressed, with or without a UTF-8 byte-order mark) to OUT."""
    from prefixshield.traces import importers
    from prefixshield.traces.io import write_trace

    common = dict(seed=seed, warmup_s=warmup_s, limit=limit, assign=assign,
                  tenant_skew=tenant_skew, tenant_map=tenant_map,
                  num_groups=None if assign == "map" and num_groups == 1 else num_groups)
    if fmt == "mooncake":
        if system_prompt_tokens:
            raise click.BadParameter("mooncake traces carry their own prefixes (hash_ids)",
                                     param_hint="--system-prompt-tokens")
        tr = importers.import_mooncake(src, time_scale=time_scale, **common)
    else:
        if fmt == "azure":
            tr = importers.import_azure(src, time_scale=time_scale,
                                        system_prompt_tokens=system_prompt_tokens, **common)
        else:
            if time_scale != 1.0 or rate is not None:
                raise click.BadParameter("sharegpt has no timestamps to scale (arrivals are "
                                         "drawn)", param_hint="--time-scale/--rate")
            tr = importers.import_sharegpt(src, system_prompt_tokens=system_prompt_tokens,
                                           **common)
    note = ""
    if rate is not None:
        from prefixshield.traces.transform import scale_to_rate

        tr, factor = scale_to_rate(tr, rate)
        note += f" (arrivals x {factor:.3g} for {rate:g} req/s)"
    if max_prompt_tokens is not None:
        from prefixshield.traces.transform import limit_request_tokens

        tr = limit_request_tokens(tr, max_prompt_tokens, over)
        n = tr.meta["limit"]["requests_affected"]
        note += (f" ({n} prompts over {max_prompt_tokens} tokens "
                 f"{'dropped' if over == 'drop' else 'clipped'})")
    write_trace(tr, out)
    console.print(f"imported {len(tr)} requests from {src} to {out}{note}")


@trace.command("inspect")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--block-size", type=POSITIVE, default=16, show_default=True)
@_user_errors
def trace_inspect(path, block_size):
    """Print what a trace holds: requests, groups, roles, prompt lengths, rates."""
    from prefixshield.traces.io import read_trace

    tr = read_trace(path)
    df = tr.requests
    lens = tr.prompt_lengths()
    dur = float(df["arrival_s"].max() - df["arrival_s"].min()) if len(df) else 0.0
    console.print(f"[bold]{path}[/]: {len(df)} requests over {dur:.1f} s, seed {tr.seed}, "
                  f"vocab {tr.vocab_size}; meta: {tr.meta.get('workload') or tr.meta.get('importer') or '-'}")
    table = Table()
    for col in ("group", "contract", "role", "requests", "measured", "rate (req/s)",
                "mean prompt (tokens)", f"mean prompt (blocks of {block_size})",
                "mean output (tokens)", "distinct prefix_ids"):
        table.add_column(col, justify="left" if col in ("group", "contract", "role") else "right")
    df = df.assign(_len=lens)
    for (g, c, r), sub in df.groupby(["group", "contract", "role"], sort=False):
        span = float(sub["arrival_s"].max() - sub["arrival_s"].min())
        rate = (len(sub) - 1) / span if span > 0 else float("nan")
        table.add_row(str(g), str(c), str(r), str(len(sub)), str(int(sub["measured"].sum())),
                      f"{rate:.2f}", f"{sub['_len'].mean():.0f}",
                      f"{(sub['_len'] // block_size).mean():.1f}",
                      f"{sub['output_tokens'].mean():.0f}", str(sub["prefix_id"].nunique()))
    console.print(table)


@main.command()
@click.option("--model", "model_dir", required=True, type=click.Path(file_okay=False, exists=True),
              help="Model directory (random weights are fine: `prefixshield make-model`).")
@click.option("--name", required=True, help="Profile name, e.g. cpu-tiny-qwen2.")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default=None,
              help="Profile file to write [default: NAME.toml].")
@click.option("--block-size", type=POSITIVE, default=32, show_default=True,
              help="KV block size (vLLM's CPU attention needs a multiple of 32).")
@click.option("--blocks", "num_blocks", type=int, default=2048, show_default=True,
              help="KV blocks for the engine under test.")
@click.option("--dtype", default="float32", show_default=True,
              help="Model dtype for vLLM (float32: what `validate` runs the tiny model with).")
@click.option("--quick", is_flag=True, help="A small grid (for smoke tests).")
@_user_errors
def calibrate(model_dir, name, out_path, block_size, num_blocks, dtype, quick):
    """Measure step times on a real vLLM engine and fit a cost-model profile."""
    from rich.progress import Progress

    from prefixshield.calibrate.fit import fit_cost_model, write_profile
    from prefixshield.calibrate.measure import CalibrationGrid, measure_step_times

    grid = CalibrationGrid.quick() if quick else CalibrationGrid()
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("timing engine steps", total=None)
        m = measure_step_times(model_dir, block_size=block_size, num_blocks=num_blocks, grid=grid,
                               dtype=dtype,
                               progress=lambda d, t: progress.update(task, completed=d, total=t))
    fit = fit_cost_model(m)
    grid_text = grid.describe()
    path = out_path or f"{name}.toml"
    write_profile(path, name, fit, m.facts, grid_text)
    c = fit.cost
    console.print(f"fitted {fit.num_samples} steps: a={c.a_s:.3g} s, b={c.b_s_per_prefill_token:.3g} "
                  f"s/token, c={c.c_s_per_decode_seq:.3g} s/seq, d={c.d_s_per_context_token:.3g} "
                  f"s/context token; R^2={fit.r2:.3f}, median |rel err| "
                  f"{100 * fit.median_abs_rel_error:.1f}%")
    console.print(f"wrote {path}")


@main.command("make-model")
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.option("--arch", default="tiny-qwen2", show_default=True,
              type=click.Choice(["tiny-qwen2", "qwen2.5-1.5b", "qwen2.5-7b"]),
              help="Architecture: the tiny CPU test model or a public Qwen2.5 shape.")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Weight RNG seed.")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default=None,
              help="Weight dtype [default: float32 for tiny-qwen2, bfloat16 otherwise].")
@click.option("--dry-run", is_flag=True, help="Print config.json and the parameter count only.")
@click.option("--overwrite", is_flag=True, help="Replace a non-empty OUT_DIR.")
@_user_errors
def make_model(out_dir, arch, seed, dtype, dry_run, overwrite):
    """Write a random-weight model with the exact shapes of ARCH (no download, no tokenizer).

    Step time depends on a model's shapes, not its weights: calibrate and validate on it with
    token-id prompts (vLLM runs it with skip_tokenizer_init=True).
    """
    import json

    from prefixshield.validate.tinymodel import model_config, num_parameters, write_tiny_model

    if dry_run:
        console.print_json(json.dumps(model_config(arch)))
        console.print(f"{num_parameters(arch):,} parameters")
        return
    path = write_tiny_model(out_dir, arch=arch, seed=seed, dtype=dtype, overwrite=overwrite)
    console.print(f"wrote {arch} ({num_parameters(arch):,} parameters) to {path}/")


def _live_options(calibrate_help: str):
    """``--profile``/``--calibrate`` and the live engine (``--model``, ``--blocks``,
    ``--block-size``, ``--max-num-seqs``, ``--max-num-batched-tokens``) of ``validate`` and
    ``validate-matrix``."""
    options = [
        click.option("--profile", default=None,
                     help="Cost-model profile of the simulated side: a shipped name or a .toml "
                          "path (required unless --calibrate)."),
        click.option("--calibrate", is_flag=True, help=calibrate_help),
        click.option("--model", "model_dir", type=click.Path(file_okay=False), default=None,
                     help="Model directory [default: a tiny-qwen2 written to OUT/model]."),
        click.option("--blocks", "num_blocks", type=int, default=64, show_default=True,
                     help="KV blocks, null block included (vLLM num_gpu_blocks_override)."),
        click.option("--block-size", type=POSITIVE, default=32, show_default=True,
                     help="Tokens per block (vLLM's CPU attention: a multiple of 32)."),
        click.option("--max-num-seqs", type=int, default=16, show_default=True,
                     help="Most running requests per step."),
        click.option("--max-num-batched-tokens", type=int, default=8192, show_default=True,
                     help="Token budget per step (chunked prefill)."),
    ]

    def apply(fn):
        for opt in reversed(options):
            fn = opt(fn)
        return fn
    return apply


@main.command()
@click.argument("workload")
@click.option("--policy", "-p", default="lru", show_default=True,
              help="Policy installed in vLLM (by the plugin) and in the simulator.")
@_live_options("Measure a profile on the live engine right before the replay and simulate "
               "with it (written to OUT/calibrated_profile.toml); replaces --profile.")
@click.option("--timed", is_flag=True,
              help="Honour arrival times on the wall clock [default: one request at a time].")
@click.option("--free-outputs", is_flag=True,
              help="Let the model pick its own output tokens (only their number is forced); "
                   "by default it generates the simulator's, so later turns quote the same ids.")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Trace seed.")
@_workload_options
@click.option("--check-invariants", is_flag=True,
              help="Check the pool/policy invariants after every block-pool call (slow).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True,
              help="Write sim_vs_live.{md,csv,json}, sim_vs_live_requests.csv and "
                   "sim_vs_live_steps.csv here.")
@_user_errors
def validate(workload, policy, profile, calibrate, model_dir, num_blocks, block_size,
             max_num_seqs, max_num_batched_tokens, timed, free_outputs, seed, alpha, overrides,
             check_invariants, out_dir):
    """Replay WORKLOAD on a real vLLM with POLICY installed, and in the simulator; write the
    sim-vs-live report: Metric / vLLM / Sim (the profile) / Sim (the live engine's own step
    times, which isolates the scheduler model) with Diff%, per-request cached-token agreement,
    and the profile's step-time residuals.

    WORKLOAD is a generated workload name or a trace .parquet file. Needs vLLM installed.
    Small pools cannot hold the 1,536-token C_prefill probe: give the rate with
    --set base_rate=... (requests/s) and prompt sizes with --set prefix_tokens=....
    """
    from prefixshield.validate.matrix import ValidationCell, run_cell

    if calibrate and profile:
        raise click.UsageError("--calibrate measures the profile itself: drop --profile")
    if not calibrate and not profile:
        raise click.UsageError("give --profile NAME|FILE.toml, or --calibrate")
    _workload_overrides(workload, overrides)  # named errors before vLLM starts
    cell = ValidationCell(workload=workload, policy=policy, timed=timed, seed=seed, alpha=alpha,
                          overrides=tuple(overrides), num_blocks=num_blocks,
                          block_size=block_size, max_num_seqs=max_num_seqs,
                          max_num_batched_tokens=max_num_batched_tokens)
    try:
        report = run_cell(cell, out_dir=out_dir, profile=profile, calibrate=calibrate,
                          model_dir=model_dir, force_outputs=not free_outputs,
                          check_invariants=check_invariants, console=console)
    except ImportError as e:
        raise click.ClickException(f"validate needs vLLM installed (make install-vllm): {e}") \
            from None
    from prefixshield.validate.compare import to_markdown

    console.print(to_markdown(report), markup=False)
    console.print(f"wrote the report to {out_dir}/")


@main.command("validate-matrix")
@click.option("--workload", "-w", "workloads", multiple=True,
              help="A matrix workload (repeatable) [default: one_touch, two_pass_replay, "
                   "low_and_slow, sharegpt at their CPU sizes].")
@click.option("--policy", "-p", "policies", multiple=True,
              help="A policy spec (repeatable) [default: lru, prefixshield].")
@click.option("--mode", "modes", multiple=True, type=click.Choice(["serialized", "timed"]),
              help="Arrival mode (repeatable) [default: both].")
@_live_options("Calibrate on the live engine right before every cell's replay.")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]),
              default="float32", show_default=True,
              help="Model dtype (bfloat16 for the Qwen2.5 shapes on a GPU).")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Trace seed.")
@_workload_options
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True,
              help="Write matrix.{md,csv,json} and cells/<cell>/sim_vs_live.* here; finished "
                   "cells are kept (an interrupted matrix resumes).")
@_user_errors
def validate_matrix(workloads, policies, modes, profile, calibrate, model_dir, num_blocks,
                    block_size, max_num_seqs, max_num_batched_tokens, dtype, seed, alpha,
                    overrides, out_dir):
    """Run `validate` over workloads x policies x modes on one live engine and write one
    summary table (cached-token agreement, TTFT/E2E error with the profile and with the live
    step times, the profile's step-time error).

    The workloads run at CPU sizes on 64 blocks of 32 tokens (see
    prefixshield/validate/matrix.py), at --alpha x C_prefill of the profile each cell runs
    with; --set KEY=VALUE applies to every cell (e.g. --set duration_s=2 for a quick matrix).
    A cell takes tens of seconds on two cores.
    """
    from rich.progress import Progress

    from prefixshield.validate.matrix import MATRIX_POLICIES, default_cells, run_matrix

    if calibrate and profile:
        raise click.UsageError("--calibrate measures the profile itself: drop --profile")
    if not calibrate and not profile:
        raise click.UsageError("give --profile NAME|FILE.toml, or --calibrate")
    cells = default_cells(workloads or None, tuple(policies) or MATRIX_POLICIES,
                          tuple(modes) or ("serialized", "timed"), seed=seed,
                          extra=tuple(overrides), alpha=alpha, num_blocks=num_blocks,
                          block_size=block_size, max_num_seqs=max_num_seqs,
                          max_num_batched_tokens=max_num_batched_tokens, dtype=dtype)
    from prefixshield.validate.matrix import typed_overrides

    for cell in cells:
        typed_overrides(cell)  # named errors before vLLM starts
    try:
        with Progress(console=console) as progress:
            task = progress.add_task("validation cells", total=len(cells))
            result = run_matrix(cells, out_dir, profile=profile, calibrate=calibrate,
                                model_dir=model_dir, console=console,
                                on_cell=lambda d, t, label: progress.update(
                                    task, completed=d, description=label))
    except ImportError as e:
        raise click.ClickException(f"validate-matrix needs vLLM installed (make install-vllm): "
                                   f"{e}") from None
    console.print((Path(out_dir) / "matrix.md").read_text(), markup=False)
    console.print(f"{result.ran} cells run, {result.reused} reused, {result.failed} failed; "
                  f"wrote {', '.join(str(p) for p in result.paths)}")
    if result.failed:
        raise click.ClickException(f"{result.failed} cell(s) failed (their rows say why)")


@main.command()
def profiles() -> None:
    """List the shipped cost-model profiles and their provenance."""
    from prefixshield.simulator.costmodel import list_profiles, load_profile

    table = Table()
    for col in ("name", "status", "hardware", "model", "a (s)", "b (s/prefill tok)",
                "c (s/decode seq)", "d (s/context tok)"):
        table.add_column(col)
    for name in list_profiles():
        p = load_profile(name)
        c = p.cost
        table.add_row(name, p.provenance["status"], p.provenance["hardware"], p.provenance["model"],
                      f"{c.a_s:g}", f"{c.b_s_per_prefill_token:g}", f"{c.c_s_per_decode_seq:g}",
                      f"{c.d_s_per_context_token:g}")
    console.print(table)


# sweep, reproduce, report, regress: defined beside the experiments package, registered on `main`.
from prefixshield import cli_experiments  # noqa: E402,F401
from prefixshield import cli_attack  # noqa: E402,F401
from prefixshield import cli_bench  # noqa: E402,F401

if __name__ == "__main__":
    main()
