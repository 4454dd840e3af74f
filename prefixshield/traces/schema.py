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
see :mod:`prefixshield.traces.tokens`), ``vocab_size`` and ``meta`` (generator name and
parameters, free-form JSON-able dict). ``meta["tenants"]`` (optional) declares the configured
groups and contracts, ``{"groups": [...], "contracts": [...]}``, including ones without a request
in this trace (the silent attacker of a no-attack control).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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


def build_requests(columns: dict[str, Any]) -> pd.DataFrame:
    """A request table with exactly the dtypes of ``TRACE_COLUMNS`` (columns in that order).

    Args:
        columns: every name of ``TRACE_COLUMNS`` mapped to a sequence of equal length; list
            columns hold one int sequence per row (stored as numpy int64 arrays). Extra names
            are appended after the schema columns unchanged.
    """
    missing = [c for c in TRACE_COLUMNS if c not in columns]
    if missing:
        raise TraceError(f"build_requests: missing column(s) {', '.join(missing)}")
    data: dict[str, Any] = {}
    for name, dtype in TRACE_COLUMNS.items():
        col = columns[name]
        if name in _LIST_COLUMNS:
            arr = np.empty(len(col), dtype=object)
            for i, x in enumerate(col):
                arr[i] = np.array(x, dtype=np.int64)
            data[name] = arr
        elif dtype == "string":
            data[name] = pd.array(list(col), dtype="string")
        else:
            data[name] = np.asarray(col, dtype=dtype)
    for name, col in columns.items():
        if name not in data:
            data[name] = col
    return pd.DataFrame(data)


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

    def __len__(self) -> int:
        return len(self.requests)

    def validate(self, source: str = "<trace>") -> "Trace":
        """Check columns, dtypes and value ranges; raise :class:`TraceError` naming row and field."""
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
                             f"number in [0, {MAX_ARRIVAL_S:g}] s, got {arr[bad[0]]!r}")
        dec = np.flatnonzero(np.diff(arr) < 0)
        if dec.size:
            raise TraceError(f"{source}: row {int(dec[0]) + 1}: field arrival_s decreases "
                             f"({arr[dec[0]]} then {arr[dec[0] + 1]}); traces are sorted by arrival")
        rid = df["request_id"].to_numpy()
        if len(np.unique(rid)) != len(rid):
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
        roles = df["role"].astype(str).to_numpy()
        bad = np.flatnonzero(~np.isin(roles, ROLES))
        if bad.size:
            raise TraceError(f"{source}: row {int(bad[0])}: field role must be one of "
                             f"{'|'.join(ROLES)}, got {roles[bad[0]]!r}")
        for i, (ids, lens) in enumerate(zip(df["segment_ids"], df["segment_lengths"])):
            if len(ids) != len(lens) or len(ids) == 0:
                raise TraceError(f"{source}: row {i}: fields segment_ids and segment_lengths must be "
                                 f"non-empty and of equal length ({len(ids)} vs {len(lens)})")
            if np.min(lens) < 1:
                raise TraceError(f"{source}: row {i}: field segment_lengths must be > 0")
            if np.min(ids) < 0:
                raise TraceError(f"{source}: row {i}: field segment_ids must be >= 0")
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
                if not all(np.array_equal(x, y) for x, y in zip(a[name], b[name])):
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
        return np.fromiter((int(np.sum(x)) for x in self.requests["segment_lengths"]),
                           dtype=np.int64, count=len(self.requests))
