"""Attacks through the router: an attacker aiming through the ``session`` ring lands every
request on the victim's replicas, differs from the unaimed trace only in its ids, and the
experiment fields ``replicas``/``router`` run a point as a fleet."""

from __future__ import annotations

import numpy as np
import pytest

from prefixshield.experiments.cells import run_spec, task_key
from prefixshield.experiments.spec import SpecError, type_field
from prefixshield.fleet.config import FleetConfig
from prefixshield.fleet.routers.base import RouterConfig
from prefixshield.fleet.routers.session import session_replica
from prefixshield.fleet.run import run_fleet
from prefixshield.policies import make_policy
from prefixshield.simulator.config import EngineConfig
from prefixshield.simulator.costmodel import load_profile
from prefixshield.tenancy import DEFAULT_CONTRACTS
from prefixshield.workloads.one_touch import OneTouchParams, one_touch


def _rows(aim: str, replicas: int = 8):
    tr = one_touch(OneTouchParams(aim=aim, aim_replicas=replicas, seed=3))
    return tr, tr.requests


@pytest.mark.parametrize("replicas", [1, 3, 8])
def test_aimed_attacker_lands_only_on_the_victims_replicas(replicas):
    tr, r = _rows("session", replicas)
    victim = r[r["role"] == "victim"]
    attacker = r[r["role"] == "attacker"]
    targets = sorted({session_replica("victim", int(h), replicas) for h in victim["prefix_id"]})
    assert tr.meta["aim_targets"] == targets
    got = [session_replica("attacker", int(h), replicas) for h in attacker["prefix_id"]]
    # request k goes to the (k mod T)-th target: the flood is dealt over them evenly
    assert got == [targets[k % len(targets)] for k in range(len(got))]
    assert attacker["prefix_id"].is_unique


def test_unaimed_attacker_spreads_over_the_ring():
    _, r = _rows("none")
    attacker = r[r["role"] == "attacker"]
    assert (attacker["prefix_id"].to_numpy() == np.arange(len(attacker))).all()
    assert len({session_replica("attacker", int(h), 8) for h in attacker["prefix_id"]}) > 4


def test_aim_changes_only_the_attackers_ids():
    _, a = _rows("session")
    _, b = _rows("none")
    same = ["arrival_s", "group", "role", "measured", "output_tokens"]
    assert a[same].equals(b[same])
    lens = [list(x) for x in a["segment_lengths"]], [list(x) for x in b["segment_lengths"]]
    assert lens[0] == lens[1]
    v = a["role"] == "victim"
    assert a.loc[v, "prefix_id"].equals(b.loc[v, "prefix_id"])
    assert [list(x) for x in a.loc[v, "segment_ids"]] == [list(x) for x in b.loc[v, "segment_ids"]]


def test_aim_is_deterministic_and_checked():
    a, _ = _rows("session")
    b, _ = _rows("session")
    assert a.requests.drop(columns=["segment_ids", "segment_lengths"]).equals(
        b.requests.drop(columns=["segment_ids", "segment_lengths"]))
    with pytest.raises(ValueError, match="aim must be one of"):
        OneTouchParams(aim="victim")
    with pytest.raises(ValueError, match="aim_replicas"):
        OneTouchParams(aim_replicas=0)


def test_aiming_concentrates_the_flood_on_the_victims_session_replicas():
    """Under ``session`` the aimed flood reaches only the victim's replicas (more evictions
    there than the spread flood causes); under round robin the ids are not read."""
    eng = EngineConfig(num_blocks=512)
    cost = load_profile("l4-qwen2.5-1.5b").cost
    ev = {}
    for aim in ("session", "none"):
        tr, _ = _rows(aim)
        for router in ("session", "round_robin"):
            fleet = FleetConfig(replicas=8, router=RouterConfig(name=router))
            res = run_fleet(tr, lambda: make_policy("lru", 512), cost, eng, DEFAULT_CONTRACTS,
                            fleet)
            rec = res.records
            att = rec[rec["role"] == "attacker"]
            ev[aim, router] = (set(att["replica"]), res)
    targets = set(_rows("session")[0].meta["aim_targets"])
    assert ev["session", "session"][0] == targets
    assert len(ev["none", "session"][0]) > len(targets)
    # round robin ignores the ids: the same replicas, the same hits
    a, b = ev["session", "round_robin"][1], ev["none", "round_robin"][1]
    assert a.records["cached_tokens"].equals(b.records["cached_tokens"])


def test_fleet_fields_of_an_experiment_point():
    assert type_field("one_touch", "replicas", "8") == 8
    assert type_field("one_touch", "router", "kv_aware") == "kv_aware"
    for key, text, msg in (("replicas", "0", "replicas: must be"),
                           ("router", "nearest", "router: must be one of"),
                           ("router_key", "user", "router_key: must be")):
        with pytest.raises(SpecError, match=msg):
            type_field("one_touch", key, text, "--grid")
    spec = run_spec("one_touch", {"replicas": 4, "router": "session", "router_key": "group"},
                    0, ("lru",))
    assert spec.fleet.replicas == 4 and spec.fleet.router.name == "session"
    assert spec.fleet.router.session_key == "group" and "replicas" not in spec.overrides
    assert run_spec("one_touch", {}, 0, ("lru",)).fleet is None
    with pytest.raises(SpecError, match="need replicas"):
        run_spec("one_touch", {"router": "session"}, 0, ("lru",))
    # the fleet is part of a task's identity; one engine keeps the key it had
    one = task_key("simulate", "one_touch", {}, 0)
    keys = {task_key("simulate", "one_touch", s, 0)
            for s in ({"replicas": 4}, {"replicas": 4, "router": "session"}, {"replicas": 8})}
    assert len(keys) == 3 and one not in keys
