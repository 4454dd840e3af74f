"""A results store is safe to share (issue 26): one writer at a time under an OS lock, the
leftovers of a killed writer cleaned by the next, regress exact per cell, and names from files
drawn literally. Small runs (2 s traces, one policy)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from prefixshield.cli import main
from prefixshield.experiments.store import ResultsStore
from prefixshield.parquetfiles import read_frame

SMALL = ["one_touch", "-p", "lru", "--set", "duration_s=2", "--executor", "inprocess",
         "--no-report"]
ROOT = Path(__file__).resolve().parents[2]


def _sweep_process(out: Path, seeds: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "prefixshield", "sweep", *SMALL, "--seeds",
                             str(seeds), "--out", str(out)], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_two_writers_of_different_specs_one_is_refused_and_the_cells_are_intact(tmp_path):
    out = tmp_path / "shared"
    a, b = _sweep_process(out, 2), _sweep_process(out, 3)
    outs = [p.communicate(timeout=240)[0] for p in (a, b)]
    codes = sorted([a.returncode, b.returncode])
    assert codes == [0, 1], outs
    refused = outs[[a.returncode, b.returncode].index(1)]
    assert "Traceback" not in refused
    assert ("another process is writing this store" in refused
            or "holds results of another spec" in refused), refused
    winner = 2 if a.returncode == 0 else 3
    store = ResultsStore.open(out)
    cells = store.load()
    assert store.experiments[0].seeds == tuple(range(winner))
    assert sorted(cells["seed"]) == list(range(winner))
    assert (cells["status"] == "ok").all()


def test_a_killed_writer_releases_its_lock_and_its_leftovers_are_cleaned(tmp_path):
    out = tmp_path / "killed"
    p = _sweep_process(out, 2)
    deadline = time.time() + 120
    while not (out / "store.json").exists() and time.time() < deadline:
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=30)
    # what a SIGKILL mid-write leaves: hidden temporaries and a staging folder
    (out / "figures").mkdir(exist_ok=True)
    (out / "figures" / ".x.png.abc.tmp").write_text("half")
    (out / "cells").mkdir(exist_ok=True)
    (out / "cells" / ".seed=0.parquet.abc.tmp").write_text("half")
    (out / ".tables.abc.new").mkdir()
    r = CliRunner().invoke(main, ["sweep", *SMALL, "--seeds", "2", "--out", str(out)])
    assert r.exit_code == 0, r.output
    left = [p.name for p in out.rglob(".*") if p.name != ".lock"]
    assert left == []
    assert len(ResultsStore.open(out).load()) == 2


def _tamper(store: Path, seed: int, pp: float) -> None:
    cell = next(store.rglob(f"seed={seed}.parquet"))
    df = read_frame(cell)
    df["hit_ratio"] = df["hit_ratio"] + pp / 100
    df.to_parquet(cell, index=False)


def test_regress_catches_a_30pp_change_on_one_of_two_seeds_and_accept_takes_it(tmp_path):
    base = tmp_path / "base"
    r = CliRunner().invoke(main, ["sweep", *SMALL, "--seeds", "2", "--out", str(base)])
    assert r.exit_code == 0, r.output
    _tamper(base, 1, +30)
    r = CliRunner().invoke(main, ["regress", str(base), "--executor", "inprocess"])
    assert r.exit_code == 1, r.output
    text = " ".join(r.output.split())
    assert "1 of 2 cells changed" in text
    row = next(line for line in r.output.splitlines() if "hit_ratio" in line)
    cols = [c.strip() for c in row.split("│")][1:-1]
    assert cols[3] == "1" and cols[7] == "-0.3", cols  # seed 1, the change (now - baseline)
    assert cols[8] == "no (95% CI contains 0)", cols  # the paired CI alone would pass it
    r = CliRunner().invoke(main, ["regress", str(base), "--executor", "inprocess", "--accept"])
    assert r.exit_code == 0, r.output
    assert "accepted" in r.output
    r = CliRunner().invoke(main, ["regress", str(base), "--executor", "inprocess"])
    assert r.exit_code == 0 and "none changed" in r.output, r.output


def test_a_c_prefill_cache_entry_that_is_not_finite_is_a_miss(tmp_path, monkeypatch):
    from prefixshield import usercache
    from prefixshield.simulator import capacity

    monkeypatch.setattr(usercache, "load", lambda *a, **k: float("inf"))
    stored = []
    monkeypatch.setattr(usercache, "store", lambda *a, **k: stored.append(a[-1]) or True)
    capacity._measure.cache_clear()
    from prefixshield.simulator.config import EngineConfig
    from prefixshield.simulator.costmodel import load_profile

    value = capacity._measure(load_profile("l4-qwen2.5-1.5b").cost, EngineConfig(),
                              (256,) * 4, (4,) * 4)
    capacity._measure.cache_clear()
    assert 0 < value < float("inf") and stored == [value]


def test_group_names_with_dollars_are_drawn_as_written(tmp_path):
    import dataclasses

    from prefixshield.traces.io import read_trace, write_trace

    src = tmp_path / "t.parquet"
    r = CliRunner().invoke(main, ["trace", "generate", "one_touch", str(src), "--set",
                                  "duration_s=2"])
    assert r.exit_code == 0, r.output
    t = read_trace(src)
    names = {"victim": "$victim", "attacker": "$a$"}
    df = t.requests.copy()
    df["group"] = df["group"].replace(names)
    meta = json.loads(json.dumps(t.meta))
    meta["tenants"]["groups"] = [names.get(g, g) for g in meta["tenants"]["groups"]]
    write_trace(dataclasses.replace(t, requests=df, meta=meta), tmp_path / "d.parquet")
    out = tmp_path / "out"
    r = CliRunner().invoke(main, ["run", str(tmp_path / "d.parquet"), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert (out / "comparison.png").stat().st_size > 0


@pytest.mark.parametrize("text", ["null", "[]", "3"])
def test_regress_refuses_a_store_json_that_is_not_an_object(tmp_path, text):
    (tmp_path / "store.json").write_text(text)
    r = CliRunner().invoke(main, ["regress", str(tmp_path)])
    assert r.exit_code == 1 and "expected a JSON object" in r.output
