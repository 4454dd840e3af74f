"""Engine timing and scheduling against values computed by hand from a simple profile."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from helpers import make_trace
from prefixshield.policies import make_policy
from prefixshield.simulator.config import EngineConfig
from prefixshield.simulator.costmodel import CostModel
from prefixshield.simulator.engine import Engine, EngineError

# 10 ms per step plus 1 ms per prefill token; decode and attention free unless a test says so.
SIMPLE = CostModel(a_s=0.010, b_s_per_prefill_token=0.001, c_s_per_decode_seq=0.0,
                   d_s_per_context_token=0.0)


def run(rows, cost=SIMPLE, coalesce=True, **cfg):
    config = EngineConfig(check_invariants=True, **cfg)
    engine = Engine(make_trace(rows), make_policy("lru", config.num_blocks, config.vllm_compat),
                    cost, config, coalesce_decode=coalesce)
    return engine.run()


def test_single_prefill_ttft_is_one_step():
    r = run([dict(segment_ids=[1], segment_lengths=[64])])
    assert r.records["ttft_s"].iloc[0] == pytest.approx(0.010 + 0.064)


def test_two_prompts_share_one_step():
    r = run([dict(segment_ids=[1], segment_lengths=[64]),
             dict(segment_ids=[2], segment_lengths=[64])])
    assert list(r.records["ttft_s"]) == pytest.approx([0.138, 0.138])


def test_token_budget_queues_the_second_prompt():
    r = run([dict(segment_ids=[1], segment_lengths=[64]),
             dict(segment_ids=[2], segment_lengths=[64])], max_num_batched_tokens=64)
    assert list(r.records["ttft_s"]) == pytest.approx([0.074, 0.148])


def test_chunked_prefill_splits_a_prompt_over_steps():
    r = run([dict(segment_ids=[1], segment_lengths=[64])], max_num_batched_tokens=32)
    assert r.records["ttft_s"].iloc[0] == pytest.approx(2 * (0.010 + 0.032))


def test_prefix_hit_skips_cached_blocks():
    r = run([dict(segment_ids=[1], segment_lengths=[64]),
             dict(segment_ids=[1], segment_lengths=[64], arrival_s=1.0)])
    rec = r.records
    assert list(rec["cached_tokens"]) == [0, 48]  # n-1 rule: 3 of 4 blocks
    assert rec["ttft_s"].iloc[1] == pytest.approx(0.010 + 0.016)
    assert list(rec["hit_fraction"]) == pytest.approx([0.0, 0.75])


def test_arrival_waits_for_the_running_step():
    # B arrives mid-way through A's prefill step and is scheduled at the next step boundary.
    r = run([dict(segment_ids=[1], segment_lengths=[64]),
             dict(segment_ids=[2], segment_lengths=[64], arrival_s=0.05)])
    assert r.records["ttft_s"].iloc[1] == pytest.approx(0.074 + 0.074 - 0.05)


@pytest.mark.parametrize("coalesce", [True, False])
def test_decode_steps_sum_by_hand(coalesce):
    cost = CostModel(a_s=0.010, b_s_per_prefill_token=0.001, c_s_per_decode_seq=0.002,
                     d_s_per_context_token=1e-5)
    L, out = 40, 50
    r = run([dict(segment_ids=[1], segment_lengths=[L], output_tokens=out)], cost=cost,
            coalesce=coalesce)
    prefill = 0.010 + 0.001 * L + 1e-5 * L
    decode = sum(0.010 + 0.002 + 1e-5 * (L + j) for j in range(1, out))
    assert r.records["ttft_s"].iloc[0] == pytest.approx(prefill)
    assert r.records["e2e_s"].iloc[0] == pytest.approx(prefill + decode)
    if coalesce:
        assert r.num_events < r.num_steps


def test_preemption_frees_the_last_admitted_and_recomputes_with_hits():
    # 8 usable blocks of 16 tokens. Both prompts take 2 blocks; decoding 100 tokens each needs
    # 8 blocks per request: the later one is preempted, and on return hits its cached blocks.
    rows = [dict(segment_ids=[1], segment_lengths=[20], output_tokens=100),
            dict(segment_ids=[2], segment_lengths=[20], output_tokens=100)]
    r = run(rows, num_blocks=9)
    rec = r.records
    assert rec["preemptions"].iloc[0] == 0
    assert rec["preemptions"].iloc[1] >= 1
    assert rec["e2e_s"].notna().all()
    assert rec["e2e_s"].iloc[1] > rec["e2e_s"].iloc[0]


def test_request_larger_than_the_pool_is_an_error_naming_it():
    with pytest.raises(EngineError, match=r"request 0 .* needs 200 tokens"):
        run([dict(segment_ids=[1], segment_lengths=[199])], num_blocks=5)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 2), st.integers(0, 3), st.integers(1, 120),
                          st.integers(1, 60)), min_size=1, max_size=12),
       st.sampled_from(["0.10", "current"]), st.integers(12, 40))
def test_coalesced_decode_matches_step_by_step(reqs, compat, num_blocks):
    reqs = sorted(reqs)
    rows = [dict(arrival_s=t, segment_ids=[p, 100 + i], segment_lengths=[64, n],
                 output_tokens=o, group=f"g{p % 2}")
            for i, (t, p, n, o) in enumerate(reqs)]
    cost = CostModel(0.01, 0.0005, 0.001, 1e-6)
    try:
        a = run(rows, cost=cost, coalesce=True, num_blocks=num_blocks, vllm_compat=compat)
    except EngineError:
        return
    b = run(rows, cost=cost, coalesce=False, num_blocks=num_blocks, vllm_compat=compat)
    for col in ("cached_tokens", "preemptions", "new_blocks"):
        assert np.array_equal(a.records[col], b.records[col]), col
    for col in ("ttft_s", "e2e_s"):
        assert np.allclose(a.records[col], b.records[col], rtol=1e-9, atol=1e-12), col
    assert np.array_equal(a.evictions, b.evictions)
    assert a.num_steps == b.num_steps


def test_request_that_can_never_be_admitted_is_an_error_not_a_hang():
    # static_quota with two groups: 4 usable blocks -> quota 2; a 3-block prompt never fits.
    rows = [dict(segment_ids=[1], segment_lengths=[16], group="a"),
            dict(segment_ids=[2], segment_lengths=[40], group="b", arrival_s=1.0)]
    config = EngineConfig(num_blocks=5)
    engine = Engine(make_trace(rows), make_policy("static_quota", 5), SIMPLE, config)
    with pytest.raises(EngineError, match=r"group 'b' can never be admitted: it needs 3 blocks"):
        engine.run()


def test_idle_engine_waits_for_the_next_arrival_without_spinning():
    rows = [dict(segment_ids=[1], segment_lengths=[64]),
            dict(segment_ids=[2], segment_lengths=[64], arrival_s=100.0)]
    r = run(rows)
    assert r.records["ttft_s"].iloc[1] == pytest.approx(0.074)
    assert r.num_events == 2


def test_same_trace_and_seed_give_bit_identical_records():
    from prefixshield.simulator.costmodel import load_profile
    from prefixshield.workloads import generate

    cost = load_profile("l4-qwen2.5-1.5b").cost
    runs = []
    for _ in range(2):
        trace = generate("one_touch", duration_s=10, seed=7)
        runs.append(Engine(trace, make_policy("lru", 512), cost, EngineConfig()).run())
    assert runs[0].records.equals(runs[1].records)
    assert np.array_equal(runs[0].occupancy, runs[1].occupancy)
    assert np.array_equal(runs[0].evictions, runs[1].evictions)


def test_observing_a_run_changes_nothing():
    from prefixshield.simulator.costmodel import load_profile
    from prefixshield.workloads import generate

    cost = load_profile("l4-qwen2.5-1.5b").cost
    trace = generate("one_touch", duration_s=10, seed=3)
    plain = Engine(trace, make_policy("prefixshield", 512), cost, EngineConfig()).run()
    seen = []
    watched = Engine(trace, make_policy("prefixshield", 512), cost, EngineConfig()).run(
        observe=lambda eng, t: seen.append((t, int(eng.pool.num_cached_blocks()))), every_s=0.5)
    assert watched.records.equals(plain.records)
    assert np.array_equal(watched.evictions, plain.evictions)
    assert [t for t, _ in seen] == pytest.approx(0.5 * np.arange(1, len(seen) + 1))
    assert len(seen) >= 2 * 10 and max(n for _, n in seen) > 0


def test_waiting_requests_hold_no_tokens_until_they_reach_the_head():
    """An overloaded engine's queue holds row indices: a request's token ids and block hashes
    are built when it first reaches the head of the waiting queue (same results either way:
    the batched-step tests compare every workload against the step-by-step path)."""
    from prefixshield.experiments.single import RunSpec, build_trace
    from prefixshield.policies import make_policy
    from prefixshield.simulator.config import EngineConfig
    from prefixshield.simulator.costmodel import load_profile
    from prefixshield.simulator.engine import Engine
    from prefixshield.simulator.kvcache import Sequence

    profile = load_profile("l4-qwen2.5-1.5b")
    spec = RunSpec(workload="one_touch", policies=("lru",), engine=EngineConfig(max_num_seqs=4),
                   profile=profile, overrides={"duration_s": 20.0, "base_rate": 3.0,
                                               # long outputs, so 3 requests/s overload it
                                               "max_output_tokens": None})
    trace, _ = build_trace(spec)
    seen = []

    def observe(engine, t):
        built = sum(isinstance(x, Sequence) for x in engine.waiting)
        seen.append((len(engine.waiting), built, engine.num_preemptions.sum()))

    engine = Engine(trace, make_policy("lru", 512), profile.cost, spec.engine, batched=True)
    engine.run(observe=observe, every_s=0.5)
    deepest = max(seen)
    assert deepest[0] > 20, "the engine was overloaded"
    # only the head, and requests preempted back to it, are built
    assert all(built <= 1 + preempted for _, built, preempted in seen), seen

    # The step-by-step path builds each request on arrival (its scheduler orders requests by
    # what they are) but keeps only the block hashes of a waiting request, not its token ids.
    tokens_held = []

    def observe_step(engine, t):
        queue = list(engine.scheduler._queue)
        tokens_held.append((len(queue), sum(s.token_ids.size for s in queue)))

    engine = Engine(trace, make_policy("lru", 512), profile.cost, spec.engine, batched=False)
    engine.run(observe=observe_step, every_s=0.5)
    assert max(tokens_held)[0] > 20, "the engine was overloaded"
    assert all(held == 0 for _, held in tokens_held), tokens_held
