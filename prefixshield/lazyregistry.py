"""A name -> object registry whose entries live in modules imported on first look-up: the
package's own, and those other installed packages declare in an entry-point group.

The policies (`prefixshield.policies.POLICIES`) and the workloads
(`prefixshield.workloads.WORKLOADS`) are registered this way: each registry is built from
one table, name -> the module that registers that name when imported, so a command that uses one
policy and one workload does not import (and build the numba dispatchers and dataclasses of) all
the others at start-up.

Another package adds names without editing this one by declaring entry points in the registry's
group (``prefixshield.policies``, ``prefixshield.workloads``), e.g. in its ``pyproject.toml``::

    [project.entry-points."prefixshield.policies"]
    my_policy = "my_package.my_policy:MyPolicy"

The group is read (package metadata only, nothing imported) the first time a name the package
does not list is asked for, or the names are listed; the entry point's module is imported the
first time its name is looked up. Loading it must register the name (the module decorates its
class or generator with the registry's ``register`` function), or the object it names is
registered under the entry point's name. The package's own names win: an entry point that reuses
one is skipped with a warning.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Iterator, Mapping
from importlib import metadata
from typing import Any


class LazyRegistry(Mapping[str, Any]):
    """Name -> registered object. Its names are those of ``modules`` (in that order), of the
    entry points in ``group`` and of anything registered directly. ``in`` and look-ups of the
    package's own names read nothing else; listing the names (iteration, ``len``, ``sorted``) or
    asking for another name reads the entry-point group once; looking a name up
    (``registry[name]``, ``.get``, ``.values()``, ``.items()``) imports the module that
    registers it the first time.

    Args:
        kind: what is registered ("policy", "workload"), for error messages.
        modules: name -> dotted module path; importing the module registers the name.
        duplicate: the exception raised when a name is registered twice.
        group: the entry-point group other installed packages add names in (None: none).
    """

    def __init__(self, kind: str, modules: Mapping[str, str],
                 duplicate: type[Exception] = ValueError, group: str | None = None) -> None:
        self.kind = kind
        self.modules = dict(modules)
        self.group = group
        self._duplicate = duplicate
        self._entries: dict[str, Any] = {}
        self._external: dict[str, metadata.EntryPoint] | None = None

    def register(self, name: str, value: Any) -> None:
        """Add ``value`` under ``name``; a name registered twice raises."""
        if name in self._entries:
            raise self._duplicate(f"{self.kind} {name!r} registered twice")
        self._entries[name] = value

    def entry_points(self) -> dict[str, metadata.EntryPoint]:
        """Name -> entry point of the names other installed packages add (read once)."""
        if self._external is None:
            found: dict[str, metadata.EntryPoint] = {}
            if self.group is not None:
                for ep in metadata.entry_points(group=self.group):
                    if ep.name in self.modules or ep.name in found:
                        warnings.warn(f"{self.kind} {ep.name!r} of entry point {ep.value!r} "
                                      f"(group {self.group}) is already taken; skipped",
                                      stacklevel=2)
                        continue
                    found[ep.name] = ep
            self._external = found
        return self._external

    def __getitem__(self, name: str) -> Any:
        try:
            return self._entries[name]
        except KeyError:
            pass
        if name in self.modules:
            importlib.import_module(self.modules[name])
            where = f"module {self.modules[name]}"
        elif name in self.entry_points():
            ep = self._external[name]
            value = ep.load()
            if name not in self._entries:  # it did not register itself
                self.register(name, value)
            where = f"entry point {ep.value}"
        else:
            raise KeyError(name)
        try:
            return self._entries[name]
        except KeyError:
            raise RuntimeError(f"{where} registers no {self.kind} {name!r}") from None

    def __contains__(self, name: object) -> bool:
        return (name in self.modules or name in self._entries
                or (isinstance(name, str) and name in self.entry_points()))

    def __iter__(self) -> Iterator[str]:
        yield from self.modules
        external = self.entry_points()
        yield from external
        yield from (n for n in self._entries if n not in self.modules and n not in external)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return f"<{self.kind} registry: {', '.join(self)}>"
