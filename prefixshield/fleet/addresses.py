"""Argument tuples by address, so that one kernel can drive many engines' fused loops.

A fleet's compiled lockstep loop (`prefixshield.fleet.fused`) calls
`prefixshield.simulator.fused.run_loop` for each replica, each with its own eleven tuples of
arrays (about ninety arrays). Passing every replica's tuples to the kernel as one tuple of
tuples makes the kernel's type depend on the number of replicas (a compile per fleet size, and
about 45 s of compile at 16 replicas, measured), and indexing it with a variable replica copies
the whole tuple. Instead each replica's arrays are written once as a row of addresses and
shapes (`address_row`), and a kernel rebuilds the tuples of replica ``r`` from its row with
`views_like` -- unmanaged C arrays over the same memory (no allocation, no reference counting,
so it works in kernels compiled with ``_nrt=False``), built in place by an intrinsic, in the
type of a prototype tuple (the first replica's): one compiled loop for every fleet size.

The arrays a kernel builds are valid while the arrays the rows were taken from are alive: the
caller holds them (and rewrites a row when it replaces one of them, e.g. a grown buffer).
Every array must be C-contiguous.
"""

from __future__ import annotations

import numpy as np
from numba import types
from numba.core import cgutils
from numba.core.typing import signature
from numba.extending import intrinsic
from numba.np.arrayobj import np_cfarray

WORDS = 4
"""int64 words per array in a row: address, then up to three dimensions."""


def _flat(value) -> list[np.ndarray]:
    """The arrays of a nested tuple, depth first."""
    if isinstance(value, np.ndarray):
        return [value]
    out: list[np.ndarray] = []
    for item in value:
        out.extend(_flat(item))
    return out


def address_row(value) -> np.ndarray:
    """The row (int64, `WORDS` per array) of the arrays of the nested tuple ``value``, in
    the order `views_like` reads them. Raises ``ValueError`` for an array that is not
    C-contiguous or has more than three dimensions."""
    arrays = _flat(value)
    row = np.zeros(WORDS * len(arrays), dtype=np.int64)
    for j, a in enumerate(arrays):
        if not a.flags.c_contiguous or a.ndim > WORDS - 1:
            raise ValueError(f"array {j} of the tuple: C-contiguous, 1 to {WORDS - 1} "
                             f"dimensions, got {a.ndim} dimensions, strides {a.strides}")
        row[WORDS * j] = a.ctypes.data
        row[WORDS * j + 1:WORDS * j + 1 + a.ndim] = a.shape
    return row


def _array_types(ty) -> list[types.Array]:
    if isinstance(ty, types.Array):
        return [ty]
    if isinstance(ty, types.BaseTuple):
        out: list[types.Array] = []
        for t in ty.types:
            out.extend(_array_types(t))
        return out
    raise TypeError(f"views_like: a nested tuple of arrays, got {ty}")


def _mutable(ty):
    """``ty`` with every array a mutable C array of its dtype and dimensions."""
    if isinstance(ty, types.Array):
        return types.Array(ty.dtype, ty.ndim, "C")
    return types.BaseTuple.from_types([_mutable(t) for t in ty.types])


@intrinsic
def views_like(typingctx, proto, row):
    """``views_like(proto, row)``: a tuple of the structure of ``proto`` (nested tuples of
    arrays) whose arrays are C views of the memory and shapes in ``row`` (an int64 array
    made by `address_row` of a tuple of that structure). ``proto`` is read for its type
    only."""
    if not (isinstance(row, types.Array) and row.dtype == types.int64 and row.ndim == 1):
        return None
    try:
        arrtys = _array_types(proto)
    except TypeError:
        return None
    if any(a.ndim > WORDS - 1 for a in arrtys):
        return None
    retty = _mutable(proto)
    word = cgutils.intp_t

    def codegen(context, builder, sig, args):
        ary = context.make_array(sig.args[1])(context, builder, args[1])
        base = builder.bitcast(ary.data, word.as_pointer())
        built = []
        for j, arrty in enumerate(arrtys):
            mut = types.Array(arrty.dtype, arrty.ndim, "C")
            words = [builder.load(builder.gep(base, [word(WORDS * j + k)]))
                     for k in range(arrty.ndim + 1)]
            ptr = builder.inttoptr(words[0], cgutils.voidptr_t)
            if arrty.ndim == 1:
                shapety, shape = types.intp, words[1]
            else:
                shapety = types.UniTuple(types.intp, arrty.ndim)
                shape = context.make_tuple(builder, shapety, words[1:])
            built.append(np_cfarray(context, builder, signature(mut, types.voidptr, shapety),
                                    [ptr, shape]))
        pos = iter(built)

        def assemble(ty):
            if isinstance(ty, types.Array):
                return next(pos)
            return context.make_tuple(builder, ty, [assemble(t) for t in ty.types])

        return assemble(retty)

    return retty(proto, row), codegen
