"""Property-based CLI fuzz: every option of every command, values drawn from its click type.

Walks the ``prefixshield`` click group, so an option added later is fuzzed (and must declare a
bound) from its first commit. Two properties:

* parsing: any value of any option either parses within its declared bound or is refused with
  a click usage error (exit 2, one ``Error:`` line) -- never a traceback;
* running: the commands that are cheap on a tiny trace (``run``, ``trace inspect``, ``trace
  generate``, ``trace import``, ``report``) run to success or a one-line error (exit 1 or 2, no
  traceback) under an alarm, with fuzzed values of their options.
"""

from __future__ import annotations

import math
import signal
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefixshield.cli import main
from prefixshield.edges import INT64_MAX, unbounded_options

HOSTILE_TEXT = ["..", "../x", "/", "$x$", "$", "a,b", "=1", "", " ", "nan", "inf", "-1",
                "1e20", "99999999999999999999", "x" * 300, "lru:x=1", "é", "a=b=c"]
ARGV_TEXT = st.text(st.characters(blacklist_characters="\x00"), max_size=40)
"""Any text a process can receive: execve ends an argument at its first NUL byte."""


def leaf_commands(group: click.Group, path=()):
    """``(argv prefix, command)`` for every command under ``group``."""
    for name, cmd in sorted(group.commands.items()):
        if isinstance(cmd, click.Group):
            yield from leaf_commands(cmd, path + (name,))
        else:
            yield path + (name,), cmd


LEAVES = list(leaf_commands(main))
OPTIONS = [(path, cmd, p) for path, cmd in LEAVES for p in cmd.params
           if isinstance(p, click.Option) and not p.is_flag and p.name != "help"]


def values_for(param: click.Parameter) -> st.SearchStrategy[str]:
    """Text for ``param`` drawn from its type: in range, at and past its bounds, and hostile."""
    t = param.type
    hostile = st.sampled_from(HOSTILE_TEXT)
    if isinstance(t, click.Choice):
        return st.one_of(st.sampled_from(list(t.choices)), hostile)
    if isinstance(t, (click.IntRange, click.types.IntParamType)):
        edges = [getattr(t, "min", None), getattr(t, "max", None)]
        near = [str(e + d) for e in edges if e is not None for d in (-1, 0, 1)]
        return st.one_of(st.integers(-2 ** 70, 2 ** 70).map(str), st.sampled_from(near or ["0"]),
                         hostile)
    if isinstance(t, (click.FloatRange, click.types.FloatParamType)):
        return st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr),
                         st.sampled_from(["1e300", "-1e300", "0", "nan", "inf", "-inf"]),
                         hostile)
    return st.one_of(ARGV_TEXT, hostile)


def test_every_numeric_option_declares_a_bound():
    assert unbounded_options(main) == []


def test_the_fuzz_covers_every_command():
    assert len(LEAVES) >= 16 and len(OPTIONS) >= 80


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_any_option_value_parses_within_its_bound_or_is_a_usage_error(data):
    path, cmd, param = data.draw(st.sampled_from(OPTIONS))
    text = data.draw(values_for(param))
    args = [*(["x"] * sum(1 for p in cmd.params if isinstance(p, click.Argument)
                          and p.required)), param.opts[0], text]
    try:
        ctx = cmd.make_context(" ".join(path), args)
    except click.ClickException as e:
        assert e.exit_code == 2, (path, param.opts, text, e)
        return
    value = ctx.params[param.name]
    values = value if isinstance(value, tuple) else (value,)
    for v in values:
        if isinstance(v, bool) or v is None:
            continue
        if isinstance(v, int):
            assert -INT64_MAX - 1 <= v <= INT64_MAX, (path, param.opts, text)
        if isinstance(v, float):
            assert math.isfinite(v), (path, param.opts, text)


# ---------------------------------------------------------------------- running, on tiny inputs
class _Hang(Exception):
    pass


def _invoke(argv: list[str], seconds: int = 30):
    """Invoke the CLI in-process under an alarm: a hang fails the test instead of CI."""
    def ring(*_):
        raise _Hang(f"no answer in {seconds} s: {argv}")

    old = signal.signal(signal.SIGALRM, ring)
    signal.alarm(seconds)
    try:
        return CliRunner().invoke(main, argv)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz")
    r = CliRunner().invoke(main, ["trace", "generate", "one_touch", str(d / "t.parquet"),
                                  "--set", "duration_s=2", "--set", "base_rate=2"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["sweep", "one_touch", "-p", "lru", "--seeds", "1", "--set",
                                  "duration_s=2", "--executor", "inprocess", "--no-report",
                                  "--out", str(d / "store")])
    assert r.exit_code == 0, r.output
    src = Path(__file__).parent / "traces" / "fixtures" / "mooncake_synthetic_head60.jsonl"
    return {"trace": str(d / "t.parquet"), "store": str(d / "store"), "src": str(src),
            "tmp": d}


RUNNABLE = {
    ("run",): lambda i: ["run", i["trace"], "--no-plot"],
    ("trace", "inspect"): lambda i: ["trace", "inspect", i["trace"]],
    ("trace", "generate"): lambda i: ["trace", "generate", "one_touch",
                                      str(i["tmp"] / "g.parquet"), "--set", "duration_s=1"],
    ("trace", "import"): lambda i: ["trace", "import", "mooncake", i["src"],
                                    str(i["tmp"] / "m.parquet"), "--limit", "30"],
    ("report",): lambda i: ["report", i["store"], "--quiet"],
}
RUN_OPTIONS = [(path, p) for path, cmd, p in OPTIONS if path in RUNNABLE
               and p.name not in ("out_dir",)]


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_running_with_any_option_value_succeeds_or_fails_in_one_line(inputs, data):
    path, param = data.draw(st.sampled_from(RUN_OPTIONS))
    text = data.draw(values_for(param))
    argv = RUNNABLE[path](inputs) + [param.opts[0], text]
    r = _invoke(argv)
    assert r.exit_code in (0, 1, 2), (argv, r.exit_code, r.output)
    assert r.exception is None or isinstance(r.exception, SystemExit), \
        (argv, repr(r.exception), r.output)
    assert "Traceback" not in r.output, (argv, r.output)
    if r.exit_code:
        assert r.output.count("Error:") == 1, (argv, r.output)
