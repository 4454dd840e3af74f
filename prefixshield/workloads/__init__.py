"""Synthetic workloads, one module each, registered in `WORKLOADS`.

- `base`: ``WorkloadParams`` / ``PrefixParams`` and the building blocks of a trace.
- `outputs`: output-length distributions from data (Azure conv, ShareGPT) or a range.
- `attack`: the victim-plus-attacker setup and the creation-pressure knob.
- one module per workload: ``one_touch``, ``low_and_slow``, ``two_pass_replay``,
  ``delayed_replay``, ``sharegpt`` (and ``bursty_sharegpt``), ``borrowing``, and
  ``searched_attack`` (the attacker as a parameter space, for ``prefixshield attack-search``),
  ``servegen`` (tenants that are real clients of a production model).

Each workload is listed once, in ``registry.WORKLOAD_MODULES``; its module is imported the first
time the workload is looked up in `WORKLOADS` or a name of it is taken from this package.

Every params docstring says where each default comes from: the reference setup or
data. ``prefixshield.experiments.single.build_trace`` sizes the load from the workload's own
request shapes (``probe_shapes``) and a profile.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

from prefixshield.workloads.registry import (WORKLOAD_MODULES, WORKLOADS, generate, make_params,
                                             params_to_dict)

# The workload modules load on first use (PEP 562; their registry entries too, see
# ``registry.WORKLOAD_MODULES``): building their params dataclasses was ~0.015 CPU-s of every
# `prefixshield run`, which needs one workload.
_LAZY = {"AttackParams": "attack", "PrefixParams": "base", "WorkloadParams": "base",
         "BorrowingParams": "borrowing", "borrowing": "borrowing",
         "DelayedReplayParams": "delayed_replay", "delayed_replay": "delayed_replay",
         "designed_debt_blocks": "delayed_replay",
         "LowAndSlowParams": "low_and_slow", "low_and_slow": "low_and_slow",
         "OneTouchParams": "one_touch", "one_touch": "one_touch",
         "SearchedAttackParams": "searched_attack", "searched_attack": "searched_attack",
         "ServeGenParams": "servegen", "servegen": "servegen",
         "BurstyShareGPTParams": "sharegpt", "ShareGPTParams": "sharegpt",
         "bursty_sharegpt": "sharegpt", "sharegpt": "sharegpt",
         "TwoPassReplayParams": "two_pass_replay", "two_pass_replay": "two_pass_replay"}


def __getattr__(name: str) -> Any:
    """The params classes and generators of `_LAZY`, imported when first asked for."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    globals()[name] = value
    return value


class _Package(types.ModuleType):
    """This package. Most generators share their module's name (``one_touch`` in
    ``.one_touch``); importing such a module binds the module to the package's attribute of that
    name, where the generator was when this package imported every module. The generator stays
    there: ``prefixshield.workloads.one_touch`` is the function, whatever was imported first."""

    def __setattr__(self, name: str, value: Any) -> None:
        if (isinstance(value, types.ModuleType) and _LAZY.get(name) == name
                and value.__name__ == f"{__name__}.{name}"):
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

__all__ = [
    "AttackParams", "BorrowingParams", "BurstyShareGPTParams", "DelayedReplayParams",
    "LowAndSlowParams", "OneTouchParams", "PrefixParams", "SearchedAttackParams", "ServeGenParams",
    "ShareGPTParams",
    "TwoPassReplayParams", "WORKLOADS", "WORKLOAD_MODULES", "WorkloadParams", "borrowing",
    "bursty_sharegpt", "delayed_replay", "designed_debt_blocks", "generate", "low_and_slow",
    "make_params", "one_touch", "params_to_dict", "searched_attack", "servegen", "sharegpt",
    "two_pass_replay",
]
