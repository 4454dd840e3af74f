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

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
MOONCAKE = DATA / "mooncake" / "synthetic_trace.jsonl"
AZURE = DATA / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv"


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
    df = tr.requests
    assert (df["group"] == [f"group{p % 3}" for p in df["prefix_id"]]).all()
    assert not df.loc[df["arrival_s"] < 5, "measured"].any()
    r = CliRunner().invoke(main, ["trace", "import", "azure", str(AZURE), str(out),
                                  "--limit", "50", "--system-prompt-tokens", "256"],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert read_trace(out).meta["system_prompt_tokens"] == 256
    for args, words in ((["sharegpt", "--time-scale", "2"], "no timestamps"),
                        (["azure", "--assign", "prefix"], "no prefix roots"),
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
