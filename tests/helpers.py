"""Small builders shared by the tests (vLLM's test style: make_request, make_pool)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import strategies as st

from prefixshield.policies import make_policy
from prefixshield.simulator.blockpool import BlockPool
from prefixshield.simulator.costmodel import CostModel
from prefixshield.simulator.kvcache import KVCacheManager, Sequence, make_sequence
from prefixshield.traces.schema import Trace


def make_manager(num_blocks: int = 10, block_size: int = 16, compat: str = "current",
                 policy: str = "lru", num_groups: int = 4) -> KVCacheManager:
    """A cache manager over a fresh pool and policy."""
    pool = BlockPool(num_blocks, make_policy(policy, num_blocks, vllm_compat=compat), num_groups)
    return KVCacheManager(pool, block_size)


def make_request(request_id: int, token_ids, group: int = 0, block_size: int = 16,
                 num_prompt_tokens: int | None = None) -> Sequence:
    """A sequence whose prompt is ``token_ids`` (all of them unless ``num_prompt_tokens``)."""
    toks = np.asarray(token_ids, dtype=np.int64)
    n = toks.shape[0] if num_prompt_tokens is None else num_prompt_tokens
    return make_sequence(request_id, group, 0, 0, toks, n, block_size, hash_seed=0)


def schedule(manager: KVCacheManager, seq: Sequence, now: float = 0.0) -> tuple[np.ndarray, int]:
    """Look up and allocate the whole prompt (as one admission); returns (hit blocks, cached tokens).

    Marks the prompt computed, like the engine does at the end of the step."""
    hits, cached = manager.get_computed_blocks(seq)
    ok = manager.allocate_slots(seq, seq.num_tokens - cached, now, hits)
    assert ok, "allocation unexpectedly failed"
    seq.num_computed_tokens = seq.num_tokens
    return hits, cached


def make_trace(rows: list[dict], seed: int = 0) -> Trace:
    """A validated trace from row dicts; unspecified columns get simple defaults."""
    full = []
    for i, r in enumerate(rows):
        d = {"request_id": i, "arrival_s": 0.0, "group": "g0", "contract": "standard",
             "role": "benign", "prefix_id": 0, "measured": True, "output_tokens": 1,
             "output_segment_id": -1}
        d.update(r)
        d["segment_ids"] = np.asarray(d["segment_ids"], dtype=np.int64)
        d["segment_lengths"] = np.asarray(d["segment_lengths"], dtype=np.int64)
        full.append(d)
    return Trace(pd.DataFrame(full), seed=seed).validate()


def assert_same_run(a, b, steps: bool = True) -> None:
    """Two :class:`~prefixshield.simulator.engine.RunResult` bit-identical (no tolerance
    anywhere): records, occupancy (values and dtypes), eviction matrix, policy stats, creation
    logs (values and dtypes) and, with ``steps``, the step count."""
    assert a.records.equals(b.records), "records differ"
    assert np.array_equal(a.occupancy_t, b.occupancy_t), "occupancy times differ"
    assert np.array_equal(a.occupancy, b.occupancy), "occupancy differs"
    assert a.occupancy.dtype == b.occupancy.dtype and a.occupancy_t.dtype == b.occupancy_t.dtype
    assert np.array_equal(a.evictions, b.evictions), "evictions differ"
    assert a.policy_stats == b.policy_stats, "policy stats differ"
    assert a.creations.keys() == b.creations.keys()
    for k in a.creations:
        assert a.creations[k].dtype == b.creations[k].dtype, f"creations[{k!r}] dtype"
        assert np.array_equal(a.creations[k], b.creations[k]), f"creations[{k!r}] differ"
    if steps:
        assert a.num_steps == b.num_steps, "step counts differ"


def small_trace(name: str, seed: int = 0, **overrides) -> Trace:
    """Workload ``name`` (with parameter ``overrides``) at the shortest measured phase (of a
    few) its generator accepts. An attack workload draws the ``two_group`` population unless
    ``overrides`` name one: these traces serve the engine's equivalence tests, which run every
    policy (a static quota cannot serve the 8-group background population: its 63-block
    shares are smaller than one victim request)."""
    import dataclasses

    from prefixshield.workloads import WORKLOADS, generate

    fields = {f.name for f in dataclasses.fields(WORKLOADS[name].params_type)}
    if "population" in fields:
        overrides.setdefault("population", "two_group")
    for duration_s in (5.0, 10.0, 20.0, 40.0):
        try:
            return generate(name, duration_s=duration_s, seed=seed, **overrides)
        except ValueError:
            continue
    raise AssertionError(f"workload {name!r} does not generate at any short duration")


# (arrival s, shared prefix id, tail tokens / block, output tokens / block, group)
RANDOM_REQUEST = st.tuples(st.floats(0, 0.5), st.integers(0, 3), st.floats(0.05, 2.0),
                           st.floats(0.05, 6.0), st.integers(0, 1))
"""A random small request (the random-trace tests draw lists of them)."""


def random_rows(reqs: list, block_size: int, tied: bool, both_groups: bool = False) -> list:
    """Trace rows of `RANDOM_REQUEST` draws, in arrival order: each request shares
    its prefix id's two blocks and adds its own tail; ``tied`` puts arrivals on a grid of
    1/8 s (with the tests' 1/64 s steps, arrivals fall due exactly when steps end, several at
    once); ``both_groups``: a copy of the last row in the other group when only one appears
    (for configs that name both)."""
    B = block_size
    rows = [dict(arrival_s=round(8 * t) / 8 if tied else t, segment_ids=[p, 100 + i],
                 segment_lengths=[2 * B, max(1, round(n * B))], output_tokens=max(1, round(o * B)),
                 group=f"g{g}", prefix_id=p)
            for i, (t, p, n, o, g) in enumerate(sorted(reqs))]
    if both_groups and {r["group"] for r in rows} != {"g0", "g1"}:
        rows.append(dict(rows[-1], group="g1" if rows[-1]["group"] == "g0" else "g0",
                         segment_ids=[0, 99]))
    return rows


def random_cost(tied: bool) -> CostModel:
    """The random-trace tests' cost: steps of exactly 1/64 s when ``tied``, else a linear
    model whose steps fall anywhere."""
    return (CostModel(1 / 64, 0.0, 0.0, 0.0, 0.0) if tied
            else CostModel(0.01, 0.0005, 0.001, 1e-6, 0.002))

