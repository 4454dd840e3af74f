"""numba's kernel cache lives in one directory per digest of the kernel sources
(:mod:`prefixshield.kernelcache`), so a kernel compiled against other sources of a module it
inlines or calls is never loaded."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from prefixshield import kernelcache

NUMBA_DECORATOR = re.compile(r"@(njit|jit|intrinsic|vectorize|guvectorize|generated_jit)\b"
                             r"|\bnjit\(")


def test_every_module_with_a_kernel_is_a_kernel_source():
    pkg = kernelcache.PACKAGE_DIR
    with_kernels = sorted(str(p.relative_to(pkg)) for p in pkg.rglob("*.py")
                          if NUMBA_DECORATOR.search(p.read_text()))
    assert with_kernels == sorted(kernelcache.KERNEL_SOURCES)


def test_digest_changes_with_any_kernel_source_and_only_with_them(tmp_path):
    pkg = tmp_path / "prefixshield"
    shutil.copytree(kernelcache.PACKAGE_DIR, pkg,
                    ignore=shutil.ignore_patterns("__pycache__", "*.nbi", "*.nbc"))
    base = kernelcache.digest(pkg)
    assert base == kernelcache.digest(kernelcache.PACKAGE_DIR)
    (pkg / "cli" / "run.py").write_text((pkg / "cli" / "run.py").read_text() + "\n# not a kernel source\n")
    assert kernelcache.digest(pkg) == base
    seen = {base}
    for rel in ("policies/kernels/prefixshield_kernels.py", "simulator/fused.py"):
        path = pkg / rel
        path.write_text(path.read_text() + "\n# edited\n")
        seen.add(kernelcache.digest(pkg))
    assert len(seen) == 3
    assert all(re.fullmatch(r"[0-9a-f]{16}", d) for d in seen)


def test_cache_path_under_the_users_numba_dir_and_not_nested_in_a_child(tmp_path, monkeypatch):
    d = kernelcache.digest()
    mine = kernelcache.cache_path({"NUMBA_CACHE_DIR": str(tmp_path)})
    assert mine == tmp_path / f"kernels-{d}"
    # a child process inherits the parent's setting: same directory, not kernels-*/kernels-*
    assert kernelcache.cache_path({"NUMBA_CACHE_DIR": str(mine)}) == mine
    other = tmp_path / "kernels-0123456789abcdef"
    assert kernelcache.cache_path({"NUMBA_CACHE_DIR": str(other)}) == mine
    monkeypatch.setenv("PREFIXSHIELD_CACHE_DIR", str(tmp_path / "c"))
    assert kernelcache.cache_path({}) == tmp_path / "c" / "numba" / f"kernels-{d}"


def test_a_fresh_process_caches_kernels_in_the_digest_directory(tmp_path):
    code = ("import json, os, prefixshield.simulator.fused as f\n"
            "print(json.dumps({'env': os.environ['NUMBA_CACHE_DIR'],"
            " 'path': f._allocate._cache._cache_path}))\n")
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    expected = tmp_path / f"kernels-{kernelcache.digest()}"
    assert got["env"] == str(expected)
    assert Path(got["path"]).is_relative_to(expected)


def test_is_warm_says_whether_the_engine_loop_is_compiled(tmp_path):
    from prefixshield.kernelcache import cache_path, is_warm

    env = {"NUMBA_CACHE_DIR": str(tmp_path)}
    assert not is_warm(env)  # a command then says numba is compiling
    where = cache_path(env) / "simulator_abc"
    where.mkdir(parents=True)
    (where / "lru._replay-12.py311.nbi").write_bytes(b"")
    assert not is_warm(env)  # a policy's kernel alone does not make the loop warm
    (where / "fused.run_loop-470.py311.nbi").write_bytes(b"")
    assert is_warm(env)
    assert not is_warm(env, loops=("engine", "fleet"))  # a lockstep fleet's loop is its own
    fleet = cache_path(env) / "fleet_abc"
    fleet.mkdir()
    (fleet / "fused.fleet_loop-374.py311.nbi").write_bytes(b"")
    assert is_warm(env, loops=("engine", "fleet"))


def test_a_run_that_may_run_in_lockstep_waits_for_the_fleet_loop_too(tmp_path, monkeypatch):
    from prefixshield.cli.common import compile_note
    from prefixshield.fleet.config import FleetConfig
    from prefixshield.fleet.routers.base import RouterConfig
    from prefixshield.kernelcache import cache_path

    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    where = cache_path() / "simulator_abc"
    where.mkdir(parents=True)
    (where / "fused.run_loop-470.py311.nbi").write_bytes(b"")
    assert compile_note() == ""
    assert compile_note(FleetConfig(4, RouterConfig("round_robin"))) == ""  # split
    for fleet in (FleetConfig(4, RouterConfig("kv_aware")),
                  FleetConfig(4, RouterConfig("round_robin"), mode="lockstep"),
                  FleetConfig(4, RouterConfig("round_robin"), ledger="fleet")):
        assert "numba compiles them" in compile_note(fleet)
