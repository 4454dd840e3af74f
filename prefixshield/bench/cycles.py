"""The processor's cycle counter inside numba kernels, for timing a few hundred nanoseconds of
kernel code without a Python call around it.

``cycle_count()`` is LLVM's ``llvm.readcyclecounter`` (``rdtsc`` on x86-64, ``cntvct`` on
arm64): a monotonically increasing count, not serializing, so a reading may move a few
instructions either way -- a bias of tens of cycles on a single short reading, none on a
mean over many. Its unit is converted to nanoseconds by the caller, with the wall time of
the same kernel call (`ns_per_count`), so no frequency is assumed.
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic


@intrinsic
def _readcyclecounter(typingctx):
    sig = types.uint64()

    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(ir.IntType(64), [])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.readcyclecounter")
        return builder.call(fn, [])

    return sig, codegen


@njit(cache=True, inline="always")
def cycle_count():
    """The cycle counter now (uint64, counts; a kernel-side clock, see the module docstring)."""
    return _readcyclecounter()


def ns_per_count(wall_ns: float, counts: int) -> float:
    """Nanoseconds per counter unit: ``wall_ns`` of a kernel call over the ``counts`` the
    counter advanced across the same work. Raises ``RuntimeError`` if the counter did not move
    (a platform whose LLVM lowers the intrinsic to a constant 0)."""
    if counts <= 0:
        raise RuntimeError("llvm.readcyclecounter did not advance on this machine; in-kernel "
                           "timing is not available")
    return wall_ns / counts
