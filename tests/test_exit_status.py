"""The program's exit status is its command's own (issue 35).

A finished sweep used to abort at exit now and then (SIGABRT, exit 134, "terminate called without
an active exception"): an arrow worker thread dropped the last reference to a Parquet read's
Python file object while the interpreter was tearing its modules down (see
:mod:`prefixshield.exitcode`). The cause is gone (:mod:`prefixshield.parquetfiles`) and the
program leaves before the teardown. These tests run the program as a user's shell does, in its
own process: the reproducer many times on a loaded machine, every status its command's own; and,
since the abort is a race, each half of the fix on its own, deterministically (no Parquet file
read through a Python file object; no flush, hence no thread, left for the interpreter's
finalization), both of which fail on the code before the fix.
"""

import ast
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PROGRAM = [sys.executable, "-m", "prefixshield"]

SWEEP_RUNS = 30
"""Runs of the reproducer, CONCURRENT at a time. Before the fix it aborted in 9 of 60 runs in a
row and in 4 of 60 interleaved with the fixed program (0 of 60) while other work loaded this
2-core machine; under this test's own load alone the rate was lower (the test failed in 2 of its
3 tries before the fix, and a 3-at-a-time loop of 60 runs had none), so the two deterministic
tests below check the two halves of the fix directly."""

CONCURRENT = 3
"""Sweeps running at once."""

SWEEP = ["sweep", "one_touch", "-p", "lru", "-p", "prefixshield", "--grid", "blocks=512",
         "--seeds", "1", "--set", "duration_s=10", "--executor", "inprocess"]
"""The reproducer: a small sweep, whose tables are built from the cells it reads back."""


def _env() -> dict[str, str]:
    """This checkout first on the child's path (the installed package may be another copy)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}


def _run(args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*PROGRAM, *map(str, args)], capture_output=True, text=True,
                          env=_env(), timeout=600, **kw)


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=_env(), timeout=120)


def test_a_finished_sweep_exits_0_every_time_on_a_loaded_machine(tmp_path):
    # CONCURRENT runs at a time keep every core busy, as a CI machine running jobs side by side
    # does; the abort needed the machine loaded
    def one(i: int) -> str | None:
        out = tmp_path / f"s{i}"
        proc = _run([*SWEEP, "--out", out])
        if proc.returncode != 0:
            return f"run {i}: exit {proc.returncode}: {proc.stderr[-300:]}"
        if not (out / "index.md").is_file():
            return f"run {i}: exit 0 without {out / 'index.md'}"
        return None

    with ThreadPoolExecutor(CONCURRENT) as pool:
        failures = [f for f in pool.map(one, range(SWEEP_RUNS)) if f]
    assert not failures, f"{len(failures)} of {SWEEP_RUNS} runs:\n" + "\n".join(failures)


@pytest.mark.parametrize("args, status", [(["--version"], 0),
                                          (["run", "no_such_workload"], 2),
                                          (["run", "one_touch", "--bogus-option"], 2),
                                          (["run", "one_touch", "--set", "duration_s=abc"], 1)])
def test_the_program_ends_with_its_commands_status(args, status):
    proc = _run(args)
    assert proc.returncode == status, proc.stderr
    assert ("Error:" in proc.stderr) == (status != 0)


_HANDLERS_THEN = """
import atexit, sys, threading, time
atexit.register(lambda: print("exit handler ran", flush=False))
def late():  # runs on until the main thread is done: the exit must wait for it
    while threading.main_thread().is_alive():
        time.sleep(0.01)
    print("thread finished", flush=False)
threading.Thread(target=late).start()
sys.argv = ["prefixshield", "--version"]
{call}
"""


@pytest.mark.parametrize("call", ["from prefixshield.cli import main; main()",
                                  "import runpy; runpy.run_module('prefixshield', "
                                  "run_name='__main__')"])
def test_the_program_joins_threads_runs_exit_handlers_and_flushes_first(call):
    proc = _python(_HANDLERS_THEN.format(call=call))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["prefixshield, version 0.1.0", "thread finished",
                                        "exit handler ran"]


_FINALIZATION_PROBE = """
import os, sys

class Stdout:
    # standard output that says so when the interpreter's finalization flushes it

    def __init__(self, raw):
        self.raw = raw

    def write(self, text):
        return self.raw.write(text)

    def flush(self, write=os.write, finalizing=sys.is_finalizing):
        if finalizing():
            write(1, b"flushed while the interpreter finalizes\\n")
        self.raw.flush()

    def __getattr__(self, name):
        return getattr(self.raw, name)

sys.stdout = Stdout(sys.stdout)
sys.argv = ["prefixshield", "--version"]
from prefixshield.cli import main
main()
"""


def test_the_program_ends_before_the_interpreter_finalizes():
    # the abort happened there: a native thread asking for the GIL while the interpreter
    # finalized; the program flushes its streams itself and is gone before that
    proc = _python(_FINALIZATION_PROBE)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["prefixshield, version 0.1.0"]


def test_parquet_is_read_without_a_python_file_object(tmp_path, monkeypatch):
    """The cause: arrow's workers held the Python file object pandas opens for a local path.
    A sweep, start to end, reads every Parquet file through arrow's own handles."""
    import builtins

    import pandas as pd
    from click.testing import CliRunner

    from prefixshield.cli import main
    from prefixshield.experiments.store import ResultsStore
    from prefixshield.parquetfiles import read_frame

    opened: list[str] = []
    real_open = builtins.open

    def spy(file, mode="r", *args, **kwargs):
        if "r" in mode and str(file).endswith(".parquet"):
            opened.append(str(file))
        return real_open(file, mode, *args, **kwargs)

    path = tmp_path / "t.parquet"
    want = pd.DataFrame({"a": [1, 2], "b": ["x", "y"]})
    want.to_parquet(path, index=False)
    monkeypatch.setattr(builtins, "open", spy)
    pd.read_parquet(path)  # the probe sees pandas' own open()
    assert opened == [str(path)]
    opened.clear()
    pd.testing.assert_frame_equal(read_frame(path), want)
    assert opened == []
    out = tmp_path / "sweep"
    r = CliRunner().invoke(main, [*SWEEP, "--set", "duration_s=4", "--out", str(out)],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert len(ResultsStore.open(out).load()) == 2 and opened == []


def test_leave_reports_a_failing_handler_and_still_runs_the_others():
    proc = _python("import atexit\n"
                   "atexit.register(lambda: print('second', end=''))\n"
                   "atexit.register(lambda: 1 / 0)\n"
                   "from prefixshield.exitcode import leave\n"
                   "print('first ', end='')\nleave(3)\n")
    assert proc.returncode == 3
    assert proc.stdout == "first second" and "ZeroDivisionError" in proc.stderr


@pytest.mark.parametrize("raised, status, stderr", [
    ("SystemExit()", 0, ""), ("SystemExit(4)", 4, ""), ("SystemExit('bad: x')", 1, "bad: x"),
    ("ValueError('boom')", 1, "ValueError: boom"), ("SystemExit(258)", 2, "")])
def test_status_of_follows_cpython(raised, status, stderr):
    proc = _python("from prefixshield.exitcode import leave, status_of\n"
                   f"try:\n    raise {raised}\nexcept BaseException as e:\n"
                   "    leave(status_of(e))\n")
    assert proc.returncode == status and stderr in proc.stderr


def test_no_module_hands_pandas_a_parquet_path():
    """pandas opens a local path with Python's open() and arrow's workers then hold the file
    object (the abort's cause): the package reads Parquet with parquetfiles.read_frame."""
    offenders = []
    for path in sorted((ROOT / "prefixshield").rglob("*.py")):
        if path.name == "parquetfiles.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr == "read_parquet":
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not offenders
