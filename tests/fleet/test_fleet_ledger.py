"""PrefixShield's ledger across a fleet: per replica (default) or one bucket per group and
contract for the fleet, with a propagation delay. One replica's fleet ledger is its own; at zero
staleness every replica's copy is the fleet bucket replayed over every replica's charges; with
a delay every copy still receives every charge once."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from prefixshield.cli import main
from prefixshield.fleet.config import FleetConfig
from prefixshield.fleet.ledger import FleetLedger, replay_balance
from prefixshield.fleet.routers.base import RouterConfig
from prefixshield.policies import make_policy

sys.path.insert(0, str(Path(__file__).parent))
from test_fleet import _fleet, _same_run  # noqa: E402


def _policies(result):
    return result.fleet.ledger.policies


def test_one_replica_fleet_ledger_is_the_replica_ledger():
    own = _fleet("one_touch", "prefixshield", FleetConfig(1))
    shared = _fleet("one_touch", "prefixshield", FleetConfig(1, ledger="fleet"))
    assert own.fleet.mode == "split" and own.fleet.ledger is None
    assert shared.fleet.mode == "lockstep" and shared.fleet.ledger is not None
    _same_run(own.fleet.replicas[0], shared.fleet.replicas[0])
    _same_run(own, shared)
    assert own.fleet.replicas[0].policy_stats == shared.fleet.replicas[0].policy_stats
    # the ledger logged every charge the one replica made
    log = shared.fleet.ledger.log()
    charged = shared.fleet.replicas[0].policy_stats["charged_blocks"]
    assert log["blocks"].sum() == sum(sum(v) for v in charged.values()) > 0


@pytest.mark.parametrize("router", ["round_robin", "session", "kv_aware"])
def test_zero_staleness_copies_are_the_fleet_bucket(router):
    res = _fleet("one_touch", "prefixshield",
                 FleetConfig(4, RouterConfig(name=router), ledger="fleet"))
    ledger = res.fleet.ledger
    log = ledger.log()
    assert len(set(log["replica"].tolist())) > 1  # charges came from several replicas
    # the charges were made in one time order across the fleet
    assert np.all(np.diff(log["t_s"]) >= 0)
    pols = _policies(res)
    G, C = pols[0].balance.shape
    for g in range(G):
        for c in range(C):
            sel = (log["group"] == g) & (log["contract"] == c)
            bal, t0 = replay_balance(log["t_s"][sel], log["blocks"][sel],
                                     float(pols[0].rho[c]), float(pols[0].beta[c]))
            for p in pols:  # every copy is the fleet bucket, to the bit
                if sel.any():
                    assert (p.balance[g, c], p.t0[g, c]) == (bal, t0)
                else:
                    assert p.balance[g, c] == p.beta[c]
    # each replica's own charges are those it logged (I1 stays per replica)
    for r, p in enumerate(pols):
        own = log["replica"] == r
        for g in range(G):
            for c in range(C):
                sel = own & (log["group"] == g) & (log["contract"] == c)
                assert p.charged[g, c] == log["blocks"][sel].sum()
        p.check_invariants()
    # a debt read at the end is the same on every replica
    end = float(log["t_s"][-1])
    for g in range(G):
        assert len({p.debt(g, end) for p in pols}) == 1
    assert max(pols[0].debt(g, end) for g in range(G)) > 0  # the attacker owes


def test_stale_copies_receive_every_charge_late():
    s = 0.5
    res = _fleet("one_touch", "prefixshield", FleetConfig(4, ledger="fleet",
                                                          ledger_staleness_s=s))
    log = res.fleet.ledger.log()
    pols = _policies(res)
    G, C = pols[0].balance.shape
    k = np.arange(log["t_s"].shape[0])
    for r, p in enumerate(pols):
        own = log["replica"] == r
        # replica r's copy: its own charges at their time, the others' s seconds later; at one
        # instant a delivery goes before an own charge, deliveries and own charges in log order
        at = np.where(own, log["t_s"], log["t_s"] + s)
        order = np.lexsort((k, own.astype(int), at))
        for g in range(G):
            for c in range(C):
                o = order[(log["group"][order] == g) & (log["contract"][order] == c)]
                if o.shape[0] == 0:
                    continue
                bal, t0 = replay_balance(at[o], log["blocks"][o], float(p.rho[c]),
                                         float(p.beta[c]))
                assert (p.balance[g, c], p.t0[g, c]) == (bal, t0)


def test_other_policies_have_no_ledger():
    for policy in ("lru", "static_quota"):
        own = _fleet("one_touch", policy, FleetConfig(4))
        shared = _fleet("one_touch", policy, FleetConfig(4, ledger="fleet"))
        assert shared.fleet.ledger is None and shared.fleet.mode == "split"
        _same_run(own, shared)


def test_ledger_staleness_bounds():
    with pytest.raises(ValueError, match="needs the fleet ledger"):
        FleetConfig(2, ledger_staleness_s=1.0)
    with pytest.raises(ValueError, match="staleness"):
        FleetConfig(2, ledger="fleet", ledger_staleness_s=float("nan"))
    with pytest.raises(ValueError, match="ledger must be"):
        FleetConfig(2, ledger="global")
    with pytest.raises(ValueError, match="lockstep mode only"):
        FleetConfig(2, mode="split", ledger="fleet").resolved_mode()
    with pytest.raises(ValueError, match="staleness"):
        FleetLedger([make_policy("prefixshield", 64)], -1.0)


@pytest.mark.parametrize("args,needle", [
    (["--replicas", "2", "--ledger-staleness", "1"], "needs --ledger fleet"),
    (["--replicas", "2", "--ledger", "fleet", "--ledger-staleness", "-1"], "--ledger-staleness"),
    (["--replicas", "2", "--ledger", "fleet", "--ledger-staleness", "nan"],
     "--ledger-staleness"),
    (["--replicas", "2", "--ledger", "fleet", "--fleet-mode", "split"], "lockstep mode only"),
    (["--ledger", "fleet"], "needs --replicas"),
])
def test_bad_ledger_options_are_one_line_errors(args, needle):
    res = CliRunner().invoke(main, ["run", "one_touch", *args])
    assert res.exit_code == 2, res.output
    assert needle in res.output
    assert "Traceback" not in res.output


def test_run_with_a_fleet_ledger(tmp_path):
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["run", "one_touch", "-p", "prefixshield", "--replicas", "2",
                                    "--ledger", "fleet", "--ledger-staleness", "1",
                                    "--out", str(out), "--no-plot"])
    assert res.exit_code == 0, res.output
    assert "router round_robin (lockstep, fleet ledger (staleness 1 s))" in res.output
    summary = (out / "prefixshield" / "fleet" / "summary.csv").read_text()
    assert "ledger" in summary and "fleet" in summary


def test_ledger_fields_of_an_experiment_point():
    from prefixshield.experiments.cells import run_spec, task_key
    from prefixshield.experiments.spec import SpecError, type_field

    assert type_field("one_touch", "ledger", "fleet") == "fleet"
    assert type_field("one_touch", "ledger_staleness_s", "0.5") == 0.5
    for key, text, msg in (("ledger", "shared", "must be one of"),
                           ("ledger_staleness_s", "nan", "finite"),
                           ("ledger_staleness_s", "-1", "must be a number of seconds")):
        with pytest.raises(SpecError, match=f"{key}: .*{msg}"):
            type_field("one_touch", key, text, "--grid")
    fleet = {"replicas": 4, "ledger": "fleet", "ledger_staleness_s": 1.0}
    spec = run_spec("one_touch", fleet, 0, ("prefixshield",))
    assert (spec.fleet.ledger, spec.fleet.ledger_staleness_s) == ("fleet", 1.0)
    assert "ledger" not in spec.overrides and "ledger_staleness_s" not in spec.overrides
    with pytest.raises(SpecError, match="needs the fleet ledger"):
        run_spec("one_touch", {"replicas": 4, "ledger_staleness_s": 1.0}, 0, ("lru",))
    # part of a task's identity; the default ledger spelled out keeps the key it had
    keys = {task_key("simulate", "one_touch", s, 0)
            for s in ({"replicas": 4}, {"replicas": 4, "ledger": "fleet"}, fleet)}
    assert len(keys) == 3
    assert task_key("simulate", "one_touch", {"replicas": 4, "ledger": "replica"}, 0) \
        == task_key("simulate", "one_touch", {"replicas": 4}, 0)
