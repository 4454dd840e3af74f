"""The site's figures: the scripts under docs/figures/ write what the pages show, and every
figure a page names is there.

The diagrams' script runs in about a second; the demo's runs ``prefixshield run one_touch
--policy all`` (a few seconds once the kernels are compiled), each into a temporary folder.
"""

import importlib.util
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
FIGURES = DOCS / "figures"


def _script(name: str):
    """docs/figures/``name``.py as a module (it is not a package)."""
    spec = importlib.util.spec_from_file_location(f"docs_figures_{name}", FIGURES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_diagrams_script_writes_both_svgs(tmp_path):
    diagrams = _script("diagrams")
    written = diagrams.main(tmp_path / "out")
    assert [p.name for p in written] == list(diagrams.FILES)
    for path in written:
        text = path.read_text()
        assert text.startswith("<?xml") and "<svg" in text and text.rstrip().endswith("</svg>")


def test_diagrams_are_the_same_bytes_when_drawn_twice(tmp_path):
    diagrams = _script("diagrams")
    first = [p.read_bytes() for p in diagrams.main(tmp_path / "a")]
    second = [p.read_bytes() for p in diagrams.main(tmp_path / "b")]
    assert first == second


def test_demo_script_copies_the_runs_comparison_png(tmp_path):
    demo = _script("demo")
    path = demo.main(tmp_path)
    data = path.read_bytes()
    assert path.name == demo.NAME
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    assert len(data) <= demo.MAX_BYTES


def test_every_figure_a_page_shows_is_committed():
    shown = {(page, m) for page in DOCS.rglob("*.md")
             for m in re.findall(r"\]\((figures/[^)\s]+)\)", page.read_text())}
    assert shown, "no page shows a figure from docs/figures/"
    missing = [f"{page.relative_to(REPO)}: {ref}" for page, ref in sorted(shown)
               if not (page.parent / ref).is_file()]
    assert not missing, missing
