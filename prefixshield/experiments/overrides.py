"""Typed ``key=value`` overrides for parameter dataclasses (CLI ``--set``)."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any


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
            return int(text)
        except ValueError:
            raise OverrideError(f"--set {key}: expected an integer, got {text!r}") from None
    if tp is float:
        try:
            return float(text)
        except ValueError:
            raise OverrideError(f"--set {key}: expected a number, got {text!r}") from None
    if tp is str:
        return text
    raise OverrideError(f"--set {key}: this parameter cannot be set from the command line")


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
