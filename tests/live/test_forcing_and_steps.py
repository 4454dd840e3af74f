"""Forced output content, step-time replay and on-the-spot calibration against a real vLLM.

Multi-turn traces quote earlier turns' outputs: with the forced-output logits processor the
live model generates the simulator's output ids, so decode-block reuse agrees exactly. The live
engine's recorded steps, replayed as the simulator's cost model, isolate the scheduler and
queueing model from the profile: its latencies must then match live within 5%.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from prefixshield.simulator.costmodel import CostModel
from prefixshield.traces.schema import Trace
from prefixshield.validate.compare import calibrate_engine, compare_with_sim, write_report
from prefixshield.live.engine import STEP_COLUMNS, LiveError

COST = CostModel(a_s=1e-3, b_s_per_prefill_token=5e-6, c_s_per_decode_seq=2e-4,
                 d_s_per_context_token=1e-8)
TIME_INDEPENDENT = ("lru", "s3fifo", "static_quota")

_RUNS: dict[tuple, object] = {}


@pytest.fixture(scope="module")
def multi_turn_trace():
    """``sharegpt`` on 40 blocks of 32: conversations whose later turns quote earlier outputs
    (real output lengths from the turn table). Two groups, conversations within 576 tokens, so
    that a static quota (19 blocks per group) can serve every request."""
    from prefixshield.workloads import generate

    return generate("sharegpt", num_blocks=40, block_size=32, seed=2, base_rate=3.0,
                    num_groups=2, max_conversation_tokens=576, system_prompt_tokens=32,
                    warmup_s=0, duration_s=10, think_time_s=1.0, min_think_time_s=0.2)


def run(live_engine, trace, policy, serialize=True, force=None, key=None):
    k = (key or id(trace), policy, serialize, force)
    if k not in _RUNS:
        _RUNS[k] = live_engine.replay(trace, policy, serialize=serialize, force_outputs=force,
                                      check_invariants=True)
    return _RUNS[k]


def test_the_multi_turn_trace_quotes_earlier_outputs(multi_turn_trace):
    df = multi_turn_trace.requests
    outs = set(df["output_segment_id"])
    quoting = [i for i, segs in enumerate(df["segment_ids"]) if outs & set(segs)]
    assert len(quoting) >= 3


def test_free_outputs_miss_the_decode_blocks_the_simulator_hits(live_engine, multi_turn_trace):
    """The failure forcing fixes: with the model's own tokens a later turn's prompt does not
    match the blocks the earlier turn decoded, so live caches less than the simulator."""
    live = run(live_engine, multi_turn_trace, "lru", force=False, key="mt")
    report = compare_with_sim(live, multi_turn_trace, COST)
    req = report.requests
    assert (req["cached_sim"] > req["cached_vllm"]).any(), req.to_string()
    assert live.facts["forced_outputs"] is False


@pytest.mark.parametrize("policy", TIME_INDEPENDENT)
def test_forced_outputs_make_multi_turn_cached_tokens_identical(live_engine, multi_turn_trace,
                                                                policy):
    live = run(live_engine, multi_turn_trace, policy, key="mt")
    assert live.facts["forced_outputs"] is True
    report = compare_with_sim(live, multi_turn_trace, COST, check_invariants=True)
    assert report.disagreements.empty, report.disagreements.to_string()
    assert report.agreement["equal_steps"] == report.agreement["requests"]


def test_prefixshield_multi_turn_agrees_on_99_percent(live_engine, multi_turn_trace):
    live = run(live_engine, multi_turn_trace, "prefixshield", key="mt")
    report = compare_with_sim(live, multi_turn_trace, COST, check_invariants=True)
    assert report.agreement["fraction"] >= 0.99, report.disagreements.to_string()


def test_every_step_is_recorded_with_its_features(live_engine, multi_turn_trace):
    live = run(live_engine, multi_turn_trace, "lru", key="mt")
    steps = live.steps
    assert list(steps.columns) == list(STEP_COLUMNS)
    assert (steps["seconds"] > 0).all() and (steps["scheduled_tokens"] > 0).all()
    assert np.all(np.diff(steps["end_s"].to_numpy()) > 0)
    # serialized: one request at a time; each is new exactly once
    assert steps["new_requests"].sum() == len(multi_turn_trace)
    assert (steps["num_requests"] == 1).all()
    rec = live.records
    tokens = int((rec["prompt_tokens"] - rec["cached_tokens"]).sum()
                 + (rec["output_tokens"] - 1).sum())
    assert int(steps["scheduled_tokens"].sum()) == tokens  # every computed token, once
    assert steps["seconds"].sum() <= live.wall_s + 1e-6


def _check_step_replay(report, tolerance_pct=5.0):
    al = report.meta["steps"]["alignment"]
    t = report.table.set_index("metric")
    for metric in ("P50 TTFT", "P95 TTFT", "P50 e2e latency", "P95 e2e latency"):
        d = t.loc[metric, "steps_diff_pct"]
        assert abs(d) <= tolerance_pct, (metric, d, al)
    return al


def test_step_replay_reproduces_serialized_latencies(live_engine, multi_turn_trace):
    live = run(live_engine, multi_turn_trace, "lru", key="mt")
    report = compare_with_sim(live, multi_turn_trace, COST)
    al = _check_step_replay(report)
    assert al["identical"] == al["live_steps"] == al["sim_steps"], al


def test_step_replay_reproduces_timed_latencies(live_engine, one_touch_trace):
    df = one_touch_trace.requests.copy()
    df["arrival_s"] = df["arrival_s"] * 0.25                 # queueing on the CPU engine
    trace = Trace(df, seed=one_touch_trace.seed, vocab_size=one_touch_trace.vocab_size)
    live = run(live_engine, trace, "lru", serialize=False, key="timed")
    report = compare_with_sim(live, trace, COST)
    al = _check_step_replay(report)
    assert al["identical"] >= 0.99 * al["live_steps"], al
    # requests joined at step boundaries, never before their arrival
    rec = live.records
    assert (rec["submit_s"] >= rec["arrival_s"] - 1e-9).all()


def test_report_carries_three_columns_residuals_and_the_step_log(live_engine, multi_turn_trace,
                                                                 tmp_path):
    live = run(live_engine, multi_turn_trace, "lru", key="mt")
    report = compare_with_sim(live, multi_turn_trace, COST)
    paths = write_report(report, tmp_path)
    md = paths[0].read_text()
    assert "| Metric | vLLM | Sim | Diff% | Sim (live steps) | Diff% |" in md
    assert "## Step times" in md and "median |relative error|" in md
    assert "fitted on live steps" in md
    res = report.meta["steps"]["profile_residuals"]
    assert res["steps"] == len(live.steps) and res["median_abs_rel_error"] >= 0
    assert len(pd.read_csv(paths[4])) == len(live.steps)
    fit = report.meta["steps"]["live_fit"]
    assert [t["term"] for t in fit["terms"]][0] == "a_s"


def test_calibration_on_the_live_engine_then_replay(live_engine, one_touch_trace):
    fit, m, source = calibrate_engine(live_engine)
    c = fit.cost
    assert fit.num_samples >= 8 and np.isfinite(fit.r2)
    assert c.a_s + c.b_s_per_prefill_token + c.d_s_per_context_token > 0
    assert source["num_samples"] == fit.num_samples and "R²" in source["how"]
    # the engine replays normally afterwards, and the calibrated profile is used and recorded
    live = live_engine.replay(one_touch_trace, "lru")
    report = compare_with_sim(live, one_touch_trace, c, cost_source=source)
    assert report.disagreements.empty
    assert report.meta["cost_source"]["name"].startswith("calibrated")


def test_a_request_the_policy_can_never_admit_is_an_error_not_a_hang(live_engine):
    """Four groups on 40 blocks: a static quota of 9 blocks cannot hold a 600-token request;
    vLLM would wait forever (FCFS), the simulator refuses the trace, the live replay raises."""
    from prefixshield.workloads import generate

    trace = generate("sharegpt", num_blocks=40, block_size=32, seed=2, base_rate=3.0,
                     num_groups=4, max_conversation_tokens=640, system_prompt_tokens=32,
                     warmup_s=0, duration_s=8, think_time_s=1.0, min_think_time_s=0.2)
    with pytest.raises(LiveError, match="can never be admitted"):
        live_engine.replay(trace, "static_quota")
    assert live_engine.pool.free_block_queue.num_free_blocks == 39  # everything aborted
    assert not live_engine.engine.has_unfinished_requests()


FORCING_OFF_SCRIPT = """
import sys
from prefixshield.live.engine import LiveEngine, LiveEngineConfig, LiveError
from prefixshield.workloads import generate
trace = generate("one_touch", num_blocks=40, block_size=32, prefix_tokens=128,
                 suffix_tokens=(8, 40), duration_s=2.0, base_rate=2.0, output_tokens=(2, 6),
                 hot_fraction=0.5, seed=1)
eng = LiveEngine(LiveEngineConfig(sys.argv[1], num_blocks=40, block_size=32, max_num_seqs=8,
                                  force_outputs=False))
try:
    try:
        eng.replay(trace, "lru", force_outputs=True)
        raise SystemExit("no LiveError")
    except LiveError as e:
        assert "force_outputs=True" in str(e), e
    live = eng.replay(trace, "lru")
    assert live.facts["forced_outputs"] is False
finally:
    eng.close()
print("FORCING-OFF-OK")
"""


def test_forcing_needs_the_processor_installed(tiny_model_dir):
    """In its own process: closing a second in-process engine would tear down vLLM's global
    parallel state under the session's engine."""
    import os
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", FORCING_OFF_SCRIPT, tiny_model_dir],
                          capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert proc.returncode == 0 and "FORCING-OFF-OK" in proc.stdout, \
        proc.stdout[-2000:] + proc.stderr[-4000:]
