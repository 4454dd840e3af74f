"""How the command-line program leaves the process: with the command's own exit status, once
everything Python does at exit is done, and before the interpreter tears its modules down.

A finished command used to abort now and then after its last line and its last file (SIGABRT,
exit 134, "terminate called without an active exception"; 9 runs in 60 of a small sweep on a
loaded machine). Every core dump showed the same two threads: the main thread in
``Py_FinalizeEx`` clearing modules, and an arrow worker thread finishing a Parquet read that
``read_table`` had already returned from. The worker dropped the last reference to something
that holds a Python object -- the scan's ``arrow::py::PyReadableFile`` (the file object pandas
had opened and handed to pyarrow) or a ``PyBuffer`` read from it -- whose destructor takes the
GIL; a thread that asks for the GIL while the interpreter finalizes is ended by
``pthread_exit``, whose forced unwind through that ``noexcept`` destructor calls
``std::terminate``. The cause is fixed where the files are read (`prefixshield.parquetfiles`:
arrow opens them itself, so nothing it holds needs the GIL); `leave` makes the program's
exit deterministic besides, so that no native thread still at work when a command returns can
turn its status into an abort.

`leave` does, in Python's own order, what the interpreter does at exit and matters to a
command -- it waits for the non-daemon threads (and runs ``threading``'s exit hooks, which shut
``concurrent.futures`` executors down), runs every ``atexit`` handler (Ray's,
``multiprocessing``'s, ``logging.shutdown``, ``weakref.finalize``, a caller's own), flushes the
standard streams -- and then ends the process with ``os._exit(status)``. What it skips is module
teardown and the C/C++ exit handlers: nothing of a command's is written there (every file it
writes is closed and renamed before the command returns, `prefixshield.atomic`), and the
objects' memory goes back to the operating system with the process. It also saves the teardown's
collector passes over every object alive at exit (0.35-0.45 CPU-s of a ``prefixshield run``
before the CLI froze them).

Only the program calls it (`prefixshield.cli.common._Program`); library use and in-process
runners (``CliRunner``, pytest) leave the interpreter's exit as it is.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import NoReturn

FLUSH_FAILED = 120
"""The status CPython exits with when flushing a standard stream fails at exit (e.g. stdout is a
pipe whose reader has gone: ``prefixshield run ... | head -1``)."""


def status_of(exc: BaseException) -> int:
    """The exit status CPython gives a process ended by ``exc`` escaping to the top level.

    ``SystemExit(None)`` is 0, ``SystemExit(int)`` that int (the OS keeps its low 8 bits), any
    other ``SystemExit`` code is printed to stderr and is 1; another exception's traceback is
    printed to stderr and is 1.
    """
    if isinstance(exc, SystemExit):
        code = exc.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        print(code, file=sys.stderr)
        return 1
    sys.excepthook(type(exc), exc, exc.__traceback__)
    return 1


def _join_threads() -> None:
    """What ``Py_FinalizeEx`` does first: ``threading._shutdown`` -- the exit hooks of
    ``threading`` (``concurrent.futures`` joins its workers there) and a join of every
    non-daemon thread. A private function of CPython's (3.4 to 3.13); without it, the join."""
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()
        return
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()


def _flush_streams() -> bool:
    """Flush stdout, then stderr, as the interpreter does at exit; False if one failed."""
    ok = True
    for stream in (sys.stdout, sys.stderr):
        if stream is None or getattr(stream, "closed", True):
            continue
        try:
            stream.flush()
        except (OSError, ValueError):
            ok = False
    return ok


def leave(status: int) -> NoReturn:
    """End the process with ``status`` after the interpreter's exit work, before its teardown.

    Runs, in CPython's order, the thread shutdown, every ``atexit`` handler and the flush of the
    standard streams (see the module doc); then ``os._exit``. An ``atexit`` handler that raises
    is reported on stderr as Python reports it and does not stop the others; a failed flush
    makes the status `FLUSH_FAILED`, as it does in CPython. ``status`` beyond 0-255 is
    taken modulo 256, as the OS does.
    """
    try:
        _join_threads()
    except BaseException as exc:  # noqa: BLE001 -- a Ctrl-C while joining still leaves cleanly
        status = status_of(exc) if not isinstance(exc, KeyboardInterrupt) else 130
    atexit._run_exitfuncs()  # each handler's error is printed, the rest still run
    if not _flush_streams():
        status = FLUSH_FAILED
    os._exit(status & 0xFF)
