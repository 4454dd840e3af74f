"""Replicates of a trace file: a bootstrap over its sessions.

A trace file is one observation; the seeds of ``compare TRACE.parquet`` are replicates of it
drawn by `session_bootstrap`, what a trace can honestly vary: *which* sessions arrived.

* A session is a ``(group, prefix_id)`` pair, the unit every importer keeps together: a
  ShareGPT conversation, a Mooncake prefix root (the requests that share a first block after
  the prefix every request shares), a generated workload's logical prefix.
* Replicate ``seed`` draws as many sessions as the trace has, uniformly with replacement
  (``numpy.random.default_rng(seed)``); a drawn session contributes all of its requests at their
  own arrival times, measured flags, groups, contracts, roles and lengths.
* A session drawn ``k > 1`` times appears as ``k`` sessions. Its first copy is the original;
  every further copy is a new session of the same shape: segments that are *private* to the
  session (in the prompt or as the generated output of no other session) get fresh ids, so a copy
  never hits its twin's blocks, while segments it shares with other sessions (a system prompt, a
  common document) keep theirs, so the trace's cross-session reuse stays what it was. Copies get
  fresh ``prefix_id`` values.
* Rows are ordered by arrival (stable: original row, then copy) and renumbered
  ``request_id = 0..n-1``; the trace's seed, vocabulary and meta are kept (meta gains
  ``bootstrap``: the seed and the session counts).

The number of requests, and the load, vary from replicate to replicate as the draw does.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from prefixshield.traces.schema import Segments, Trace, build_requests, offsets_of


def sessions_of(trace: Trace) -> np.ndarray:
    """Each row's session index (int64, 0..S-1 in order of first arrival): its
    ``(group, prefix_id)`` pair."""
    df = trace.requests
    key = pd.MultiIndex.from_arrays([df["group"].astype(str).to_numpy(),
                                     df["prefix_id"].to_numpy(np.int64)])
    codes, _ = pd.factorize(key, sort=False)
    return codes.astype(np.int64)


def session_bootstrap(trace: Trace, seed: int) -> Trace:
    """Replicate ``seed`` of ``trace`` (see the module docstring): its sessions drawn with
    replacement, further copies of a session given fresh private segments and prefix ids."""
    df = trace.requests
    n = len(df)
    if n == 0:
        return trace
    sess = sessions_of(trace)
    num_sessions = int(sess.max()) + 1
    rng = np.random.default_rng(seed)
    counts = np.bincount(rng.integers(0, num_sessions, size=num_sessions),
                         minlength=num_sessions)
    seg = trace.segments()
    out_seg = df["output_segment_id"].to_numpy(np.int64)
    # which sessions use each segment: prompt segments and generated outputs
    per_row = np.diff(seg.offsets)
    used_ids = np.concatenate([seg.ids, out_seg[out_seg >= 0]])
    used_sess = np.concatenate([np.repeat(sess, per_row), sess[out_seg >= 0]])
    pairs = np.unique(np.stack([used_ids, used_sess], axis=1), axis=0)
    ids, users = np.unique(pairs[:, 0], return_counts=True)
    private = ids[users == 1]
    # copy k >= 1 of a session maps private id x to base + rank(x) + (k - 1) * len(private)
    base = int(used_ids.max()) + 1 if used_ids.size else 0

    # the rows of the replicate: row i once per copy of its session, copy index k
    times = counts[sess]
    rows = np.repeat(np.arange(n, dtype=np.int64), times)
    first = np.repeat(offsets_of(times)[:-1], times)
    copy = np.arange(rows.shape[0], dtype=np.int64) - first
    order = np.lexsort((copy, rows, df["arrival_s"].to_numpy()[rows]))
    rows, copy = rows[order], copy[order]

    def remap(values: np.ndarray, k: np.ndarray) -> np.ndarray:
        """Segment ids ``values`` of copies ``k`` (same shape): private ones renamed in
        copies k >= 1."""
        out = values.copy()
        if not private.size:
            return out
        rank = np.searchsorted(private, values)
        hit = (k >= 1) & (rank < private.size) & (private[np.minimum(rank, private.size - 1)]
                                                  == values)
        out[hit] = base + rank[hit] + (k[hit] - 1) * private.size
        return out

    lengths = per_row[rows]
    new_offsets = offsets_of(lengths)
    # the flat positions of every new row's segments, in order (no Python step per row)
    flat = (np.repeat(seg.offsets[rows], lengths)
            + np.arange(int(new_offsets[-1]), dtype=np.int64)
            - np.repeat(new_offsets[:-1], lengths))
    new_ids = remap(seg.ids[flat], np.repeat(copy, lengths))
    new_out = np.where(out_seg[rows] >= 0, remap(np.maximum(out_seg[rows], 0), copy), -1)
    prefix = df["prefix_id"].to_numpy(np.int64)
    span = int(prefix.max()) + 1
    columns = {
        "request_id": np.arange(rows.shape[0], dtype=np.int64),
        "arrival_s": df["arrival_s"].to_numpy()[rows],
        "group": df["group"].astype(str).to_numpy()[rows],
        "contract": df["contract"].astype(str).to_numpy()[rows],
        "role": df["role"].astype(str).to_numpy()[rows],
        "prefix_id": prefix[rows] + copy * span,
        "measured": df["measured"].to_numpy(bool)[rows],
        "output_tokens": df["output_tokens"].to_numpy(np.int64)[rows],
        "segment_ids": Segments(new_ids, seg.lengths[flat], new_offsets),
        "segment_lengths": Segments(new_ids, seg.lengths[flat], new_offsets),
        "output_segment_id": new_out,
    }
    meta = {**trace.meta, "bootstrap": {
        "seed": int(seed), "unit": "session (group, prefix_id)", "sessions": num_sessions,
        "file_requests": int(n),
        "sessions_drawn": int(np.count_nonzero(counts)), "requests": int(rows.shape[0])}}
    out = dataclasses.replace(trace, requests=build_requests(columns), meta=meta)
    return out.validate(f"session bootstrap {seed}")
