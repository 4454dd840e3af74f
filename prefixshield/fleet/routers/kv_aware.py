"""``kv_aware``: exact knowledge of every replica's cached blocks; least estimated work first.

Reproduces the KV-event routers (NVIDIA Dynamo's KV router, Ray Serve's KV-event router, the
vLLM production stack's KV-aware routing, llm-d's precise prefix-cache scorer with its load
scorer): the engines publish block-stored / block-removed events, so the router knows exactly
which leading blocks of the prompt each replica holds, and scores a replica by the work a
request would add there. Here the cost of replica r, in blocks, is

    (pending prefill tokens of r + this prompt's tokens r has not cached) / block_size
    + blocks held by r's running requests

-- Dynamo's "potential prefill blocks + active decode blocks" with an overlap weight of 1 --
and the least cost wins (ties: fewer requests, then the next replica in turn).
Simplifications: the router reads the pools directly at the arrival (no event delay, no
events lost), and the pending prefill of waiting requests is their prompt less what was
cached when each arrived. Reads replica state: lockstep.
"""

from __future__ import annotations

from prefixshield.fleet.routers.base import Router, least, register_router


@register_router
class KVAware(Router):
    """argmin over replicas of (pending + new prefill tokens) / B + held blocks."""

    name = "kv_aware"
    reads_state = True
    reproduces = "Dynamo KV router / Ray Serve KV-event router / llm-d precise prefix scorer"

    def __init__(self, config, num_replicas, requests, seed):
        super().__init__(config, num_replicas, requests, seed)
        self._last = -1

    def route(self, row, replicas):
        B = self.requests.block_size
        hashes = self.requests.prompt_hashes(row)
        prompt = int(self.requests.prompt_tokens[row])
        costs = []
        for r in replicas:
            new = prompt - r.cached_prefix_blocks(hashes) * B
            costs.append(((r.pending_prefill_tokens() + new) / B + r.held_blocks(),
                          r.num_requests()))
        self._last = least(costs, self._last + 1)
        return self._last
