"""C_prefill: measured with requests shaped like the workload's own (DESIGN §7)."""

import numpy as np
import pytest

from prefixshield.simulator.capacity import measure_c_prefill
from prefixshield.simulator.config import EngineConfig
from prefixshield.simulator.costmodel import CostModel, load_profile

SIMPLE = CostModel(a_s=0.010, b_s_per_prefill_token=0.001, c_s_per_decode_seq=0.0,
                   d_s_per_context_token=0.0)


def test_c_prefill_is_requests_over_makespan_of_the_probe():
    # 32 prompts of 64 tokens, one output token, all in one 8,192-token step: 10 ms + 2,048 ms
    c = measure_c_prefill(SIMPLE, EngineConfig(), [64] * 32, [1] * 32)
    assert c == pytest.approx(32 / (0.010 + 32 * 64 * 0.001))


def test_real_outputs_lower_c_prefill_and_a_small_pool_lowers_it_more():
    cost = load_profile("l4-qwen2.5-1.5b").cost
    prompts = np.full(32, 1580)
    one = measure_c_prefill(cost, EngineConfig(), prompts, np.ones(32, int))
    decode = measure_c_prefill(cost, EngineConfig(num_blocks=4096), prompts, np.full(32, 200))
    pinned = measure_c_prefill(cost, EngineConfig(), prompts, np.full(32, 200))
    # one-token prefills: throughput set by prefill; decoding 200 tokens adds ~200 steps; in
    # 512 blocks only four 112-block requests fit at a time, so they decode in waves
    assert one > decode > pinned
    assert pinned < 0.5 * decode


def test_c_prefill_is_cached_per_profile_engine_and_shape():
    cost = load_profile("l4-qwen2.5-1.5b").cost
    args = (cost, EngineConfig(), (1580,) * 32, (50,) * 32)
    assert measure_c_prefill(*args) == measure_c_prefill(*args)
    from prefixshield.simulator.capacity import _measure
    hits = _measure.cache_info().hits
    measure_c_prefill(*args)
    assert _measure.cache_info().hits == hits + 1


# ------------------------------------------------------------------ the basis of a capacity sweep
def _resolved(num_blocks, basis="reference", **overrides):
    from prefixshield.experiments.single import RunSpec, resolve_params

    spec = RunSpec("one_touch", ("lru",), EngineConfig(num_blocks=num_blocks),
                   load_profile("l4-qwen2.5-1.5b"), overrides=overrides, c_prefill_basis=basis)
    return resolve_params(spec)


def test_reference_basis_keeps_rates_and_attack_fixed_while_the_hot_set_scales():
    p512, info512 = _resolved(512)
    p4096, info4096 = _resolved(4096)
    assert info4096["c_prefill_req_per_s"] == info512["c_prefill_req_per_s"]
    assert p4096.base_rate == p512.base_rate
    assert p4096.attacker_request_rate() == p512.attacker_request_rate()
    assert p4096.hot_prefixes == 8 * p512.hot_prefixes          # only the hot set scales
    assert "reference pool of 512 blocks" in info4096["c_prefill_probe"]
    assert info4096["c_prefill_basis"].startswith("the reference pool of 512 blocks")


def test_capacity_basis_measures_at_the_runs_own_pool_and_says_so():
    _, ref = _resolved(4096)
    p, info = _resolved(4096, "capacity")
    assert info["c_prefill_req_per_s"] > ref["c_prefill_req_per_s"]  # a larger pool serves more
    assert info["c_prefill_basis"] == "this run's pool of 4,096 blocks"


def test_a_probe_that_does_not_fit_the_reference_pool_uses_the_runs_pool():
    # 9,000-token prefixes (563 blocks) cannot be prefilled in 511 usable blocks
    _, info = _resolved(4096, prefix_tokens=9000, num_hot_prefixes=1)
    assert "does not fit the reference pool" in info["c_prefill_basis"]


def test_an_unknown_basis_is_refused():
    with pytest.raises(ValueError, match="c_prefill_basis"):
        _resolved(512, "per-run")
