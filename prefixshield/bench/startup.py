"""Start-up: CPU seconds of a whole ``prefixshield run one_touch -p lru`` process.

The command runs as a child process, once untimed (numba's on-disk kernel cache and the
C_prefill cache are warm after it, as they are for a user's second run), then ``repeats`` times
timed; CPU time is the child's user + system time from ``resource.getrusage(RUSAGE_CHILDREN)``
(what ``/usr/bin/time`` reports), wall time from ``time.perf_counter``. Anchors, in the same run:
an interpreter that does nothing (``python -c pass``) and one that only imports the third-party
packages the run path cannot do without (numpy, pandas, numba, simpy, click, rich) and loads
numba's CPU target (which imports ``scipy.linalg`` to probe BLAS), loading and exiting the way
the CLI does (the collector paused while these load and their objects frozen after,
`prefixshield.cli.common._loading`; the exit handlers run, then ``os._exit`` before the
interpreter's teardown, `prefixshield.exitcode.leave`)
-- the floor our own code sits on; and the same imports with Python's default collector and
exit, whose collections the CLI skips.

Every child gets the environment the command line sets for itself
(`prefixshield.machine.START_ENV`, so the floor is what the run cannot avoid) and runs without
``PYTHONDONTWRITEBYTECODE``: a user's interpreter writes its bytecode cache on the first run like
the other caches, while with the variable set every run recompiles our ~60 modules (~0.1 CPU-s,
reported in the notes when the variable was dropped).
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from prefixshield.bench.common import Column, SectionResult, Tick, no_progress, ratio

TARGET_CPU_S = 1.0
"""Issue 10: the whole ``run one_touch -p lru`` process, after a first run."""

CLI_IMPORTS = "import click, rich.console\n"
"""The floor's packages the command line imports as it starts."""

RUN_IMPORTS = "import numpy, pandas, numba, simpy\n"
"""The floor's packages the ``run`` command imports."""

FLOOR_TARGET = "from numba.core.registry import cpu_target\ncpu_target.target_context.refresh()\n"
"""numba's CPU target registries, loaded by the first kernel call (from its cache), or by ``run``
before it (`prefixshield.cli.common._load_numba_target`)."""

FLOOR_CODE = CLI_IMPORTS + RUN_IMPORTS + FLOOR_TARGET
"""The imports of the floor, as Python does them by default."""

FLOOR_LOAD = (CLI_IMPORTS + "import gc\ngc.disable()\n" + RUN_IMPORTS + FLOOR_TARGET
              + "gc.freeze()\ngc.enable()\n")
"""The floor as the command line loads it: the run's imports and numba's CPU target with the
collector paused and what they built frozen after (`prefixshield.cli.common._loading`)."""

FLOOR_EXIT = "import atexit, os, sys\natexit._run_exitfuncs()\nsys.stdout.flush()\nos._exit(0)\n"
"""The CLI's exit (`prefixshield.exitcode.leave`), after the floor's imports: the exit
handlers run and the streams flushed, then no module teardown and none of its collections."""

FLOOR_LABEL = "import floor (numpy, pandas, numba + CPU target, simpy, click, rich)"
DEFAULT_EXIT_LABEL = "the same imports, Python's default collector and exit"
RUN_LABEL = "prefixshield run one_touch -p lru"


def run_command() -> list[str]:
    """argv of ``prefixshield run one_touch -p lru`` with this interpreter's console script (or
    ``python -m prefixshield`` when the script is not beside the interpreter)."""
    script = Path(sys.executable).with_name("prefixshield")
    base = [str(script)] if script.exists() else [sys.executable, "-m", "prefixshield"]
    return base + ["run", "one_touch", "-p", "lru"]


def child_times(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """(CPU seconds = user + system, wall seconds) of running ``argv`` to completion. Raises
    ``RuntimeError`` with the tail of its output when it fails."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                          text=True)
    dt = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited with {proc.returncode}: "
                           f"{proc.stdout[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, dt


def child_env(base: dict[str, str] | None = None) -> tuple[dict[str, str], list[str]]:
    """The children's environment: ``base`` (default ``os.environ``) with the CLI's
    `START_ENV` where unset and without ``PYTHONDONTWRITEBYTECODE``
    (module docstring); also the names of the variables dropped."""
    from prefixshield.machine import START_ENV

    env = dict(os.environ if base is None else base)
    for name, value in START_ENV.items():
        env.setdefault(name, value)
    dropped = [name for name in ("PYTHONDONTWRITEBYTECODE",) if env.pop(name, None) is not None]
    return env, dropped


def steps(quick: bool) -> int:
    """Progress steps this section announces."""
    return 5


def run(quick: bool = False, tick: Tick = no_progress) -> SectionResult:
    """Time the run command and the anchors (``quick``: 1 timed repeat each, else 3; the least
    CPU time is reported)."""
    repeats = 1 if quick else 3
    env, dropped = child_env()
    cmd = run_command()
    tick("start-up: first (untimed) run")
    child_times(cmd, env)
    probes = {"interpreter (python -c pass)": [sys.executable, "-c", "pass"],
              FLOOR_LABEL: [sys.executable, "-c", FLOOR_LOAD + FLOOR_EXIT],
              DEFAULT_EXIT_LABEL: [sys.executable, "-c", FLOOR_CODE],
              RUN_LABEL: cmd}
    best: dict[str, tuple[float, float]] = {}
    for label, argv in probes.items():
        tick(f"start-up: {label}")
        times = [child_times(argv, env) for _ in range(repeats)]
        best[label] = min(times)
    res = SectionResult(
        "startup", "start-up: whole process, after a first run (CPU = user + system seconds)",
        [Column("process", "process"), Column("cpu_s", "CPU s", ".2f"),
         Column("wall_s", "wall s", ".2f"), Column("over_floor", "CPU / import floor", ".2f",
                                                   "x")])
    floor = best[FLOOR_LABEL][0]
    for label, (cpu, wall_s) in best.items():
        res.rows.append({"process": label, "cpu_s": cpu, "wall_s": wall_s,
                         "over_floor": ratio(cpu, floor)})
    run_cpu = best[RUN_LABEL][0]
    res.extra.update(target_cpu_s=TARGET_CPU_S, command=" ".join(cmd), repeats=repeats,
                     dropped_env=dropped)
    res.notes.append(f"target: <= {TARGET_CPU_S:.1f} CPU-s; measured {run_cpu:.2f} CPU-s "
                     f"({run_cpu / TARGET_CPU_S:.2f}x the target), of which the import floor is "
                     f"{floor:.2f} CPU-s; least of {repeats} timed runs after an untimed one")
    if dropped:
        res.notes.append(f"children ran without {', '.join(dropped)} (set here), so the untimed "
                         "run left Python's bytecode cache warm as a default interpreter does")
    return res
