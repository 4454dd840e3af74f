"""A trace file as a first-class study: ``compare TRACE.parquet`` over session-bootstrap
replicates, ``--blocks auto`` sizing, the stages a run prints as it goes, and the guard that
names a tenant whose contract does not fit it."""

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from prefixshield.cli import main
from prefixshield.experiments.sizing import request_needs, unique_blocks
from prefixshield.fleet.hashes import trace_hashes
from prefixshield.simulator.config import EngineConfig
from prefixshield.traces.bootstrap import session_bootstrap
from prefixshield.traces.io import read_trace

FIXTURES = Path(__file__).parent / "fixtures"


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def mooncake(tmp_path_factory):
    """The first 60 records of Mooncake's synthetic trace, 2 groups by session, 512-token
    hash blocks."""
    path = tmp_path_factory.mktemp("mc") / "mc.parquet"
    r = invoke("trace", "import", "mooncake", FIXTURES / "mooncake_synthetic_head60.jsonl",
               path, "--groups", "2", "--assign", "session")
    assert r.exit_code == 0, r.output
    return path


def test_compare_takes_a_trace_file_and_says_its_replicates_are_session_draws(mooncake,
                                                                               tmp_path):
    out = tmp_path / "c.csv"
    r = invoke("compare", mooncake, "-p", "lru,s3fifo", "--blocks", "auto", "--seeds", "3",
               "--scale-to-engine", "0.8", "--out", out)
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "replicates: seeds 0..2 are bootstrap draws of the file's" in text
    assert "paired over 3 session-bootstrap replicates; differences vs lru" in text
    assert "arrivals scaled by" in text and "--blocks auto:0.25:" in text
    runs = pd.read_csv(out)
    assert sorted(runs["seed"].unique()) == [0, 1, 2] and set(runs["status"]) == {"ok"}
    # each seed ran the replicate of that seed: its request count is the draw's
    trace = read_trace(mooncake)
    for seed in range(3):
        want = len(session_bootstrap(trace, seed))
        assert set(runs.loc[runs["seed"] == seed, "requests"]) == {want}
    paired = pd.read_csv(f"{out}.paired.csv")
    row = paired.set_index("policy").loc["s3fifo"]
    assert row["hit_ratio_ci_low"] <= row["hit_ratio_diff"] <= row["hit_ratio_ci_high"]


def test_compare_on_a_trace_file_is_deterministic(mooncake, tmp_path):
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    for out in (a, b):
        r = invoke("compare", mooncake, "-p", "lru", "--blocks", "auto", "--seeds", "2",
                   "--out", out)
        assert r.exit_code == 0, r.output
    assert a.read_text() == b.read_text()


def test_blocks_auto_is_the_fraction_of_the_unique_blocks_plus_the_null_block(mooncake,
                                                                             tmp_path):
    trace = read_trace(mooncake)
    engine = EngineConfig()
    hashes, _, _ = trace_hashes(trace, engine)
    unique = len(np.unique(hashes))
    assert unique_blocks(trace, engine) == unique
    want = math.ceil(0.5 * unique) + 1
    out = tmp_path / "o"
    r = invoke("run", mooncake, "-p", "lru", "--blocks", "auto:0.5", "--out", out, "--no-plot")
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    line = (f"--blocks auto:0.5: {want:,} blocks = 0.5 x the trace's {unique:,} unique blocks "
            "of 16 tokens + the null block")
    assert line in text
    assert f"{want} blocks x 16 tokens" in text
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["engine"]["num_blocks"] == want and cfg["trace"]["blocks_sizing"] == line


def test_blocks_auto_is_raised_to_the_smallest_pool_a_quota_serves(mooncake):
    trace = read_trace(mooncake)
    need = int(request_needs(trace, EngineConfig()).max())
    r = invoke("run", mooncake, "-p", "static_quota", "--blocks", "auto:0.001")
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert f"raised to {2 * need + 1:,}, the smallest pool in which static_quota admits" in text


def test_a_run_says_each_stage_as_it_starts_and_ends(mooncake):
    r = invoke("run", mooncake, "-p", "lru,s3fifo", "--blocks", "4096")
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    for stage in (f"building the trace of {mooncake}...", "simulating lru (1 of 2)",
                  "simulating s3fifo (2 of 2)"):
        assert any(line.startswith(stage) for line in lines), (stage, r.output)
    assert any(line.startswith("simulated lru in ") for line in lines)
    # the stage lines come before the table
    assert r.output.index("simulating s3fifo") < r.output.index("judged population")


def _one_heavy_tenant(tmp_path, every_s=0.5):
    """Two benign tenants over 40 s: ``chat`` sends a 2,048-token prompt of its own every
    ``every_s`` (0.5 s: 256 blocks/s of new blocks, 6.4x the standard refill of 40/s),
    ``quiet`` a 64-token one every 10 s (within its refill)."""
    from prefixshield.traces.io import write_trace
    from prefixshield.traces.schema import Trace, build_requests

    rows = [(every_s * i, "chat", 2048) for i in range(int(40 / every_s))] + \
        [(10.0 * i + 0.25, "quiet", 64) for i in range(4)]
    rows.sort()
    n = len(rows)
    cols = {"request_id": list(range(n)), "arrival_s": [r[0] for r in rows],
            "group": [r[1] for r in rows], "contract": ["standard"] * n,
            "role": ["benign"] * n, "prefix_id": list(range(n)), "measured": [True] * n,
            "output_tokens": [4] * n, "segment_ids": [[1000 + i] for i in range(n)],
            "segment_lengths": [[r[2]] for r in rows], "output_segment_id": [-1] * n}
    path = tmp_path / f"heavy{every_s:g}.parquet"
    write_trace(Trace(build_requests(cols)).validate("test"), path)
    return path


def test_the_guard_names_a_tenant_whose_contract_does_not_fit_it_on_one_engine(tmp_path):
    r = invoke("run", _one_heavy_tenant(tmp_path), "-p", "lru", "--blocks", "4096")
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "warning: a tenant's contract does not fit it under lru: chat (standard: refill " \
           "40 blocks/s) created" in text
    assert "quiet (" not in text


def test_the_guard_leaves_a_tenant_less_than_twice_over_its_refill_unnamed(tmp_path):
    from prefixshield.experiments.contract_fit import FAR, creation_rates, debt_fractions
    from prefixshield.experiments.single import RunSpec, build_trace, run_policies
    from prefixshield.simulator.costmodel import load_profile

    path = _one_heavy_tenant(tmp_path, every_s=2.2)  # 128 blocks / 2.2 s: about 1.5x refill
    spec = RunSpec(str(path), ("lru",), EngineConfig(num_blocks=4096),
                   load_profile("l4-qwen2.5-1.5b"))
    lru = run_policies(build_trace(spec)[0], spec)["lru"]
    assert debt_fractions(lru)["chat"] > 0.5  # in debt most of the window ...
    assert creation_rates(lru)[("chat", "standard")] < FAR * 40  # ... but not far over
    r = invoke("run", path, "-p", "lru", "--blocks", "4096")
    assert r.exit_code == 0, r.output
    assert "warning" not in r.output


def test_compare_runs_the_guard_too(tmp_path):
    r = invoke("compare", _one_heavy_tenant(tmp_path), "-p", "lru", "--blocks", "4096",
               "--seeds", "2")
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "warning on 2 of 2 seeds (seed 0): a tenant's contract does not fit it under " \
           "lru: chat" in text


def test_compare_on_a_trace_file_runs_a_fleet_and_a_scheduler(mooncake):
    r = invoke("compare", mooncake, "-p", "lru,static_quota", "--blocks", "auto", "--seeds",
               "2", "--replicas", "2", "--router", "session", "--scheduler", "vtc")
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "fleet: 2 replicas of that engine behind router session" in text
    assert "scheduler: vtc" in text
    assert "seed 1: 2 policies" in text and "static_quota" in text
