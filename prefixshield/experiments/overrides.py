"""Typed ``key=value`` overrides for parameter dataclasses (CLI ``--set``)."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any

from prefixshield.edges import MAX_INT


class OverrideError(ValueError):
    """A ``key=value`` override names an unknown field or a value of the wrong type."""


def _convert(text: str, tp: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if text.lower() in ("none", "null") and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _convert(text, a, key)
            except OverrideError as e:
                errors.append(str(e))
        raise OverrideError(errors[0] if errors else f"--set {key}: cannot parse {text!r}")
    if origin is tuple:
        parts = [p for p in text.split(",") if p != ""]
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(p, args[0], key) for p in parts)
        if len(parts) == 1 and len(args) > 1 and len(set(args)) == 1:
            # ``output_tokens=8`` means the range (8, 8): one value for a same-typed pair
            parts = parts * len(args)
        if len(parts) != len(args):
            raise OverrideError(f"--set {key}: expected {len(args)} comma-separated values, "
                                f"got {text!r}")
        return tuple(_convert(p, a, key) for p, a in zip(parts, args))
    if tp is bool:
        low = text.lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise OverrideError(f"--set {key}: expected true or false, got {text!r}")
    if tp is int:
        try:
            value = int(text)
        except ValueError:
            raise OverrideError(f"--set {key}: expected an integer, got {text!r}") from None
        # The declared bound of every integer field (prefixshield.edges): beyond it a count or
        # a length overflows a C long in numpy or numba before any check of its own runs.
        if not -MAX_INT <= value <= MAX_INT:
            raise OverrideError(f"--set {key}: must be in [{-MAX_INT}, {MAX_INT}], got {text}")
        return value
    if tp is float:
        try:
            value = float(text)
        except ValueError:
            raise OverrideError(f"--set {key}: expected a number, got {text!r}") from None
        if not math.isfinite(value):  # inf/nan reach generators and sizes as overflows
            raise OverrideError(f"--set {key}: expected a finite number, got {text!r}")
        return value
    if tp is str:
        return text
    raise OverrideError(f"--set {key}: this parameter cannot be set from the command line")


def _convert_keyed(text: str, tp: Any, key: str, where: str) -> Any:
    try:
        return _convert(text, tp, key)
    except OverrideError as e:
        raise OverrideError(str(e).replace("--set", where, 1)) from None


def parse_policy_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """``"name"`` or ``"name:key=value,key=value"`` -> (policy name, typed constructor kwargs).

    The keys are the keyword parameters of the policy class (beyond ``num_blocks`` and
    ``vllm_compat``), typed from its signature; e.g. ``prefixshield:debt_gate=false``.
    """
    import inspect

    from prefixshield.policies import POLICIES

    name, _, rest = spec.partition(":")
    name = name.strip()
    if name not in POLICIES:
        raise OverrideError(f"unknown policy {name!r}; known: {', '.join(sorted(POLICIES))}")
    if not rest.strip():
        return name, {}
    cls = POLICIES[name]
    sig = inspect.signature(cls.__init__)
    hints = typing.get_type_hints(cls.__init__)
    known = [p for p in sig.parameters if p not in ("self", "num_blocks", "vllm_compat")]
    out: dict[str, Any] = {}
    for item in rest.split(","):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise OverrideError(f"policy {spec!r}: expected name:key=value[,key=value]")
        if key not in known:
            raise OverrideError(f"policy {name!r} has no parameter {key!r}; known: "
                                f"{', '.join(known) or 'none'}")
        out[key] = _convert_keyed(value.strip(), hints.get(key, str), key, f"policy {name}:")
    return name, out


def parse_overrides(params_type: type, items: typing.Iterable[str]) -> dict[str, Any]:
    """Turn ``["key=value", ...]`` into typed values for the fields of ``params_type``."""
    hints = typing.get_type_hints(params_type)
    known = {f.name for f in dataclasses.fields(params_type)}
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise OverrideError(f"--set {item!r}: expected key=value")
        if key not in known:
            raise OverrideError(f"--set {key}: unknown parameter of {params_type.__name__}; "
                                f"known: {', '.join(sorted(known))}")
        out[key] = _convert(value.strip(), hints[key], key)
    return out
