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


def sub_trace(trace: Trace, rows: np.ndarray) -> Trace:
    """The rows ``rows`` (sorted) of ``trace`` as a trace of their own, with every tenant of
    ``trace`` declared."""
    meta = dict(trace.meta)
    meta["tenants"] = {"groups": trace.group_names(), "contracts": trace.contract_names()}
    return Trace(requests=trace.requests.iloc[rows].reset_index(drop=True), seed=trace.seed,
                 vocab_size=trace.vocab_size, meta=meta)
