"""``run``/``compare --replicas N --router NAME``: bad input is one line before any work; a run
prints and writes the fleet tables."""

from __future__ import annotations

import pandas as pd
import pytest
from click.testing import CliRunner

from prefixshield.cli import main
from prefixshield.parquetfiles import read_frame


@pytest.mark.parametrize("args,needle", [
    (["--replicas", "0"], "--replicas"),
    (["--replicas", "100000"], "--replicas"),
    (["--replicas", "2", "--router", "nope"], "unknown router 'nope'"),
    (["--replicas", "2", "--router", "prefix_affinity", "--router-match", "2"],
     "--router-match"),
    (["--replicas", "2", "--router", "kv_aware", "--router-imbalance", "3"],
     "is read by --router prefix_affinity"),
    (["--router", "session"], "needs --replicas"),
    (["--replicas", "2", "--router", "kv_aware", "--fleet-mode", "split"], "lockstep mode only"),
    (["--executor", "process"], "needs --replicas"),
    (["--replicas", "2", "--router", "kv_aware", "--workers", "2"], "runs in lockstep"),
    (["--replicas", "2", "--address", "x:1"], "needs --executor ray"),
])
@pytest.mark.parametrize("command", ["run", "compare"])
def test_bad_fleet_options_are_one_line_errors(command, args, needle):
    res = CliRunner().invoke(main, [command, "one_touch", *args])
    assert res.exit_code == 2, res.output
    assert needle in res.output
    assert "Traceback" not in res.output


def test_run_prints_and_writes_the_fleet_tables(tmp_path):
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["run", "one_touch", "-p", "lru", "--replicas", "2",
                                    "--router", "prefix_affinity", "--out", str(out),
                                    "--no-plot"])
    assert res.exit_code == 0, res.output
    assert "2 replicas, router prefix_affinity (lockstep)" in res.output
    assert "tenants across the fleet" in res.output
    reps = pd.read_csv(out / "lru" / "fleet" / "replicas.csv")
    assert reps["replica"].tolist() == [0, 1]
    rec = read_frame(out / "lru" / "records.parquet")
    assert reps["requests"].sum() == len(rec)
    assert sorted(rec["replica"].unique()) == [0, 1]
    tenants = pd.read_csv(out / "lru" / "fleet" / "tenants.csv")
    assert set(tenants["group"]) == {"victim", "attacker", *(f"tenant{i}" for i in range(1, 7))}
    assert (out / "lru" / "fleet" / "evictions_replica1.csv").exists()
