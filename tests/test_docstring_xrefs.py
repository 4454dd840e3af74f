"""The API reference renders cross-references: no docstring or comment of the package is
written with Sphinx roles (``:meth:`x```, ``:class:`~a.b.C```), which mkdocstrings shows raw;
a reference is ``[`C`][a.b.C]`` (autorefs) or plain code."""

import re
from pathlib import Path

import prefixshield

SPHINX_ROLE = re.compile(r":(meth|class|func|mod|data|attr|exc|obj):`")


def test_no_sphinx_role_is_left_in_the_package():
    root = Path(prefixshield.__file__).parent
    found = [f"{p.relative_to(root.parent)}:{i}" for p in sorted(root.rglob("*.py"))
             for i, line in enumerate(p.read_text().splitlines(), 1) if SPHINX_ROLE.search(line)]
    assert not found, f"{len(found)} Sphinx roles, first at {found[:5]}"
