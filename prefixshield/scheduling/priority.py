"""``priority``: vLLM's ``priority`` scheduling policy, as vLLM implements it.

* The waiting queue is ordered by ``(priority, arrival time, request id)``, lower first
  (``PriorityRequestQueue``, ``Request.__lt__``); a preempted request goes back by the same
  order (``prepend_request`` is an ordered insert there).
* When a running request's blocks do not fit, the victim is the running request with the
  largest ``(priority, arrival time)`` -- the first such in admission order (Python's ``max``)
  -- wherever it stands in the running list. If it was already scheduled in this step, its
  tokens go back to the step's budget (vLLM 0.32; vLLM 0.10.2 left them counted, a bug fixed
  since, which is not reproduced).

Each request's priority is its group's (`SchedulerConfig.priorities`, 0 when not named).
"""

from __future__ import annotations

from prefixshield.scheduling.base import OrderedQueue, Scheduler
from prefixshield.scheduling.registry import register_scheduler


@register_scheduler
class PriorityScheduler(Scheduler):
    """vLLM's ``priority`` policy over per-group priorities (lower first)."""

    name = "priority"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._queue = OrderedQueue(self._key)

    def _key(self, seq) -> tuple:
        r = seq.request_id
        return (self.priority[seq.group], float(self.arrival_s[r]), r)

    def arrive(self, seq) -> None:
        self._queue.add(seq)

    def requeue(self, seq) -> None:
        self._queue.add(seq)

    def __len__(self) -> int:
        return len(self._queue)

    def peek(self, eligible=None):
        return self._queue.first(eligible)

    def pop(self, seq) -> None:
        self._queue.remove(seq)

    def victim(self, running) -> int:
        best = 0
        best_key = None
        for i, s in enumerate(running):
            k = (self.priority[s.group], float(self.arrival_s[s.request_id]))
            if best_key is None or k > best_key:  # strict: the first maximum, as max() keeps
                best, best_key = i, k
        return best
