"""Split mode: the router (one that reads no replica state) assigns every request up front,
and each replica runs its share of the trace as an ordinary single engine (the fused loop where
it applies).

A replica's sub-trace keeps the whole trace's declared tenants, so every replica knows every
group and contract (group ids, a static quota's partition, the ledgers' buckets are the same on
every replica, as in a real deployment where each engine is configured alike).
"""

from __future__ import annotations

import numpy as np

from prefixshield.traces.schema import Trace


def tenants_of(trace: Trace) -> dict[str, list[str]]:
    """Every tenant of ``trace`` as a sub-trace declares them (``meta["tenants"]``)."""
    return {"groups": trace.group_names(), "contracts": trace.contract_names()}


def sub_trace(trace: Trace, rows: np.ndarray,
              tenants: dict[str, list[str]] | None = None) -> Trace:
    """The rows ``rows`` (sorted) of ``trace`` as a trace of their own, with every tenant of
    ``trace`` declared (``tenants``: :func:`tenants_of` of ``trace``, given when it is split
    many ways: reading them scans the whole trace)."""
    meta = dict(trace.meta)
    meta["tenants"] = tenants_of(trace) if tenants is None else tenants
    return Trace(requests=trace.requests.iloc[rows].reset_index(drop=True), seed=trace.seed,
                 vocab_size=trace.vocab_size, meta=meta)
