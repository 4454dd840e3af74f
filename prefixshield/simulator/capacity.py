"""``C_prefill``: the unique-prefill throughput of a profile for a workload (requests per second).

Measured as in the reference evaluation: 32 requests with distinct prefixes (no reuse possible)
arrive together under LRU, and ``C_prefill = 32 / makespan``. The requests are *shaped like the
workload's*: the same prompt lengths and output-length distribution
(``probe_shapes`` of the workload's params), so that a workload whose requests decode hundreds
of tokens, and hold their blocks while they do, is loaded against what the engine can really
serve, not against one-token prefills. The nominal load ``alpha`` then sets the base arrival rate
to ``alpha * C_prefill``.

Results are cached per (profile cost coefficients, engine config, request shapes) in the process
and on disk (`prefixshield.usercache`, namespace ``c_prefill``), keyed also by the package
version and a fingerprint of the simulator sources the probe runs (so an edited engine never
reads a stale value in a development checkout). A cached value is the float the probe measured,
bit for bit (JSON round-trips floats exactly); an unusable cache directory means measuring.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, replace
from functools import lru_cache
from pathlib import Path

import numpy as np

from prefixshield.policies import make_policy
from prefixshield.scheduling.config import SchedulerConfig
from prefixshield.simulator.config import EngineConfig
from prefixshield.simulator.costmodel import CostModel
from prefixshield.simulator.engine import Engine
from prefixshield.traces.schema import Trace, build_requests

C_PREFILL_REQUESTS = 32


def distinct_prefill_trace(prompt_tokens, output_tokens) -> Trace:
    """Requests at t=0, request i one unique segment of ``prompt_tokens[i]`` tokens decoding
    ``output_tokens[i]`` tokens."""
    prompt = np.asarray(prompt_tokens, dtype=np.int64)
    out = np.asarray(output_tokens, dtype=np.int64)
    n = len(prompt)
    if n == 0 or len(out) != n:
        raise ValueError(f"C_prefill probe needs equal, non-zero numbers of prompt and output "
                         f"lengths, got {n} and {len(out)}")
    df = build_requests({
        "request_id": np.arange(n, dtype=np.int64),
        "arrival_s": np.zeros(n),
        "group": ["probe"] * n,
        "contract": ["standard"] * n,
        "role": ["benign"] * n,
        "prefix_id": np.arange(n, dtype=np.int64),
        "measured": np.ones(n, dtype=bool),
        "output_tokens": out,
        "segment_ids": [np.array([i], dtype=np.int64) for i in range(n)],
        "segment_lengths": [np.array([p], dtype=np.int64) for p in prompt],
        "output_segment_id": np.full(n, -1, dtype=np.int64),
    })
    return Trace(df, seed=0, meta={"generator": "c_prefill_probe"})


_PROBE_SOURCES = ("simulator/engine.py", "simulator/batch.py", "simulator/blockpool.py",
                  "simulator/kvcache.py", "simulator/costmodel.py", "simulator/capacity.py",
                  "simulator/config.py", "simulator/hashing.py", "traces/schema.py",
                  "traces/segments.py", "traces/tokens.py", "policies/base.py",
                  "policies/lru.py", "policies/kernels/linkedlist.py")
"""Package files whose code decides the probe's makespan (their bytes enter the disk key)."""


@lru_cache(maxsize=1)
def source_fingerprint() -> str:
    """sha256 over `_PROBE_SOURCES` (a missing file counts as empty)."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for rel in _PROBE_SOURCES:
        h.update(rel.encode())
        try:
            h.update((root / rel).read_bytes())
        except OSError:
            pass
    return h.hexdigest()


def measure_c_prefill(cost: CostModel, config: EngineConfig, prompt_tokens,
                      output_tokens) -> float:
    """Requests/s at which this profile and engine serve the distinct-prefix probe requests
    (``prompt_tokens[i]``, ``output_tokens[i]``; LRU): ``len / makespan``. Cached in the process
    and on disk (module docstring).

    The engine's capacity, not a tenant's: the probe runs under vLLM's FCFS without per-tenant
    limits whatever ``config.scheduler`` says, so a workload's arrival rates (alpha x
    C_prefill) -- and therefore its trace -- are the same under every scheduler."""
    return _measure(cost, replace(config, check_invariants=False, scheduler=SchedulerConfig()),
                   tuple(int(x) for x in prompt_tokens), tuple(int(x) for x in output_tokens))


def disk_key(cost: CostModel, config: EngineConfig, prompt_tokens: tuple[int, ...],
             output_tokens: tuple[int, ...]) -> dict:
    """The on-disk cache key of one probe (JSON-able): cost coefficients, engine config,
    request shapes and the source fingerprint (the package version is stored beside it)."""
    return {"cost": asdict(cost), "engine": config.to_dict(), "prompt_tokens": prompt_tokens,
            "output_tokens": output_tokens, "sources": source_fingerprint()}


@lru_cache(maxsize=256)
def _measure(cost: CostModel, config: EngineConfig, prompt_tokens: tuple[int, ...],
             output_tokens: tuple[int, ...]) -> float:
    """The in-process cache over the disk cache over `_probe`."""
    from prefixshield import __version__, usercache

    key = disk_key(cost, config, prompt_tokens, output_tokens)
    hit = usercache.load("c_prefill", key, __version__)
    # json reads ``Infinity`` and ``NaN`` as floats: an entry that is not a finite positive
    # number (a hand-edited or foreign file) is a miss, measured again and overwritten.
    if isinstance(hit, float) and math.isfinite(hit) and hit > 0:
        return hit
    value = _probe(cost, config, prompt_tokens, output_tokens)
    usercache.store("c_prefill", key, __version__, value)
    return value


def _probe(cost: CostModel, config: EngineConfig, prompt_tokens: tuple[int, ...],
           output_tokens: tuple[int, ...]) -> float:
    """Run the probe (no cache)."""
    trace = distinct_prefill_trace(prompt_tokens, output_tokens)
    policy = make_policy("lru", config.num_blocks, vllm_compat=config.vllm_compat)
    result = Engine(trace, policy, cost, config).run()
    makespan = float(np.nanmax(result.records["e2e_s"]))
    if not makespan > 0:
        raise ValueError(f"C_prefill probe finished in {makespan} s: the profile's step time "
                         f"must be > 0")
    return len(prompt_tokens) / makespan
