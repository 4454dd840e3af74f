"""Row accumulator shared by the workload generators and the importers of public traces."""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import numpy as np

from prefixshield.traces.schema import Segments, Trace, build_requests, flatten_cells, offsets_of


class FlatRows(NamedTuple):
    """One batch's segment column in flat form: ``values`` (int64) one row after another,
    ``counts[i]`` of them for row ``i``."""

    values: np.ndarray
    counts: np.ndarray


class RequestRows:
    """Row accumulator shared by generators and importers.

    ``add`` appends a batch of rows of one group; ``finish`` sorts all rows by arrival (ties
    keep insertion order), numbers them ``request_id = 0..n-1`` and builds the validated trace.
    Prompts are kept flat (segment ids and lengths one after another, a count per row) from
    ``add`` to the trace (`Trace.segments`): sorting, dropping and building the list
    columns are array operations, not a Python step per row.
    """

    def __init__(self) -> None:
        self.declared: dict[str, str] = {}
        self.cols: dict[str, list] = {k: [] for k in (
            "arrival_s", "group", "contract", "role", "prefix_id", "measured", "output_tokens",
            "output_segment_id")}
        # per batch: flat segment ids, flat lengths (tokens), segments per row
        self.segs: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def declare(self, group: str, contract: str) -> None:
        """Configure ``group`` on ``contract`` even if it sends no request (a silent tenant)."""
        self.declared.setdefault(group, contract)

    def add(self, arrival_s, group: str, contract: str, role: str, prefix_id, measured,
            output_tokens, seg_ids, seg_lens, output_segment_id=None) -> None:
        """Append ``n = len(arrival_s)`` rows; scalars broadcast.

        ``seg_ids`` and ``seg_lens`` give each row's prompt segments, either as 2-D int arrays
        of shape ``(n, k)`` (every row ``k`` segments: the fast form), as `FlatRows`
        (values one row after another, and the number per row), or as per-row sequences."""
        arrival_s = np.asarray(arrival_s, dtype=np.float64)
        n = len(arrival_s)
        c = self.cols
        c["arrival_s"].append(arrival_s)
        # one code per batch (a batch is one group, contract and role); expanded in finish
        c["group"].append((group, n))
        c["contract"].append((contract, n))
        c["role"].append((role, n))
        c["prefix_id"].append(np.broadcast_to(np.asarray(prefix_id, dtype=np.int64), (n,)))
        c["measured"].append(np.broadcast_to(np.asarray(measured, dtype=bool), (n,)))
        c["output_tokens"].append(np.broadcast_to(np.asarray(output_tokens, dtype=np.int64), (n,)))
        osid = -1 if output_segment_id is None else output_segment_id
        c["output_segment_id"].append(np.broadcast_to(np.asarray(osid, dtype=np.int64), (n,)))
        ids, n_ids = _flat(seg_ids, n)
        lens, n_lens = _flat(seg_lens, n)
        if len(n_ids) != n or len(n_lens) != n:
            raise AssertionError("segment lists must have one entry per row")
        if not np.array_equal(n_ids, n_lens):
            raise AssertionError("segment ids and lengths must have one entry per segment")
        self.segs.append((ids, lens, n_ids))

    def roles(self) -> list[tuple[str, int]]:
        """``(role, rows)`` of every batch added so far, in order."""
        return list(self.cols["role"])

    def count_by_group(self, groups: Sequence[str]) -> dict[str, int]:
        """Rows added so far per group of ``groups`` (in that order; 0 for a group without rows;
        rows of a group not listed are not counted)."""
        have: dict[str, int] = {}
        for g, n in self.cols["group"]:
            have[str(g)] = have.get(str(g), 0) + n
        return {g: int(have.get(g, 0)) for g in groups}

    def finish(self, seed: int, vocab_size: int, meta: dict[str, Any],
               drop_role: str | None = None) -> Trace:
        """The trace; rows of ``drop_role`` are removed *after* numbering (no-attack controls).

        ``meta["tenants"]`` declares every group and contract of *all* rows (in order of first
        arrival), then those configured with `declare`, so a control without its
        attacker rows keeps the attacker configured but silent: quota policies are sized for the
        same groups, debt policies hold the same buckets (see `Trace.group_names`).
        """
        cols: dict[str, Any] = {}
        for k, v in self.cols.items():
            if k in ("group", "contract", "role"):
                cols[k] = _codes(v)
            else:
                cols[k] = np.concatenate(v) if v else np.empty(0)
        n = len(cols["arrival_s"])
        order = np.argsort(cols["arrival_s"], kind="stable")
        rid = np.arange(n, dtype=np.int64)
        names = {k: cols[k][1] for k in ("group", "contract", "role")}
        # first arrival of each name: the first sorted row carrying its code
        first_rows = {k: _first_seen(cols[k][0][order], len(names[k]))
                      for k in ("group", "contract")}
        meta = {**meta, "tenants": {
            "groups": [str(g) for g in dict.fromkeys(
                [*(names["group"][i] for i in first_rows["group"]), *self.declared])],
            "contracts": [str(c) for c in dict.fromkeys(
                [*(names["contract"][i] for i in first_rows["contract"]),
                 *self.declared.values()])]}}
        if drop_role is not None:
            role_sorted = np.asarray(names["role"], dtype=object)[cols["role"][0][order]] \
                if n else np.empty(0, dtype=object)
            keep = role_sorted != drop_role
            order, rid = order[keep], rid[keep]
        out: dict[str, Any] = {}
        for k, v in cols.items():
            if k in ("group", "contract", "role"):
                codes, uniques = v
                out[k] = np.asarray(uniques, dtype=object)[codes[order]] if len(uniques) \
                    else np.empty(0, dtype=object)
            else:
                out[k] = v[order]
        out["request_id"] = rid
        segments = _gather(self.segs, order)
        out["segment_ids"] = out["segment_lengths"] = segments
        trace = Trace(build_requests(out), seed=seed, vocab_size=vocab_size, meta=meta)
        trace.set_segments(segments)
        return trace.validate(f"<{meta.get('workload', 'trace')}>")


def _flat(rows, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``(values, counts)`` of one batch's segment column in any form `RequestRows.add`
    takes (int64)."""
    if isinstance(rows, np.ndarray) and rows.ndim == 2 and rows.dtype != object:
        k = rows.shape[1]
        return (np.ascontiguousarray(rows, dtype=np.int64).reshape(-1),
                np.full(rows.shape[0], k, dtype=np.int64))
    if isinstance(rows, FlatRows):
        return (np.asarray(rows.values, dtype=np.int64).reshape(-1),
                np.asarray(rows.counts, dtype=np.int64).reshape(-1))
    return flatten_cells(list(rows))


def _codes(batches: list[tuple[str, int]]) -> tuple[np.ndarray, list[str]]:
    """Row codes (int64) into the distinct names (in order of first batch) of per-batch
    ``(name, rows)`` pairs."""
    names = list(dict.fromkeys(b[0] for b in batches))
    index = {name: i for i, name in enumerate(names)}
    codes = np.repeat(np.array([index[b[0]] for b in batches], dtype=np.int64),
                      np.array([b[1] for b in batches], dtype=np.int64)) \
        if batches else np.zeros(0, dtype=np.int64)
    return codes, names


def _first_seen(codes: np.ndarray, num_codes: int) -> list[int]:
    """The codes in order of their first appearance in ``codes``."""
    firsts = np.full(num_codes, len(codes), dtype=np.int64)
    np.minimum.at(firsts, codes, np.arange(len(codes), dtype=np.int64))
    seen = np.flatnonzero(firsts < len(codes))
    return seen[np.argsort(firsts[seen], kind="stable")].tolist()


def _gather(batches: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
            rows: np.ndarray) -> Segments:
    """The segments of ``rows`` (indices into all batches' rows, in the order wanted)."""
    if not batches:
        empty = np.zeros(0, dtype=np.int64)
        return Segments(empty, empty, np.zeros(1, dtype=np.int64))
    ids = np.concatenate([b[0] for b in batches])
    lens = np.concatenate([b[1] for b in batches])
    counts = np.concatenate([b[2] for b in batches])
    start = offsets_of(counts)[:-1]
    new_counts = counts[rows]
    new_off = offsets_of(new_counts)
    # position j of the output takes input start[row] + (j - new_off[row])
    idx = np.repeat(start[rows] - new_off[:-1], new_counts) + np.arange(new_off[-1],
                                                                        dtype=np.int64)
    return Segments(ids[idx], lens[idx], new_off)
