"""``prefixshield run``, ``compare`` and ``profiles``: simulate a workload under policies, compare
them over paired seeds, list the cost-model profiles."""

from __future__ import annotations

import time
from pathlib import Path

import click
from rich.table import Table

from prefixshield.cli.common import (SEED, _engine_options, _load_numba_target, _loading,
                                     _policy_names, _refuse_option_keys, _user_errors,
                                     _workload_names, _workload_options, _workload_overrides,
                                     console, count, finite)
from prefixshield.edges import MAX_SEEDS


_C_PREFILL_BASIS = click.option(
    "--c-prefill-basis", type=click.Choice(["reference", "capacity"]), default="reference",
    show_default=True,
    help="Where C_prefill is measured: on the reference pool of 512 blocks, once per profile "
         "(the same arrival rates and attack at every --blocks), or on this run's own pool.")


@click.command()
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
@click.option("--scale-to-engine", "scale_to_load", type=finite(0, 10, min_open=True),
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
            from prefixshield.figures import policy_comparison
            from prefixshield.simulator.metrics import summarize

            groups = next(iter(results.values())).groups  # every run has the trace's groups
            focus = "victim" if "victim" in set(trace.requests["group"]) else None
            if focus not in groups:
                focus = groups[0] if groups else ""
            png = folder / "comparison.png"
            policy_comparison(png, f"{workload} - {spec.profile.name}, {num_blocks} blocks, "
                              f"seed {seed}", {p: summarize(r) for p, r in results.items()},
                              {p: (r.occupancy_t, r.occupancy[:, r.groups.index(focus)])
                               for p, r in results.items()}, focus)
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
@click.option("--seeds", type=count(1, MAX_SEEDS), default=10, show_default=True,
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
    _refuse_option_keys(overrides)
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
                      "token-bucket debt over the window.")



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

