"""Importer options on the command line, gzip and BOM inputs, and fitting a trace to a pool."""

import gzip
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from prefixshield.cli import main
from prefixshield.traces import importers
from prefixshield.traces.io import read_trace
from prefixshield.traces.schema import TraceError
from prefixshield.traces.transform import limit_request_tokens

FIXTURES = Path(__file__).resolve().parent / "fixtures"
"""Leading cuts of the public traces in ../shared/data, with their licences (see README.md)."""
MOONCAKE = FIXTURES / "mooncake_synthetic_head1000.jsonl"
AZURE = FIXTURES / "azure_conv_head4000.csv"


def head(path: Path, n: int) -> bytes:
    with open(path, "rb") as f:
        return b"".join(f.readline() for _ in range(n))


def test_gzip_and_bom_inputs_import_like_plain_text(tmp_path):
    plain = tmp_path / "m.jsonl"
    plain.write_bytes(head(MOONCAKE, 40))
    gz = tmp_path / "m.data"  # compressed, whatever the name says
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    a, b, c = (importers.import_mooncake(p) for p in (plain, gz, bom))
    assert a.requests.drop(columns=[]).equals(b.requests) and a.requests.equals(c.requests)
    az = tmp_path / "a.csv.gz"
    az.write_bytes(gzip.compress(head(AZURE, 30)))
    assert len(importers.import_azure(az)) == 29


def test_undecodable_and_corrupt_inputs_name_the_file(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"timestamp": 0}\n\xff\xfe\n')
    with pytest.raises(TraceError, match=r"bad.jsonl: not UTF-8 text"):
        importers.import_mooncake(bad)
    broken = tmp_path / "broken.jsonl.gz"
    broken.write_bytes(gzip.compress(head(MOONCAKE, 20))[:200])
    with pytest.raises(TraceError, match=r"broken.jsonl.gz"):
        importers.import_mooncake(broken)


def test_import_cli_passes_every_option(tmp_path):
    out = tmp_path / "o.parquet"
    r = CliRunner().invoke(main, ["trace", "import", "mooncake", str(MOONCAKE), str(out),
                                  "--groups", "3", "--assign", "prefix", "--limit", "300",
                                  "--time-scale", "2", "--warmup-s", "5",
                                  "--max-prompt-tokens", "8192", "--over", "drop"],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    tr = read_trace(out)
    meta = tr.meta
    assert meta["assign"] == "prefix" and meta["time_scale"] == 2.0 and meta["limit"][
        "max_prompt_tokens"] == 8192
    assert len(tr) == 300 - meta["limit"]["requests_affected"]
    assert tr.prompt_lengths().max() <= 8192
    # the tenant model dealt the 300 records read; the drop came after, and the line says so
    n = meta["limit"]["requests_affected"]
    dealt = [line for line in r.output.splitlines() if line.startswith("tenants:")]
    assert n > 0 and dealt and dealt[-1].endswith(
        f"; counted before the {n:,} prompts over 8,192 tokens were dropped, so the trace "
        "may hold fewer"), r.output
    df = tr.requests
    assert (df["group"] == [f"group{p % 3}" for p in df["prefix_id"]]).all()
    assert not df.loc[df["arrival_s"] < 5, "measured"].any()
    r = CliRunner().invoke(main, ["trace", "import", "azure", str(AZURE), str(out),
                                  "--limit", "50", "--system-prompt-tokens", "256"],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert read_trace(out).meta["system_prompt_tokens"] == 256
    r = CliRunner().invoke(main, ["trace", "import", "azure", str(AZURE), str(out),
                                  "--limit", "200", "--rate", "3"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    arr = read_trace(out).requests["arrival_s"].to_numpy()
    assert (len(arr) - 1) / (arr.max() - arr.min()) == pytest.approx(3.0)
    for args, words in ((["sharegpt", "--time-scale", "2"], "no timestamps"),
                        (["azure", "--assign", "prefix"], "no sessions or prefixes"),
                        (["mooncake", "--system-prompt-tokens", "5"], "own prefixes")):
        src = {"azure": AZURE, "mooncake": MOONCAKE}.get(args[0], MOONCAKE)
        r = CliRunner().invoke(main, ["trace", "import", args[0], str(src), str(out), *args[1:]])
        assert r.exit_code != 0 and words in r.output, r.output


def test_clipping_keeps_each_prompt_head_and_shared_prefixes(tmp_path):
    tr = importers.import_mooncake(MOONCAKE, limit=400)
    lengths = tr.prompt_lengths()
    cap = int(np.percentile(lengths, 75))
    clipped = limit_request_tokens(tr, cap, "clip")
    new = clipped.prompt_lengths()
    assert (new == np.minimum(lengths, cap)).all()
    for (a_ids, a_lens), (b_ids, b_lens) in zip(
            zip(tr.requests["segment_ids"], tr.requests["segment_lengths"]),
            zip(clipped.requests["segment_ids"], clipped.requests["segment_lengths"])):
        k = len(b_ids)
        assert list(a_ids[:k]) == list(b_ids)          # the head is the same segments,
        assert list(a_lens[:k - 1]) == list(b_lens[:-1])  # whole but for the last one
    dropped = limit_request_tokens(tr, cap, "drop")
    assert len(dropped) == int((lengths <= cap).sum())
    assert dropped.meta["limit"]["requests_affected"] == int((lengths > cap).sum())
    with pytest.raises(ValueError, match="mode"):
        limit_request_tokens(tr, cap, "trim")


# ------------------------------------------------------------------------------ tenant models
def _infinite_cache_cached(trace):
    from prefixshield.experiments.single import RunSpec, run_policies
    from prefixshield.simulator.config import EngineConfig
    from prefixshield.simulator.costmodel import load_profile

    total = int(trace.prompt_lengths().sum() + trace.requests["output_tokens"].sum())
    spec = RunSpec(workload="t", policies=("lru",), profile=load_profile("l4-qwen2.5-1.5b"),
                   engine=EngineConfig(num_blocks=total // 16 + len(trace) + 2))
    rec = run_policies(trace, spec)["lru"].records.sort_values("request_id")
    return rec["cached_tokens"].to_numpy()


def test_session_tenants_keep_shared_prefixes_together_and_round_robin_splits_them():
    stretched = importers.MooncakeImport(time_scale=1000.0)
    one = importers.import_mooncake(MOONCAKE, limit=400, shape=stretched)
    session = importers.import_mooncake(MOONCAKE, limit=400, shape=stretched, num_groups=4,
                                        assign="session")
    robin = importers.import_mooncake(MOONCAKE, limit=400, shape=stretched, num_groups=4)
    base = _infinite_cache_cached(one)
    assert np.array_equal(_infinite_cache_cached(session), base)
    assert _infinite_cache_cached(robin).sum() < base.sum()
    roots = session.requests.groupby("prefix_id")["group"].nunique()
    assert (roots == 1).all() and session.requests["group"].nunique() == 4


def test_zipf_tenants_come_out_heterogeneous():
    tr = importers.import_azure(AZURE, limit=4000, num_groups=4, assign="zipf")
    share = tr.requests["group"].value_counts(normalize=True).reindex(
        [f"group{i}" for i in range(4)])
    assert share.is_monotonic_decreasing and share.iloc[0] > 2.5 * share.iloc[3]
    conv = importers.import_sharegpt(FIXTURES / "sharegpt_first60.json", num_groups=3,
                                     assign="zipf", tenant_skew=2.0)
    per_conv = conv.requests.groupby("prefix_id")["group"].nunique()
    assert (per_conv == 1).all()  # a conversation stays in one tenant
    counts = conv.requests.groupby("group")["prefix_id"].nunique()
    assert counts["group0"] > 2 * counts["group2"]
    # servegen: the shares of real clients (the first one sends most)
    from prefixshield.workloads.servegen import ServeGenParams

    sg = importers.import_azure(AZURE, limit=4000, num_groups=4, assign="servegen")
    got = sg.requests["group"].value_counts(normalize=True).reindex(
        [f"group{i}" for i in range(4)]).to_numpy()
    assert np.allclose(got, ServeGenParams(num_tenants=4)._shares(), atol=0.03)


def test_a_tenant_map_names_groups_and_contracts(tmp_path):
    m = tmp_path / "map.csv"
    m.write_text("record,group,contract\n" + "".join(
        f"{i},{'gold' if i % 5 == 0 else 'bronze'},{'critical' if i % 5 == 0 else 'best_effort'}\n"
        for i in range(60)))
    tr = importers.import_azure(AZURE, limit=60, assign="map", tenant_map=m)
    assert tr.group_names() == ["gold", "bronze"]
    df = tr.requests
    assert set(zip(df["group"], df["contract"])) == {("gold", "critical"),
                                                     ("bronze", "best_effort")}
    bad = tmp_path / "bad.csv"
    bad.write_text("record,group\n0,a\n0,b\n")
    with pytest.raises(TraceError, match=r"bad.csv: line 3: field record: record 0 is mapped "
                                         "twice"):
        importers.import_azure(AZURE, limit=2, assign="map", tenant_map=bad)
    short = tmp_path / "short.csv"
    short.write_text("record,group\n0,a\n")
    with pytest.raises(TraceError, match="record 1 is not mapped"):
        importers.import_azure(AZURE, limit=2, assign="map", tenant_map=short)


@pytest.mark.parametrize("fmt, src, assign", [
    ("mooncake", MOONCAKE, "round_robin"), ("mooncake", MOONCAKE, "session"),
    ("mooncake", MOONCAKE, "prefix"), ("mooncake", MOONCAKE, "zipf"),
    ("azure", AZURE, "round_robin"), ("azure", AZURE, "zipf"), ("azure", AZURE, "servegen"),
])
def test_shipped_samples_import_with_each_tenant_model_and_run_under_every_policy(
        tmp_path, fmt, src, assign):
    out = tmp_path / "t.parquet"
    args = ["trace", "import", fmt, str(src), str(out), "--groups", "4", "--assign", assign,
            "--limit", "150", "--max-prompt-tokens", "30000"]
    if fmt == "azure":
        args += ["--system-prompt-tokens", "256"]
    r = CliRunner().invoke(main, args, catch_exceptions=False)
    assert r.exit_code == 0, r.output
    # auto: a pool static_quota's share can serve too (4096 blocks is refused up front where a
    # 30,000-token prompt exceeds a quarter of it)
    r = CliRunner().invoke(main, ["run", str(out), "-p", "all", "--blocks", "auto",
                                  "--out", str(tmp_path / "res")], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    import pandas as pd

    summary = pd.read_csv(tmp_path / "res" / "summary.csv")
    assert sorted(summary["policy"]) == ["lru", "prefixshield", "s3fifo", "static_quota"]
    ok = summary[summary["status"] == "ok"]
    assert set(ok["policy"]) == {"lru", "prefixshield", "s3fifo", "static_quota"}
    assert np.isfinite(ok["token_hit_ratio"]).all()


def test_scale_to_engine_sets_the_rate_and_keeps_the_pattern(tmp_path):
    from prefixshield.experiments.single import RunSpec, build_trace
    from prefixshield.simulator.config import EngineConfig
    from prefixshield.simulator.costmodel import load_profile
    from prefixshield.traces.io import write_trace

    src = importers.import_azure(AZURE, limit=300)
    path = tmp_path / "a.parquet"
    write_trace(src, path)
    spec = RunSpec(workload=str(path), policies=("lru",), engine=EngineConfig(num_blocks=1024),
                   profile=load_profile("l4-qwen2.5-1.5b"), scale_to_load=0.5)
    scaled, info = build_trace(spec)
    arr = scaled.requests["arrival_s"].to_numpy()
    rate = (len(arr) - 1) / (arr.max() - arr.min())
    assert rate == pytest.approx(0.5 * info["c_prefill_req_per_s"])
    orig = src.requests["arrival_s"].to_numpy()
    assert np.allclose(arr, (orig - orig.min()) * info["time_factor"])
    assert (scaled.requests["request_id"] == src.requests["request_id"]).all()
    r = CliRunner().invoke(main, ["run", "one_touch", "--scale-to-engine", "0.5"])
    assert r.exit_code != 0 and "for trace files" in r.output
