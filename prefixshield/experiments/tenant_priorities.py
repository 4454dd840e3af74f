"""Scheduler priorities that a trace carries (a tenant map's ``priority`` column)."""

from __future__ import annotations

from dataclasses import replace


def with_trace_priorities(spec, trace):
    """``(spec, used)``: under ``--scheduler priority`` with no ``--priority`` given, ``spec``
    with the priorities the trace's import recorded (``meta["priorities"]``, group -> int, from
    a tenant map), restricted to the trace's groups; otherwise ``spec`` unchanged. ``used`` is
    the dict applied (empty when none)."""
    prio = dict(trace.meta.get("priorities") or {})
    sched = spec.engine.scheduler
    if not prio or sched.name != "priority" or sched.priorities:
        return spec, {}
    known = set(trace.group_names())
    prio = {g: int(p) for g, p in prio.items() if g in known}
    engine = replace(spec.engine, scheduler=replace(sched, priorities=tuple(prio.items())))
    return replace(spec, engine=engine), prio
