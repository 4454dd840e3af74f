"""The package's imports run one way: no two of its parts import each other, directly or through
others.

A part is a subpackage (``prefixshield.simulator``) or a top-level module
(``prefixshield.figures``). Every import counts, at module level or inside a function (a lazy
import still ties the two parts: one cannot be understood, tested or moved without the other),
except those under ``if TYPE_CHECKING:``, which annotate and never run.
"""

from __future__ import annotations

import ast
from pathlib import Path

import prefixshield

ROOT = Path(prefixshield.__file__).parent


def _part(module: str) -> str | None:
    """The part of ``prefixshield.a.b`` (``a``), None for a module outside the package or the
    package itself."""
    names = module.split(".")
    return names[1] if names[0] == "prefixshield" and len(names) > 1 else None


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING"
            or isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, package: str):
    """Every module ``tree`` imports (absolute names), outside ``if TYPE_CHECKING:``."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _type_checking(node):
            yield from (m for child in node.orelse for m in _imports(child, package))
            continue
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            yield base
            # ``from prefixshield import figures``: the names may be modules themselves
            yield from (f"{base}.{a.name}" for a in node.names)
        yield from _imports(node, package)


def part_graph(root: Path) -> dict[str, set[str]]:
    """part -> the other parts it imports, over every ``.py`` file under ``root``."""
    graph: dict[str, set[str]] = {}
    known = {p.stem if p.is_file() else p.name for p in root.iterdir()
             if p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists())}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).with_suffix("")
        module = ".".join(rel.parts)
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        if path.name == "__init__.py":
            module = package = module.removesuffix(".__init__")
        me = _part(module)
        if me is None:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for imported in _imports(tree, package):
            other = _part(imported)
            if other in known and other != me and not other.startswith("__"):
                graph.setdefault(me, set()).add(other)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as its parts in order (the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_parts_of_the_package_import_one_way():
    graph = part_graph(ROOT)
    assert {"cli", "simulator", "policies", "fleet"} <= set(graph)  # the walk saw them
    cycle = find_cycle(graph)
    assert cycle is None, "parts that import each other: " + " -> ".join(cycle)


def test_a_lazy_import_back_up_is_a_cycle_and_type_checking_is_not(tmp_path):
    pkg = tmp_path / "prefixshield"
    (pkg / "low").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "low" / "__init__.py").write_text("")
    (pkg / "high.py").write_text("from prefixshield.low import thing\n")
    (pkg / "low" / "thing.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from prefixshield import high\n")
    assert find_cycle(part_graph(pkg)) is None
    (pkg / "low" / "other.py").write_text("def f():\n    from .. import high\n")
    assert find_cycle(part_graph(pkg)) == ["high", "low", "high"]
