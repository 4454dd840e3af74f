"""The searched_attack workload: the one_touch point reproduces one_touch, the control does not
depend on the attack, every point of the space generates and keeps the budget."""

from __future__ import annotations

import math

import numpy as np
import pytest

from prefixshield.experiments.attack_space import SPACE, known_points, suggest, to_optuna_params
from prefixshield.workloads import generate
from prefixshield.workloads.searched_attack import SearchedAttackParams, on_intervals


def same_requests(a, b) -> bool:
    A, B = a.requests.reset_index(drop=True), b.requests.reset_index(drop=True)
    if len(A) != len(B) or list(A.columns) != list(B.columns):
        return False
    for c in A.columns:
        if c in ("segment_ids", "segment_lengths"):
            if not all(np.array_equal(x, y) for x, y in zip(A[c], B[c])):
                return False
        elif not A[c].equals(B[c]):
            return False
    return True


def random_points(n: int, seed: int = 0) -> list[dict]:
    optuna = pytest.importorskip("optuna")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    out = []
    for _ in range(n):
        t = study.ask()
        out.append(suggest(t))
        study.tell(t, 0.0)
    return out


@pytest.mark.parametrize("seed", [0, 3])
def test_default_point_is_one_touch_row_for_row(seed):
    # searched_attack keeps the two-group population: its default point is that one_touch
    assert same_requests(generate("one_touch", seed=seed, population="two_group"),
                         generate("searched_attack", seed=seed))


def test_one_touch_point_of_the_space_at_an_explicit_budget_is_one_touch_at_that_rate():
    p = SearchedAttackParams(budget_requests=0.5, budget_prompt_tokens=2000.0)
    rate = p.budget_rate()   # min(0.5, 2000 / 1584)
    assert rate == 0.5
    point = known_points({"one_touch": rate, "low_and_slow": rate, "two_pass_replay": rate},
                         {"one_touch": 9.0, "low_and_slow": 0.1, "two_pass_replay": 0.2}, 1536)
    fields = point["one_touch"]
    a = generate("searched_attack", seed=1, budget_requests=0.5, budget_prompt_tokens=2000.0,
                 **fields)
    b = generate("one_touch", seed=1, attacker_rate=rate, population="two_group")
    assert same_requests(a, b)


def test_control_is_one_trace_whatever_the_attack():
    ref = generate("searched_attack", seed=2, attack=False)
    assert set(ref.requests["role"]) == {"victim"}
    assert ref.meta["tenants"] == {"groups": ["victim", "attacker"],
                                   "contracts": ["standard", "best_effort"]}
    for fields in random_points(5, seed=1):
        c = generate("searched_attack", seed=2, attack=False, **fields)
        assert same_requests(ref, c)
        assert c.meta["tenants"] == ref.meta["tenants"]
        # and the attack trace has exactly the control's victim rows
        a = generate("searched_attack", seed=2, **fields)
        victim = a.requests[a.requests["role"] == "victim"].drop(columns="request_id")
        for col in ("arrival_s", "prefix_id", "output_tokens"):
            assert victim[col].reset_index(drop=True).equals(
                ref.requests[col].reset_index(drop=True))
        assert a.meta["tenants"] == ref.meta["tenants"]


def test_every_sampled_point_generates_and_keeps_the_budget():
    base_rate = 0.643
    for fields in random_points(40, seed=7):
        p = SearchedAttackParams(seed=4, base_rate=base_rate, duration_s=30.0, **fields)
        tr = generate("searched_attack", seed=4, base_rate=base_rate, duration_s=30.0, **fields)
        m = tr.meta
        w0, w1 = m["pressure_window_s"]
        att = tr.requests[tr.requests["role"] == "attacker"]
        expected = math.ceil((w1 - w0) * p.request_rate() - 1e-9)
        assert m["attacker_requests"] == len(att) == expected, fields
        assert ((att["arrival_s"] >= w0) & (att["arrival_s"] < w1)).all()
        limits = p.limits()
        assert len(att) / (w1 - w0) <= limits["requests"] * (1 + 1e-9) + 1 / (w1 - w0)
        # prompt tokens: within one request and the random suffixes of the limit
        prompt = np.array([int(np.sum(x)) for x in att["segment_lengths"]])
        mean_prompt = p.attack_prefix_tokens + p.mean_suffix_tokens
        slack = (p.suffix_tokens[1] - p.mean_suffix_tokens) / mean_prompt
        assert prompt.sum() / (w1 - w0) <= limits["prompt_tokens"] * (1 + slack) \
            + mean_prompt / (w1 - w0) + 1e-6
        assert m["attacker_admissions"] + m["attacker_reuses"] + m["attacker_replays"] == len(att)
        if fields["attacker_output_tokens"] is not None:
            assert (att["output_tokens"] == fields["attacker_output_tokens"]).all()
        assert set(att["contract"]) <= {"best_effort", "standard"}


def test_replays_reuse_an_admitted_prompt_after_the_designed_delay():
    tr = generate("searched_attack", seed=0, replay_fraction=0.9, replay_delay=0.0,
                  duration_s=30.0)
    att = tr.requests[tr.requests["role"] == "attacker"]
    assert tr.meta["attacker_replays"] > 0
    first = {}
    for _, r in att.iterrows():
        key = int(r["prefix_id"])
        if key in first:
            assert np.array_equal(r["segment_ids"], first[key])   # same prefix and suffix
        else:
            first[key] = r["segment_ids"]
    # each admission is replayed at most once
    counts = att["prefix_id"].value_counts()
    assert counts.max() <= 2


def test_on_off_cycles_always_leave_on_time_in_the_window():
    for cycle, duty, phase in ((1.0, 0.1, 0.0), (120.0, 0.1, 0.999), (7.0, 0.5, 0.5)):
        iv = on_intervals(10.0, 40.0, cycle, duty, phase)
        assert (iv[:, 1] > iv[:, 0]).all() and iv[0, 0] >= 10.0 and iv[-1, 1] <= 40.0
        assert np.sum(iv[:, 1] - iv[:, 0]) > 0


def test_params_name_what_is_wrong():
    with pytest.raises(ValueError, match="not pressure_ratio"):
        SearchedAttackParams(pressure_ratio=2.0)
    with pytest.raises(ValueError, match="budget_limits"):
        SearchedAttackParams(budget_limits="bogus")
    with pytest.raises(ValueError, match="attacker_alt_contract"):
        SearchedAttackParams(attacker_alt_contract="critical")
    with pytest.raises(ValueError, match="attacker_output_tokens"):
        SearchedAttackParams(attacker_output_tokens=5000)


def test_space_dims_name_params_fields_and_round_trip():
    import dataclasses

    fields = {f.name for f in dataclasses.fields(SearchedAttackParams)}
    assert {d.name for d in SPACE} <= fields
    pts = known_points({"one_touch": 0.7, "low_and_slow": 0.7, "two_pass_replay": 0.7},
                       {"one_touch": 0.7, "low_and_slow": 0.2, "two_pass_replay": 0.3}, 1536)
    for pt in pts.values():
        params = to_optuna_params(pt)
        assert all(not k.endswith("__mode") or v in ("value", "no pool", "periodic", "data")
                   for k, v in params.items())
    with pytest.raises(ValueError, match="outside the attack space"):
        to_optuna_params({**pts["one_touch"], "duty": 0.01})
