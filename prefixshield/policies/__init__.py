"""Replacement policies, listed once in ``base.POLICY_MODULES`` and registered in
``base.POLICIES``.

A policy's module (and the numba dispatchers it builds, ~50 over all policies) is imported the
first time the policy is looked up or its module is named: ``make_policy("lru", ...)`` or
``import prefixshield.policies.lru`` loads LRU only, ``POLICIES["s3fifo"]`` or
``prefixshield.policies.s3fifo`` loads S3-FIFO (PEP 562 below).
"""

from __future__ import annotations

import importlib
from typing import Any

from prefixshield.policies.base import (COMPAT_MODES, POLICIES, POLICY_MODULES, Policy,
                                        make_policy, register_policy)

_SUBMODULES = frozenset(m.rpartition(".")[2] for m in POLICY_MODULES.values())
"""The policy modules' names: attributes of the package on first use, as when this package
imported them all."""


def __getattr__(name: str) -> Any:
    """A policy module (``lru``, ``prefixshield``, ``s3fifo``, ``static_quota``), imported when
    first asked for."""
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["COMPAT_MODES", "POLICIES", "POLICY_MODULES", "Policy", "make_policy",
           "register_policy"]
