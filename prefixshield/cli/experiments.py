"""Command line for experiments: ``sweep``, ``reproduce``, ``report``, ``regress``.

Registered on the ``prefixshield`` group by `prefixshield.cli`. Like the rest of the CLI,
these only parse options, call `prefixshield.experiments` and print.
"""

from __future__ import annotations

import shlex
import sys
import tempfile
from pathlib import Path

import click
from rich.table import Table

from prefixshield.cli.common import (_policy_names, _user_errors, console, count,
                                     executor_options)
from prefixshield.edges import MAX_SEEDS


_executor_options = executor_options("process", "cells")


def _run_with_progress(store, executor_name, workers, address, what: str):
    """Run the store's missing cells with a progress bar (tasks, elapsed, ETA)."""
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn, TimeRemainingColumn)

    from prefixshield.experiments.executors import make_executor
    from prefixshield.experiments.runner import run_store

    done = len(store.done())
    total = store.num_cells()
    if done == total:
        console.print(f"{what}: all {total} cells already in {store.root}/; nothing to run")
        from prefixshield.experiments.runner import RunStats

        return RunStats(cells_skipped=done)
    if done:
        console.print(f"{what}: resuming, {done} of {total} cells already done")
    executor = make_executor(executor_name, workers, address)
    try:
        with Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                      MofNCompleteColumn(), TextColumn("traces"), TimeElapsedColumn(),
                      TextColumn("ETA"), TimeRemainingColumn(), console=console,
                      transient=not sys.stdout.isatty()) as progress:
            task = progress.add_task(f"{what} ({executor.name})", total=None)

            def on_progress(n, total_tasks):
                progress.update(task, completed=n, total=total_tasks)

            stats = run_store(store, executor, on_progress=on_progress)
    finally:
        executor.close()
    console.print(f"{what}: {stats.cells_written} cells written"
                  + (f" ({stats.cells_failed} failed: a policy could not serve its trace)"
                     if stats.cells_failed else "")
                  + (f", {stats.cells_skipped} kept from before" if stats.cells_skipped else "")
                  + f", {stats.tasks} traces simulated")
    return stats


def _print_gains(store) -> None:
    """A rich table per simulate experiment: mean hit ratio and paired gain per point/policy."""
    from prefixshield.experiments import analysis as A

    cells = store.load()
    for exp in store.experiments:
        if exp.kind != "simulate":
            continue
        g = A.paired_gains(cells, exp)
        base = exp.baseline_policy
        table = Table(title=f"{exp.name} ({exp.workload}): {len(exp.seeds)} paired seeds; "
                            f"differences vs {base} (95% bootstrap CI)")
        cols = (["point"] if exp.grid else []) + ["policy", "runs", "hit ratio",
                                                  "diff (pp)", "P95 TTFT (s)", "diff (s)"]
        for col in cols:
            table.add_column(col, justify="left" if col in ("point", "policy") else "right")
        for _, r in g.iterrows():
            is_base = r["policy"] == base
            cells_row = ([r["point_label"]] if exp.grid else []) + [
                r["policy"], str(r["runs"]) + (f" ({r['failed']} failed)" if r["failed"] else ""),
                A.fmt_pct(r["hit_ratio_mean"]),
                "baseline" if is_base else A.fmt_ci(r["hit_ratio_diff"], r["hit_ratio_ci_low"],
                                                    r["hit_ratio_ci_high"]),
                A.fmt_num(r["p95_ttft_s_mean"]),
                "baseline" if is_base else A.fmt_ci(r["p95_ttft_s_diff"], r["p95_ttft_s_ci_low"],
                                                    r["p95_ttft_s_ci_high"], 1.0, 3)]
            table.add_row(*cells_row)
        console.print(table)
        failed = g[g["failed"] > 0]
        for _, r in failed.iterrows():
            console.print(f"[yellow]{exp.name} {r['point_label']} {r['policy']}: "
                          f"{r['failed']} runs failed: {r['error']}[/]")


def _report(store) -> None:
    from prefixshield.experiments.report import build_report

    with console.status("writing tables and figures..."):
        sections = build_report(store)
    n_tables = sum(len(s.tables) for s in sections)
    n_figs = sum(len(s.figures) for s in sections)
    console.print(f"wrote {n_tables} tables, {n_figs} figures, index.md and report.html (one "
                  f"self-contained page: open it in a browser) to {store.root}/")


def _command_line() -> str:
    return "prefixshield " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def _worst_case_searches(out: Path, quick, compat, profile, executor, workers, address) -> None:
    """Run (or resume) the worst-case attack search of every scheduler setting into
    ``out/attack-search/<key>/`` (tables and figures there too)."""
    import time

    from prefixshield.experiments import attack_search as AS
    from prefixshield.experiments.executors import make_executor
    from prefixshield.experiments.reproduce import worst_case_searches

    AS._import_optuna()
    for key, label, config in worst_case_searches(quick, compat, profile):
        t0 = time.perf_counter()
        with console.status(f"attack search under {label}..."):
            resolved = AS.resolve(config)
            folder = out / "attack-search" / key
            store = AS.open_store(folder, config, resolved, command=_command_line())
            ex = make_executor(executor, workers, address)
            try:
                res = AS.run_search(store, config, resolved, ex)
            finally:
                ex.close()
            AS.write_outputs(folder, res)
        console.print(f"attack search under {label}: {config.trials} trials per policy, "
                      f"{time.perf_counter() - t0:.1f} s wall")


# ---------------------------------------------------------------------------------------- sweep
@click.command()
@click.argument("workload", required=False)
@click.option("--policy", "-p", "policies", multiple=True, default=("lru", "prefixshield"),
              show_default=True,
              help="Policies as for `run` (comma lists may mix names and NAME:KEY=VALUE specs); "
                   "the first is the baseline of paired differences.")
@click.option("--grid", "grid", multiple=True, metavar="KEY=V1,V2,...",
              help="A swept field (repeatable; the full factorial is run): an engine field "
                   "(blocks, block_size, compat, max_num_seqs, max_num_batched_tokens), alpha, "
                   "profile, any workload parameter, POLICY.PARAM (e.g. prefixshield.rho_scale) "
                   "or contract.NAME.rho|beta. Tuple-valued fields take ';' between values.")
@click.option("--set", "fixed", multiple=True, metavar="KEY=VALUE",
              help="A fixed field (same keys as --grid; repeatable).")
@click.option("--spec", "spec_file", type=click.Path(dir_okay=False), default=None,
              help="A TOML spec file (one experiment, or [[experiment]] tables) instead of "
                   "WORKLOAD/--policy/--grid/--set.")
@click.option("--seeds", type=count(1, MAX_SEEDS), default=10, show_default=True,
              help="Paired seeds per point (0..N-1), every policy on the identical trace.")
@click.option("--name", default="sweep", show_default=True, help="Experiment name.")
@click.option("--records", is_flag=True, help="Also store per-request records of every cell.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True,
              help="Results store (new, or the same spec's: finished cells are skipped).")
@click.option("--report/--no-report", default=True, show_default=True,
              help="Write tables, figures and index.md when done.")
@click.option("--allow-failures", is_flag=True,
              help="Exit 0 even when some cells failed (a policy that cannot serve its trace); "
                   "without it such a sweep exits 1 after writing everything.")
@_executor_options
@_user_errors
def sweep(workload, policies, grid, fixed, spec_file, seeds, name, records, out_dir, report,
          allow_failures, executor, workers, address):
    """Run WORKLOAD over a grid of fields, paired seeds per point, into a results store.

    \b
    Examples:
      prefixshield sweep one_touch --grid blocks=512,1024,2048,4096 --out results/capacity
      prefixshield sweep one_touch -p lru,prefixshield --grid alpha=0.4,0.6,0.8 \\
          --grid prefixshield.rho_scale=0.5,1,2 --set compat=0.10 --seeds 5 --out results/g
      prefixshield sweep --spec my_sweep.toml --out results/mine

    Every cell (point, policy, seed) is written atomically as it finishes: an interrupted sweep
    rerun with the same arguments resumes where it stopped. Prints the paired gain per point and
    writes index.md, tables/ and figures/ (gain against each swept field) into --out.
    """
    from prefixshield.experiments.spec import (Experiment, SpecError, load_spec_file,
                                               parse_grid_option, parse_set_option)
    from prefixshield.experiments.store import ResultsStore

    if spec_file:
        if workload or grid or fixed or policies != ("lru", "prefixshield"):
            raise click.UsageError("--spec replaces WORKLOAD, --policy, --grid and --set")
        experiments = load_spec_file(spec_file)
    else:
        if not workload:
            raise click.UsageError("give WORKLOAD (or --spec FILE)")
        from prefixshield.workloads import WORKLOADS

        if workload not in WORKLOADS:
            raise click.BadParameter(f"unknown workload {workload!r}; known: "
                                     f"{', '.join(sorted(WORKLOADS))}", param_hint="WORKLOAD")
        if seeds < 1:
            raise click.BadParameter("must be >= 1", param_hint="--seeds")
        axes = tuple(parse_grid_option(workload, g) for g in grid)
        base = dict(parse_set_option(workload, s) for s in fixed)
        try:
            experiments = [Experiment(name=name, workload=workload,
                                      policies=_policy_names(policies),
                                      seeds=tuple(range(seeds)), base=base, grid=axes,
                                      records=records)]
        except SpecError as e:
            raise click.UsageError(str(e)) from None
    from prefixshield.experiments.cells import check_experiments

    with console.status("checking every point's settings..."):
        check_experiments(experiments)  # before the store: a corrected command may reuse --out
    store = ResultsStore.create(out_dir, experiments, kind="sweep",
                                extra={"command": _command_line()})
    _run_with_progress(store, executor, workers, address, "sweep")
    _print_gains(store)
    if report:
        _report(store)
    _fail_on_failed_cells(store, allow_failures)


def _fail_on_failed_cells(store, allow_failures: bool) -> None:
    """Exit 1 (one line, after everything is written) when a cell of ``store`` failed."""
    cells = store.load()
    failed = int((cells["status"] == "failed").sum()) if len(cells) else 0
    if failed and not allow_failures:
        raise click.ClickException(f"{failed} of {len(cells)} cells failed (a policy could not "
                                   "serve its trace; see the tables); --allow-failures accepts "
                                   "that")


# ---------------------------------------------------------------------------------------- reproduce
@click.command()
@click.option("--quick", is_flag=True,
              help="3 seeds and a 20 s measured phase (every experiment and point kept): for CI.")
@click.option("--seeds", type=count(1, MAX_SEEDS), default=None,
              help="Paired seeds per cell [default: 10, or 3 with --quick].")
@click.option("--compat", type=click.Choice(["0.10", "current"]), default="0.10",
              show_default=True, help="vLLM compat mode (0.10: the reference's vLLM).")
@click.option("--profile", default="l4-qwen2.5-1.5b", show_default=True,
              help="Cost-model profile (all experiments but the profile sweep).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True,
              help="Results store and report folder (resumable).")
@click.option("--only", "only", multiple=True, metavar="SECTION",
              help="Run and report only this section of the evaluation (repeatable; e.g. "
                   "fleet; worst-cases: the attack searches) [default: all].")
@_executor_options
@_user_errors
def reproduce(quick, seeds, compat, profile, out_dir, only, executor, workers, address):
    """Regenerate the whole evaluation (every named experiment) into OUT.

    The attack table with no-attack controls, the benign and borrowing tables, the capacity,
    pressure, load and profile sweeps, the segmentation and delayed-replay ablations, the table
    of PrefixShield's readings and the overhead table: Markdown and CSV under tables/, PNG
    figures under figures/, and index.md linking them, all rebuilt by `prefixshield report OUT`
    from the stored cells. Default setup mirrors the reference: --compat 0.10, l4-qwen2.5-1.5b,
    10 paired runs.
    """
    import time

    from prefixshield.experiments.reproduce import REPRODUCE_SECTIONS, reproduce_experiments
    from prefixshield.experiments.store import ResultsStore
    from prefixshield.simulator.costmodel import load_profile

    if seeds is not None and seeds < 1:
        raise click.BadParameter("must be >= 1", param_hint="--seeds")
    known = (*REPRODUCE_SECTIONS, "worst-cases")
    for sec in only:  # checked here: the section list lives with the experiments
        if sec not in known:
            raise click.BadParameter(f"unknown section {sec!r}; known: {', '.join(known)}",
                                     param_hint="--only")
    load_profile(profile)
    experiments = reproduce_experiments(quick=quick, seeds=seeds, compat=compat, profile=profile)
    if only:  # a section's experiments (a section may share one with another)
        wanted = {n for sec in only for n in REPRODUCE_SECTIONS.get(sec, ())}
        experiments = [e for e in experiments if e.name in wanted]
    store = ResultsStore.create(out_dir, experiments, kind="reproduce",
                                extra={"command": _command_line(), "quick": bool(quick)})
    t0 = time.perf_counter()
    if experiments:
        _run_with_progress(store, executor, workers, address, "reproduce")
        console.print(f"cells took {time.perf_counter() - t0:.1f} s wall")
    if not only or "worst-cases" in only:
        _worst_case_searches(Path(out_dir), quick, compat, profile, executor, workers, address)
    _report(store)
    console.print(f"open {Path(out_dir) / 'index.md'}")


# ---------------------------------------------------------------------------------------- report
@click.command()
@click.argument("store_dir", type=click.Path(file_okay=False))
@click.option("--quiet", is_flag=True, help="Do not print the paired tables.")
@_user_errors
def report(store_dir, quiet):
    """Rebuild every table, figure, index.md and report.html of a results store from its cells
    alone; for a `run --out` folder, write its report.html.

    report.html is one self-contained page (tables, figures inline, no server): open it in a
    browser."""
    from prefixshield.experiments.html_report import is_run_dir, run_report
    from prefixshield.experiments.store import STORE_FILE, ResultsStore

    if not (Path(store_dir) / STORE_FILE).exists() and is_run_dir(Path(store_dir)):
        out = run_report(store_dir)
        console.print(f"wrote {out} (one self-contained page: open it in a browser)")
        return
    if not (Path(store_dir) / STORE_FILE).exists():
        raise click.ClickException(f"{store_dir}: not a results store (no {STORE_FILE}; made "
                                   "by sweep or reproduce) and not a run's --out folder (no "
                                   "summary.csv and config.json)")

    store = ResultsStore.open(store_dir)
    if not store.done():
        raise click.ClickException(f"{store_dir}: no cell of its {store.num_cells()} is written "
                                   "yet; nothing to report (rerun the command that made it)")
    store.lock()  # report writes tables/ and figures/ into the store
    missing = store.num_cells() - len(store.done())
    if missing:
        console.print(f"[yellow]{missing} of {store.num_cells()} cells are missing (an "
                      "interrupted run?): the tables show what is there; rerun the command "
                      "that made the store to finish it[/]")
    if not quiet and store.meta.get("kind") != "reproduce":
        _print_gains(store)
    _report(store)


# ---------------------------------------------------------------------------------------- regress
@click.command()
@click.argument("baseline_dir", type=click.Path(file_okay=False))
@click.option("--tol", "tolerances", multiple=True, metavar="METRIC=TOL",
              help="Explicit tolerance for a metric, absolute (e.g. hit_ratio=0.005); metrics "
                   "without one move when their 95% paired CI excludes 0.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Keep the rerun's store here (resumable) [default: a temporary folder]; "
                   "never the baseline itself.")
@click.option("--accept", is_flag=True,
              help="Make the rerun the new baseline: after the comparison, BASELINE_DIR's cells "
                   "are replaced by the rerun's (exit 0).")
@_executor_options
@_user_errors
def regress(baseline_dir, tolerances, out_dir, accept, executor, workers, address):
    """Rerun the experiments stored in BASELINE_DIR and fail if a cell changed.

    The simulator is deterministic (same code and seed: same numbers), so every cell is
    compared exactly: a cell whose metrics differ from the baseline's is listed with its seed,
    the baseline and new values and the change, and the command exits 1. The table's
    "significant" column adds the paired rule per metric (its 95% bootstrap CI over seeds
    excludes 0, or |mean change| > --tol): whether the change is systematic or one seed's. Exit
    0 when nothing changed. Accept an intended change with --accept (the rerun replaces the
    baseline's cells). The CI check for a team changing a policy: commit a baseline made by
    `prefixshield sweep` (or `reproduce --quick`) and run `prefixshield regress` on it.
    """
    from prefixshield.experiments.regress import accept_rerun, compare_stores, parse_tolerances
    from prefixshield.experiments.store import ResultsStore

    tols = parse_tolerances(tolerances)
    base = ResultsStore.open(baseline_dir)
    if out_dir is not None and _same_folder(out_dir, baseline_dir):
        raise click.BadParameter(f"{out_dir} is the baseline: the rerun would be compared with "
                                 "itself; give another folder", param_hint="--out")
    if accept:
        base.lock()  # the baseline is rewritten: no other writer meanwhile
    tmp = None
    if out_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="prefixshield-regress-")
        out_dir = Path(tmp.name) / "rerun"
    try:
        rerun = ResultsStore.create(out_dir, base.experiments, kind=base.meta.get("kind", "sweep"),
                                    extra={"command": _command_line(),
                                           "baseline": str(baseline_dir)})
        _run_with_progress(rerun, executor, workers, address, "regress")
        result = compare_stores(base.load(), rerun.load(), base.experiments, tols)
        if accept and not result.ok:
            accept_rerun(base, rerun)
    finally:
        if tmp is not None:
            tmp.cleanup()
    n_cells = result.cells_compared
    if result.ok:
        console.print(f"[green]regress: {n_cells} cells compared exactly, none changed[/] "
                      f"(baseline {baseline_dir})")
        return
    changed = result.changed
    table = Table(title=f"regress: {changed['cell'].nunique()} of {n_cells} cells changed vs "
                        f"{baseline_dir}")
    for col in ("experiment", "point", "policy", "seed", "metric", "baseline", "now", "change",
                "significant"):
        table.add_column(col, justify="left" if col in ("experiment", "point", "policy",
                                                        "metric", "significant") else "right")
    for _, r in changed.iterrows():
        def f(x):
            return x if isinstance(x, str) else f"{x:.6g}"
        table.add_row(r["experiment"], r["point"], r["policy"], str(r["seed"]), r["metric"],
                      f(r["baseline"]), f(r["current"]), f(r["change"]), r["significant"])
    console.print(table)
    if accept:
        console.print(f"accepted: {baseline_dir} now holds the rerun's cells")
        return
    console.print("[red]regress: cells changed[/] (an intended change: rerun with --accept to "
                  "make it the baseline)")
    raise SystemExit(1)


def _same_folder(a, b) -> bool:
    """Whether paths ``a`` and ``b`` name one folder (through links and ``..``)."""
    import os

    pa, pb = Path(a), Path(b)
    if pa.exists() and pb.exists():
        return os.path.samefile(pa, pb)
    return os.path.realpath(pa) == os.path.realpath(pb)
