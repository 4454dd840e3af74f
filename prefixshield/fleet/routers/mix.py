"""A fixed 64-bit mix (splitmix64's finaliser) for hashing routing keys: the same key gives
the same replica on every machine and run (Python's ``hash`` of a string is salted per
process)."""

from __future__ import annotations

MASK = (1 << 64) - 1


def mix64(x: int) -> int:
    """splitmix64's output function of ``x`` (taken mod 2**64)."""
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)
