"""``session``: a consistent hash of the request's session key picks its replica.

Reproduces the vLLM production stack's ``SessionRouter`` (a ``uhashring`` hash ring over the
endpoints, keyed by the session-id header) and SGLang's / the vLLM router's
``consistent_hash`` policy. The trace schema has no session column, so the key is
``session_key``: ``prefix`` hashes the request's group and ``prefix_id`` (in conversation
traces, the conversation; in generated ones, the logical prefix a client keeps), ``group``
hashes the tenant alone (the ``X-Tenant-ID`` fallback). Simplifications: no fallback to a
load-based choice for requests without a key (every request has one here), and the ring has
`VIRTUAL_NODES` points per replica with a fixed 64-bit mix instead of ``uhashring``'s
MD5 ketama points (the same replica for a key whatever the executor; which replica differs
from ``uhashring``'s).
"""

from __future__ import annotations

import hashlib

import numpy as np

from prefixshield.fleet.routers.base import Router, register_router
from prefixshield.fleet.routers.mix import mix64

VIRTUAL_NODES = 64
"""Points per replica on the ring (more: a more even share of keys per replica)."""


def _name_hash(name: str) -> int:
    """A stable 64-bit hash of a group name (blake2b; Python's ``hash`` is salted)."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")


def ring(num_replicas: int) -> tuple[np.ndarray, np.ndarray]:
    """The hash ring of ``num_replicas`` replicas: its points (sorted uint64) and the replica
    owning each (int64), `VIRTUAL_NODES` points per replica."""
    points = sorted((mix64((r << 32) + v), r) for r in range(num_replicas)
                    for v in range(VIRTUAL_NODES))
    return (np.array([p for p, _ in points], dtype=np.uint64),
            np.array([r for _, r in points], dtype=np.int64))


def routing_key(group: str, prefix_id: int, session_key: str = "prefix") -> int:
    """The 64-bit key of a request of ``group`` with ``prefix_id`` under ``session_key``
    (``prefix`` or ``group``, see `RouterConfig`)."""
    g = _name_hash(group)
    if session_key == "group":
        return mix64(g)
    return mix64(g ^ mix64(int(prefix_id) & ((1 << 64) - 1)))


def replica_of(points: np.ndarray, owners: np.ndarray, key: int) -> int:
    """The replica owning ``key``: the first ring point at or after it, cyclically."""
    i = int(np.searchsorted(points, np.uint64(key), side="left"))
    return int(owners[i % len(owners)])


def session_replica(group: str, prefix_id: int, num_replicas: int,
                    session_key: str = "prefix") -> int:
    """The replica the ``session`` router sends such a request to in a fleet of
    ``num_replicas``: what anyone who knows the ring (the endpoint list and the hash) can
    compute, e.g. an attacker aiming at a victim's replica."""
    points, owners = ring(num_replicas)
    return replica_of(points, owners, routing_key(group, prefix_id, session_key))


@register_router
class Session(Router):
    """The first ring point at or after ``mix64(key)`` (cyclically) names the replica."""

    name = "session"
    reads_state = False
    reproduces = "vLLM production stack SessionRouter / SGLang consistent_hash"

    def __init__(self, config, num_replicas, requests, seed):
        super().__init__(config, num_replicas, requests, seed)
        self._points, self._owners = ring(num_replicas)
        self._group_hash = [_name_hash(g) for g in requests.groups]

    def key(self, row: int) -> int:
        """The request's 64-bit routing key (`routing_key`)."""
        g = self._group_hash[int(self.requests.group_id[row])]
        if self.config.session_key == "group":
            return mix64(g)
        return mix64(g ^ mix64(int(self.requests.prefix_id[row]) & ((1 << 64) - 1)))

    def route(self, row, replicas):
        return replica_of(self._points, self._owners, self.key(row))
