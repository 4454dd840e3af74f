"""A policy's whole state in one buffer, so that a kernel call from Python passes one array.

numba unboxes every array argument of a call from Python (about 150 ns each on the development
machine): a kernel with 30 state arrays pays ~4 µs before its first instruction, more than the
work of selecting one victim. A `Packed` keeps every array of a policy in one uint8
buffer, behind a header of ``(byte offset, rows, columns)`` triples (int64, one per field; a
1-D field has one column); the policy keeps numpy views of the fields for Python code, and a
kernel rebuilds all of them from the buffer at once, as one named tuple, with `views`
(unmanaged arrays over the buffer's memory, built in place by an intrinsic: no allocation, no
reference counting, and usable in kernels compiled with ``_nrt=False``), so it is called with
the buffer alone. (A numba ``StructRef`` or
jitclass holding the arrays measured slower than a few array arguments here: ~1.4-1.7 µs per
call.)

A `Record` declares a packed state once (each field's name, dtype and dimensions) and gives
both the `views` intrinsic and the `Packed` buffers of that layout. Fields are 8-byte aligned.
The arrays a kernel builds are valid while the buffer is alive (the kernel's caller holds it);
a kernel never returns one.
"""

from __future__ import annotations

from collections import namedtuple
from typing import Sequence

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.core.typing import signature
from numba.extending import intrinsic
from numba.np.arrayobj import np_cfarray
from numba.np.numpy_support import from_dtype

_ALIGN = 8
_HEADER = 3
"""int64 words of header per field: byte offset, rows, columns."""


@intrinsic
def _address(typingctx, addr):
    """``void*`` of the integer address ``addr``."""
    if not isinstance(addr, types.Integer):
        return None
    sig = types.voidptr(addr)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], cgutils.voidptr_t)

    return sig, codegen


@intrinsic
def _view(typingctx, ptr, shape, dtype):
    """C array of ``dtype`` and ``shape`` (an integer or a tuple of them) over the memory at
    ``void*`` ``ptr``, not memory-managed (no meminfo, so nothing to reference-count).

    ``numba.carray`` builds the same array, but through an overload whose compiled body
    returns an array, which numba refuses in a kernel compiled without its reference-counted
    runtime (``_nrt=False``); an intrinsic is lowered in place, so this works in both."""
    if ptr is not types.voidptr or not isinstance(dtype, (types.DType, types.NumberClass)):
        return None
    if isinstance(shape, types.Integer):
        ndim = 1
    elif isinstance(shape, types.UniTuple) and isinstance(shape.dtype, types.Integer):
        ndim = shape.count
    else:
        return None
    dt = dtype.dtype if isinstance(dtype, types.DType) else dtype.instance_type
    retty = types.Array(dt, ndim, "C")

    def codegen(context, builder, sig, args):
        return np_cfarray(context, builder, signature(retty, ptr, shape), args[:2])

    return signature(retty, ptr, shape, dtype), codegen


@intrinsic
def prefetch(typingctx, arr, index):
    """Hint the CPU to fetch the cache line of ``arr[index]`` (``0 <= index < arr.size``, 1-D)
    for reading soon: no effect on any value. For kernels whose next random accesses are known
    ahead (a key stream's hash slots), so their memory latency overlaps the current work."""
    if not (isinstance(arr, types.Array) and arr.ndim == 1 and isinstance(index, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        ary = context.make_array(sig.args[0])(context, builder, args[0])
        idx = context.cast(builder, args[1], sig.args[1], types.intp)
        ptr = builder.bitcast(builder.gep(ary.data, [idx]), cgutils.voidptr_t)
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [cgutils.voidptr_t, i32, i32, i32]),
            "llvm.prefetch.p0")
        builder.call(fn, [ptr, i32(0), i32(3), i32(1)])  # read, keep in all levels, data
        return context.get_dummy_value()

    return types.void(arr, index), codegen


@njit(cache=True, inline="always")
def at_address(addr, count, dtype):
    """The ``count`` elements of ``dtype`` at integer address ``addr`` as a 1-D C array (for
    kernels called with a buffer's ``ctypes.data`` instead of the array: a call with scalar
    arguments only skips numba's array unboxing; the caller keeps the buffer alive)."""
    return _view(_address(addr), count, dtype)


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


def views(record: type, fields: Sequence[tuple[np.dtype, int]]):
    """An intrinsic ``views(buf)`` that returns every field of a packed buffer at once, as an
    instance of the named tuple class ``record`` (one name per field, in header order), each a
    C array view of its ``(dtype, ndim)`` in ``fields`` (``ndim`` 1 or 2) in the shape the header
    gives. For a kernel to read a whole packed state with one call, its dtypes declared in one
    table (`Packed`'s ``fields`` carry the same dtypes and the shapes; a `Record` declares
    both at once). ``buf`` may also be the buffer's ``void*`` (a compiled hook's ``state``,
    `prefixshield.policies.hooks`)."""
    arrtys = [types.Array(from_dtype(np.dtype(dtype)), ndim, "C") for dtype, ndim in fields]
    if any(a.ndim not in (1, 2) for a in arrtys) or len(arrtys) != len(record._fields):
        raise ValueError("views: one field of 1 or 2 dimensions per name of the record")
    retty = types.NamedTuple(arrtys, record)
    i64 = ir.IntType(64)
    pair = types.UniTuple(types.intp, 2)

    @intrinsic
    def _views(typingctx, buf):
        if not (isinstance(buf, types.Array) and buf.dtype == types.uint8
                or buf is types.voidptr):
            return None

        def codegen(context, builder, sig, args):
            if sig.args[0] is types.voidptr:
                data = args[0]
            else:
                data = context.make_array(sig.args[0])(context, builder, args[0]).data
            base = builder.ptrtoint(data, cgutils.intp_t)
            hdr = builder.bitcast(data, i64.as_pointer())
            out = []
            for i, arrty in enumerate(arrtys):
                off, rows, cols = (builder.load(builder.gep(hdr, [i64(_HEADER * i + k)]))
                                   for k in range(_HEADER))
                ptr = builder.inttoptr(builder.add(base, off), cgutils.voidptr_t)
                if arrty.ndim == 1:
                    shapety, shape = types.intp, rows
                else:
                    shapety, shape = pair, context.make_tuple(builder, pair, [rows, cols])
                out.append(np_cfarray(context, builder, signature(arrty, types.voidptr, shapety),
                                      [ptr, shape]))
            return context.make_tuple(builder, retty, out)

        return retty(buf), codegen

    return _views


class Packed:
    """Named arrays in one uint8 buffer (see the module docstring).

    Args:
        fields: ``(name, dtype, shape)`` per field, in header order (kernels read them with
            `views`); shapes of 1 or 2 dimensions. Arrays start zeroed.
        buffer: an existing buffer of this layout to view instead (a copy's, after unpickling).

    Attributes:
        buffer: the uint8 buffer to pass to kernels.
        arrays: name -> numpy view of that field, in its shape.
        offsets: name -> byte offset of that field in ``buffer``.
    """

    def __init__(self, fields: Sequence[tuple[str, np.dtype, tuple[int, ...]]],
                 buffer: np.ndarray | None = None) -> None:
        pos = 8 * _HEADER * len(fields)
        layout = []
        for name, dtype, shape in fields:
            if len(shape) not in (1, 2):
                raise ValueError(f"packed field {name!r}: 1 or 2 dimensions, got {shape}")
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
        hdr = self.buffer[:8 * _HEADER * len(fields)].view(np.int64)
        self.arrays: dict[str, np.ndarray] = {}
        self.offsets: dict[str, int] = {}
        for i, (name, dtype, shape, off, count) in enumerate(layout):
            hdr[_HEADER * i] = off
            hdr[_HEADER * i + 1] = shape[0]
            hdr[_HEADER * i + 2] = shape[1] if len(shape) == 2 else 1
            nbytes = count * dtype.itemsize
            self.arrays[name] = self.buffer[off:off + nbytes].view(dtype).reshape(shape)
            self.offsets[name] = off


class Record:
    """A packed state declared once: each field's name, dtype and number of dimensions, from
    which come both the kernels' `views` intrinsic and the `Packed` buffers (the shapes, known
    only when a buffer is built, are given then).

    Args:
        fields: ``name=dtype`` per 1-D field, ``name=(dtype, 2)`` per 2-D one, in header
            order (the order of the keyword arguments).

    Attributes:
        names: the field names, in header order.
        fields: name -> ``(numpy dtype, ndim)``.
        views: an intrinsic ``views(buf)`` (`views`): every field of a buffer of this record as
            one named tuple of C array views, for kernels and hooks (assign it to a module
            global: numba reads it as a global, not as an attribute of this object).
    """

    def __init__(self, **fields) -> None:
        self.fields: dict[str, tuple[np.dtype, int]] = {}
        for name, spec in fields.items():
            dtype, ndim = spec if isinstance(spec, tuple) else (spec, 1)
            self.fields[name] = (np.dtype(dtype), int(ndim))
        self.names = tuple(self.fields)
        self.views = views(namedtuple("State", self.names), list(self.fields.values()))

    def pack(self, **values) -> Packed:
        """A new buffer of this record with every field's initial value.

        Args:
            values: one per field (no other names): an array (the field takes its shape and a
                copy of its contents, cast to the field's dtype) or a shape (an int for a 1-D
                field, a tuple otherwise: the field starts zeroed); its dimensions must be
                the field's.

        Returns:
            the `Packed` buffer, its fields in `names` order.

        Raises:
            ValueError: a field missing or unknown, or of other dimensions than declared.
        """
        if set(values) != set(self.names):
            raise ValueError(f"Record.pack: one value per field {self.names}, got "
                             f"{tuple(values)}")
        layout = []
        for name in self.names:
            dtype, ndim = self.fields[name]
            value = values[name]
            if isinstance(value, np.ndarray):
                shape = value.shape
            else:
                shape = (value,) if isinstance(value, (int, np.integer)) else tuple(value)
            if len(shape) != ndim:
                raise ValueError(f"Record.pack: field {name!r} has {ndim} dimension(s), "
                                 f"got shape {shape}")
            layout.append((name, dtype, shape))
        packed = Packed(layout)
        for name, value in values.items():
            if isinstance(value, np.ndarray):
                packed.arrays[name][...] = value
        return packed
