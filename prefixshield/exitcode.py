"""How the command-line program leaves the process: without the C++ static destructors.

On a loaded machine ``prefixshield sweep`` sometimes aborted after its last line of output and
its last file (SIGABRT, "terminate called without an active exception"; 3 runs in 25 under load
here, once in a CI run): a native thread pool (most likely pyarrow's, apache/arrow#34314) torn
down by the C++ static destructors that C's ``exit()`` runs after Python has finished. Nothing is
left to do by then, so the program skips that last step: :func:`finish`, a Python ``atexit``
handler, registers glibc's ``_exit`` with ``on_exit``. Registered after every library was
loaded, it is the first of C's exit handlers to run, and it ends the process with the status
``exit()`` was given. Everything before it runs as usual: every Python ``atexit`` handler (Ray's,
multiprocessing's, ``weakref.finalize``, the CLI's ``gc.freeze``, a caller's own) and Python's
finalization (streams flushed, files closed).

Only the program itself arms it (``prefixshield.cli.common._Program``); library use and
in-process test runners (``CliRunner``) leave the shutdown as it is, as do platforms without
glibc's ``on_exit``.
"""

from __future__ import annotations

armed = False
"""Set by the program when it starts (see the module doc)."""


def finish() -> None:
    """If :data:`armed`, have C's ``exit()`` end with ``_exit(status)`` before the C++ teardown
    (see the module doc); otherwise, or without glibc's ``on_exit``, do nothing."""
    if not armed:
        return
    import ctypes

    try:
        libc = ctypes.CDLL(None)  # the process's own symbols: glibc where there is one
        on_exit, _exit = libc.on_exit, libc._exit
    except (OSError, AttributeError):
        return
    on_exit.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    # on_exit calls it as (status, arg): _exit(status) with the status exit() was given
    on_exit(ctypes.cast(_exit, ctypes.c_void_p), None)
