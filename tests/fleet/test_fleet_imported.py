"""Imported public traces feed fleet runs directly: the ``session`` tenant model's units are
the routing keys (a Mooncake prefix root stays on one replica), and the CLI runs an imported
trace file over a fleet under every router."""

from __future__ import annotations

from pathlib import Path

import pytest

from prefixshield.fleet.config import FleetConfig
from prefixshield.fleet.routers.base import ROUTERS, RouterConfig
from prefixshield.fleet.run import run_fleet
from prefixshield.policies import make_policy
from prefixshield.simulator.config import EngineConfig
from prefixshield.simulator.costmodel import load_profile
from prefixshield.tenancy import DEFAULT_CONTRACTS
from prefixshield.traces.importers import AzureImport, import_azure, import_mooncake
from prefixshield.traces.transform import limit_request_tokens

FIXTURES = Path(__file__).resolve().parents[1] / "traces" / "fixtures"
BLOCKS = 2048


def _mooncake():
    tr = import_mooncake(FIXTURES / "mooncake_conversation_head400.jsonl", num_groups=4,
                         assign="session", limit=120)
    return limit_request_tokens(tr, 30_000)


def _run(trace, router, key="prefix"):
    eng = EngineConfig(num_blocks=BLOCKS)
    fleet = FleetConfig(replicas=8, router=RouterConfig(name=router, session_key=key))
    return run_fleet(trace, lambda: make_policy("lru", BLOCKS), load_profile(
        "l4-qwen2.5-1.5b").cost, eng, DEFAULT_CONTRACTS, fleet)


def test_session_router_keeps_each_mooncake_prefix_root_on_one_replica():
    res = _run(_mooncake(), "session")
    rec = res.records
    per_root = rec.groupby(["group", "prefix_id"])["replica"].nunique()
    assert (per_root == 1).all()
    assert rec["replica"].nunique() > 1  # the roots are spread over the fleet
    by_group = _run(_mooncake(), "session", key="group").records
    assert (by_group.groupby("group")["replica"].nunique() == 1).all()


@pytest.mark.parametrize("router", sorted(ROUTERS))
def test_every_router_serves_an_imported_trace(router):
    tr = _mooncake()
    res = _run(tr, router)
    assert len(res.records) == len(tr)
    assert res.records["ttft_s"].notna().all()
    assert (res.records["cached_tokens"] <= res.records["prompt_tokens"]).all()


def test_azure_session_keys_are_the_group_system_prompt():
    tr = import_azure(FIXTURES / "azure_conv_head40.csv", num_groups=2, assign="round_robin",
                      shape=AzureImport(system_prompt_tokens=256))
    rec = _run(tr, "session").records
    # Azure has no sessions: every request of a group shares prefix_id 0, so one replica
    assert (rec.groupby("group")["replica"].nunique() == 1).all()
