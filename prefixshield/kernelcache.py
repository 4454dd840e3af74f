"""Where numba keeps the package's compiled kernels: one directory per version of their sources.

numba's on-disk cache (``cache=True``) checks a cached function against its *own* source file
only (modification time and size). A kernel that inlines or calls kernels of another module
carries their compiled code in its cache entry, so after an edit of that other module (or an
upgrade that leaves the caller's file as it was) numba still loads the old machine code: the
fused event loop's cached PrefixShield wrappers, compiled against an older layout of the
policy's packed buffer, ran and wrote the wrong fields after a field was added to it. Hence one
cache directory per digest of every kernel source file (`KERNEL_SOURCES`): an edit of any
of them starts a fresh directory, and nothing compiled against other sources is ever loaded.

Location: ``$NUMBA_CACHE_DIR/kernels-<digest>`` where the user set ``NUMBA_CACHE_DIR``, else
``<prefixshield's cache directory>/numba/kernels-<digest>`` (`prefixshield.usercache.cache_dir`;
writable where a read-only install's ``__pycache__`` is not). Where that directory
cannot be written, numba falls back to its own locations by itself. Directories of older digests
are left in place (about 6 MB each after a full test run).
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from pathlib import Path

KERNEL_SOURCES = (
    "bench/cycles.py",
    "bench/selector.py",
    "fleet/addresses.py",
    "fleet/fused.py",
    "policies/hooks.py",
    "policies/kernels/hashtable.py",
    "policies/kernels/linkedlist.py",
    "policies/kernels/packed.py",
    "policies/kernels/prefixshield_kernels.py",
    "policies/kernels/s3fifo_kernels.py",
    "policies/lru.py",
    "policies/static_quota.py",
    "scheduling/kernels.py",
    "simulator/batch.py",
    "simulator/blockpool.py",
    "simulator/creation.py",
    "simulator/fused.py",
    "simulator/hashing.py",
    "traces/tokens.py",
)
"""Every package module (path under ``prefixshield/``) that defines a numba kernel; a test keeps
the list complete."""

DIR_PREFIX = "kernels-"
_OURS = re.compile(re.escape(DIR_PREFIX) + r"[0-9a-f]{16}")

PACKAGE_DIR = Path(__file__).resolve().parent


def digest(package_dir: Path = PACKAGE_DIR) -> str:
    """16 hex digits of SHA-256 over every `KERNEL_SOURCES` file (name and bytes); a
    missing file counts as empty."""
    h = hashlib.sha256()
    for rel in KERNEL_SOURCES:
        try:
            data = (package_dir / rel).read_bytes()
        except OSError:
            data = b""
        h.update(rel.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
    return h.hexdigest()[:16]


def cache_path(environ=None, package_dir: Path = PACKAGE_DIR) -> Path:
    """The kernel cache directory for these sources. ``NUMBA_CACHE_DIR`` (from ``environ``,
    default ``os.environ``) is the base, unless it is already one of ours (a child process
    inherits it from its parent), whose parent is then the base."""
    env = os.environ if environ is None else environ
    user = env.get("NUMBA_CACHE_DIR", "").strip()
    if user:
        base = Path(user).expanduser()
        if _OURS.fullmatch(base.name):
            base = base.parent
    else:
        from prefixshield.usercache import cache_dir

        base = cache_dir() / "numba"
    return base / f"{DIR_PREFIX}{digest(package_dir)}"


def configure() -> Path | None:
    """Point numba's cache at `cache_path` for this process and its children (through
    ``NUMBA_CACHE_DIR``; also numba's loaded config when numba is already imported) and return
    it; None, changing nothing, where no home directory can be found. Must run before the first
    kernel module is imported: numba picks a function's cache location when it decorates it."""
    try:
        path = cache_path()
    except RuntimeError:  # Path.home() without HOME or a passwd entry
        return None
    os.environ["NUMBA_CACHE_DIR"] = str(path)
    numba_config = sys.modules.get("numba.core.config")
    if numba_config is not None:
        numba_config.CACHE_DIR = str(path)
    return path


LOOPS = {"engine": "**/fused.run_loop-*.nbi", "fleet": "**/fused.fleet_loop-*.nbi"}
"""The big compiled loops (numba index files under the cache): a single engine's event loop,
and a lockstep fleet's loop around it (`prefixshield.fleet.fused`), each about a minute to
compile."""


def is_warm(environ=None, package_dir: Path = PACKAGE_DIR,
            loops: tuple[str, ...] = ("engine",)) -> bool:
    """Whether this version's kernel cache already holds the compiled ``loops`` (names of
    `LOOPS`; the numba index of each): if not, the first simulation that needs them compiles
    them (about a minute each), and a command says so. A policy's own kernels may still
    compile on its first run."""
    try:
        path = cache_path(environ, package_dir)
    except RuntimeError:
        return False
    try:
        return all(any(path.glob(LOOPS[name])) for name in loops)
    except OSError:
        return False
