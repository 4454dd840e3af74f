"""Row accumulator shared by the workload generators and the importers of public traces."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from prefixshield.traces.schema import Trace, build_requests


class RequestRows:
    """Row accumulator shared by generators and importers.

    ``add`` appends a batch of rows of one group; ``finish`` sorts all rows by arrival (ties
    keep insertion order), numbers them ``request_id = 0..n-1`` and builds the validated trace.
    """

    def __init__(self) -> None:
        self.declared: dict[str, str] = {}
        self.cols: dict[str, list] = {k: [] for k in (
            "arrival_s", "group", "contract", "role", "prefix_id", "measured", "output_tokens",
            "segment_ids", "segment_lengths", "output_segment_id")}

    def declare(self, group: str, contract: str) -> None:
        """Configure ``group`` on ``contract`` even if it sends no request (a silent tenant)."""
        self.declared.setdefault(group, contract)

    def add(self, arrival_s, group: str, contract: str, role: str, prefix_id, measured,
            output_tokens, seg_ids: Sequence, seg_lens: Sequence, output_segment_id=None) -> None:
        """Append ``n = len(arrival_s)`` rows; scalars broadcast, ``seg_*`` are per-row lists."""
        arrival_s = np.asarray(arrival_s, dtype=np.float64)
        n = len(arrival_s)
        c = self.cols
        c["arrival_s"].append(arrival_s)
        c["group"].append(np.full(n, group, dtype=object))
        c["contract"].append(np.full(n, contract, dtype=object))
        c["role"].append(np.full(n, role, dtype=object))
        c["prefix_id"].append(np.broadcast_to(np.asarray(prefix_id, dtype=np.int64), (n,)))
        c["measured"].append(np.broadcast_to(np.asarray(measured, dtype=bool), (n,)))
        c["output_tokens"].append(np.broadcast_to(np.asarray(output_tokens, dtype=np.int64), (n,)))
        osid = -1 if output_segment_id is None else output_segment_id
        c["output_segment_id"].append(np.broadcast_to(np.asarray(osid, dtype=np.int64), (n,)))
        if len(seg_ids) != n or len(seg_lens) != n:
            raise AssertionError("segment lists must have one entry per row")
        c["segment_ids"].extend(seg_ids)
        c["segment_lengths"].extend(seg_lens)

    def count_by_group(self, groups: Sequence[str]) -> dict[str, int]:
        """Rows added so far per group of ``groups`` (in that order; 0 for a group without rows;
        rows of a group not listed are not counted)."""
        added = np.concatenate(self.cols["group"]) if self.cols["group"] else np.empty(0, object)
        names, counts = np.unique(added.astype(str), return_counts=True)
        have = dict(zip(names.tolist(), counts.tolist()))
        return {g: int(have.get(g, 0)) for g in groups}

    def finish(self, seed: int, vocab_size: int, meta: dict[str, Any],
               drop_role: str | None = None) -> Trace:
        """The trace; rows of ``drop_role`` are removed *after* numbering (no-attack controls).

        ``meta["tenants"]`` declares every group and contract of *all* rows (in order of first
        arrival), then those configured with :meth:`declare`, so a control without its
        attacker rows keeps the attacker configured but silent: quota policies are sized for the
        same groups, debt policies hold the same buckets (see :meth:`Trace.group_names`).
        """
        cols: dict[str, Any] = {}
        for k, v in self.cols.items():
            if k in ("segment_ids", "segment_lengths"):
                arr = np.empty(len(v), dtype=object)
                arr[:] = [np.asarray(x, dtype=np.int64) for x in v]
                cols[k] = arr
            else:
                cols[k] = np.concatenate(v) if v else np.empty(0)
        order = np.argsort(cols["arrival_s"], kind="stable")
        cols = {k: v[order] for k, v in cols.items()}
        cols["request_id"] = np.arange(len(order), dtype=np.int64)
        meta = {**meta, "tenants": {
            "groups": [str(g) for g in dict.fromkeys([*cols["group"], *self.declared])],
            "contracts": [str(c) for c in dict.fromkeys([*cols["contract"],
                                                         *self.declared.values()])]}}
        if drop_role is not None:
            keep = cols["role"] != drop_role
            cols = {k: v[keep] for k, v in cols.items()}
        trace = Trace(build_requests(cols), seed=seed, vocab_size=vocab_size, meta=meta)
        return trace.validate(f"<{meta.get('workload', 'trace')}>")

