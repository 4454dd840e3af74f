"""The executable specification of ``fifo``: the same decisions, one block at a time."""

from __future__ import annotations

import numpy as np

from prefixshield.policies.base import Policy


class ReferenceFIFO(Policy):
    """Free blocks as a dict ``block -> cached``; victims are the smallest ``(cached, born,
    block)``: truly free first (by id), then the oldest content."""

    name = "reference_fifo"

    def __init__(self, num_blocks: int, vllm_compat: str = "current") -> None:
        super().__init__(num_blocks, vllm_compat)
        self.born = [0] * self.num_blocks
        self.clock = 0
        self.free_blocks = {b: False for b in range(1, self.num_blocks)}

    def on_release(self, blocks, cached, now) -> None:
        for b, c in zip(blocks, cached):
            self.free_blocks[int(b)] = bool(c)

    def on_acquire(self, blocks) -> None:
        for b in blocks:
            del self.free_blocks[int(b)]

    def on_materialize(self, blocks, hashes, group, contract, prefix_id, now, **kwargs) -> None:
        for b in blocks:
            self.born[int(b)] = self.clock
            self.clock += 1

    def select_victims(self, n, now, requester) -> np.ndarray:
        victims = self.free_order()[:n]
        for b in victims:
            del self.free_blocks[int(b)]
        return victims

    def num_free(self) -> int:
        return len(self.free_blocks)

    def free_order(self) -> np.ndarray:
        def key(b):
            cached = self.free_blocks[b]
            return (cached, self.born[b] if cached else 0, b)

        return np.array(sorted(self.free_blocks, key=key), dtype=np.int32)
