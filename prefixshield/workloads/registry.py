"""The one registry of workloads: name -> generator, each with its params dataclass."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from prefixshield.lazyregistry import LazyRegistry
from prefixshield.tenancy import Contract
from prefixshield.traces.schema import Trace

WORKLOAD_MODULES: dict[str, str] = {
    "borrowing": "prefixshield.workloads.borrowing",
    "delayed_replay": "prefixshield.workloads.delayed_replay",
    "low_and_slow": "prefixshield.workloads.low_and_slow",
    "one_touch": "prefixshield.workloads.one_touch",
    "searched_attack": "prefixshield.workloads.searched_attack",
    "servegen": "prefixshield.workloads.servegen",
    "sharegpt": "prefixshield.workloads.sharegpt",
    "bursty_sharegpt": "prefixshield.workloads.sharegpt",
    "two_pass_replay": "prefixshield.workloads.two_pass_replay",
}
"""The one list of workloads: name -> the module whose generator registers itself under that name
(`register`). A module is imported the first time its workload is looked up, so a run of
one workload does not build the others' params dataclasses at start-up."""

WORKLOADS = LazyRegistry("workload", WORKLOAD_MODULES, duplicate=RuntimeError,
                         group="prefixshield.workloads")
"""Workload name -> generator ``fn(params=None) -> Trace``; ``fn.params_type`` is its params
dataclass. A read-only mapping: each workload module decorates its generator with
`register`, and is imported on the first look-up of its name. Other installed packages add
workloads in the entry-point group ``prefixshield.workloads`` (see
[`prefixshield.lazyregistry`][prefixshield.lazyregistry])."""


def register(name: str, params_type: type) -> Callable[[Callable], Callable]:
    """Decorator: add a generator to `WORKLOADS` under ``name`` with ``params_type``."""
    def deco(fn: Callable) -> Callable:
        fn.params_type = params_type  # type: ignore[attr-defined]
        fn.workload_name = name  # type: ignore[attr-defined]
        WORKLOADS.register(name, fn)
        return fn
    return deco


def make_params(name: str, **overrides: Any):
    """Params of workload ``name`` with ``overrides``; unknown names or fields raise ValueError."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(sorted(WORKLOADS))}")
    ptype = WORKLOADS[name].params_type  # type: ignore[attr-defined]
    known = {f.name for f in dataclasses.fields(ptype)}
    bad = sorted(set(overrides) - known)
    if bad:
        raise ValueError(f"workload {name!r} has no parameter(s) {', '.join(bad)}; "
                         f"known: {', '.join(sorted(known))}")
    return ptype(**overrides)


def generate(name: str, **overrides: Any) -> Trace:
    """Generate workload ``name`` with its default params updated by ``overrides``."""
    return WORKLOADS[name](make_params(name, **overrides))


def params_to_dict(params) -> dict[str, Any]:
    """JSON-able dict of a params dataclass (tuples become lists, contracts dicts)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(params):
        v = getattr(params, f.name)
        if isinstance(v, tuple):
            v = list(v)
        elif isinstance(v, Mapping):
            v = {k: dataclasses.asdict(c) if isinstance(c, Contract) else c for k, c in v.items()}
        out[f.name] = v
    return out
