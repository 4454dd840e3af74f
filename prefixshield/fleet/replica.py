"""A fleet replica that receives its requests from the router while it runs (lockstep mode).

:class:`LockstepReplica` is the :class:`~prefixshield.simulator.engine.Engine` -- the same
scheduler, pool, policy and step code -- built over the whole trace, whose arrivals are the
rows the router sends it (:meth:`deliver`) instead of every row. Two things in a single engine
look ahead at the next arrival, which a replica does not know until the router decides:

* the arrival process schedules the next arrival's timeout right after an arrival;
* a coalesced decode jump stops at the first step boundary at or after the next arrival.

Both wait on a :class:`~prefixshield.fleet.slots.Slot`: the event id is taken when the single
engine would schedule, the time is set when the next row is routed here (or, for a jump, when
no later row can change its length: see :meth:`jump_settles`, and :meth:`close`). So a replica
given the rows R runs exactly as a single engine over the sub-trace R: same steps, same times,
same records (the identity test in ``tests/fleet``). It takes the per-step path (batched, or
step-by-step for non-default schedulers), never the fused loop, which needs every arrival up
front.

The replicas of one run serve disjoint rows of one trace, so they share what is per request
(:class:`SharedRows`): the arrays read from the trace, the per-request results (each row is
written only by the replica it was routed to), and the token ids and block hashes, built once
for the fleet instead of once per replica. A replica owns only its run state
(:meth:`~prefixshield.simulator.engine.Engine._new_run_state`: pool, policy, environment,
queues, logs) and its scheduler; memory then grows with requests + replicas x blocks, not
replicas x requests.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import pandas as pd

from prefixshield.fleet.slots import Slot
from prefixshield.scheduling.registry import make_scheduler
from prefixshield.simulator import batch as bk
from prefixshield.simulator.engine import Engine, _Chunks, bind_capacity
from prefixshield.simulator.records import build_records


class _ChunkCache:
    """Token ids and block hashes of the whole trace for every replica: the last
    :attr:`KEEP` chunks built (:class:`~prefixshield.simulator.engine._Chunks`, each a run of
    consecutive rows), searched newest first; a row in none of them starts a new one. Arrivals
    come in trace order across the fleet and the replicas' queue heads lag them a little, so
    nearly every row is built once (each replica's own two chunk streams over the whole trace
    built every row about twice per replica)."""

    KEEP = 8
    """Chunks kept (each at most ``Engine.CHUNK_REQUESTS`` rows and ``CHUNK_TOKENS`` tokens
    unless one request is longer)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.chunks: deque[_Chunks] = deque()

    def get(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Row ``i``'s token ids (prompt then output) and full-block hashes (read-only views:
        the same values :class:`_Chunks` gives a single engine)."""
        for c in reversed(self.chunks):
            if c.lo <= i < c.hi:
                return c.get(i)
        c = _Chunks(self.engine)
        c._build(i)
        self.chunks.append(c)
        if len(self.chunks) > self.KEEP:
            self.chunks.popleft()
        return c.get(i)

    def hashes(self, i: int) -> np.ndarray:
        """Row ``i``'s full-block hashes (a view)."""
        return self.get(i)[1]


class SharedRows:
    """What the replicas of one lockstep run share (see the module doc): the first replica
    (``template``) built the per-request arrays; the others take them from it.

    Attributes:
        template: the replica whose per-request arrays every replica uses.
        chunks: the fleet's token ids and block hashes (:class:`_ChunkCache`).
    """

    def __init__(self, template: "LockstepReplica") -> None:
        self.template = template
        self.chunks = _ChunkCache(template)
        self._records: pd.DataFrame | None = None

    def records(self) -> pd.DataFrame:
        """Every row's record (built once, after every replica has finished)."""
        if self._records is None:
            self._records = build_records(self.template)
        return self._records


class LockstepReplica(Engine):
    """An engine over the whole ``trace`` that serves only the rows delivered to it.

    Args: those of :class:`Engine` (``fused`` is forced off), and ``shared``: the
    :attr:`shared` of the run's first replica (built over the same trace, cost, config and
    contracts), whose per-request arrays this one then uses; None: this is the first. Call
    :meth:`start`, then :meth:`advance` / :meth:`deliver` in arrival order, then
    :meth:`close` and :meth:`finish`.
    """

    def __init__(self, *args, shared: SharedRows | None = None, **kwargs) -> None:
        kwargs["fused"] = False
        if shared is None:
            super().__init__(*args, **kwargs)
            self.shared = SharedRows(self)
        else:
            self._share(shared, *args, **kwargs)
        if self.batched:
            self._head_chunks = self._arrival_chunks = self.shared.chunks
        self._fed: deque[int] = deque()  # routed here, not arrived yet (arrival order)
        self._closed = False  # no row will be routed any more
        self._slot: Slot | None = None  # the arrival process waits for its next row
        self._deferred = None  # (plan, slot) of a decode jump waiting for the router
        self.rows: list[int] = []  # the rows routed here, in order
        self._unadmitted: list[int] = []  # arrived rows maybe not admitted yet (pruned lazily)
        self.done = None
        self.deferred_jumps = 0  # decode jumps that waited for the router (tests read it)

    def _new_run_state(self, policy) -> None:
        # remembers what the engine's run state is: every other attribute can be shared
        before = set(vars(self))
        super()._new_run_state(policy)
        self._run_names = frozenset(set(vars(self)) - before)

    def _share(self, shared: SharedRows, trace, policy, cost, config, **kwargs) -> None:
        """Take the per-request arrays of ``shared.template`` (built by :class:`Engine` over
        the same ``trace``, ``cost``, ``config`` and ``contracts``) and build the run state
        and the scheduler (whose queue is the run's own) for ``policy``."""
        t = shared.template
        if trace is not t.trace or config is not t.config or cost is not t.cost:
            raise ValueError("replicas sharing rows run the same trace, cost and config")
        vars(self).update({k: v for k, v in vars(t).items()
                           if k not in t._run_names and k != "scheduler"})
        self.shared = shared
        self.scheduler = make_scheduler(config.scheduler, self.groups, self.arrival_s,
                                        self.group_id)
        bind_capacity(self.scheduler, config, cost)
        self._new_run_state(policy)

    def records(self) -> pd.DataFrame:
        """The records of the rows routed here, in trace order."""
        return self.shared.records().iloc[self.rows].reset_index(drop=True)

    # ---------------------------------------------------------------- the engine's look-ahead
    def _arrivals_left(self) -> bool:
        return bool(self._fed) or not self._closed

    def _next_arrival_wait(self) -> float | None:
        return self.arrival_s[self._fed[0]] - self.env.now if self._fed else None

    def _jump(self, plan):
        if self._fed or self._closed:  # the next arrival is known: the engine's own jump
            return (yield from super()._jump(plan))
        slot = Slot(self.env)
        self._deferred = (plan, slot)
        self.deferred_jumps += 1
        return (yield slot.event)

    def _resolve_jump(self, wait: float | None) -> None:
        plan, slot = self._deferred
        self._deferred = None
        k, seconds = plan(wait)
        if k > 0:
            self.num_events += 1  # as Engine._jump counts a jump it takes
            slot.fire(seconds, k)
        else:
            slot.fire(0.0, 0)

    def jump_settles(self, t: float) -> bool:
        """If a decode jump waits for the router and an arrival at ``t`` (or any later one)
        would leave its length what no arrival gives, settle it now; returns whether it did."""
        if self._deferred is None:
            return False
        plan, slot = self._deferred
        if plan(t - slot.at) != plan(None):
            return False
        self._resolve_jump(None)
        return True

    def _fed_arrivals(self):
        """The engine's arrival process over the rows the router sends (see module doc)."""
        env = self.env
        while True:
            if self._fed:
                delay = self.arrival_s[self._fed[0]] - env.now
                if delay > 0:
                    yield env.timeout(delay)
            elif self._closed:
                return
            else:
                self._slot = Slot(env)
                yield self._slot.event
            i = self._fed.popleft()
            self._arrive(i)
            self._unadmitted.append(i)
            self._wake()

    # ---------------------------------------------------------------- driven by the fleet
    def start(self) -> None:
        """Create the processes, in the single engine's order (arrivals first)."""
        self.env.process(self._fed_arrivals())
        self.done = self.env.process(self._engine())

    def horizon(self, t: float) -> float:
        """Events before this time come before an arrival at ``t`` routed here: ``t`` as the
        waiting arrival process will compute it (``then + (t - then)``)."""
        return min(t, self._slot.at + (t - self._slot.at)) if self._slot is not None else t

    def advance(self, t: float) -> None:
        """Process every event before an arrival at ``t`` could be (settling decode jumps
        that no arrival can shorten)."""
        env = self.env
        limit = self.horizon(t)
        while True:
            while env.peek() < limit:
                env.step()
            if not self.jump_settles(t):
                return

    def deliver(self, row: int) -> None:
        """Row ``row`` (arriving at or after every row delivered before) is routed here."""
        self._fed.append(row)
        self.rows.append(row)
        t = self.arrival_s[row]
        if self._deferred is not None:
            self._resolve_jump(t - self._deferred[1].at)
        if self._slot is not None:
            slot, self._slot = self._slot, None
            slot.fire(max(t - slot.at, 0.0))

    def close(self) -> None:
        """No more rows: settle a waiting jump, let an idle engine see it is done."""
        self._closed = True
        if self._deferred is not None:
            self._resolve_jump(None)
        self._wake()

    def finish(self) -> None:
        """Run to the end (after :meth:`close`); an error of the engine is raised here."""
        self.env.run(until=self.done)

    # ---------------------------------------------------------------- what routers read
    def num_requests(self) -> int:
        # waiting requests are in the scheduler's queue under any scheduler but plain FCFS
        # (and on the step-by-step path), else in self.waiting
        waiting = len(self.scheduler) if self._scheduler_queue else len(self.waiting)
        return waiting + len(self._fed) + len(self.running)

    def cached_prefix_blocks(self, hashes: np.ndarray) -> int:
        return self.pool.cached_prefix_length(hashes, hashes.shape[0])

    def pending_prefill_tokens(self) -> int:
        self._unadmitted = [i for i in self._unadmitted if self.cached_tokens[i] < 0]
        total = 0
        for i in self._unadmitted:
            total += int(self.prompt_tokens[i] - self.arrival_cached_tokens[i])
        for i in self._fed:
            total += int(self.prompt_tokens[i])
        for s in self.running:
            done = (int(self._state[s.request_id, bk.COMPUTED]) if self.batched
                    else s.num_computed_tokens)
            total += max(0, s.num_prompt_tokens - done)
        return total

    def held_blocks(self) -> int:
        # a Python sum of a few groups' counts: numpy's reduction costs more at this size
        return sum(self.kv.held.tolist())
