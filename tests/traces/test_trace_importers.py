"""Importers on the public traces (or their committed cuts) and on malformed files."""

from __future__ import annotations

import csv
import io
import json
import math

import numpy as np
import pandas as pd
import pytest

from _trace_helpers import FIXTURES, data_file, rows, write_text
from prefixshield.traces import derive_sharegpt
from prefixshield.traces.conversations import sharegpt_turns
from prefixshield.traces.importers import (
    AzureImport, MooncakeImport, ShareGPTImport, estimate_tokens, import_azure, import_mooncake,
    import_sharegpt, parse_sharegpt)
from prefixshield.traces.schema import TraceError
from prefixshield.traces.segments import LOCAL_BITS, NUM_KINDS, SegmentKind

# ---- Mooncake -------------------------------------------------------------------------------


def _mooncake_records(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_mooncake_maps_hash_ids_to_512_token_segments():
    path = data_file("mooncake")
    recs = _mooncake_records(path)
    tr = import_mooncake(path)
    df = tr.requests
    assert len(df) == len(recs)
    t0 = min(r["timestamp"] for r in recs)
    assert np.allclose(df["arrival_s"], [(r["timestamp"] - t0) / 1000 for r in recs])
    for r, ids, lens, out, pid in zip(recs, df["segment_ids"], df["segment_lengths"],
                                      df["output_tokens"], df["prefix_id"]):
        assert ids.tolist() == r["hash_ids"]
        assert lens[:-1].tolist() == [512] * (len(ids) - 1)
        assert 1 <= lens[-1] <= 512
        assert int(lens.sum()) == r["input_length"]
        assert out == r["output_length"] and pid == r["hash_ids"][0]
    assert set(df["group"]) == {"default"} and df["measured"].all()
    assert tr.meta["importer"] == "mooncake" and not tr.meta["resorted"]


def test_mooncake_shared_hash_ids_share_segments():
    tr = import_mooncake(data_file("mooncake"))
    seen: dict[int, int] = {}
    shared = 0
    for ids in tr.requests["segment_ids"]:
        for s in ids:
            shared += s in seen
            seen[int(s)] = seen.get(int(s), 0) + 1
    assert shared > 0  # the trace reuses prefixes


def test_mooncake_groups_round_robin_and_by_prefix():
    path = data_file("mooncake")
    rr = import_mooncake(path, groups=["a", "b", "c"])
    assert list(rr.requests["group"][:6]) == ["a", "b", "c", "a", "b", "c"]
    byp = import_mooncake(path, groups=["a", "b"], assign="prefix", limit=30)
    for pid, sub in byp.requests.groupby("prefix_id"):
        assert sub["group"].nunique() == 1
        assert sub["group"].iloc[0] == ["a", "b"][pid % 2]
    assert len(byp) == 30


def test_mooncake_sorts_out_of_order_timestamps_stably(tmp_path):
    p = write_text(tmp_path / "m.jsonl",
                   '{"timestamp": 2000, "input_length": 10, "output_length": 1, "hash_ids": [5]}\n'
                   '\n'
                   '{"timestamp": 1000, "input_length": 600, "output_length": 2,'
                   ' "hash_ids": [5, 6]}\n')
    tr = import_mooncake(p)
    assert tr.requests["arrival_s"].tolist() == [0.0, 1.0]
    assert tr.requests["segment_lengths"][0].tolist() == [512, 88]
    assert tr.meta["resorted"]


BAD_MOONCAKE = [
    ('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]\n',
     r"line 3: not valid JSON"),
    ('{"timestamp": 0, "input_length": 10, "hash_ids": [1]}\n',
     r"line 3: field output_length: missing"),
    ('{"timestamp": -5, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n',
     r"line 3: field timestamp: expected a number >= 0"),
    ('{"timestamp": 0, "input_length": "10", "output_length": 1, "hash_ids": [1]}\n',
     r"line 3: field input_length: expected an integer >= 1, got '10'"),
    ('{"timestamp": 0, "input_length": 10, "output_length": true, "hash_ids": [1]}\n',
     r"line 3: field output_length: expected an integer >= 1, got True"),
    ('{"timestamp": 0, "input_length": 10, "output_length": 0, "hash_ids": [1]}\n',
     r"line 3: field output_length: expected an integer >= 1, got 0"),
    ('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": []}\n',
     r"line 3: field hash_ids: expected a non-empty list"),
    ('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1, -2]}\n',
     r"line 3: field hash_ids\[1\]: expected an integer in \[0, 2\*\*40\)"),
    ('{"timestamp": 0, "input_length": 1100, "output_length": 1, "hash_ids": [1, 2]}\n',
     r"line 3: field input_length: 1100 tokens does not match 2 hash_ids of 512 tokens "
     r"\(expected 513\.\.1024\)"),
    ('[1, 2]\n', r"line 3: record must be a JSON object"),
]


@pytest.mark.parametrize("bad_line,message", BAD_MOONCAKE)
def test_mooncake_malformed_record_names_file_line_and_field(tmp_path, bad_line, message):
    good = '{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n'
    p = write_text(tmp_path / "bad.jsonl", good + "\n" + bad_line + good)
    with pytest.raises(TraceError, match=r"bad\.jsonl: " + message):
        import_mooncake(p)


@pytest.mark.parametrize("fn,kind", [(import_mooncake, "mooncake"), (import_azure, "azure"),
                                     (import_sharegpt, "sharegpt")])
def test_num_groups_names_groups_round_robin(fn, kind):
    tr = fn(data_file(kind), num_groups=3, limit=12)
    assert sorted(tr.requests["group"].unique()) == ["group0", "group1", "group2"]
    assert set(fn(data_file(kind), limit=3).requests["group"]) == {"default"}
    with pytest.raises(ValueError, match="contradicts"):
        fn(data_file(kind), groups=["a"], num_groups=2)


def test_importers_report_missing_file(tmp_path):
    for fn in (import_mooncake, import_azure, import_sharegpt):
        with pytest.raises(TraceError, match=r"absent\.x: no such file"):
            fn(tmp_path / "absent.x")


# ---- Azure ----------------------------------------------------------------------------------

def _azure_rows(path):
    with open(path, newline="", encoding="utf-8-sig") as f:
        return list(csv.DictReader(f))


def test_azure_arrivals_relative_to_first_and_unique_prompts():
    path = data_file("azure")
    recs = _azure_rows(path)
    tr = import_azure(path)
    df = tr.requests
    assert len(df) == len(recs)
    stamps = pd.to_datetime([r["TIMESTAMP"] for r in recs], format="ISO8601")
    expect = ((stamps - stamps.min()).total_seconds()).to_numpy()
    assert np.allclose(df["arrival_s"], np.sort(expect))
    assert df["arrival_s"].iloc[0] == 0.0
    order = np.argsort(expect, kind="stable")
    assert tr.prompt_lengths().tolist() == [int(recs[i]["ContextTokens"]) for i in order]
    assert df["output_tokens"].tolist() == [int(recs[i]["GeneratedTokens"]) for i in order]
    firsts = [int(ids[0]) for ids in df["segment_ids"]]
    assert len(set(firsts)) == len(df) and all(len(ids) == 1 for ids in df["segment_ids"])


def test_azure_shared_system_prefix_within_group():
    path = data_file("azure")
    tr = import_azure(path, shape=AzureImport(system_prompt_tokens=64), groups=["x", "y"],
                      limit=40)
    df = tr.requests
    assert len(df) == 40
    for g, sub in df.groupby("group", observed=True):
        heads = {int(ids[0]) for ids in sub["segment_ids"]}
        assert len(heads) == 1
        kind = (heads.pop() >> LOCAL_BITS) % NUM_KINDS
        assert kind == SegmentKind.SYSTEM
        for ids, lens in zip(sub["segment_ids"], sub["segment_lengths"]):
            assert lens[0] == min(64, int(lens.sum()))
    assert (df["prefix_id"] == 0).all()
    recs = _azure_rows(path)[:40]
    assert sorted(tr.prompt_lengths().tolist()) == sorted(int(r["ContextTokens"]) for r in recs)
    # round robin in file order
    assert list(rows(tr, group="x")["request_id"]) != list(rows(tr, group="y")["request_id"])
    assert abs(len(rows(tr, group="x")) - len(rows(tr, group="y"))) <= 1


AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
AZURE_GOOD = "2023-11-16 18:15:46.6805900,374,44\n"
BAD_AZURE = [
    ("2023-11-16 18:15:47,abc,44\n", r"line 3: field ContextTokens: expected an integer >= 1, "
                                     r"got 'abc'"),
    ("2023-11-16 18:15:47,12.5,44\n", r"line 3: field ContextTokens"),
    ("2023-11-16 18:15:47,12,0\n", r"line 3: field GeneratedTokens: expected an integer >= 1"),
    ("yesterday,12,3\n", r"line 3: field TIMESTAMP: expected a date-time"),
    ("2023-11-16 18:15:47,12\n", r"line 3: expected 3 fields, got 2"),
]


@pytest.mark.parametrize("bad_line,message", BAD_AZURE)
def test_azure_malformed_row_names_file_line_and_field(tmp_path, bad_line, message):
    p = write_text(tmp_path / "bad.csv", AZURE_HEADER + AZURE_GOOD + bad_line + AZURE_GOOD)
    with pytest.raises(TraceError, match=r"bad\.csv: " + message):
        import_azure(p)


def test_azure_missing_column(tmp_path):
    p = write_text(tmp_path / "hdr.csv", "TIMESTAMP,ContextTokens\n2023-11-16 18:15:46,3\n")
    with pytest.raises(TraceError, match=r"hdr\.csv: line 1: field GeneratedTokens: missing"):
        import_azure(p)


@pytest.mark.parametrize("cls,field,value", [(MooncakeImport, "block_tokens", 0),
                                             (MooncakeImport, "block_tokens", 512.5),
                                             (MooncakeImport, "time_scale", 0.0),
                                             (MooncakeImport, "time_scale", math.inf),
                                             (AzureImport, "system_prompt_tokens", -1),
                                             (AzureImport, "time_scale", -1.0),
                                             (AzureImport, "time_scale", math.nan)])
def test_mooncake_and_azure_import_knobs_are_refused_when_built(cls, field, value):
    with pytest.raises(ValueError, match=field):
        cls(**{field: value})


# ---- ShareGPT -------------------------------------------------------------------------------

@pytest.mark.parametrize("field,value", [("base_rate", 0.0), ("think_time_s", -1.0),
                                         ("min_think_time_s", math.nan),
                                         ("system_prompt_tokens", -1),
                                         ("max_conversation_tokens", 0),
                                         ("chars_per_token", 0.0)])
def test_sharegpt_import_knobs_are_refused_when_built(field, value):
    with pytest.raises(ValueError, match=field):
        ShareGPTImport(**{field: value})


def test_sharegpt_import_builds_multi_turn_requests():
    path = data_file("sharegpt")
    turns, stats = parse_sharegpt(path)
    tr = import_sharegpt(path, groups=["a", "b"], shape=ShareGPTImport(system_prompt_tokens=32))
    df = tr.requests
    assert len(df) == len(turns) == stats["turns"]
    assert df["prefix_id"].nunique() == stats["conversations"]
    for pid, conv in df.groupby("prefix_id"):
        conv = conv.reset_index(drop=True)
        expect = turns[turns["conversation"] == pid]
        assert conv["output_tokens"].tolist() == expect["assistant_tokens"].tolist()
        assert conv["group"].iloc[0] == ["a", "b"][pid % 2]
        for k in range(len(conv)):
            ids, lens = conv["segment_ids"][k], conv["segment_lengths"][k]
            assert lens[0] == 32 and len(ids) == 2 + 2 * k
            assert lens[-1] == expect["user_tokens"].iloc[k]
            if k:
                prev = conv["segment_ids"][k - 1]
                assert np.array_equal(ids[:len(prev)], prev)
                assert ids[len(prev)] == conv["output_segment_id"][k - 1]


def test_sharegpt_parse_joins_chunks_and_estimates_chars_over_4():
    turns, stats = parse_sharegpt(FIXTURES / "sharegpt_first6.json")
    # records: QWJhYvA_0, i6IyJda_0, A5AbcES_0, hRPPgZT_0, hRPPgZT_11, hRPPgZT_17
    assert stats["records"] == 6 and stats["conversations"] == 4
    assert turns.groupby("source_id", sort=False).size().to_dict() == {
        "QWJhYvA": 6, "i6IyJda": 1, "A5AbcES": 1, "hRPPgZT": 6 + 3 + 2}
    rec = json.loads((FIXTURES / "sharegpt_first6.json").read_text())[1]
    msgs = rec["conversations"]
    row = turns[turns["source_id"] == "i6IyJda"].iloc[0]
    assert row["user_tokens"] == math.ceil(len(msgs[0]["value"]) / 4)
    assert row["assistant_tokens"] == math.ceil(len(msgs[1]["value"]) / 4)
    assert estimate_tokens("") == 1 and estimate_tokens("abcde") == 2


def test_sharegpt_parse_turn_rules(tmp_path):
    recs = [
        {"id": "c_0", "conversations": [{"from": "system", "value": "x" * 8},
                                        {"from": "human", "value": "y" * 4},
                                        {"from": "gpt", "value": "z" * 40}]},
        {"id": "c_3", "conversations": [{"from": "gpt", "value": "z" * 4},
                                        {"from": "human", "value": "q" * 12}]},
        {"id": "d_0", "conversations": [{"from": "gpt", "value": "w" * 4},
                                        {"from": "human", "value": "u" * 4},
                                        {"from": "gpt", "value": "v" * 4}]},
        {"id": "e_0", "conversations": []},
    ]
    p = write_text(tmp_path / "s.json", json.dumps(recs))
    turns, stats = parse_sharegpt(p)
    got = turns[["source_id", "user_tokens", "assistant_tokens"]].values.tolist()
    # c: system+human merge (2+1), gpt 10 + continuation gpt 1 merge; trailing human dropped
    # d: leading gpt folds into the first user prompt
    assert got == [["c", 3, 11], ["d", 2, 1]]
    assert stats == {"records": 4, "conversations": 2, "turns": 2, "empty_conversations": 1,
                     "trailing_user_messages": 1}


BAD_SHAREGPT = [
    ('{"id": "a_0", "conversations": [{"from": "robot", "value": "hi"}]}',
     r"line 3 column 1: record 1 \(id 'a_0'\): field conversations\[0\]\.from: expected one of"),
    ('{"id": "a_0", "conversations": [{"from": "gpt", "value": 5}]}',
     r"line 3 column 1: record 1 \(id 'a_0'\): field conversations\[0\]\.value: expected a "
     r"string"),
    ('{"id": "a_0"}', r"line 3 column 1: record 1 \(id 'a_0'\): field conversations: expected "
                      r"a list"),
    ('{"id": 7, "conversations": []}', r"line 3 column 1: record 1: field id: expected a string"),
    ('"text"', r"line 3 column 1: record 1: expected an object"),
    ('{"id": "a_0", "conversations": [}', r"line 3 column 33: record 1: not valid JSON"),
]


@pytest.mark.parametrize("bad_record,message", BAD_SHAREGPT)
def test_sharegpt_malformed_record_names_file_line_and_field(tmp_path, bad_record, message):
    good = '{"id": "g_0", "conversations": [{"from": "human", "value": "hi"}, ' \
           '{"from": "gpt", "value": "hello"}]}'
    text = "[\n" + good + ",\n" + bad_record + ",\n" + good + "\n]\n"
    p = write_text(tmp_path / "bad.json", text)
    with pytest.raises(TraceError, match=r"bad\.json: " + message):
        import_sharegpt(p)


def test_sharegpt_not_an_array(tmp_path):
    p = write_text(tmp_path / "obj.json", '{"id": "a"}')
    with pytest.raises(TraceError, match=r"obj\.json: line 1 column 1: expected a JSON array"):
        parse_sharegpt(p)


# ---- the packaged turn table ----------------------------------------------------------------

def test_packaged_turn_table_matches_its_derivation():
    source = data_file("sharegpt")
    table, _ = derive_sharegpt.derive(source)
    packaged = pd.read_csv(derive_sharegpt.DEFAULT_OUT)
    if source == derive_sharegpt.DEFAULT_SOURCE:  # full source: byte-identical file
        assert derive_sharegpt.to_bytes(table) == derive_sharegpt.DEFAULT_OUT.read_bytes()
    # the fixture's conversations are the packaged file's first ones
    n = table["conversation"].nunique()
    head = packaged[packaged["conversation"] < n].reset_index(drop=True)
    pd.testing.assert_frame_equal(head, table.reset_index(drop=True), check_dtype=False)
    convs = sharegpt_turns()
    assert [len(u) for u, _ in convs[:n]] == table.groupby("conversation").size().tolist()


def test_packaged_output_length_histogram_matches_its_derivation():
    from prefixshield.traces import derive_outputs

    source = data_file("azure")
    derived = pd.read_csv(io.StringIO(derive_outputs.derive(source)))
    packaged = pd.read_csv(derive_outputs.DEFAULT_OUT)
    if source == derive_outputs.DEFAULT_SOURCE:  # the whole trace: byte-identical file
        assert derive_outputs.derive(source) == derive_outputs.DEFAULT_OUT.read_text()
        assert packaged["count"].sum() == 19366
    # the fixture's rows are the trace's first ones: each length counted at most as often
    merged = derived.merge(packaged, on="generated_tokens", suffixes=("_cut", "_all"))
    assert len(merged) == len(derived)
    assert (merged["count_cut"] <= merged["count_all"]).all()
