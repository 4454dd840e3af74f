"""No function of the package takes 15 parameters or more.

The fused loop once took 70 arrays and scalars one by one, and its allocation 55, called twice
with the same 55 arguments: a signature that long hides which state a function reads and
writes, and every new field meant editing each call. State now travels as a few named tuples
and packed buffers; this keeps it so, for every ``def`` (methods, nested functions and numba
kernels alike; ``self``, ``*args`` and ``**kwargs`` count as one each).
"""

from __future__ import annotations

import ast
from pathlib import Path

import prefixshield

MAX_PARAMETERS = 14


def _parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = fn.args
    return (len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + (a.vararg is not None)
            + (a.kwarg is not None))


def _long_signatures(root: Path):
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = _parameters(node)
                if n > MAX_PARAMETERS:
                    yield f"{path.relative_to(root.parent)}:{node.lineno} {node.name}: {n}"


def test_no_function_takes_15_parameters_or_more():
    root = Path(prefixshield.__file__).parent
    assert not list(_long_signatures(root))


def test_the_count_sees_a_long_signature(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    names = ", ".join(f"a{i}" for i in range(13))
    (pkg / "m.py").write_text(f"class C:\n    def f(self, {names}, *rest):\n        pass\n"
                              f"def g({names}):\n    pass\n")
    assert list(_long_signatures(pkg)) == ["pkg/m.py:2 f: 15"]
