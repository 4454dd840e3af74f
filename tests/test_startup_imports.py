"""What `prefixshield run` loads and sets up at start-up (issue 10): only what the run needs.

Behaviour, not speed: which modules a run imports, the environment the CLI gives OpenBLAS, that a
console without colours skips highlighting, that an in-process CliRunner registers no exit
handler (the program's own exit is tests/test_exit_status.py), and the environment of the
start-up bench's children. No timing is asserted (the machines are shared)."""

import atexit
import gc
import io
import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner
from rich.text import Text

import prefixshield.traces as traces
from prefixshield.cli import common as cli
from prefixshield.cli import main
from prefixshield.bench import startup

# A generated-workload run without --out, in a fresh interpreter (sys.modules as a user's process
# has them), printing the modules it ended with and the environment OpenBLAS saw.
_RUN_AND_REPORT = """
import contextlib, io, json, os, sys
sys.argv = ["prefixshield", "run", "one_touch", "-p", "lru", "--set", "duration_s=8"]
from prefixshield.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    main(standalone_mode=False)
import gc
print(json.dumps({"modules": sorted(sys.modules),
                  "timeout": os.environ.get("OPENBLAS_THREAD_TIMEOUT"),
                  "frozen": gc.get_freeze_count(), "collector_on": gc.isenabled()}))
"""


def run_fresh(code: str, **env: str) -> dict:
    """Run ``code`` in a new interpreter with ``env`` added; its last stdout line as JSON.

    The OpenBLAS variable is dropped first: importing the CLI here set it in this process."""
    full = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    full.update(env)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def fresh_run(tmp_path_factory) -> dict:
    cache = tmp_path_factory.mktemp("cache")
    return run_fresh(_RUN_AND_REPORT, PREFIXSHIELD_CACHE_DIR=str(cache))


def test_run_of_a_generated_workload_loads_no_parquet_io_and_no_importers(fresh_run):
    mods = set(fresh_run["modules"])
    assert "prefixshield.simulator.engine" in mods  # it did run
    assert "prefixshield.traces.io" not in mods
    assert "prefixshield.traces.importers" not in mods
    assert "pyarrow.parquet" not in mods


def test_run_loads_only_the_workload_it_runs(fresh_run):
    mods = set(fresh_run["modules"])
    assert "prefixshield.workloads.one_touch" in mods
    others = {"prefixshield.workloads.sharegpt", "prefixshield.workloads.servegen",
              "prefixshield.workloads.searched_attack", "prefixshield.workloads.borrowing",
              "prefixshield.workloads.two_pass_replay", "prefixshield.workloads.delayed_replay",
              "prefixshield.workloads.low_and_slow"}
    assert not others & mods


def test_run_loads_only_the_policy_modules_it_runs(fresh_run):
    # The fused loop needs every policy's kernels (their kernel modules load), but the engine
    # picks the policy by its registered name, so the classes of the others stay unloaded.
    mods = set(fresh_run["modules"])
    assert "prefixshield.policies.lru" in mods
    assert not {"prefixshield.policies.prefixshield", "prefixshield.policies.s3fifo"} & mods


def test_program_loads_the_run_with_the_collector_paused_then_frozen(fresh_run):
    assert fresh_run["frozen"] > 0 and fresh_run["collector_on"]
    assert "numba.np.linalg" in fresh_run["modules"]  # numba's CPU target, loaded meanwhile


def test_loading_outside_the_program_leaves_the_collector_alone(monkeypatch):
    before = gc.get_freeze_count()
    with cli._loading():
        assert gc.isenabled()
    assert gc.get_freeze_count() == before
    monkeypatch.setattr(cli._Program, "running", True)
    try:
        with cli._loading():
            assert not gc.isenabled()
        assert gc.isenabled() and gc.get_freeze_count() > before
    finally:
        gc.unfreeze()


_LIST_THEN_LOOK_UP = """
import json, sys
from prefixshield.policies import POLICIES, POLICY_MODULES
from prefixshield.workloads import WORKLOAD_MODULES, WORKLOADS
mods = lambda: sorted(m for m in sys.modules
                      if m.startswith(("prefixshield.policies.", "prefixshield.workloads.")))
out = {"policies": sorted(POLICIES), "workloads": sorted(WORKLOADS), "listed": mods(),
       "lengths": [len(POLICIES), len(WORKLOADS)], "in": ["lru" in POLICIES, "nope" in POLICIES]}
import prefixshield.policies, prefixshield.workloads
out["s3fifo_module"] = prefixshield.policies.s3fifo.__name__
out["one_touch_params"] = prefixshield.workloads.OneTouchParams.__name__
out["after_two"] = mods()
out["names"] = {n: POLICIES[n].name for n in POLICY_MODULES}
out["generators"] = {n: [WORKLOADS[n].workload_name, WORKLOADS[n].params_type.__name__]
                     for n in WORKLOAD_MODULES}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def registries() -> dict:
    return run_fresh(_LIST_THEN_LOOK_UP)


def test_registries_name_every_policy_and_workload_without_importing_them(registries):
    assert registries["policies"] == ["lru", "prefixshield", "s3fifo", "static_quota"]
    assert registries["workloads"] == ["borrowing", "bursty_sharegpt", "delayed_replay",
                                       "low_and_slow", "one_touch", "searched_attack", "servegen",
                                       "sharegpt", "two_pass_replay"]
    assert registries["lengths"] == [4, 9] and registries["in"] == [True, False]
    assert registries["listed"] == ["prefixshield.policies.base",
                                    "prefixshield.workloads.registry"]


def test_package_attributes_import_one_module_each(registries):
    assert registries["s3fifo_module"] == "prefixshield.policies.s3fifo"
    assert registries["one_touch_params"] == "OneTouchParams"
    loaded = set(registries["after_two"])
    assert {"prefixshield.policies.s3fifo", "prefixshield.workloads.one_touch"} <= loaded
    assert not {"prefixshield.policies.lru", "prefixshield.policies.prefixshield",
                "prefixshield.policies.static_quota", "prefixshield.workloads.sharegpt",
                "prefixshield.workloads.servegen"} & loaded


def test_every_listed_module_registers_its_name(registries):
    assert registries["names"] == {n: n for n in registries["policies"]}
    assert {n: g[0] for n, g in registries["generators"].items()} == {
        n: n for n in registries["workloads"]}
    assert registries["generators"]["bursty_sharegpt"][1] == "BurstyShareGPTParams"


def test_workload_generators_stay_package_attributes_after_their_module_loads():
    import prefixshield.workloads as workloads
    import prefixshield.workloads.servegen as by_attribute  # noqa: F401  (binds the module)
    from prefixshield.workloads.servegen import ServeGenParams, servegen

    assert workloads.servegen is servegen and workloads.WORKLOADS["servegen"] is servegen
    assert workloads.ServeGenParams is ServeGenParams
    assert sys.modules["prefixshield.workloads.servegen"].servegen is servegen
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        workloads.not_a_name  # noqa: B018


def test_registering_a_listed_name_twice_raises():
    from prefixshield.policies import POLICIES, register_policy
    from prefixshield.workloads.registry import WORKLOADS, register

    with pytest.raises(ValueError, match="policy 'lru' registered twice"):
        register_policy(POLICIES["lru"])
    one_touch = WORKLOADS["one_touch"]  # its module registered it
    with pytest.raises(RuntimeError, match="workload 'one_touch' registered twice"):
        register("one_touch", object)(lambda params=None: None)
    assert WORKLOADS["one_touch"] is one_touch


def test_run_loads_neither_plotting_nor_the_vllm_side(fresh_run):
    mods = set(fresh_run["modules"])
    assert not {m for m in mods if m.split(".")[0] == "matplotlib"}
    assert not {m for m in mods if m.startswith(("prefixshield.validate", "prefixshield.live"))}


def test_cli_shortens_the_openblas_idle_spin_before_numpy_loads(fresh_run):
    assert fresh_run["timeout"] == cli.START_ENV["OPENBLAS_THREAD_TIMEOUT"] == "4"


def test_cli_keeps_an_openblas_timeout_the_user_set():
    got = run_fresh("import json, os, prefixshield.cli\n"
                    "print(json.dumps(os.environ['OPENBLAS_THREAD_TIMEOUT']))",
                    OPENBLAS_THREAD_TIMEOUT="12")
    assert got == "12"


def test_console_without_colours_never_calls_the_highlighter(monkeypatch):
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(sys, "stdout", io.StringIO())  # not a terminal: no colour system
    calls = []
    console = cli._make_console()
    console.highlighter = lambda text: calls.append(str(text)) or Text(str(text))
    console.print("rate 1.5 req/s")
    assert console.color_system is None and calls == []
    assert sys.stdout.getvalue() == "rate 1.5 req/s\n"


def test_console_with_colours_still_highlights(monkeypatch):
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    calls = []
    console = cli._make_console()
    console.highlighter = lambda text: calls.append(str(text)) or Text(str(text))
    console.print("rate 1.5 req/s")
    assert console.color_system is not None and calls == ["rate 1.5 req/s"]


def test_traces_package_still_exports_io_and_importers_on_first_use():
    from prefixshield.traces import importers, io as trace_io

    assert traces.read_trace is trace_io.read_trace
    assert traces.write_trace is trace_io.write_trace
    assert traces.import_azure is importers.import_azure
    assert set(traces.__all__) >= {"read_trace", "write_trace", "import_mooncake"}
    assert traces.io is trace_io and traces.importers is importers
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        traces.not_a_name  # noqa: B018


def test_startup_floor_loads_like_the_program():
    code = startup.FLOOR_LOAD.replace(startup.RUN_IMPORTS, "import numpy\n").replace(
        startup.FLOOR_TARGET, "")
    assert "gc.disable()" in code and "import numpy\n" in code
    got = run_fresh(code + "import json\nprint(json.dumps([gc.isenabled(), "
                           "gc.get_freeze_count() > 0]))")
    assert got == [True, True]


def test_startup_bench_children_get_the_cli_env_and_write_bytecode():
    env, dropped = startup.child_env({"PYTHONDONTWRITEBYTECODE": "1", "PATH": "/bin"})
    assert dropped == ["PYTHONDONTWRITEBYTECODE"] and "PYTHONDONTWRITEBYTECODE" not in env
    assert env["OPENBLAS_THREAD_TIMEOUT"] == "4" and env["PATH"] == "/bin"
    env, dropped = startup.child_env({"OPENBLAS_THREAD_TIMEOUT": "9"})
    assert dropped == [] and env["OPENBLAS_THREAD_TIMEOUT"] == "9"


def test_cli_runner_invocations_register_no_exit_handler():
    before = atexit._ncallbacks()
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0 and atexit._ncallbacks() == before
