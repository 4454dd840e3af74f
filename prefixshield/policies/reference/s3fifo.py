"""Reference S3-FIFO: the rules of ``prefixshield/policies/s3fifo.py`` in plain Python.

Read this first: it is the specification the numba policy is tested against, and it follows
libCacheSim's ``S3FIFO.c`` (``find`` / ``insert`` / ``evict`` / ``evict_small`` /
``evict_main``) plus the pool's additions (truly free blocks first, pinned blocks kept).
"""

from __future__ import annotations

import copy
from collections import OrderedDict, deque

import numpy as np

from prefixshield.policies.base import Policy


class ReferenceS3FIFO(Policy):
    """Executable spec of ``S3FIFOPolicy`` (same constructor, same decisions).

    State: ``truly_free`` (deque, head reused first), ``small`` and ``main`` (deques, head =
    oldest), ``freq``/``key`` (dicts over queued blocks), ``in_use`` (pinned blocks), ``ghost``
    (OrderedDict of content keys, oldest first), ``has_evicted``.
    """

    name = "reference_s3fifo"

    def __init__(self, num_blocks: int, vllm_compat: str = "current",
                 small_size_ratio: float = 0.1, ghost_size_ratio: float = 0.9,
                 move_to_main_threshold: int = 2) -> None:
        super().__init__(num_blocks, vllm_compat)
        capacity = self.num_blocks - 1
        self.small_size = int(capacity * small_size_ratio)   # C: (int64_t) truncation
        self.main_size = capacity - self.small_size
        self.ghost_size = int(capacity * ghost_size_ratio)
        self.threshold = move_to_main_threshold
        self.freq_cap = max(3, move_to_main_threshold)
        self.truly_free: deque[int] = deque(range(1, self.num_blocks))
        self.small: deque[int] = deque()
        self.main: deque[int] = deque()
        self.freq: dict[int, int] = {}
        self.key: dict[int, int] = {}
        self.in_use: set[int] = set()
        self.ghost: OrderedDict[int, None] = OrderedDict()
        self.has_evicted = False
        self.counts = dict(promotions=0, evictions_small=0, evictions_main=0, ghost_hits=0)

    # -- helpers ---------------------------------------------------------------------------------

    def _unpinned(self, queue) -> int:
        return sum(1 for b in queue if b not in self.in_use)

    def _trim_ghost(self) -> None:
        while len(self.ghost) > self.ghost_size:
            self.ghost.popitem(last=False)

    def _leave_queues(self, b: int) -> None:
        for queue in (self.small, self.main):
            if b in queue:
                queue.remove(b)
        self.freq.pop(b, None)
        self.key.pop(b, None)

    def _evict_small(self):
        while self.small:
            if self._unpinned(self.small) == 0:
                return None
            b = self.small.popleft()
            if self.freq[b] >= self.threshold:      # promotion (pinned or not)
                self.main.append(b)
                self.freq[b] = 0
                self.counts["promotions"] += 1
            elif b in self.in_use:                  # pinned: kept, back to the small tail
                self.small.append(b)
            else:                                   # reclaimed; its key goes to the ghost
                if self.ghost_size > 0 and self.key[b] not in self.ghost:
                    self.ghost[self.key[b]] = None  # trimmed later (see _trim_ghost callers)
                del self.freq[b], self.key[b]
                self.counts["evictions_small"] += 1
                return b
        return None

    def _evict_main(self):
        while self.main:
            if self._unpinned(self.main) == 0:
                return None
            b = self.main.popleft()
            if self.freq[b] >= 1:                   # second chance, 2-bit counter
                self.main.append(b)
                self.freq[b] = min(self.freq[b], 3) - 1
            elif b in self.in_use:                  # pinned with freq 0: kept, main tail
                self.main.append(b)
            else:
                del self.freq[b], self.key[b]
                self.counts["evictions_main"] += 1
                return b
        return None

    def _evict_one(self) -> int:
        while True:
            small_free, main_free = self._unpinned(self.small), self._unpinned(self.main)
            assert small_free + main_free > 0, "no free block to reclaim"
            self.has_evicted = True
            if (len(self.main) > self.main_size or small_free == 0) and main_free > 0:
                b = self._evict_main()
            else:
                b = self._evict_small()
            if b is not None:
                return b

    # -- pool interface --------------------------------------------------------------------------

    def on_release(self, blocks, cached, now) -> None:
        """Unpin; uncached blocks become truly free (head in "current", tail in "0.10")."""
        freed = []
        for b, c in zip((int(x) for x in blocks), (bool(x) for x in cached)):
            self.in_use.remove(b)
            if not c:
                self._leave_queues(b)
                freed.append(b)
        if self.vllm_compat == "current":
            self.truly_free.extendleft(reversed(freed))
        else:
            self.truly_free.extend(freed)

    def on_acquire(self, blocks) -> None:
        """Pin; queue positions do not change."""
        self.in_use.update(int(b) for b in blocks)

    def select_victims(self, n, now, requester) -> np.ndarray:
        """Truly free blocks first, then S3-FIFO reclamation."""
        self._trim_ghost()
        out = []
        for _ in range(n):
            b = self.truly_free.popleft() if self.truly_free else self._evict_one()
            self.in_use.add(b)
            out.append(b)
        return np.array(out, dtype=np.int32)

    def on_materialize(self, blocks, hashes, group, contract, prefix_id, now, *, request_id=-1,
                       root=None, num_decode=0) -> None:
        """Ghost hit -> main; small full before any eviction -> main; else small. freq 0."""
        for b, h in zip((int(x) for x in blocks), (int(x) for x in hashes)):
            self._leave_queues(b)
            self.key[b], self.freq[b] = h, 0
            if self.ghost_size > 0 and h in self.ghost:
                del self.ghost[h]
                self.main.append(b)
                self.counts["ghost_hits"] += 1
            elif not self.has_evicted and len(self.small) >= self.small_size:
                self.main.append(b)
            else:
                self.small.append(b)
        self._trim_ghost()

    def on_hit(self, blocks, group, contract, prefix_id, now, *, root=None) -> None:
        """freq += 1, capped."""
        for b in (int(x) for x in blocks):
            if b in self.freq:
                self.freq[b] = min(self.freq[b] + 1, self.freq_cap)

    def num_free(self) -> int:
        """Truly free plus unpinned queued blocks."""
        return len(self.truly_free) + self._unpinned(self.small) + self._unpinned(self.main)

    def free_order(self) -> np.ndarray:
        """What select_victims(num_free) would return now (run on a copy)."""
        clone = copy.deepcopy(self)
        return clone.select_victims(clone.num_free(), 0.0, 0)

    def stats(self) -> dict:
        """Queue sizes and event counters (a subset of ``S3FIFOPolicy.stats``)."""
        return dict(small_blocks=len(self.small), main_blocks=len(self.main),
                    ghost_keys=len(self.ghost), **self.counts)
