"""attack-search end to end (CI-sized): the search against LRU is at least as damaging as
one_touch at the same budget, the worst-case table lists every policy, the same seed gives the
same trials and tables on any executor, and a search killed part-way resumes to the same end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

pytest.importorskip("optuna")

from prefixshield.cli import main  # noqa: E402
from prefixshield.experiments import attack_search as AS  # noqa: E402
from prefixshield.experiments.executors import make_executor  # noqa: E402
from prefixshield.parquetfiles import read_frame  # noqa: E402

ALL = ("lru", "prefixshield", "s3fifo", "static_quota")
SMALL = {"blocks": 512, "compat": "current", "alpha": 0.6, "profile": "l4-qwen2.5-1.5b",
         "duration_s": 15.0}
TABLES = ("trials.csv", "worst_case.csv", "worst_attacks.csv", "transfer.csv",
          "worst_evictions.csv")


def search(out, policies=("lru",), trials=6, executor="inprocess", workers=None, base=SMALL,
           seeds=2, write=True, **kw):
    config = AS.SearchConfig(policies=tuple(policies), trials=trials, seeds=seeds,
                             eval_seeds=seeds, base=base, **kw)
    resolved = AS.resolve(config)
    store = AS.open_store(out, config, resolved)
    ex = make_executor(executor, workers)
    try:
        res = AS.run_search(store, config, resolved, ex)
    finally:
        ex.close()
    if write:  # the tables and figures
        AS.write_outputs(out, res)
    return res


def tables_of(out) -> dict[str, pd.DataFrame]:
    return {name: pd.read_csv(Path(out) / "tables" / name) for name in TABLES}


def cli_args(out, trials=8):
    return ["attack-search", "--policy", "lru", "--trials", str(trials), "--seeds", "2",
            "--eval-seeds", "2", "--batch", "2", "--set", "duration_s=15",
            "--executor", "inprocess", "--out", str(out)]


@pytest.fixture(scope="module")
def all_policies(tmp_path_factory):
    out = tmp_path_factory.mktemp("all") / "search"
    return out, search(out, policies=ALL, trials=5)


def test_lru_search_is_at_least_as_damaging_as_one_touch_at_the_same_budget(all_policies):
    _, res = all_policies
    worst = res.worst["lru"].result.hit_loss[0]
    one_touch = res.fixed["one_touch"]["lru"].hit_loss[0]
    assert worst >= one_touch
    # the hand-written attacks ran at the budget: one_touch at its flood rate, which is the
    # default budget's request limit
    assert res.resolved.spend["one_touch"] == res.resolved.budget_rate["one_touch"]


def test_worst_case_table_lists_every_policy_with_its_parts(all_policies):
    out, res = all_policies
    table = pd.read_csv(Path(out) / "tables" / "worst_case.csv")
    assert list(table["policy"]) == list(ALL)
    cols = " ".join(table.columns)
    for part in ("worst loss", "held-out", "one_touch", "low_and_slow", "two_pass_replay",
                 "attacker pressure", "attacker debt", "evicted attacker->victim"):
        assert part in cols
    transfer = pd.read_csv(Path(out) / "tables" / "transfer.csv")
    assert list(transfer["attack (worst found against)"]) == list(ALL)
    assert list(transfer.columns[1:]) == list(ALL)
    for name in ("search_progress.png", "transfer.png", "worst_evictions.png"):
        assert (Path(out) / "figures" / name).stat().st_size > 1000
    # every trial's loss is paired against the policy's own control on the same seeds
    trials = pd.read_csv(Path(out) / "tables" / "trials.csv")
    assert len(trials) == 5 * len(ALL) and set(trials["status"]) == {"ok"}


def test_same_seed_gives_the_same_trials_and_tables_on_any_executor(tmp_path):
    a = tmp_path / "a"
    b = tmp_path / "b"
    search(a, policies=("lru", "prefixshield"), trials=6)
    search(b, policies=("lru", "prefixshield"), trials=6, executor="process", workers=2)
    ta, tb = tables_of(a), tables_of(b)
    for name in TABLES:
        pd.testing.assert_frame_equal(ta[name], tb[name], check_exact=True, obj=name)
    # and another sampler seed asks other trials
    c = tmp_path / "c"
    search(c, policies=("lru",), trials=6, sampler_seed=1)
    tc = tables_of(c)["trials.csv"]
    la = ta["trials.csv"][ta["trials.csv"]["policy"] == "lru"].reset_index(drop=True)
    tpe = la["source"] == "tpe"
    assert not la.loc[tpe, "intensity"].equals(tc.loc[tpe, "intensity"])


def test_a_killed_search_resumes_and_ends_identical_to_an_uninterrupted_one(tmp_path):
    whole = tmp_path / "whole"
    r = CliRunner().invoke(main, cli_args(whole), catch_exceptions=False)
    assert r.exit_code == 0, r.output
    killed = tmp_path / "killed"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "prefixshield", *cli_args(killed)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    cells = killed / "cells"
    deadline = time.monotonic() + 120
    try:
        # wait until some trials are stored but not all (8 trials x 2 seeds)
        while time.monotonic() < deadline and proc.poll() is None:
            n = len(list(cells.glob("search.*/*/*/*.parquet"))) if cells.exists() else 0
            if n >= 6:
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the search finished before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    n_before = len(list(cells.glob("search.*/*/*/*.parquet")))
    assert 6 <= n_before < 16
    assert not (killed / "tables").exists()
    r = CliRunner().invoke(main, cli_args(killed), catch_exceptions=False)
    assert r.exit_code == 0, r.output
    tw, tk = tables_of(whole), tables_of(killed)
    for name in TABLES:
        pd.testing.assert_frame_equal(tw[name], tk[name], check_exact=True, obj=name)
    # the cells too, every column but the measured wall time
    for store_dir in (whole, killed):
        assert len(list((store_dir / "cells").glob("search.*/*/*/*.parquet"))) == 16
    a = sorted((whole / "cells").rglob("*.parquet"))
    b = sorted((killed / "cells").rglob("*.parquet"))
    assert [p.relative_to(whole) for p in a] == [p.relative_to(killed) for p in b]
    for pa, pb in zip(a, b):
        pd.testing.assert_frame_equal(read_frame(pa).drop(columns="wall_s"),
                                      read_frame(pb).drop(columns="wall_s"))


def test_a_store_of_another_search_is_refused_before_any_work(tmp_path):
    out = tmp_path / "s"
    r = CliRunner().invoke(main, cli_args(out, trials=3), catch_exceptions=False)
    assert r.exit_code == 0, r.output
    n = len(list((out / "cells").rglob("*.parquet")))
    args = cli_args(out, trials=3)
    args[args.index("--seeds") + 1] = "3"
    r = CliRunner().invoke(main, args)
    assert r.exit_code != 0 and "another" in r.output
    assert len(list((out / "cells").rglob("*.parquet"))) == n
    # more trials extend the same search: the first three are kept, not recomputed
    r = CliRunner().invoke(main, cli_args(out, trials=4), catch_exceptions=False)
    assert r.exit_code == 0, r.output
    trials = pd.read_csv(out / "tables" / "trials.csv")
    assert list(trials["trial"]) == [0, 1, 2, 3]


def test_cli_errors_name_what_is_wrong(tmp_path):
    r = CliRunner().invoke(main, ["attack-search", "--budget", "bogus=5", "--out",
                                  str(tmp_path / "x")])
    assert r.exit_code != 0 and "--budget" in r.output
    r = CliRunner().invoke(main, ["attack-search", "--set", "intensity=0.5", "--out",
                                  str(tmp_path / "x")])
    assert r.exit_code != 0 and "intensity" in r.output
