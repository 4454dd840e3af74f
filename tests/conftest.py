import os
import signal
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

WARM_KERNELS = "PREFIXSHIELD_WARM_KERNELS"
"""Set to 1 (``make test`` does): while the suite runs, a low-priority child process compiles
the package's numba kernels into the on-disk cache by running ``prefixshield bench --quick``.
On a clean checkout compiling them is several minutes of the suite, taken one kernel at a time
by whichever test first calls it; the suite runs on one core, so the child uses the other, and a
test that reaches a kernel after the child compiled it loads it instead. It changes no result
(numba writes each cache file whole; a kernel is the same whichever process compiled it)."""

_warm: subprocess.Popen | None = None


def pytest_sessionstart(session):
    global _warm
    if os.environ.get(WARM_KERNELS) != "1" or hasattr(session.config, "workerinput"):
        return
    import prefixshield  # noqa: F401  (sets NUMBA_CACHE_DIR for the child to inherit)

    # its own session: at the end the whole group goes (the bench's children with it)
    _warm = subprocess.Popen([sys.executable, "-m", "prefixshield", "bench", "--quick"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             env={**os.environ}, start_new_session=True,
                             preexec_fn=lambda: os.nice(10))


def pytest_sessionfinish(session, exitstatus):
    if _warm is None:
        return
    try:
        os.killpg(_warm.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    _warm.wait()
