"""``prefixshield calibrate | make-model | validate | validate-matrix``: the commands that run a
real vLLM engine (or write the model it runs)."""

from __future__ import annotations

from pathlib import Path

import click

from prefixshield.cli.common import (POSITIVE, SEED, _scheduler_options, _user_errors,
                                     _workload_options, _workload_overrides, console, count)


@click.command()
@click.option("--model", "model_dir", required=True, type=click.Path(file_okay=False, exists=True),
              help="Model directory (random weights are fine: `prefixshield make-model`).")
@click.option("--name", required=True, help="Profile name, e.g. cpu-tiny-qwen2.")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default=None,
              help="Profile file to write [default: NAME.toml].")
@click.option("--block-size", type=POSITIVE, default=32, show_default=True,
              help="KV block size (vLLM's CPU attention needs a multiple of 32).")
@click.option("--blocks", "num_blocks", type=count(2), default=2048, show_default=True,
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


@click.command("make-model")
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

    from prefixshield.live.tinymodel import model_config, num_parameters, write_tiny_model

    if dry_run:
        console.print_json(json.dumps(model_config(arch)))
        console.print(f"{num_parameters(arch):,} parameters")
        return
    path = write_tiny_model(out_dir, arch=arch, seed=seed, dtype=dtype, overwrite=overwrite)
    console.print(f"wrote {arch} ({num_parameters(arch):,} parameters) to {path}/")


def _live_options(calibrate_help: str):
    """``--profile``/``--calibrate`` and the live engine (``--model``, ``--blocks``,
    ``--block-size``, ``--max-num-seqs``, ``--max-num-batched-tokens``) of ``validate`` and
    ``validate-matrix``. The engine's pool and batching (``num_blocks``, ``block_size``,
    ``max_num_seqs``, ``max_num_batched_tokens``) reach the command as its ``**engine``,
    under the keyword names its cells take."""
    options = [
        click.option("--profile", default=None,
                     help="Cost-model profile of the simulated side: a shipped name or a .toml "
                          "path (required unless --calibrate)."),
        click.option("--calibrate", is_flag=True, help=calibrate_help),
        click.option("--model", "model_dir", type=click.Path(file_okay=False), default=None,
                     help="Model directory [default: a tiny-qwen2 written to OUT/model]."),
        click.option("--blocks", "num_blocks", type=count(2), default=64, show_default=True,
                     help="KV blocks, null block included (vLLM num_gpu_blocks_override)."),
        click.option("--block-size", type=POSITIVE, default=32, show_default=True,
                     help="Tokens per block (vLLM's CPU attention: a multiple of 32)."),
        click.option("--max-num-seqs", type=POSITIVE, default=16, show_default=True,
                     help="Most running requests per step."),
        click.option("--max-num-batched-tokens", type=POSITIVE, default=8192, show_default=True,
                     help="Token budget per step (chunked prefill)."),
    ]

    def apply(fn):
        for opt in reversed(options):
            fn = opt(fn)
        return fn
    return apply


@click.command()
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
@_scheduler_options
@click.option("--check-invariants", is_flag=True,
              help="Check the pool/policy invariants after every block-pool call (slow).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True,
              help="Write sim_vs_live.{md,csv,json}, sim_vs_live_requests.csv and "
                   "sim_vs_live_steps.csv here.")
@_user_errors
def validate(workload, policy, profile, calibrate, model_dir, timed, free_outputs, seed, alpha,
             overrides, scheduler, check_invariants, out_dir, **engine):
    """Replay WORKLOAD on a real vLLM with POLICY installed, and in the simulator; write the
    sim-vs-live report: Metric / vLLM / Sim (the profile) / Sim (the live engine's own step
    times, which isolates the scheduler model) with Diff%, per-request cached-token agreement,
    and the profile's step-time residuals.

    WORKLOAD is a generated workload name or a trace .parquet file. Needs vLLM installed.
    Small pools cannot hold the 1,536-token C_prefill probe: give the rate with
    --set base_rate=... (requests/s) and prompt sizes with --set prefix_tokens=....

    --scheduler runs live too: priority is vLLM's own priority policy (each request carries
    its group's --priority); vtc and --tenant-limit are installed at vLLM's waiting queue.
    """
    from prefixshield.live.scheduling import check_supported
    from prefixshield.validate.matrix import ValidationCell, run_cell

    if calibrate and profile:
        raise click.UsageError("--calibrate measures the profile itself: drop --profile")
    if not calibrate and not profile:
        raise click.UsageError("give --profile NAME|FILE.toml, or --calibrate")
    _workload_overrides(workload, overrides)  # named errors before vLLM starts
    try:
        check_supported(scheduler)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--scheduler") from None
    cell = ValidationCell(workload=workload, policy=policy, timed=timed, seed=seed, alpha=alpha,
                          overrides=tuple(overrides), scheduler=scheduler, **engine)
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


@click.command("validate-matrix")
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
def validate_matrix(workloads, policies, modes, profile, calibrate, model_dir, dtype, seed,
                    alpha, overrides, out_dir, **engine):
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
                          extra=tuple(overrides), alpha=alpha, dtype=dtype, **engine)
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


