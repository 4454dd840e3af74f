"""The batched engine step against the step-by-step one (its oracle): bit-identical runs.

``Engine(..., batched=False)`` sends every running request through ``allocate_slots`` every
step; the default batched step does the per-request work in numba kernels over a
struct-of-arrays batch and calls the cache manager only for requests that open or fill a block,
finish, are admitted or preempted. Every observable result must be the same bit for bit:
records (TTFT and latency floats included), occupancy series, eviction matrix, policy state,
creation log and step count, for every policy and both compat modes.

With LRU the default engine runs the fused event loop (``simulator/fused.py``) rather than the
per-step batched path; ``test_fused_loop.py`` holds all three (oracle, per-step, fused) equal.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st

from helpers import assert_same_run as same_run, make_trace, small_trace
from prefixshield.policies import POLICIES, make_policy
from prefixshield.simulator.config import EngineConfig
from prefixshield.simulator.costmodel import CostModel, load_profile
from prefixshield.simulator.engine import Engine, EngineError
from prefixshield.workloads import WORKLOADS, generate

ALL_POLICIES = sorted(POLICIES)
COMPATS = ("0.10", "current")
PROFILE_COST = load_profile("l4-qwen2.5-1.5b").cost


def assert_same_run(a, b) -> None:
    """Bit-identical results, event counts included (:func:`helpers.assert_same_run`)."""
    same_run(a, b)
    assert a.num_events == b.num_events, "event counts differ"


def both_paths(trace, policy: str, config: EngineConfig, cost: CostModel = PROFILE_COST,
               coalesce: bool = True):
    """(step-by-step result, batched result), or None if the trace cannot run (then it must
    fail the same way on both paths)."""
    results, errors = [], []
    for batched in (False, True):
        try:
            engine = Engine(trace, make_policy(policy, config.num_blocks, config.vllm_compat),
                            cost, config, coalesce_decode=coalesce, batched=batched)
            results.append(engine.run())
        except EngineError as e:
            errors.append(str(e))
    if errors:
        assert len(errors) == 2 and errors[0] == errors[1], errors
        return None
    return results[0], results[1]


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
@pytest.mark.parametrize("compat", COMPATS)
def test_every_workload_runs_bit_identical_on_both_paths(workload, compat):
    trace = small_trace(workload, seed=1)
    for policy in ALL_POLICIES:
        # 512 blocks (the default), and a pool small enough to preempt and evict.
        for num_blocks, check in ((512, False), (160, True)):
            config = EngineConfig(num_blocks=num_blocks, vllm_compat=compat,
                                  check_invariants=check)
            pair = both_paths(trace, policy, config)
            if pair is not None:
                assert_same_run(*pair)


def test_the_workload_runs_exercise_preemption_and_eviction():
    # Guard for the test above: its small pool must reach the paths a batched step could get
    # wrong (preemption mid-batch, evictions), or it proves little.
    preemptions = evictions = 0
    for workload in sorted(WORKLOADS):
        trace = small_trace(workload, seed=1)
        config = EngineConfig(num_blocks=160)
        pair = both_paths(trace, "lru", config)
        if pair is not None:
            preemptions += int(pair[1].records["preemptions"].sum())
            evictions += int(pair[1].evictions.sum())
    assert preemptions > 0 and evictions > 0


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_one_touch_at_4096_blocks_with_short_outputs_is_bit_identical(policy):
    # The benchmark's setting (shorter): many requests decoding at once, all four policies.
    trace = generate("one_touch", duration_s=20.0, seed=2, num_blocks=4096,
                     output_tokens=(16, 64))
    for compat in COMPATS:
        pair = both_paths(trace, policy, EngineConfig(num_blocks=4096, vllm_compat=compat))
        assert pair is not None
        assert_same_run(*pair)


# (arrival s, shared prefix id, tail tokens / block, output tokens / block, group)
request = st.tuples(st.floats(0, 0.5), st.integers(0, 3), st.floats(0.05, 2.0),
                    st.floats(0.05, 6.0), st.integers(0, 1))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reqs=st.lists(request, min_size=1, max_size=14),
       policy=st.sampled_from(ALL_POLICIES), compat=st.sampled_from(COMPATS),
       num_blocks=st.integers(12, 32), block_size=st.sampled_from([4, 16]),
       max_tokens=st.sampled_from([24, 64, 8192]), max_seqs=st.sampled_from([2, 3, 256]),
       coalesce=st.booleans(), check=st.booleans())
def test_random_small_traces_run_bit_identical_on_both_paths(reqs, policy, compat, num_blocks,
                                                             block_size, max_tokens, max_seqs,
                                                             coalesce, check):
    # Shared two-block prefixes (p) in two groups, unique tails, outputs of up to six blocks,
    # in pools of 12-32 blocks (preemption, evictions, head-of-line blocking), small token
    # budgets (chunked prefill, the budget running out mid-batch) and small max_num_seqs.
    reqs = sorted(reqs)
    B = block_size
    rows = [dict(arrival_s=t, segment_ids=[p, 100 + i],
                 segment_lengths=[2 * B, max(1, round(n * B))], output_tokens=max(1, round(o * B)),
                 group=f"g{g}", prefix_id=p)
            for i, (t, p, n, o, g) in enumerate(reqs)]
    config = EngineConfig(num_blocks=num_blocks, block_size=block_size, vllm_compat=compat,
                          max_num_batched_tokens=max_tokens, max_num_seqs=max_seqs,
                          check_invariants=check)
    cost = CostModel(0.01, 0.0005, 0.001, 1e-6, 0.002)
    pair = both_paths(make_trace(rows, seed=len(reqs)), policy, config, cost, coalesce)
    if pair is None:
        event("cannot run (same error on both paths)")
        return
    assert_same_run(*pair)
    event(f"preemptions: {'yes' if pair[1].records['preemptions'].sum() else 'no'}")
    event(f"evictions: {'yes' if pair[1].evictions.sum() else 'no'}")


def test_preemption_in_the_middle_of_a_decoding_batch_is_bit_identical():
    # Three requests decode long outputs in a 12-block pool: the later ones are preempted
    # while the earlier ones still open blocks, and come back with their cached blocks.
    rows = [dict(segment_ids=[i], segment_lengths=[20], output_tokens=70, arrival_s=0.01 * i)
            for i in range(3)]
    for policy in ALL_POLICIES:
        for compat in COMPATS:
            config = EngineConfig(num_blocks=12, vllm_compat=compat, check_invariants=True)
            pair = both_paths(make_trace(rows), policy, config)
            assert pair is not None
            assert_same_run(*pair)
            assert pair[1].records["preemptions"].sum() > 0


def test_batched_sequences_carry_the_same_tokens_and_hashes():
    # The chunked token/hash kernel against the per-request builder, for prompt-only and
    # output-segment (conversation) requests, across several chunks.
    for workload in ("one_touch", "sharegpt"):
        trace = small_trace(workload, seed=3)
        engine = Engine(trace, make_policy("lru", 512), PROFILE_COST, EngineConfig())
        engine.CHUNK_REQUESTS = 5  # several chunks even on a short trace
        for i in range(len(trace)):
            a, b = engine._make_sequence(i), engine._make_sequence_batched(i)
            assert np.array_equal(a.token_ids, b.token_ids)
            assert np.array_equal(a.block_hashes, b.block_hashes)
            assert (a.request_id, a.group, a.contract, a.prefix_id, a.num_prompt_tokens) == \
                (b.request_id, b.group, b.contract, b.prefix_id, b.num_prompt_tokens)
            assert a.blocks.shape == b.blocks.shape
