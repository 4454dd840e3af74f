"""Compiled hooks: how a policy from another package runs in the fused engine loop.

The fused loop (`prefixshield.simulator.fused.run_loop`, one numba kernel per run) drives the
package's own policies through their kernels, which it names. A policy it does not name can
still run there at compiled speed by handing the loop six C functions, its *hooks*, one per
event, all of one C signature (`SIG`), and its whole state in one uint8 buffer
(`prefixshield.policies.kernels.packed.Packed`). Its
[`fused_arrays`][prefixshield.policies.base.Policy.fused_arrays] returns
``FusedArrays("hooks", packed=<the buffer>, hooks=Hooks(...).table())``; the loop calls each
hook by its address (`call_hook`) with the buffer's address as ``state``.

Why addresses and not numba functions: a ``cache=True`` kernel that takes jitted functions as
arguments (numba's first-class function types) is not loaded from numba's on-disk cache: the
loop would recompile in every new process. An address is an int64 like any other; the loop's
machine code does not depend on which hooks it calls, so it is cached once for every policy,
and each hook, a ``numba.cfunc(SIG, cache=True)``, is cached in its own module's cache.

The signature, ``int64 hook(void *state, void *a, void *b, int64 n, int64 group,
int64 contract, int64 prefix, float64 now)``, and what each event passes (arguments an event
does not list are NULL, -1 or 0.0; block ids are int32, content keys uint64, flags one byte
each):

* ``on_hit(blocks=a, n, group, contract, prefix, now)``: cached blocks reused by a request of
  ``group`` (``prefix``: its declared prefix id), before ``on_acquire``;
* ``on_acquire(blocks=a, n)``: the free ones among them left the free set;
* ``select_victims(out=b, n, group, now)``: write ``n`` free blocks for ``group`` into ``b``,
  in order, and drop them from the free set;
* ``on_materialize(blocks=a, hashes=b, n, group, contract, prefix, now)``: newly cached full
  blocks and their content keys;
* ``on_release(blocks=a, cached=b, n, now)``: blocks that reached ref_cnt 0, in vLLM's free
  order, and whether each still carries a hash;
* ``available(group)``: returns how many free blocks ``group`` may take now (the loop
  ignores the other hooks' return values).

These are the Python events' arguments (`prefixshield.policies.base.Policy`), minus the keyword
arguments of ``on_materialize`` and ``on_hit`` (``request_id``, ``root``, ``num_decode``),
which the hooks do not get, and ``on_request_finished``, which the loop does not call for a
hooks policy: a policy whose decisions depend on them has no compiled form here. The loop calls
the hooks where the block pool calls the Python events, in the same order and with the same
arrays, so a policy whose hooks make the decisions of its Python methods gives the same run on
every path (``Engine(..., batched=False)``, ``fused=False``, fused); that they agree is the
policy's own contract (the engine cannot see into a hook). ``select_victims`` is called only
with ``n <= available(group)``, as the pool calls it.

The state is declared once, as a `prefixshield.policies.kernels.packed.Record` (each field's
name, dtype and dimensions): its ``views`` intrinsic, assigned to a module global, rebuilds
every field from ``state`` in a hook (it takes a ``void*`` as well as the buffer), and its
``pack`` builds the buffer from the fields' initial values. In a hook, `array` turns
``a``/``b`` into numpy views (no copy). Hooks run inside the loop, which is compiled without
numba's reference-counted runtime: they must not allocate arrays, raise or return one.

What a policy writes (`HookedPolicy` does the rest): the `Record`, the hooks of the events it
follows (``on_hit`` and ``on_materialize`` default to one that does nothing),
``HOOKS = Hooks(record, on_...=...)``, and ``initial_state``, ``num_free`` and
``free_order``; ``STATS`` names the fields its ``stats`` reports. A hook is cached in its own
module's numba cache, which records the module's name: import that module under one name.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import KW_ONLY, dataclass
from typing import Any, ClassVar

import numpy as np
from llvmlite import ir
from numba import cfunc, njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from prefixshield.policies.base import FusedArrays, Policy
from prefixshield.policies.kernels.packed import Record, _view

SIG = types.int64(types.voidptr, types.voidptr, types.voidptr, types.int64, types.int64,
                  types.int64, types.int64, types.float64)
"""The one C signature of every hook: ``(state, a, b, n, group, contract, prefix, now)``."""

EVENTS = ("on_hit", "on_acquire", "select_victims", "on_materialize", "on_release",
          "available")
"""The hooks, in the order of `Hooks.table`'s addresses."""
ON_HIT, ON_ACQUIRE, SELECT_VICTIMS, ON_MATERIALIZE, ON_RELEASE, AVAILABLE = range(len(EVENTS))


def hook(fn):
    """Decorator: compile ``fn(state, a, b, n, group, contract, prefix, now)`` as a hook (a
    ``numba.cfunc`` of `SIG`, cached on disk)."""
    return cfunc(SIG, cache=True)(fn)


@hook
def _ignore(state, a, b, n, group, contract, prefix, now):
    """The default of an event a policy does not follow (`Hooks`): does nothing."""
    return 0


@dataclass(frozen=True)
class Hooks:
    """A policy's compiled form: the layout of its packed state and its six hooks (compiled
    with `hook`; see the module docstring for what each receives). The policy keeps this
    object alive while its runs can call them.

    The hooks are given by keyword, one per name of `EVENTS`; ``on_hit`` and
    ``on_materialize`` default to a hook that does nothing (shared, compiled once), for a
    policy whose decisions do not depend on them. The others have no default: every policy
    must drop the blocks a hit takes back from its free set (``on_acquire``), as it must
    choose victims, take freed blocks and count what it may give.

    Args:
        state: the `Record` of the buffer every hook receives as ``state`` (what
            [`HookedPolicy`][prefixshield.policies.hooks.HookedPolicy] builds).

    Raises:
        TypeError: ``state`` is no `Record`, or a hook no cfunc of `SIG`.
    """

    state: Record
    _: KW_ONLY
    on_hit: Any = _ignore
    on_acquire: Any
    select_victims: Any
    on_materialize: Any = _ignore
    on_release: Any
    available: Any

    def __post_init__(self) -> None:
        if not isinstance(self.state, Record):
            raise TypeError(f"Hooks.state: a packed.Record, got {self.state!r}")
        for name in EVENTS:
            f = getattr(self, name)
            if getattr(f, "_sig", None) != SIG:
                raise TypeError(f"hook {name}: a numba.cfunc of hooks.SIG (use hooks.hook), "
                                f"got {f!r}")

    def table(self) -> np.ndarray:
        """The hooks' addresses (int64, in `EVENTS` order): ``FusedArrays.hooks``."""
        return np.array([getattr(self, name).address for name in EVENTS], dtype=np.int64)


def _pointer(context, builder, ty, value):
    """``void*`` of a hook argument: an array's data, NULL for None, a ``void*`` as is."""
    if isinstance(ty, types.Array):
        return builder.bitcast(context.make_array(ty)(context, builder, value).data,
                               cgutils.voidptr_t)
    if isinstance(ty, types.NoneType):
        return cgutils.voidptr_t(None)
    return value


def _pointer_type(ty) -> bool:
    return isinstance(ty, (types.Array, types.NoneType)) or ty is types.voidptr


@intrinsic
def call_hook(typingctx, address, state, a, b, n, group, contract, prefix, now):
    """Call the hook at integer ``address`` (a `Hooks.table` entry) with `SIG`'s arguments;
    ``state``, ``a`` and ``b`` are arrays (their data is passed), ``void*`` or None (NULL).
    Returns the hook's int64. For the fused loop: the call is indirect, its machine code is
    the same whichever hook it calls (so the caller stays cacheable)."""
    ints = (address, n, group, contract, prefix)
    if not (all(isinstance(t, types.Integer) for t in ints) and isinstance(now, types.Float)
            and all(_pointer_type(t) for t in (state, a, b))):
        return None
    sig = types.int64(address, state, a, b, n, group, contract, prefix, now)

    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        fnty = ir.FunctionType(i64, [cgutils.voidptr_t] * 3 + [i64] * 4 + [ir.DoubleType()])
        fn = builder.inttoptr(context.cast(builder, args[0], signature.args[0], types.int64),
                              fnty.as_pointer())
        ptrs = [_pointer(context, builder, t, v) for t, v in zip(signature.args[1:4], args[1:4])]
        nums = [context.cast(builder, v, t, types.int64)
                for t, v in zip(signature.args[4:8], args[4:8])]
        return builder.call(fn, ptrs + nums
                            + [context.cast(builder, args[8], signature.args[8], types.float64)])

    return sig, codegen


@njit(cache=True, inline="always")
def array(ptr, n, dtype):
    """In a hook: the ``n`` elements of ``dtype`` at ``void*`` ``ptr`` (``a`` or ``b``) as a
    1-D C array view (no copy, not memory-managed; valid during the call)."""
    return _view(ptr, n, dtype)


def check_fused(packed, table) -> None:
    """Raise ``ValueError`` unless ``packed`` and ``table`` can be a hooks policy's
    ``FusedArrays.packed`` and ``.hooks``: a contiguous uint8 buffer, and one nonzero int64
    address per event (the loop calls them unchecked: a wrong address would crash the
    process, not raise)."""
    if not (isinstance(packed, np.ndarray) and packed.dtype == np.uint8 and packed.ndim == 1
            and packed.flags.c_contiguous):
        raise ValueError("a hooks policy's FusedArrays.packed is its state: a contiguous 1-D "
                         "uint8 buffer")
    if not (isinstance(table, np.ndarray) and table.dtype == np.int64
            and table.shape == (len(EVENTS),) and np.all(table != 0)):
        raise ValueError(f"a hooks policy's FusedArrays.hooks is Hooks.table(): {len(EVENTS)} "
                         "nonzero int64 addresses")


def _pointer_of(x, dtype):
    """``(array, address)`` of ``x`` as a contiguous array of ``dtype`` (the array keeps the
    memory alive during the call), or ``(None, None)`` (NULL)."""
    if x is None:
        return None, None
    x = np.ascontiguousarray(x, dtype=dtype)
    return x, x.ctypes.data


class HookedPolicy(Policy):
    """A policy whose events *are* its hooks: its Python methods call the same compiled
    functions (through ctypes) that the fused loop calls by address, so every path of the
    engine runs one implementation and they agree by construction.

    A subclass sets the class attribute ``HOOKS`` (`Hooks`, with the `Record` of its state)
    and implements `initial_state` (the value of every field), ``num_free`` and
    ``free_order``, reading its fields in ``arrays``. ``on_request_finished`` and the keyword
    arguments of ``on_hit`` and ``on_materialize`` are not hooks (the module docstring): a
    subclass that needs them has no compiled form here.

    Attributes:
        state: the packed buffer (uint8) of ``HOOKS.state``, the ``state`` every hook
            receives; built anew by every `bind_tenants` (and by the constructor, which binds
            one group, ``"default"``, and no contract, so that the policy works unbound).
        arrays: field name -> numpy view of that field of ``state``.
        STATS: class attribute, the fields `stats` reports (default none).
    """

    HOOKS: ClassVar[Hooks]
    STATS: ClassVar[tuple[str, ...]] = ()
    state: np.ndarray
    arrays: dict[str, np.ndarray]

    def __init__(self, num_blocks: int, vllm_compat: str = "current") -> None:
        super().__init__(num_blocks, vllm_compat)
        self.bind_tenants(["default"], [])

    def bind_tenants(self, groups, contracts) -> None:
        """Name the groups and contracts, then build ``state`` from `initial_state` (which
        may read ``self.groups`` and ``self.contracts``)."""
        super().bind_tenants(groups, contracts)
        packed = self.HOOKS.state.pack(**self.initial_state())
        self.state, self.arrays = packed.buffer, packed.arrays

    @abstractmethod
    def initial_state(self) -> dict:
        """Every field of ``HOOKS.state`` at the start of a run: field name -> initial array
        or shape (zeroed), as `Record.pack` takes them; called by `bind_tenants`, with
        ``num_blocks``, ``vllm_compat``, ``groups`` and ``contracts`` set."""

    def stats(self) -> dict:
        """Each field named in ``STATS``, as a (nested) list."""
        return {name: self.arrays[name].tolist() for name in self.STATS}

    def _call(self, hook, a=None, b=None, n=0, group=-1, contract=-1, prefix=-1, now=0.0):
        return int(hook.ctypes(self.state.ctypes.data, a, b, n, group, contract, prefix, now))

    def on_hit(self, blocks, group, contract, prefix_id, now, **kwargs) -> None:
        blocks, a = _pointer_of(blocks, np.int32)
        self._call(self.HOOKS.on_hit, a, None, blocks.shape[0], group, contract, prefix_id, now)

    def on_acquire(self, blocks) -> None:
        blocks, a = _pointer_of(blocks, np.int32)
        self._call(self.HOOKS.on_acquire, a, None, blocks.shape[0])

    def select_victims(self, n, now, requester) -> np.ndarray:
        out = np.empty(n, dtype=np.int32)
        self._call(self.HOOKS.select_victims, None, out.ctypes.data, n, requester, now=now)
        return out

    def on_materialize(self, blocks, hashes, group, contract, prefix_id, now, **kwargs) -> None:
        blocks, a = _pointer_of(blocks, np.int32)
        hashes, b = _pointer_of(hashes, np.uint64)
        self._call(self.HOOKS.on_materialize, a, b, blocks.shape[0], group, contract, prefix_id,
                   now)

    def on_release(self, blocks, cached, now) -> None:
        blocks, a = _pointer_of(blocks, np.int32)
        cached, b = _pointer_of(cached, np.bool_)
        self._call(self.HOOKS.on_release, a, b, blocks.shape[0], now=now)

    def available(self, requester: int) -> int:
        return self._call(self.HOOKS.available, group=requester)

    def fused_arrays(self) -> FusedArrays:
        """The loop's ``hooks`` kernels: ``HOOKS``' addresses over ``state``."""
        return FusedArrays("hooks", packed=self.state, hooks=self.HOOKS.table())
