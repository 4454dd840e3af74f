"""``prefixshield run``, ``compare`` and ``profiles``: simulate a workload under policies, compare
them over paired seeds, list the cost-model profiles."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import click
from rich.table import Table

from prefixshield.cli.common import (CONTRACT_MODES, C_PREFILL_BASES, SEED, Stages,
                                     _engine_options, _fleet_options, _load_numba_target,
                                     _loading, _scheduler_options, _user_errors,
                                     _workload_options, compile_note, console, count, finite,
                                     fleet_executor, run_options)
from prefixshield.edges import MAX_SEEDS


_C_PREFILL_BASIS = click.option(
    "--c-prefill-basis", type=click.Choice(list(C_PREFILL_BASES)), default=C_PREFILL_BASES[0],
    show_default=True,
    help="Where C_prefill is measured: on the reference pool of 512 blocks, once per profile "
         "(the same arrival rates and attack at every --blocks), or on this run's own pool.")


_CONTRACTS = click.option(
    "--contracts", "contracts_mode", type=click.Choice(list(CONTRACT_MODES)),
    default=CONTRACT_MODES[0], show_default=True,
    help="The tiers' refill and burst: the reference's (64/40/16 blocks/s, sized for 511 "
         "blocks), or fit: each tier's refill = the mean creation rate of its groups under LRU "
         "on this trace and pool, burst = refill x the pool's turnover time (the trace is "
         "built as without it; only the policies' contracts change).")


_SCALE_TO_ENGINE = click.option(
    "--scale-to-engine", "scale_to_load", type=finite(0, 10, min_open=True), default=None,
    metavar="LOAD",
    help="Trace files: rescale arrival times (one factor) so the trace's mean rate is LOAD x "
         "C_prefill of this profile and engine, measured with the trace's own request shapes "
         "(order, burstiness and prefixes kept; gaps scaled).")


@click.command()
@click.argument("workload")
@click.option("--policy", "-p", "policies", multiple=True, default=("lru",), show_default=True,
              help="Policy to run: a name, 'all', or NAME:KEY=VALUE[,KEY=VALUE] with constructor "
                   "arguments (e.g. prefixshield:debt_gate=false). Repeat for several; every "
                   "policy gets the identical trace.")
@_engine_options
@_scheduler_options
@_fleet_options
@click.option("--seed", type=SEED, default=0, show_default=True, help="Trace seed.")
@_workload_options
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Write records, summaries and config here.")
@click.option("--plot/--no-plot", default=True, show_default=True,
              help="With --out: write comparison.png (report.html, one self-contained page, "
                   "is written either way).")
@click.option("--check-invariants", is_flag=True,
              help="Verify the block pool's invariants after every step (slow).")
@_C_PREFILL_BASIS
@_CONTRACTS
@_SCALE_TO_ENGINE
@click.option("--stream", is_flag=True,
              help="Stream the trace through the engine in windows of requests, so memory does "
                   "not grow with its length (10^7 requests and more). Needs --out: records, "
                   "occupancy and held blocks are written as the run goes and the summary is "
                   "computed from them (the same figures as without --stream). For trace files "
                   "and the workloads generated in windows of time (one_touch with aim=none, "
                   "low_and_slow); one engine under fcfs, priority, vtc or kvtc (with or "
                   "without per-tenant limits), policies "
                   "lru, prefixshield, static_quota, s3fifo. Not written: trace.parquet, "
                   "groups.csv, the figure.")
@_user_errors
@run_options
def run(opts, out_dir, plot, stream):
    """Simulate WORKLOAD under one or more policies and print a summary table.

    WORKLOAD is a generated workload name or a trace .parquet file (see `prefixshield trace`).
    """
    with _loading():
        from prefixshield.experiments.single import (check_out_dir, is_trace_file,
                                                     run_policies, write_outputs)

        _load_numba_target()

    workload, seed, fleet = opts.workload, opts.seed, opts.fleet
    if out_dir:
        # before minutes of simulation, not after
        check_out_dir(out_dir, inputs=[workload] if is_trace_file(workload) else [])
    if stream and opts.auto_blocks is not None:
        raise click.BadParameter("auto counts the unique blocks of the whole trace, which "
                                 "--stream never holds: give --blocks N", param_hint="--blocks")
    engine, sizing = _engine(opts)
    spec = opts.spec(engine=engine)
    if stream:
        _run_stream(spec, out_dir, opts.contracts)
        return
    # the C_prefill probe runs the engine: the first compilation may happen here
    spec, trace, info = _checked_trace(spec, opts.every_policy,
                                       f"building the trace of {workload}{compile_note()}")
    names = spec.policies
    spec = _trace_priorities(spec, trace)
    _print_header(workload, trace, spec, info, sizing)
    if sizing:
        info = {**info, "blocks_sizing": sizing}  # config.json says how the pool was sized
    if opts.contracts == "fit":
        spec, info = _fit_contracts(trace, spec, info)
    timings: dict[str, float] = {}
    failures: dict[str, str] = {}
    with Stages(total=len(names)) as stages, fleet_executor(opts.executor) as ex:
        note = [compile_note(fleet)]
        where = "" if fleet is None else f" on {fleet.replicas} replicas"

        def start(name):
            stages.stage(f"simulating {name}{where} ({len(timings) + len(failures) + 1} of "
                         f"{len(names)}){note[0]}")
            note[0] = ""

        done = _on_done(stages, timings, lambda name, _result, s: f"simulated {name} in {s:.2f} s")
        results = run_policies(trace, spec, on_done=done, failures=failures, executor=ex,
                               on_start=start)
    _print_summary(results, timings, failures)
    tenants = _print_tenants(results)
    _print_debt_warning(results, fitted=opts.contracts == "fit")
    if fleet is not None:
        _print_fleet(results)
    if out_dir:
        def figures(folder: Path) -> list[Path]:
            from prefixshield.experiments.html_report import run_report

            made = _figure(folder)
            return made + [run_report(folder)]

        def _figure(folder: Path) -> list[Path]:
            if not (plot and results):
                return []
            from prefixshield.experiments.tenant_view import by_tenant
            from prefixshield.figures import policy_comparison
            from prefixshield.simulator.metrics import summarize

            groups = next(iter(results.values())).groups  # every run has the trace's groups
            focus = "victim" if "victim" in set(trace.requests["group"]) else None
            if focus not in groups:
                focus = groups[0] if groups else ""
            png = folder / "comparison.png"
            policy_comparison(png, f"{workload} - {spec.profile.name}, "
                              f"{spec.engine.num_blocks} blocks, "
                              f"seed {seed}", {p: summarize(r) for p, r in results.items()},
                              {p: (r.occupancy_t, r.occupancy[:, r.groups.index(focus)])
                               for p, r in results.items()}, focus,
                              tenants=by_tenant(tenants)[0] if len(tenants) else None)
            return [png]

        written = write_outputs(out_dir, spec, trace, info, results, failures, extra=figures)
        console.print(f"wrote {len(written)} files to {out_dir}/")
    if not results:
        raise click.ClickException("no policy could serve this trace (see the table)")


@click.command()
@click.argument("workload")
@click.option("--policy", "-p", "policies", multiple=True, default=("all",), show_default=True,
              help="Policies as for `run`; the first is the baseline of the paired differences.")
@_engine_options
@_scheduler_options
@_fleet_options
@click.option("--seeds", type=count(1, MAX_SEEDS), default=10, show_default=True,
              help="Paired runs: seeds 0..N-1, every policy on the identical trace per seed. "
                   "A generated workload: its trace seed. A trace file: bootstrap replicate "
                   "N of its sessions (see below).")
@_workload_options
@_C_PREFILL_BASIS
@_CONTRACTS
@_SCALE_TO_ENGINE
@click.option("--out", "out_csv", type=click.Path(dir_okay=False), default=None,
              help="Write per-run rows and the paired table as CSV (OUT and OUT.paired.csv).")
@_user_errors
@run_options
def compare(opts, out_csv):
    """Paired comparison of policies on WORKLOAD over several seeds.

    WORKLOAD is a generated workload or a trace .parquet file. Prints the mean hit ratio and
    P95 TTFT of the judged requests per policy, and the paired difference to the first policy
    with a 95% bootstrap CI (10,000 resamples, fixed seed). With --contracts fit, the
    contracts are fitted once, on seed 0's trace, and every seed runs under them.

    A trace file is one observation; its seeds are replicates drawn by a bootstrap over its
    sessions (a session: a group and prefix_id, the unit the importers keep together, e.g. a
    conversation or a Mooncake prefix root). Seed N draws as many sessions as the file has,
    with replacement (seed N of numpy's default generator), each with all its requests at
    their own arrival times (after --scale-to-engine); a session drawn twice is a second
    session of the same shape, its private content renamed so that it never hits its twin,
    its content shared with other sessions (a system prompt) kept. The tenant assignment is
    the file's own and is not re-dealt. The CI is then over which sessions arrived.
    """
    with _loading():
        from prefixshield.atomic import write_with
        from prefixshield.experiments.analysis import fmt_ci
        from prefixshield.experiments.contract_fit import debt_warning
        from prefixshield.experiments.paired import paired_table, run_paired
        from prefixshield.experiments.single import is_trace_file
        from prefixshield.experiments.tenant_view import results_tenant_frame

    workload, seeds, fleet = opts.workload, len(opts.seeds), opts.fleet
    engine, sizing = _engine(opts)
    trace_file = is_trace_file(workload)
    spec = opts.spec(engine=engine, seed=0, resample="sessions" if trace_file else None)
    spec, trace0, info0 = _checked_trace(
        spec, opts.every_policy, f"building seed 0's trace of {workload}{compile_note()}")
    names = spec.policies
    _print_header(workload, trace0, spec, info0, sizing)
    if trace_file:
        b = info0["bootstrap"]
        console.print(f"replicates: seeds 0..{seeds - 1} are bootstrap draws of the file's "
                      f"{b['sessions']:,} sessions (group, prefix_id; {b['file_requests']:,} "
                      "requests) with replacement, each "
                      "with all its requests at their own times; a session drawn again is a "
                      "new one of the same shape (private content renamed, shared content "
                      f"kept); the tenant assignment is the file's. Seed 0: "
                      f"{b['sessions_drawn']:,} distinct sessions, {b['requests']:,} requests.")
    fitted = _fit_contracts(trace0, spec, info0)[0].contracts if opts.contracts == "fit" \
        else None
    tenant_rows: list = []
    warnings: dict[int, str] = {}

    def guard(seed, results):
        tenant_rows.append(results_tenant_frame(results).assign(seed=seed))
        msg = debt_warning(results, fitted=opts.contracts == "fit")
        if msg:
            warnings[seed] = msg

    with Stages(total=seeds) as stages, fleet_executor(opts.executor) as ex:
        t0 = [time.perf_counter()]
        where = "" if fleet is None else f" on {fleet.replicas} replicas"
        stages.stage(f"seed 0 of {seeds}: {len(names)} policies{where}{compile_note(fleet)}")

        def on_seed(s):
            stages.done(f"seed {s}: {len(names)} policies in {time.perf_counter() - t0[0]:.2f} s")
            t0[0] = time.perf_counter()
            if s + 1 < seeds:
                stages.stage(f"seed {s + 1} of {seeds}: {len(names)} policies{where}")

        runs = run_paired(spec, list(opts.seeds), on_seed=on_seed, contracts=fitted,
                          executor=ex, on_results=guard)
    table_df = paired_table(runs, baseline=names[0],
                            metrics=("hit_ratio", "token_hit_ratio", "p95_ttft_s",
                                     "arrival_hit_ratio", "p95_queue_s"))
    over = "session-bootstrap replicates" if trace_file else "seeds"
    table = Table(title=f"{workload}: paired over {seeds} {over}; differences vs {names[0]} "
                        "(95% bootstrap CI)")
    attack = ("attacker_pressure_ratio" in runs
              and bool(runs["attacker_pressure_ratio"].notna().any()))
    cols = ["policy", "runs", "hit ratio", "diff (pp)", "at arrival", "token hit ratio",
            "P95 TTFT (s)", "diff (s)", "P95 queue (s)"]
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
               f"{100 * r['arrival_hit_ratio_mean']:.2f}%",
               f"{100 * r['token_hit_ratio_mean']:.2f}%",
               f"{r['p95_ttft_s_mean']:.3f}",
               fmt_ci(r['p95_ttft_s_diff'], r['p95_ttft_s_ci_low'], r['p95_ttft_s_ci_high'],
                      1.0, 3),
               f"{r['p95_queue_s_mean']:.3f}"]
        if attack:
            m = means.loc[r["policy"]]
            row += [_fmt(m["attacker_pressure_ratio"], ".2f"),
                    _fmt(m["attacker_mean_debt_blocks"], ".0f")]
        table.add_row(*row)
    console.print(table)
    console.print("hit ratio: mean over the judged requests of cached / prompt tokens (vLLM's "
                  "per-request definition) at admission; at arrival: of the prefix cached when "
                  "they arrived; token hit ratio: cached over prompt tokens summed over them "
                  "(what trace studies publish); P95 queue: arrival to first admission.")
    for _, r in table_df[table_df["failed"] > 0].iterrows():
        console.print(f"[yellow]{r['policy']} failed on {r['failed']} of {seeds} seeds[/]: "
                      f"{r['error']}" + ("; its means and differences are over the seeds it "
                                         "served" if r["runs"] else ""))
    if warnings:
        first = min(warnings)
        console.print(f"[yellow]warning[/] on {len(warnings)} of {seeds} seeds (seed {first}): "
                      f"{warnings[first]}")
    tenants = _print_compare_tenants(tenant_rows, seeds, out_csv)
    if out_csv:
        write_with(out_csv, lambda tmp: runs.to_csv(tmp, index=False))
        write_with(f"{out_csv}.paired.csv", lambda tmp: table_df.to_csv(tmp, index=False))
        write_with(f"{out_csv}.tenants.csv", lambda tmp: tenants.to_csv(tmp, index=False))
        console.print(f"wrote {out_csv}, {out_csv}.paired.csv and {out_csv}.tenants.csv "
                      "(per tenant, per seed)")


def _print_compare_tenants(tenant_rows: list, seeds: int, out_csv):
    """The per-tenant table of a paired comparison: each tenant under each policy, the mean
    over the seeds that policy served; returns the per-seed rows (one frame)."""
    import pandas as pd

    from prefixshield.cli.tenant_summary import print_tenant_table
    from prefixshield.experiments.tenant_view import mean_over_seeds

    rows = pd.concat(tenant_rows, ignore_index=True) if tenant_rows else pd.DataFrame()
    if rows.empty:
        return rows
    print_tenant_table(console, mean_over_seeds(rows),
                       f"per tenant: mean over {seeds} seeds, every policy",
                       where=f"{out_csv}.tenants.csv" if out_csv else "--out FILE.tenants.csv")
    return rows


def _print_tenants(results):
    """The per-tenant table of a run's policies (every policy, tenant by tenant); returns its
    frame (`results_tenant_frame`)."""
    from prefixshield.cli.tenant_summary import print_tenant_table
    from prefixshield.experiments.tenant_view import results_tenant_frame

    df = results_tenant_frame(results)
    print_tenant_table(console, df, "per tenant: measured requests of each group, every policy",
                       where="each policy's groups.csv")
    return df


def _trace_priorities(spec, trace):
    """``spec`` with the trace's own tenant priorities (a tenant map's ``priority`` column)
    under ``--scheduler priority`` without ``--priority``; says so when it uses them."""
    from prefixshield.experiments.tenant_priorities import with_trace_priorities

    spec, used = with_trace_priorities(spec, trace)
    if used:
        console.print("priorities from the trace's tenant map: "
                      + ", ".join(f"{g}={p}" for g, p in used.items()))
    return spec


IDLE_ROWS = 32
"""A fleet of more replicas lists only its busy ones in the per-replica table."""


def _count(n: int, noun: str) -> str:
    """``1 replica``, ``4 replicas``."""
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _print_header(workload, trace, spec, info, sizing=None) -> None:
    """What runs: the trace, the engine and profile (``sizing``: how ``--blocks auto`` sized
    the pool), and how the load was sized."""
    e = spec.engine
    console.print(f"[bold]{workload}[/]: {len(trace)} requests, {len(trace.group_names())} "
                  f"groups; profile {spec.profile.name} ({spec.profile.provenance['status']}); "
                  f"{e.num_blocks} blocks x {e.block_size} tokens; vLLM compat {e.vllm_compat}")
    if sizing:
        console.print(sizing)
    if spec.fleet is not None:
        f = spec.fleet
        mode, alone = f.resolved_mode(), f.resolved_mode(shares_ledger=False)
        if mode != alone:  # only PrefixShield keeps buckets for a fleet ledger to share
            how = (f"{mode} run under prefixshield, whose buckets the fleet ledger shares; {alone}"
                   " under any other policy, where the ledger changes nothing")
        else:
            how = f"{mode} run"
        console.print(f"fleet: {_count(f.replicas, 'replica')} of that engine behind router "
                      f"{f.router.name} ({how})")
    if not e.scheduler.is_default:
        console.print(f"scheduler: {_scheduler_text(e.scheduler)}")
    if "time_factor" in info:
        console.print(f"arrivals scaled by {info['time_factor']:.3g} to {info['scale_to_load']:g}"
                      f" x C_prefill {info['c_prefill_req_per_s']:.3g} req/s = "
                      f"{info['base_rate_req_per_s']:.3g} req/s (measured: "
                      f"{info['c_prefill_probe']})")
        return
    if "base_rate_req_per_s" not in info:
        return
    if info["c_prefill_req_per_s"] is None:
        console.print(f"load: base rate {info['base_rate_req_per_s']:.3g} req/s (given)")
    else:
        console.print(f"load: base rate {info['base_rate_req_per_s']:.3g} req/s = alpha "
                      f"{spec.alpha:g} x C_prefill {info['c_prefill_req_per_s']:.3g} req/s "
                      f"(measured: {info['c_prefill_probe']})")
    meta = trace.meta
    from prefixshield.workloads.population import population_text

    line = population_text(meta)
    if line:
        console.print(line)
    if "judged_population" in meta:
        console.print(f"judged population: {meta['judged_population']}")
    if "designed_pressure_ratio" in meta:
        console.print(f"attacker: {meta['attacker_rate']:.3g} req/s, designed creation pressure "
                      f"{meta['designed_pressure_ratio']:.2f} x its refill "
                      f"({meta['attacker_rho_blocks_per_s']:g} blocks/s)"
                      + ("" if meta["params"].get("attack", True) else "; silent (control)"))


def _scheduler_text(sc) -> str:
    """One line: the scheduler, its parameters and the per-tenant limits."""
    parts = [sc.name]
    if sc.name == "priority":
        parts.append("priorities " + (", ".join(f"{g}={p}" for g, p in sc.priorities)
                                      or "all 0"))
    if sc.name in ("vtc", "kvtc"):
        parts.append(f"weights {sc.vtc_input_weight:g} per prompt token, "
                     f"{sc.vtc_output_weight:g} per output token")
    if sc.name == "kvtc":
        parts.append("KV " + ("priced at capacity" if sc.kvtc_kv_weight is None
                              else f"{sc.kvtc_kv_weight:g}") + " per block-second")
    for g, lim in sc.limits:
        who = "every group" if g == "*" else g
        parts.append(f"{who}: " + ", ".join(f"{k}={v}" for k, v in vars(lim).items()
                                           if v is not None))
    return "; ".join(parts)


def _fit_contracts(trace, spec, info):
    """``spec`` with contracts fitted to ``trace`` and its pool under LRU, the trace info with
    the fit recorded; prints the fit."""
    from prefixshield.experiments.contract_fit import fit_to_trace

    with console.status("fitting contracts: LRU on the trace..."):
        fit = fit_to_trace(trace, spec)
    for line in fit.describe():
        console.print(line)
    return replace(spec, contracts=fit.contracts), {**info, "contracts_fit": fit.to_dict()}


def _print_debt_warning(results, fitted: bool) -> None:
    """The guard: say so when the contracts do not fit (``fitted``: they were fitted to this
    trace and pool, `debt_warning`)."""
    from prefixshield.experiments.contract_fit import debt_warning

    msg = debt_warning(results, fitted)
    if msg:
        console.print(f"[yellow]warning[/]: {msg}")


def _fmt(x: float, spec: str) -> str:
    """``format(x, spec)``, or ``-`` for NaN."""
    return "-" if x != x else format(x, spec)


def _print_fleet(results) -> None:
    """Per policy: the fleet's replicas (load, hits beside the infinite-cache bound, TTFT,
    queueing, blocks) and its tenants across the fleet."""
    from prefixshield.fleet.metrics import (fleet_summary, replica_table, routing_warning,
                                            tenant_table, with_bound)

    def f3(x):
        return _fmt(x, ".3f")

    warned: dict[str, list[str]] = {}
    for label, r in results.items():
        msg = routing_warning(r)
        if msg:
            warned.setdefault(msg, []).append(label)
        rec = with_bound(r)
        s = fleet_summary(r, rec)
        # the Python loop gives the same results, only slower: say why a run took it
        loop = f", {r.fleet.loop}" if r.fleet.loop not in ("", "compiled") else ""
        ledger = ("" if s["ledger"] == "replica"
                  else f", fleet ledger (staleness {s['ledger_staleness_s']:g} s)")
        title = (f"{label}: {_count(s['replicas'], 'replica')}, router {s['router']} "
                 f"({s['mode']}{loop}{ledger}); load max/mean "
                 f"{s['max_over_mean_requests']:.2f}")
        rows = replica_table(r, rec).to_dict("records")
        idle = [row["replica"] for row in rows if row["requests"] == 0]
        collapse = len(rows) > IDLE_ROWS and idle  # a big fleet: its idle replicas as one line
        t = Table(title=title, caption=(f"{len(idle)} idle replicas not listed (no request, "
                                        "an empty pool)") if collapse else None)
        cols = ["replica", "requests", "hit ratio", "bound", "token hit", "token bound",
                "P95 TTFT (s)", "mean queue (s)", "P95 queue (s)", "new blocks",
                "mean blocks", "evictions"]
        for col in cols:
            t.add_column(col, justify="right")
        for row in rows:
            if row["requests"] == 0:  # an idle replica has no figures, only its empty pool
                if collapse:
                    continue
                t.add_row(str(row["replica"]), "0", "[yellow]idle[/]", *["-"] * 8,
                          str(row["evictions"]))
                continue
            t.add_row(str(row["replica"]), str(row["requests"]), f3(row["hit_ratio"]),
                      f3(row["bound_hit_ratio"]), f3(row["token_hit_ratio"]),
                      f3(row["bound_token_hit_ratio"]), f3(row["p95_ttft_s"]),
                      f3(row["mean_queue_s"]), f3(row["p95_queue_s"]), str(row["new_blocks"]),
                      f"{row['mean_blocks']:.0f}", str(row["evictions"]))
        console.print(t)
        t = Table(title=f"{label}: tenants across the fleet")
        cols = ["group", "role", "requests", "hit ratio", "bound", "token hit", "token bound",
                "P95 TTFT (s)", "mean queue (s)", "replicas", "top share"]
        for col in cols:
            t.add_column(col, justify="left" if col in ("group", "role") else "right")
        for row in tenant_table(r, rec).to_dict("records"):
            t.add_row(str(row["group"]), str(row["role"]), str(row["requests"]),
                      f3(row["hit_ratio"]), f3(row["bound_hit_ratio"]),
                      f3(row["token_hit_ratio"]), f3(row["bound_token_hit_ratio"]),
                      f3(row["p95_ttft_s"]), f3(row["mean_queue_s"]), str(row["replicas"]),
                      f"{row['top_share']:.2f}")
        console.print(t)
    for msg, labels in warned.items():
        under = "" if len(labels) == len(results) else f" (under {', '.join(labels)})"
        console.print(f"[yellow]warning[/]: {msg}{under}")


def _run_stream(spec, out_dir, contracts_mode) -> None:
    """``run --stream``: each policy's run streamed into ``out_dir``
    (`prefixshield.experiments.streamed`), then the summary table."""
    from prefixshield.experiments.streamed import build_stream, run_streamed_outputs

    if not out_dir:
        raise click.UsageError("--stream writes the records to files as the run goes: give "
                               "--out DIR")
    if contracts_mode == "fit":
        raise click.UsageError("--stream: --contracts fit runs LRU on the whole trace first; "
                               "use the reference contracts")
    stream, info = build_stream(spec)
    e = spec.engine
    console.print(f"[bold]{spec.workload}[/] (streamed): {len(stream.groups)} groups; profile "
                  f"{spec.profile.name}; {e.num_blocks} blocks x {e.block_size} tokens; vLLM "
                  f"compat {e.vllm_compat}")
    from prefixshield.workloads.population import population_text

    line = population_text(stream.meta)
    if line:
        console.print(line)
    timings: dict[str, float] = {}
    failures: dict[str, str] = {}
    with Stages(total=len(spec.policies)) as stages:
        stages.stage(f"simulating (streamed){compile_note()}")
        done = _on_done(stages, timings, lambda name, r, s: (
            f"simulated {name}: {r.requests:,} requests in {s:.2f} s, {r.num_windows:,} "
            "windows"))

        results = run_streamed_outputs(out_dir, spec, stream, info, on_done=done,
                                       failures=failures)
    _print_summaries({p: r.summary for p, r in results.items()}, timings, failures)
    console.print(f"wrote streamed results to {out_dir}/")
    if not results:
        raise click.ClickException("no policy could serve this trace (see the table)")


def _on_done(stages, timings: dict[str, float], describe):
    """A per-policy callback that times each run (seconds since the previous one, into
    ``timings``) and ends its step of ``stages`` (a `Stages`)
    with the line ``describe(name, result, seconds)``."""
    t0 = [time.perf_counter()]

    def done(name, result):
        timings[name] = time.perf_counter() - t0[0]
        t0[0] = time.perf_counter()
        stages.done(describe(name, result, timings[name]))
    return done


def _checked_trace(spec, every: bool, stage: str):
    """``(spec, trace, info)``: ``spec``'s trace built behind the stage line ``stage``, with
    only the policies under which its every request can be admitted (`_admissible`;
    ``every``: ``--policy all`` was given). A trace file is checked as read, before the
    build's C_prefill probe simulates anything (its replicates and rescaling keep its requests'
    shapes); a generated workload once its trace is built for the pool."""
    from prefixshield.experiments.single import build_trace, is_trace_file

    with Stages() as stages:
        stages.stage(stage)
        if is_trace_file(spec.workload):
            # Parquet I/O only when a file is read (as build_trace does)
            from prefixshield.traces.io import read_trace

            spec = _admissible(read_trace(spec.workload), spec, spec.workload, every)
            trace, info = build_trace(spec)
        else:
            trace, info = build_trace(spec)
            spec = _admissible(trace, spec, spec.workload, every)
    return spec, trace, info


def _admissible(trace, spec, source: str, every: bool):
    """``spec`` with only the policies under which every request of ``trace`` can be admitted
    (`prefixshield.experiments.sizing.unadmittable`). A policy named on the command line
    that cannot is refused (``ValueError``, one line, before any simulation); under
    ``--policy all`` it is left out with a line saying why, unless none is left."""
    from prefixshield.experiments.sizing import unadmittable

    bad = unadmittable(trace, spec.engine, spec.policies, source)
    if not bad:
        return spec
    if not every or len(bad) == len(spec.policies):
        raise ValueError(next(iter(bad.values())))
    for label, why in bad.items():
        console.print(f"[yellow]--policy all: {label} left out[/]: {why}")
    return replace(spec, policies=tuple(p for p in spec.policies if p not in bad))


def _engine(opts):
    """The run's ``EngineConfig`` (``opts.engine``, or under ``--blocks auto`` the pool sized
    from the trace) and, for ``--blocks auto``, the line saying how the pool was sized
    (`prefixshield.experiments.sizing.resolve_auto`; None for a number)."""
    if opts.auto_blocks is None:
        return opts.engine, None
    from prefixshield.experiments.single import is_trace_file
    from prefixshield.experiments.sizing import resolve_auto

    args = (opts.workload, opts.engine, opts.policies, opts.auto_blocks)
    if not is_trace_file(opts.workload):  # refused before the stage line (resolve_auto says why)
        return resolve_auto(*args)
    with Stages() as stages:
        stages.stage("sizing the pool from the trace (--blocks auto)")
        return resolve_auto(*args)


def _print_summary(results, timings, failures=None) -> None:
    from prefixshield.simulator.metrics import summarize

    _print_summaries({p: summarize(r) for p, r in results.items()}, timings, failures)


def _print_summaries(summaries: dict, timings, failures=None) -> None:
    """The summary table of runs given as their summary dicts (policy label -> dict)."""
    failures = failures or {}
    pop = next(iter(summaries.values()))["population"] if summaries else "all"
    table = Table(title=f"judged population: {'measured victim' if pop == 'victim' else 'all measured'} requests")
    attack = pop == "victim"
    cols = ["policy", "requests", "hit ratio", "at arrival", "token hit ratio", "P50 TTFT (s)",
            "P95 TTFT (s)", "P95 queue (s)", "preemptions", "evictions"]
    if attack:
        cols += ["attacker pressure", "attacker debt (blocks)", "attacker KV share"]
    for col in cols + ["sim time (s)"]:
        table.add_column(col, justify="left" if col == "policy" else "right")
    for name, s in summaries.items():
        row = [name, str(s["requests"]), f"{100 * s['hit_ratio']:.2f}%",
               f"{100 * s['arrival_hit_ratio']:.2f}%",
               f"{100 * s['token_hit_ratio']:.2f}%", f"{s['p50_ttft_s']:.3f}",
               f"{s['p95_ttft_s']:.3f}", f"{s['p95_queue_s']:.3f}", str(s["preemptions"]),
               str(s["evictions"])]
        if attack:
            row += [_fmt(s["attacker_pressure_ratio"], ".2f"),
                    _fmt(s["attacker_mean_debt_blocks"], ".0f"),
                    _fmt(100 * s["attacker_kv_share"], ".1f") + "%"]
        table.add_row(*row, f"{timings.get(name, float('nan')):.2f}")
    for name in failures:
        table.add_row(name, "[red]failed[/]", *[""] * (len(cols) - 1))
    console.print(table)
    for name, err in failures.items():
        console.print(f"[red]{name} failed[/]: {err}")
    console.print("hit ratio: the prefix cached when each request was admitted; at arrival: when "
                  "it arrived (the gap is what the cache lost while it queued); P95 queue: "
                  "arrival to first admission.")
    if attack:
        console.print("attacker pressure: blocks the attacker materialized per second of the "
                      "pressure window over its refill (measured); debt: its time-weighted mean "
                      "token-bucket debt over the window; KV share: the attacker's share of the "
                      "KV block-seconds running requests held.")



@click.command()
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

