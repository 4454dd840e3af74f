"""The simulator's schedulers in a live vLLM: vLLM's own ``priority`` policy, and VTC and
per-tenant limits installed at the scheduler's queue (:mod:`prefixshield.live.scheduling`).

Serialized replays must agree with the simulator (run with the same ``SchedulerConfig``) on
every request's cached tokens; timed replays, whose queues really are ordered by the scheduler,
must agree with the step-time replay on every request's cached tokens and on every step's
batch -- and the FCFS step-time replay must not, so the scheduler is what was checked.
"""

from __future__ import annotations

import dataclasses

import pytest

from prefixshield.live.engine import LiveError
from prefixshield.scheduling import SchedulerConfig, TenantLimits
from prefixshield.simulator.costmodel import CostModel
from prefixshield.traces.schema import Trace
from prefixshield.validate.compare import compare_with_sim

COST = CostModel(a_s=1e-3, b_s_per_prefill_token=5e-6, c_s_per_decode_seq=2e-4,
                 d_s_per_context_token=1e-8)

_RUNS: dict = {}


@pytest.fixture(scope="module")
def crowded_trace(one_touch_trace):
    """``one_touch`` as one burst: every request arrives at 0 s, so 37 requests queue for 8
    slots and 39 blocks whatever the machine's speed -- the order matters, deterministically
    (equal arrivals: the row breaks ties on both sides)."""
    df = one_touch_trace.requests.copy()
    df["arrival_s"] = 0.0
    return Trace(df, seed=one_touch_trace.seed, vocab_size=one_touch_trace.vocab_size)


def configs(trace) -> dict[str, SchedulerConfig]:
    victim, attacker = "victim", "attacker"
    assert set(trace.group_names()) == {victim, attacker}
    return {
        # the attacker first: vLLM's own priority queue and victim rule
        "priority": SchedulerConfig(name="priority", priorities=((victim, 1),)),
        # VTC with every limit: the queue installed by prefixshield
        "vtc+limits": SchedulerConfig(name="vtc", limits=(
            (attacker, TenantLimits(max_running=1, max_output_tokens=3)),
            ("*", TenantLimits(max_blocks=12)))),
        # KVTC, its KV weight given (the capacity price needs the simulator's cost model), large
        # enough that the block-seconds of a CPU engine's millisecond steps rule the order
        "kvtc": SchedulerConfig(name="kvtc", kvtc_kv_weight=10000.0),
    }


def run(live_engine, trace, name, serialize):
    key = (id(trace), name, serialize)
    if key not in _RUNS:
        _RUNS[key] = live_engine.replay(trace, "lru", serialize=serialize,
                                        scheduler=configs(trace)[name], check_invariants=True)
    return _RUNS[key]


@pytest.mark.parametrize("name", ["priority", "vtc+limits", "kvtc"])
def test_serialized_cached_tokens_equal_the_simulator_on_every_request(live_engine,
                                                                       one_touch_trace, name):
    live = run(live_engine, one_touch_trace, name, serialize=True)
    assert live.facts["scheduler"] == configs(one_touch_trace)[name].to_dict()
    report = compare_with_sim(live, one_touch_trace, COST)
    n = len(one_touch_trace)
    assert report.agreement["equal"] == report.agreement["equal_steps"] == n, \
        report.disagreements.to_string()
    if name == "kvtc":  # the queue charged every group the block-seconds it held
        stats = live.facts["scheduler_stats"]
        assert stats["kvtc_kv_weight"] == 10000.0
        assert all(x > 0 for x in stats["kvtc_block_s"].values()), stats["kvtc_block_s"]


def test_kvtc_live_without_its_kv_weight_fails_before_any_request(live_engine,
                                                                   one_touch_trace):
    with pytest.raises(LiveError, match="kvtc live needs its KV weight"):
        live_engine.replay(one_touch_trace, "lru", scheduler=SchedulerConfig(name="kvtc"))
    assert not live_engine.engine.has_unfinished_requests()


@pytest.mark.parametrize("name", ["priority", "vtc+limits", "kvtc"])
def test_timed_step_replay_agrees_on_cached_tokens_and_every_batch(live_engine, crowded_trace,
                                                                   name):
    live = run(live_engine, crowded_trace, name, serialize=False)
    report = compare_with_sim(live, crowded_trace, COST)
    al = report.meta["steps"]["alignment"]
    assert report.agreement["equal_steps"] == len(crowded_trace), report.requests.to_string()
    assert al["identical"] == al["live_steps"] == al["sim_steps"], al
    # the same live steps replayed under FCFS do not line up: the scheduler was checked
    fcfs = dataclasses.replace(live, facts={**live.facts, "scheduler": None})
    other = compare_with_sim(fcfs, crowded_trace, COST)
    al_fcfs = other.meta["steps"]["alignment"]
    assert al_fcfs["identical"] < 0.9 * al["identical"], al_fcfs
    assert other.agreement["equal_steps"] < len(crowded_trace)
    if name == "kvtc":
        # nor under VTC: the block-seconds the queue charged from vLLM's tables did the ordering
        vtc = dataclasses.replace(live, facts={**live.facts,
                                               "scheduler": SchedulerConfig("vtc").to_dict()})
        al_vtc = compare_with_sim(vtc, crowded_trace, COST).meta["steps"]["alignment"]
        assert al_vtc["identical"] < 0.9 * al["identical"], al_vtc


def test_limits_are_in_force_live(live_engine, crowded_trace):
    live = run(live_engine, crowded_trace, "vtc+limits", serialize=False)
    rec = live.records
    att = rec[rec["group"] == "attacker"]
    assert (att["generated_tokens"] <= 3).all() and (att["output_tokens"] <= 3).all()
    stats = live.facts["scheduler_stats"]
    assert stats["vtc_output_tokens"]["attacker"] == int(att["generated_tokens"].sum())


def test_what_live_mode_cannot_take_fails_before_any_request(live_engine, one_touch_trace):
    bad_group = SchedulerConfig(name="priority", priorities=(("nobody", 1),))
    with pytest.raises(LiveError, match="priority for group 'nobody'"):
        live_engine.replay(one_touch_trace, "lru", scheduler=bad_group)
    tight = SchedulerConfig(limits=(("*", TenantLimits(max_blocks=1)),))
    with pytest.raises(LiveError, match="max_blocks limit 1"):
        live_engine.replay(one_touch_trace, "lru", scheduler=tight)
    assert not live_engine.engine.has_unfinished_requests()
