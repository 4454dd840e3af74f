"""``vtc``: the Virtual Token Counter (Sheng et al., "Fairness in Serving Large Language
Models", OSDI 2024, Algorithm 2), over vLLM's step structure.

* Each group ``g`` has a counter ``c_g`` of the service it received: ``w_in`` per prompt token
  of each of its requests, charged when the request is first admitted, and ``w_out`` per output
  token, charged as it is emitted. The weights are `SchedulerConfig.vtc_input_weight` and
  `vtc_output_weight` (the paper's 1 and 2 by default). Recomputation
  after a preemption is not charged again: it is the engine's choice, not the tenant's demand.
* **Counter lift.** When a request arrives for a group with nothing waiting, its counter is
  raised to the least counter of the groups that have requests waiting -- or, if none has, to
  the counter of the group whose request was admitted last -- so that idling earns no credit.
* **Order.** The next request tried is the oldest waiting request (FIFO within its group,
  preempted requests first) of the waiting group with the least counter (ties: the group whose
  next request arrived first). As in vLLM, a request that is tried and does not fit stops
  admission for the step.
* **Preemption victim** (the paper does not preempt; vLLM must): the most recently admitted
  running request of the running group with the *largest* counter. That keeps the paper's
  invariant -- the least-served tenants are served -- through memory pressure, and within a
  group it is vLLM's own rule (last admitted first).

Counters are kept as integer token counts per group and a lift offset, so the same tokens give
the same counter whether decode steps are taken one by one or in a jump.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from prefixshield.scheduling.base import Scheduler
from prefixshield.scheduling.registry import register_scheduler


@register_scheduler
class VTCScheduler(Scheduler):
    """The Virtual Token Counter: the least-served waiting group first."""

    name = "vtc"
    order_fixed = False
    counts_outputs = True

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        G = len(self.groups)
        self._queues = [deque() for _ in range(G)]
        self._num_waiting = 0
        self.input_tokens = np.zeros(G, dtype=np.int64)
        self.output_tokens = np.zeros(G, dtype=np.int64)
        self.lift = np.zeros(G, dtype=np.float64)
        self._last_admitted_group = -1
        self.prompt_tokens: np.ndarray | None = None  # set by the engine

    def counter(self, g: int) -> float:
        """``c_g``: weighted tokens served to group ``g`` plus its lifts."""
        cfg = self.config
        return (cfg.vtc_input_weight * float(self.input_tokens[g])
                + cfg.vtc_output_weight * float(self.output_tokens[g]) + float(self.lift[g]))

    def _lift_to(self, g: int, level: float) -> None:
        c = self.counter(g)
        if level > c:
            self.lift[g] += level - c

    def arrive(self, seq) -> None:
        g = seq.group
        if not self._queues[g]:
            waiting = [h for h, q in enumerate(self._queues) if q]
            if waiting:
                self._lift_to(g, min(self.counter(h) for h in waiting))
            elif self._last_admitted_group >= 0:
                self._lift_to(g, self.counter(self._last_admitted_group))
        self._queues[g].append(seq)
        self._num_waiting += 1

    def requeue(self, seq) -> None:
        self._queues[seq.group].appendleft(seq)
        self._num_waiting += 1

    def __len__(self) -> int:
        return self._num_waiting

    def peek(self, eligible=None):
        best = None
        best_key = None
        for g, q in enumerate(self._queues):
            if not q:
                continue
            s = q[0]
            if eligible is not None and not eligible(s):
                continue
            key = (self.counter(g), float(self.arrival_s[s.request_id]), s.request_id)
            if best_key is None or key < best_key:
                best, best_key = s, key
        return best

    def pop(self, seq) -> None:
        q = self._queues[seq.group]
        assert q[0] is seq
        q.popleft()
        self._num_waiting -= 1

    def on_admit(self, seq, first: bool, now: float) -> None:
        self._last_admitted_group = seq.group
        if first:
            self.input_tokens[seq.group] += seq.num_prompt_tokens

    def on_output(self, group: int, num_tokens: int) -> None:
        self.output_tokens[group] += num_tokens

    def victim(self, running) -> int:
        best = len(running) - 1
        best_c = None
        for i in range(len(running) - 1, -1, -1):  # newest first: ties keep the newest
            c = self.counter(running[i].group)
            if best_c is None or c > best_c:
                best, best_c = i, c
        return best

    def stats(self) -> dict:
        return {"vtc_counter": {g: self.counter(i) for i, g in enumerate(self.groups)},
                "vtc_input_tokens": {g: int(x) for g, x in zip(self.groups, self.input_tokens)},
                "vtc_output_tokens": {g: int(x) for g, x in
                                      zip(self.groups, self.output_tokens)}}
