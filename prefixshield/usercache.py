"""A small on-disk cache of derived numbers in the user's cache directory (never required).

Location: ``$PREFIXSHIELD_CACHE_DIR`` if set and non-empty, else ``$XDG_CACHE_HOME/prefixshield``,
else ``~/.cache/prefixshield`` (the XDG / platformdirs convention on Linux). One JSON file per
entry, ``<dir>/<namespace>/<sha256 of the key>.json``, holding the package version, the key
itself and the value; an entry is used only if both its version and its key equal the caller's
(a hash collision or an entry from another version is a miss). Writes are atomic
(`prefixshield.atomic`). Every failure -- a missing, unreadable or read-only directory, a
corrupt or foreign file -- is a miss (or a skipped write), never an error: the caller measures
instead.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

ENV_CACHE_DIR = "PREFIXSHIELD_CACHE_DIR"


def cache_dir() -> Path:
    """The cache directory (it may not exist)."""
    explicit = os.environ.get(ENV_CACHE_DIR, "").strip()
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    base = Path(xdg).expanduser() if xdg and os.path.isabs(os.path.expanduser(xdg)) \
        else Path.home() / ".cache"
    return base / "prefixshield"


def _path(namespace: str, key: Any) -> tuple[Path, str]:
    text = json.dumps(key, sort_keys=True, separators=(",", ":"))
    return cache_dir() / namespace / f"{hashlib.sha256(text.encode()).hexdigest()}.json", text


def load(namespace: str, key: Any, version: str) -> Any | None:
    """The value stored under ``(namespace, key)`` by this ``version``, or None (a miss).

    ``key`` must be JSON-serialisable; it is compared whole, not only by its hash."""
    path, text = _path(namespace, key)
    try:
        entry = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or entry.get("version") != version \
            or json.dumps(entry.get("key"), sort_keys=True, separators=(",", ":")) != text:
        return None
    return entry.get("value")


def store(namespace: str, key: Any, version: str, value: Any) -> bool:
    """Store ``value`` (JSON-serialisable) under ``(namespace, key)`` atomically; False when the
    directory cannot be created or written (nothing is raised)."""
    from prefixshield.atomic import write_text

    path, _ = _path(namespace, key)
    try:
        write_text(path, json.dumps({"version": version, "key": key, "value": value},
                                    sort_keys=True, allow_nan=False))
    except (OSError, ValueError):
        return False
    return True
