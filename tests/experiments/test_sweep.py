"""Sweeps end to end: the results store, resume after SIGKILL, executors, report and regress."""

import json
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest
from click.testing import CliRunner

from prefixshield.cli import main
from prefixshield.experiments.executors import make_executor
from prefixshield.experiments.runner import run_store
from prefixshield.experiments.spec import Experiment, parse_grid_option
from prefixshield.experiments.store import ResultsStore
from tests.fleet.test_fleet_executors import _same_fleet, _split_run

MEASURED = ["wall_s"]
"""The only measured (non-simulated) column of a simulate cell."""


def small_experiment(name="small", seeds=(0, 1)):
    return Experiment(name=name, workload="one_touch", policies=("lru", "prefixshield"),
                      seeds=tuple(seeds), base={"duration_s": 8.0},
                      grid=(parse_grid_option("one_touch", "blocks=512,1024"),
                            parse_grid_option("one_touch", "prefixshield.rho_scale=0.5,1")))


def cells_of(path) -> pd.DataFrame:
    df = ResultsStore.open(path).load().drop(columns=MEASURED)
    return df.sort_values(["experiment", "point", "policy", "seed"]).reset_index(drop=True)


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def reference_store(tmp_path_factory):
    """The small sweep run in-process, uninterrupted."""
    root = tmp_path_factory.mktemp("ref") / "store"
    store = ResultsStore.create(root, [small_experiment()], kind="sweep")
    stats = run_store(store, make_executor("inprocess"))
    assert stats.cells_written == store.num_cells() == 16
    # lru does not depend on prefixshield.rho_scale: its cells share one trace and one run
    assert stats.tasks == 4
    return root


def test_cells_hold_summary_and_details(reference_store):
    df = ResultsStore.open(reference_store).load()
    assert set(df["status"]) == {"ok"}
    assert {"hit_ratio", "token_hit_ratio", "p95_ttft_s", "grid.blocks",
            "grid.prefixshield.rho_scale", "policy_spec", "occupancy_json",
            "evictions_json", "groups_json", "ttft_quantiles_json"} <= set(df.columns)
    ps = df[df["policy"] == "prefixshield"]
    assert set(ps["policy_spec"]) == {"prefixshield:rho_scale=0.5", "prefixshield:rho_scale=1.0"}
    stats = json.loads(ps.iloc[0]["policy_stats_json"])
    assert stats["flags"]["rho_scale"] == 0.5 and "debt_samples" not in stats
    meta = json.loads((reference_store / "store.json").read_text())
    assert meta["provenance"]["prefixshield_version"]
    assert "l4-qwen2.5-1.5b" in meta["profiles"]
    assert meta["experiments"][0]["grid"][0] == ["blocks", [512, 1024]]


def test_a_rerun_skips_finished_cells(reference_store, tmp_path):
    store = ResultsStore.create(reference_store, [small_experiment()], kind="sweep")
    stats = run_store(store, make_executor("inprocess"))
    assert stats.tasks == 0 and stats.cells_written == 0 and stats.cells_skipped == 16


def test_a_store_of_another_spec_is_refused_before_any_work(reference_store, tmp_path):
    from prefixshield.experiments.spec import SpecError

    with pytest.raises(SpecError, match="another spec"):
        ResultsStore.create(reference_store, [small_experiment(seeds=(0, 1, 2))], kind="sweep")
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "x.txt").write_text("x")
    with pytest.raises(SpecError, match="not empty"):
        ResultsStore.create(tmp_path / "junk", [small_experiment()], kind="sweep")


@pytest.mark.parametrize("executor", ["process", "ray"])
def test_executors_give_bit_identical_cells(reference_store, tmp_path, executor):
    if executor == "ray":
        pytest.importorskip("ray", reason="ray is an optional extra")
    store = ResultsStore.create(tmp_path / executor, [small_experiment()], kind="sweep")
    ex = make_executor(executor, workers=2)
    try:
        run_store(store, ex)
        # a split fleet's replicas on the same executor (one Ray start-up serves both)
        fleet = _split_run(ex)
    finally:
        ex.close()
    pd.testing.assert_frame_equal(cells_of(tmp_path / executor), cells_of(reference_store))
    _same_fleet(fleet, _split_run(make_executor("inprocess")))


def test_a_sweep_killed_part_way_resumes_and_ends_identical(reference_store, tmp_path):
    """SIGKILL the sweep process after some cells are written, rerun the same command, and check
    that every cell exists exactly once with the values of an uninterrupted run."""
    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "prefixshield", "sweep", "one_touch",
           "-p", "lru,prefixshield", "--grid", "blocks=512,1024",
           "--grid", "prefixshield.rho_scale=0.5,1", "--set", "duration_s=8", "--seeds", "2",
           "--name", "small", "--executor", "inprocess", "--no-report", "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cells = out / "cells"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if cells.exists() and len(list(cells.rglob("seed=*.parquet"))) >= 3:
            break
        if proc.poll() is not None:
            pytest.fail("the sweep ended before it could be killed")
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    partial = len(list(cells.rglob("seed=*.parquet")))
    assert 3 <= partial < 16
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "resuming" in r.stdout
    files = sorted(p.relative_to(cells) for p in cells.rglob("*.parquet"))
    assert len(files) == len(set(files)) == 16
    assert not list(out.rglob("*.tmp"))
    pd.testing.assert_frame_equal(cells_of(out), cells_of(reference_store))


def test_sweep_cli_prints_gains_and_writes_the_report(tmp_path):
    out = tmp_path / "cli"
    r = invoke("sweep", "one_touch", "-p", "lru,prefixshield:segmentation=false",
               "--grid", "alpha=0.4,0.6", "--set", "duration_s=8", "--seeds", "2",
               "--executor", "inprocess", "--records", "--out", out)
    assert r.exit_code == 0, r.output
    assert "prefixshield:segmentation=false" in r.output and "alpha=0.4" in r.output
    assert (out / "index.md").exists() and (out / "tables" / "sweep.csv").exists()
    pngs = sorted(p.name for p in (out / "figures").glob("*.png"))
    assert "sweep-gain-vs-alpha.png" in pngs and "sweep-occupancy.png" in pngs
    for p in (out / "figures").glob("*.png"):
        assert p.read_bytes()[:4] == b"\x89PNG"
    store = ResultsStore.open(out)
    rec = store.load_records("sweep", "p000", "lru", 0)
    assert {"ttft_s", "cached_tokens", "group"} <= set(rec.columns)
    # report rebuilds every table and figure from the cells alone
    before = (out / "tables" / "sweep.csv").read_text()
    for p in (out / "figures").glob("*.png"):
        p.unlink()
    (out / "tables" / "sweep.csv").unlink()
    r = invoke("report", out)
    assert r.exit_code == 0, r.output
    assert (out / "tables" / "sweep.csv").read_text() == before
    assert sorted(p.name for p in (out / "figures").glob("*.png")) == pngs


def test_sweep_from_a_toml_spec(tmp_path):
    spec = tmp_path / "s.toml"
    spec.write_text('name = "outs"\nworkload = "low_and_slow"\npolicies = ["lru", "s3fifo"]\n'
                    'seeds = 2\n[base]\nduration_s = 8\n[grid]\noutput_tokens = [[1, 1], [16, 64]]\n')
    r = invoke("sweep", "--spec", spec, "--executor", "inprocess", "--out", tmp_path / "o")
    assert r.exit_code == 0, r.output
    assert "output_tokens=1,1" in r.output and "output_tokens=16,64" in r.output


def test_a_policy_that_cannot_serve_a_trace_fails_its_cells_alone(tmp_path):
    """static_quota's 255-block share cannot hold a 384-block (6,144-token) prompt: its cells
    fail with the reason; the other policy's cells are written."""
    out = tmp_path / "iso"
    r = invoke("sweep", "one_touch", "-p", "lru,static_quota", "--set", "duration_s=8",
               "--set", "prefix_tokens=6144", "--set", "base_rate=0.3", "--seeds", "1",
               "--executor", "inprocess", "--out", out)
    assert r.exit_code == 1, r.output  # failed cells fail the sweep, after writing them all
    assert "1 of 2 cells failed" in r.output and "--allow-failures" in r.output
    r = invoke("sweep", "one_touch", "-p", "lru,static_quota", "--set", "duration_s=8",
               "--set", "prefix_tokens=6144", "--set", "base_rate=0.3", "--seeds", "1",
               "--executor", "inprocess", "--allow-failures", "--out", out)
    assert r.exit_code == 0, r.output
    df = ResultsStore.open(out).load()
    assert dict(zip(df["policy"], df["status"])) == {"lru": "ok", "static_quota": "failed"}
    err = df.loc[df["policy"] == "static_quota", "error"].iloc[0]
    assert "can never be admitted" in err or "quota" in err
    assert "failed" in r.output


def test_regress_passes_on_the_same_code_and_fails_on_a_perturbed_parameter(
        reference_store, tmp_path, monkeypatch):
    r = invoke("regress", reference_store, "--executor", "inprocess")
    assert r.exit_code == 0, r.output
    assert "none changed" in r.output
    # a team changes a policy default: PrefixShield admitting per scheduler call (on this small
    # store, 8 s at 512/1,024 blocks, it moves the victim's hit ratio by about 20 pp)
    from prefixshield.policies.prefixshield import PrefixShieldPolicy

    monkeypatch.setitem(PrefixShieldPolicy.__init__.__kwdefaults__, "admission", "call")
    r = invoke("regress", reference_store, "--executor", "inprocess", "--out", tmp_path / "re")
    assert r.exit_code == 1, r.output
    assert "changed" in r.output and "prefixshield" in r.output and "hit_ratio" in r.output
    moved = [line for line in r.output.splitlines() if "│ lru" in line]
    assert not moved, "an unchanged policy must not move"


def test_regress_explicit_tolerance_absorbs_small_moves(reference_store, tmp_path, monkeypatch):
    from prefixshield.policies.prefixshield import PrefixShieldPolicy

    monkeypatch.setitem(PrefixShieldPolicy.__init__.__kwdefaults__, "segmentation", False)
    tols = [a for m in ("hit_ratio", "token_hit_ratio", "p50_ttft_s", "p95_ttft_s", "mean_e2e_s",
                        "evictions", "preemptions", "attacker_pressure_ratio",
                        "attacker_mean_debt_blocks") for a in ("--tol", f"{m}=1e12")]
    r = invoke("regress", reference_store, "--executor", "inprocess", *tols)
    assert r.exit_code == 0, r.output
    r = invoke("regress", reference_store, "--tol", "hit_ratio=-1")
    assert r.exit_code != 0 and "finite number >= 0" in r.output
