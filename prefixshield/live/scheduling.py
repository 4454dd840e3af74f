"""The simulator's schedulers in a live vLLM 0.32 engine, installed at the scheduler's queue.

What runs live, per [`SchedulerConfig`][prefixshield.scheduling.config.SchedulerConfig]:

* ``fcfs`` without limits: vLLM's own scheduler, untouched.
* ``priority`` without limits: vLLM's own ``priority`` policy -- the scheduler's ``policy`` is
  set to ``SchedulingPolicy.PRIORITY`` with a fresh ``PriorityRequestQueue``, exactly what
  ``scheduling_policy="priority"`` builds at start-up (vLLM reads ``policy`` only there and in
  the preemption branch of ``schedule``), and each request is submitted with its group's
  priority. This is vLLM's code, not ours: the live run checks the simulator's model of it.
* per-tenant limits (any scheduler), ``vtc`` and ``kvtc``: `TenantRequestQueue` replaces
  the scheduler's waiting queue. It holds the very scheduler class the simulator runs (same
  order, same counters, same eligibility test) and answers vLLM's ``peek_request`` /
  ``pop_request`` with its choice among the requests its group's limits let through; when
  none is eligible the queue reads as empty, so vLLM stops admitting for the step -- the
  simulator's "held back" rule. ``max_output_tokens`` is applied where a gateway applies it:
  the request's ``max_tokens``.
* ``vtc``'s and ``kvtc``'s preemption victim (the most recently admitted request of the running
  group with the largest counter) goes through vLLM's priority preemption branch: before each
  ``schedule()`` every running request's ``priority`` is set to its rank in that order, so
  vLLM's ``max(running, key=(priority, arrival_time))`` is that victim.
  Output tokens are charged to the counters from ``update_from_output``; a request that
  arrived while a step ran sees the counters before that step's outputs, as in the simulator
  (whose arrival lands mid-step, before the step's tokens are emitted).
* ``kvtc``'s block-seconds: after each ``schedule()`` that schedules tokens the block-table
  entries of every group's running requests are read from vLLM's KV manager, and charged with
  that step's output tokens, times the step's seconds as the replay records them (live, the
  engine's time is real time; a step-time replay of the simulator charges the same seconds).
  Its KV weight must be given (``kvtc_kv_weight``): the default, the capacity price, comes from
  the simulator's cost model, which a live engine does not have.

Nothing of vLLM 0.32's scheduler is out of reach for these four: the queue is an object vLLM
calls through a small interface, and the victim rule is the one branch that reads a request
attribute we can set. What the live mode does *not* reproduce is listed in
`check_supported`'s errors (a scheduler class from another package).
"""

from __future__ import annotations

import time
from typing import Iterable, Iterator

import numpy as np

from prefixshield.scheduling.config import SchedulerConfig

EXTRA_ROW = "prefixshield_row"
"""``SamplingParams.extra_args`` key of a request's trace row (the queue's request id)."""

LIVE_SCHEDULERS = ("fcfs", "priority", "vtc", "kvtc")
"""Schedulers the live mode installs (others registered by plugins are simulator-only)."""


def check_supported(config: SchedulerConfig) -> None:
    """Raise ``ValueError`` (one line) if the live mode cannot run ``config``."""
    if config.name not in LIVE_SCHEDULERS:
        raise ValueError(f"scheduler {config.name!r} runs in the simulator only; the live mode "
                         f"installs {', '.join(LIVE_SCHEDULERS)} (a scheduler from another "
                         "package has no vLLM counterpart here)")
    if config.name == "kvtc" and config.kvtc_kv_weight is None:
        raise ValueError("kvtc live needs its KV weight given (kvtc_kv_weight, --vtc-weights "
                         "IN,OUT,KV): its default is the simulator's capacity price, from a cost "
                         "model the live engine does not have")


def uses_queue(config: SchedulerConfig) -> bool:
    """Whether ``config`` needs `TenantRequestQueue` (VTC, or admission limits) rather
    than one of vLLM's own queues."""
    return config.name in ("vtc", "kvtc") or any(
        lim.max_running is not None or lim.max_blocks is not None for _, lim in config.limits)


class _Item:
    """A waiting vLLM request as the simulator's schedulers see a ``Sequence``."""

    __slots__ = ("request_id", "group", "num_prompt_tokens", "req")

    def __init__(self, row: int, group: int, req) -> None:
        self.request_id = row
        self.group = group
        self.num_prompt_tokens = int(req.num_prompt_tokens)
        self.req = req

    @property
    def num_tokens(self) -> int:
        return int(self.req.num_tokens)


def _request_queue_base():
    from vllm.v1.core.sched.request_queue import RequestQueue

    return RequestQueue


class TenantRequestQueue(_request_queue_base()):
    """vLLM's waiting queue, ordered and filtered by a simulator scheduler.

    Args:
        vllm_scheduler: the engine core's ``Scheduler`` (its ``running`` list and KV manager
            are read for the limits).
        scheduler: the simulator's scheduler for this replay (built over the trace's groups).
        group_id: per trace row, the group id.

    A request's row comes from its ``SamplingParams.extra_args[EXTRA_ROW]``.
    ``remove_request(s)`` (vLLM's abort) marks requests gone: they are never chosen again and
    no longer counted (the simulator's schedulers cannot drop an arbitrary request; an abort
    ends the replay anyway).
    """

    def __init__(self, vllm_scheduler, scheduler, group_id: np.ndarray) -> None:
        self.vllm = vllm_scheduler
        self.sched = scheduler
        self.group_id = group_id
        self.limits = scheduler.limits
        self.has_limits = any(lim.max_running is not None or lim.max_blocks is not None
                              for lim in self.limits)
        self.block_size = int(vllm_scheduler.block_size)
        self._items: dict[int, _Item] = {}  # id(vLLM request) -> item, while it waits
        self._removed: set[int] = set()
        self._admitted: set[int] = set()
        self._peeked: _Item | None = None
        # Output tokens of the last step not yet charged to the scheduler (group -> tokens),
        # and when that step ended (replay seconds): see on_arrival_time.
        self.pending: dict[int, int] = {}
        # kvtc: blocks held per group over each ended step and its seconds, not yet charged
        self.pending_hold: list[tuple[np.ndarray, float]] = []
        self.pending_end = float("inf")
        self.arrival_clock: dict[int, float] = {}  # row -> when it arrived (replay seconds)
        self.t0 = time.monotonic()

    # ------------------------------------------------------------------ helpers
    def _item(self, request) -> _Item:
        item = self._items.get(id(request))
        if item is None:
            extra = request.sampling_params.extra_args or {}
            row = int(extra[EXTRA_ROW])
            item = _Item(row, int(self.group_id[row]), request)
        return item

    def flush(self) -> None:
        """Charge the pending output tokens (and block-seconds) to the scheduler's counters."""
        for g, k in self.pending.items():
            self.sched.on_output(g, k)
        self.pending.clear()
        for held, seconds in self.pending_hold:
            self.sched.on_hold(held, seconds)
        self.pending_hold.clear()

    def held_blocks(self) -> np.ndarray:
        """Block-table entries of each group's running requests, as vLLM's KV manager has
        them."""
        held = np.zeros(len(self.limits), dtype=np.int64)
        kvm = self.vllm.kv_cache_manager
        for r in self.vllm.running:
            g = int(self.group_id[int(r.sampling_params.extra_args[EXTRA_ROW])])
            held[g] += len(kvm.get_block_ids(r.request_id)[0])
        return held

    def _eligible(self):
        """The simulator engine's admission test over vLLM's running requests (None: every
        waiting request is eligible): the group runs fewer than ``max_running`` requests and
        its running requests' block tables plus the request's own known tokens' blocks fit
        ``max_blocks``. Read afresh at each peek: a request admitted in this step is already
        in ``running`` with its blocks, as the simulator counts it."""
        if not self.has_limits and not self._removed:
            return None
        G = len(self.limits)
        count = np.zeros(G, dtype=np.int64)
        held = np.zeros(G, dtype=np.int64)
        if self.has_limits:
            kvm = self.vllm.kv_cache_manager
            for r in self.vllm.running:
                g = int(self.group_id[int(r.sampling_params.extra_args[EXTRA_ROW])])
                count[g] += 1
                held[g] += len(kvm.get_block_ids(r.request_id)[0])
        limits, removed, B = self.limits, self._removed, self.block_size

        def eligible(item: _Item) -> bool:
            if id(item.req) in removed:
                return False
            lim = limits[item.group]
            if lim.max_running is not None and count[item.group] >= lim.max_running:
                return False
            return lim.max_blocks is None or held[item.group] + -(-item.num_tokens // B) \
                <= lim.max_blocks
        return eligible

    def _choice(self) -> _Item | None:
        self._peeked = self.sched.peek(self._eligible())
        return self._peeked

    # ------------------------------------------------------------------ vLLM's interface
    def add_request(self, request) -> None:
        """A request arrives (``Scheduler.add_request``)."""
        item = self._item(request)
        if (self.pending or self.pending_hold) and \
                self.arrival_clock.get(item.request_id, np.inf) >= self.pending_end:
            self.flush()  # it arrived after the last step ended: that step's tokens count
        self._items[id(request)] = item
        self.sched.arrive(item)

    def pop_request(self):
        """Admit the request `peek_request` chose (vLLM pops right after peeking)."""
        item = self._peeked if self._peeked is not None else self._choice()
        if item is None:
            raise IndexError("pop from a queue with no eligible request")
        self._peeked = None
        self.sched.pop(item)
        del self._items[id(item.req)]
        first = item.request_id not in self._admitted
        self._admitted.add(item.request_id)
        self.sched.on_admit(item, first, time.monotonic() - self.t0)
        return item.req

    def peek_request(self):
        """The scheduler's next eligible request."""
        item = self._choice()
        if item is None:
            raise IndexError("peek at a queue with no eligible request")
        return item.req

    def prepend_request(self, request) -> None:
        """A preempted request waits again (the scheduler's ``requeue``)."""
        item = self._item(request)
        self._items[id(request)] = item
        self.sched.requeue(item)

    def prepend_requests(self, requests: Iterable) -> None:
        """Requeue ``requests`` so that the first of them ends up first, as vLLM's FCFS queue
        does (``extendleft(reversed(...))``)."""
        for r in reversed(list(requests)):
            self.prepend_request(r)

    def remove_request(self, request) -> None:
        """Drop ``request`` (an abort): see the class docstring."""
        if id(request) in self._items:
            self._removed.add(id(request))

    def remove_requests(self, requests: Iterable) -> None:
        for r in requests:
            self.remove_request(r)

    def __bool__(self) -> bool:
        # vLLM's admission loop stops on an empty queue: a queue whose every request is held
        # back by its group's limits must read as empty (the simulator's "held back").
        return self._choice() is not None

    def __len__(self) -> int:
        return len(self.sched) - len(self._removed)

    def __iter__(self) -> Iterator:
        """The waiting requests, in the order they joined the queue (not the scheduler's)."""
        return iter([it.req for k, it in self._items.items() if k not in self._removed])


class LiveScheduling:
    """Installs a `SchedulerConfig` on a live vLLM scheduler for one replay (a context
    manager; the scheduler must have nothing waiting or running).

    Args:
        vllm_scheduler: the engine core's ``Scheduler``.
        config: the scheduling policy and limits (``check_supported`` must accept it).
        groups: the trace's group names (`Trace.group_names`), as the simulator numbers
            them.
        group_id: per trace row, the group id.
        arrival_s: per trace row, the arrival the scheduler orders by (seconds).

    Attributes:
        queue: the `TenantRequestQueue` (None when vLLM's own queue runs).
        priority: per group, the priority requests are submitted with.
    """

    def __init__(self, vllm_scheduler, config: SchedulerConfig, groups: list[str],
                 group_id: np.ndarray, arrival_s: np.ndarray) -> None:
        from prefixshield.scheduling import make_scheduler

        check_supported(config)
        self.vllm = vllm_scheduler
        self.config = config
        self.group_id = group_id
        self.sched = make_scheduler(config, groups, arrival_s, group_id)
        self.priority = list(self.sched.priority) if config.name == "priority" \
            else [0] * len(groups)
        self.queue = TenantRequestQueue(vllm_scheduler, self.sched, group_id) \
            if uses_queue(config) else None
        self._saved: tuple | None = None
        # kvtc: the blocks each group holds in the step now running
        self._step_held: np.ndarray | None = None

    def __enter__(self) -> "LiveScheduling":
        from vllm.v1.core.sched.request_queue import SchedulingPolicy, create_request_queue

        v = self.vllm
        if v.running or len(v.waiting) or len(v.kv_holding_waiting):
            raise RuntimeError("scheduling can be installed only on an idle vLLM scheduler")
        self._saved = (v.policy, v.waiting, v.kv_holding_waiting)
        # priority and vtc take vLLM's priority preemption branch (an arbitrary victim, its
        # tokens back to the budget), as the simulator's engine does for them
        policy = SchedulingPolicy.FCFS if self.config.name == "fcfs" \
            else SchedulingPolicy.PRIORITY
        v.policy = policy
        v.waiting = self.queue if self.queue is not None else create_request_queue(policy)
        v.kv_holding_waiting = create_request_queue(policy)
        if self.queue is not None:
            self._wrap()
        return self

    def __exit__(self, *exc) -> None:
        if self.queue is not None:
            self.queue.flush()  # the last step's output tokens
        v = self.vllm
        v.policy, v.waiting, v.kv_holding_waiting = self._saved
        for name in ("schedule", "update_from_output"):
            v.__dict__.pop(name, None)

    def _wrap(self) -> None:
        v, q = self.vllm, self.queue
        schedule = v.schedule
        update = v.update_from_output
        vtc = self.config.name in ("vtc", "kvtc")
        kvtc = self.config.name == "kvtc"

        def wrapped_schedule(*args, **kwargs):
            q.flush()
            if vtc:
                # VTC's victim: largest counter, then most recently admitted; vLLM's priority
                # branch preempts max(running, key=(priority, arrival_time)), so rank them.
                order = sorted(range(len(v.running)), key=lambda i: (
                    q.sched.counter(q._item(v.running[i]).group), i))
                for rank, i in enumerate(order):
                    v.running[i].priority = rank
            out = schedule(*args, **kwargs)
            if kvtc and out.total_num_scheduled_tokens > 0:
                # what the step that runs now holds; a step that schedules nothing is folded
                # into the next one, as the replay's step record folds it
                self._step_held = q.held_blocks()
            return out

        def wrapped_update(scheduler_output, model_runner_output):
            reqs = [v.requests[rid] for rid in scheduler_output.num_scheduled_tokens]
            before = [r.num_output_tokens for r in reqs]
            out = update(scheduler_output, model_runner_output)
            for r, b in zip(reqs, before):
                k = r.num_output_tokens - b
                if k:
                    g = q._item(r).group
                    q.pending[g] = q.pending.get(g, 0) + k
            q.pending_end = float("inf")  # set by step_ended once the step is timed
            return out

        v.schedule = wrapped_schedule
        v.update_from_output = wrapped_update

    def arrived(self, row: int, when_s: float) -> None:
        """Row ``row`` is submitted now; it arrived at ``when_s`` replay seconds (the trace's
        arrival when timed, the submission when serialized)."""
        if self.queue is not None:
            self.queue.arrival_clock[row] = when_s

    def step_ended(self, end_s: float, start_s: float) -> None:
        """The step that just returned ended at ``end_s`` replay seconds and is charged from
        ``start_s`` (the replay's step record: the previous step's end, or the arrival that
        woke the engine): a request arriving before ``end_s`` arrived while it ran, and sees
        the counters before its output tokens (and, under kvtc, its block-seconds: the blocks
        held in it times ``end_s - start_s``, the seconds the step-time replay charges)."""
        q = self.queue
        if q is not None and self._step_held is not None:
            q.pending_hold.append((self._step_held, end_s - start_s))
            self._step_held = None
        if q is not None and (q.pending or q.pending_hold):
            q.pending_end = end_s

    def stats(self) -> dict:
        """The scheduler's own counters (JSON-able) and its configuration."""
        return {"config": self.config.to_dict(), **self.sched.stats()}
