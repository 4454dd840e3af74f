"""``round_robin``: request k (in arrival order) goes to replica ``k mod N``.

Reproduces the round-robin policy of the vLLM production stack's router
(``RoundRobinRouter``), SGLang's router and Ray Serve's simplest balancing: no state read,
so the fleet splits the trace and runs the replicas independently.
"""

from __future__ import annotations

from prefixshield.fleet.routers.base import Router, register_router


@register_router
class RoundRobin(Router):
    """Replica ``row mod N`` for trace row ``row`` (rows are in arrival order)."""

    name = "round_robin"
    reads_state = False
    reproduces = "vLLM production stack / SGLang router round-robin"

    def route(self, row, replicas):
        return row % self.num_replicas
