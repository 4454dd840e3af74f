"""``fifo``: first cached, first evicted. Truly free blocks are reused first (lowest id first);
then the free cached block whose content was computed longest ago, however often it was hit."""

from __future__ import annotations

import numpy as np

from prefixshield.policies.base import Policy


class FIFOPolicy(Policy):
    name = "fifo"

    def __init__(self, num_blocks: int, vllm_compat: str = "current") -> None:
        super().__init__(num_blocks, vllm_compat)
        self.free = np.ones(self.num_blocks, dtype=bool)   # ref_cnt 0 (block 0: never)
        self.free[0] = False
        self.cached = np.zeros(self.num_blocks, dtype=bool)  # still carries a hash
        self.born = np.zeros(self.num_blocks, dtype=np.int64)  # order its content was computed
        self.clock = 0

    def on_release(self, blocks, cached, now) -> None:
        self.free[blocks] = True
        self.cached[blocks] = cached

    def on_acquire(self, blocks) -> None:
        self.free[blocks] = False

    def on_materialize(self, blocks, hashes, group, contract, prefix_id, now, **kwargs) -> None:
        self.born[blocks] = self.clock + np.arange(len(blocks))
        self.clock += len(blocks)

    def select_victims(self, n, now, requester) -> np.ndarray:
        victims = self.free_order()[:n]
        self.free[victims] = False
        self.cached[victims] = False
        return victims

    def num_free(self) -> int:
        return int(np.count_nonzero(self.free))

    def free_order(self) -> np.ndarray:
        ids = np.flatnonzero(self.free)
        cached = self.cached[ids]
        age = np.where(cached, self.born[ids], 0)
        order = np.lexsort((ids, age, cached))  # sorted by cached, then age, then id
        return ids[order].astype(np.int32)
