"""``prefixshield bench --quick --json F`` runs every section and writes only finite numbers.

A smoke test: it never asserts a speed (the machines are shared; see prefixshield.bench)."""

import json
import math

from click.testing import CliRunner

from prefixshield.bench import SECTION_NAMES
from prefixshield.cli import main


def numbers(obj, path="$"):
    """Every (path, number) in a JSON document."""
    if isinstance(obj, bool):
        return
    if isinstance(obj, (int, float)):
        yield path, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from numbers(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from numbers(v, f"{path}[{i}]")


def test_bench_quick_runs_every_section_and_writes_finite_numbers(tmp_path, monkeypatch):
    monkeypatch.setenv("PREFIXSHIELD_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(main, ["bench", "--quick", "--json", str(out)])
    assert result.exit_code == 0, result.output + repr(result.exception)
    report = json.loads(out.read_text())
    assert report["quick"] is True
    assert list(report["sections"]) == list(SECTION_NAMES)
    for name, section in report["sections"].items():
        if name in ("pool", "plugin"):  # need vLLM: skipped under --quick, and say so
            assert section["skipped"] and "--quick" in section["skipped"]
            assert name in result.output or section["skipped"] in result.output
            continue
        assert section["skipped"] is None and section["rows"], name
    found = list(numbers(report))
    assert len(found) > 50
    bad = [(p, v) for p, v in found if not math.isfinite(v)]
    assert not bad, bad
    for title in ("engine throughput", "scheduler cost", "start-up", "key-stream replay",
                  "victim selection", "policy state bytes", "scale: engine time per request"):
        assert title in result.output
    scale = report["sections"]["scale"]
    assert {r["part"] for r in scale["rows"]} == {"engine + lru", "pool + lru",
                                                   "pool + prefixshield"}
    assert all(r["bytes_per_unit"] > 0 for r in scale["rows"] if r["unit"] == "blocks")
    traces = report["sections"]["traces"]
    assert {r["part"] for r in traces["rows"]} == {"build", "simulate + lru",
                                                    "long run, streamed"}
    for long_run in [r for r in traces["rows"] if r["part"] == "long run, streamed"]:
        assert long_run["peak_rss_mib"] > 0 and long_run["size"] > 0, long_run["detail"]
    fleet = report["sections"]["fleet"]
    assert [r["part"] for r in fleet["rows"]] == ["single engine", "split round_robin",
                                                  "split round_robin, process",
                                                  "lockstep least_loaded", "lockstep kv_aware",
                                                  "lockstep least_loaded, Python loop"]
    assert all(r["us_per_request"] > 0 for r in fleet["rows"]), fleet["rows"]
    by_part = {r["part"]: r for r in fleet["rows"]}
    assert by_part["split round_robin"]["vs_split"] == 1.0
    assert all(by_part[p]["vs_split"] > 0 for p in by_part if p.startswith("lockstep"))


def test_bench_rejects_an_unknown_section():
    result = CliRunner().invoke(main, ["bench", "--section", "warp-drive"])
    assert result.exit_code != 0 and "unknown bench section 'warp-drive'" in result.output
