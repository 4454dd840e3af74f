"""The attacker's budget in KV block-seconds and total tokens, and attack-search per scheduler:
the units parse, the block-seconds estimate charges long outputs what they hold, the default
budget is one_touch's measured level (so one_touch spends its own rate and keeps it), a trial
over the budget as measured is infeasible, the scheduler is part of the search's identity, and
bad input is a one-line error before any work."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from click.testing import CliRunner

pytest.importorskip("optuna")

from prefixshield.cli import main  # noqa: E402
from prefixshield.experiments import attack_search as AS  # noqa: E402
from prefixshield.experiments.spec import SpecError  # noqa: E402
from prefixshield.workloads.searched_attack import (SearchedAttackParams,  # noqa: E402
                                                    budget_request_rate, parse_budget_limits)

SMALL = {"blocks": 512, "compat": "current", "alpha": 0.6, "profile": "l4-qwen2.5-1.5b",
         "duration_s": 15.0}


def test_budget_units_parse_in_a_fixed_order_and_both_is_the_old_budget():
    assert parse_budget_limits("both") == ("requests", "prompt_tokens")
    assert parse_budget_limits("block_s+requests") == ("requests", "block_s")
    for bad in ("", "bogus", "requests+requests", "requests+"):
        with pytest.raises(ValueError, match="budget_limits"):
            parse_budget_limits(bad)
    with pytest.raises(ValueError, match="budget_block_s"):
        SearchedAttackParams(budget_limits="block_s")
    for v in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="budget_tokens"):
            SearchedAttackParams(budget_limits="tokens", budget_tokens=v)


def test_block_seconds_charge_long_outputs_what_they_hold():
    p = SearchedAttackParams(base_rate=5.0, budget_limits="prompt_tokens+block_s",
                             budget_block_s=300.0)
    short = replace(p, attacker_output_tokens=16)
    long = replace(p, attacker_output_tokens=1000)
    c_short, c_long = short.request_costs(), long.request_costs()
    # same prompt, so the prompt-token limit allows both the same rate ...
    assert c_short["prompt_tokens"] == c_long["prompt_tokens"]
    # ... but a 1,000-token decode holds a growing table for 1,000 steps
    assert c_long["block_s"] > 20 * c_short["block_s"]
    assert c_long["tokens"] - c_short["tokens"] == pytest.approx(984)
    assert long.budget_rate() == pytest.approx(300.0 / c_long["block_s"])
    assert long.budget_rate() < short.budget_rate()
    # the estimate scales with the contention factor, and the tighter limit binds
    assert replace(long, block_s_scale=2.0).request_costs()["block_s"] == pytest.approx(
        2 * c_long["block_s"])
    assert budget_request_rate({"requests": 1.0, "tokens": 100.0}, {"tokens": 50.0}) == 1.0
    assert budget_request_rate({"requests": 1.0, "tokens": 100.0}, {"tokens": 200.0}) == 0.5


@pytest.fixture(scope="module")
def default_budget():
    config = AS.SearchConfig(policies=("lru",), trials=3, seeds=2, eval_seeds=1, base=SMALL)
    return config, AS.resolve(config)


def test_the_default_budget_is_one_touch_measured_and_binds_it_exactly(default_budget):
    config, r = default_budget
    assert config.units == ("requests", "prompt_tokens", "block_s")
    assert list(r.limits) == ["requests", "prompt_tokens", "block_s"]
    assert r.limits["block_s"] == r.one_touch_block_s > 0
    assert r.block_s_scale > 1   # contention lengthens residence beyond the uncontended step
    # one_touch's estimate at its rate is its measurement: it spends its own rate
    assert r.spend["one_touch"] == pytest.approx(r.designed_rate["one_touch"], rel=1e-9)
    old = AS.resolve(replace(config, budget_limits="both"))
    assert "block_s" not in old.limits and math.isnan(old.one_touch_block_s)
    assert old.limits["requests"] == r.limits["requests"]
    line = AS.budget_line(config, r)
    assert "KV block-seconds/s (one_touch's measured under LRU)" in line


def test_one_touch_keeps_the_budget_it_defines_and_over_budget_is_infeasible(tmp_path,
                                                                             default_budget):
    config, r = default_budget
    store = AS.open_store(tmp_path / "s", config, r)
    from prefixshield.experiments.executors import make_executor

    ex = make_executor("inprocess", None)
    try:
        res = AS.run_search(store, config, r, ex)
    finally:
        ex.close()
    warm = res.trials["lru"][0]
    assert warm.source == "warm start: one_touch"
    # the warm start reproduces one_touch's rows: its block-seconds are the budget's level
    assert AS.block_s_rate(warm.result, r) == pytest.approx(r.limits["block_s"], rel=1e-9)
    assert warm.feasible and AS.over_budget(warm.result, r) <= 1e-9
    over = replace(warm.result, attacker_block_s=2 * warm.result.attacker_block_s)
    assert AS.over_budget(over, r) == pytest.approx(1.0, rel=1e-6)
    assert AS.over_budget(warm.result, replace(r, limits={"requests": 1.0})) == -math.inf
    AS.write_outputs(tmp_path / "s", res)
    import pandas as pd

    trials = pd.read_csv(tmp_path / "s" / "tables" / "trials.csv")
    assert {"feasible", "attacker_block_s_per_s", "victim_p95_queue_s"} <= set(trials.columns)
    worst = pd.read_csv(tmp_path / "s" / "tables" / "worst_case.csv")
    assert "attacker block-s/s (measured)" in worst.columns
    assert "% of budget" in worst.loc[0, "attacker block-s/s (measured)"]


def test_the_scheduler_is_part_of_the_search_identity(tmp_path, default_budget):
    config, r = default_budget
    vtc = replace(config, base={**SMALL, "scheduler": "vtc"})
    assert vtc.identity() != config.identity()
    AS.open_store(tmp_path / "s", config, r)
    with pytest.raises(SpecError, match="base"):
        AS.open_store(tmp_path / "s", vtc, r)
    with pytest.raises(SpecError, match="unknown scheduler"):
        AS.SearchConfig(policies=("lru",), base={"scheduler": "round_robin"})
    with pytest.raises(SpecError, match="budget_block_s"):
        AS.SearchConfig(policies=("lru",), budget_block_s=math.inf)


@pytest.mark.parametrize("args, option", [
    (["--scheduler", "round_robin"], "--scheduler"),
    (["--budget", "block_s=0"], "--budget"),
    (["--budget", "block_s=nan"], "--budget"),
    (["--budget", "tokens=inf"], "--budget"),
    (["--budget", "block_s", "--budget", "block_s"], "--budget"),
    (["--tenant-limit", "max_running=0"], "--tenant-limit"),
    (["--tenant-limit", "max_queue=3"], "--tenant-limit"),
])
def test_bad_scheduler_and_budget_input_is_one_line_before_any_work(tmp_path, args, option):
    out = tmp_path / "x"
    r = CliRunner().invoke(main, ["attack-search", *args, "--out", str(out)])
    assert r.exit_code == 2 and option in r.output
    assert len([x for x in r.output.strip().splitlines() if x.startswith("Error")]) == 1
    assert not out.exists()
