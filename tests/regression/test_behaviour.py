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
    """Claim (G1): at 512 blocks PrefixShield keeps more of the victim's hits than LRU, and the
    paired PrefixShield-LRU CI lies above zero; LRU beats the static quota (whose 255-block
    share cannot hold the 384-block hot set). Measured: 18.8% vs 8.1%, +10.7 pp [+9.7, +11.8];
    S3-FIFO 7.6%; static quota 0.0% (the share holds fewer blocks than the four prefixes it
    cycles through, so its own LRU order evicts each one before its next use)."""
    runs = _runs("one_touch", ALL)
    mean = {p: hit(runs, p).mean() for p in ALL}
    assert mean["prefixshield"] > mean["s3fifo"], mean
    assert mean["prefixshield"] > mean["lru"] > mean["static_quota"], mean
    assert gain(runs)["ci_low"] > 0


@pytest.mark.xfail(strict=True, reason=(
    "S3-FIFO >= LRU does not hold at 512 blocks: 7.6% vs 8.1%, paired -0.5 pp [-1.8, +1.1] "
    "over 10 seeds. Its small FIFO (10% = 51 blocks) is shorter than one "
    "96-block prefix, so a hot prefix freed by its request is evicted from the small queue "
    "before its next use can raise its frequency"))
def test_one_touch_s3fifo_at_least_matches_lru():
    """Claim: S3-FIFO >= LRU on one_touch at 512 blocks (means over seeds)."""
    runs = _runs("one_touch", ALL)
    assert hit(runs, "s3fifo").mean() >= hit(runs, "lru").mean()


def test_protection_grows_from_512_to_4096_blocks():
    """Claim: the PrefixShield-LRU gain grows with capacity, because what in-flight requests
    pin leaves the policy more room to choose in a larger cache. Measured (C_prefill of the
    reference pool, so the same rates and attack at every size): +10.7 pp at 512, +90.7 pp at
    4,096 blocks (not monotone in between: +97.1 at 1,024, +95.5 at 2,048)."""
    small, large = gain(_pair("one_touch", 512)), gain(_pair("one_touch", 4096))
    assert large["mean_diff"] > small["mean_diff"] > 0


@pytest.mark.parametrize("alpha", [0.4, 0.6, 0.8])
def test_protection_is_positive_at_loads_40_60_80_percent(alpha):
    """Claim: the gain stays positive across loads. Measured: +86.0, +10.7, +15.4 pp."""
    assert gain(_pair("one_touch", alpha=alpha))["ci_low"] > 0


# ------------------------------------------------------------------------------ pressure
PRESSURES = (0.5, 1.0, 2.0, 4.0)


def _pressure(ratio, policies=("lru", "prefixshield")):
    return _runs("low_and_slow", policies, overrides=(("pressure_ratio", ratio),))


@pytest.mark.parametrize("ratio", [
    pytest.param(0.5, marks=pytest.mark.xfail(strict=True, reason=(
        "at 0.5 the measured ratio is 0.575 (+15%): the attacker sends one request every "
        "12.1 s, 4 in the 42 s window where 3.46 are designed (the reference measured 0.54 at "
        "its 0.5 point); 1, 2, 4 measure 1.007, 2.013, 4.025"))),
    1.0, 2.0, 4.0])
def test_measured_pressure_matches_the_designed_ratio(ratio):
    """The pressure knob does what it says: the attacker's measured creation (prompt and
    decode blocks over its refill) is within 10% of the designed ratio."""
    measured = _pressure(ratio)["attacker_pressure_ratio"].to_numpy()
    assert np.allclose(measured, ratio, rtol=0.10), (ratio, measured)


def test_no_protection_below_refill():
    """Claim: at a measured pressure ratio <= 0.6 the gain's CI includes zero. Measured: 0.575;
    PrefixShield and LRU both 99.25%, +0.0 pp on every seed."""
    runs = _pressure(0.5)
    assert runs["attacker_pressure_ratio"].max() <= 0.6
    d = gain(runs)
    assert d["ci_low"] <= 0 <= d["ci_high"]


def test_below_refill_the_debt_machinery_is_idle():
    """Mechanism behind the previous test: below refill no group owes anything, so the debt
    machinery is idle (responsibility off changes nothing) and PrefixShield could differ from
    LRU only by its retention classes (segmentation off gives LRU's result exactly); here the
    classes change nothing either (PrefixShield gives LRU's result exactly)."""
    runs = _pressure(0.5, ("lru", "prefixshield", "prefixshield:segmentation=false",
                           "prefixshield:responsibility=false"))
    assert (runs["attacker_mean_debt_blocks"] == 0).all()
    assert np.array_equal(hit(runs, "prefixshield:segmentation=false"), hit(runs, "lru"))
    assert np.array_equal(hit(runs, "prefixshield:responsibility=false"),
                          hit(runs, "prefixshield"))
    assert np.array_equal(hit(runs, "prefixshield"), hit(runs, "lru"))


def test_protection_grows_with_pressure():
    """Claim: the PrefixShield-LRU gain grows with the creation pressure (0.5, 1, 2, 4).
    Measured: +0.0, +0.0, +0.0, +0.2 pp: it holds, but flatly. At the fitted low_and_slow
    attacker (one prefix every few seconds beside a victim that reuses each hot prefix about
    every 0.7 s) LRU itself loses nothing up to pressure 2 (99.25%) and 0.2 pp at 4 (99.04%);
    its 6.6-pp loss needs pressure 7.5, the workload's default."""
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
            rows.append({
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
    again). Measured over 10 seeds: 192.5 blocks promoted without the gate at both waits, 0
    with it."""
    on, off = _gated_vs_open(wait_factor)
    assert (on["eligible"].to_numpy() > 0).all()
    assert (on["granted"] == 0).all() and (on["gated"] > 0).all()
    assert (off["gated"] == 0).all()
    assert (off["granted"].to_numpy() >= off["eligible"].to_numpy()).all()


@pytest.mark.parametrize("wait_factor", [
    pytest.param(0.0, marks=pytest.mark.xfail(strict=True, reason=(
        "the victim's gain from the gate is +0.01 pp [+0.00, +0.02] at wait 0: the gate keeps "
        "more of the victim's blocks cached through the neutral phase (19 victim-owned blocks "
        "evicted with it, 127 without: reproduce's delayed-replay table) but the victim's hit "
        "ratio is 99.24% against 99.23%, so those are blocks its later requests barely hit"))),
    0.5])
def test_the_victim_gains_from_the_gate(wait_factor):
    """Claim: the victim keeps more of its hits with the gate than without (paired CI above
    zero). Measured: +0.01 pp [+0.00, +0.02] at wait 0, +0.07 pp [+0.02, +0.11] at 0.5."""
    on, off = _gated_vs_open(wait_factor)
    d = paired_difference(on["victim_hit"].to_numpy(), off["victim_hit"].to_numpy())
    assert d["ci_low"] > 0, d


def test_after_the_clearance_time_gate_and_no_gate_converge():
    """Claim (the gate is never permanent): replaying after the designed clearance time, the
    victim's hit ratio with and without the gate agree (paired CI includes zero) and the gate
    grants promotions again. Measured: +0.00 pp on every seed; the gate granted all 192.5
    eligible blocks."""
    on, off = _gated_vs_open(1.0)
    d = paired_difference(on["victim_hit"].to_numpy(), off["victim_hit"].to_numpy())
    assert d["ci_low"] <= 0 <= d["ci_high"], d
    assert on["granted"].sum() > 0
