"""The self-contained HTML report: a run's --out folder and a results store each get one page
(tables, figures inline) that a browser renders with every tenant and policy on it.

The browser test runs headless Chromium (Debian's ``chromium``; ``make test`` installs it where
it can). It is skipped only when no Chromium is installed and ``PREFIXSHIELD_REQUIRE_BROWSER``
is unset; with that variable set, a missing browser fails it. The screenshot is kept under
``test-artifacts/html-report/`` (ignored by git) for a person to look at.
"""

import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from prefixshield.cli import main

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "traces" / "fixtures"
ARTIFACTS = REPO / "test-artifacts" / "html-report"
POLICIES = ("lru", "prefixshield", "s3fifo", "static_quota")
TENANTS = ("group0", "group1", "group2", "group3")


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def browser() -> str | None:
    """A headless-capable Chromium on PATH, or None (the test then skips unless
    PREFIXSHIELD_REQUIRE_BROWSER is set)."""
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable",
                 "chrome", "chrome-headless-shell"):
        path = shutil.which(name)
        if path:
            return path
    if os.environ.get("PREFIXSHIELD_REQUIRE_BROWSER"):
        pytest.fail("PREFIXSHIELD_REQUIRE_BROWSER is set but no chromium is on PATH (Debian: "
                    "apt-get install chromium; `make test` tries to)")
    pytest.skip("no chromium on PATH (set PREFIXSHIELD_REQUIRE_BROWSER to make this a failure)")


def headless(exe: str, *args: str) -> subprocess.CompletedProcess:
    """Run Chromium headless (no sandbox: tests may run as root in a container; no GPU)."""
    return subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu",
                           "--hide-scrollbars", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "HOME": str(ARTIFACTS.parent)})


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """All four policies on 60 Mooncake records in 4 session tenants, with --out."""
    out = tmp_path_factory.mktemp("html") / "run"
    return out, _imported_run(4, out, "--policy", "all")


def _imported_run(groups: int, out, *run_args) -> str:
    """``run``'s output on the 60 Mooncake records imported as ``groups`` session tenants (1,024
    blocks of 512 tokens, ``--out out``)."""
    trace = out.parent / "mc.parquet"
    r = invoke("trace", "import", "mooncake", FIXTURES / "mooncake_synthetic_head60.jsonl",
               trace, "--groups", str(groups), "--assign", "session")
    assert r.exit_code == 0, r.output
    r = invoke("run", trace, *run_args, "--blocks", "1024", "--block-size", "512", "--out", out)
    assert r.exit_code == 0, r.output
    return r.output


def test_run_prints_a_row_per_tenant_and_policy(run_dir):
    _, output = run_dir
    assert "per tenant" in output
    rows = [line for line in output.splitlines() if re.match(r"^│ group\d", line)]
    pairs = {(cells.split("│")[1].strip(), cells.split("│")[2].strip()) for cells in rows}
    assert pairs == {(g, p) for g in TENANTS for p in POLICIES}


def test_the_run_page_is_one_self_contained_file(run_dir):
    out, _ = run_dir
    page = (out / "report.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "data:image/png;base64," in page
    # no reference to another file: the page opens anywhere on its own
    assert not re.search(r'(src|href)="(?!data:|#)', page)
    before = page
    r = invoke("report", out)
    assert r.exit_code == 0, r.output and "report.html" in r.output
    assert (out / "report.html").read_text() == before  # rebuilt from the folder alone


def test_report_refuses_a_folder_that_is_neither(tmp_path):
    r = CliRunner().invoke(main, ["report", str(tmp_path)])
    assert r.exit_code == 1 and r.output.count("\n") == 1
    assert "not a results store" in r.output and "not a run's --out folder" in r.output


def test_the_run_page_renders_in_headless_chromium(run_dir):
    exe = browser()
    out, _ = run_dir
    url = (out / "report.html").resolve().as_uri()
    dom = headless(exe, "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    table = re.search(r'<table id="tenants">(.*?)</table>', dom.stdout, re.S)
    assert table, "the rendered page has no per-tenant table"
    cells = re.findall(r"<tr[^>]*>\s*<td[^>]*>([^<]*)</td>\s*<td[^>]*>([^<]*)</td>",
                       table.group(1))
    assert set(cells) == {(g, p) for g in TENANTS for p in POLICIES}
    summary = re.search(r'<table id="summary">(.*?)</table>', dom.stdout, re.S).group(1)
    assert all(f">{p}<" in summary for p in POLICIES)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "run-report.png"
    shot.unlink(missing_ok=True)
    r = headless(exe, "--window-size=1400,2600", f"--screenshot={shot}", url)
    assert r.returncode == 0 and shot.is_file(), r.stderr[-2000:]
    from matplotlib.image import imread

    img = imread(shot)
    assert img.shape[0] == 2600 and img.shape[1] == 1400
    # something was drawn: not one flat colour, and the figure's colours are there
    assert float(np.std(img[..., :3])) > 0.05
    assert (np.abs(img[..., :3] - np.array([0.12, 0.47, 0.71])).sum(axis=-1) < 0.1).any()


def test_a_store_gets_a_page_with_its_tables_figures_and_tenants(tmp_path):
    from prefixshield.experiments.executors import make_executor
    from prefixshield.experiments.report import build_report
    from prefixshield.experiments.runner import run_store
    from prefixshield.experiments.spec import Experiment
    from prefixshield.experiments.store import ResultsStore

    exp = Experiment(name="tiny", workload="one_touch", policies=("lru", "prefixshield"),
                     seeds=(0,), base={"duration_s": 8.0})
    store = ResultsStore.create(tmp_path / "store", [exp], kind="sweep")
    run_store(store, make_executor("inprocess"))
    build_report(store)
    page = (tmp_path / "store" / "report.html").read_text()
    assert page.count("data:image/png;base64,") >= 3
    table = re.search(r'<table id="tenants">(.*?)</table>', page, re.S).group(1)
    for who in ("victim", "attacker", "lru", "prefixshield"):
        assert f">{who}<" in table


def test_a_fleet_run_page_has_its_replicas_and_tenants(tmp_path):
    out = tmp_path / "fleet"
    _imported_run(2, out, "-p", "lru", "--replicas", "2", "--router", "least_loaded")
    page = (out / "report.html").read_text()
    assert "<h3>lru: replicas</h3>" in page and "<h3>lru: tenants</h3>" in page
    tenants = page.split("<h3>lru: tenants</h3>")[1]
    assert ">group0<" in tenants and ">group1<" in tenants
