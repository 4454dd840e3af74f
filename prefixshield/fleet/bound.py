"""The infinite-cache upper bound of a fleet run: the hits every request would get if each
replica's pool never evicted, under the same routing and the same admission times.

A request's cached prefix at its first admission holds only blocks computed on its replica by
requests admitted no later than it (vLLM caches a block when the step that computes it is
scheduled; blocks of a request admitted in the same step count, whichever of the two the
scheduler took first). So its bound is the longest leading run of its prompt's blocks (capped
at ``(prompt - 1) // block_size``, as vLLM's lookup is) found among the prompt and output
blocks of the *other* requests on its replica first admitted at or before its own admission.
It is at least the hits the run got, request by request (tested), and reaches them when
nothing that would hit was evicted. Requests never admitted have no bound (NaN).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd


def bound_cached_tokens(records: pd.DataFrame, hashes: np.ndarray, offsets: np.ndarray,
                        block_size: int) -> np.ndarray:
    """Infinite-cache cached tokens of every row of ``records`` (a fleet's merged records in
    trace order, with ``replica``, ``arrival_s``, ``queue_s``, ``prompt_tokens``), float64,
    NaN for requests never admitted."""
    n = len(records)
    out = np.full(n, np.nan)
    admitted = records["arrival_s"].to_numpy() + records["queue_s"].to_numpy()
    replica = records["replica"].to_numpy()
    prompt = records["prompt_tokens"].to_numpy()
    B = block_size
    for r in np.unique(replica):
        rows = np.flatnonzero((replica == r) & ~np.isnan(admitted))
        rows = rows[np.argsort(admitted[rows], kind="stable")]
        seen: set[int] = set()
        i = 0
        while i < rows.shape[0]:
            j = i
            while j < rows.shape[0] and admitted[rows[j]] == admitted[rows[i]]:
                j += 1
            batch = rows[i:j]
            blocks = {int(k): set(hashes[offsets[k]:offsets[k + 1]].tolist()) for k in batch}
            together = Counter(h for b in blocks.values() for h in b)
            for k in batch:
                k = int(k)
                own = blocks[k]
                cap = (int(prompt[k]) - 1) // B
                hit = 0
                for h in hashes[offsets[k]:offsets[k] + cap].tolist():
                    if h in seen or together[h] - (h in own) > 0:
                        hit += 1
                    else:
                        break
                out[k] = hit * B
            for b in blocks.values():
                seen |= b
            i = j
    return out
