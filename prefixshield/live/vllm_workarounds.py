"""Work-arounds needed to start a real vLLM engine in a process that also runs the simulator.

vLLM 0.32.0's CPU platform, while starting a worker, scans every module in ``sys.modules`` and
calls ``vars(value).get("kernel")`` on each attribute that has a ``__dict__``. llvmlite (loaded by
numba, i.e. by our simulator) exposes ``llvmlite.binding.ffi.lib``, whose ``__getattr__`` forwards
*every* name to the C library, ``__dict__`` included, and returns a function wrapper instead of a
dict: the scan then fails with ``AttributeError: '_lib_fn_wrapper' object has no attribute
'get'``. Making that wrapper answer dunder names normally fixes the scan and changes nothing for
llvmlite, which never looks up dunder names through it.
"""

from __future__ import annotations

import sys


def guard_llvmlite_for_vllm() -> None:
    """Apply the fix above if llvmlite is loaded (idempotent)."""
    ffi = sys.modules.get("llvmlite.binding.ffi")
    if ffi is None or not hasattr(ffi, "lib"):
        return
    cls = type(ffi.lib)
    if getattr(cls, "_prefixshield_guarded", False):
        return
    forward = cls.__getattr__

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return forward(self, name)

    cls.__getattr__ = __getattr__
    cls._prefixshield_guarded = True
