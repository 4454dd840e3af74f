"""The replacement-policy interface and the one registry of policies.

A policy owns the *order of free blocks* (cached or truly free); the block pool owns reference
counts, the hash map and ownership, and asks the policy only which free blocks to reuse next.
The same instance works under the pure cache driver, the SimPy engine and the live vLLM adapter.

Units: block ids are ints in ``[1, num_blocks)`` (block 0 is vLLM's null block and never free);
group and contract ids are small non-negative ints; ``now`` is seconds on the accounting clock.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Sequence

import numpy as np

from prefixshield.lazyregistry import LazyRegistry
from prefixshield.tenancy import Contract

COMPAT_MODES = ("0.10", "current")
"""vLLM free-queue semantics: ``"0.10"`` appends every freed block to the tail; ``"current"``
puts freed blocks that carry no hash at the head (they are reused first)."""


@dataclass
class FusedArrays:
    """A policy's state as the fused engine loop (`prefixshield.simulator.fused.run_loop`)
    drives it: which of the loop's kernel sets runs its events, and the arrays those kernels
    update in place (the policy's own; nothing is copied). Fields a kernel set does not read
    stay empty.

    Attributes:
        kernels: the kernel set, a key of `prefixshield.simulator.fused.KERNELS` (``"lru"``:
            one linked list in vLLM's free order; ``"prefixshield"``: the packed state;
            ``"static_quota"``; ``"s3fifo"``; ``"hooks"``: the policy's own compiled hooks,
            `prefixshield.policies.hooks`, for a policy of any class).
        lists: ``(prev, nxt, member, length)`` of the policy's linked lists.
        packed: PrefixShield's packed state buffer (uint8), or a hooks policy's whole state
            (the ``state`` its hooks receive).
        hooks: a hooks policy's six hook addresses (int64,
            [`Hooks.table`][prefixshield.policies.hooks.Hooks.table]).
        debt_log: PrefixShield's debt log (its columns are appended to in place; the loop's
            counters are written back to it).
        quota: StaticQuota's per-group quota (blocks).
        quota_state: StaticQuota's ``(owner, occupancy)``.
        s3_state: S3-FIFO's ``(freq, in_use, key, cnt, params, gkeys, gtab, gpos)``.
        ghost_slack: S3-FIFO's ghost slack going in (the loop's value comes back through
            [`Policy.fused_done`][prefixshield.policies.base.Policy.fused_done]).
    """

    kernels: str
    lists: tuple = ()
    packed: np.ndarray | None = None
    debt_log: Any = None
    quota: int = 0
    quota_state: tuple = ()
    s3_state: tuple = ()
    ghost_slack: int = 0
    hooks: np.ndarray | None = None


class Policy(ABC):
    """Contract between the block pool and a replacement policy.

    Before anything else the driver calls `bind_tenants` once, naming the groups and
    contracts whose ids later calls use. Then the pool calls, in vLLM's order:

    * `on_release` when blocks reach ref_cnt 0 (they become free candidates);
    * `on_acquire` when free cached blocks are taken back into use by a prefix hit;
    * `select_victims` when a request needs ``n`` new blocks; the returned blocks leave the
      policy's free set and the pool drops the hash of each cached one (an eviction);
    * `on_materialize` when a request caches newly computed full blocks;
    * `on_hit` when a request reuses cached blocks (in use or free);
    * `on_request_finished` when a request has ended.

    Invariant kept by every policy: the set of blocks it holds as free is exactly the set of
    non-null blocks with ref_cnt 0, and `num_free` is its size.
    """

    name: ClassVar[str]

    def __init__(self, num_blocks: int, vllm_compat: str = "current") -> None:
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be >= 2 (block 0 is the null block), got {num_blocks}")
        if vllm_compat not in COMPAT_MODES:
            raise ValueError(f"vllm_compat must be one of {COMPAT_MODES}, got {vllm_compat!r}")
        self.num_blocks = int(num_blocks)
        self.vllm_compat = vllm_compat
        self.groups: tuple[str, ...] = ()
        self.contracts: tuple[Contract, ...] = ()

    def bind_tenants(self, groups: Sequence[str], contracts: Sequence[Contract]) -> None:
        """Name the accounting groups and contracts: id i of a later call is ``groups[i]`` /
        ``contracts[i]``. Called once, before any block is allocated."""
        self.groups = tuple(groups)
        self.contracts = tuple(contracts)

    @abstractmethod
    def on_release(self, blocks: np.ndarray, cached: np.ndarray, now: float) -> None:
        """``blocks`` (int32, in vLLM's free order) reached ref_cnt 0; ``cached[i]`` says block i
        still carries a hash (a reclamation candidate) rather than being truly free."""

    @abstractmethod
    def on_acquire(self, blocks: np.ndarray) -> None:
        """Free cached ``blocks`` were taken back into use by a hit; they leave the free set."""

    @abstractmethod
    def select_victims(self, n: int, now: float, requester: int) -> np.ndarray:
        """Remove and return ``n`` free blocks (int32) for ``requester`` to reuse, in order.

        The caller guarantees ``n <= available(requester)``."""

    def on_materialize(self, blocks: np.ndarray, hashes: np.ndarray, group: int, contract: int,
                       prefix_id: int, now: float, *, request_id: int = -1, root=None,
                       num_decode: int = 0) -> None:
        """``blocks`` are newly computed full blocks of one request of ``group``, now cached under
        content keys ``hashes`` (uint64; the same content always has the same key, so a policy
        with a ghost history can recognise returning content in a different block).

        Keyword arguments (a request is usually materialized over several calls: prefill chunks,
        decode blocks as they fill): ``request_id`` names the request (ints, unique among
        running requests; -1: unknown, the call stands alone), ``root`` is the content key
        (uint64) of the request's first full block (None: unknown), ``num_decode`` says how
        many of the last ``blocks`` hold output tokens (decode blocks)."""

    def on_hit(self, blocks: np.ndarray, group: int, contract: int, prefix_id: int,
               now: float, *, root=None) -> None:
        """``blocks`` are cached blocks reused by a request of ``group`` (before on_acquire);
        ``root`` as in [`on_materialize`][prefixshield.policies.base.Policy.on_materialize]."""

    def on_request_finished(self, request_id: int) -> None:
        """Request ``request_id`` (as passed to `on_materialize`) ended; it will not
        materialize again (a preempted request has not ended)."""

    @abstractmethod
    def num_free(self) -> int:
        """Number of free blocks the policy holds (vLLM's ``get_num_free_blocks``)."""

    def available(self, requester: int) -> int:
        """Free blocks ``requester`` may take now; quota policies cap it. Default: all free."""
        return self.num_free()

    @classmethod
    def group_capacity(cls, num_blocks: int, num_groups: int) -> int:
        """The most blocks one group may hold in a pool of ``num_blocks`` configured blocks
        shared by ``num_groups`` groups, with nothing else running: a request needing more
        can never be admitted. Default: every usable block (``num_blocks - 1``); a policy that
        caps a group (a quota) overrides this and `pool_for`."""
        return int(num_blocks) - 1

    @classmethod
    def pool_for(cls, need_blocks: int, num_groups: int) -> int:
        """The smallest configured pool in which one group of ``num_groups`` may hold
        ``need_blocks`` blocks (the inverse of `group_capacity`)."""
        return max(2, int(need_blocks) + 1)

    @abstractmethod
    def free_order(self) -> np.ndarray:
        """The free blocks in the order they would be reused (for tests and the live adapter)."""

    def stats(self) -> dict:
        """Policy-specific counters (occupancy per class, debt, promotions, ...), JSON-able."""
        return {}

    def check_invariants(self) -> None:
        """Raise ``AssertionError`` naming the first broken policy invariant. The pool's own
        invariants are checked by the pool; this hook is for what only the policy knows."""

    def fused_arrays(self) -> FusedArrays | None:
        """The state the fused engine loop runs this policy's events on (`FusedArrays`), or
        None: the policy has no compiled form there and its runs take the per-step path.
        Default: None. The engine takes the package's kernel sets only from an exactly
        registered class (a subclass may change an event the kernels would not see), and
        ``"hooks"`` (`prefixshield.policies.hooks`) from any class: its hooks are its events."""
        return None

    def fused_done(self, ghost_slack: int) -> None:
        """After a fused loop call: the scalar state the loop kept for the policy (S3-FIFO's
        ghost slack). Default: nothing to keep."""


PolicyFactory = Callable[..., Policy]

POLICY_MODULES: dict[str, str] = {
    "lru": "prefixshield.policies.lru",
    "prefixshield": "prefixshield.policies.prefixshield",
    "s3fifo": "prefixshield.policies.s3fifo",
    "static_quota": "prefixshield.policies.static_quota",
}
"""The one list of policies: name -> the module whose class registers itself under that name
(`register_policy`). A module is imported the first time its policy is looked up, so a run
of one policy does not build the numba dispatchers of the others at start-up."""

POLICIES = LazyRegistry("policy", POLICY_MODULES, group="prefixshield.policies")
"""The registry: policy name -> class, a read-only mapping (a policy's module is imported on the
first look-up of its name); each class adds itself with `register_policy`. Other installed
packages add policies in the entry-point group ``prefixshield.policies`` (see
[`prefixshield.lazyregistry`][prefixshield.lazyregistry])."""


def register_policy(cls: type[Policy]) -> type[Policy]:
    """Class decorator: add ``cls`` to `POLICIES` under ``cls.name``."""
    POLICIES.register(cls.name, cls)
    return cls


def make_policy(name: str, num_blocks: int, vllm_compat: str = "current", **params) -> Policy:
    """Build the registered policy ``name`` (importing its module on first use); unknown names
    raise ``KeyError`` listing the known."""
    try:
        cls = POLICIES[name]
    except KeyError:
        raise KeyError(f"unknown policy {name!r}; known: {', '.join(sorted(POLICIES))}") from None
    try:
        return cls(num_blocks, vllm_compat=vllm_compat, **params)
    except ValueError as e:
        raise ValueError(f"policy {name}: {e}") from None
