"""records.build_records: the same per-request records as Engine.records' DataFrame, cell for
cell, dtype for dtype and byte for byte in the files written from them."""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
import pytest

from helpers import make_trace, small_trace
from prefixshield.policies import make_policy
from prefixshield.simulator.config import EngineConfig
from prefixshield.simulator.costmodel import load_profile
from prefixshield.simulator.engine import Engine
from prefixshield.simulator.records import RECORD_COLUMNS, build_records
from prefixshield.workloads import WORKLOADS

COST = load_profile("l4-qwen2.5-1.5b").cost
PATHS = {"step-by-step": dict(batched=False), "per-step batched": dict(fused=False),
         "default": dict()}


def dict_records(engine: Engine) -> pd.DataFrame:
    """The records as ``Engine.records`` built them before ``build_records``: a dict of
    per-column arrays, string columns by ``astype(str)`` (the reference)."""
    df = engine.trace.requests
    return pd.DataFrame({
        "request_id": df["request_id"].to_numpy(np.int64),
        "arrival_s": engine.arrival_s,
        "group": df["group"].astype(str).to_numpy(),
        "contract": df["contract"].astype(str).to_numpy(),
        "role": df["role"].astype(str).to_numpy(),
        "prefix_id": engine.prefix_id,
        "measured": df["measured"].to_numpy(bool),
        "prompt_tokens": engine.prompt_tokens,
        "cached_tokens": engine.cached_tokens,
        "new_tokens": engine.prompt_tokens - engine.cached_tokens,
        "new_blocks": engine.num_new_blocks,
        "output_tokens": engine.output_tokens,
        "hit_fraction": engine.cached_tokens / engine.prompt_tokens,
        "ttft_s": engine.first_token_s - engine.arrival_s,
        "e2e_s": engine.finish_s - engine.arrival_s,
        "preemptions": engine.num_preemptions,
        "queue_s": engine.admitted_s - engine.arrival_s,
        "arrival_cached_tokens": engine.arrival_cached_tokens,
        "arrival_hit_fraction": engine.arrival_cached_tokens / engine.prompt_tokens,
        "block_s": engine.block_s,
    })


def assert_same_records(got: pd.DataFrame, want: pd.DataFrame) -> None:
    """Equal cells (NaN where NaN), equal dtypes and column order, equal Parquet and CSV bytes."""
    assert [(c, str(t)) for c, t in got.dtypes.items()] == list(RECORD_COLUMNS)
    assert list(got.columns) == list(want.columns)
    assert [str(t) for t in got.dtypes] == [str(t) for t in want.dtypes]
    pd.testing.assert_frame_equal(got, want, check_exact=True)
    assert got.equals(want)
    for col in ("group", "contract", "role"):
        assert all(type(x) is str for x in got[col])
    a, b = io.BytesIO(), io.BytesIO()
    got.to_parquet(a, index=False)
    want.to_parquet(b, index=False)
    assert a.getvalue() == b.getvalue(), "Parquet bytes differ"
    assert got.to_csv(index=False) == want.to_csv(index=False), "CSV differs"


def run_engine(trace, path: str, policy: str = "lru", num_blocks: int = 512) -> Engine:
    config = EngineConfig(num_blocks=num_blocks)
    engine = Engine(trace, make_policy(policy, num_blocks), COST, config, **PATHS[path])
    engine.run()
    return engine


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_build_records_equals_the_dict_built_frame(workload, path):
    engine = run_engine(small_trace(workload), path)
    assert_same_records(build_records(engine), dict_records(engine))


@pytest.mark.parametrize("policy", ["prefixshield", "static_quota"])
def test_build_records_equals_the_dict_built_frame_under_other_policies(policy):
    engine = run_engine(small_trace("low_and_slow"), "default", policy=policy)
    assert_same_records(build_records(engine), dict_records(engine))


def test_engine_records_equals_build_records():
    engine = run_engine(small_trace("one_touch"), "default")
    assert_same_records(build_records(engine), engine.records())


def test_group_and_contract_names_follow_declared_tenants_and_odd_names():
    # declared (silent) tenants come first in Engine.groups, so the ids are not first-seen order
    rows = [{"arrival_s": 0.1 * i, "segment_ids": [i], "segment_lengths": [20 + i],
             "group": ["b", "ä g", "a", "b"][i % 4], "role": ["victim", "benign", "attacker",
                                                          "victim"][i % 4],
             "contract": ["standard", "critical"][i % 2]} for i in range(12)]
    trace = make_trace(rows)
    trace.meta["tenants"] = {"groups": ["silent", "a"], "contracts": ["best_effort", "critical"]}
    engine = run_engine(trace, "default", num_blocks=64)
    assert engine.groups[:2] == ["silent", "a"]
    got = build_records(engine)
    assert_same_records(got, dict_records(engine))
    assert list(got["group"][:4]) == ["b", "ä g", "a", "b"]


def test_records_share_no_memory_with_the_engine_or_the_trace():
    engine = run_engine(small_trace("one_touch"), "default")
    got = build_records(engine)
    sources = [engine.arrival_s, engine.prefix_id, engine.prompt_tokens, engine.cached_tokens,
               engine.num_new_blocks, engine.output_tokens, engine.first_token_s,
               engine.finish_s, engine.num_preemptions, engine.group_id, engine.contract_id]
    sources += [engine.trace.requests[c].to_numpy() for c in ("request_id", "arrival_s",
                                                              "prefix_id", "measured",
                                                              "output_tokens")]
    for col in got.columns:
        for src in sources:
            assert not np.shares_memory(got[col].to_numpy(), src), col
    before = engine.cached_tokens.copy()
    got.loc[:, "cached_tokens"] = -7
    assert np.array_equal(engine.cached_tokens, before)


def test_filtering_and_grouping_the_records_give_the_same_answers():
    engine = run_engine(small_trace("low_and_slow"), "default")
    got, want = build_records(engine), dict_records(engine)
    pd.testing.assert_frame_equal(got[got["measured"]], want[want["measured"]])
    pd.testing.assert_frame_equal(got.groupby("group")["ttft_s"].describe(),
                                  want.groupby("group")["ttft_s"].describe())
    assert np.array_equal(got.to_numpy(), want.to_numpy())
