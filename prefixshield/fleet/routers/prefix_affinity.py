"""``prefix_affinity``: a router-side prefix tree per replica, behind a load-imbalance check.

Reproduces Ray Serve LLM's ``PrefixCacheAffinityRouter`` (and the shape of SGLang's
``cache_aware`` router, which has the same two stages):

1. Load check: if the most and least loaded replicas differ by more than ``imbalance``
   requests (waiting + running), the least loaded replica is taken (Ray: Power of Two Choices).
2. Otherwise the replica whose tree matches the longest leading run of the prompt's blocks wins
   if its match is at least ``match_ratio`` of the prompt's blocks (Ray's 10%); ties go to the
   less loaded. Below that, the replica with the smallest tree (Ray: the lowest prefix-cache
   utilisation) is taken.

The request's prompt blocks then enter the chosen replica's tree. The tree is the router's
*belief*, not the cache: it never learns of evictions. It holds the prompt's content: Ray's
and SGLang's trees hold the prompt's characters or tokens and know nothing of the engine's
tenant salt (vLLM's ``cache_salt``), so equal leading text matches whichever tenant sent it,
even where the engine will not let the two tenants share a block. Simplifications: the tree
holds chained block hashes of the content (unsalted; a set of chained hashes is a tree) where
Ray's and SGLang's hold characters or tokens; it is unbounded (Ray and SGLang evict their
trees by LRU past a size, which a trace of this simulator's length rarely reaches); the load
check compares exact request counts, not sampled queue lengths. Reads replica state (loads):
lockstep.
"""

from __future__ import annotations

from prefixshield.fleet.routers.base import Router, least, register_router


@register_router
class PrefixAffinity(Router):
    """Load check, then the longest tree match above ``match_ratio``, else the smallest tree."""

    name = "prefix_affinity"
    reads_state = True
    reproduces = "Ray Serve PrefixCacheAffinityRouter / SGLang cache_aware"

    def __init__(self, config, num_replicas, requests, seed):
        super().__init__(config, num_replicas, requests, seed)
        self._trees: list[set[int]] = [set() for _ in range(num_replicas)]
        self._last = -1

    def _match(self, tree: set[int], hashes: list[int]) -> int:
        k = 0
        for h in hashes:
            if h not in tree:
                break
            k += 1
        return k

    def route(self, row, replicas):
        loads = [r.num_requests() for r in replicas]
        hashes = self.requests.prompt_hashes(row, content=True).tolist()
        start = self._last + 1
        if max(loads) - min(loads) > self.config.imbalance or not hashes:
            choice = least(loads, start)
        else:
            matches = [self._match(t, hashes) for t in self._trees]
            best = max(matches)
            if best > 0 and best >= self.config.match_ratio * len(hashes):
                # the longest match; among equals the least loaded
                choice = least([(-m, load) for m, load in zip(matches, loads)], start)
            else:
                choice = least([(len(t), load) for t, load in zip(self._trees, loads)], start)
        self._trees[choice].update(hashes)
        self._last = choice
        return choice
