"""The trace schema: one row per request, prompts as deterministic token segments.

Columns (``TRACE_COLUMNS``), units in the names where they matter:

=================  ==============  ===============================================================
column             dtype           meaning
=================  ==============  ===============================================================
request_id         int64           unique, increasing with arrival order
arrival_s          float64         arrival time in seconds from trace start (non-decreasing)
group              string          accounting group (tenant); also the prefix-cache salt
contract           string          service contract: a key of ``DEFAULT_CONTRACTS`` or a custom one
role               string          ``victim`` | ``attacker`` | ``benign``
prefix_id          int64           logical prefix (policy metadata), not the lookup hash
measured           bool            counted in metrics (warm-up rows are False)
output_tokens      int64           decode length, forced (``min_tokens = max_tokens``)
segment_ids        list<int64>     prompt segments in order
segment_lengths    list<int64>     tokens per segment, each > 0
output_segment_id  int64           segment whose tokens the request "generates" (-1: unique ones)
=================  ==============  ===============================================================

Trace-level fields: ``seed`` (token ids of a segment are a pure function of seed and segment id,
see `prefixshield.traces.tokens`), ``vocab_size`` and ``meta`` (generator name and
parameters, free-form JSON-able dict). ``meta["tenants"]`` (optional) declares the configured
groups and contracts, ``{"groups": [...], "contracts": [...]}``, including ones without a request
in this trace (the silent attacker of a no-attack control).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

ROLES = ("victim", "attacker", "benign")

TRACE_COLUMNS: dict[str, str] = {
    "request_id": "int64",
    "arrival_s": "float64",
    "group": "string",
    "contract": "string",
    "role": "string",
    "prefix_id": "int64",
    "measured": "bool",
    "output_tokens": "int64",
    "segment_ids": "list<int64>",
    "segment_lengths": "list<int64>",
    "output_segment_id": "int64",
}

DEFAULT_VOCAB_SIZE = 1000
"""Token ids stay below this; 1000 fits the tiny live-mode model and every real vocabulary."""


MAX_ARRIVAL_S = 1e9
"""Latest arrival a trace may hold (~31.7 years): float64 still resolves 1 us there."""


class TraceError(ValueError):
    """A trace (file, record or field) is malformed; the message names where and what."""


_LIST_COLUMNS = ("segment_ids", "segment_lengths")


class Segments(NamedTuple):
    """The prompt segments of a whole trace as flat arrays (all int64): request ``i``'s segment
    ids are ``ids[offsets[i]:offsets[i + 1]]`` and their lengths in tokens
    ``lengths[offsets[i]:offsets[i + 1]]``; ``offsets`` has ``len(trace) + 1`` entries, from
    0. The columnar form every hot path reads (prompt lengths, validation, the engine's token
    and hash kernels): no Python per request."""

    ids: np.ndarray
    lengths: np.ndarray
    offsets: np.ndarray


def flatten_cells(column) -> tuple[np.ndarray, np.ndarray]:
    """``(values, counts)`` of a list column: its cells one after another (int64) and each
    cell's length (int64). C loops over the cells (``len``, ``np.concatenate``), no Python
    bytecode per cell."""
    cells = column.tolist() if hasattr(column, "tolist") else list(column)
    counts = np.fromiter(map(len, cells), dtype=np.int64, count=len(cells))
    if not cells or not counts.any():
        return np.zeros(0, dtype=np.int64), counts
    return np.concatenate(cells).astype(np.int64, copy=False), counts


def offsets_of(counts: np.ndarray) -> np.ndarray:
    """``[0, cumsum(counts)...]`` (int64, ``len(counts) + 1`` entries)."""
    off = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=off[1:])
    return off


def cells_of(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """An object array of ``len(offsets) - 1`` cells, cell ``i`` an int64 array equal to
    ``values[offsets[i]:offsets[i + 1]]``: the cells of a list column built from its flat form.

    Rows of one width are gathered into one 2-D array whose rows become the cells (views into
    it): numpy makes the views in C, where slicing cell by cell costs a Python call each.
    """
    counts = np.diff(offsets)
    n = len(counts)
    out = np.empty(n, dtype=object)
    for width in np.flatnonzero(np.bincount(counts)):  # a few widths, not one pass per row
        rows = np.flatnonzero(counts == width)
        idx = offsets[rows][:, None] + np.arange(width, dtype=np.int64)[None, :]
        block = np.ascontiguousarray(values[idx], dtype=np.int64)
        out[rows] = np.fromiter(iter(block), dtype=object, count=len(rows))
    return out


def build_requests(columns: dict[str, Any]) -> pd.DataFrame:
    """A request table with exactly the dtypes of ``TRACE_COLUMNS`` (columns in that order).

    Args:
        columns: every name of ``TRACE_COLUMNS`` mapped to a sequence of equal length; list
            columns hold one int sequence per row (stored as numpy int64 arrays), or are
            `Segments` (both list columns from one flat form; the cells are built from
            it without a Python step per row). Extra names are appended after the schema
            columns unchanged.
    """
    missing = [c for c in TRACE_COLUMNS if c not in columns]
    if missing:
        raise TraceError(f"build_requests: missing column(s) {', '.join(missing)}")
    data: dict[str, Any] = {}
    for name, dtype in TRACE_COLUMNS.items():
        col = columns[name]
        if name in _LIST_COLUMNS:
            if isinstance(col, Segments):
                flat = col.ids if name == "segment_ids" else col.lengths
                data[name] = cells_of(flat, col.offsets)
                continue
            arr = np.empty(len(col), dtype=object)
            for i, x in enumerate(col):
                arr[i] = np.array(x, dtype=np.int64)
            data[name] = arr
        elif dtype == "string":
            data[name] = _string_array(col)
        else:
            data[name] = np.asarray(col, dtype=dtype)
    for name, col in columns.items():
        if name not in data:
            data[name] = col
    return pd.DataFrame(data)


def _string_array(col) -> pd.api.extensions.ExtensionArray:
    """``pd.array(list(col), dtype="string")``, converting each distinct value once: a
    trace's string columns hold a few names repeated over millions of rows."""
    codes, uniques = pd.factorize(np.asarray(col, dtype=object), use_na_sentinel=False)
    if len(uniques) == len(codes):  # nothing repeats: the plain conversion costs the same
        return pd.array(list(col), dtype="string")
    names = pd.array(list(uniques), dtype="string")
    return names.take(codes)


MAX_VOCAB_SIZE = 2 ** 31
"""Largest vocabulary a trace may name (token ids are drawn below it; real models: < 2**18)."""


@dataclass
class Trace:
    """A request trace: ``requests`` holds ``TRACE_COLUMNS``, one row per request, by arrival.

    Attributes:
        requests: the request table (pandas; list columns hold numpy int64 arrays or lists).
        seed: token seed for segment token ids.
        vocab_size: token ids are in ``[0, vocab_size)``.
        meta: provenance: generator or importer name, its parameters, source file.
    """

    requests: pd.DataFrame
    seed: int = 0
    vocab_size: int = DEFAULT_VOCAB_SIZE
    meta: dict[str, Any] = field(default_factory=dict)
    # The flat form of the list columns (see segments()), kept with the frame it was taken
    # from: a trace is never edited in place (transforms build a new frame), so the frame's
    # identity says whether the cache still holds.
    _segments: Segments | None = field(default=None, init=False, repr=False, compare=False)
    _segments_of: Any = field(default=None, init=False, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.requests)

    def segments(self) -> Segments:
        """The prompt segments as flat arrays (`Segments`), built once per request
        table (generators hand theirs over; other traces flatten their cells on first use).

        Raises:
            TraceError: a row's ``segment_ids`` and ``segment_lengths`` differ in length.
        """
        if self._segments is None or self._segments_of is not self.requests:
            ids, n_ids = flatten_cells(self.requests["segment_ids"])
            lens, n_lens = flatten_cells(self.requests["segment_lengths"])
            bad = np.flatnonzero(n_ids != n_lens)
            if bad.size:
                i = int(bad[0])
                raise TraceError(f"row {i}: fields segment_ids and segment_lengths must be of "
                                 f"equal length ({n_ids[i]} vs {n_lens[i]})")
            self.set_segments(Segments(ids, lens, offsets_of(n_ids)))
        return self._segments

    def set_segments(self, segments: Segments) -> None:
        """Hand over the flat form of the current request table's list columns (the caller
        built both from the same arrays; `segments` then returns these)."""
        self._segments, self._segments_of = segments, self.requests

    def validate(self, source: str = "<trace>") -> "Trace":
        """Check columns, dtypes and value ranges; raise `TraceError` naming row and field."""
        df = self.requests
        missing = [c for c in TRACE_COLUMNS if c not in df.columns]
        if missing:
            raise TraceError(f"{source}: missing column(s) {', '.join(missing)}")
        if not 2 <= self.vocab_size <= MAX_VOCAB_SIZE:
            raise TraceError(f"{source}: vocab_size must be in [2, {MAX_VOCAB_SIZE}], got "
                             f"{self.vocab_size}")
        if not 0 <= self.seed < 2 ** 63:
            raise TraceError(f"{source}: seed must be in [0, 2**63), got {self.seed}")
        tenants = self.meta.get("tenants")
        if tenants is not None and not (
                isinstance(tenants, dict)
                and all(isinstance(tenants.get(k, []), list)
                        and all(isinstance(x, str) for x in tenants.get(k, []))
                        for k in ("groups", "contracts"))):
            raise TraceError(f"{source}: meta field tenants must be "
                             f'{{"groups": [names], "contracts": [names]}}, got {tenants!r}')
        if len(df) == 0:
            return self
        arr = df["arrival_s"].to_numpy(dtype=np.float64)
        # Beyond MAX_ARRIVAL_S a step of a few milliseconds is below float64's resolution of
        # the clock (near 1e300 s every latency reads 0.000 s).
        bad = np.flatnonzero(~np.isfinite(arr) | (arr < 0) | (arr > MAX_ARRIVAL_S))
        if bad.size:
            raise TraceError(f"{source}: row {int(bad[0])}: field arrival_s must be a finite "
                             f"number in [0, {MAX_ARRIVAL_S:g}] s, got {float(arr[bad[0]])!r}")
        dec = np.flatnonzero(np.diff(arr) < 0)
        if dec.size:
            raise TraceError(f"{source}: row {int(dec[0]) + 1}: field arrival_s decreases "
                             f"({arr[dec[0]]} then {arr[dec[0] + 1]}); traces are sorted by arrival")
        rid = df["request_id"].to_numpy()
        # ids numbered in arrival order (every generator and importer) are increasing: no
        # sort or hash needed to see that they are distinct
        if not (np.diff(rid) > 0).all() and len(np.unique(rid)) != len(rid):
            raise TraceError(f"{source}: field request_id has duplicate values")
        bad = np.flatnonzero(rid < 0)
        if bad.size:
            raise TraceError(f"{source}: row {int(bad[0])}: field request_id must be >= 0, got "
                             f"{rid[bad[0]]}")
        pid = df["prefix_id"].to_numpy()
        bad = np.flatnonzero(pid < 0)
        if bad.size:
            raise TraceError(f"{source}: row {int(bad[0])}: field prefix_id must be >= 0, got "
                             f"{pid[bad[0]]}")
        out = df["output_tokens"].to_numpy()
        bad = np.flatnonzero(out < 1)
        if bad.size:
            raise TraceError(f"{source}: row {int(bad[0])}: field output_tokens must be >= 1, "
                             f"got {out[bad[0]]}")
        # each distinct role checked once: the column repeats three names
        codes, uniques = pd.factorize(df["role"].astype(str).to_numpy(), use_na_sentinel=False)
        bad = np.flatnonzero(~np.isin(np.asarray(uniques, dtype=str), ROLES)[codes])
        if bad.size:
            raise TraceError(f"{source}: row {int(bad[0])}: field role must be one of "
                             f"{'|'.join(ROLES)}, got {str(uniques[codes[bad[0]]])!r}")
        if self._segments is not None and self._segments_of is self.requests:
            # the cells were built from these flat arrays (RequestRows.finish): check those
            seg = self._segments
            n_ids = n_lens = np.diff(seg.offsets)
            ids, lens = seg.ids, seg.lengths
        else:
            ids, n_ids = flatten_cells(df["segment_ids"])
            lens, n_lens = flatten_cells(df["segment_lengths"])
        # the first row with any fault, and its first fault in the order the checks are listed
        uneven = (n_ids != n_lens) | (n_ids == 0)
        first = {}
        if uneven.any():
            first["uneven"] = int(np.argmax(uneven))
        rows = np.repeat(np.arange(len(df), dtype=np.int64), n_lens)
        if (lens < 1).any():
            first["lengths"] = int(rows[np.argmax(lens < 1)])
        rows = np.repeat(np.arange(len(df), dtype=np.int64), n_ids)
        if (ids < 0).any():
            first["ids"] = int(rows[np.argmax(ids < 0)])
        if first:
            i = min(first.values())
            if first.get("uneven") == i:
                raise TraceError(f"{source}: row {i}: fields segment_ids and segment_lengths must "
                                 f"be non-empty and of equal length ({n_ids[i]} vs {n_lens[i]})")
            if first.get("lengths") == i:
                raise TraceError(f"{source}: row {i}: field segment_lengths must be > 0")
            raise TraceError(f"{source}: row {i}: field segment_ids must be >= 0")
        if self._segments is None or self._segments_of is not self.requests:
            self.set_segments(Segments(ids, lens, offsets_of(n_ids)))
        return self

    def equals(self, other: "Trace") -> bool:
        """True when seed, vocab_size, meta and every request cell are identical."""
        if (self.seed, self.vocab_size, self.meta) != (other.seed, other.vocab_size, other.meta):
            return False
        a, b = self.requests, other.requests
        if list(a.columns) != list(b.columns) or len(a) != len(b):
            return False
        for name in a.columns:
            if name in _LIST_COLUMNS:
                (x, nx), (y, ny) = flatten_cells(a[name]), flatten_cells(b[name])
                if not (np.array_equal(nx, ny) and np.array_equal(x, y)):
                    return False
            elif not a[name].reset_index(drop=True).equals(b[name].reset_index(drop=True)):
                return False
        return True

    def group_names(self) -> list[str]:
        """The configured groups: those declared in ``meta["tenants"]``, then any other group
        with a request, in order of first arrival. A policy is bound to exactly these."""
        declared = self.meta.get("tenants", {}).get("groups", [])
        return list(dict.fromkeys([*map(str, declared), *self.requests["group"].astype(str)]))

    def contract_names(self) -> list[str]:
        """The configured contracts: declared ones (``meta["tenants"]``), then any other used."""
        declared = self.meta.get("tenants", {}).get("contracts", [])
        return list(dict.fromkeys([*map(str, declared), *self.requests["contract"].astype(str)]))

    def prompt_lengths(self) -> np.ndarray:
        """Prompt length in tokens of every request (int64)."""
        seg = self.segments()
        summed = np.zeros(len(seg.lengths) + 1, dtype=np.int64)
        np.cumsum(seg.lengths, out=summed[1:])
        return summed[seg.offsets[1:]] - summed[seg.offsets[:-1]]
