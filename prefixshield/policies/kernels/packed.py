"""A policy's whole state in one buffer, so that a kernel call from Python passes one array.

numba unboxes every array argument of a call from Python (about 150 ns each on the development
machine): a kernel with 30 state arrays pays ~4 µs before its first instruction, more than the
work of selecting one victim. A :class:`Packed` keeps every array of a policy in one uint8
buffer, behind a header of ``(byte offset, element count)`` pairs (int64, one pair per field);
the policy keeps numpy views of the fields for Python code, and a kernel rebuilds its arrays
from the buffer with :func:`field` (a ``carray`` over the buffer's memory: no allocation, no
reference counting), so it is called with the buffer alone. (A numba ``StructRef`` or jitclass
holding the arrays measured slower than a few array arguments here: ~1.4-1.7 µs per call.)

Fields are 8-byte aligned. The arrays a kernel builds are valid while the buffer is alive (the
kernel's caller holds it); a kernel never returns one.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic
from numba.np.numpy_support import carray

_ALIGN = 8


@intrinsic
def _byte_address(typingctx, arr, offset):
    """``void*`` to byte ``offset`` of ``arr``'s data."""
    if not isinstance(arr, types.Array) or not isinstance(offset, types.Integer):
        return None
    sig = types.voidptr(arr, offset)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        base = builder.ptrtoint(ary.data, cgutils.intp_t)
        off = context.cast(builder, args[1], signature.args[1], types.intp)
        return builder.inttoptr(builder.add(base, off), cgutils.voidptr_t)

    return sig, codegen


@intrinsic
def _address(typingctx, addr):
    """``void*`` of the integer address ``addr``."""
    if not isinstance(addr, types.Integer):
        return None
    sig = types.voidptr(addr)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], cgutils.voidptr_t)

    return sig, codegen


@njit(cache=True, inline="always")
def at_address(addr, count, dtype):
    """The ``count`` elements of ``dtype`` at integer address ``addr`` as a 1-D C array (for
    kernels called with a buffer's ``ctypes.data`` instead of the array: a call with scalar
    arguments only skips numba's array unboxing; the caller keeps the buffer alive)."""
    return carray(_address(addr), count, dtype)


def entry_point(dispatcher, *args):
    """The compiled entry of ``dispatcher`` for the types of ``args`` (compiled, or loaded from
    numba's cache, by calling it with ``args`` once): a Python-callable that unboxes its
    arguments for that one signature and skips the dispatcher's type resolution (~0.3 µs a call
    here). Falls back to the dispatcher itself where numba does not expose it."""
    dispatcher(*args)
    try:
        return dispatcher.overloads[tuple(dispatcher.typeof_pyval(a) for a in args)].entry_point
    except (AttributeError, KeyError):  # pragma: no cover - other numba versions
        return dispatcher


@njit(cache=True, inline="always")
def field(buf, i, dtype):
    """Field ``i`` of the packed buffer ``buf`` as a 1-D C array of ``dtype`` (a view)."""
    hdr = carray(_byte_address(buf, 0), 2 * (i + 1), np.int64)
    return carray(_byte_address(buf, hdr[2 * i]), hdr[2 * i + 1], dtype)


class Packed:
    """Named arrays in one uint8 buffer (see the module docstring).

    Args:
        fields: ``(name, dtype, shape)`` per field, in header order (field ``i`` is read by
            ``field(buf, i, dtype)`` in kernels). Arrays start zeroed.
        buffer: an existing buffer of this layout to view instead (a copy's, after unpickling).

    Attributes:
        buffer: the uint8 buffer to pass to kernels.
        arrays: name -> numpy view of that field, in its shape.
        offsets: name -> byte offset of that field in ``buffer``.
    """

    def __init__(self, fields: Sequence[tuple[str, np.dtype, tuple[int, ...]]],
                 buffer: np.ndarray | None = None) -> None:
        pos = 16 * len(fields)
        layout = []
        for name, dtype, shape in fields:
            dtype = np.dtype(dtype)
            count = int(np.prod(shape, dtype=np.int64))
            pos = -(-pos // _ALIGN) * _ALIGN
            layout.append((name, dtype, tuple(shape), pos, count))
            pos += count * dtype.itemsize
        size = -(-pos // _ALIGN) * _ALIGN
        if buffer is None:
            buffer = np.zeros(size, dtype=np.uint8)
        elif buffer.dtype != np.uint8 or buffer.shape != (size,) or not buffer.flags.c_contiguous:
            raise ValueError(f"a packed buffer of this layout is {size} contiguous bytes")
        self.buffer = buffer
        hdr = self.buffer[:16 * len(fields)].view(np.int64)
        self.arrays: dict[str, np.ndarray] = {}
        self.offsets: dict[str, int] = {}
        for i, (name, dtype, shape, off, count) in enumerate(layout):
            hdr[2 * i] = off
            hdr[2 * i + 1] = count
            nbytes = count * dtype.itemsize
            self.arrays[name] = self.buffer[off:off + nbytes].view(dtype).reshape(shape)
            self.offsets[name] = off
