"""Split replicas on an executor: the merged result is the same on every executor."""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd
from click.testing import CliRunner

from prefixshield.cli import main
from prefixshield.experiments.executors import make_executor
from prefixshield.fleet.config import FleetConfig
from prefixshield.fleet.routers.base import RouterConfig
from prefixshield.fleet.run import run_fleet
from prefixshield.parquetfiles import read_frame
from prefixshield.policies import make_policy
from prefixshield.tenancy import DEFAULT_CONTRACTS
from tests.fleet.test_fleet import _same_run, _trace


def _split_run(executor, policy="prefixshield"):
    trace, eng, cost = _trace("one_touch")
    fresh = functools.partial(make_policy, policy, 512, vllm_compat=eng.vllm_compat)
    fleet = FleetConfig(3, router=RouterConfig(name="random"))
    return run_fleet(trace, fresh, cost, eng, DEFAULT_CONTRACTS, fleet, executor)


def _same_fleet(a, b) -> None:
    _same_run(a, b)
    assert np.array_equal(a.fleet.assignment, b.fleet.assignment)
    for ra, rb in zip(a.fleet.replicas, b.fleet.replicas):
        _same_run(ra, rb)
    assert a.policy_stats == b.policy_stats


def test_split_replicas_on_processes_give_the_inprocess_result():
    # Ray maps tasks through the same ``executor.map`` (tests/experiments runs a sweep on it);
    # a local Ray's start-up takes minutes on a loaded CI runner, so it is not repeated here
    ex = make_executor("process", workers=2)
    try:
        spread = _split_run(ex)
    finally:
        ex.close()
    _same_fleet(spread, _split_run(make_executor("inprocess")))
    _same_fleet(spread, _split_run(None))


def test_run_hands_split_replicas_to_the_executor(tmp_path):
    # one worker: the executor's map path without a pool's start-up (the pool is tested above)
    outs = {}
    for extra in ([], ["--executor", "process", "--workers", "1"]):
        out = tmp_path / str(len(extra))
        res = CliRunner().invoke(main, ["run", "one_touch", "-p", "lru", "--replicas", "2",
                                        *extra, "--out", str(out), "--no-plot"])
        assert res.exit_code == 0, res.output
        outs[len(extra)] = read_frame(out / "lru" / "records.parquet")
    pd.testing.assert_frame_equal(outs[0], outs[4])


def test_a_replica_task_travels_flat_and_arrives_the_same():
    import pickle

    from prefixshield.fleet.run import ReplicaTask
    from prefixshield.fleet.split import sub_trace

    trace, eng, cost = _trace("sharegpt")
    st = sub_trace(trace, np.arange(0, len(trace), 3))
    task = ReplicaTask(1, st, functools.partial(make_policy, "lru", 512), cost, eng, {})
    back = pickle.loads(pickle.dumps(task))
    pd.testing.assert_frame_equal(back.trace.requests, st.requests)
    for a, b in zip(st.requests["segment_ids"], back.trace.requests["segment_ids"]):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    for a, b in zip(st.segments(), back.trace.segments()):
        assert np.array_equal(a, b)
    assert (back.replica, back.trace.meta, back.config) == (1, st.meta, eng)
