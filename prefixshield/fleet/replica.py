"""A fleet replica that receives its requests from the router while it runs (lockstep mode).

`LockstepReplica` is the [`Engine`][prefixshield.simulator.engine.Engine] -- the same
scheduler, pool, policy and step code -- built over the whole trace, whose arrivals are the
rows the router sends it (`deliver`) instead of every row. Two things in a single engine
look ahead at the next arrival, which a replica does not know until the router decides:

* the arrival process schedules the next arrival's timeout right after an arrival;
* a coalesced decode jump stops at the first step boundary at or after the next arrival.

Both are asked of the engine's arrival source (`prefixshield.simulator.arrivals`), here a
`RoutedArrivals`, and both wait on a `Slot`: the event id is taken when the single
engine would schedule, the time is set when the next row is routed here (or, for a jump, when
no later row can change its length: see `jump_settles`, and `close`). So a replica
given the rows R runs exactly as a single engine over the sub-trace R: same steps, same times,
same records (the identity test in ``tests/fleet``). It takes the per-step path (batched, or
step-by-step for non-default schedulers), never the fused loop, which needs every arrival up
front.

The replicas of one run serve disjoint rows of one trace, so they share what is per request
(`SharedRows`): the arrays read from the trace, the per-request results (each row is
written only by the replica it was routed to), and the token ids and block hashes, built once
for the fleet instead of once per replica ([`Engine`][prefixshield.simulator.engine.Engine]'s
``rows_of``). A replica owns only its run state (pool, policy, environment, queues, logs), its
arrival source (`RoutedArrivals`) and its scheduler; memory then grows with requests + replicas x blocks, not
replicas x requests.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import pandas as pd

from prefixshield.fleet.slots import Slot
from prefixshield.simulator import batch as bk
from prefixshield.simulator import requests as rq
from prefixshield.simulator.arrivals import ArrivalSource, Plan
from prefixshield.simulator.engine import Engine, _Chunks
from prefixshield.simulator.records import build_records


class _ChunkCache:
    """Token ids and block hashes of the whole trace for every replica: the last
    `KEEP` chunks built (`_Chunks`, each a run of
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
        the same values `_Chunks` gives a single engine)."""
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
        chunks: the fleet's token ids and block hashes (`_ChunkCache`).
    """

    SHARED = tuple(f.name for f in rq.TRACE_FIELDS + rq.RESULT_FIELDS
                   if f.name not in ("request_id", "role", "measured")) + (rq.STATE_MATRIX,)
    """The declared per-request arrays (`prefixshield.simulator.requests`) every replica
    holds as the template's own (``request_id``, ``role``, ``measured`` are read from the
    shared trace)."""

    def __init__(self, template: "LockstepReplica") -> None:
        self.template = template
        self.chunks = _ChunkCache(template)
        self._records: pd.DataFrame | None = None

    def check(self, replica: Engine) -> None:
        """Raise ``AssertionError`` unless ``replica`` holds the template's arrays
        (`SHARED`)."""
        for name in self.SHARED:
            if getattr(replica, name) is not getattr(self.template, name):
                raise AssertionError(f"replica's {name} is not the shared rows'")

    def records(self) -> pd.DataFrame:
        """Every row's record (built once, after every replica has finished)."""
        if self._records is None:
            self._records = build_records(self.template)
        return self._records


class RoutedArrivals(ArrivalSource):
    """A lockstep replica's arrivals (an `ArrivalSource`):
    the rows the router sends it (`deliver`), in arrival order, each at
    its ``arrival_s``. Where a single engine would look ahead at its next arrival, this one
    waits on a `Slot` until the router decides (see the
    module docstring).

    Attributes:
        fed: rows routed here that have not arrived yet (arrival order).
        closed: no row will be routed any more.
        slot: the arrival process waits for its next row (None: it does not).
        deferred: ``(plan, slot)`` of a decode jump waiting for the router (None: none).
        deferred_jumps: decode jumps that waited for the router (tests read it).
    """

    def __init__(self) -> None:
        self.fed: deque[int] = deque()
        self.closed = False
        self.slot: Slot | None = None
        self.deferred = None
        self.deferred_jumps = 0
        self.unadmitted: list[int] = []  # arrived rows maybe not admitted yet (pruned lazily)

    def bind(self, engine: Engine) -> None:
        super().bind(engine)
        self.arrival_s = engine.arrival_s

    def process(self):
        engine = self.engine
        env = engine.env
        fed, arrival_s = self.fed, self.arrival_s
        while True:
            if fed:
                delay = arrival_s[fed[0]] - env.now
                if delay > 0:
                    yield env.timeout(delay)
            elif self.closed:
                return
            else:
                self.slot = Slot(env)
                yield self.slot.event
            i = fed.popleft()
            engine.arrive(i)
            self.unadmitted.append(i)

    def left(self) -> bool:
        return bool(self.fed) or not self.closed

    def next_wait(self) -> float | None:
        return self.arrival_s[self.fed[0]] - self.engine.env.now if self.fed else None

    def jump(self, plan: Plan):
        if self.fed or self.closed:  # the next arrival is known: a single engine's jump
            return (yield from self.take_jump(plan, self.next_wait()))
        slot = Slot(self.engine.env)
        self.deferred = (plan, slot)
        self.deferred_jumps += 1
        return (yield slot.event)

    def _resolve_jump(self, wait: float | None) -> None:
        plan, slot = self.deferred
        self.deferred = None
        k, seconds = plan(wait)
        if k > 0:
            self.engine.num_events += 1  # as take_jump counts a jump it takes
            slot.fire(seconds, k)
        else:
            slot.fire(0.0, 0)

    def jump_settles(self, t: float) -> bool:
        """If a decode jump waits for the router and an arrival at ``t`` (or any later one)
        would leave its length what no arrival gives, settle it now; returns whether it did."""
        if self.deferred is None:
            return False
        plan, slot = self.deferred
        if plan(t - slot.at) != plan(None):
            return False
        self._resolve_jump(None)
        return True

    def horizon(self, t: float) -> float:
        """Events before this time come before an arrival at ``t`` routed here: ``t`` as the
        waiting arrival process will compute it (``then + (t - then)``)."""
        return min(t, self.slot.at + (t - self.slot.at)) if self.slot is not None else t

    def deliver(self, row: int) -> None:
        """Row ``row`` (arriving at or after every row delivered before) is routed here."""
        self.fed.append(row)
        t = self.arrival_s[row]
        if self.deferred is not None:
            self._resolve_jump(t - self.deferred[1].at)
        if self.slot is not None:
            slot, self.slot = self.slot, None
            slot.fire(max(t - slot.at, 0.0))

    def close(self) -> None:
        """No more rows: settle a waiting jump."""
        self.closed = True
        if self.deferred is not None:
            self._resolve_jump(None)


class LockstepReplica(Engine):
    """An engine over the whole ``trace`` that serves only the rows delivered to it (its
    arrival source a `RoutedArrivals`).

    Args: those of `Engine` (``fused`` is forced off), and ``shared``: the
    `shared` of the run's first replica (built over the same trace, cost, config and
    contracts), whose per-request arrays this one then uses (`Engine`'s ``rows_of``);
    None: this is the first. Call `start`, then `advance` / `deliver` in
    arrival order, then `close` and `finish`.
    """

    def __init__(self, *args, shared: SharedRows | None = None, **kwargs) -> None:
        kwargs["fused"] = False
        routed = kwargs["arrivals"] = RoutedArrivals()
        if shared is None:
            super().__init__(*args, **kwargs)
            self.shared = SharedRows(self)
        else:
            super().__init__(*args, rows_of=shared.template, **kwargs)
            self.shared = shared
            shared.check(self)
        self.routed = routed
        if self.batched:
            self._head_chunks = self._arrival_chunks = self.shared.chunks
        self.rows: list[int] = []  # the rows routed here, in order
        self.done = None

    @property
    def deferred_jumps(self) -> int:
        """Decode jumps that waited for the router."""
        return self.routed.deferred_jumps

    def jump_waits(self) -> bool:
        """Whether a decode jump of this replica waits for the router."""
        return self.routed.deferred is not None

    def records(self) -> pd.DataFrame:
        """The records of the rows routed here, in trace order."""
        return self.shared.records().iloc[self.rows].reset_index(drop=True)

    # ---------------------------------------------------------------- driven by the fleet
    def start(self) -> None:
        """Create the processes, in the single engine's order (arrivals first)."""
        self.done = super().start()

    def horizon(self, t: float) -> float:
        """`RoutedArrivals.horizon`."""
        return self.routed.horizon(t)

    def jump_settles(self, t: float) -> bool:
        """`RoutedArrivals.jump_settles`."""
        return self.routed.jump_settles(t)

    def advance(self, t: float) -> None:
        """Process every event before an arrival at ``t`` could be (settling decode jumps
        that no arrival can shorten)."""
        env = self.env
        routed = self.routed
        limit = routed.horizon(t)
        while True:
            while env.peek() < limit:
                env.step()
            if not routed.jump_settles(t):
                return

    def deliver(self, row: int) -> None:
        """Row ``row`` (arriving at or after every row delivered before) is routed here."""
        self.rows.append(row)
        self.routed.deliver(row)

    def close(self) -> None:
        """No more rows: settle a waiting jump, let an idle engine see it is done."""
        self.routed.close()
        self._wake()

    def finish(self) -> None:
        """Run to the end (after `close`); an error of the engine is raised here."""
        self.env.run(until=self.done)

    # ---------------------------------------------------------------- what routers read
    def num_requests(self) -> int:
        # waiting requests are in the scheduler's queue under any scheduler but plain FCFS
        # (and on the step-by-step path), else in self.waiting
        waiting = len(self.scheduler) if self._scheduler_queue else len(self.waiting)
        return waiting + len(self.routed.fed) + len(self.running)

    def cached_prefix_blocks(self, hashes: np.ndarray) -> int:
        return self.pool.cached_prefix_length(hashes, hashes.shape[0])

    def pending_prefill_tokens(self) -> int:
        routed = self.routed
        routed.unadmitted = [i for i in routed.unadmitted if self.cached_tokens[i] < 0]
        total = 0
        for i in routed.unadmitted:
            total += int(self.prompt_tokens[i] - self.arrival_cached_tokens[i])
        for i in routed.fed:
            total += int(self.prompt_tokens[i])
        for s in self.running:
            done = (int(self._state[s.request_id, bk.COMPUTED]) if self.batched
                    else s.num_computed_tokens)
            total += max(0, s.num_prompt_tokens - done)
        return total

    def held_blocks(self) -> int:
        # a Python sum of a few groups' counts: numpy's reduction costs more at this size
        return sum(self.kv.held.tolist())
