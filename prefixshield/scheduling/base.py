"""The scheduler interface the engine's step-by-step and per-step batched paths drive.

A scheduler owns the waiting queue (arrival, requeue after preemption, which request to try
next), picks the preemption victim when a running request's blocks do not fit, and keeps its
own accounting (token counters). The engine keeps vLLM's step structure around it: running
requests first, in admission order, then waiting requests while the token budget and
``max_num_seqs`` allow; a waiting request that is tried and does not fit stops admission for the
step (head-of-line blocking, as in vLLM, whatever the order). Per-tenant limits make a request
*ineligible* (held back, as a gateway holds it) rather than blocking: the scheduler's order skips
it.

Items in the queue are the engine's ``Sequence`` objects (``request_id`` = trace row, ``group``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable, ClassVar, Sequence as Seq

import numpy as np

from prefixshield.scheduling.config import SchedulerConfig


class Scheduler(ABC):
    """One run's scheduling policy.

    Args:
        config: the scheduler configuration.
        groups: group names by id.
        arrival_s: per request (trace row), seconds.
        group_id: per request, the group id.

    Class attributes:
        name: the registered name.
        order_fixed: whether the order of the waiting requests changes only through arrivals,
            admissions and preemptions (not through decode steps). When False, a waiting
            request that did not fit may be replaced by another as the queue's choice after a
            quiet decode step, so the engine jumps over quiet decode steps only when nothing
            waits or ``max_num_seqs`` requests run.
        counts_outputs: whether `on_output` does anything (the batched path counts
            the emitted tokens per group only for a scheduler that reads them).
        counts_block_seconds: whether `on_hold` does anything (the engine passes the
            blocks each group holds over every step and decode jump only to a scheduler that
            reads them).
    """

    name: ClassVar[str] = ""
    order_fixed: ClassVar[bool] = True
    counts_outputs: ClassVar[bool] = False
    counts_block_seconds: ClassVar[bool] = False

    def __init__(self, config: SchedulerConfig, groups: list[str], arrival_s: np.ndarray,
                 group_id: np.ndarray) -> None:
        self.config = config
        self.groups = groups
        self.arrival_s = arrival_s
        self.group_id = group_id
        self.priority, self.limits = config.resolve(groups)

    # ------------------------------------------------------------------ the waiting queue
    @abstractmethod
    def arrive(self, seq) -> None:
        """A request arrives (``seq.request_id`` its trace row)."""

    @abstractmethod
    def requeue(self, seq) -> None:
        """A running request was preempted and waits again (vLLM's ``prepend_request``)."""

    @abstractmethod
    def __len__(self) -> int:
        """Requests waiting."""

    def __bool__(self) -> bool:
        return len(self) > 0

    @abstractmethod
    def peek(self, eligible: Callable[[object], bool] | None = None):
        """The waiting request to try next, among those ``eligible`` accepts (all when None);
        None if there is none. Does not remove it."""

    @abstractmethod
    def pop(self, seq) -> None:
        """Remove ``seq``, the request `peek` just returned (it was admitted)."""

    # ------------------------------------------------------------------ preemption
    def victim(self, running: Seq) -> int:
        """Position in ``running`` (admission order) of the request to preempt when a running
        request's blocks do not fit. Default: vLLM's, the most recently admitted."""
        return len(running) - 1

    # ------------------------------------------------------------------ accounting
    def on_admit(self, seq, first: bool, now: float) -> None:
        """``seq`` was admitted at ``now`` (``first``: its first admission, not a resumption
        after preemption)."""

    def on_output(self, group: int, num_tokens: int) -> None:
        """``num_tokens`` output tokens of a request of ``group`` were emitted."""

    @property
    def wants_capacity(self) -> bool:
        """Whether `bind_capacity` is to be called before the run."""
        return False

    def bind_capacity(self, usable_blocks: int, prompt_tokens_per_s: float) -> None:
        """The engine's capacity, told once before the run when `wants_capacity`: its
        usable KV blocks and the prompt tokens per second a full-budget prefill step computes
        (simulated seconds)."""

    def on_hold(self, held: np.ndarray, seconds: float) -> None:
        """Over the ``seconds`` (simulated) that just passed, group ``g``'s running requests
        held ``held[g]`` block-table entries (KV blocks) throughout. Called after every step
        and every decode jump when `counts_block_seconds`."""

    def stats(self) -> dict:
        """The scheduler's own counters at the end (JSON-able)."""
        return {}


class OrderedQueue:
    """Waiting requests kept sorted by a key (ties impossible: the key ends with the row).
    Insertion is O(n) (a list insert); queues are short next to a run's steps."""

    def __init__(self, key: Callable[[object], tuple]) -> None:
        self._key = key
        self._keys: list[tuple] = []
        self._items: list = []

    def add(self, seq) -> None:
        """Insert ``seq`` at its key's place."""
        import bisect

        k = self._key(seq)
        i = bisect.bisect_left(self._keys, k)
        self._keys.insert(i, k)
        self._items.insert(i, seq)

    def first(self, eligible: Callable[[object], bool] | None):
        """The first item in key order that ``eligible`` accepts (None if none)."""
        if eligible is None:
            return self._items[0] if self._items else None
        for s in self._items:
            if eligible(s):
                return s
        return None

    def remove(self, seq) -> None:
        """Remove ``seq`` (present)."""
        import bisect

        i = bisect.bisect_left(self._keys, self._key(seq))
        assert self._items[i] is seq
        del self._keys[i]
        del self._items[i]

    def __len__(self) -> int:
        return len(self._items)
