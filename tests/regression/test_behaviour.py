"""The reference's claims about policy behaviour (DESIGN §7-§8), as paired multi-seed tests.

Every test runs the workload's defaults (512 blocks, ``l4-qwen2.5-1.5b``, alpha 0.6, real output
lengths, load measured with the workload's own request shapes) unless the claim names another
point, gives every policy the identical trace per seed, and judges a claim by the mean over
seeds and the 95% paired bootstrap CI of the difference (10,000 resamples, fixed seed), as
``prefixshield compare`` prints them. A test states the claim, not the margin a policy wins by.

Where the simulator does not reproduce a claim, the test still states it and is marked
``xfail(strict=True)`` with the measured numbers in its reason: it fails CI the day the claim
starts to hold (so the reason gets revisited), and a neighbouring test pins the mechanism that
explains the difference.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

import numpy as np
import pytest

from prefixshield.experiments.paired import run_paired
from prefixshield.experiments.single import RunSpec, build_trace, run_policies
from prefixshield.simulator.config import EngineConfig
from prefixshield.simulator.costmodel import load_profile
from prefixshield.simulator.metrics import paired_difference

SEEDS = tuple(range(10))
"""The reference's 10 paired runs."""
PROFILE = load_profile("l4-qwen2.5-1.5b")
ALL = ("lru", "s3fifo", "static_quota", "prefixshield")


@lru_cache(maxsize=None)
def _runs(workload: str, policies: tuple[str, ...], num_blocks: int = 512, alpha: float = 0.6,
          overrides: tuple = ()):
    spec = RunSpec(workload=workload, policies=policies, engine=EngineConfig(num_blocks=num_blocks),
                   profile=PROFILE, alpha=alpha, overrides=dict(overrides))
    return run_paired(spec, list(SEEDS))


def hit(runs, policy: str) -> np.ndarray:
    """Victim (or all measured) hit ratio per seed, in seed order."""
    return runs[runs["policy"] == policy].sort_values("seed")["hit_ratio"].to_numpy()


def gain(runs, policy: str = "prefixshield", baseline: str = "lru") -> dict:
    """Paired hit-ratio difference ``policy - baseline`` with its 95% bootstrap CI."""
    return paired_difference(hit(runs, policy), hit(runs, baseline))


def _pair(workload, num_blocks=512, alpha=0.6, **overrides):
    return _runs(workload, ("lru", "prefixshield"), num_blocks, alpha,
                 tuple(sorted(overrides.items())))


# ------------------------------------------------------------------------------ one_touch
def test_one_touch_prefixshield_protects_the_victim_with_a_ci_above_zero():
    """Claim (G1): at 512 blocks PrefixShield keeps more of the victim's hits than LRU (and
    S3-FIFO), and the paired PrefixShield-LRU CI lies above zero. Measured (the background
    population): 3.89% vs LRU 2.80%, +1.09 pp [+0.25, +2.06]; S3-FIFO 3.11%."""
    runs = _runs("one_touch", ALL)
    mean = {p: hit(runs, p).mean() for p in ALL if p != "static_quota"}
    assert mean["prefixshield"] > mean["s3fifo"], mean
    assert mean["prefixshield"] > mean["lru"], mean
    assert gain(runs)["ci_low"] > 0


def test_one_touch_static_quota_cannot_serve_the_eight_group_population():
    """The static quota beside the claim above: with the background population the trace
    configures 8 groups, so each one's share is 511 // 8 = 63 blocks, fewer than one victim
    request's 97-98 blocks: the quota can never admit the victim's first request and fails
    every seed (the LRU > StaticQuota ordering of the two-group reading has no number to
    compare)."""
    runs = _runs("one_touch", ("lru", "static_quota"))
    sq = runs[runs["policy"] == "static_quota"]
    assert (sq["status"] == "failed").all()
    assert sq["error"].str.contains("at most 63 with nothing running").all()
    two = _runs("one_touch", ("lru", "static_quota"), overrides=(("population", "two_group"),))
    assert hit(two, "lru").mean() > hit(two, "static_quota").mean() == 0


def test_one_touch_s3fifo_at_least_matches_lru():
    """Claim: S3-FIFO >= LRU on one_touch at 512 blocks (means over seeds). Measured: 3.11%
    against 2.80% (paired +0.32 pp [-0.12, +0.79]). (Under the two-group reading it did not
    hold: 7.6% against 8.1%.)"""
    runs = _runs("one_touch", ALL)
    assert hit(runs, "s3fifo").mean() >= hit(runs, "lru").mean()


def test_protection_grows_from_512_to_4096_blocks():
    """Claim: the PrefixShield-LRU gain grows with capacity, because what in-flight requests
    pin leaves the policy more room to choose in a larger cache. Measured (C_prefill of the
    reference pool, so the same rates and attack at every size): +1.09 pp at 512, +92.87 pp at
    4,096 blocks."""
    small, large = gain(_pair("one_touch", 512)), gain(_pair("one_touch", 4096))
    assert large["mean_diff"] > small["mean_diff"] > 0


@pytest.mark.parametrize("alpha", [0.4, 0.6, 0.8])
def test_protection_is_positive_at_loads_40_60_80_percent(alpha):
    """Claim: the gain stays positive across loads. Measured: +31.39, +1.09, +3.10 pp."""
    assert gain(_pair("one_touch", alpha=alpha))["ci_low"] > 0


# ------------------------------------------------------------------------------ pressure
PRESSURES = (0.5, 1.0, 2.0, 4.0)
"""The nominal points of the reference's creation-pressure sweep, a one-touch sweep."""
REFERENCE_MEASURED = {0.5: 0.54, 1.0: 1.02, 2.0: 2.14, 4.0: 4.23}
"""The pressure ratios the reference measured at those points."""


def _pressure(ratio, policies=("lru", "prefixshield")):
    """one_touch at the sweep point ``ratio``: its designed pressure and fitted window
    (``prefixshield.workloads.one_touch.PRESSURE_SWEEP``), as ``reproduce`` runs it."""
    from prefixshield.workloads.one_touch import PRESSURE_SWEEP, PRESSURE_SWEEP_DURATION_S

    return _runs("one_touch", policies, overrides=(
        ("duration_s", PRESSURE_SWEEP_DURATION_S),
        ("pressure_ratio", dict(PRESSURE_SWEEP)[ratio])))


@pytest.mark.parametrize("ratio", [
    pytest.param(0.5, marks=pytest.mark.xfail(strict=True, reason=(
        "at 0.5 the measured ratio is 0.60 (the reference: 0.54, +12%): the attacker sends "
        "one 97-block request every 11.7 s, 4 in the 40 s window, and the designed rate that "
        "gives 0.54 on the fit's seed 100 gives 0.60-0.61 on seeds 0-9; 1, 2, 4 measure 1.06, "
        "2.11, 4.23"))),
    1.0, 2.0, 4.0])
def test_measured_pressure_matches_the_designed_ratio(ratio):
    """The pressure knob does what it says: at each sweep point the attacker's measured
    creation (prompt and decode blocks over its refill) is within 10% of the ratio the
    reference measured there."""
    measured = _pressure(ratio)["attacker_pressure_ratio"].to_numpy()
    assert np.allclose(measured, REFERENCE_MEASURED[ratio], rtol=0.10), (ratio, measured)


@pytest.mark.xfail(strict=True, reason=(
    "below refill PrefixShield still gains: at the 0.5 point (measured 0.60) +1.12 pp "
    "[+0.71, +1.53] (98.48% against LRU's 97.37%): nobody is in debt, but the retention "
    "classes keep the victim's reused hot prefixes over the attacker's and the background "
    "groups' once-touched blocks, which LRU does not (the next test pins it)"))
def test_no_protection_below_refill():
    """Claim: below refill (the sweep's 0.5 point) the gain's CI includes zero."""
    runs = _pressure(0.5)
    assert runs["attacker_pressure_ratio"].max() < 1
    d = gain(runs)
    assert d["ci_low"] <= 0 <= d["ci_high"]


def test_below_refill_the_debt_machinery_is_idle():
    """Mechanism behind the previous test: below refill no group owes anything, so the debt
    machinery is idle (responsibility off changes nothing) and PrefixShield differs from LRU
    only by its retention classes (segmentation off gives LRU's result exactly); the classes
    are what gains (PrefixShield above LRU on every seed)."""
    runs = _pressure(0.5, ("lru", "prefixshield", "prefixshield:segmentation=false",
                           "prefixshield:responsibility=false"))
    assert (runs["attacker_mean_debt_blocks"] == 0).all()
    assert np.array_equal(hit(runs, "prefixshield:segmentation=false"), hit(runs, "lru"))
    assert np.array_equal(hit(runs, "prefixshield:responsibility=false"),
                          hit(runs, "prefixshield"))
    assert (hit(runs, "prefixshield") > hit(runs, "lru")).all()


def test_protection_grows_with_pressure():
    """Claim: the PrefixShield-LRU gain grows with the creation pressure (the one-touch sweep's
    0.5, 1, 2, 4). Measured: +1.12, +3.00, +6.56, +16.88 pp (LRU 97.37%, 95.28%, 90.84%,
    80.17%; PrefixShield 97.0-98.5% throughout)."""
    gains = [gain(_pressure(r))["mean_diff"] for r in PRESSURES]
    assert all(b >= a for a, b in zip(gains, gains[1:])), gains


# ------------------------------------------------------------------------------ controls
@pytest.mark.parametrize("workload", ["one_touch", "low_and_slow", "two_pass_replay"])
def test_no_attack_control_prefixshield_matches_lru(workload):
    """Claim: the mechanism costs nothing without an attacker: the victim's mean hit ratio
    under PrefixShield is within 0.5 percentage points of LRU's. The control keeps the attacker
    configured but silent (same groups, same quota sizes). Measured: +0.00 pp on every seed of
    all three."""
    runs = _pair(workload, attack=False)
    assert abs(gain(runs)["mean_diff"]) <= 0.005
    assert (runs["attacker_pressure_ratio"] == 0).all()


# ------------------------------------------------------------------------------ borrowing
def test_borrowing_quota_caps_the_active_group_and_work_conserving_policies_lend():
    """Claim (G3): with the second group idle, S3-FIFO and PrefixShield let the active group
    use (nearly) the whole cache, the static quota never more than its share, and PrefixShield
    costs nothing against LRU (mean within 0.5 pp; measured +0.00 pp)."""
    spec = RunSpec("borrowing", ALL, EngineConfig(), PROFILE)
    for seed in SEEDS[:3]:
        s = replace(spec, seed=seed)
        trace, _ = build_trace(s)
        runs = run_policies(trace, s)

        def peak(p):
            r = runs[p]
            return int(r.occupancy[:, r.groups.index("active")].max())

        assert peak("static_quota") <= 511 // 2
        assert peak("s3fifo") >= 500 and peak("prefixshield") >= 500
    runs = _runs("borrowing", ("lru", "prefixshield"))
    assert abs(gain(runs)["mean_diff"]) <= 0.005


# ------------------------------------------------------------------------------ delayed replay
def _replay(wait_factor):
    spec = RunSpec("delayed_replay", ("prefixshield", "prefixshield:debt_gate=false"),
                   EngineConfig(), PROFILE, overrides={"wait_factor": wait_factor})
    rows = []
    for seed in SEEDS:
        s = replace(spec, seed=seed)
        trace, _ = build_trace(s)
        for label, r in run_policies(trace, s).items():
            rec = r.records
            neutral = r.evictions[r.groups.index("benign")]  # the neutral phase's requests
            rows.append({
                "neutral_victim_evicted": int(neutral[r.groups.index("victim")]),
                "neutral_attacker_evicted": int(neutral[r.groups.index("attacker")]),
                "seed": seed, "policy": label,
                "victim_hit": rec.loc[(rec["role"] == "victim") & rec["measured"],
                                      "hit_fraction"].mean(),
                "eligible": int(rec.loc[rec["role"] == "attacker", "cached_tokens"].sum()) // 16,
                "granted": r.policy_stats["promotions_granted"]["attacker"],
                "gated": r.policy_stats["promotions_gated"]["attacker"]})
    return rows


@lru_cache(maxsize=None)
def _replay_table(wait_factor):
    import pandas as pd
    return pd.DataFrame(_replay(wait_factor))


def _gated_vs_open(wait_factor):
    t = _replay_table(wait_factor)
    on = t[t["policy"] == "prefixshield"].sort_values("seed")
    off = t[t["policy"] == "prefixshield:debt_gate=false"].sort_values("seed")
    return on, off


@pytest.mark.parametrize("wait_factor", [0.0, 0.5])
def test_replay_while_in_debt_is_gated(wait_factor):
    """Claim (G2, invariant I2): a replay before the debt is repaid manufactures no REUSE block
    (the gate refuses every promotion; without it every replayed hit is promoted, at least the
    blocks the replays' first scheduling hit, more where a preempted replay hits its blocks
    again). Measured over 10 seeds: 192 and 91.4 blocks promoted without the gate at waits 0
    and 0.5 (at 0.5 the victim's and background traffic of the wait evicted some of the
    attacker's blocks before the replay), 0 with it."""
    on, off = _gated_vs_open(wait_factor)
    assert (on["eligible"].to_numpy() > 0).all()
    assert (on["granted"] == 0).all() and (on["gated"] > 0).all()
    assert (off["gated"] == 0).all()
    assert (off["granted"].to_numpy() >= off["eligible"].to_numpy()).all()


GATE_REASON = (
    "the victim's pass after the neutral phase hits as much without the gate as with it: "
    "+0.00 pp on every seed at wait 0 (98.58% both) and at 0.5 (99.28% both; LRU 61.5% and "
    "83.2% in reproduce's table). The gate refuses every replay promotion (192 and 91.4 "
    "blocks), but the attacker is in debt and responsibility reclaims the indebted group's "
    "blocks first whatever their class: at wait 0 the neutral phase evicts the same blocks either way (55.2 attacker- and "
    "9.3 victim-owned), at 0.5 0.3 victim-owned blocks with the gate, 1.6 without, none of "
    "which the pass hits. With responsibility off the gate does show: 77.27% against 73.16% "
    "at wait 0 (compat 0.10, as reproduce runs it; the next test pins it)")


@pytest.mark.parametrize("wait_factor", [
    pytest.param(0.0, marks=pytest.mark.xfail(strict=True, reason=GATE_REASON)),
    pytest.param(0.5, marks=pytest.mark.xfail(strict=True, reason=GATE_REASON))])
def test_the_victim_gains_from_the_gate(wait_factor):
    """Claim: the victim keeps more of its hits with the gate than without (paired CI above
    zero), judged on its measured pass over its hot prefixes after the neutral phase."""
    on, off = _gated_vs_open(wait_factor)
    d = paired_difference(on["victim_hit"].to_numpy(), off["victim_hit"].to_numpy())
    assert d["ci_low"] > 0, d


def test_while_in_debt_responsibility_decides_what_the_neutral_phase_evicts():
    """Mechanism behind the previous test: at wait 0 the neutral phase's evictions by owner are
    the same whether the replayed blocks were promoted or not, on every seed, most of them the
    attacker's; with responsibility off (the indebted group no longer reclaimed first) the
    gate raises the victim's pass hit ratio (means over seeds, waits 0 and 0.5)."""
    on, off = _gated_vs_open(0.0)
    for col in ("neutral_victim_evicted", "neutral_attacker_evicted"):
        assert np.array_equal(on[col].to_numpy(), off[col].to_numpy()), col
    assert on["neutral_attacker_evicted"].sum() > on["neutral_victim_evicted"].sum()
    for wait in (0.0, 0.5):
        runs = _runs("delayed_replay", ("prefixshield:responsibility=false",
                                        "prefixshield:debt_gate=false,responsibility=false"),
                     overrides=(("wait_factor", wait),))
        assert hit(runs, "prefixshield:responsibility=false").mean() > hit(
            runs, "prefixshield:debt_gate=false,responsibility=false").mean(), wait


def test_after_the_clearance_time_gate_and_no_gate_converge():
    """Claim (the gate is never permanent): replaying after the designed clearance time, the
    victim's hit ratio with and without the gate agree (paired CI includes zero) and the gate
    grants promotions again. Measured: +0.00 pp on every seed (99.14%); the gate granted 31.0
    of the 63.3 blocks granted without it (the bucket refills only to the clearance point)."""
    on, off = _gated_vs_open(1.0)
    d = paired_difference(on["victim_hit"].to_numpy(), off["victim_hit"].to_numpy())
    assert d["ci_low"] <= 0 <= d["ci_high"], d
    assert on["granted"].sum() > 0
