"""Arrival sources: which of an engine's trace rows arrive, and when.

An [`Engine`][prefixshield.simulator.engine.Engine] (on its SimPy paths: step-by-step and
per-step batched) asks its arrival source four things, and nothing else about arrivals:

* `ArrivalSource.process`: the SimPy process that makes the rows arrive, each at its
  time, through [`Engine.arrive`][prefixshield.simulator.engine.Engine.arrive] (which
  puts the row in the engine's waiting requests, records the prefix cached at arrival and
  wakes an idle engine);
* `ArrivalSource.left`: whether any row is still to arrive (an engine with nothing
  running or waiting ends when none is; a waiting head that cannot fit with nothing running
  is an error when none is);
* `ArrivalSource.next_wait`: the seconds from now to the next arrival (None: none is
  left, or its time is not known yet);
* `ArrivalSource.jump`: a coalesced decode jump bounded by the next arrival: the
  engine's ``plan(wait)`` gives the jump's steps and seconds from that wait, and the source
  takes the jump (a SimPy generator returning the steps taken).

`TraceArrivals` is every row of the engine's trace in order (what an engine uses
unless given another source). A fleet replica in lockstep mode uses
`RoutedArrivals`: the rows the router sends it, whose next
arrival is not known until the router decides. A streamed run feeds the fused loop windows of
rows instead (`prefixshield.simulator.stream`), whose arrivals are the windows' rows.

A source serves one engine's run: `ArrivalSource.bind` is called with the engine when
its run state is built (before any process starts).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Callable, Generator

if TYPE_CHECKING:  # the engine imports this module
    from prefixshield.simulator.engine import Engine

Plan = Callable[[float | None], tuple[int, float]]
"""A decode jump's plan: from the wait (s) until the next arrival (None: no arrival bounds it)
the number of steps to take and their seconds (0 steps: no jump)."""


class ArrivalSource(ABC):
    """Which rows arrive at one engine and when (see the module docstring).

    Subclasses give `process`, `left` and `next_wait`; `jump`'s
    default bounds a jump by `next_wait`, as a single engine does.
    """

    engine: "Engine"

    def bind(self, engine: "Engine") -> None:
        """Serve ``engine``'s run (called when its run state is built)."""
        self.engine = engine

    @abstractmethod
    def process(self) -> Generator:
        """The SimPy arrival process: yields the timeouts until each row's arrival time and
        calls [`Engine.arrive`][prefixshield.simulator.engine.Engine.arrive] with the row
        then, in arrival order; it returns when no row is left."""

    @abstractmethod
    def left(self) -> bool:
        """Whether a row is still to arrive."""

    @abstractmethod
    def next_wait(self) -> float | None:
        """Seconds from the engine's now to the next arrival (``arrival_s[row] - now``), None
        when none is left or its time is unknown."""

    def jump(self, plan: Plan) -> Generator:
        """Take a coalesced decode jump (a generator: ``k = yield from source.jump(plan)``):
        ``plan(self.next_wait())`` gives its steps ``k`` and seconds; a jump of ``k > 0`` steps
        counts as one engine event (``num_events``) and lasts its seconds (one SimPy timeout).
        Returns the steps taken, 0 for none."""
        return (yield from self.take_jump(plan, self.next_wait()))

    def take_jump(self, plan: Plan, wait: float | None) -> Generator:
        """The jump ``plan(wait)`` gives, taken now (see `jump`)."""
        k, seconds = plan(wait)
        if k <= 0:
            return 0
        engine = self.engine
        engine.num_events += 1
        yield engine.env.timeout(seconds)
        return k


class TraceArrivals(ArrivalSource):
    """Every row of the engine's trace, in order, each at its ``arrival_s``.

    Attributes:
        next_row: rows that have arrived so far (the next to arrive is this row).
    """

    def __init__(self) -> None:
        self.next_row = 0

    def bind(self, engine: "Engine") -> None:
        super().bind(engine)
        self.arrival_s = engine.arrival_s
        self.next_row = 0

    def process(self) -> Generator:
        engine = self.engine
        env = engine.env
        arrival_s = self.arrival_s
        for i in range(len(arrival_s)):
            delay = arrival_s[i] - env.now
            if delay > 0:
                yield env.timeout(delay)
            engine.arrive(i)
            self.next_row = i + 1

    def left(self) -> bool:
        return self.next_row < len(self.arrival_s)

    def next_wait(self) -> float | None:
        if self.next_row < len(self.arrival_s):
            return self.arrival_s[self.next_row] - self.engine.env.now
        return None
