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


def test_a_big_fleet_names_some_idle_replicas_and_lists_only_the_busy_ones(mooncake):
    from prefixshield.cli.run import IDLE_ROWS
    from prefixshield.fleet.metrics import IDLE_NAMED

    r = invoke("run", mooncake, "-p", "lru", "--blocks", "4096", "--replicas", "100",
               "--router", "round_robin")
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    served = 60  # the fixture's requests, one replica each under round_robin
    assert 100 > IDLE_ROWS and 100 - served > IDLE_NAMED
    named = ", ".join(str(i) for i in range(served, served + IDLE_NAMED))
    assert (f"{100 - served} of 100 replicas received no request (replica {named} and "
            f"{100 - served - IDLE_NAMED} more)") in text
    assert f"{100 - served} idle replicas not listed" in text
    assert not [line for line in r.output.splitlines() if "│ idle │" in line.replace(" ", "")]


def test_a_lockstep_run_on_the_python_loop_says_why(mooncake):
    from prefixshield.fleet.fused import MAX_AFFINITY_REPLICAS

    n = MAX_AFFINITY_REPLICAS + 1
    r = invoke("run", mooncake, "-p", "lru", "--blocks", "4096", "--replicas", n,
               "--router", "prefix_affinity")
    assert r.exit_code == 0, r.output
    assert (f"(lockstep, Python loop: prefix_affinity over more than {MAX_AFFINITY_REPLICAS} "
            "replicas)") in " ".join(r.output.split())
    r = invoke("run", mooncake, "-p", "lru", "--blocks", "4096", "--replicas", 4,
               "--router", "prefix_affinity")
    assert r.exit_code == 0 and "Python loop" not in r.output, r.output
