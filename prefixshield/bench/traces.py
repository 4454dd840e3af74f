"""Traces: building a generated trace against simulating it, and the memory of a long run.

1. *Build vs simulate* (rows ``build`` and ``simulate + lru``): the scale section's cheap
   ``one_touch`` (:data:`~prefixshield.bench.scale.ENGINE_OVERRIDES` at
   :data:`~prefixshield.bench.scale.ENGINE_BLOCKS` blocks: 128-token prefixes, one output
   token) lengthened until it holds about 10^4, 10^5 and 10^6 requests (``--quick``: 10^3,
   4 x 10^3, 1.6 x 10^4). ``build``: wall seconds of
   :func:`~prefixshield.experiments.single.build_trace` (the generator, the validated
   :class:`~prefixshield.traces.schema.Trace`, the scheduler check), best of ``repeats``;
   ``simulate + lru``: wall seconds of ``Engine.run`` under LRU on that trace (the fused
   loop; best of ``repeats``), the single-engine figure of the same run. Each row gives
   microseconds per request and the build row its ratio to the simulation (``build /
   simulate``: at most 1 is the goal "building is no slower than simulating"). The engine's
   construction (per-request arrays from the trace) is reported apart, in ``detail``.
2. *Long run* (row ``long run``): one process builds a trace of :data:`LONG_REQUESTS`
   (8 x 10^6) requests (``--quick``: :data:`QUICK_LONG_REQUESTS`) and simulates it under
   LRU; its peak resident set size (``ru_maxrss`` of the child process) after the build and
   after the run, and both wall times. The fused loop holds block hashes and tables a window at a time
   (``Engine.FUSED_WINDOW_HASHES``); what still grows with the trace is the trace itself (a
   pandas frame, two small arrays per request) and the engine's per-request arrays and
   records, so the figure is stated per request too.

Each part starts with an untimed warm-up (kernels loaded). No number is asserted.
"""

from __future__ import annotations

import gc
import json
import math
import subprocess
import sys
import time

from prefixshield.bench.common import Column, SectionResult, Tick, no_progress, ratio
from prefixshield.bench.scale import (ENGINE_BLOCKS, ENGINE_OVERRIDES, ENGINE_PROFILE,
                                      engine_setup)

SIZES = (10_000, 100_000, 1_000_000)
QUICK_SIZES = (1_000, 4_000, 16_000)
LONG_REQUESTS = 8_000_000
"""Requests of the long run (about a minute of a bench run): the largest round size this
workload may generate, not 10^7: one generated stream holds at most
``prefixshield.edges.MAX_REQUESTS`` (5 x 10^6) requests, and the victim's stream is ~54% of
this trace's requests (a 10^7-request trace is refused before anything is drawn)."""
QUICK_LONG_REQUESTS = 100_000
LONG_TIMEOUT_S = 1800.0
"""The long run is abandoned (and its row says so) past this many seconds."""
PILOT_DURATION_S = 100.0


def cheap_trace(duration_s: float):
    """The scale section's cheap ``one_touch`` with a measured phase of ``duration_s``."""
    from prefixshield.experiments.single import RunSpec, build_trace
    from prefixshield.simulator.config import EngineConfig
    from prefixshield.simulator.costmodel import load_profile

    spec = RunSpec("one_touch", ("lru",), EngineConfig(num_blocks=ENGINE_BLOCKS),
                   load_profile(ENGINE_PROFILE),
                   overrides={**ENGINE_OVERRIDES, "duration_s": float(duration_s)})
    return build_trace(spec)[0]


def duration_for(requests: int) -> float:
    """Measured-phase seconds that give about ``requests`` requests (from a pilot trace)."""
    pilot = cheap_trace(PILOT_DURATION_S)
    warmup = int((~pilot.requests["measured"].to_numpy()).sum())
    rate = (len(pilot) - warmup) / PILOT_DURATION_S
    return max(1.0, (requests - warmup) / rate)


def lru_engine(trace):
    """A fresh single engine under LRU for ``trace`` (the scale section's configuration)."""
    from prefixshield.policies import make_policy
    from prefixshield.simulator.config import EngineConfig
    from prefixshield.simulator.costmodel import load_profile
    from prefixshield.simulator.engine import Engine

    return Engine(trace, make_policy("lru", ENGINE_BLOCKS), load_profile(ENGINE_PROFILE).cost,
                  EngineConfig(num_blocks=ENGINE_BLOCKS))


def build_rows(sizes, repeats: int, tick: Tick) -> list[dict]:
    """``build`` and ``simulate + lru`` rows at each target size."""
    lru_engine(cheap_trace(PILOT_DURATION_S)).run()   # warm-up: kernels loaded
    rows: list[dict] = []
    for target in sizes:
        tick(f"traces: build and simulate, {target:,} requests")
        duration = duration_for(target)
        build_s, trace = math.inf, None
        for _ in range(repeats):
            trace = None
            gc.collect()
            t0 = time.perf_counter()
            trace = cheap_trace(duration)
            build_s = min(build_s, time.perf_counter() - t0)
        n = len(trace)
        run_s, init_s, windows = math.inf, math.inf, 0
        for _ in range(repeats):
            t0 = time.perf_counter()
            engine = lru_engine(trace)
            t1 = time.perf_counter()
            engine.run()
            t2 = time.perf_counter()
            init_s, run_s = min(init_s, t1 - t0), min(run_s, t2 - t1)
            windows = engine.num_windows
            del engine
        rows.append({"part": "build", "size": n, "wall_s": build_s,
                     "us_per_request": build_s / n * 1e6,
                     "vs_simulate": ratio(build_s, run_s),
                     "detail": "generator + validated Trace + scheduler check"})
        rows.append({"part": "simulate + lru", "size": n, "wall_s": run_s,
                     "us_per_request": run_s / n * 1e6, "vs_simulate": 1.0,
                     "detail": f"Engine.run, fused, {windows} window(s); Engine() took "
                               f"{init_s / n * 1e6:.3f} us/request"})
        del trace
        gc.collect()
    return rows


def long_run(requests: int) -> dict:
    """Build a trace of about ``requests`` requests and simulate it under LRU, in this process;
    returns the wall times and the peak RSS (bytes) after each (run it in a fresh process:
    the peak is the process's own)."""
    import resource

    def peak() -> int:
        kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(kib) * (1 if sys.platform == "darwin" else 1024)

    duration = duration_for(requests)
    gc.collect()
    start = peak()
    t0 = time.perf_counter()
    trace = cheap_trace(duration)
    build_s = time.perf_counter() - t0
    after_build = peak()
    engine = lru_engine(trace)
    t0 = time.perf_counter()
    engine.run()
    run_s = time.perf_counter() - t0
    return {"requests": len(trace), "build_s": build_s, "run_s": run_s,
            "peak_rss_start": start, "peak_rss_after_build": after_build,
            "peak_rss_after_run": peak(), "windows": engine.num_windows,
            "fused": bool(engine.fused_applies())}


def long_row(requests: int) -> dict:
    """The ``long run`` row: :func:`long_run` in a child process (its own peak RSS)."""
    code = ("import json, sys; from prefixshield.bench.traces import long_run; "
            f"print(json.dumps(long_run({int(requests)})))")
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=LONG_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"part": "long run", "size": requests, "wall_s": None, "us_per_request": None,
                "vs_simulate": None, "detail": f"abandoned past {LONG_TIMEOUT_S:g} s"}
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return {"part": "long run", "size": requests, "wall_s": None, "us_per_request": None,
                "vs_simulate": None, "detail": f"failed (exit {out.returncode}): {last}"}
    r = json.loads(out.stdout.strip().splitlines()[-1])
    n = r["requests"]
    mib = 1 << 20
    return {"part": "long run", "size": n, "wall_s": r["build_s"] + r["run_s"],
            "us_per_request": (r["build_s"] + r["run_s"]) / n * 1e6,
            "vs_simulate": ratio(r["build_s"], r["run_s"]),
            "peak_rss_mib": r["peak_rss_after_run"] / mib,
            "rss_bytes_per_request": (r["peak_rss_after_run"] - r["peak_rss_start"]) / n,
            "detail": (f"build {r['build_s']:.1f} s ({r['build_s'] / n * 1e6:.2f} us/request), "
                       f"run {r['run_s']:.1f} s ({r['run_s'] / n * 1e6:.2f} us/request, "
                       f"{'fused' if r['fused'] else 'per-step'}, {r['windows']} windows); "
                       f"peak RSS {r['peak_rss_start'] / mib:,.0f} MiB at start, "
                       f"{r['peak_rss_after_build'] / mib:,.0f} MiB after the build, "
                       f"{r['peak_rss_after_run'] / mib:,.0f} MiB after the run")}


COLUMNS = [Column("part", "part"), Column("size", "requests", ","),
           Column("wall_s", "wall s", ".3f"), Column("us_per_request", "us/request", ".3f"),
           Column("vs_simulate", "vs simulate", ".2f", "x"),
           Column("peak_rss_mib", "peak RSS MiB", ",.0f"),
           Column("rss_bytes_per_request", "RSS B/request", ",.0f"),
           Column("detail", "detail")]


def steps(quick: bool) -> int:
    """Progress steps this section announces."""
    return len(QUICK_SIZES if quick else SIZES) + 1


def run(quick: bool = False, tick: Tick = no_progress) -> SectionResult:
    """Both parts (see the module docstring); ``quick``: small sizes, one repeat."""
    res = SectionResult(
        "traces", "traces: building a generated trace vs simulating it under LRU (us per "
                  "request; vs simulate = build / simulate), and the peak RSS of a long run",
        list(COLUMNS))
    repeats = 1 if quick else 2
    res.rows.extend(build_rows(QUICK_SIZES if quick else SIZES, repeats, tick))
    long_n = QUICK_LONG_REQUESTS if quick else LONG_REQUESTS
    tick(f"traces: long run, {long_n:,} requests")
    res.rows.append(long_row(long_n))
    for row in res.rows:
        for k in ("peak_rss_mib", "rss_bytes_per_request"):
            row.setdefault(k, None)
    res.extra.update(engine_setup(), repeats=repeats, long_requests=long_n)
    res.notes.append(
        f"one_touch at {ENGINE_BLOCKS:,} blocks ({ENGINE_PROFILE}), 128-token prefixes, 1 "
        f"output token (the scale section's workload); build and simulate: best of {repeats} "
        f"wall times each, the same trace; long run: one child process, build + Engine.run "
        f"under LRU, its peak RSS (ru_maxrss)")
    return res
