"""What this machine has, read once where a bound depends on it, and the environment the command
line gives the libraries that size themselves to it."""

from __future__ import annotations

import os


def physical_memory_bytes() -> int | None:
    """This machine's physical memory in bytes (``sysconf`` pages x page size), or None where
    the platform does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # no sysconf names on this platform
        return None


START_ENV: dict[str, str] = {"OPENBLAS_THREAD_TIMEOUT": "4"}
"""Environment the command line (`prefixshield.cli.common`) sets (unless the user already
has) before anything loads numpy.

OpenBLAS -- numpy's copy, and scipy's, which numba loads at start-up to probe for BLAS -- starts a
worker thread per core that busy-waits 2**28 cycles (~0.1 s) for work before it sleeps. No command
hands BLAS work large enough to thread, so on a 2-core machine that spin was 0.06-0.15 CPU-s of
every command (measured per thread, more the idler the machine). ``OPENBLAS_THREAD_TIMEOUT=4``
(OpenBLAS's minimum, 2**4 cycles) only sends idle workers to sleep sooner: the thread count,
hence how BLAS splits any work and every result, is unchanged."""
