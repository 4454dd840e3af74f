"""A name -> object registry whose entries live in modules imported on first look-up.

The policies (:data:`prefixshield.policies.POLICIES`) and the workloads
(:data:`prefixshield.workloads.WORKLOADS`) are registered this way: each registry is built from
one table, name -> the module that registers that name when imported, so a command that uses one
policy and one workload does not import (and build the numba dispatchers and dataclasses of) all
the others at start-up.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import Any


class LazyRegistry(Mapping[str, Any]):
    """Name -> registered object. Its names are those of ``modules`` (in that order) and of
    anything registered directly. ``in``, ``len``, iteration and ``sorted`` only read names;
    looking a name up (``registry[name]``, ``.get``, ``.values()``, ``.items()``) imports the
    module that registers it the first time.

    Args:
        kind: what is registered ("policy", "workload"), for error messages.
        modules: name -> dotted module path; importing the module registers the name.
        duplicate: the exception raised when a name is registered twice.
    """

    def __init__(self, kind: str, modules: Mapping[str, str],
                 duplicate: type[Exception] = ValueError) -> None:
        self.kind = kind
        self.modules = dict(modules)
        self._duplicate = duplicate
        self._entries: dict[str, Any] = {}

    def register(self, name: str, value: Any) -> None:
        """Add ``value`` under ``name``; a name registered twice raises."""
        if name in self._entries:
            raise self._duplicate(f"{self.kind} {name!r} registered twice")
        self._entries[name] = value

    def __getitem__(self, name: str) -> Any:
        try:
            return self._entries[name]
        except KeyError:
            if name not in self.modules:
                raise
        importlib.import_module(self.modules[name])
        try:
            return self._entries[name]
        except KeyError:
            raise RuntimeError(f"module {self.modules[name]} registers no {self.kind} "
                               f"{name!r}") from None

    def __contains__(self, name: object) -> bool:
        return name in self.modules or name in self._entries

    def __iter__(self) -> Iterator[str]:
        yield from self.modules
        yield from (n for n in self._entries if n not in self.modules)

    def __len__(self) -> int:
        return len(self.modules) + sum(n not in self.modules for n in self._entries)

    def __repr__(self) -> str:
        return f"<{self.kind} registry: {', '.join(self)}>"
