"""``random``: each request to a replica drawn uniformly, reproducibly.

Reproduces the ``random`` policy of SGLang's router (and of llm-d's random picker). The draw is
a fixed 64-bit mix of the trace seed and the request's row, not a stateful generator: the
same trace and seed route every request to the same replica on every machine, executor and
run, and a request's replica does not depend on how many were routed before it.
"""

from __future__ import annotations

from prefixshield.fleet.routers.base import Router, register_router
from prefixshield.fleet.routers.mix import mix64

RANDOM_SALT = 0x52A11D0
"""Mixed into the trace seed so that routing draws differ from the trace's own draws."""


@register_router
class Random(Router):
    """Replica ``mix64(mix64(seed ^ salt) + row) mod N``."""

    name = "random"
    reads_state = False
    reproduces = "SGLang router / llm-d random picker"

    def route(self, row, replicas):
        return mix64(mix64(self.seed ^ RANDOM_SALT) + row) % self.num_replicas
