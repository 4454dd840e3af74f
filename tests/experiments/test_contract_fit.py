"""Contracts sized to the deployment: the fit's formulas on a real LRU run, the debt-time
measure, and the guard that says when the contracts do not fit."""

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from prefixshield.cli import main
from prefixshield.experiments.contract_fit import (debt_fractions, debt_warning,
                                                   fit_contracts, fit_to_trace)
from prefixshield.experiments.single import RunSpec, run_policies
from prefixshield.simulator.config import EngineConfig
from prefixshield.simulator.costmodel import load_profile
from prefixshield.simulator.creation import debt_fraction
from prefixshield.tenancy import DEFAULT_CONTRACTS
from prefixshield.traces import importers
from prefixshield.traces.io import write_trace
from prefixshield.traces.transform import limit_request_tokens

FIXTURES = Path(__file__).resolve().parents[1] / "traces" / "fixtures"
CONVERSATION = FIXTURES / "mooncake_conversation_head400.jsonl"
BLOCKS = 4096


@pytest.fixture(scope="module")
def trace():
    # 120 conversation requests over 4 session tenants, prompts clipped to fit the pool
    tr = importers.import_mooncake(CONVERSATION, limit=120, num_groups=4, assign="session")
    return limit_request_tokens(tr, 16_000, "clip")


@pytest.fixture(scope="module")
def spec():
    return RunSpec(workload="<trace>", policies=("lru", "prefixshield"),
                   engine=EngineConfig(num_blocks=BLOCKS), profile=load_profile(
                       "h200-qwen2.5-7b"))


def log(t, group, contract, blocks):
    return {"t_s": np.asarray(t, float), "group": np.asarray(group, np.int64),
            "contract": np.asarray(contract, np.int64), "blocks": np.asarray(blocks, np.int64)}


def test_debt_fraction_is_the_time_below_zero_over_the_window():
    rho, beta = np.array([1.0, 1.0]), np.array([2.0, 0.0])
    # 5 blocks at t=1 from a full bucket of 2: -3, repaid at 1 block/s: in debt over [1, 4)
    assert debt_fraction(log([1.0], [0], [0], [5]), 0, rho, beta, (0.0, 10.0)) == 0.3
    # a second contract in debt over [3, 5): the spans are united, [1, 5)
    two = log([1.0, 3.0], [0, 0], [0, 1], [5, 2])
    assert debt_fraction(two, 0, rho, beta, (0.0, 10.0)) == pytest.approx(0.4)
    assert debt_fraction(two, 0, rho, beta, (2.0, 4.0)) == 1.0
    assert debt_fraction(two, 1, rho, beta, (0.0, 10.0)) == 0.0  # never charged


def test_fit_funds_the_lru_creation_and_buckets_hold_one_pool(trace, spec):
    lru = run_policies(trace, replace(spec, policies=("lru",)))["lru"]
    fit = fit_contracts(lru, BLOCKS)
    rates = np.array(list(fit.rates.values()))
    assert len(rates) == 4 and (rates > 0).all()
    assert {c for _g, c in fit.rates} == {"standard"} and fit.fitted == ("standard",)
    std = fit.contracts["standard"]
    assert std.rho_blocks_per_s == pytest.approx(rates.mean())
    assert fit.turnover_s == pytest.approx((BLOCKS - 1) / rates.sum())
    assert 4 * std.beta_blocks == pytest.approx(BLOCKS - 1)  # four groups: one pool
    for name, ref in DEFAULT_CONTRACTS.items():  # unused tiers keep the reference ratios
        c = fit.contracts[name]
        assert c.rho_blocks_per_s == pytest.approx(fit.scale * ref.rho_blocks_per_s)
        assert c.beta_blocks == pytest.approx(c.rho_blocks_per_s * fit.turnover_s)
    # the window's creation, counted from the log
    w0, w1 = fit.window_s
    inside = (lru.creations["t_s"] >= w0) & (lru.creations["t_s"] < w1)
    assert rates.sum() * (w1 - w0) == pytest.approx(lru.creations["blocks"][inside].sum())


def test_fit_is_deterministic(trace, spec):
    assert fit_to_trace(trace, spec) == fit_to_trace(trace, spec)


def test_guard_fires_on_reference_contracts_and_not_on_fitted_ones(trace, spec):
    results = run_policies(trace, spec)
    fractions = {p: debt_fractions(r) for p, r in results.items()}
    assert all(min(f.values()) > 0.5 for f in fractions.values())
    msg = debt_warning(results)
    assert msg.startswith("the contracts do not fit this deployment: every group was in debt")
    assert "standard 40 blocks/s (burst 192)" in msg and "with --contracts fit" in msg
    # contracts already fitted: the message says so instead of advising the fit
    told = debt_warning(results, fitted=True)
    assert told.startswith(msg.split(". Size")[0]) and "with --contracts fit" not in told
    assert "fitted to this trace and pool (--contracts fit)" in told
    fitted = replace(spec, contracts=fit_to_trace(trace, spec).contracts)
    again = run_policies(trace, fitted)
    assert debt_warning(again) is None
    assert any(min(debt_fractions(r).values()) <= 0.5 for r in again.values())


def test_run_with_contracts_fit_prints_and_records_the_fit(trace, tmp_path):
    path = tmp_path / "t.parquet"
    write_trace(trace, path)
    out = tmp_path / "out"
    r = CliRunner().invoke(main, ["run", str(path), "-p", "lru", "-p", "prefixshield",
                                  "--blocks", str(BLOCKS), "--profile", "h200-qwen2.5-7b",
                                  "--contracts", "fit", "--out", str(out), "--no-plot"])
    assert r.exit_code == 0, r.output
    assert "contracts fitted under LRU" in r.output and "warning" not in r.output
    config = json.loads((out / "config.json").read_text())
    fit = config["trace"]["contracts_fit"]
    assert config["contracts"]["standard"]["rho_blocks_per_s"] == \
        fit["contracts"]["standard"]["rho_blocks_per_s"]
    plain = CliRunner().invoke(main, ["run", str(path), "-p", "lru", "--blocks", str(BLOCKS),
                                      "--profile", "h200-qwen2.5-7b"])
    assert plain.exit_code == 0 and "do not fit this deployment" in plain.output


def test_compare_fits_once_and_keeps_each_seeds_trace(tmp_path):
    args = ["compare", "one_touch", "-p", "lru,prefixshield", "--seeds", "2",
            "--set", "duration_s=8"]
    fitted = CliRunner().invoke(main, [*args, "--contracts", "fit", "--out",
                                       str(tmp_path / "f.csv")])
    assert fitted.exit_code == 0, fitted.output
    assert fitted.output.count("contracts fitted under LRU") == 1
    ref = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "r.csv")])
    assert ref.exit_code == 0, ref.output
    import pandas as pd

    f, r = pd.read_csv(tmp_path / "f.csv"), pd.read_csv(tmp_path / "r.csv")
    # LRU ignores contracts and the traces (the attack's rate included) are the reference's
    cols = ["seed", "hit_ratio", "token_hit_ratio", "p95_ttft_s", "evictions"]
    pd.testing.assert_frame_equal(f[f.policy == "lru"][cols].reset_index(drop=True),
                                  r[r.policy == "lru"][cols].reset_index(drop=True))
