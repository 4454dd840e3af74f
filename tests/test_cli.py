"""The command line: a real run end to end, and one clear error line for every bad input."""

import json
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from prefixshield.cli import main
from prefixshield.parquetfiles import read_frame

SMALL = ["--set", "duration_s=8"]


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def test_run_writes_records_summary_config_and_png(tmp_path):
    out = tmp_path / "out"
    r = invoke("run", "one_touch", "--policy", "all", *SMALL, "--out", out)
    assert r.exit_code == 0, r.output
    assert "lru" in r.output and "hit" in r.output
    rec = read_frame(out / "lru" / "records.parquet")
    assert {"ttft_s", "cached_tokens", "hit_fraction", "group", "role"} <= set(rec.columns)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["engine"]["num_blocks"] == 512 and cfg["profile"]["name"] == "l4-qwen2.5-1.5b"
    assert cfg["trace"]["params"]["duration_s"] == 8.0
    summary = pd.read_csv(out / "summary.csv")
    assert list(summary["policy"]) == sorted(summary["policy"])
    assert (out / "comparison.png").read_bytes()[:4] == b"\x89PNG"
    assert not list(out.rglob("*.tmp"))


def test_run_header_says_how_the_load_was_measured_and_the_attack_sized():
    r = invoke("run", "one_touch", "--policy", "lru", *SMALL)
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "C_prefill" in text and "32 distinct-prefix requests" in text
    assert "1,536-token prefix" in text and "azure_conv outputs (mean 8 tokens, at most 8)" in text
    assert "designed creation pressure" in text and "attacker pressure" in text
    # the population: every group with its contract and rate
    assert "population (background): 8 groups; victim share 0.575 of the base rate" in text
    assert "6 background groups tenant1..tenant6 (benign, standard)" in text
    assert "attacker (attacker, best_effort)" in text
    r = invoke("run", "delayed_replay", "--policy", "lru", *SMALL)
    assert "judged population: the victim's measured pass after the neutral phase" in " ".join(
        r.output.split())
    r = invoke("run", "one_touch", "--policy", "lru", *SMALL, "--set", "base_rate=1.5")
    assert "base rate 1.5 req/s (given)" in " ".join(r.output.split())


def test_control_keeps_the_attacker_configured_so_the_quota_is_sized_the_same(tmp_path):
    out = tmp_path / "out"
    # the two-group population: with the default 8 groups a static share (63 blocks) cannot
    # hold one victim request (tests/regression/test_behaviour.py)
    r = invoke("run", "one_touch", "-p", "static_quota", *SMALL, "--set", "attack=false",
               "--set", "population=two_group", "--out", out)
    assert r.exit_code == 0, r.output
    assert "silent (control)" in r.output
    groups = pd.read_csv(out / "static_quota" / "groups.csv")
    assert list(groups["group"]) == ["victim", "attacker"]
    assert groups.set_index("group").loc["victim", "peak_blocks"] <= 511 // 2


def test_trace_generate_then_run_the_file(tmp_path):
    path = tmp_path / "t.parquet"
    assert invoke("trace", "generate", "one_touch", path, *SMALL).exit_code == 0
    r = invoke("trace", "inspect", path)
    assert r.exit_code == 0 and "attacker" in r.output
    r = invoke("run", path, "--policy", "lru")
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("args, message", [
    (["run", "no_such_workload"], "unknown workload 'no_such_workload'"),
    (["run", "one_touch", "--policy", "fifo9"], "unknown policy 'fifo9'"),
    (["run", "one_touch", "--profile", "tpu-none"], "unknown profile 'tpu-none'"),
    (["run", "one_touch", "--blocks", "1"], "Invalid value for '--blocks'"),
    (["run", "one_touch", "--block-size", "0"], "Invalid value for '--block-size'"),
    (["run", "one_touch", "--block-size", "1.5"], "'1.5' is not a valid integer"),
    (["run", "one_touch", "--set", "nope=1"], "--set nope: unknown parameter"),
    (["run", "one_touch", "--set", "duration_s=soon"], "--set duration_s: expected a number"),
    (["run", "missing/trace.parquet"], "missing/trace.parquet"),
    (["run", "one_touch", "--blocks", "64", "--c-prefill-basis", "capacity"],
     "cannot measure C_prefill for 'one_touch'"),
    (["run", "one_touch", "--set", "output_dist=zipf"], "output_dist must be one of"),
])
def test_bad_input_is_one_error_line_without_traceback(tmp_path, args, message):
    out = tmp_path / "out"
    r = invoke(*args, "--out", out)
    assert r.exit_code != 0
    assert message in r.output
    assert "Traceback" not in r.output
    assert sum(line.startswith("Error") for line in r.output.splitlines()) == 1
    assert not out.exists()


def test_unreadable_trace_file_names_the_file(tmp_path):
    bad = tmp_path / "bad.parquet"
    bad.write_text("this is not parquet")
    r = invoke("run", bad)
    assert r.exit_code != 0 and str(bad) in r.output and "Traceback" not in r.output


def test_trace_import_then_inspect(tmp_path):
    fixtures = Path(__file__).resolve().parent / "traces" / "fixtures"
    src = sorted(fixtures.glob("*mooncake*.jsonl"))[0]
    out = tmp_path / "mc.parquet"
    r = invoke("trace", "import", "mooncake", src, out, "--groups", "2")
    assert r.exit_code == 0, r.output
    r = invoke("trace", "inspect", out)
    assert r.exit_code == 0 and "group1" in r.output


def test_trace_import_of_a_malformed_file_names_file_and_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [0]}\n'
                   '{"timestamp": 5, "input_length": "many"}\n')
    r = invoke("trace", "import", "mooncake", bad, tmp_path / "o.parquet")
    assert r.exit_code != 0 and "line 2" in r.output and str(bad) in r.output
    assert not (tmp_path / "o.parquet").exists()


def test_compare_prints_paired_differences_and_writes_csv(tmp_path):
    out = tmp_path / "cmp.csv"
    r = invoke("compare", "one_touch", "-p", "lru,prefixshield", "--seeds", "2", *SMALL,
               "--out", out)
    assert r.exit_code == 0, r.output
    assert "differences vs lru" in r.output and "prefixshield" in r.output
    runs = pd.read_csv(out)
    assert sorted(runs["seed"].unique()) == [0, 1] and set(runs["policy"]) == {"lru", "prefixshield"}
    paired = pd.read_csv(f"{out}.paired.csv")
    assert {"hit_ratio_diff", "hit_ratio_ci_low", "hit_ratio_ci_high"} <= set(paired.columns)


def test_policy_spec_with_unknown_parameter_is_one_error_line():
    r = invoke("run", "one_touch", "-p", "prefixshield:nope=1")
    assert r.exit_code != 0 and "has no parameter 'nope'" in r.output
    assert "Traceback" not in r.output


def test_result_files_get_ordinary_permissions(tmp_path):
    import os
    import stat

    out = tmp_path / "out"
    assert invoke("run", "one_touch", *SMALL, "--out", out).exit_code == 0
    umask = os.umask(0)
    os.umask(umask)
    mode = stat.S_IMODE((out / "summary.csv").stat().st_mode)
    assert mode == 0o666 & ~umask


# ------------------------------------------- a pool a policy cannot serve is refused up front
BIG = ["--set", "prefix_tokens=6144", "--set", "base_rate=0.3", "--set", "duration_s=8",
       "--set", "population=two_group"]
"""A 388-block prompt: more than static_quota's 255-block share of two tenants at 512 blocks."""
REFUSED = ("under static_quota, request 0 of group 'victim' needs 386 blocks of prompt and "
           "output but a group may hold at most 255 of 512 (its share: 511 usable blocks over 2 "
           "groups): it could never be admitted; the smallest pool that serves it is 773 blocks")


@pytest.mark.parametrize("command", ["run", "compare"])
def test_a_pool_a_policy_cannot_serve_is_refused_before_any_simulation(tmp_path, command):
    out = tmp_path / "iso"
    extra = ["--out", out] if command == "run" else ["--seeds", "2"]
    r = invoke(command, "one_touch", "-p", "lru,static_quota", *BIG, *extra)
    assert r.exit_code == 1, r.output
    assert REFUSED in " ".join(r.output.split())
    assert "simulating" not in r.output and "seed 0:" not in r.output
    assert not out.exists()


def test_policy_all_leaves_out_a_policy_that_cannot_serve_with_a_line(tmp_path):
    # the default population's 8 groups: static_quota's share (63 blocks) is less than one
    # 98-block victim request, so `all` runs the other policies and says why
    out = tmp_path / "all"
    r = invoke("run", "one_touch", "-p", "all", *SMALL, "--out", out)
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "--policy all: static_quota left out: one_touch: under static_quota, request 0" in text
    assert "(its share: 511 usable blocks over 8 groups)" in text
    assert list(pd.read_csv(out / "summary.csv")["policy"]) == ["lru", "prefixshield", "s3fifo"]
    r = invoke("run", "one_touch", "-p", "lru,static_quota", *SMALL)
    assert r.exit_code == 1 and "left out" not in r.output
    assert "it could never be admitted" in " ".join(r.output.split())


def test_the_smallest_pool_named_serves_the_request():
    r = invoke("run", "one_touch", "-p", "static_quota", *BIG, "--blocks", "773")
    assert r.exit_code == 0, r.output
    r = invoke("run", "one_touch", "-p", "static_quota", *BIG, "--blocks", "772")
    assert r.exit_code == 1 and "smallest pool that serves it is 773 blocks" in r.output


def test_a_narrower_rerun_replaces_the_whole_results_folder(tmp_path):
    out = tmp_path / "r"
    assert invoke("run", "one_touch", "-p", "all", *SMALL, "--out", out).exit_code == 0
    assert (out / "s3fifo").is_dir()
    r = invoke("run", "one_touch", "-p", "lru", *SMALL, "--out", out)
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["lru"]
    assert list(pd.read_csv(out / "summary.csv")["policy"]) == ["lru"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "no staging left"


def test_out_is_checked_before_simulating(tmp_path):
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    r = invoke("run", "one_touch", "-p", "lru", *SMALL, "--out", busy)
    assert r.exit_code == 1 and "not empty and not the results of an earlier run" in r.output
    assert "judged population" not in r.output  # refused before the simulation
    assert (busy / "notes.txt").read_text() == "mine"
    f = tmp_path / "file"
    f.write_text("x")
    r = invoke("run", "one_touch", "-p", "lru", *SMALL, "--out", f / "sub")
    assert r.exit_code != 0 and "not a writable folder" in r.output


def test_run_stream_writes_the_files_and_summary_of_the_unstreamed_run(tmp_path):
    args = ("run", "one_touch", "-p", "lru", "-p", "prefixshield", *SMALL, "--no-plot")
    assert invoke(*args, "--out", tmp_path / "whole").exit_code == 0
    r = invoke(*args, "--stream", "--out", tmp_path / "streamed")
    assert r.exit_code == 0, r.output
    whole, streamed = tmp_path / "whole", tmp_path / "streamed"
    assert (whole / "summary.csv").read_text() == (streamed / "summary.csv").read_text()
    for policy in ("lru", "prefixshield"):
        for name in ("records", "occupancy", "held"):
            pd.testing.assert_frame_equal(read_frame(streamed / policy / f"{name}.parquet"),
                                          read_frame(whole / policy / f"{name}.parquet"))
        for name in ("evictions.csv", "policy_stats.json"):
            assert (streamed / policy / name).read_text() == (whole / policy / name).read_text()
    assert json.loads((streamed / "config.json").read_text())["trace"]["streamed"] is True


def test_trace_generate_stream_writes_the_rows_of_the_unstreamed_trace(tmp_path):
    from prefixshield.traces.io import read_trace

    args = ("trace", "generate", "one_touch")
    long = ("--set", "duration_s=1300", "--set", "base_rate=2")   # three windows of time
    assert invoke(*args, tmp_path / "a.parquet", *long, "--stream").exit_code == 0
    assert invoke(*args, tmp_path / "b.parquet", *long).exit_code == 0
    a, b = read_trace(tmp_path / "a.parquet"), read_trace(tmp_path / "b.parquet")
    assert a.meta["measured_requests"] is None
    a.meta = {**a.meta, "measured_requests": b.meta["measured_requests"]}
    assert a.equals(b)
