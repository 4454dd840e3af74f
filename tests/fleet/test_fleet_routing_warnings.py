"""A fleet run says when its router leaves replicas idle or loads them unevenly, and why; an idle
replica prints as idle, never as a row of ``nan``."""

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from prefixshield.cli import main

FIXTURES = Path(__file__).parent.parent / "traces" / "fixtures"


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def mooncake(tmp_path_factory):
    path = tmp_path_factory.mktemp("mc") / "mc.parquet"
    r = invoke("trace", "import", "mooncake", FIXTURES / "mooncake_synthetic_head60.jsonl",
               path, "--groups", "2", "--assign", "session")
    assert r.exit_code == 0, r.output
    return path


def test_session_by_tenant_on_more_replicas_than_tenants_warns_and_shows_idle(mooncake):
    r = invoke("run", mooncake, "-p", "lru", "--blocks", "4096", "--replicas", "8",
               "--router", "session", "--router-key", "group")
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert not re.search(r"\bnan\b", r.output)
    assert "warning: router session: 6 of 8 replicas received no request" in text
    assert "Cause: session hashes each request's tenant; the trace has 2 distinct keys for " \
           "8 replicas, and its busiest key (tenant 'group" in text
    idle = [line for line in r.output.splitlines() if "idle" in line]
    assert len(idle) == 6, r.output


def test_an_even_router_does_not_warn(mooncake):
    r = invoke("run", mooncake, "-p", "lru", "--blocks", "4096", "--replicas", "2",
               "--router", "round_robin")
    assert r.exit_code == 0, r.output
    assert "warning: router" not in r.output and "idle" not in r.output


def test_the_warning_states_the_threshold(mooncake):
    from prefixshield.fleet.metrics import LOAD_WARN

    r = invoke("run", mooncake, "-p", "lru", "--blocks", "4096", "--replicas", "4",
               "--router", "session", "--router-key", "group")
    assert r.exit_code == 0, r.output
    assert f"> {LOAD_WARN:g}" in " ".join(r.output.split())
