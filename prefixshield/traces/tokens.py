"""Deterministic token ids for prompt segments.

A trace stores each prompt as a list of ``(segment_id, length)``; the token ids of a segment are a
pure function of ``(trace seed, segment_id, position)``, so two requests that share a segment share
its tokens exactly (and hence its block hashes), and the live mode can send the same ids to vLLM.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@njit(cache=True, inline="always")
def splitmix64(x: np.uint64) -> np.uint64:
    """One SplitMix64 output step: a bijective 64-bit mix (Steele et al., 2014)."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@njit(cache=True)
def _fill_segment_tokens(out, start, seed, segment_id, length, vocab_size):
    base = splitmix64(np.uint64(seed) ^ splitmix64(np.uint64(segment_id)))
    for i in range(length):
        out[start + i] = np.int64(splitmix64(base + np.uint64(i)) % np.uint64(vocab_size))


@njit(cache=True)
def _concat_segments(seed, segment_ids, segment_lengths, vocab_size):
    total = 0
    for k in range(segment_lengths.shape[0]):
        total += segment_lengths[k]
    out = np.empty(total, dtype=np.int64)
    pos = 0
    for k in range(segment_ids.shape[0]):
        _fill_segment_tokens(out, pos, seed, segment_ids[k], segment_lengths[k], vocab_size)
        pos += segment_lengths[k]
    return out


def prompt_token_ids(seed: int, segment_ids, segment_lengths, vocab_size: int) -> np.ndarray:
    """Token ids (int64, each in ``[0, vocab_size)``) of a prompt given as segments.

    Args:
        seed: the trace's token seed.
        segment_ids: segment identifiers, in prompt order (non-negative ints).
        segment_lengths: tokens per segment (positive ints), same length as ``segment_ids``.
        vocab_size: exclusive upper bound of the generated ids.
    """
    ids = np.asarray(segment_ids, dtype=np.int64)
    lens = np.asarray(segment_lengths, dtype=np.int64)
    return _concat_segments(np.int64(seed), ids, lens, np.int64(vocab_size))
