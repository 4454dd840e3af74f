"""Events whose place in SimPy's order is taken before their time is known.

SimPy processes the events of one instant in the order they were scheduled (its queue is a
heap keyed by ``(time, priority, event id)``, the id counting up at every scheduling). A
single engine schedules its next arrival's timeout right after the previous arrival, and its
decode jump's timeout when the jump starts; a fleet replica learns the time of either only
later, when the router sends it a request. A `Slot` takes the event id at the moment the
single engine would have scheduled, and `Slot.fire` puts the event in the queue with that
id and the time the single engine would have computed (``then + delay``, the same float
operation), so the replica processes its events in exactly the single engine's order.

This reads two attributes of `simpy.Environment` that are not public API
(``_eid``, ``_queue``; SimPy 4); the fleet's identity tests break if they change.
"""

from __future__ import annotations

from heapq import heappush

import simpy
from simpy.events import NORMAL


class Slot:
    """An untriggered event holding the next event id of ``env`` and the time it was taken."""

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self.event = env.event()
        self.eid = next(env._eid)
        self.at = env.now

    def fire(self, delay: float, value=None) -> None:
        """Trigger the event at ``at + delay`` seconds (``delay >= 0``), ordered by its id."""
        ev = self.event
        ev._ok = True
        ev._value = value
        heappush(self.env._queue, (self.at + delay, NORMAL, self.eid, ev))
