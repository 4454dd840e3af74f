"""Reference LRU: vLLM's free-block queue as one OrderedDict (head = next block reused)."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from prefixshield.policies.base import Policy


class ReferenceLRU(Policy):
    """Executable spec of ``LRUPolicy``: the queue starts as ``1 .. num_blocks-1``; victims come
    from the head; freed blocks go to the tail, except that in ``"current"`` mode blocks without
    a hash go to the head, reading in the order they were freed."""

    name = "reference_lru"

    def __init__(self, num_blocks: int, vllm_compat: str = "current") -> None:
        super().__init__(num_blocks, vllm_compat)
        self.queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, self.num_blocks))

    def on_release(self, blocks, cached, now) -> None:
        """Freed blocks join the queue (see the class docstring for where)."""
        blocks, cached = [int(b) for b in blocks], [bool(c) for c in cached]
        if self.vllm_compat == "current":
            for b in reversed([b for b, c in zip(blocks, cached) if not c]):
                self.queue[b] = None
                self.queue.move_to_end(b, last=False)
            blocks = [b for b, c in zip(blocks, cached) if c]
        for b in blocks:
            self.queue[b] = None

    def on_acquire(self, blocks) -> None:
        """Hit blocks leave the queue."""
        for b in blocks:
            del self.queue[int(b)]

    def select_victims(self, n, now, requester) -> np.ndarray:
        """The ``n`` blocks at the head."""
        return np.array([self.queue.popitem(last=False)[0] for _ in range(n)], dtype=np.int32)

    def num_free(self) -> int:
        """Length of the queue."""
        return len(self.queue)

    def free_order(self) -> np.ndarray:
        """The queue, head first."""
        return np.array(list(self.queue), dtype=np.int32)
