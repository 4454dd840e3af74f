"""``fcfs``: vLLM's default scheduling policy -- first come, first served, a preempted request
back at the head of the queue, the most recently admitted request preempted first."""

from __future__ import annotations

from collections import deque

from prefixshield.scheduling.base import Scheduler
from prefixshield.scheduling.registry import register_scheduler


@register_scheduler
class FCFSScheduler(Scheduler):
    """vLLM's ``fcfs`` policy (``FCFSRequestQueue``): a deque; arrivals at the tail, preempted
    requests at the head. With per-tenant limits, the first *eligible* request in that order
    is tried."""

    name = "fcfs"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._queue: deque = deque()

    def arrive(self, seq) -> None:
        self._queue.append(seq)

    def requeue(self, seq) -> None:
        self._queue.appendleft(seq)

    def __len__(self) -> int:
        return len(self._queue)

    def peek(self, eligible=None):
        if eligible is None:
            return self._queue[0] if self._queue else None
        for s in self._queue:
            if eligible(s):
                return s
        return None

    def pop(self, seq) -> None:
        if self._queue[0] is seq:
            self._queue.popleft()
        else:
            self._queue.remove(seq)
