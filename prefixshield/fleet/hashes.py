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
    the :class:`RequestInfo` routers read. A request's output tokens are salted by its row in
    ``trace`` (the whole trace's; see :mod:`prefixshield.fleet.split` for the replicas')."""
    df = trace.requests
    groups = trace.group_names()
    group_id = _index_of(df["group"], groups)
    arrival_s = df["arrival_s"].to_numpy(np.float64)
    sched = make_scheduler(config.scheduler, groups, arrival_s, group_id)
    out = capped_outputs(sched.limits, group_id, df["output_tokens"].to_numpy(np.int64))
    n = len(df)
    segments = trace.segments()  # the flat form the engine's kernels read
    seg_off, seg_lens = segments.offsets, segments.lengths
    prompt = trace.prompt_lengths()
    B = config.block_size
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum((prompt + out) // B, out=offsets[1:])
    hashes = np.empty(int(offsets[-1]), dtype=np.uint64)
    if n:
        fz.build_hashes(np.int64(trace.seed), np.int64(trace.vocab_size),
                        segments.ids, seg_lens, seg_off,
                        df["output_segment_id"].to_numpy(np.int64), out,
                        np.int64(trace.seed ^ OUTPUT_SEED_SALT), group_id, np.int64(B),
                        np.int64(config.hash_seed), offsets, hashes, np.int64(0), np.int64(n),
                        np.int64(0))
    info = RequestInfo(groups, group_id, df["prefix_id"].to_numpy(np.int64), prompt, out, B,
                       hashes=lambda i: hashes[offsets[i]:offsets[i + 1]])
    return hashes, offsets, info
