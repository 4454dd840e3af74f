"""A policy and a workload from another package: ``tests/extensions/fixture_pkg`` (FIFO eviction
and a short ``one_touch``), installed with pip into a folder of its own and put on the path of
child processes, is found through its entry points and runs under ``run``, ``compare``,
``sweep`` and inside vLLM (the plugin on vLLM's own ``KVCacheManager``). The policy is also held
to its reference with :mod:`prefixshield.testing`, as its author would.

This process never imports the package through its entry points: the registries here keep the
package's own names only."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from prefixshield.testing import random_ops, run_twin

FIXTURE = Path(__file__).parent / "fixture_pkg"
SMALL = ["--set", "duration_s=6"]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The fixture package installed (``pip install --no-deps --target``) into a fresh folder;
    it is built from a copy, so no build files land in the source tree."""
    src = tmp_path_factory.mktemp("src") / "fixture_pkg"
    shutil.copytree(FIXTURE, src, ignore=shutil.ignore_patterns("build", "*.egg-info",
                                                                "__pycache__"))
    target = tmp_path_factory.mktemp("site")
    # setuptools (the fixture's build backend) from this environment where it has one (Python
    # 3.11's venvs do, and torch brings it on later ones); else pip fetches it to build
    isolation = ["--no-build-isolation"] if importlib.util.find_spec("setuptools") else []
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", *isolation,
                    "--disable-pip-version-check", "--target", str(target), str(src)],
                   check=True, capture_output=True, text=True)
    return target


def child(site: Path, *args: str, code: str | None = None) -> subprocess.CompletedProcess:
    """``python -m prefixshield ARGS`` (or ``python -c CODE``) with ``site`` on its path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-c", code] if code else [sys.executable, "-m", "prefixshield", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def test_the_registries_list_the_entry_points_and_load_them_on_first_look_up(site):
    code = textwrap.dedent("""
        import json, sys
        from prefixshield.policies import POLICIES
        from prefixshield.workloads import WORKLOADS
        out = {"policies": sorted(POLICIES), "workloads": "short_one_touch" in WORKLOADS,
               "loaded_before": "prefixshield_fifo.policy" in sys.modules}
        out["class"] = POLICIES["fifo"].__name__
        out["loaded_after"] = "prefixshield_fifo.policy" in sys.modules
        out["params"] = WORKLOADS["short_one_touch"].params_type.__name__
        print(json.dumps(out))
    """)
    import json

    got = json.loads(child(site, code=code).stdout)
    assert got == {"policies": ["fifo", "lru", "prefixshield", "s3fifo", "static_quota"],
                   "workloads": True, "loaded_before": False, "class": "FIFOPolicy",
                   "loaded_after": True, "params": "ShortOneTouchParams"}


def test_the_external_policy_runs_the_external_workload(site):
    out = child(site, "run", "short_one_touch", "-p", "lru", "-p", "fifo", *SMALL).stdout
    assert "short_one_touch" in out and "fifo" in out and "failed" not in out


def test_the_external_policy_under_compare(site, tmp_path):
    csv = tmp_path / "cmp.csv"
    out = child(site, "compare", "one_touch", "-p", "lru,fifo", "--seeds", "2", *SMALL,
                "--out", str(csv)).stdout
    assert "fifo" in out
    assert "fifo" in csv.read_text()


def test_the_external_policy_under_sweep(site, tmp_path):
    out = tmp_path / "sweep"
    child(site, "sweep", "one_touch", "-p", "lru,fifo", "--grid", "blocks=512,1024", *SMALL,
          "--seeds", "1", "--name", "small", "--executor", "inprocess", "--no-report", "--out",
          str(out))
    cells = sorted(p.relative_to(out / "cells").as_posix() for p in out.rglob("*.parquet"))
    assert [c.split("/")[1:] for c in cells] == [[p, policy, "seed=0.parquet"]
                                                 for p in ("p000", "p001")
                                                 for policy in ("fifo", "lru")]


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None
                    and os.environ.get("PREFIXSHIELD_REQUIRE_VLLM") != "1",
                    reason="vLLM not installed (PREFIXSHIELD_REQUIRE_VLLM=1 makes it fail)")
def test_the_external_policy_inside_vllm(site):
    """The plugin builds ``fifo`` by name inside vLLM's ``KVCacheManager`` and keeps vLLM's
    invariants over a random stream of admissions, chunks, decodes, preemptions and frees."""
    code = textwrap.dedent("""
        from prefixshield.live import plugin
        from prefixshield.live.kvdriver import Side, run_stream
        side = Side(40, 16, plugin.plugin_env("fifo", groups=["default", "tenant-a",
                                                              "tenant-b"], check_invariants=True))
        obs = run_stream(side, 0, num_ops=250)
        pool = side.pool
        pool.check_invariants()
        stats = pool.prefixshield_stats()
        print(type(pool).__name__, type(pool.policy).__name__, stats["policy"],
              stats["num_evictions"], pool.get_num_free_blocks(),
              sum(1 for o in obs if o[0] == "admit" and o[2]))
    """)
    words = child(site, code=code).stdout.split()[-6:]
    assert words[:3] == ["PolicyBlockPool", "FIFOPolicy", "fifo"]
    assert int(words[3]) > 0 and int(words[4]) == 39 and int(words[5]) > 0


def test_the_example_policy_matches_its_reference():
    sys.path.insert(0, str(FIXTURE))
    try:
        from prefixshield_fifo.policy import FIFOPolicy
        from prefixshield_fifo.reference import ReferenceFIFO
    finally:
        sys.path.remove(str(FIXTURE))
    reclaimed = 0
    for seed in range(10):
        for num_blocks in (2, 5, 16):
            for compat in ("current", "0.10"):
                twin = run_twin(FIFOPolicy(num_blocks, compat), ReferenceFIFO(num_blocks, compat),
                                num_blocks, random_ops(seed), num_keys=2 * num_blocks,
                                work_conserving=True)
                reclaimed += twin.num_reclaimed
    assert reclaimed > 0
