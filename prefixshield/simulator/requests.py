"""The per-request table: every per-request array of a run, declared once.

A run's per-request state is a struct of arrays indexed by trace row (arrival order). Three
kinds of fields, each declared here once (name, dtype, initial value, meaning):

* `TRACE_FIELDS`: read from the trace before the run (``request_id``, ``arrival_s``,
  the group and contract ids, ...); never written by a run;
* `RESULT_FIELDS`: written by the run (``first_token_s`` .. ``block_s``), allocated
  with their initial values by `allocate`; the records are built from them
  ([`build_records`][prefixshield.simulator.records.build_records]);
* `LOOP_FIELDS`: what the fused loop alone keeps per request besides
  (``materialized``, ``held_since``), and the batched step's counter matrix ``_state``
  (`STATE_MATRIX`, ``[n, batch.NUM_FIELDS]`` int64, `state_matrix`).

Every holder of these arrays uses the declaration: the `Engine`
(its attributes under these names), a streamed run's window of rows
(`Window`: [`CARRIED`][prefixshield.simulator.requests.CARRIED] is what it carries from one
window to the next), the records builder (`RECORD_INPUTS`, read off any object holding
them, such as a `RowSlice`), and fleet replicas sharing one trace's rows
(`SharedRows`).

Units: seconds, tokens, blocks, as the engine's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from prefixshield.simulator import batch as bk


@dataclass(frozen=True)
class Field:
    """One per-request array: ``name`` (the attribute it is held under), ``dtype``, its
    initial value ``fill`` (None: read from the trace, no initial value) and what it holds
    (``doc``, with units)."""

    name: str
    dtype: np.dtype
    fill: Any
    doc: str

    def allocate(self, n: int) -> np.ndarray:
        """``n`` entries of this field's initial value (a field with ``fill`` None: empty)."""
        if self.fill is None:
            return np.empty(n, dtype=self.dtype)
        return np.full(n, self.fill, dtype=self.dtype)


TRACE_FIELDS: tuple[Field, ...] = (
    Field("request_id", np.dtype(np.int64), None, "the trace's request id"),
    Field("arrival_s", np.dtype(np.float64), None, "arrival time, s"),
    Field("group_id", np.dtype(np.int64), None, "position of the request's group in the "
          "run's group names"),
    Field("contract_id", np.dtype(np.int64), None, "position of its contract in the run's "
          "contract names"),
    Field("role", np.dtype(object), None, "the trace's role, as str"),
    Field("prefix_id", np.dtype(np.int64), None, "the trace's prefix id"),
    Field("measured", np.dtype(np.bool_), None, "whether the request is in the measured "
          "phase"),
    Field("output_tokens", np.dtype(np.int64), None, "output tokens it decodes (a group's "
          "max_tokens cap applied)"),
    Field("output_segment_id", np.dtype(np.int64), None, "the segment its output tokens "
          "come from (-1: drawn from its row)"),
    Field("prompt_tokens", np.dtype(np.int64), None, "prompt tokens (its segments' lengths "
          "summed)"),
)
"""The columns a run reads from the trace, by row."""

RESULT_FIELDS: tuple[Field, ...] = (
    Field("first_token_s", np.dtype(np.float64), np.nan, "first output token, s (NaN: none "
          "yet)"),
    Field("finish_s", np.dtype(np.float64), np.nan, "last output token, s (NaN: not "
          "finished)"),
    Field("cached_tokens", np.dtype(np.int64), -1, "prompt tokens cached at first admission "
          "(-1: not admitted)"),
    Field("num_preemptions", np.dtype(np.int64), 0, "times preempted"),
    Field("num_new_blocks", np.dtype(np.int64), 0, "blocks it materialized (set when it "
          "finishes)"),
    Field("admitted_s", np.dtype(np.float64), np.nan, "first admission, s (NaN: not "
          "admitted)"),
    Field("arrival_cached_tokens", np.dtype(np.int64), -1, "prompt tokens cached when it "
          "arrived (-1: not arrived)"),
    Field("block_s", np.dtype(np.float64), 0.0, "KV block-seconds its block table held over "
          "its life"),
)
"""What a run writes per request (every path: step-by-step, batched, fused)."""

LOOP_FIELDS: tuple[Field, ...] = (
    Field("materialized", np.dtype(np.int64), 0, "blocks it materialized so far (fused "
          "loop)"),
    Field("held_since", np.dtype(np.float64), 0.0, "when its block table last changed, s "
          "(fused loop's block-seconds)"),
)
"""The fused loop's own per-request state (an `Engine` builds them per fused run)."""

STATE_MATRIX = "_state"
"""The batched step's per-request counters (``[n, batch.NUM_FIELDS]`` int64, columns
`prefixshield.simulator.batch`'s ``PROMPT`` .. ``ADMISSION``): `state_matrix`."""

CARRIED: tuple[str, ...] = ((STATE_MATRIX,) + tuple(f.name for f in RESULT_FIELDS)
                            + tuple(f.name for f in LOOP_FIELDS))
"""Every array a run writes per request: what a streamed window carries to the next."""

RECORD_INPUTS: tuple[str, ...] = (tuple(f.name for f in TRACE_FIELDS
                                        if f.name != "output_segment_id")
                                  + tuple(f.name for f in RESULT_FIELDS))
"""What [`build_records`][prefixshield.simulator.records.build_records] reads per request."""


def allocate(target: Any, n: int, fields: tuple[Field, ...] = RESULT_FIELDS) -> None:
    """Set ``target``'s arrays of ``fields`` for ``n`` requests, each at its initial value."""
    for f in fields:
        setattr(target, f.name, f.allocate(n))


def state_matrix(prompt_tokens: np.ndarray, output_tokens: np.ndarray) -> np.ndarray:
    """The batched step's counters before a run: prompt and output lengths known, nothing
    computed, not admitted (``ADMISSION`` -1)."""
    state = np.zeros((prompt_tokens.shape[0], bk.NUM_FIELDS), dtype=np.int64)
    state[:, bk.PROMPT] = prompt_tokens
    state[:, bk.OUTPUT_TOTAL] = output_tokens
    state[:, bk.ADMISSION] = -1
    return state


class RowSlice:
    """Rows ``lo .. hi-1`` of ``source``'s per-request arrays (views; ``names``, by default
    `RECORD_INPUTS`) with its ``groups`` and ``contracts``: what the records builder
    reads of part of a run."""

    def __init__(self, source: Any, lo: int, hi: int,
                 names: tuple[str, ...] = RECORD_INPUTS) -> None:
        self.groups, self.contracts = source.groups, source.contracts
        for name in names:
            setattr(self, name, getattr(source, name)[lo:hi])
