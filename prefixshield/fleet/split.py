"""Split mode: the router (one that reads no replica state) assigns every request up front,
and each replica runs its share of the trace as an ordinary single engine (the fused loop where
it applies).

A replica's sub-trace keeps the whole trace's declared tenants, so every replica knows every
group and contract (group ids, a static quota's partition, the ledgers' buckets are the same on
every replica, as in a real deployment where each engine is configured alike).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from prefixshield.traces.schema import Segments, Trace, cells_of


def tenants_of(trace: Trace) -> dict[str, list[str]]:
    """Every tenant of ``trace`` as a sub-trace declares them (``meta["tenants"]``)."""
    return {"groups": trace.group_names(), "contracts": trace.contract_names()}


def sub_trace(trace: Trace, rows: np.ndarray,
              tenants: dict[str, list[str]] | None = None) -> Trace:
    """The rows ``rows`` (sorted) of ``trace`` as a trace of their own, with every tenant of
    ``trace`` declared (``tenants``: `tenants_of` of ``trace``, given when it is split
    many ways: reading them scans the whole trace)."""
    meta = dict(trace.meta)
    meta["tenants"] = tenants_of(trace) if tenants is None else tenants
    return Trace(requests=trace.requests.iloc[rows].reset_index(drop=True), seed=trace.seed,
                 vocab_size=trace.vocab_size, meta=meta)


def pack_trace(trace: Trace) -> dict[str, Any]:
    """``trace`` in a form that pickles fast (`unpack_trace` restores it): the request
    table without its two list columns, and those as flat arrays (`Trace.segments`).
    Pickling the list cells costs about 9 us a row each way (an array object per cell), more
    than a split replica's whole run; the flat arrays pickle as two buffers."""
    seg = trace.segments()
    return {"requests": trace.requests.drop(columns=["segment_ids", "segment_lengths"]),
            "columns": list(trace.requests.columns), "segments": tuple(seg),
            "seed": trace.seed, "vocab_size": trace.vocab_size, "meta": trace.meta}


def unpack_trace(packed: dict[str, Any]) -> Trace:
    """The trace `pack_trace` packed: the same columns in the same order, each list cell
    an int64 array of the same values, and the flat segments handed over."""
    seg = Segments(*packed["segments"])
    df = packed["requests"].assign(segment_ids=cells_of(seg.ids, seg.offsets),
                                   segment_lengths=cells_of(seg.lengths, seg.offsets))
    trace = Trace(requests=df[packed["columns"]], seed=packed["seed"],
                  vocab_size=packed["vocab_size"], meta=packed["meta"])
    trace.set_segments(seg)
    return trace
