"""What this machine has, read once where a bound depends on it."""

from __future__ import annotations

import os


def physical_memory_bytes() -> int | None:
    """This machine's physical memory in bytes (``sysconf`` pages x page size), or None where
    the platform does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # no sysconf names on this platform
        return None
