"""The router interface, the registry and what a router may read of the replicas.

A router is built once per fleet run and asked, at each arrival in trace order, which replica
serves that request. Routers that read no replica state (`Router.reads_state` False) may
be asked for the whole trace before any replica runs: the fleet then splits the trace and runs
the replicas independently. The others are asked in one event loop that advanced every replica
up to the arrival (`prefixshield.fleet.lockstep`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from prefixshield.lazyregistry import LazyRegistry

ROUTER_MODULES: dict[str, str] = {
    "round_robin": "prefixshield.fleet.routers.round_robin",
    "random": "prefixshield.fleet.routers.random",
    "session": "prefixshield.fleet.routers.session",
    "least_loaded": "prefixshield.fleet.routers.least_loaded",
    "prefix_affinity": "prefixshield.fleet.routers.prefix_affinity",
    "kv_aware": "prefixshield.fleet.routers.kv_aware",
}
"""Name -> module; a module is imported the first time its router is looked up."""

ROUTERS = LazyRegistry("router", ROUTER_MODULES, group="prefixshield.routers")
"""The registry: router name -> class (a `Router` subclass). Other installed packages
add routers in the entry-point group ``prefixshield.routers``."""


def register_router(cls):
    """Class decorator: add ``cls`` to `ROUTERS` under ``cls.name``."""
    ROUTERS.register(cls.name, cls)
    return cls


@dataclass(frozen=True)
class RouterConfig:
    """A router and its options (validated at the CLI edge, see `prefixshield.edges`).

    Attributes:
        name: a key of `ROUTERS`.
        imbalance: ``prefix_affinity``: the largest difference between the most and the least
            loaded replica's requests (waiting + running) under which prefix affinity decides;
            above it the least loaded replica is taken.
        match_ratio: ``prefix_affinity``: the smallest matched share of the prompt's blocks for
            the best-matching replica to win (below it the replica with the smallest tree).
        session_key: ``session``: what is hashed, ``prefix`` (the request's group and
            ``prefix_id``: the conversation in conversation traces) or ``group`` (the tenant).
    """

    name: str = "round_robin"
    imbalance: int = 8
    match_ratio: float = 0.1
    session_key: str = "prefix"


class RequestInfo:
    """What a router may know of the trace's requests (arrays by trace row): ``groups`` (names
    by id), ``group_id``,
    ``prefix_id``, ``prompt_tokens``, ``output_tokens`` (int64) and, for routers that read
    prompts, ``hashes(row)``: the request's full-block hashes of prompt then output (uint64),
    as the engine computes them (salted by tenant, so tenants never share a block), and
    ``content_hashes(row)``: the same chain without the tenant salt (what a router that reads
    the prompt's text or tokens compares: equal content gives equal hashes across tenants)."""

    def __init__(self, groups: list[str], group_id: np.ndarray, prefix_id: np.ndarray,
                 prompt_tokens: np.ndarray, output_tokens: np.ndarray, block_size: int,
                 hashes=None, content_hashes=None, flat_content=None) -> None:
        self.groups = groups
        self.group_id = group_id
        self.prefix_id = prefix_id
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.block_size = block_size
        self.hashes = hashes
        self.content_hashes = content_hashes
        self._flat_content = flat_content

    def flat_content_hashes(self) -> np.ndarray:
        """Every row's `content_hashes` in one array, row i's at the offsets of the fleet's
        hashes (`prefixshield.fleet.hashes.trace_hashes`; a compiled router reads them)."""
        if self._flat_content is None:
            raise TypeError("these requests carry no flat content hashes")
        return self._flat_content()

    def prompt_hashes(self, row: int, content: bool = False) -> np.ndarray:
        """Hashes of the request's prompt blocks that a lookup may hit: the first
        ``(prompt - 1) // block_size`` (vLLM never hits the last prompt token); the engine's
        (tenant-salted) ones, or with ``content`` the unsalted `content_hashes`."""
        of = self.content_hashes if content else self.hashes
        return of(row)[:(int(self.prompt_tokens[row]) - 1) // self.block_size]


class ReplicaView(Protocol):
    """What a state-reading router sees of one replica at an arrival (all exact)."""

    def num_requests(self) -> int:
        """Requests routed to it and not finished: waiting (routed ones included) + running."""

    def cached_prefix_blocks(self, hashes: np.ndarray) -> int:
        """Leading blocks of ``hashes`` cached in its pool now (no side effect)."""

    def pending_prefill_tokens(self) -> int:
        """Prompt tokens still to compute: waiting requests' prompts less what was cached at
        their arrival, plus running requests' uncomputed prompt tokens."""

    def held_blocks(self) -> int:
        """Block-table entries of its running requests (the KV they hold, cached or not)."""


class Router(ABC):
    """Base of every router.

    Args:
        config: the router's options.
        num_replicas: replicas behind it (>= 1).
        requests: the trace's requests as the router may read them.
        seed: the trace seed (routers that draw use it, nothing else).

    Subclasses set ``name``, ``reads_state`` and ``reproduces`` (one line: the production
    router it follows) and implement `route`.
    """

    name = ""
    reads_state = False
    reproduces = ""

    def __init__(self, config: RouterConfig, num_replicas: int, requests: RequestInfo,
                 seed: int) -> None:
        self.config = config
        self.num_replicas = num_replicas
        self.requests = requests
        self.seed = seed

    @abstractmethod
    def route(self, row: int, replicas: list[ReplicaView] | None) -> int:
        """The replica (0-based) that serves trace row ``row``; ``replicas`` is None for
        routers that read no state."""

    def assign_all(self, n: int) -> np.ndarray:
        """Replica of every row ``0..n-1`` (routers that read no state only), int64."""
        if self.reads_state:
            raise TypeError(f"router {self.name} reads replica state: it cannot route ahead")
        return np.fromiter((self.route(i, None) for i in range(n)), np.int64, n)


def make_router(config: RouterConfig, num_replicas: int, requests: RequestInfo,
                seed: int) -> Router:
    """Build ``config.name``'s router; an unknown name raises ``KeyError`` (the CLI checks
    names first)."""
    return ROUTERS[config.name](config, num_replicas, requests, seed)


def least(values: list, start: int = 0) -> int:
    """Index of the smallest value; ties go to the first at or after ``start`` cyclically (so
    that ties rotate instead of piling on replica 0)."""
    n = len(values)
    best = start % n
    for j in range(1, n):
        i = (start + j) % n
        if values[i] < values[best]:
            best = i
    return best
