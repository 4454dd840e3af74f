"""Tenant models that follow the trace: roots as the trace has them (several system prompts,
one, or none), split into sessions where the roots are fewer than the groups, so --groups N
works on any trace with at least N sessions; a tenant map that gives tiers and priorities; a
trace's own tenant column used as it is."""

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from prefixshield.cli import main
from prefixshield.traces import importers
from prefixshield.traces.schema import TraceError
from prefixshield.traces.tenants import (apportion_groups, fill_empty_groups, root_sessions,
                                         divergence_roots)

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SYNTHETIC = FIXTURES / "mooncake_synthetic_head1000.jsonl"
MODELS = ("round_robin", "session", "prefix", "zipf", "servegen")


def three_roots(path: Path, tenant: bool = False) -> Path:
    """A Mooncake-format trace (made up here, not a cut of a public one) of 12 conversations
    under three system prompts: prompt A (3 blocks) leads 6 conversations, B (2 blocks) and C
    (4 blocks) 3 each; conversation k has k % 3 + 1 turns, each turn extending the last by one
    or two blocks. 24 requests, arrivals 0.5 s apart in turn order."""
    systems = {"A": [1000, 1001, 1002], "B": [2000, 2001], "C": [3000, 3001, 3002, 3003]}
    which = ["A", "B", "C"] * 3 + ["A"] * 3
    hist = {k: [] for k in range(12)}
    nxt, t, recs = 5000, 0, []
    for turn in range(3):
        for k in range(12):
            if turn > k % 3:
                continue
            add = 1 + (k + turn) % 2
            hist[k] = hist[k] + list(range(nxt, nxt + add))
            nxt += add
            h = systems[which[k]] + hist[k]
            t += 500
            rec = {"timestamp": t, "input_length": len(h) * 512 - 100,
                   "output_length": 8 + k, "hash_ids": h}
            if tenant:
                rec["tenant"] = f"app-{which[k]}"
            recs.append(rec)
    assert len(recs) == 24
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def test_roots_are_the_system_prompts_and_sessions_the_conversations(tmp_path):
    f = three_roots(tmp_path / "t.jsonl")
    lists = [json.loads(x)["hash_ids"] for x in f.read_text().splitlines()]
    roots, shared = divergence_roots(lists)
    assert shared == 0 and sorted(set(roots.tolist())) == [1000, 2000, 3000]
    sessions, prefix = root_sessions(lists, roots, shared)
    assert prefix == {1000: 3, 2000: 2, 3000: 4}
    assert len(set(sessions.tolist())) == 12  # one session per conversation
    # every turn of a conversation is in its first turn's session
    first_turn = {tuple(h[:len(h)]): s for h, s in zip(lists, sessions)}
    for h, s in zip(lists, sessions):
        shorter = [first_turn[k] for k in first_turn if len(k) < len(h) and h[:len(k)] == list(k)]
        assert all(x == s for x in shorter)


@pytest.mark.parametrize("assign", MODELS)
def test_every_model_fills_four_groups_on_three_roots(tmp_path, assign):
    tr = importers.import_mooncake(three_roots(tmp_path / "t.jsonl"), num_groups=4,
                                   assign=assign, seed=1)
    counts = tr.meta["requests_per_group"]
    assert list(counts) == ["group0", "group1", "group2", "group3"]
    assert all(n > 0 for n in counts.values()) and sum(counts.values()) == 24
    rows = tr.requests
    if assign in ("session", "prefix"):
        # a group never mixes system prompts; prompt A (9 requests, 6 sessions) is split in two
        assert (rows.groupby("group")["prefix_id"].nunique() == 1).all()
        plan = tr.meta["tenant_plan"]
        assert plan["unit"] == "session" and plan["roots"] == 3 and plan["sessions"] == 12
        assert [(r["root"], r["groups"]) for r in plan["split"]] == [
            (1000, [0, 1]), (2000, [2]), (3000, [3])]
    if assign != "round_robin":
        # a conversation (a session) stays in one group; rows are in arrival (= file) order
        lists = [json.loads(x)["hash_ids"] for x in (tmp_path / "t.jsonl").read_text()
                 .splitlines()]
        roots, shared = divergence_roots(lists)
        sessions, _ = root_sessions(lists, roots, shared)
        per = rows.assign(session=sessions).groupby("session")["group"].nunique()
        assert len(per) == 12 and (per == 1).all()


@pytest.mark.parametrize("assign", ("zipf", "servegen", "session", "prefix"))
def test_a_seed_gives_the_same_tenants(tmp_path, assign):
    f = three_roots(tmp_path / "t.jsonl")
    a = importers.import_mooncake(f, num_groups=4, assign=assign, seed=7)
    b = importers.import_mooncake(f, num_groups=4, assign=assign, seed=7)
    assert a.requests["group"].tolist() == b.requests["group"].tolist()
    assert a.meta["tenant_plan"] == b.meta["tenant_plan"]


@pytest.mark.parametrize("assign", MODELS)
def test_every_model_fills_four_groups_on_the_mooncake_sample(assign):
    tr = importers.import_mooncake(SYNTHETIC, num_groups=4, assign=assign, seed=0)
    assert all(n > 0 for n in tr.meta["requests_per_group"].values())
    assert tr.meta["tenant_plan"]["unit"] in ("root", "record")  # 913 roots: none split


def test_fewer_sessions_than_groups_is_one_line_before_any_request(tmp_path):
    f = three_roots(tmp_path / "t.jsonl")
    with pytest.raises(ValueError) as e:
        importers.import_mooncake(f, num_groups=13, assign="zipf")
    assert str(e.value) == ("--assign zipf --groups 13: the trace has only 12 sessions (3 "
                            "roots), fewer than the groups; give --groups 12 or fewer, use "
                            "round_robin, or accept empty groups with --allow-fewer-groups")
    r = CliRunner().invoke(main, ["trace", "import", "mooncake", str(f),
                                  str(tmp_path / "o.parquet"), "--groups", "13",
                                  "--assign", "session"])
    assert r.exit_code == 1 and r.output.count("\n") == 1
    assert not (tmp_path / "o.parquet").exists()


def test_fill_empty_groups_moves_the_last_unit_of_the_largest_group():
    assert fill_empty_groups(np.array([0, 0, 1, 0]), 3).tolist() == [0, 0, 1, 2]
    assert fill_empty_groups(np.array([0, 1, 2]), 3).tolist() == [0, 1, 2]  # unchanged
    assert fill_empty_groups(np.array([0, 0]), 3).tolist() == [0, 1]  # two units: one empty


def test_apportion_gives_each_root_a_group_then_the_busiest():
    assert apportion_groups([12, 6, 6], [6, 3, 3], 4).tolist() == [2, 1, 1]
    assert apportion_groups([12, 6, 6], [6, 3, 3], 5).tolist() == [3, 1, 1]
    # ties go to the earlier root: 12/4 = 6/2
    assert apportion_groups([12, 6, 6], [6, 3, 3], 6).tolist() == [4, 1, 1]
    # a root cannot have more groups than sessions
    assert apportion_groups([100, 1], [1, 5], 4).tolist() == [1, 3]


def test_import_summary_says_how_roots_were_split(tmp_path):
    f = three_roots(tmp_path / "t.jsonl")
    r = CliRunner().invoke(main, ["trace", "import", "mooncake", str(f),
                                  str(tmp_path / "o.parquet"), "--groups", "4",
                                  "--assign", "session"])
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "3 roots < 4 groups, so roots are split into their 12 sessions" in text
    assert "root 1000 (9 requests, 6 sessions, 3-block prefix) -> group0, group1" in text


def test_a_tenant_table_gives_tiers_and_priorities(tmp_path):
    m = tmp_path / "tiers.csv"
    m.write_text("group,contract,priority\ngroup0,critical,0\ngroup2,best_effort,5\n")
    tr = importers.import_mooncake(three_roots(tmp_path / "t.jsonl"), num_groups=4,
                                   assign="session", tenant_map=m)
    by = tr.requests.groupby("group")["contract"].unique().map(list).to_dict()
    assert by == {"group0": ["critical"], "group1": ["standard"],
                  "group2": ["best_effort"], "group3": ["standard"]}
    assert tr.meta["priorities"] == {"group0": 0, "group2": 5}


def test_a_record_map_gives_tiers_and_priorities(tmp_path):
    m = tmp_path / "map.csv"
    m.write_text("record,group,contract,priority\n"
                 + "".join(f"{i},{'chat' if i % 2 else 'batch'},"
                           f"{'critical' if i % 2 else 'best_effort'},{i % 2}\n"
                           for i in range(24)))
    tr = importers.import_mooncake(three_roots(tmp_path / "t.jsonl"), assign="map",
                                   tenant_map=m)
    assert tr.meta["requests_per_group"] == {"batch": 12, "chat": 12}
    assert tr.meta["priorities"] == {"batch": 0, "chat": 1}
    assert set(tr.requests.loc[tr.requests["group"] == "chat", "contract"]) == {"critical"}


@pytest.mark.parametrize("text, where", [
    ("group,priority\ng0,high\n", "line 2: field priority: expected an integer, got 'high'"),
    ("group,contract\ngroup0,critical\ngroup0,standard\n", "line 3: field group: 'group0' "
     "is listed twice"),
    ("group,colour\ng0,red\n", "line 1: expected a header with columns group"),
    ("group,priority\nnobody,1\n", "group 'nobody' is not a group of this import"),
])
def test_a_bad_tenant_table_names_its_line(tmp_path, text, where):
    m = tmp_path / "m.csv"
    m.write_text(text)
    with pytest.raises((TraceError, ValueError)) as e:
        importers.import_mooncake(three_roots(tmp_path / "t.jsonl"), num_groups=4,
                                  assign="session", tenant_map=m)
    assert where in str(e.value) and "\n" not in str(e.value)


def test_the_trace_tenant_column_is_used_as_it_is(tmp_path):
    f = three_roots(tmp_path / "t.jsonl", tenant=True)
    tr = importers.import_mooncake(f)
    assert tr.meta["assign"] == "trace"
    assert tr.meta["requests_per_group"] == {"app-A": 9, "app-B": 6, "app-C": 9}
    redealt = importers.import_mooncake(f, num_groups=4, assign="session")
    assert redealt.meta["tenant_column"] == "ignored"
    with pytest.raises(ValueError, match="--groups 4: the trace names its own 3 tenants"):
        importers.import_mooncake(f, num_groups=4)


def test_a_tenant_column_on_some_records_only_is_refused(tmp_path):
    f = three_roots(tmp_path / "t.jsonl", tenant=True)
    lines = f.read_text().splitlines()
    rec = json.loads(lines[3])
    del rec["tenant"]
    lines[3] = json.dumps(rec)
    f.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceError, match=r"line 4: field tenant: missing \(earlier records"):
        importers.import_mooncake(f)


def test_an_azure_tenant_column_is_used_as_it_is(tmp_path):
    src = (FIXTURES / "azure_conv_head40.csv").read_text().splitlines()
    rows = [src[0] + ",tenant"] + [f"{x},{'a' if i % 3 else 'b'}" for i, x in
                                   enumerate(src[1:])]
    f = tmp_path / "az.csv"
    f.write_text("\n".join(rows) + "\n")
    tr = importers.import_azure(f)
    assert tr.meta["requests_per_group"] == {"b": 14, "a": 26}


def test_run_under_the_priority_scheduler_uses_the_maps_priorities(tmp_path):
    m = tmp_path / "tiers.csv"
    m.write_text("group,priority\ngroup0,0\ngroup1,3\n")
    trace = tmp_path / "t.parquet"
    r = CliRunner().invoke(main, ["trace", "import", "mooncake",
                                  str(three_roots(tmp_path / "t.jsonl")), str(trace),
                                  "--groups", "4", "--assign", "session", "--tenant-map",
                                  str(m)])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["run", str(trace), "-p", "lru", "--scheduler", "priority",
                                  "--block-size", "512", "--blocks", "64"])
    assert r.exit_code == 0, r.output
    assert "priorities from the trace's tenant map: group0=0, group1=3" in r.output
    assert "scheduler: priority; priorities group0=0, group1=3" in r.output
    # an explicit --priority wins over the map's
    r = CliRunner().invoke(main, ["run", str(trace), "-p", "lru", "--scheduler", "priority",
                                  "--priority", "group1=1", "--block-size", "512",
                                  "--blocks", "64"])
    assert r.exit_code == 0 and "from the trace's tenant map" not in r.output


def test_a_zipf_draw_that_filled_every_group_is_the_one_it_always_was():
    # the draw before sessions existed: one per distinct key, keys in sorted order
    rng = np.random.default_rng(9)
    units = rng.permutation(np.repeat(rng.choice(10_000, size=20, replace=False), 3))
    keys, inverse = np.unique(units, return_inverse=True)
    w = 1.0 / np.arange(1, 4) ** 1.0
    old = np.random.default_rng([5, 11]).choice(3, size=len(keys), p=w / w.sum())[inverse]
    assert len(set(old.tolist())) == 3
    assert importers.assign_tenants("zipf", units, ["a", "b", "c"], seed=5).tolist() == \
        old.tolist()
