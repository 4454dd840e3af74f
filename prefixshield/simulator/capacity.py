"""``C_prefill``: the unique-prefill throughput of an engine profile (requests per second).

Measured, as in the reference evaluation, by simulating 32 requests with distinct 1,536-token
prefixes (no reuse possible) arriving together under LRU, and dividing 32 by the makespan. The
nominal load ``alpha`` of a workload then sets its base arrival rate to ``alpha * C_prefill``.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

import numpy as np

from prefixshield.policies import make_policy
from prefixshield.simulator.config import EngineConfig
from prefixshield.simulator.costmodel import CostModel
from prefixshield.simulator.engine import Engine
from prefixshield.traces.schema import Trace, build_requests

C_PREFILL_REQUESTS = 32
C_PREFILL_PROMPT_TOKENS = 1536


def distinct_prefill_trace(num_requests: int = C_PREFILL_REQUESTS,
                           prompt_tokens: int = C_PREFILL_PROMPT_TOKENS) -> Trace:
    """``num_requests`` requests at t=0, each one unique segment, one output token."""
    n = num_requests
    df = build_requests({
        "request_id": np.arange(n, dtype=np.int64),
        "arrival_s": np.zeros(n),
        "group": ["probe"] * n,
        "contract": ["standard"] * n,
        "role": ["benign"] * n,
        "prefix_id": np.arange(n, dtype=np.int64),
        "measured": np.ones(n, dtype=bool),
        "output_tokens": np.ones(n, dtype=np.int64),
        "segment_ids": [np.array([i], dtype=np.int64) for i in range(n)],
        "segment_lengths": [np.array([prompt_tokens], dtype=np.int64) for _ in range(n)],
        "output_segment_id": np.full(n, -1, dtype=np.int64),
    })
    return Trace(df, seed=0, meta={"generator": "c_prefill_probe"})


@lru_cache(maxsize=64)
def measure_c_prefill(cost: CostModel, config: EngineConfig) -> float:
    """Requests/s of unique 1,536-token prefills on this profile and engine (LRU, 32 requests)."""
    cfg = replace(config, check_invariants=False)
    trace = distinct_prefill_trace()
    engine = Engine(trace, make_policy("lru", cfg.num_blocks, vllm_compat=cfg.vllm_compat), cost, cfg)
    result = engine.run()
    makespan = float(np.nanmax(result.records["e2e_s"]))
    return C_PREFILL_REQUESTS / makespan
