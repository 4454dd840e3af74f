"""Per-request records of a finished run, built column by column into their final buffers.

[`build_records`][prefixshield.simulator.records.build_records] is what `Engine.records`
returns: one row per request, the same columns, dtypes and values as building a
``pd.DataFrame`` from a dict of per-column arrays (tested equal, and equal Parquet bytes), built
with less memory traffic, which at 10^6 requests is most of its cost:

* every column is written once, straight into one buffer per dtype (int64, float64, object,
  bool; rows of a 2-D array), so no temporary column is made first and copied after;
* the frame wraps those rows as they are (``copy=False``): pandas does not stack the columns
  into blocks again (its dict constructor copies every column once more). The frame is
  therefore not consolidated (one block per column); pandas consolidates it by itself where an
  operation needs that, and values, dtypes and written files do not depend on it;
* ``group`` and ``contract`` are the engine's integer ids (``group_id``, ``contract_id``) taken
  from arrays of the names: ``names[id]`` is exactly the string ``astype(str)`` gives for that
  row (the ids are positions of ``str(cell)`` in the names), one pointer copy a row instead of a
  string conversion a row. ``role`` has no ids in the engine and is converted as before.

Every column is a copy: the records share no memory with the trace or the engine (as before),
so changing one in place changes nothing else.

Where the rest of the time goes at 10^6 requests: fresh memory. Buffers this large are mapped
from the kernel at each allocation, and the kernel zeroes each new page on its first write
(``clear_page_erms``: half of ``Engine.run``'s time at 10^6 requests under ``perf``, 6% at
10^5, where the allocator reuses memory it already holds); see `prefixshield.bench.scale`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

RECORD_COLUMNS: tuple[tuple[str, str], ...] = (
    ("request_id", "int64"),
    ("arrival_s", "float64"),
    ("group", "object"),
    ("contract", "object"),
    ("role", "object"),
    ("prefix_id", "int64"),
    ("measured", "bool"),
    ("prompt_tokens", "int64"),
    ("cached_tokens", "int64"),
    ("new_tokens", "int64"),
    ("new_blocks", "int64"),
    ("output_tokens", "int64"),
    ("hit_fraction", "float64"),
    ("ttft_s", "float64"),
    ("e2e_s", "float64"),
    ("preemptions", "int64"),
    ("queue_s", "float64"),
    ("arrival_cached_tokens", "int64"),
    ("arrival_hit_fraction", "float64"),
    ("block_s", "float64"),
)
"""The records' columns in order, with their dtypes (``object``: Python ``str`` cells).

``queue_s``: seconds from arrival to first admission (queueing before the cache is read);
``arrival_cached_tokens`` / ``arrival_hit_fraction``: the prefix cached when the request
arrived, beside ``cached_tokens`` / ``hit_fraction`` when it was admitted -- the difference is
what the cache lost while the request queued; ``block_s``: KV block-seconds its block table
held over its life (what the request consumed of the cache)."""


def _names_of(names: list[str], ids: np.ndarray, out: np.ndarray) -> None:
    """``out[i] = names[ids[i]]`` (``out``: an object row)."""
    # mode="clip": the ids are positions in names by construction, and "raise" would buffer
    np.take(np.asarray(names, dtype=object), ids, out=out, mode="clip")


def build_records(engine: Any) -> pd.DataFrame:
    """Per-request records of ``engine`` (after its run): arrival, identity, tokens, new blocks,
    TTFT, latency, preemptions; columns and dtypes `RECORD_COLUMNS`.

    Args:
        engine: a finished [`Engine`][prefixshield.simulator.engine.Engine], or any object with
            the same plain data (this module does not import the engine, which imports it):
            the per-request arrays [`RECORD_INPUTS`][prefixshield.simulator.requests.RECORD_INPUTS]
            (declared in `prefixshield.simulator.requests`, under those names; a streamed
            run's window, a [`RowSlice`][prefixshield.simulator.requests.RowSlice] of one) and the
            name lists ``groups`` and ``contracts``.

    Returns:
        The same frame as ``pd.DataFrame({...})`` over those arrays (see the module docstring:
        equal values and dtypes; its columns are rows of four buffers, one per dtype).
    """
    n = len(engine.arrival_s)
    ints = np.empty((9, n), dtype=np.int64)
    floats = np.empty((7, n), dtype=np.float64)
    strings = np.empty((3, n), dtype=object)
    flags = np.empty((1, n), dtype=np.bool_)
    (request_id, prefix_id, prompt, cached, new_tokens, new_blocks, output,
     preemptions, arrival_cached) = ints
    arrival, hit_fraction, ttft, e2e, queue, arrival_hit, block_s = floats
    group, contract, role = strings
    measured = flags[0]
    np.copyto(request_id, engine.request_id)
    np.copyto(arrival, engine.arrival_s)
    _names_of(engine.groups, engine.group_id, group)
    _names_of(engine.contracts, engine.contract_id, contract)
    role[:] = engine.role
    np.copyto(prefix_id, engine.prefix_id)
    np.copyto(measured, engine.measured)
    np.copyto(prompt, engine.prompt_tokens)
    np.copyto(cached, engine.cached_tokens)
    np.subtract(engine.prompt_tokens, engine.cached_tokens, out=new_tokens)
    np.copyto(new_blocks, engine.num_new_blocks)
    np.copyto(output, engine.output_tokens)
    np.divide(engine.cached_tokens, engine.prompt_tokens, out=hit_fraction)
    np.subtract(engine.first_token_s, engine.arrival_s, out=ttft)
    np.subtract(engine.finish_s, engine.arrival_s, out=e2e)
    np.copyto(preemptions, engine.num_preemptions)
    np.subtract(engine.admitted_s, engine.arrival_s, out=queue)
    np.copyto(arrival_cached, engine.arrival_cached_tokens)
    np.divide(engine.arrival_cached_tokens, engine.prompt_tokens, out=arrival_hit)
    np.copyto(block_s, engine.block_s)
    return pd.DataFrame({
        "request_id": request_id,
        "arrival_s": arrival,
        "group": group,
        "contract": contract,
        "role": role,
        "prefix_id": prefix_id,
        "measured": measured,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "new_tokens": new_tokens,
        "new_blocks": new_blocks,
        "output_tokens": output,
        "hit_fraction": hit_fraction,
        "ttft_s": ttft,
        "e2e_s": e2e,
        "preemptions": preemptions,
        "queue_s": queue,
        "arrival_cached_tokens": arrival_cached,
        "arrival_hit_fraction": arrival_hit,
        "block_s": block_s,
    }, copy=False)
