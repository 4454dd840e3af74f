"""Traces given as consecutive chunks of rows, for runs whose memory must not grow with the
trace (`prefixshield.simulator.stream`).

A `TraceStream` carries what a run needs before its first row -- the trace's seed,
vocabulary, meta and the names of every group and contract in `Trace.group_names`
order -- and a callable giving the chunks: validated `Trace` pieces, rows in arrival
order, row numbers going on from one chunk to the next. Sources: an in-memory trace
(`TraceStream.of_trace`), a Parquet trace file read in row batches
(`prefixshield.traces.io.stream_trace`), a generator drawing windows of simulated time
(`prefixshield.workloads.stream_workload`).

Units: as the trace's (seconds, tokens).
"""

from __future__ import annotations

from typing import Iterable, Iterator

import numpy as np
import pandas as pd

from prefixshield.traces.schema import Segments, Trace, TraceError, offsets_of


class TraceStream:
    """A trace given as consecutive chunks of rows, in arrival order.

    Attributes:
        seed, vocab_size, meta: the trace's fields (as `Trace`'s).
        groups, contracts: the configured names of the whole trace, in
            `Trace.group_names` order (declared, then by first arrival).
        chunks: a callable returning an iterator of validated `Trace` chunks; row
            numbers go on from chunk to chunk.
        source: what errors name (a file's path).
    """

    def __init__(self, seed: int, vocab_size: int, meta: dict, groups: list[str],
                 contracts: list[str], chunks, source: str = "<trace stream>") -> None:
        self.seed, self.vocab_size, self.meta = int(seed), int(vocab_size), meta
        self.groups, self.contracts = list(groups), list(contracts)
        self.chunks = chunks
        self.source = source

    def rows(self) -> Iterator[tuple[int, Trace]]:
        """``(first row, chunk)`` for every chunk with rows, checking across chunks what a
        chunk's own validation cannot see: arrivals that go back, request ids that do not
        increase (a streamed trace numbers its requests in arrival order, as every generator
        and importer does: distinct ids cannot be checked otherwise in bounded memory).

        Raises:
            TraceError: naming the source and the row (in the whole trace).
        """
        base, last_t, last_id = 0, -np.inf, -1
        for chunk in self.chunks():
            df = chunk.requests
            if not len(df):
                continue
            t = df["arrival_s"].to_numpy(np.float64)
            rid = df["request_id"].to_numpy(np.int64)
            if t[0] < last_t:
                raise TraceError(f"{self.source}: row {base}: field arrival_s decreases "
                                 f"({last_t} then {t[0]}); traces are sorted by arrival")
            steps = np.diff(np.concatenate([[last_id], rid])) <= 0
            if steps.any():
                raise TraceError(f"{self.source}: row {base + int(np.argmax(steps))}: field "
                                 f"request_id must increase with arrival in a streamed trace")
            yield base, chunk
            base += len(df)
            last_t, last_id = float(t[-1]), int(rid[-1])

    @classmethod
    def of_trace(cls, trace: Trace, rows: int) -> "TraceStream":
        """An in-memory trace in chunks of ``rows`` rows (tests; the same run as the trace's)."""
        df = trace.requests

        def chunks() -> Iterator[Trace]:
            for lo in range(0, len(df), rows):
                yield Trace(df.iloc[lo:lo + rows].reset_index(drop=True), trace.seed,
                            trace.vocab_size, trace.meta)
        return cls(trace.seed, trace.vocab_size, trace.meta, trace.group_names(),
                   trace.contract_names(), chunks)

    def tenants_meta(self) -> dict:
        """``meta`` declaring every group and contract of the whole trace (a chunk's
        [`Trace.group_names`][prefixshield.traces.schema.Trace.group_names] is then the trace's)."""
        return {**self.meta, "tenants": {"groups": self.groups, "contracts": self.contracts}}


def concat_traces(parts: Iterable[Trace], seed: int, vocab_size: int, meta: dict) -> Trace:
    """One trace of ``parts``' rows one after another (at least one part; their segments'
    flat forms joined, not re-flattened), validated; ``meta`` is the whole trace's."""
    parts = list(parts)
    segs = [p.segments() for p in parts]
    seg = Segments(np.concatenate([s.ids for s in segs]),
                   np.concatenate([s.lengths for s in segs]),
                   offsets_of(np.concatenate([np.diff(s.offsets) for s in segs])))
    trace = Trace(pd.concat([p.requests for p in parts], ignore_index=True), seed=seed,
                  vocab_size=vocab_size, meta=meta)
    trace.set_segments(seg)
    return trace.validate(f"<{meta.get('workload', 'trace')}>")
