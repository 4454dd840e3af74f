"""attack-search against a fleet: the aim the router reads is a searched coordinate,
``searched_attack`` aims as ``one_touch`` does (and pays for its lead), and a tiny search over
a fleet runs and searches the aim."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("optuna")

from prefixshield.experiments import attack_search as AS  # noqa: E402
from prefixshield.experiments.attack_space import (SPACE, space_for,  # noqa: E402
                                                   workload_fields)
from prefixshield.experiments.store import ResultsStore  # noqa: E402
from prefixshield.fleet.routers.session import session_replica  # noqa: E402
from prefixshield.workloads.searched_attack import (SearchedAttackParams,  # noqa: E402
                                                    searched_attack)

sys.path.insert(0, str(Path(__file__).parent))
from test_search import search  # noqa: E402


@pytest.mark.parametrize("base, extra", [
    ({}, []),
    ({"replicas": 8, "router": "round_robin"}, []),
    ({"replicas": 8, "router": "least_loaded"}, []),
    ({"replicas": 8, "router": "session", "router_key": "group"}, []),
    ({"replicas": 8, "router": "session"}, [("aim", ("none", "session"))]),
    ({"replicas": 8, "router": "prefix_affinity"}, [("aim", ("none", "prefix")),
                                                    ("aim_blocks", ())]),
    ({"replicas": 8, "router": "kv_aware"}, [("aim", ("none", "prefix")), ("aim_blocks", ())]),
])
def test_the_space_adds_the_aim_the_router_reads(base, extra):
    space = space_for(base, 96)
    assert space[:len(SPACE)] == SPACE
    assert [(d.name, d.choices) for d in space[len(SPACE):]] == extra
    if extra and extra[-1][0] == "aim_blocks":
        assert (space[-1].low, space[-1].high, space[-1].log) == (1, 96, True)


def test_unaimed_points_drop_the_lead_and_session_aims_know_the_fleet():
    base = {"replicas": 8}
    assert workload_fields({"aim": "none", "aim_blocks": 11}, base) == {"aim": "none"}
    assert workload_fields({"aim": "prefix", "aim_blocks": 11}, base) == {
        "aim": "prefix", "aim_blocks": 11}
    assert workload_fields({"aim": "session"}, base) == {"aim": "session", "aim_replicas": 8}


def test_searched_attack_aims_as_one_touch_and_pays_for_its_lead():
    plain = SearchedAttackParams(seed=3)
    led = SearchedAttackParams(seed=3, aim="prefix", aim_blocks=11)
    assert led.request_costs()["prompt_tokens"] == plain.request_costs()["prompt_tokens"] + 176
    assert led.request_costs()["block_s"] > plain.request_costs()["block_s"]
    tr = searched_attack(led).requests
    att = tr[tr["role"] == "attacker"]
    hot = sorted({int(x[0]) for x in tr.loc[tr["role"] == "victim", "segment_ids"]})
    for k, (ids, lens) in enumerate(zip(att["segment_ids"], att["segment_lengths"])):
        assert int(ids[0]) == hot[int(att["prefix_id"].iloc[k]) % len(hot)]
        assert int(lens[0]) == 176 and len(ids) == 3
    sess = searched_attack(SearchedAttackParams(seed=3, aim="session", aim_replicas=8))
    r = sess.requests
    targets = sess.meta["aim_targets"]
    got = {session_replica("attacker", int(h), 8) for h in r.loc[r["role"] == "attacker",
                                                                 "prefix_id"]}
    assert got == set(targets)
    with pytest.raises(ValueError, match="read by aim=prefix only"):
        SearchedAttackParams(aim_blocks=3)


def test_a_tiny_fleet_search_runs_and_searches_the_aim(tmp_path):
    base = {"blocks": 512, "compat": "current", "alpha": 0.6, "profile": "l4-qwen2.5-1.5b",
            "duration_s": 3.0, "replicas": 2, "router": "session"}
    # session routes ahead (split runs, the fused loop): the cheapest fleet with an aim
    res = search(tmp_path / "s", trials=2, base=base, seeds=1, warm_start=False,
                 budget_limits="requests", write=False)
    ident = res.config.identity()
    assert ident["base"]["router"] == "session" and ident["space"][-1][0] == "aim"
    store = ResultsStore.open(tmp_path / "s")
    trials = AS.trials_frame(res)  # what trials.csv holds
    assert list(trials["aim"]) == [t.fields["aim"] for t in res.trials["lru"]]
    assert set(trials["aim"]) == {"none", "session"}  # both searched (sampler seed 0)
    # the runs are the fleet's; an aimed trial's runs know the fleet's size
    for t, exp in zip(res.trials["lru"], [e for e in store.experiments
                                          if e.name.startswith("search.")]):
        assert exp.base["replicas"] == 2 and exp.base["aim"] == t.fields["aim"]
        assert exp.base.get("aim_replicas") == (2 if t.fields["aim"] == "session" else None)
