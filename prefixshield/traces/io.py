"""Parquet I/O for traces.

A trace file is one Parquet table holding ``TRACE_COLUMNS`` (plus any extra columns the trace
carries) with the trace-level fields in the Arrow schema metadata:

=============================  ===================================================
key                            value
=============================  ===================================================
``prefixshield.format``        ``"trace/1"``
``prefixshield.seed``          token seed, decimal integer
``prefixshield.vocab_size``    decimal integer
``prefixshield.meta``          JSON object (generator or importer and parameters)
=============================  ===================================================

Writes are atomic (temp file in the target folder, then ``os.replace``): a crash never leaves a
half-written trace under the final name. Reads validate everything and raise
[`TraceError`][prefixshield.traces.schema.TraceError] naming the file and what is wrong.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from prefixshield.atomic import atomic_path
from prefixshield.traces.schema import TRACE_COLUMNS, Trace, TraceError, build_requests
from prefixshield.traces.stream import TraceStream

FORMAT = "trace/1"
_KEY_FORMAT = b"prefixshield.format"
_KEY_SEED = b"prefixshield.seed"
_KEY_VOCAB = b"prefixshield.vocab_size"
_KEY_META = b"prefixshield.meta"

_ARROW_TYPES: dict[str, pa.DataType] = {
    "int64": pa.int64(),
    "float64": pa.float64(),
    "string": pa.string(),
    "bool": pa.bool_(),
    "list<int64>": pa.list_(pa.int64()),
}

ARROW_SCHEMA = pa.schema([(name, _ARROW_TYPES[t]) for name, t in TRACE_COLUMNS.items()])
"""Arrow schema of the ``TRACE_COLUMNS`` part of a trace file (without metadata)."""


def _json_default(x: Any) -> Any:
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, (set, frozenset)):
        return sorted(x)
    raise TypeError(f"object of type {type(x).__name__} is not JSON serialisable")


def _list_array(values) -> pa.Array:
    lengths = np.fromiter((len(v) for v in values), dtype=np.int64, count=len(values))
    offsets = np.zeros(len(values) + 1, dtype=np.int32 if lengths.sum() < 2**31 else np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = (np.concatenate([np.asarray(v, dtype=np.int64) for v in values])
            if len(values) else np.empty(0, dtype=np.int64))
    arr_type = pa.ListArray if offsets.dtype == np.int32 else pa.LargeListArray
    arr = arr_type.from_arrays(pa.array(offsets), pa.array(flat, type=pa.int64()))
    return arr.cast(_ARROW_TYPES["list<int64>"]) if arr_type is pa.LargeListArray else arr


def write_trace(trace: Trace, path: str | os.PathLike) -> Path:
    """Validate ``trace`` and write it to ``path`` as Parquet, atomically.

    Args:
        trace: the trace; its ``meta`` must be JSON-serialisable (numpy scalars are converted).
        path: target file; its folder must exist. An existing file is replaced.

    Returns:
        The path written.

    Raises:
        TraceError: the trace is invalid or its meta is not JSON-serialisable.
    """
    path = Path(path)
    trace.validate(str(path))
    table = _arrow_table(trace, _file_metadata(trace.seed, trace.vocab_size, trace.meta, path))
    # atomic_path gives the file ordinary permissions (mkstemp alone makes it 0600)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)
    return path


def _file_metadata(seed: int, vocab_size: int, meta: dict, path: Path) -> dict[bytes, bytes]:
    """The schema metadata of a trace file (the table in the module docstring)."""
    try:
        meta_json = json.dumps(meta, sort_keys=True, default=_json_default)
    except (TypeError, ValueError) as e:
        raise TraceError(f"{path}: trace meta is not JSON-serialisable ({e})") from None
    return {
        _KEY_FORMAT: FORMAT.encode(),
        _KEY_SEED: str(int(seed)).encode(),
        _KEY_VOCAB: str(int(vocab_size)).encode(),
        _KEY_META: meta_json.encode(),
    }


def _arrow_table(trace: Trace, metadata: dict[bytes, bytes]) -> pa.Table:
    """The trace's rows as an Arrow table of the file's types, with ``metadata``."""
    df = trace.requests
    arrays, fields = [], []
    for name in df.columns:
        t = TRACE_COLUMNS.get(name)
        if t == "list<int64>":
            arr = _list_array(list(df[name]))
        elif t == "string":
            arr = pa.array(df[name].astype(str).tolist(), type=pa.string())
        elif t is not None:
            arr = pa.array(df[name].to_numpy(dtype=t), type=_ARROW_TYPES[t])
        else:
            arr = pa.array(df[name])
        arrays.append(arr)
        fields.append(pa.field(name, arr.type))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields, metadata=metadata))


def write_trace_stream(stream: TraceStream, path: str | os.PathLike) -> tuple[Path, int]:
    """Write a `TraceStream` to ``path`` as one trace file,
    a chunk (row group) at a time, atomically: the file `write_trace` writes for the
    same rows and meta, with one chunk in memory whatever the trace's length.

    Returns:
        The path written and the number of rows.

    Raises:
        TraceError: a chunk is invalid (naming its row) or the meta is not JSON-serialisable.
    """
    path = Path(path)
    metadata = _file_metadata(stream.seed, stream.vocab_size, stream.meta, path)
    rows = 0
    with atomic_path(path) as tmp:
        writer = None
        try:
            for _base, chunk in stream.rows():
                table = _arrow_table(chunk, metadata)
                if writer is None:
                    writer = pq.ParquetWriter(tmp, table.schema)
                writer.write_table(table)
                rows += len(chunk)
        finally:
            if writer is not None:
                writer.close()
        if writer is None:
            raise TraceError(f"{path}: the trace has no requests; nothing to write")
    return path, rows


def _metadata_int(md: dict, key: bytes, src: str) -> int:
    if key not in md:
        raise TraceError(f"{src}: schema metadata lacks {key.decode()!r}; not a prefixshield trace "
                         f"(write traces with prefixshield.traces.io.write_trace)")
    raw = md[key].decode(errors="replace")
    try:
        return int(raw)
    except ValueError:
        raise TraceError(f"{src}: schema metadata {key.decode()!r} must be an integer, "
                         f"got {raw!r}") from None


def _check_column(table: pa.Table, name: str, src: str) -> Any:
    """Column ``name`` converted to the schema type, as numpy / list-of-arrays."""
    want = TRACE_COLUMNS[name]
    col = table.column(name)
    have = col.type
    if col.null_count:
        row = int(np.flatnonzero(pc.is_null(col).to_numpy(zero_copy_only=False))[0])
        raise TraceError(f"{src}: row {row}: field {name} is null")
    if want == "list<int64>":
        if not (pa.types.is_list(have) or pa.types.is_large_list(have)) or \
                not pa.types.is_integer(have.value_type):
            raise TraceError(f"{src}: column {name} must be a list of integers, got {have}")
        col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
        offs = col.offsets.to_numpy()
        flat = col.values.slice(int(offs[0]), int(offs[-1] - offs[0]))
        offs = offs - offs[0]
        if flat.null_count:
            bad = np.flatnonzero(pc.is_null(flat).to_numpy(zero_copy_only=False))[0]
            row = int(np.searchsorted(offs, bad, side="right") - 1)
            raise TraceError(f"{src}: row {row}: field {name} contains a null element")
        try:
            values = flat.cast(pa.int64()).to_numpy()
        except pa.ArrowInvalid as e:
            raise TraceError(f"{src}: column {name} does not fit int64 ({e})") from None
        return [values[offs[i]:offs[i + 1]] for i in range(len(offs) - 1)]
    if want == "string":
        if not (pa.types.is_string(have) or pa.types.is_large_string(have)
                or pa.types.is_dictionary(have)):
            raise TraceError(f"{src}: column {name} must be strings, got {have}")
        return col.cast(pa.string()).to_pylist()
    if want == "bool":
        if not pa.types.is_boolean(have):
            raise TraceError(f"{src}: column {name} must be boolean, got {have}")
        return col.to_numpy()
    if want == "int64":
        if not pa.types.is_integer(have):
            raise TraceError(f"{src}: column {name} must be integers, got {have}")
        try:
            return col.cast(pa.int64()).to_numpy()
        except pa.ArrowInvalid as e:
            raise TraceError(f"{src}: column {name} does not fit int64 ({e})") from None
    # float64
    if not (pa.types.is_floating(have) or pa.types.is_integer(have)):
        raise TraceError(f"{src}: column {name} must be numbers, got {have}")
    return col.cast(pa.float64()).to_numpy()


def _check_path(path: Path) -> str:
    """``path`` as errors name it; raises unless it is an existing file."""
    src = str(path)
    if not path.exists():
        raise TraceError(f"{src}: no such file")
    if not path.is_file():
        raise TraceError(f"{src}: not a file")
    return src


def _header(md: dict, src: str) -> tuple[int, int, dict[str, Any]]:
    """``(seed, vocab_size, meta)`` from a trace file's schema metadata."""
    fmt = md.get(_KEY_FORMAT)
    if fmt is not None and fmt.decode(errors="replace") != FORMAT:
        raise TraceError(f"{src}: unsupported trace format {fmt.decode(errors='replace')!r}, "
                         f"expected {FORMAT!r}")
    seed = _metadata_int(md, _KEY_SEED, src)
    vocab = _metadata_int(md, _KEY_VOCAB, src)
    meta: dict[str, Any] = {}
    if _KEY_META in md:
        try:
            meta = json.loads(md[_KEY_META].decode())
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise TraceError(f"{src}: schema metadata 'prefixshield.meta' is not JSON ({e})") \
                from None
        if not isinstance(meta, dict):
            raise TraceError(f"{src}: schema metadata 'prefixshield.meta' must be a JSON object")
    return seed, vocab, meta


def _check_columns(names: list[str], src: str) -> None:
    missing = [c for c in TRACE_COLUMNS if c not in names]
    if missing:
        raise TraceError(f"{src}: missing column(s) {', '.join(missing)}")


def _trace_of(table: pa.Table, src: str, seed: int, vocab: int, meta: dict) -> Trace:
    """The (not yet validated) trace of a table of trace rows."""
    columns: dict[str, Any] = {name: _check_column(table, name, src) for name in TRACE_COLUMNS}
    for name in table.column_names:
        if name not in columns:
            columns[name] = table.column(name).to_pandas()
    return Trace(requests=build_requests(columns), seed=seed, vocab_size=vocab, meta=meta)


def read_trace(path: str | os.PathLike) -> Trace:
    """Read and validate a trace written by [`write_trace`][prefixshield.traces.io.write_trace].

    Args:
        path: a Parquet trace file.

    Returns:
        The trace; list columns hold numpy int64 arrays.

    Raises:
        TraceError: naming the file and what is wrong: missing file, not Parquet, missing
            metadata or column, wrong column type, or a bad field (with its row number).
    """
    src, table, (seed, vocab, meta) = _open(path, pq.read_table)
    return _trace_of(table, src, seed, vocab, meta).validate(src)


def _open(path: str | os.PathLike, reader) -> tuple[str, Any, tuple[int, int, dict]]:
    """``(what errors name, reader(path), (seed, vocab_size, meta))`` of a trace file, its
    header and columns checked (``reader``: ``pq.read_table`` or ``pq.ParquetFile``)."""
    path = Path(path)
    src = _check_path(path)
    try:
        opened = reader(path)
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as e:
        raise TraceError(f"{src}: not a readable Parquet file ({e})") from None
    schema = opened.schema if isinstance(opened, pa.Table) else opened.schema_arrow
    header = _header(schema.metadata or {}, src)
    _check_columns(schema.names, src)
    return src, opened, header


STREAM_BATCH_ROWS = 1 << 16
"""Rows [`stream_trace`][prefixshield.traces.io.stream_trace] reads at a time."""


def _rows_on(message: str, base: int) -> str:
    """``message`` with its ``row N`` (of a batch) made the row of the file."""
    return re.sub(r": row (\d+):", lambda m: f": row {int(m.group(1)) + base}:", message,
                  count=1)


def stream_trace(path: str | os.PathLike, batch_rows: int = STREAM_BATCH_ROWS) -> TraceStream:
    """A trace file as a `TraceStream`: its rows read
    ``batch_rows`` at a time in file order (``ParquetFile.iter_batches``), each batch
    validated as `read_trace` validates a trace, errors naming the row of the file.
    Memory holds one batch, whatever the file's length.

    The groups and contracts (in `Trace.group_names` order) come from a first pass
    over those two columns, a batch at a time.

    Raises:
        TraceError: as `read_trace` (the header and columns at once; a bad row when
            the stream reaches it).
    """
    src, pf, (seed, vocab, meta) = _open(path, pq.ParquetFile)
    tenants = meta.get("tenants", {}) if isinstance(meta.get("tenants"), dict) else {}
    names = {k: dict.fromkeys(map(str, tenants.get(f"{k}s", []))) for k in ("group", "contract")}
    for batch in pf.iter_batches(batch_size=batch_rows, columns=["group", "contract"]):
        for k in names:
            col = batch.column(k)
            if col.null_count:
                break   # the row's own validation names it
            names[k].update(dict.fromkeys(map(str, pd.unique(col.to_numpy(
                zero_copy_only=False)))))

    def chunks():
        base = 0
        for batch in pf.iter_batches(batch_size=batch_rows):
            table = pa.Table.from_batches([batch])
            try:
                trace = _trace_of(table, src, seed, vocab, meta).validate(src)
            except TraceError as e:
                raise TraceError(_rows_on(str(e), base)) from None
            base += len(trace)
            yield trace

    return TraceStream(seed, vocab, meta, list(names["group"]), list(names["contract"]),
                       chunks, source=src)
