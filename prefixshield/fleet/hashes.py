"""Every request's block hashes, as the engine computes them, for routers and the bound."""

from __future__ import annotations

import numpy as np

from prefixshield.fleet.routers.base import RequestInfo
from prefixshield.scheduling.config import capped_outputs
from prefixshield.scheduling.registry import make_scheduler
from prefixshield.simulator import fused as fz
from prefixshield.simulator.config import EngineConfig
from prefixshield.simulator.engine import OUTPUT_SEED_SALT, _index_of
from prefixshield.traces.schema import Trace


def trace_hashes(trace: Trace, config: EngineConfig) -> tuple[np.ndarray, np.ndarray,
                                                              RequestInfo]:
    """Full-block hashes of every request's prompt then output (the engine's, with its
    scheduler's output caps), their offsets (request i's at ``offsets[i]:offsets[i+1]``) and
    the `RequestInfo` routers read. A request's output tokens are salted by its row in
    ``trace`` (the whole trace's; see `prefixshield.fleet.split` for the replicas').
    The info's content hashes (the same chain without the tenant salt) are built on first
    use."""
    df = trace.requests
    groups = trace.group_names()
    group_id = _index_of(df["group"], groups)
    arrival_s = df["arrival_s"].to_numpy(np.float64)
    sched = make_scheduler(config.scheduler, groups, arrival_s, group_id)
    out = capped_outputs(sched.limits, group_id, df["output_tokens"].to_numpy(np.int64))
    n = len(df)
    segments = trace.segments()  # the flat form the engine's kernels read
    prompt = trace.prompt_lengths()
    B = config.block_size
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum((prompt + out) // B, out=offsets[1:])

    def build(groups_of_rows: np.ndarray) -> np.ndarray:
        hashes = np.empty(int(offsets[-1]), dtype=np.uint64)
        if n:
            rows = (segments.ids, segments.lengths, segments.offsets,
                    df["output_segment_id"].to_numpy(np.int64), out, groups_of_rows)
            fz.build_hashes(np.int64(trace.seed), np.int64(trace.vocab_size),
                            np.int64(trace.seed ^ OUTPUT_SEED_SALT), np.int64(config.hash_seed),
                            rows, np.int64(B), offsets, hashes, np.int64(0), np.int64(n),
                            np.int64(0))
        return hashes

    hashes = build(group_id)
    content: list[np.ndarray] = []  # built on first use: only content-matching routers read it

    def flat_content() -> np.ndarray:
        if not content:
            # every row hashed as group 0: the tenant salt left out, the content kept
            content.append(build(np.zeros(n, dtype=group_id.dtype)))
        return content[0]

    def content_hashes(i: int) -> np.ndarray:
        return flat_content()[offsets[i]:offsets[i + 1]]

    info = RequestInfo(groups, group_id, df["prefix_id"].to_numpy(np.int64), prompt, out, B,
                       hashes=lambda i: hashes[offsets[i]:offsets[i + 1]],
                       content_hashes=content_hashes, flat_content=flat_content)
    return hashes, offsets, info
