"""``prefixshield bench``: the speed figures of `prefixshield.bench`, one table per section.

Added to the main group by `prefixshield.cli`.
"""

from __future__ import annotations

import json

import click
from rich.table import Table

from prefixshield.cli.common import _user_errors, console


def _table(result) -> Table:
    table = Table(title=result.title)
    for c in result.columns:
        table.add_column(c.header, justify="right")
    for row in result.rows:
        table.add_row(*(c.render(row.get(c.key)) for c in result.columns))
    return table


@click.command()
@click.option("--quick", is_flag=True,
              help="A smoke run: small traces and few repeats (seconds, not minutes); the "
                   "sections that need vLLM (pool, plugin) are skipped. Its numbers are not "
                   "for comparison.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Also write every number, with the machine it ran on, to this JSON file.")
@click.option("--section", "sections", multiple=True,
              help="Run only this section (repeatable): engine, schedulers, startup, keystream, "
                   "selector, state, pool, plugin, scale, traces, fleet. Default: all.")
@_user_errors
def bench(quick, json_path, sections):
    """Measure the simulator's speed, each figure against its anchor in the same run.

    Engine throughput (vs the step-by-step engine), start-up CPU time of `prefixshield run`
    (vs the import floor), key-stream replay (vs libCacheSim's C path), victim selection
    latency (vs LRU's call), policy state per block (vs LRU), our block pool (vs vLLM's
    KVCacheManager), the vLLM plugin (vs native vLLM), and scale (engine time per request and
    block-pool memory per block over sizes up to 10^6 requests and 2^20 blocks), and traces
    (building a generated trace vs simulating it under LRU, and the peak RSS of runs of
    10^6 and 10^7 requests streamed through the engine), and fleet (split and lockstep runs of
    10^6 requests over 16 replicas vs one engine, and their peak RSS).
    Absolute times depend on the machine and its load; compare the ratios.
    """
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from prefixshield.atomic import write_text
    from prefixshield.bench import SECTION_NAMES, run_sections, section_module

    names = tuple(dict.fromkeys(sections)) or SECTION_NAMES
    for n in names:
        section_module(n)
    with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as progress:
        current: dict[str, int] = {}

        def start(name: str, steps: int):
            if current:
                progress.remove_task(current.pop("task"))
            task = current["task"] = progress.add_task(name, total=max(steps, 1))
            ticked = [False]

            def tick(description: str) -> None:
                if ticked[0]:  # the step announced before this one is finished
                    progress.advance(task)
                ticked[0] = True
                progress.update(task, description=description)
            return tick

        def done(result) -> None:
            progress.console.print(_table(result) if not result.skipped else
                                   f"[bold]{result.title}[/]: {result.skipped}")
            for note in result.notes:
                progress.console.print(f"  {note}")

        report = run_sections(names, quick, on_section_start=start, on_section_done=done)
    if quick:
        console.print("--quick: a smoke run (small traces, one repeat, vLLM sections skipped); "
                      "run `prefixshield bench` for figures to compare")
    if json_path:
        write_text(json_path, json.dumps(report, indent=2, allow_nan=False) + "\n")
        console.print(f"wrote {json_path}")
