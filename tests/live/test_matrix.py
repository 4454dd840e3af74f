"""``prefixshield validate-matrix``: cells on one live engine, one summary, resumable.

Run as a separate process: the matrix starts and closes its own engine, and closing a second
in-process engine would tear down vLLM's global parallel state under the session's engine."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pandas as pd


def cli(args):
    proc = subprocess.run([sys.executable, "-m", "prefixshield.cli"] + args, capture_output=True,
                          text=True, timeout=900, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    return proc.returncode, proc.stdout + proc.stderr

ARGS = ["validate-matrix", "-w", "one_touch", "-p", "lru", "--mode", "serialized", "--mode",
        "timed", "--profile", "cpu-tiny-qwen2", "--set", "duration_s=1"]


def test_a_small_matrix_runs_summarises_and_resumes(tmp_path, tiny_model_dir):
    out = tmp_path / "m"
    args = ARGS + ["--model", tiny_model_dir, "--out", str(out)]
    code, output = cli(args)
    assert code == 0, output[-4000:]
    assert "2 cells run, 0 reused, 0 failed" in output
    md = (out / "matrix.md").read_text()
    assert "one_touch-lru-serialized" in md and "one_touch-lru-timed" in md
    assert "| vllm_version | 0.32.0 |" in md
    rows = pd.read_csv(out / "matrix.csv")
    ser = rows.set_index("mode").loc["serialized"]
    assert ser["cached_equal"] == ser["requests"]          # LRU serialized: exact
    assert (rows["steps_identical"] == rows["steps_live"]).all()
    for cell in ("one_touch-lru-serialized", "one_touch-lru-timed"):
        data = json.loads((out / "cells" / cell / "sim_vs_live.json").read_text())
        assert data["meta"]["cell"]["workload"] == "one_touch"
    # rerun: nothing recomputed
    code, output = cli(args)
    assert code == 0 and "0 cells run, 2 reused, 0 failed" in output, output[-4000:]
    # other settings into the same folder: refused, naming the cell
    code, output = cli(ARGS[:-1] + ["duration_s=2", "--model", tiny_model_dir, "--out",
                                    str(out)])
    assert code != 0 and "other settings" in output, output[-4000:]
