"""Attacks through the router: an attacker aiming through the ``session`` ring lands every
request on the victim's replicas, differs from the unaimed trace only in its ids, and the
experiment fields ``replicas``/``router`` run a point as a fleet. An attacker aiming by
content (``aim=prefix``) differs only in its prompts' lead and lands where the victim's
prefixes went under ``prefix_affinity``."""

from __future__ import annotations

import numpy as np
import pytest

from prefixshield.experiments.cells import run_spec, task_key
from prefixshield.experiments.spec import SpecError, type_field
from prefixshield.fleet.config import FleetConfig
from prefixshield.fleet.hashes import trace_hashes
from prefixshield.fleet.routers.base import RouterConfig
from prefixshield.fleet.routers.session import session_replica
from prefixshield.fleet.run import run_fleet
from prefixshield.policies import make_policy
from prefixshield.simulator.config import EngineConfig
from prefixshield.simulator.costmodel import load_profile
from prefixshield.tenancy import DEFAULT_CONTRACTS
from prefixshield.workloads.one_touch import PREFIX_AIM_MATCH_RATIO, OneTouchParams, one_touch


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


def _prefix_rows(aim: str, **kw):
    # the two-group population: every row is the victim's or the attacker's
    tr = one_touch(OneTouchParams(aim=aim, seed=3, population="two_group", **kw))
    return tr, tr.requests


def test_prefix_aim_changes_only_the_attackers_prompts():
    """The lead goes before each attacker prompt, dealt over the victim's hot prefixes; every
    other column and every victim row is the spread trace's."""
    a_tr, a = _prefix_rows("prefix")
    _, b = _prefix_rows("none")
    lead = OneTouchParams().lead_blocks()
    assert a_tr.meta["aim_lead_blocks"] == lead
    same = ["arrival_s", "group", "role", "measured", "output_tokens", "prefix_id"]
    assert a[same].equals(b[same])
    v = (a["role"] == "victim").to_numpy()
    cells = {k: ([list(x) for x in a[k]], [list(x) for x in b[k]])
             for k in ("segment_ids", "segment_lengths")}
    hot = sorted({int(x[0]) for x, is_v in zip(a["segment_ids"], v) if is_v})
    for k, (got, spread) in cells.items():
        assert [x for x, is_v in zip(got, v) if is_v] == [x for x, is_v in zip(spread, v) if is_v]
    att = [i for i in range(len(v)) if not v[i]]
    for k, i in enumerate(att):
        assert cells["segment_ids"][0][i] == [hot[k % len(hot)], *cells["segment_ids"][1][i]]
        assert cells["segment_lengths"][0][i] == [16 * lead, *cells["segment_lengths"][1][i]]


def test_prefix_aim_default_lead_passes_the_affinity_match_ratio():
    """11 blocks at the defaults: 11 >= 0.1 x (11 + 97) and 10 < 0.1 x (10 + 97); the ratio is
    the router's own default; bad leads are refused with the reason."""
    p = OneTouchParams(aim="prefix")
    after = (p.prefix_tokens + p.suffix_tokens[1] - 1) // p.block_size
    assert p.lead_blocks() == 11 and after == 97
    assert RouterConfig().match_ratio == PREFIX_AIM_MATCH_RATIO
    assert OneTouchParams(aim="prefix", aim_blocks=40).lead_blocks() == 40
    with pytest.raises(ValueError, match=r"aim_blocks must be in \[1, 96\]"):
        OneTouchParams(aim="prefix", aim_blocks=97)
    with pytest.raises(ValueError, match="read by aim=prefix only"):
        OneTouchParams(aim="session", aim_blocks=4)
    with pytest.raises(ValueError, match="set aim_blocks"):
        OneTouchParams(aim="prefix", prefix_tokens=16, suffix_tokens=(1, 300))


def test_prefix_aim_shares_content_not_blocks_with_the_victim():
    """The lead's content hashes are the victim's (what a text-matching router compares); its
    engine hashes, salted by tenant, are not (the attacker never hits a victim block)."""
    tr, r = _prefix_rows("prefix")
    _, _, info = trace_hashes(tr, EngineConfig(num_blocks=512))
    lead = tr.meta["aim_lead_blocks"]
    victim = int(np.flatnonzero((r["role"] == "victim").to_numpy())[0])  # hot prefix 0
    first = int(np.flatnonzero((r["role"] == "attacker").to_numpy())[0])  # lead of prefix 0
    assert (info.prompt_hashes(first, content=True)[:lead]
            == info.prompt_hashes(victim, content=True)[:lead]).all()
    assert info.prompt_hashes(first, content=True)[lead] not in \
        set(info.prompt_hashes(victim, content=True).tolist())
    assert not set(info.prompt_hashes(first).tolist()) & set(info.hashes(victim).tolist())


def _share_on_victim_replicas(records, hot: int) -> float:
    """Share of attacker requests (k-th: lead = hot prefix k mod ``hot``) routed to a replica
    that served the victim's prefix ``k mod hot`` at or before the attacker's arrival."""
    served: dict[int, set] = {h: set() for h in range(hot)}
    on, k = 0, 0
    for role, prefix, replica in records.sort_values("arrival_s", kind="stable")[
            ["role", "prefix_id", "replica"]].itertuples(index=False):
        if role == "victim":
            served[int(prefix)].add(int(replica))
        else:
            on += int(replica) in served[k % hot]
            k += 1
    return on / k


def test_prefix_aim_lands_on_the_victims_replicas_under_prefix_affinity():
    """Lockstep, 8 replicas: under ``prefix_affinity`` every aimed request goes where the
    victim's prefix went (the spread attacker: 3 of 40, to the emptiest trees); ``kv_aware``
    reads the salted caches, so the lead pulls only towards the attacker's own copies."""
    eng = EngineConfig(num_blocks=512)
    cost = load_profile("l4-qwen2.5-1.5b").cost
    share = {}
    for router in ("prefix_affinity", "kv_aware"):
        for aim in ("prefix", "none"):
            tr, _ = _prefix_rows(aim)
            res = run_fleet(tr, lambda: make_policy("lru", 512), cost, eng, DEFAULT_CONTRACTS,
                            FleetConfig(replicas=8, router=RouterConfig(name=router)))
            share[router, aim] = _share_on_victim_replicas(res.records,
                                                           tr.meta["num_hot_prefixes"])
    assert share["prefix_affinity", "prefix"] == 1.0
    assert share["prefix_affinity", "none"] == 0.075
    assert share["kv_aware", "prefix"] < 1.0


def test_reproduce_aims_each_router_by_what_it_reads():
    """The fleet table's aimed runs: session ids against ``session``, the prompt lead against
    ``prefix_affinity`` and ``kv_aware``; the routers that read neither get none (the spread
    run covers every router)."""
    from prefixshield.experiments.reproduce import REPRODUCE_SECTIONS, reproduce_experiments

    exps = {e.name: e for e in reproduce_experiments(quick=True)}
    assert dict(exps["fleet-attack"].grid)["router"] == dict(exps["fleet-control"].grid)["router"]
    aimed = {r: e.base["aim"] for name, e in exps.items() if name.startswith("fleet-aimed-")
             for r in dict(e.grid)["router"]}
    assert aimed == {"session": "session", "prefix_affinity": "prefix", "kv_aware": "prefix"}
    assert exps["fleet-attack"].base["aim"] == "none"
    assert set(REPRODUCE_SECTIONS["fleet"]) == {n for n in exps if n.startswith("fleet-")}


def test_reproduce_only_names_a_section():
    from click.testing import CliRunner

    from prefixshield.cli import main

    r = CliRunner().invoke(main, ["reproduce", "--only", "flet", "--out", "unused"])
    assert r.exit_code == 2 and "unknown section 'flet'; known: attack" in r.output
