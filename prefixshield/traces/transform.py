"""Transformations of an imported trace that keep it a valid trace.

`limit_request_tokens` makes a real trace fit an engine: a request whose prompt plus output
needs more KV cache than the pool holds can never run on it (vLLM refuses such a prompt for a
model whose ``max_model_len`` it exceeds), so it is either *dropped* or its prompt is *clipped*
to its leading tokens. Clipping keeps the prompt's head: segments are prefix-consistent (the
token ids of a shortened segment are a prefix of the full one), so two clipped prompts that
shared a prefix still share it, and the prefix structure the cache sees is preserved; what is
lost is the tail beyond the limit. Both are recorded in ``meta["limit"]``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from prefixshield.traces.schema import Trace

MODES = ("drop", "clip")


def limit_request_tokens(trace: Trace, max_prompt_tokens: int, mode: str = "drop") -> Trace:
    """``trace`` with every prompt at most ``max_prompt_tokens`` tokens.

    Args:
        trace: a validated trace.
        max_prompt_tokens: the limit (tokens, >= 1).
        mode: ``drop`` removes the longer requests; ``clip`` keeps their first
            ``max_prompt_tokens`` prompt tokens (output length unchanged).

    Returns:
        A new validated trace; request ids are kept (dropping leaves gaps), ``meta["limit"]``
        says what was done and to how many requests.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if not (isinstance(max_prompt_tokens, int) and max_prompt_tokens >= 1):
        raise ValueError(f"max_prompt_tokens must be an integer >= 1, got {max_prompt_tokens!r}")
    lengths = trace.prompt_lengths()
    over = lengths > max_prompt_tokens
    df = trace.requests
    if mode == "drop":
        out = df[~over].reset_index(drop=True)
    else:
        out = df.copy()
        ids, lens = list(out["segment_ids"]), list(out["segment_lengths"])
        for i in np.flatnonzero(over):
            seg_lens = np.asarray(lens[i], dtype=np.int64)
            ends = np.cumsum(seg_lens)
            keep = int(np.searchsorted(ends, max_prompt_tokens, side="left")) + 1
            new_lens = seg_lens[:keep].copy()
            new_lens[-1] -= int(ends[keep - 1] - max_prompt_tokens)
            ids[i] = np.asarray(ids[i], dtype=np.int64)[:keep]
            lens[i] = new_lens
        out["segment_ids"] = ids
        out["segment_lengths"] = lens
    meta = {**trace.meta, "limit": {"max_prompt_tokens": max_prompt_tokens, "mode": mode,
                                    "requests_affected": int(over.sum()),
                                    "requests_before": int(len(df))}}
    result = dataclasses.replace(trace, requests=out, meta=meta)
    return result.validate("limit_request_tokens")


def scale_to_rate(trace: Trace, rate_req_per_s: float) -> tuple[Trace, float]:
    """``trace`` with every arrival time multiplied by one factor so that its mean request rate
    (``(n - 1) / span`` over all requests) is ``rate_req_per_s``; returns the trace and the
    factor (> 1 slows the trace down).

    What it preserves: the order of arrivals, their relative spacing (bursts stay bursts), the
    group mix, every request's shape and the prefix structure, so reuse distances counted in
    requests are unchanged. What it changes: every time gap, hence reuse distances in seconds,
    the queueing the engine sees, and the warm-up boundary (``measured`` flags are kept: the same
    requests are judged).
    """
    if not (rate_req_per_s > 0 and np.isfinite(rate_req_per_s)):
        raise ValueError(f"target rate must be a finite number > 0 requests/s, got "
                         f"{rate_req_per_s}")
    arr = trace.requests["arrival_s"].to_numpy(np.float64)
    span = float(arr.max() - arr.min()) if len(arr) else 0.0
    if len(arr) < 2 or span <= 0:
        raise ValueError("a trace whose requests all arrive at once has no rate to scale")
    factor = ((len(arr) - 1) / span) / rate_req_per_s
    df = trace.requests.copy()
    df["arrival_s"] = (arr - arr.min()) * factor
    meta = {**trace.meta, "scaled": {"factor": factor, "rate_req_per_s": rate_req_per_s}}
    return dataclasses.replace(trace, requests=df, meta=meta).validate("scale_to_rate"), factor


def probe_shapes_of(trace: Trace, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(prompt tokens, output tokens) of ``n`` requests of ``trace`` taken at evenly spaced
    ranks (deterministic): the request shapes a ``C_prefill`` probe for this trace uses."""
    if len(trace) == 0:
        raise ValueError("an empty trace has no request shapes")
    idx = np.linspace(0, len(trace) - 1, n).round().astype(np.int64)
    return (trace.prompt_lengths()[idx],
            trace.requests["output_tokens"].to_numpy(np.int64)[idx])
