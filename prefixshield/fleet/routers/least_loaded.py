"""``least_loaded``: the replica with the fewest requests (waiting + running).

Reproduces join-the-shortest-queue with exact queue lengths: what Ray Serve's Power of Two
Choices router and SGLang's ``power_of_two`` approximate by sampling two replicas (here every
replica is compared, so it is the limit those converge to), and the vLLM production stack's
least-QPS choice when a request has no session. Ties go to the first tied replica after the
previous choice, cyclically (so equal replicas take turns). Reads replica state: lockstep.
"""

from __future__ import annotations

from prefixshield.fleet.routers.base import Router, least, register_router


@register_router
class LeastLoaded(Router):
    """argmin over replicas of ``num_requests()``."""

    name = "least_loaded"
    reads_state = True
    reproduces = "Ray Serve Power of Two Choices / SGLang power_of_two (exact, all replicas)"

    def __init__(self, config, num_replicas, requests, seed):
        super().__init__(config, num_replicas, requests, seed)
        self._last = -1

    def route(self, row, replicas):
        self._last = least([r.num_requests() for r in replicas], self._last + 1)
        return self._last
