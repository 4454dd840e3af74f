"""``prefixshield reproduce --quick``: every output present, every number finite, and the
reference's claims that the behaviour tests assert checked in its tables.

The quick mode runs every experiment and point of the full evaluation with 3 seeds and a 20 s
measured phase (DESIGN §9 sized for CI). A claim that does not hold at that size is still stated
here, ``xfail(strict=True)`` with the quick run's numbers: the full-size evaluation (and
``tests/regression/test_behaviour.py``, 10 seeds at the workloads' own durations) is where it is
judged.
"""

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from prefixshield.cli import main
from prefixshield.experiments.reproduce import REPRODUCE_SECTIONS, reproduce_experiments
from prefixshield.experiments.store import ResultsStore

TABLES = ("attack", "benign", "borrowing", "sweep-capacity", "sweep-pressure",
          "sweep-pressure-low_and_slow", "sweep-load", "sweep-profile", "ablation-segmentation",
          "ablation-delayed-replay", "readings", "readings-capacity",
          "overhead", "schedulers-benign", "worst-cases")


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("reproduce") / "quick"
    r = CliRunner().invoke(main, ["reproduce", "--quick", "--out", str(out)],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return out


def table(quick, name) -> pd.DataFrame:
    return pd.read_csv(quick / "tables" / f"{name}.csv")


def test_every_cell_table_figure_and_the_index_exist(quick):
    store = ResultsStore.open(quick)
    assert len(store.done()) == store.num_cells()
    cells = store.load()
    assert set(cells["status"]) <= {"ok", "failed"}
    assert store.meta["kind"] == "reproduce" and store.meta["quick"] is True
    assert {e.name for e in store.experiments} == {
        n for names in REPRODUCE_SECTIONS.values() for n in names}
    index = (quick / "index.md").read_text()
    for name in TABLES:
        assert (quick / "tables" / f"{name}.md").exists()
        assert f"tables/{name}.csv" in index
    figures = sorted((quick / "figures").glob("*.png"))
    assert len(figures) >= 10
    for f in figures:
        assert f.read_bytes()[:4] == b"\x89PNG" and f"figures/{f.name}" in index


def test_the_readings_table_has_every_reading_against_every_case(quick):
    from prefixshield.experiments.reproduce import (READING_CASES, READINGS,
                                                    WORKLOAD_READINGS)

    every = table(quick, "readings")
    workload = every["reading"].str.startswith("workload:")
    t = every[~workload]
    assert list(dict.fromkeys(t["reading"])) == [spec for spec, _ in READINGS]
    cases = {(w, base) for w, base, blocks in READING_CASES for _ in blocks}
    assert {(r.split(" ")[0], a) for r, a in zip(t["case"], t["against"])
            if a != READINGS[0][0]} == cases
    # every reading against its baseline in every case, every other one against the default
    assert len(t) == len(READINGS) * sum(len(b) for _, _, b in READING_CASES) * 2 - sum(
        len(b) for _, _, b in READING_CASES)
    # each reading of the workload: the default PrefixShield against the baseline on every
    # attack case
    w = every[workload]
    attack_cases = sum(len(b) for name, _, b in READING_CASES if name != "sharegpt")
    assert list(dict.fromkeys(w["reading"])) == [f"workload:{k}" for k, _, _ in
                                                 WORKLOAD_READINGS]
    assert len(w) == len(WORKLOAD_READINGS) * attack_cases and set(w["against"]) == {"lru"}
    assert np.isfinite(every["mean_diff"]).all()
    cap = table(quick, "readings-capacity")
    assert len(cap) == 3 * 4 and np.isfinite(cap["mean_diff"]).all()
    assert set(np.round(cap[cap["reading"] == "template"]["working_set_pct"], 1)[
        cap["blocks"] > 512]) == {76.6}


def test_the_default_setup_mirrors_the_reference():
    exps = {e.name: e for e in reproduce_experiments()}
    one = exps["attack-one_touch"]
    assert one.seeds == tuple(range(10))
    assert one.base == {"compat": "0.10", "profile": "l4-qwen2.5-1.5b"}
    assert dict(exps["sweep-capacity"].grid) == {"blocks": (512, 1024, 2048, 4096)}
    assert dict(exps["sweep-load"].grid) == {"alpha": (0.4, 0.6, 0.8)}
    assert dict(exps["ablation-delayed-replay"].grid) == {"wait_factor": (0.0, 0.5, 1.0)}


def test_numbers_are_finite(quick):
    cells = ResultsStore.open(quick).load()
    ok = cells[(cells["status"] == "ok") & (cells["experiment"] != "overhead")]
    for col in ("hit_ratio", "token_hit_ratio", "p50_ttft_s", "p95_ttft_s", "mean_e2e_s"):
        assert np.isfinite(ok[col].astype(float)).all(), col
        assert (ok[col] >= 0).all(), col
    assert ok["hit_ratio"].between(0, 1).all()
    for name in ("attack", "benign", "borrowing", "sweep-capacity", "sweep-load"):
        t = table(quick, name)
        failed = t[[c for c in t.columns if c.endswith("failed")]].sum(axis=1)
        served = t[failed == 0]  # a policy that cannot serve the trace has no mean
        means = served[[c for c in t.columns if c.endswith("hit_ratio_mean")]]
        assert len(served) and np.isfinite(means.to_numpy(float)).all(), name
    over = table(quick, "overhead")
    assert (over["select_mean_us"] > 0).all() and (over["state_bytes_per_block"] > 0).all()
    assert set(zip(over["blocks"], over["groups"])) >= {(512, 8), (4096, 32)}


# ------------------------------------------------------------------------------ the claims
def attack_row(quick, workload, policy):
    t = table(quick, "attack")
    return t[(t["workload"] == workload) & (t["attack.policy"] == policy)].iloc[0]


def sweep_row(quick, name, key, value, policy):
    t = table(quick, name)
    return t[(t[f"grid.{key}"] == value) & (t["policy"] == policy)].iloc[0]


@pytest.mark.xfail(strict=True, reason=(
    "quick size (3 seeds): one_touch's PrefixShield - LRU is +0.51 pp with a 95% CI of "
    "[-0.36, +2.19], not above zero (3.05% against 2.54%); at 10 seeds the behaviour test "
    "holds (+1.09 pp [+0.25, +2.06])"))
def test_one_touch_prefixshield_protects_the_victim(quick):
    """G1: PrefixShield > S3-FIFO and PrefixShield > LRU (means), and the paired
    PrefixShield-LRU CI lies above zero; the static quota's 63-block shares of the 8-group
    population cannot serve the trace (tests/regression/test_behaviour.py)."""
    mean = {p: attack_row(quick, "one_touch", p)["attack.hit_ratio_mean"]
            for p in ("lru", "s3fifo", "prefixshield")}
    assert mean["prefixshield"] > mean["s3fifo"], mean
    assert mean["prefixshield"] > mean["lru"], mean
    assert attack_row(quick, "one_touch", "prefixshield")["attack.hit_ratio_ci_low"] > 0
    assert attack_row(quick, "one_touch", "static_quota")["attack.failed"] == 3


def test_protection_grows_from_512_to_4096_blocks(quick):
    small = sweep_row(quick, "sweep-capacity", "blocks", 512, "prefixshield")["hit_ratio_diff"]
    large = sweep_row(quick, "sweep-capacity", "blocks", 4096, "prefixshield")["hit_ratio_diff"]
    assert large > small > 0


@pytest.mark.parametrize("alpha", [
    0.4,
    pytest.param(0.6, marks=pytest.mark.xfail(strict=True, reason=(
        "quick size (3 seeds): at alpha 0.6 (one_touch's default point) PrefixShield - LRU is "
        "+0.51 pp with a CI low of -0.36; at 10 seeds the behaviour test holds"))),
    0.8])
def test_protection_is_positive_at_loads_40_60_80_percent(quick, alpha):
    assert sweep_row(quick, "sweep-load", "alpha", alpha, "prefixshield")["hit_ratio_ci_low"] > 0


@pytest.mark.parametrize("workload", ["one_touch", "low_and_slow", "two_pass_replay"])
def test_no_attack_control_prefixshield_matches_lru(quick, workload):
    row = attack_row(quick, workload, "prefixshield")
    assert abs(row["control.hit_ratio_diff"]) <= 0.005
    assert row["control.attacker_pressure_ratio_mean"] == 0


def test_borrowing_quota_caps_the_active_group_and_work_conserving_policies_lend(quick):
    t = table(quick, "borrowing").set_index("policy")
    assert t.loc["static_quota", "active_peak_blocks"] <= 511 // 2
    assert t.loc["s3fifo", "active_peak_blocks"] >= 500
    assert t.loc["prefixshield", "active_peak_blocks"] >= 500
    assert abs(t.loc["prefixshield", "hit_ratio_diff"]) <= 0.005


def _replay(quick, wait):
    t = table(quick, "ablation-delayed-replay")
    return t[t["wait_factor"] == wait].iloc[0]


@pytest.mark.parametrize("wait", [0.0, 0.5])
def test_replay_while_in_debt_is_gated(quick, wait):
    row = _replay(quick, wait)
    assert row["gate on promoted"] == 0 and row["gate on gated"] > 0
    assert row["gate off gated"] == 0 and row["gate off promoted"] > 0


QUICK_GATE_REASON = (
    "quick size (3 seeds): the victim's measured pass hits as much with the gate as without "
    "(99.08% both at wait 0, 99.39% at 0.5: +0.00 pp [+0.00, +0.00]); the indebted attacker's "
    "blocks are reclaimed first either way. The 10-seed behaviour test does not hold either "
    "(tests/regression/test_behaviour.py)")


@pytest.mark.parametrize("wait", [
    pytest.param(0.0, marks=pytest.mark.xfail(strict=True, reason=QUICK_GATE_REASON)),
    pytest.param(0.5, marks=pytest.mark.xfail(strict=True, reason=QUICK_GATE_REASON)),
])
def test_the_victim_gains_from_the_gate(quick, wait):
    assert _replay(quick, wait)["victim gap ci_low"] > 0


def test_after_the_clearance_time_gate_and_no_gate_converge(quick):
    row = _replay(quick, 1.0)
    assert row["victim gap ci_low"] <= 0 <= row["victim gap ci_high"]
    assert row["gate on promoted"] > 0


@pytest.mark.xfail(strict=True, reason=(
    "quick size (20 s, not the sweep's 40 s): the measured ratio is 0.61 at the 0.5 point and "
    "1.21 at 1 against the reference's 0.54 and 1.02 (a short window holds few attacker "
    "requests); 2.12 and 4.23 at 2 and 4, within 10%"))
def test_measured_pressure_matches_the_designed_ratio(quick):
    """At each one-touch sweep point the attacker's measured ratio is within 10% of the one
    the reference measured there."""
    from prefixshield.workloads.one_touch import PRESSURE_SWEEP

    t = table(quick, "sweep-pressure")
    reference = {0.5: 0.54, 1.0: 1.02, 2.0: 2.14, 4.0: 4.23}
    for nominal, designed in PRESSURE_SWEEP:
        measured = t[np.isclose(t["grid.pressure_ratio"], designed)
                     & (t["policy"] != "static_quota")]["attacker_pressure_ratio_mean"]
        assert len(measured), designed
        assert np.allclose(measured, reference[nominal], rtol=0.10), (nominal, list(measured))


def test_worst_cases_per_scheduler_with_queueing_and_transfer(quick):
    from prefixshield.experiments.reproduce import ALL, SCHEDULER_SETTINGS

    w = table(quick, "worst-cases")
    labels = [label for _, label, _ in SCHEDULER_SETTINGS]
    assert list(w["scheduler"]) == [lab for lab in labels for _ in ALL]
    assert list(w["policy"]) == list(ALL) * len(labels)
    assert set(w["trials"]) == {3}
    for col in ("victim P95 TTFT held-out (s): control -> worst",
                "victim P95 queue held-out (s): control -> worst",
                "attacker block-s/s (measured)"):
        assert w[col].astype(str).str.contains(r"\d").all(), col
    for key, _, _ in SCHEDULER_SETTINGS:
        t = table(quick, f"worst-cases-transfer-{key}")
        assert list(t.columns[1:]) == list(ALL)
        assert (quick / "attack-search" / key / "attack_search.md").exists()
    index = (quick / "index.md").read_text()
    assert "KV block-seconds/s" in index   # the budget in force is stated


def test_every_scheduler_is_run_on_the_benign_workloads(quick):
    from prefixshield.experiments.reproduce import ALL, SCHEDULER_SETTINGS

    t = table(quick, "schedulers-benign")
    assert len(t) == 2 * len(SCHEDULER_SETTINGS) * len(ALL)
    assert set(t["scheduler"]) == {k for k, _, _ in SCHEDULER_SETTINGS}
    assert np.isfinite(t["p95_queue_s"]).all() and np.isfinite(t["hit_ratio"]).all()
    # fcfs is the benign and borrowing tables' own runs
    benign = table(quick, "benign")
    fc = t[(t["scheduler"] == "fcfs") & (t["workload"] == "sharegpt")]
    b = benign[benign["workload"] == "sharegpt"].set_index("policy")
    for _, r in fc.iterrows():
        assert r["hit_ratio"] == pytest.approx(b.loc[r["policy"], "hit_ratio_mean"])
