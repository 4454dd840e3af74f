"""The attack workloads' traffic population: the victim's share of the base load, the benign
background groups that send the rest, the ``two_group`` preset (the traces as they were) and
what a run's header says of them."""

from __future__ import annotations

import math

import numpy as np
import pytest

from prefixshield.workloads import generate, make_params
from prefixshield.workloads.population import (POPULATIONS, background_names, background_rate,
                                               population_text)

ATTACKS = ["one_touch", "low_and_slow", "two_pass_replay", "delayed_replay"]
# The two_group preset draws every earlier trace: tests/workloads/test_trace_digests.py.


@pytest.mark.parametrize("name", ATTACKS)
def test_the_background_groups_send_what_the_victim_does_not_of_the_base_load(name):
    extra = {"two_pass_replay": {"pressure_ratio": 1.0},
             "delayed_replay": {"judge": "run"}}.get(name, {})  # the phased one: below
    p = make_params(name, seed=3, base_rate=6.0, victim_share=0.5, duration_s=60.0, **extra)
    assert p.background_groups == 6 and p.population == "background"
    assert p.victim_request_rate == pytest.approx(3.0)
    assert background_rate(p) * p.background_groups + p.victim_request_rate \
        == pytest.approx(p.base_rate)
    t = generate(name, **{**{k: getattr(p, k) for k in ("seed", "base_rate", "victim_share",
                                                         "duration_s", "pressure_ratio")},
                          **extra})
    groups = background_names(p)
    assert t.group_names()[:2 + len(groups)] == ["victim", "attacker", *groups]
    r = t.requests
    span = t.meta["measure_end_s"] - t.meta["measure_start_s"]
    victim = r[(r["group"] == "victim") & r["measured"]]
    bg = r[r["group"].isin(groups)]
    # Poisson counts: within 4 standard deviations of rate x span
    for n, rate in ((len(victim), 3.0), (len(bg), 3.0)):
        assert abs(n - rate * span) < 4 * math.sqrt(rate * span)
    assert set(bg["role"]) == {"benign"} and set(bg["contract"]) == {"standard"}
    assert bg["measured"].all()
    # each background group reuses one system prompt of background_prefix_tokens
    for g in groups:
        first = {s[0] for s in r.loc[r["group"] == g, "segment_ids"]}
        lens = {int(s[0]) for s in r.loc[r["group"] == g, "segment_lengths"]}
        assert len(first) == 1 and lens == {p.background_prefix_tokens}
    pg = [g for g in t.meta["population_groups"] if g["role"] != "neutral"]
    assert [g["group"] for g in pg] == ["victim", *groups, "attacker"]
    assert sum(g["rate_req_per_s"] for g in pg if g["role"] != "attacker") \
        == pytest.approx(6.0)


def test_a_control_keeps_the_background_and_drops_only_the_attacker():
    kw = dict(seed=1, base_rate=6.0, victim_share=0.5)
    att, ctl = generate("low_and_slow", **kw), generate("low_and_slow", attack=False, **kw)
    keep = att.requests[att.requests["role"] != "attacker"].reset_index(drop=True)
    got = ctl.requests.reset_index(drop=True)
    assert np.array_equal(keep["request_id"], got["request_id"])
    assert keep["group"].tolist() == got["group"].tolist()
    assert ctl.group_names() == att.group_names()


def test_the_header_names_every_group_with_its_contract_and_rate():
    t = generate("one_touch", seed=0, base_rate=6.0, victim_share=0.5)
    line = population_text(t.meta)
    assert line.startswith("population (background): 8 groups; victim share 0.5")
    assert "victim (victim, standard) 3 req/s" in line
    assert "6 background groups tenant1..tenant6 (benign, standard) 0.5 req/s each" in line
    assert "attacker (attacker, best_effort)" in line
    two = population_text(generate("one_touch", seed=0, base_rate=6.0,
                                   population="two_group").meta)
    assert two.startswith("population (two_group): 2 groups; victim share 1")


def test_an_explicit_value_wins_over_the_population_and_the_presets_differ():
    assert make_params("low_and_slow", population="two_group", pressure_ratio=2.0) \
        .pressure_ratio == 2.0
    two = make_params("low_and_slow", population="two_group")
    assert (two.background_groups, two.victim_share, two.pressure_ratio) == (0, 1.0, 7.5)
    bg = make_params("low_and_slow")
    assert bg.background_groups == 6 and bg.victim_share < 1 and bg.pressure_ratio == 1.25
    assert make_params("one_touch", victim_rate=1.5, base_rate=6.0).victim_request_rate == 1.5
    assert set(POPULATIONS) == {"background", "two_group"}


@pytest.mark.parametrize("kw, match", [
    (dict(population="three"), "population must be one of background, two_group"),
    (dict(victim_share=0.0), r"victim_share must be in \(0, 1\]"),
    (dict(victim_share=1.5), r"victim_share must be in \(0, 1\]"),
    (dict(victim_rate=-1.0), "victim_rate must be > 0"),
    (dict(background_groups=-1), "background_groups must be >= 0"),
    (dict(background_contract="gold"), "background_contract 'gold' is not in contracts"),
    (dict(background_group="victi", victim_group="victi1"), "background group name victi1"),
    (dict(background_prefix_tokens=0), "background_prefix_tokens must be >= 1"),
])
def test_bad_population_params_are_refused_naming_the_field(kw, match):
    with pytest.raises(ValueError, match=match):
        make_params("one_touch", **kw)


def test_a_victim_rate_that_does_not_add_up_to_the_base_load_is_refused_when_drawn():
    with pytest.raises(ValueError, match="exceeds the base rate"):
        generate("one_touch", base_rate=6.0, victim_rate=7.0)
    with pytest.raises(ValueError, match="no background group sends the rest"):
        generate("one_touch", base_rate=6.0, background_groups=0, victim_share=0.5)
    with pytest.raises(ValueError, match="searched_attack keeps the two_group population"):
        make_params("searched_attack", population="background")


def test_a_long_trace_with_a_background_streams_the_rows_of_its_in_memory_trace():
    from prefixshield.traces.stream import concat_traces
    from prefixshield.workloads.attack import GEN_WINDOW_S, stream_attack

    kw = dict(seed=3, duration_s=2.5 * GEN_WINDOW_S, base_rate=2.0, victim_share=0.5)
    whole = generate("low_and_slow", **kw)
    stream = stream_attack("low_and_slow", make_params("low_and_slow", **kw))
    parts = list(stream.chunks())
    assert len(parts) == 3
    assert concat_traces(parts, stream.seed, stream.vocab_size, whole.meta).equals(whole)
    assert stream.groups == whole.group_names()
    short = dict(seed=5, duration_s=100.0, base_rate=6.0)
    one = generate("one_touch", **short)
    s1 = stream_attack("one_touch", make_params("one_touch", **short))
    assert concat_traces(list(s1.chunks()), s1.seed, s1.vocab_size, one.meta).equals(one)
    assert s1.groups == one.group_names()


def test_the_phased_delayed_replay_measures_only_the_victims_pass_after_the_neutral_phase():
    t = generate("delayed_replay", seed=2, base_rate=6.0)
    m, r = t.meta, t.requests
    p = make_params("delayed_replay", seed=2, base_rate=6.0)
    assert p.judge == "pass" and p.neutral_prefix_tokens == 1200
    victim = r[r["group"] == "victim"]
    judged = victim[victim["measured"]]
    assert list(judged["prefix_id"]) == list(range(p.hot_prefixes))  # each hot prefix once
    assert (judged["arrival_s"] > m["neutral_end_s"]).all()
    assert judged["arrival_s"].min() == pytest.approx(m["pass_start_s"])
    assert m["measure_start_s"] == m["pass_start_s"]
    before = victim[~victim["measured"]]
    assert len(before) == p.hot_prefixes + m["victim_phase_requests"]  # warm-up + phases
    assert m["victim_phase_rate"] == pytest.approx(p.victim_request_rate)
    assert "measured pass" in m["judged_population"]
    neutral = r[r["group"] == p.neutral_group]
    assert len(neutral) == 1 and neutral["arrival_s"].iloc[0] == pytest.approx(
        m["neutral_start_s"])
    assert [int(x[0]) for x in neutral["segment_lengths"]] == [1200]
    att = r[r["role"] == "attacker"]
    assert att["arrival_s"].max() < m["neutral_start_s"]
    bg = r[r["group"].str.startswith("tenant")]
    assert bg["arrival_s"].max() < m["measure_end_s"]
    idle = generate("delayed_replay", seed=2, base_rate=6.0, victim_phase_rate=0.0)
    iv = idle.requests[idle.requests["group"] == "victim"]
    assert len(iv) == 2 * p.hot_prefixes and idle.meta["victim_phase_requests"] == 0


def test_a_template_after_each_hot_prefix_grows_the_hot_set_to_98_blocks():
    for blocks, prefixes in ((1024, 8), (4096, 32)):
        t = generate("one_touch", num_blocks=blocks, template_tokens=32, base_rate=6.0)
        assert t.meta["hot_blocks"] == prefixes * 98
        assert round(100 * t.meta["hot_blocks"] / (blocks - 1), 1) == 76.6
        v = t.requests[t.requests["group"] == "victim"]
        segs = {(int(a[0]), int(a[1])) for a in v["segment_ids"]}
        assert len(segs) == prefixes  # one template per prefix, shared by its requests
        assert {int(x[1]) for x in v["segment_lengths"]} == {32}
    plain = generate("one_touch", seed=4, base_rate=6.0)
    assert {len(x) for x in plain.requests["segment_ids"]} == {2}
