"""Run a store's experiments: plan the unfinished cells, execute their tasks, write each cell.

Cells are written by this (the driving) process as their task returns, so an executor's workers
need no access to the store's folder (Ray on a cluster), and a kill at any moment leaves only
whole cells behind (see [`prefixshield.experiments.store`][prefixshield.experiments.store]).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from prefixshield.experiments.cells import plan_tasks, point_columns, run_task
from prefixshield.experiments.store import ResultsStore


@dataclass
class RunStats:
    """What one `run_store` call did: tasks run, cells written, cells already there,
    cells that failed (a policy that could not serve its trace)."""

    tasks: int = 0
    cells_written: int = 0
    cells_skipped: int = 0
    cells_failed: int = 0


def run_store(store: ResultsStore, executor,
              on_progress: Callable[[int, int], None] | None = None,
              experiments: list | None = None) -> RunStats:
    """Compute every cell of ``store`` not yet written, with ``executor``.

    ``on_progress(done, total)`` is called with task counts as tasks finish (and once before).
    ``experiments`` (some of the store's) limits the run to their cells (a search runs the
    batch it just added)."""
    exps = store.experiments if experiments is None else list(experiments)
    done = store.done(exps)
    tasks, dest = plan_tasks(exps, done)
    stats = RunStats(tasks=len(tasks), cells_skipped=len(done))
    points = {(e.name, p.id): p for e in exps for p in e.points()}
    if on_progress:
        on_progress(0, len(tasks))
    for n, (task, outcomes) in enumerate(executor.map(run_task, tasks), start=1):
        for outcome in outcomes:
            for cell in dest[(task.key, outcome.policy_spec)]:
                row = {"experiment": cell.experiment, "point": cell.point,
                       "policy": cell.label, "seed": cell.seed,
                       "policy_spec": outcome.policy_spec,
                       **point_columns(points[(cell.experiment, cell.point)]), **outcome.row}
                store.write_cell(row, outcome.records)
                stats.cells_written += 1
                stats.cells_failed += row.get("status") == "failed"
        if on_progress:
            on_progress(n, len(tasks))
    return stats
