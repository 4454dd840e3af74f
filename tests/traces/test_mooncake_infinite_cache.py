"""With a cache that never evicts, the simulator's cached tokens follow from Mooncake's
``hash_ids`` alone: a request hits the longest token prefix any earlier request materialized,
block-aligned and capped below its last token (vLLM's rule). The token-weighted hit ratio of an
imported Mooncake sample must equal that direct computation."""

from pathlib import Path

import numpy as np

from prefixshield.experiments.single import RunSpec, run_policies
from prefixshield.simulator.config import EngineConfig
from prefixshield.simulator.costmodel import load_profile
from prefixshield.traces.importers import MOONCAKE_BLOCK_TOKENS, MooncakeImport, import_mooncake

MOONCAKE = Path(__file__).resolve().parent / "fixtures" / "mooncake_synthetic_head1000.jsonl"
"""The first 1,000 requests of Mooncake's FAST'25 sample (fixtures/README.md)."""
BLOCK = 16


def direct_cached_tokens(trace) -> np.ndarray:
    """Cached tokens per request computed from the segments (= hash ids) in arrival order."""
    seen: dict[tuple, int] = {}  # prefix of hash ids -> longest last segment seen after it
    out = np.zeros(len(trace), dtype=np.int64)
    for i, (ids, lens) in enumerate(zip(trace.requests["segment_ids"],
                                        trace.requests["segment_lengths"])):
        ids, lens = [int(x) for x in ids], [int(x) for x in lens]
        common = 0
        for j in range(len(ids)):
            have = seen.get(tuple(ids[:j + 1]), 0)
            common = j * MOONCAKE_BLOCK_TOKENS + min(have, lens[j])
            if have < lens[j]:
                break
        prompt = sum(lens)
        out[i] = min(common, prompt - 1) // BLOCK * BLOCK
        for j in range(len(ids)):
            key = tuple(ids[:j + 1])
            seen[key] = max(seen.get(key, 0), lens[j])
    return out


def test_infinite_cache_token_hit_ratio_equals_the_hash_id_computation():
    # arrivals stretched so that every prompt is computed before the next one arrives
    trace = import_mooncake(MOONCAKE, limit=600, shape=MooncakeImport(time_scale=1000.0))
    total = int(trace.prompt_lengths().sum() + trace.requests["output_tokens"].sum())
    engine = EngineConfig(num_blocks=total // BLOCK + len(trace) + 2, block_size=BLOCK)
    spec = RunSpec(workload="mooncake", policies=("lru",), engine=engine,
                   profile=load_profile("l4-qwen2.5-1.5b"))
    result = run_policies(trace, spec)["lru"]
    rec = result.records.sort_values("request_id")
    assert int(result.evictions.sum()) == 0
    direct = direct_cached_tokens(trace)
    assert np.array_equal(rec["cached_tokens"].to_numpy(), direct)
    prompt = trace.prompt_lengths()
    token_hit = direct.sum() / prompt.sum()
    from prefixshield.simulator.metrics import summarize

    assert summarize(result)["token_hit_ratio"] == token_hit
    assert token_hit > 0  # the sample does share prefixes
