"""Fleet: a fleet run's time and memory per request against one engine on the same trace.

The scale section's cheap ``one_touch`` (`ENGINE_OVERRIDES`
at `ENGINE_BLOCKS` blocks: 128-token prefixes, one output
token), lengthened to about `REQUESTS` (10^6) requests (``--quick``: a measured phase
of `QUICK_DURATION_S`, about 1,600 requests), under LRU. Rows, each in a fresh child
process (its own peak RSS, ``VmHWM``: `peak_rss`), each
building the same trace, loading its kernels on a small run first (untimed), then timing the
run:

* ``single engine`` (the anchor): ``Engine.run`` on the whole trace (the fused loop);
* ``split round_robin``: `REPLICAS` (16) replicas of that engine, each running its
  share as an ordinary engine, one after another in the process;
* ``split round_robin, process``: the same on the process executor with `WORKERS`
  workers (the driver's peak RSS and, in ``detail``, the largest worker's ``VmHWM``);
* ``lockstep least_loaded``: the replicas in one compiled loop, the router reading their
  queues at every arrival (`prefixshield.fleet.fused`: each replica's fused loop takes
  the rows the router sends it);
* ``lockstep kv_aware``: the same with the router reading every replica's pool, pending
  prefill and held blocks at every arrival;
* ``lockstep least_loaded, Python loop``: the first lockstep row on the Python loop
  (`prefixshield.fleet.lockstep`: each replica a SimPy engine on the per-step path), what a
  fleet ledger or a third-party router runs on.

Each row gives wall seconds of the run (``run_fleet`` or ``Engine.run``; the trace build is
not timed), microseconds per request, its ratio to the single engine's (``vs single``) and,
for the lockstep rows, to the split run's in this process (``vs split``), the
process's CPU microseconds per request (the driver's only, on the process executor), and the
peak RSS. A lockstep row that would pass `LOCKSTEP_TIMEOUT_S` is abandoned and says
so (nothing is extrapolated). ``--quick`` runs the rows in this process (seconds; no RSS).
No number is asserted.
"""

from __future__ import annotations

import functools
import sys
import time

from prefixshield.bench.common import (Column, SectionResult, Tick, child_json, no_progress,
                                       peak_rss, ratio)
from prefixshield.bench.scale import ENGINE_BLOCKS, ENGINE_PROFILE, engine_setup
from prefixshield.bench.traces import cheap_trace, duration_for

REQUESTS = 1_000_000
REPLICAS = 16
QUICK_REPLICAS = 4
WORKERS = 2
"""Process-executor workers (the bench machines have 2 cores)."""
ROWS = (("single engine", None, None, None), ("split round_robin", "split", "round_robin", None),
        ("split round_robin, process", "split", "round_robin", "process"),
        ("lockstep least_loaded", "lockstep", "least_loaded", None),
        ("lockstep kv_aware", "lockstep", "kv_aware", None),
        ("lockstep least_loaded, Python loop", "lockstep", "least_loaded", "python"))
"""``(part, fleet mode, router, executor)`` of each row (mode None: one engine; executor
``python``: a lockstep run on the Python loop)."""
TIMEOUT_S = 1800.0
"""A child is abandoned (and its row says so) past this many seconds."""
LOCKSTEP_TIMEOUT_S = 1800.0
"""The lockstep rows' limit (the Python loop's took about 90 s at 10^6 requests and 16
replicas here, 2026-12-03)."""
QUICK_DURATION_S = 8.0
"""Measured-phase seconds of the warm-up trace and of the ``--quick`` sizing's pilot."""


def _workers_peak(executor) -> int | None:
    """The largest peak RSS in bytes (``VmHWM``) of a process executor's live workers; None
    where it cannot be read (not Linux, another executor). The workers are the forkserver's
    children, not this process's: ``RUSAGE_CHILDREN`` does not see them."""
    pool = getattr(executor, "_pool", None)
    peaks = []
    for pid in list(getattr(pool, "_processes", None) or {}):
        try:
            with open(f"/proc/{pid}/status") as f:
                peaks += [int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM")]
        except OSError:
            continue
    return max(peaks) if peaks else None


def _run_once(trace, mode: str | None, router: str | None, replicas: int, executor) -> None:
    """One engine (``mode`` None) or one fleet run of ``trace`` under LRU, on ``executor``
    (an executor, None, or ``"python"``: a lockstep run on the Python loop)."""
    from prefixshield.bench.traces import lru_engine
    from prefixshield.fleet.config import FleetConfig
    from prefixshield.fleet.routers.base import RouterConfig
    from prefixshield.fleet.run import run_fleet
    from prefixshield.policies import make_policy
    from prefixshield.simulator.config import EngineConfig
    from prefixshield.simulator.costmodel import load_profile
    from prefixshield.tenancy import DEFAULT_CONTRACTS

    if mode is None:
        lru_engine(trace).run()
        return
    fleet = FleetConfig(replicas, router=RouterConfig(name=router), mode=mode)
    python = executor == "python"
    run_fleet(trace, functools.partial(make_policy, "lru", ENGINE_BLOCKS),
              load_profile(ENGINE_PROFILE).cost, EngineConfig(num_blocks=ENGINE_BLOCKS),
              DEFAULT_CONTRACTS, fleet, None if python else executor, fused=not python)


def measure(requests: int, replicas: int, mode: str | None, router: str | None,
            executor: str | None, workers: int = WORKERS, quick: bool = False) -> dict:
    """Build the cheap trace of about ``requests`` requests and time one run of it (see the
    module doc) in this process; returns ``requests``, ``build_s``, ``run_s``, ``cpu_s`` and
    the peak RSS in bytes at the start, after the build and after the run (``worker_peak``:
    the largest worker's, on the process executor). Run it in a fresh process for its peak."""
    from prefixshield.experiments.executors import make_executor

    start = peak_rss()
    t0 = time.perf_counter()
    trace = cheap_trace(QUICK_DURATION_S if quick else duration_for(requests))
    build_s = time.perf_counter() - t0
    after_build = peak_rss()
    ex = make_executor(executor, workers) if executor not in (None, "python") else None
    on = "python" if executor == "python" else ex
    try:
        # untimed: kernels loaded here and in the workers
        _run_once(cheap_trace(QUICK_DURATION_S), mode, router, replicas, on)
        c0, t0 = time.process_time(), time.perf_counter()
        _run_once(trace, mode, router, replicas, on)
        run_s, cpu_s = time.perf_counter() - t0, time.process_time() - c0
        worker_peak = _workers_peak(ex)
    finally:
        if ex is not None:
            ex.close()
    return {"requests": len(trace), "build_s": build_s, "run_s": run_s, "cpu_s": cpu_s,
            "peak_start": start, "peak_after_build": after_build,
            "peak_after_run": peak_rss(), "worker_peak": worker_peak}


def _child(requests: int, replicas: int, mode, router, executor, timeout_s: float) -> dict:
    """`measure` in a child process (`child_json`)."""
    args = ", ".join(repr(a) for a in (requests, replicas, mode, router, executor))
    return child_json("import json; from prefixshield.bench.fleet import measure; "
                      f"print(json.dumps(measure({args})))", timeout_s)


COLUMNS = [Column("part", "part"), Column("size", "requests", ","),
           Column("replicas", "replicas", ","), Column("wall_s", "wall s", ".2f"),
           Column("us_per_request", "us/request", ".2f"),
           Column("vs_single", "vs single", ".1f", "x"),
           Column("vs_split", "vs split", ".1f", "x"),
           Column("cpu_us_per_request", "CPU us/request", ".2f"),
           Column("peak_rss_mib", "peak RSS MiB", ",.0f"), Column("detail", "detail")]


def steps(quick: bool) -> int:
    """Progress steps this section announces (a row each)."""
    return len(ROWS)


def _row(part: str, replicas: int, m: dict, single_us: float | None) -> dict:
    """A table row from `measure`'s figures (or its error); ``single_us``: the single
    engine's us/request (None: this is that row, or it failed)."""
    if "error" in m:
        return {"part": part, "size": None, "replicas": replicas, "wall_s": None,
                "us_per_request": None, "vs_single": None, "vs_split": None,
                "cpu_us_per_request": None,
                "peak_rss_mib": None, "detail": m["error"]}
    n, mib = m["requests"], 1 << 20
    us = m["run_s"] / n * 1e6
    peak = None
    if m["peak_after_run"]:
        peak = m["peak_after_run"] / mib
        detail = (f"trace built in {m['build_s']:.1f} s (untimed); peak RSS "
                  f"{m['peak_start'] / mib:,.0f} MiB at start, "
                  f"{m['peak_after_build'] / mib:,.0f} MiB after the build")
    else:
        # --quick: the rows share this process (and its trace): no build time or peak apart
        detail = "in-process under --quick: peak RSS not measured"
    if m.get("worker_peak"):
        detail += f"; largest worker's peak RSS {m['worker_peak'] / mib:,.0f} MiB"
    return {"part": part, "size": n, "replicas": replicas, "wall_s": m["run_s"],
            "us_per_request": us,
            "vs_single": ratio(us, single_us) if single_us else None, "vs_split": None,
            "cpu_us_per_request": m["cpu_s"] / n * 1e6, "peak_rss_mib": peak,
            "detail": detail}


def run(quick: bool = False, tick: Tick = no_progress) -> SectionResult:
    """Every row (see the module docstring); ``quick``: a small trace, in this process."""
    res = SectionResult(
        "fleet", "fleet: split and lockstep runs vs one engine on the same trace (us per "
                 "request; vs single = fleet / single engine; vs split = lockstep / split "
                 "round_robin), peak RSS of each",
        list(COLUMNS))
    n = REQUESTS
    replicas = QUICK_REPLICAS if quick else REPLICAS
    single_us = split_us = None
    for part, mode, router, executor in ROWS:
        tick(f"fleet: {part}" + ("" if quick else f", {n:,} requests"))
        if quick:
            m = measure(n, replicas, mode, router, executor, quick=True)
            m["peak_after_run"] = m["worker_peak"] = None
        else:
            limit = LOCKSTEP_TIMEOUT_S if mode == "lockstep" else TIMEOUT_S
            m = _child(n, replicas, mode, router, executor, limit)
        row = _row(part, 1 if mode is None else replicas, m, single_us)
        if mode is None and row["us_per_request"]:
            single_us, row["vs_single"] = row["us_per_request"], 1.0
        if mode == "split" and executor is None and row["us_per_request"]:
            split_us, row["vs_split"] = row["us_per_request"], 1.0
        elif mode == "lockstep" and split_us and row["us_per_request"]:
            row["vs_split"] = ratio(row["us_per_request"], split_us)
        res.rows.append(row)
    res.extra.update(engine_setup(), replicas=replicas, workers=WORKERS)
    res.notes.append(
        f"one_touch at {ENGINE_BLOCKS:,} blocks per engine ({ENGINE_PROFILE}), 128-token "
        f"prefixes, 1 output token, LRU; one timed run per row after an untimed warm-up; "
        f"the process row uses {WORKERS} workers; "
        + ("--quick: rows in this process" if quick else
           "each row a fresh child process (peak RSS: its own VmHWM)"))
    return res
