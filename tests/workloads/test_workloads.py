"""Workload generators: exact block counts, determinism, controls, segment sharing, output
lengths from data, the creation-pressure knob and the C_prefill probe's request shapes."""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np
import pytest

from _trace_helpers import full_blocks, rows, segment_lengths_by_id
from prefixshield import workloads as gen
from prefixshield.tenancy import DEFAULT_CONTRACTS
from prefixshield.traces.conversations import sharegpt_turns
from prefixshield.traces.segments import LOCAL_BITS, NUM_KINDS, SegmentKind
from prefixshield.workloads import (WORKLOADS, BorrowingParams, DelayedReplayParams,
                                    LowAndSlowParams, OneTouchParams, TwoPassReplayParams,
                                    generate, make_params)
from prefixshield.workloads.outputs import draw_output_tokens

ATTACK_WORKLOADS = ["one_touch", "low_and_slow", "two_pass_replay", "delayed_replay"]


def _kind(seg_id: int) -> SegmentKind:
    return SegmentKind((seg_id >> LOCAL_BITS) % NUM_KINDS)


def _group_index(seg_id: int) -> int:
    return (seg_id >> LOCAL_BITS) // NUM_KINDS


# ---- registry and params -------------------------------------------------------------------

def test_registry_lists_every_workload_with_its_params_type():
    assert sorted(WORKLOADS) == sorted(ATTACK_WORKLOADS + ["sharegpt", "bursty_sharegpt",
                                                           "borrowing", "searched_attack",
                                                           "servegen"])
    for name, fn in WORKLOADS.items():
        assert dataclasses.is_dataclass(fn.params_type)
        assert fn(None).meta["workload"] == name


def test_make_params_rejects_unknown_field_and_workload():
    with pytest.raises(ValueError, match="no parameter.*bogus"):
        make_params("one_touch", bogus=1)
    with pytest.raises(ValueError, match="unknown workload 'nope'"):
        make_params("nope")


def test_params_validate_ranges():
    with pytest.raises(ValueError, match="base_rate"):
        OneTouchParams(base_rate=0)
    with pytest.raises(ValueError, match="suffix_tokens"):
        OneTouchParams(suffix_tokens=(10, 5))
    with pytest.raises(ValueError, match="attacker_contract"):
        OneTouchParams(attacker_contract="gold")


# ---- one_touch: exact hot set ---------------------------------------------------------------

def test_one_touch_hot_set_is_4_prefixes_of_96_blocks_384_of_511_usable():
    tr = generate("one_touch")
    victim = rows(tr, "victim")
    prefixes = {int(ids[0]): int(lens[0]) for ids, lens in
                zip(victim["segment_ids"], victim["segment_lengths"])}
    assert len(prefixes) == 4
    assert set(prefixes.values()) == {1536}
    hot_blocks = sum(full_blocks(n, 16) for n in prefixes.values())
    assert hot_blocks == 384
    assert tr.meta["hot_blocks"] == 384 and tr.meta["usable_blocks"] == 511
    assert hot_blocks / 511 == pytest.approx(0.7515, abs=1e-4)
    assert sorted(victim["prefix_id"].unique()) == [0, 1, 2, 3]


@pytest.mark.parametrize("num_blocks,expected_prefixes", [(512, 4), (1024, 8), (2048, 16),
                                                           (4096, 32)])
def test_hot_set_scales_with_num_blocks_keeping_96_block_prefixes(num_blocks, expected_prefixes):
    p = OneTouchParams(num_blocks=num_blocks, duration_s=5.0)
    tr = gen.one_touch(p)
    assert p.hot_prefixes == expected_prefixes
    assert p.prefix_blocks == 96
    assert tr.meta["hot_blocks"] == 96 * expected_prefixes
    assert 0.74 < tr.meta["hot_blocks"] / (num_blocks - 1) < 0.76
    assert sorted(rows(tr, "victim")["prefix_id"].unique()) == list(range(expected_prefixes))


def test_warmup_sends_each_hot_prefix_once_unmeasured_then_victim_cycles():
    p = OneTouchParams()
    tr = gen.one_touch(p)
    victim = rows(tr, "victim")
    warm = victim[~victim["measured"]]
    assert list(warm["prefix_id"]) == [0, 1, 2, 3]
    # within the victim's entitlement: a fresh request's blocks (prompt and decode) per 40 blocks/s
    gap = p.expected_request_blocks() / 40.0
    assert 2.35 < gap < 2.45  # 1,536 + 1-22 prompt tokens and 8 output tokens: ~96.6 blocks
    assert list(warm["arrival_s"]) == pytest.approx([0.0, gap, 2 * gap, 3 * gap])
    meas = victim[victim["measured"]]
    assert (meas["arrival_s"] >= tr.meta["measure_start_s"]).all()
    assert (meas["arrival_s"] < tr.meta["measure_end_s"]).all()
    assert list(meas["prefix_id"]) == [k % 4 for k in range(len(meas))]
    assert not rows(tr, "attacker")["measured"].eq(False).any()


def test_one_touch_attacker_sends_fresh_1536_token_prefixes_at_design_rate():
    p = OneTouchParams()
    tr = gen.one_touch(p)
    att = rows(tr, "attacker")
    rate = min(0.75 * p.base_rate / p.alpha, 1.15 * p.base_rate)
    assert rate == pytest.approx(2.3)
    assert tr.meta["attacker_rate"] == pytest.approx(rate)
    assert len(att) == math.ceil(p.duration_s * rate)
    assert np.allclose(np.diff(att["arrival_s"]), 1 / rate)
    assert att["prefix_id"].is_unique
    first = [int(ids[0]) for ids in att["segment_ids"]]
    assert len(set(first)) == len(att)
    assert {int(lens[0]) for lens in att["segment_lengths"]} == {1536}
    assert set(att["contract"]) == {"best_effort"} and set(att["group"]) == {"attacker"}
    # real outputs by default: Azure conv lengths clipped at max_tokens 8, never one token
    out = tr.requests["output_tokens"]
    assert p.max_output_tokens == 8 and out.min() >= 7 and out.max() <= 8
    # without the clip: Azure conv lengths (7..1000 tokens)
    out = gen.one_touch(OneTouchParams(max_output_tokens=None)).requests["output_tokens"]
    assert out.min() >= 7 and out.max() <= 1000 and out.nunique() > 20
    assert 150 < out.mean() < 280


def test_one_touch_rate_is_capped_by_075_c_prefill_at_high_load():
    p = OneTouchParams(alpha=0.9)
    assert p.one_touch_rate == pytest.approx(0.75 * p.base_rate / 0.9)


def test_pressure_window_bounds_attacker_arrivals():
    tr = gen.one_touch(OneTouchParams(pressure_start_s=10.0, pressure_duration_s=20.0))
    att = rows(tr, "attacker")
    start = tr.meta["measure_start_s"]
    assert att["arrival_s"].min() == pytest.approx(start + 10.0)
    assert att["arrival_s"].max() < start + 30.0


# ---- determinism, ordering, controls --------------------------------------------------------

@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_same_seed_gives_identical_trace_and_other_seed_differs(name):
    a, b = generate(name, seed=7), generate(name, seed=7)
    assert a.equals(b)
    c = generate(name, seed=8)
    assert not a.equals(c)
    assert not a.requests["arrival_s"].equals(c.requests["arrival_s"])


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_arrivals_sorted_and_request_ids_increasing(name):
    df = generate(name).requests
    assert df["arrival_s"].is_monotonic_increasing
    assert df["request_id"].is_monotonic_increasing and df["request_id"].is_unique
    assert list(df["request_id"]) == list(range(len(df)))


@pytest.mark.parametrize("name", ATTACK_WORKLOADS)
def test_no_attack_control_is_attack_trace_minus_attacker_rows(name):
    attack = generate(name, seed=3)
    control = generate(name, seed=3, attack=False)
    assert (control.requests["role"] != "attacker").all()
    kept = attack.requests[attack.requests["role"] != "attacker"].reset_index(drop=True)
    for col in kept.columns:
        if col in ("segment_ids", "segment_lengths"):
            assert all(np.array_equal(x, y) for x, y in zip(kept[col], control.requests[col]))
        else:
            assert kept[col].equals(control.requests[col]), col
    assert len(rows(attack, "attacker")) > 0


# ---- segments -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_each_segment_id_has_one_length_and_groups_use_disjoint_ids(name):
    df = generate(name).requests
    assert all(len(v) == 1 for v in segment_lengths_by_id(df).values())
    per_group = {g: set(np.concatenate(list(sub["segment_ids"]))) for g, sub in
                 df.groupby("group", observed=True)}
    groups = list(per_group)
    for i, g in enumerate(groups):
        for h in groups[i + 1:]:
            assert not per_group[g] & per_group[h], (g, h)


@pytest.mark.parametrize("name", ["one_touch", "low_and_slow", "borrowing"])
def test_prefix_segments_shared_and_suffix_segments_unique(name):
    df = generate(name).requests
    suffixes = [int(ids[1]) for ids in df["segment_ids"] if len(ids) == 2]
    assert len(suffixes) == len(set(suffixes))
    assert all(_kind(s) == SegmentKind.SUFFIX for s in suffixes)
    for g, sub in df.groupby("group", observed=True):
        prefixes = [int(ids[0]) for ids in sub["segment_ids"] if len(ids) == 2]
        # a background group's requests start with its system prompt (one, reused)
        kind = SegmentKind.SYSTEM if g.startswith("tenant") else SegmentKind.PREFIX
        assert all(_kind(s) == kind for s in prefixes)
        if kind == SegmentKind.SYSTEM:
            assert len(set(prefixes)) == 1
        if g in ("victim", "active"):
            n = 5 if g == "active" else 4  # borrowing's working set: 5 prefixes
            assert len(set(prefixes)) == n and len(prefixes) > n  # reused


def test_segment_namespace_follows_group_role():
    tr = generate("one_touch")
    for role, gi in (("victim", 0), ("attacker", 1)):
        ids = np.concatenate(list(rows(tr, role)["segment_ids"]))
        assert {_group_index(int(s)) for s in ids} == {gi}


def test_shared_prefix_means_shared_token_ids():
    from prefixshield.traces.tokens import prompt_token_ids
    tr = generate("one_touch", duration_s=5.0)
    v = rows(tr, "victim")
    a, b = v.iloc[0], v.iloc[4]  # both hot prefix 0
    assert a["prefix_id"] == b["prefix_id"] == 0
    ta = prompt_token_ids(tr.seed, a["segment_ids"], a["segment_lengths"], tr.vocab_size)
    tb = prompt_token_ids(tr.seed, b["segment_ids"], b["segment_lengths"], tr.vocab_size)
    assert np.array_equal(ta[:1536], tb[:1536])
    assert not np.array_equal(ta[1536:1568], tb[1536:1568])


# ---- low_and_slow, replays ------------------------------------------------------------------

def test_low_and_slow_creates_125_times_refill_evenly():
    p = LowAndSlowParams(duration_s=2000.0, pressure_ratio=1.25)
    tr = gen.low_and_slow(p)
    att = rows(tr, "attacker")
    # prompt and decode blocks: the last output token is never computed
    blocks = np.mean([full_blocks(int(np.sum(l)) + int(o) - 1)
                      for l, o in zip(att["segment_lengths"], att["output_tokens"])])
    rate = tr.meta["attacker_rate"]
    assert rate == pytest.approx(1.25 * 16 / p.expected_request_blocks())
    assert tr.meta["designed_pressure_ratio"] == pytest.approx(1.25)
    assert rate * blocks == pytest.approx(20.0, rel=0.03)  # creation ~ 1.25 x 16 blocks/s
    assert np.allclose(np.diff(att["arrival_s"]), 1 / rate)
    assert att["arrival_s"].max() > tr.meta["measure_end_s"] - 1 / rate - 1e-9
    assert att["prefix_id"].is_unique


def test_low_and_slow_pressure_ratio_sets_rate():
    slow = gen.low_and_slow(LowAndSlowParams(pressure_ratio=0.5)).meta["attacker_rate"]
    fast = gen.low_and_slow(LowAndSlowParams(pressure_ratio=4.0)).meta["attacker_rate"]
    assert fast == pytest.approx(8 * slow)


def test_two_pass_replay_repeats_each_round_with_identical_segments():
    tr = gen.two_pass_replay(TwoPassReplayParams(replay_set=4, duration_s=120.0))
    att = rows(tr, "attacker")
    k = 4
    assert len(att) >= 4 * k
    for r in range(len(att) // (2 * k)):
        first = att.iloc[2 * k * r: 2 * k * r + k]
        second = att.iloc[2 * k * r + k: 2 * k * (r + 1)]
        assert list(first["prefix_id"]) == list(range(r * k, r * k + k))
        assert list(second["prefix_id"]) == list(first["prefix_id"])
        for x, y in zip(first["segment_ids"], second["segment_ids"]):
            assert np.array_equal(x, y)
        for x, y in zip(first["segment_lengths"], second["segment_lengths"]):
            assert np.array_equal(x, y)
    assert tr.meta["attacker_replay_requests"] == (len(att) // 8) * 4 + max(0, len(att) % 8 - 4)


def test_two_pass_replay_rounds_limit():
    tr = gen.two_pass_replay(TwoPassReplayParams(rounds=2, replay_set=3, replays=2,
                                                 attacker_rate=2.0))
    att = rows(tr, "attacker")
    assert len(att) == 2 * 3 * 3
    assert list(att["prefix_id"]) == [0, 1, 2] * 3 + [3, 4, 5] * 3


@pytest.mark.parametrize("wait_factor", [0.0, 0.5, 1.0])
def test_delayed_replay_waits_for_the_designed_clearance_time(wait_factor):
    p = DelayedReplayParams(wait_factor=wait_factor)
    tr = gen.delayed_replay(p)
    att = rows(tr, "attacker")
    assert list(att["prefix_id"]) == [0, 1, 0, 1]  # replay_set K = 2 by default
    admit = att.iloc[:2]
    rate = 2.3
    # bucket of best_effort (16 blocks/s, 128 blocks), full at start, charged on arrival with
    # every block the admission materializes (prompt and decode)
    c = DEFAULT_CONTRACTS["best_effort"]
    b = c.beta_blocks
    for j, (lens, out) in enumerate(zip(admit["segment_lengths"], admit["output_tokens"])):
        if j:
            b = min(c.beta_blocks, b + c.rho_blocks_per_s / rate)
        b -= full_blocks(int(np.sum(lens)) + int(out) - 1)
    clearance = -b / 16.0
    assert tr.meta["designed_debt_blocks"] == pytest.approx(-b)
    assert tr.meta["clearance_s"] == pytest.approx(clearance)
    assert 2 < clearance < 40
    wait = att["arrival_s"].iloc[2] - admit["arrival_s"].iloc[-1]
    assert wait == pytest.approx(max(1 / rate, wait_factor * clearance))
    benign = rows(tr, "benign")
    benign = benign[benign["group"] == p.neutral_group]  # not the background groups
    assert benign["arrival_s"].min() > att["arrival_s"].max()
    assert benign["prefix_id"].is_unique and len(benign)
    control = gen.delayed_replay(dataclasses.replace(p, attack=False))
    neutral = rows(control, "benign")
    assert len(neutral[neutral["group"] == p.neutral_group]) == len(benign)


def test_delayed_replay_rejects_a_schedule_longer_than_the_run():
    with pytest.raises(ValueError, match="does not fit"):
        gen.delayed_replay(DelayedReplayParams(duration_s=3.0, wait_factor=1.0, judge="run"))


# ---- ShareGPT ---------------------------------------------------------------------------------

def _conversations(tr):
    return {pid: sub.reset_index(drop=True) for pid, sub in tr.requests.groupby("prefix_id")}


@pytest.mark.parametrize("name", ["sharegpt", "bursty_sharegpt"])
def test_sharegpt_turn_prompt_is_history_plus_new_user_segment(name):
    tr = generate(name, system_prompt_tokens=256)
    p = make_params(name, system_prompt_tokens=256)
    sizes = []
    for pid, conv in _conversations(tr).items():
        assert conv["group"].nunique() == 1
        assert conv["arrival_s"].is_monotonic_increasing
        for k in range(len(conv)):
            ids, lens = conv["segment_ids"][k], conv["segment_lengths"][k]
            assert len(ids) == 1 + 2 * k + 1
            assert _kind(int(ids[0])) == SegmentKind.SYSTEM and lens[0] == 256
            assert _kind(int(ids[-1])) == SegmentKind.SUFFIX
            out = conv["output_segment_id"][k]
            assert _kind(int(out)) == SegmentKind.OUTPUT
            if k + 1 < len(conv):
                nxt_ids, nxt_lens = conv["segment_ids"][k + 1], conv["segment_lengths"][k + 1]
                assert np.array_equal(nxt_ids[:len(ids)], ids)
                assert nxt_ids[len(ids)] == out
                assert nxt_lens[len(ids)] == conv["output_tokens"][k]
        last = len(conv) - 1
        total = int(np.sum(conv["segment_lengths"][last])) + int(conv["output_tokens"][last])
        assert total <= p.max_conversation_tokens
        sizes.append(len(conv))
    assert max(sizes) > 1
    assert tr.requests["group"].nunique() == 4
    assert set(tr.requests["role"]) == {"benign"} and set(tr.requests["contract"]) == {"standard"}
    meas = tr.requests["arrival_s"] >= p.warmup_s
    assert (tr.requests["measured"] == meas).all()
    assert tr.requests["arrival_s"].max() < p.warmup_s + p.duration_s


def test_sharegpt_system_prompt_shared_within_group_only():
    tr = generate("sharegpt", system_prompt_tokens=256)
    system = {g: {int(ids[0]) for ids in sub["segment_ids"]} for g, sub in
              tr.requests.groupby("group", observed=True)}
    assert all(len(s) == 1 for s in system.values())
    assert len(set().union(*system.values())) == 4


def test_sharegpt_caps_conversation_tokens():
    tr = generate("sharegpt", max_conversation_tokens=1024, system_prompt_tokens=0)
    total = [int(np.sum(l)) + int(o) for l, o in
             zip(tr.requests["segment_lengths"], tr.requests["output_tokens"])]
    assert max(total) <= 1024


def test_bursty_sharegpt_concentrates_conversation_starts():
    def start_cv(name, **kw):
        tr = generate(name, duration_s=1200.0, system_prompt_tokens=0, **kw)
        starts = np.sort(tr.requests["arrival_s"][tr.requests["segment_ids"].map(len) == 1])
        gaps = np.diff(starts)
        return gaps.std() / gaps.mean()
    assert 0.8 < start_cv("sharegpt") < 1.2
    assert make_params("bursty_sharegpt").cv > 1
    assert start_cv("bursty_sharegpt", cv=4.0) > 2.5


def test_sharegpt_package_data_is_used_by_default():
    turns = sharegpt_turns()
    assert len(turns) == 297
    assert sum(len(u) for u, _ in turns) == 1680
    assert generate("sharegpt").meta["turns_source"].endswith("data/sharegpt_turns.csv.gz")


# ---- borrowing ------------------------------------------------------------------------------

def test_borrowing_active_working_set_exceeds_half_the_cache():
    p = BorrowingParams()
    tr = gen.borrowing(p)
    active = rows(tr, group="active")
    prefixes = {int(ids[0]): int(lens[0]) for ids, lens in
                zip(active["segment_ids"], active["segment_lengths"])}
    ws = sum(full_blocks(n) for n in prefixes.values())
    assert ws == 480 == tr.meta["working_set_blocks"]  # 5 prefixes of 96 blocks
    assert ws > 511 / 2
    # the idle group is configured but sends nothing
    assert len(rows(tr, group="idle")) == 0
    assert tr.group_names() == ["active", "idle"]
    assert set(tr.requests["contract"]) == {"standard"}


# ---- speed ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_default_trace_generates_well_under_a_second(name):
    generate(name)  # warm caches (package data)
    t0 = time.perf_counter()
    generate(name)
    assert time.perf_counter() - t0 < 0.5


# ---- output lengths from data -----------------------------------------------------------------

def test_azure_conv_histogram_is_the_whole_trace():
    from prefixshield.workloads.outputs import _empirical
    values, p = _empirical("azure_conv")
    assert values.min() == 7 and values.max() == 1000
    assert float(values @ p) == pytest.approx(211.126, abs=1e-3)   # 19,366 requests' mean


def test_output_lengths_follow_the_distribution_and_a_seed_fixes_them():
    rng = lambda: np.random.default_rng(3)  # noqa: E731
    a = draw_output_tokens(rng(), "azure_conv", None, None, 50_000)
    assert np.array_equal(a, draw_output_tokens(rng(), "azure_conv", None, None, 50_000))
    assert a.mean() == pytest.approx(211.1, rel=0.02)
    assert np.median(a) == pytest.approx(129, abs=3)
    clipped = draw_output_tokens(rng(), "azure_conv", None, 100, 1000)
    assert clipped.max() == 100
    share = draw_output_tokens(rng(), "sharegpt", None, None, 20_000)
    assert share.mean() == pytest.approx(mean_output_tokens_sharegpt(), rel=0.03)
    assert set(draw_output_tokens(rng(), "azure_conv", (2, 4), None, 100)) == {2, 3, 4}


def mean_output_tokens_sharegpt():
    return float(np.mean(np.concatenate([a for _, a in sharegpt_turns()])))


def test_output_tokens_range_replaces_the_distribution_and_1_1_is_one_token():
    tr = generate("one_touch", output_tokens=(1, 1))
    assert (tr.requests["output_tokens"] == 1).all()
    with pytest.raises(ValueError, match="output_dist"):
        OneTouchParams(output_dist="zipf")
    with pytest.raises(ValueError, match="output_tokens"):
        OneTouchParams(output_tokens=(0, 3))


def test_expected_request_blocks_counts_prompt_and_decode_blocks_exactly():
    p = OneTouchParams()
    rng = np.random.default_rng(0)
    prompt = p.prefix_tokens + p.draw_suffixes(rng, 200_000)
    out = p.draw_outputs(rng, 200_000)
    assert p.expected_request_blocks() == pytest.approx(np.mean((prompt + out - 1) // 16),
                                                        rel=0.005)
    # a fully cached replay creates only what lies beyond vLLM's hit cap of (P-1)//B blocks
    replay = np.mean((prompt + out - 1) // 16 - (prompt - 1) // 16)
    assert p.expected_request_blocks(replay=True) == pytest.approx(replay, rel=0.01)


# ---- C_prefill probe shapes, tenants, creation pressure ----------------------------------------

@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_probe_requests_are_shaped_like_the_workload_and_do_not_depend_on_the_seed(name):
    p, q = make_params(name, seed=1), make_params(name, seed=2)
    prompt, out = p.probe_shapes(32)
    assert np.array_equal(prompt, q.probe_shapes(32)[0])
    assert np.array_equal(out, q.probe_shapes(32)[1])
    if isinstance(p, gen.PrefixParams):
        assert (prompt >= p.prefix_tokens + p.suffix_tokens[0]).all()
        assert (prompt <= p.prefix_tokens + p.suffix_tokens[1]).all()
        assert out.min() >= 7 and out.max() <= (p.max_output_tokens or 1000)  # Azure conv
    elif name == "servegen":                              # the clients' published lengths
        assert (prompt + out <= p.max_request_tokens).all() and prompt.min() >= 1
    else:                                                 # ShareGPT turns: history + message
        assert (prompt > p.system_prompt_tokens).all()
        assert (prompt + out <= p.max_conversation_tokens).all()
    if not (isinstance(p, gen.PrefixParams) and p.max_output_tokens is not None):
        assert len(set(out)) > 5


def test_controls_keep_the_attack_traces_groups_and_contracts():
    for name in ATTACK_WORKLOADS:
        attack, control = generate(name), generate(name, attack=False)
        assert control.group_names() == attack.group_names()
        assert control.contract_names() == attack.contract_names()
        assert "attacker" in control.group_names()
        assert "attacker" not in set(control.requests["group"])


def test_pressure_ratio_sets_the_attacker_rate_for_every_attack_workload():
    for params in (OneTouchParams, LowAndSlowParams, TwoPassReplayParams):
        p = params(pressure_ratio=2.0)
        rate = p.attacker_request_rate()
        assert rate * p.attacker_blocks_per_request() == pytest.approx(2.0 * 16)
        assert p.designed_pressure_ratio(rate) == pytest.approx(2.0)
    # attacker_rate wins over pressure_ratio; one_touch's default is the reference's formula
    assert OneTouchParams(pressure_ratio=2.0, attacker_rate=0.5).attacker_request_rate() == 0.5
    assert OneTouchParams().attacker_request_rate() == pytest.approx(2.3)


def test_two_pass_replay_replays_each_prefix_right_after_its_admission_by_default():
    p = TwoPassReplayParams()
    att = rows(gen.two_pass_replay(p), "attacker")
    assert p.replay_set == 1
    assert list(att["prefix_id"][:6]) == [0, 0, 1, 1, 2, 2]
    gap = np.diff(att["arrival_s"][:2])[0]
    assert gap == pytest.approx(1 / p.attacker_request_rate())
