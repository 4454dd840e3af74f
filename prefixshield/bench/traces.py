"""Traces: building a generated trace against simulating it, and the memory of a long run.

1. *Build vs simulate* (rows ``build`` and ``simulate + lru``): the scale section's cheap
   ``one_touch`` (`ENGINE_OVERRIDES` at
   `ENGINE_BLOCKS` blocks: 128-token prefixes, one output
   token) lengthened until it holds about 10^4, 10^5 and 10^6 requests (``--quick``: 10^3,
   4 x 10^3, 1.6 x 10^4). ``build``: wall seconds of
   [`build_trace`][prefixshield.experiments.single.build_trace] (the generator, the validated
   [`Trace`][prefixshield.traces.schema.Trace], the scheduler check), best of ``repeats``;
   ``simulate + lru``: wall seconds of ``Engine.run`` under LRU on that trace (the fused
   loop; best of ``repeats``), the single-engine figure of the same run. Each row gives
   microseconds per request and the build row its ratio to the simulation (``build /
   simulate``: at most 1 is the goal "building is no slower than simulating"). The engine's
   construction (per-request arrays from the trace) is reported apart, in ``detail``.
2. *Long runs* (rows ``long run``): one child process per row generates a long trace of the
   same workload at load `LONG_ALPHA` and simulates it under LRU, reporting its peak
   resident set size (the child's own ``VmHWM``, see
   `peak_rss`) at the start, after the build and after the
   run, and the wall times. Rows ``long run, streamed`` at
   `LONG_SIZES` (10^6 and 10^7 requests; ``--quick``: `QUICK_LONG_SIZES`, and no
   unstreamed row): the trace generated a window of time at a time and run by
   `StreamedRun` (records and series written to a
   temporary folder as the run goes; its build is only the stream's setup, the
   windows are drawn inside the run), then the summary from the files, whose peak is given
   apart (it holds one column of the judged population whole). Equal peaks at both sizes are
   the point: memory does not grow with the trace. Row ``long run`` at the smaller size: the
   same trace built whole and run by ``Engine.run``, for its microseconds per request and
   its memory per request. The unstreamed 8 x 10^6-request row this section had (6.5 GiB
   peak) is dropped: its figure is that row's bytes per request times the length, and a
   10^7-request trace cannot be built in memory (``prefixshield.edges.MAX_REQUESTS`` caps a
   generated stream at 5 x 10^6).

   Load 0.4, not the build rows' 0.6: at 0.6 the attacker's flood (1.15 x the victim's rate)
   overloads this engine, its waiting queue grows with the trace, and a queue that grows holds
   more requests in any design (the streamed window holds every waiting request). At 0.4 the
   total is ~0.86 of C_prefill and the queue stays short.

Each part starts with an untimed warm-up (kernels loaded). No number is asserted.
"""

from __future__ import annotations

import gc
import math
import time

from prefixshield.bench.common import (Column, SectionResult, Tick, child_json, no_progress,
                                       peak_rss, ratio)
from prefixshield.bench.scale import (ENGINE_BLOCKS, ENGINE_OVERRIDES, ENGINE_PROFILE,
                                      engine_setup)

SIZES = (10_000, 100_000, 1_000_000)
QUICK_SIZES = (1_000, 4_000, 16_000)
LONG_SIZES = (1_000_000, 10_000_000)
"""Requests of the streamed long runs (the second about two minutes of a bench run); the
unstreamed one runs at the first."""
QUICK_LONG_SIZES = (20_000, 60_000)
"""``--quick``: streamed only (no unstreamed row), to keep the quick bench short."""
LONG_ALPHA = 0.4
"""Load of the long runs (see the module docstring: a stable queue)."""
LONG_TIMEOUT_S = 1800.0
"""The long run is abandoned (and its row says so) past this many seconds."""
PILOT_DURATION_S = 100.0


def cheap_spec(duration_s: float, alpha: float = 0.6):
    """The run spec of the scale section's cheap ``one_touch`` with a measured phase of
    ``duration_s`` (LRU) at load ``alpha``."""
    from prefixshield.experiments.single import RunSpec
    from prefixshield.simulator.config import EngineConfig
    from prefixshield.simulator.costmodel import load_profile

    return RunSpec("one_touch", ("lru",), EngineConfig(num_blocks=ENGINE_BLOCKS),
                   load_profile(ENGINE_PROFILE), alpha=alpha,
                   overrides={**ENGINE_OVERRIDES, "duration_s": float(duration_s)})


def cheap_trace(duration_s: float, alpha: float = 0.6):
    """The scale section's cheap ``one_touch`` with a measured phase of ``duration_s`` at load
    ``alpha``."""
    from prefixshield.experiments.single import build_trace

    return build_trace(cheap_spec(duration_s, alpha))[0]


def duration_for(requests: int, alpha: float = 0.6) -> float:
    """Measured-phase seconds that give about ``requests`` requests at load ``alpha`` (from a
    pilot trace)."""
    pilot = cheap_trace(PILOT_DURATION_S, alpha)
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


def long_run(requests: int, streamed: bool = True) -> dict:
    """Simulate a trace of about ``requests`` requests (load `LONG_ALPHA`) under LRU in
    this process; returns the
    wall times and the peak RSS (bytes) at the start, after the build and after the run (run
    it in a fresh process: the peak is the process's own).

    ``streamed``: the trace generated a window of time at a time and run by
    `StreamedRun` into a temporary folder (records and
    series written as the run goes), then its summary from the files
    (`summarize_files`, its peak reported apart: it reads
    one column of the judged population whole); else the whole trace built in memory and
    ``Engine.run``."""
    import shutil
    import tempfile

    duration = duration_for(requests, LONG_ALPHA)
    gc.collect()
    start = peak_rss()
    if not streamed:
        t0 = time.perf_counter()
        trace = cheap_trace(duration, LONG_ALPHA)
        build_s = time.perf_counter() - t0
        after_build = peak_rss()
        engine = lru_engine(trace)
        t0 = time.perf_counter()
        engine.run()
        return {"requests": len(trace), "build_s": build_s, "run_s": time.perf_counter() - t0,
                "peak_rss_start": start, "peak_rss_after_build": after_build,
                "peak_rss_after_run": peak_rss(), "windows": engine.num_windows,
                "fused": bool(engine.fused_applies()), "streamed": False}
    from prefixshield.experiments.streamed import build_stream
    from prefixshield.policies import make_policy
    from prefixshield.simulator.config import EngineConfig
    from prefixshield.simulator.costmodel import load_profile
    from prefixshield.simulator.stream import StreamedRun, summarize_files

    t0 = time.perf_counter()
    stream = build_stream(cheap_spec(duration, LONG_ALPHA))[0]
    build_s = time.perf_counter() - t0   # the stream's setup; windows are drawn as it runs
    after_build = peak_rss()
    folder = tempfile.mkdtemp(prefix="prefixshield-long-")
    try:
        t0 = time.perf_counter()
        result = StreamedRun(stream, make_policy("lru", ENGINE_BLOCKS),
                             load_profile(ENGINE_PROFILE).cost,
                             EngineConfig(num_blocks=ENGINE_BLOCKS), folder).run()
        run_s = time.perf_counter() - t0
        after_run = peak_rss()
        t0 = time.perf_counter()
        summarize_files(result)
        summary_s = time.perf_counter() - t0
        records_mib = result.files["records"].stat().st_size / (1 << 20)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return {"requests": result.requests, "build_s": build_s, "run_s": run_s,
            "summary_s": summary_s, "peak_rss_start": start,
            "peak_rss_after_build": after_build, "peak_rss_after_run": after_run,
            "peak_rss_after_summary": peak_rss(), "windows": result.num_windows,
            "records_mib": records_mib, "fused": True, "streamed": True}


def long_row(requests: int, streamed: bool = True) -> dict:
    """A ``long run`` row: `long_run` in a child process (its own peak RSS)."""
    code = ("import json, sys; from prefixshield.bench.traces import long_run; "
            f"print(json.dumps(long_run({int(requests)}, {bool(streamed)})))")
    part = "long run, streamed" if streamed else "long run"
    r = child_json(code, LONG_TIMEOUT_S)
    if "error" in r:
        return {"part": part, "size": requests, "wall_s": None, "us_per_request": None,
                "vs_simulate": None, "detail": r["error"]}
    n = r["requests"]
    mib = 1 << 20
    what = (f"streamed, {r['windows']:,} windows, records file {r['records_mib']:,.0f} MiB"
            if r["streamed"] else
            f"{'fused' if r['fused'] else 'per-step'}, {r['windows']} windows")
    summary = (f"; summary from the files {r['summary_s']:.1f} s, peak RSS after it "
               f"{r['peak_rss_after_summary'] / mib:,.0f} MiB" if r["streamed"] else "")
    return {"part": part, "size": n, "wall_s": r["build_s"] + r["run_s"],
            "us_per_request": (r["build_s"] + r["run_s"]) / n * 1e6,
            # a streamed run draws its windows as it runs: no build time apart to compare
            "vs_simulate": None if r["streamed"] else ratio(r["build_s"], r["run_s"]),
            "peak_rss_mib": r["peak_rss_after_run"] / mib,
            "rss_bytes_per_request": (r["peak_rss_after_run"] - r["peak_rss_start"]) / n,
            "detail": (("trace generated as the run goes" if r["streamed"] else
                        f"build {r['build_s']:.1f} s ({r['build_s'] / n * 1e6:.2f} us/request)")
                       + f", run {r['run_s']:.1f} s ({r['run_s'] / n * 1e6:.2f} us/request, "
                       f"{what}); peak RSS {r['peak_rss_start'] / mib:,.0f} MiB at start, "
                       f"{r['peak_rss_after_build'] / mib:,.0f} MiB after the build, "
                       f"{r['peak_rss_after_run'] / mib:,.0f} MiB after the run{summary}")}


COLUMNS = [Column("part", "part"), Column("size", "requests", ","),
           Column("wall_s", "wall s", ".3f"), Column("us_per_request", "us/request", ".3f"),
           Column("vs_simulate", "vs simulate", ".2f", "x"),
           Column("peak_rss_mib", "peak RSS MiB", ",.0f"),
           Column("rss_bytes_per_request", "RSS B/request", ",.0f"),
           Column("detail", "detail")]


def steps(quick: bool) -> int:
    """Progress steps this section announces."""
    return (len(QUICK_SIZES if quick else SIZES) + (0 if quick else 1)
            + len(QUICK_LONG_SIZES if quick else LONG_SIZES))


def run(quick: bool = False, tick: Tick = no_progress) -> SectionResult:
    """Both parts (see the module docstring); ``quick``: small sizes, one repeat."""
    res = SectionResult(
        "traces", "traces: building a generated trace vs simulating it under LRU (us per "
                  "request; vs simulate = build / simulate), and the peak RSS of long runs, "
                  "streamed and not",
        list(COLUMNS))
    repeats = 1 if quick else 2
    res.rows.extend(build_rows(QUICK_SIZES if quick else SIZES, repeats, tick))
    sizes = QUICK_LONG_SIZES if quick else LONG_SIZES
    if not quick:
        tick(f"traces: long run, {sizes[0]:,} requests")
        res.rows.append(long_row(sizes[0], streamed=False))
    for n in sizes:
        tick(f"traces: long run streamed, {n:,} requests")
        res.rows.append(long_row(n))
    for row in res.rows:
        for k in ("peak_rss_mib", "rss_bytes_per_request"):
            row.setdefault(k, None)
    res.extra.update(engine_setup(), repeats=repeats, long_sizes=list(sizes),
                     long_alpha=LONG_ALPHA)
    res.notes.append(
        f"one_touch at {ENGINE_BLOCKS:,} blocks ({ENGINE_PROFILE}), 128-token prefixes, 1 "
        f"output token (the scale section's workload); build and simulate: best of {repeats} "
        f"wall times each, the same trace; long runs: load {LONG_ALPHA}, one child process "
        f"each, build + Engine.run or a streamed run under LRU, its peak RSS (VmHWM)")
    return res
