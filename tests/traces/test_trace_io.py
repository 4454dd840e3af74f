"""Parquet trace I/O: round trip, atomic writes, and errors that name file, field and row."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prefixshield.workloads import WORKLOADS, generate
from prefixshield.traces.io import ARROW_SCHEMA, read_trace, write_trace
from prefixshield.traces.schema import TRACE_COLUMNS, Trace, TraceError


def _write_table(path, table_dict, metadata=None, schema=None):
    md = {b"prefixshield.seed": b"3", b"prefixshield.vocab_size": b"1000",
          b"prefixshield.meta": b"{}"} if metadata is None else metadata
    table = pa.table(table_dict, schema=schema)
    pq.write_table(table.replace_schema_metadata(md), path)
    return path


def _good_columns(n=3):
    return {
        "request_id": pa.array(range(n), pa.int64()),
        "arrival_s": pa.array([0.5 * i for i in range(n)], pa.float64()),
        "group": pa.array(["g"] * n),
        "contract": pa.array(["standard"] * n),
        "role": pa.array(["benign"] * n),
        "prefix_id": pa.array([0] * n, pa.int64()),
        "measured": pa.array([True] * n),
        "output_tokens": pa.array([4] * n, pa.int64()),
        "segment_ids": pa.array([[1, 2]] * n, pa.list_(pa.int64())),
        "segment_lengths": pa.array([[16, 3]] * n, pa.list_(pa.int64())),
        "output_segment_id": pa.array([-1] * n, pa.int64()),
    }


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_round_trip_preserves_every_cell_seed_vocab_and_meta(tmp_path, name):
    tr = generate(name, seed=5)
    path = write_trace(tr, tmp_path / f"{name}.parquet")
    back = read_trace(path)
    assert back.equals(tr)
    assert back.seed == 5 and back.meta["workload"] == name
    assert list(back.requests.columns) == list(TRACE_COLUMNS)
    assert [str(t) for t in back.requests.dtypes[:8]] == \
        [str(t) for t in tr.requests.dtypes[:8]]


def test_file_stores_schema_metadata(tmp_path):
    tr = generate("one_touch")
    path = write_trace(tr, tmp_path / "t.parquet")
    schema = pq.read_schema(path)
    md = schema.metadata
    assert md[b"prefixshield.seed"] == b"0"
    assert md[b"prefixshield.vocab_size"] == b"1000"
    assert json.loads(md[b"prefixshield.meta"])["hot_blocks"] == 384
    for name in TRACE_COLUMNS:
        assert schema.field(name).type == ARROW_SCHEMA.field(name).type


def test_write_replaces_atomically_and_leaves_no_temp_files(tmp_path):
    path = tmp_path / "t.parquet"
    write_trace(generate("borrowing", seed=1), path)
    write_trace(generate("borrowing", seed=2), path)
    assert read_trace(path).seed == 2
    assert [p.name for p in tmp_path.iterdir()] == ["t.parquet"]


def test_invalid_trace_is_not_written(tmp_path):
    tr = generate("borrowing")
    df = tr.requests.copy()
    df.loc[3, "output_tokens"] = 0
    with pytest.raises(TraceError, match=r"bad\.parquet: row 3: field output_tokens"):
        write_trace(Trace(df, seed=tr.seed), tmp_path / "bad.parquet")
    assert list(tmp_path.iterdir()) == []


def test_unserialisable_meta_is_an_error(tmp_path):
    tr = generate("borrowing")
    tr.meta["oops"] = object()
    with pytest.raises(TraceError, match="not JSON-serialisable"):
        write_trace(tr, tmp_path / "m.parquet")
    assert list(tmp_path.iterdir()) == []


def test_read_missing_file(tmp_path):
    with pytest.raises(TraceError, match=r"nothere\.parquet: no such file"):
        read_trace(tmp_path / "nothere.parquet")


def test_read_non_parquet(tmp_path):
    p = tmp_path / "notes.parquet"
    p.write_text("hello")
    with pytest.raises(TraceError, match=r"notes\.parquet: not a readable Parquet file"):
        read_trace(p)


def test_read_missing_column(tmp_path):
    cols = _good_columns()
    del cols["role"]
    p = _write_table(tmp_path / "nocol.parquet", cols)
    with pytest.raises(TraceError, match=r"nocol\.parquet: missing column\(s\) role"):
        read_trace(p)


def test_read_missing_seed_metadata(tmp_path):
    p = _write_table(tmp_path / "nomd.parquet", _good_columns(), metadata={})
    with pytest.raises(TraceError, match=r"nomd\.parquet: schema metadata lacks "
                                         r"'prefixshield\.seed'"):
        read_trace(p)


def test_read_good_hand_written_table(tmp_path):
    tr = read_trace(_write_table(tmp_path / "ok.parquet", _good_columns()))
    assert len(tr) == 3 and tr.seed == 3
    assert np.array_equal(tr.requests["segment_lengths"][2], [16, 3])
    assert tr.prompt_lengths().tolist() == [19, 19, 19]


def test_read_bad_field_names_row(tmp_path):
    cols = _good_columns(5)
    cols["arrival_s"] = pa.array([0.0, 1.0, 2.0, 1.5, 3.0])
    p = _write_table(tmp_path / "order.parquet", cols)
    with pytest.raises(TraceError, match=r"order\.parquet: row 3: field arrival_s decreases"):
        read_trace(p)
    cols = _good_columns(5)
    cols["segment_lengths"] = pa.array([[16, 3]] * 4 + [[16, 0]], pa.list_(pa.int64()))
    p = _write_table(tmp_path / "len.parquet", cols)
    with pytest.raises(TraceError, match=r"len\.parquet: row 4: field segment_lengths"):
        read_trace(p)


def test_read_null_names_row(tmp_path):
    cols = _good_columns(4)
    cols["prefix_id"] = pa.array([0, 0, None, 0], pa.int64())
    p = _write_table(tmp_path / "null.parquet", cols)
    with pytest.raises(TraceError, match=r"null\.parquet: row 2: field prefix_id is null"):
        read_trace(p)
    cols = _good_columns(4)
    cols["segment_ids"] = pa.array([[1], [1], [1], [1, None]], pa.list_(pa.int64()))
    p = _write_table(tmp_path / "nullel.parquet", cols)
    with pytest.raises(TraceError, match=r"row 3: field segment_ids contains a null element"):
        read_trace(p)


def test_read_wrong_column_type(tmp_path):
    cols = _good_columns()
    cols["prefix_id"] = pa.array(["a", "b", "c"])
    p = _write_table(tmp_path / "type.parquet", cols)
    with pytest.raises(TraceError, match=r"type\.parquet: column prefix_id must be integers"):
        read_trace(p)
