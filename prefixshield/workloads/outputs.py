"""Output lengths (decode tokens) of synthetic requests: from data by default, never one.

A request decodes ``output_tokens`` tokens and keeps its KV blocks pinned while it does; how long
and how many blocks it pins decides whether a replacement policy has anything left to reclaim
(the reference ran real requests on a real engine). Synthetic workloads draw output lengths from a
documented distribution, ``output_dist``:

* ``azure_conv`` (the default): ``GeneratedTokens`` of Azure's 2023 LLM inference
  *conversation* trace: 19,366 requests of a production chat service, counted with the
  service's own tokenizer; mean 211.1, median 129, range 7-1,000 tokens (CC-BY-4.0; histogram
  in ``traces/data/azure_conv_generated_tokens.csv``, see ``traces/data/PROVENANCE.md``).
* ``sharegpt``: the assistant turns of the packaged ShareGPT turn table (1,680 turns, mean
  ~368 tokens; lengths estimated as characters / 4).

``output_tokens = (lo, hi)`` replaces the distribution by a stated range, uniform inclusive
(``(1, 1)`` is the one-output-token prefill study); ``max_output_tokens`` clips the data
distribution (vLLM's ``max_tokens``).

Why Azure's conversation trace is the default: it is the one public source here of output lengths
that a production chat service counted with its own tokenizer, which is what the victim and
attacker tenants of the attack workloads model; the ShareGPT lengths are character estimates.
Its whole distribution is used, not a subset chosen per workload. The prefix workloads clip it
at ``max_output_tokens = 8`` by default, fitted to the request rate the reference's LRU sustained
at 60% load (``PrefixParams``; docs/fidelity.md), so their requests decode 8 tokens (7 for the
0.005% of Azure's outputs that are shorter).
"""

from __future__ import annotations

import functools
from importlib import resources

import numpy as np
import pandas as pd

from prefixshield.traces.shipped import AZURE_CONV_FILE


OUTPUT_DISTRIBUTIONS = ("azure_conv", "sharegpt")
"""Names accepted by ``output_dist``."""

DEFAULT_OUTPUT_DIST = "azure_conv"


@functools.lru_cache(maxsize=None)
def _empirical(dist: str) -> tuple[np.ndarray, np.ndarray]:
    """(distinct lengths ascending, probabilities) of an empirical distribution."""
    if dist == "azure_conv":
        raw = resources.files("prefixshield.traces").joinpath("data", AZURE_CONV_FILE)
        with raw.open("r") as f:
            table = pd.read_csv(f)
        values = table["generated_tokens"].to_numpy(np.int64)
        counts = table["count"].to_numpy(np.float64)
    else:
        from prefixshield.traces.conversations import sharegpt_turns

        values, counts = np.unique(np.concatenate([a for _, a in sharegpt_turns()]),
                                   return_counts=True)
        counts = counts.astype(np.float64)
    p = counts / counts.sum()
    values.flags.writeable = False
    p.flags.writeable = False
    return values, p


def check_outputs(dist: str, output_range: tuple[int, int] | None,
                  max_tokens: int | None) -> None:
    """Raise ValueError naming the field unless the output-length settings are valid."""
    if dist not in OUTPUT_DISTRIBUTIONS:
        raise ValueError(f"output_dist must be one of {', '.join(OUTPUT_DISTRIBUTIONS)}, "
                         f"got {dist!r}")
    if output_range is not None and not (len(output_range) == 2
                                         and 1 <= output_range[0] <= output_range[1]):
        raise ValueError(f"output_tokens must be (min, max) with 1 <= min <= max, "
                         f"got {output_range!r}")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_output_tokens must be >= 1, got {max_tokens}")


def output_support(dist: str, output_range: tuple[int, int] | None,
                   max_tokens: int | None) -> tuple[np.ndarray, np.ndarray]:
    """(lengths in tokens, probabilities) of the output-length distribution (exact)."""
    if output_range is not None:
        values = np.arange(int(output_range[0]), int(output_range[1]) + 1, dtype=np.int64)
        return values, np.full(values.shape[0], 1.0 / values.shape[0])
    values, p = _empirical(dist)
    return (values if max_tokens is None else np.minimum(values, max_tokens)), p


def draw_output_tokens(rng: np.random.Generator, dist: str, output_range: tuple[int, int] | None,
                       max_tokens: int | None, n: int) -> np.ndarray:
    """``n`` output lengths (int64 tokens); uses ``rng`` only, so a seed fixes them."""
    if output_range is not None:
        return rng.integers(int(output_range[0]), int(output_range[1]) + 1, size=n,
                            dtype=np.int64)
    values, p = output_support(dist, None, max_tokens)
    return rng.choice(values, size=n, p=p).astype(np.int64)


def describe_outputs(dist: str, output_range: tuple[int, int] | None,
                     max_tokens: int | None) -> str:
    """One phrase for headers, e.g. ``azure_conv outputs (mean 211 tokens)``."""
    if output_range is not None:
        return f"uniform {output_range[0]}-{output_range[1]} output tokens"
    values, p = output_support(dist, None, max_tokens)
    clip = "" if max_tokens is None else f", at most {max_tokens}"
    return f"{dist} outputs (mean {float(values @ p):.0f} tokens{clip})"
