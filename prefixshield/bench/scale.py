"""Scale: simulator time linear in the requests, block-pool memory linear in the blocks.

1. *Requests* (rows ``engine``): the simulator's full engine
   ([`Engine`][prefixshield.simulator.engine.Engine] on its default path: SimPy's event order,
   scheduler, block pool, LRU, cost model) on a cheap generated workload, ``one_touch`` at
   4,096 blocks with one output token per request (``output_tokens=(1, 1)``, the prefill study)
   and 128-token prefixes plus 16-48-token suffixes (``prefix_tokens=128``, about 10 blocks a
   request; every size takes the fused loop, which holds hashes and block tables a window of
   arrivals at a time, ``Engine.FUSED_WINDOW_HASHES``; the path and the number of windows are
   reported, and linearity is not judged when the sizes took different paths). The measured
   phase is lengthened (``duration_s``, from a pilot trace's rate) until the trace holds about
   10^4, 10^5, 10^6 and 2 x 10^6 requests (the last: past 10^6, where a fixed bound on the
   fused loop's hashes once sent a run to the per-step path; ``--quick``: 10^3, 4 x 10^3,
   1.6 x 10^4). Timed: ``Engine.run``
   (best of ``repeats`` runs, more while they add up to less than `MIN_TIMED_S`), in wall
   seconds and in this thread's CPU seconds (user + system, least of the runs; the system part
   is also given apart): on a shared machine the wall time includes the waits for a core, which
   the CPU time does not. Each run starts after the previous run's engine and result are
   released, so that a run holds only its own memory. Trace building is reported apart, not
   timed.
2. *Blocks* (rows ``pool + <policy>``): the simulator's
   [`BlockPool`][prefixshield.simulator.blockpool.BlockPool] with LRU, and with PrefixShield, at
   2^14, 2^17 and 2^20 blocks (``--quick``: 2^10, 2^12, 2^14), *filled*: every usable block
   taken, cached under its own hash and freed again, so the hash map, the free order and the
   policy's per-block state are all at their fullest. Memory is counted two ways: bytes that
   ``tracemalloc`` traces from before the pool is built to after the fill (numpy buffers are
   traced; numba typed-dict entries are not), and the ``nbytes`` of every numpy array reachable
   from the pool and its policy (`prefixshield.experiments.overhead.state_bytes`). The
   fill's wall time per block (best of 3 or more, the same rule; untraced) is reported too.

Linearity: each row gives the per-unit figure (us per request, bytes per block) and the *step
slope* from the previous size, ``(cost - previous cost) / (size - previous size)``: the cost of
one more request or block, free of fixed costs (start-up, the warm-up phase). Cost is linear in
the size where the step slopes agree: each "slope ratio" column is a slope over the previous
step's, and the verdict in the notes is "holds" when every such ratio is within 1 +-
`LINEAR_TOLERANCE`. The notes also give the least-squares line ``cost = a + b size``.
Each part starts with an untimed warm-up (numba kernels loaded or compiled). No CPU number is
asserted.
"""

from __future__ import annotations

import gc
import math
import time
import tracemalloc

import numpy as np

from prefixshield.bench.common import Column, SectionResult, Tick, no_progress, ratio

ENGINE_BLOCKS = 4096
ENGINE_PROFILE = "l4-qwen2.5-1.5b"
ENGINE_OVERRIDES = {"output_tokens": (1, 1), "prefix_tokens": 128, "suffix_tokens": (16, 48)}
"""``one_touch`` made cheap: one output token, 8-block prefixes (see the module docstring)."""
REQUEST_SIZES = (10_000, 100_000, 1_000_000, 2_000_000)
QUICK_REQUEST_SIZES = (1_000, 4_000, 16_000)
POOL_SIZES = (1 << 14, 1 << 17, 1 << 20)
QUICK_POOL_SIZES = (1 << 10, 1 << 12, 1 << 14)
POOL_POLICIES = ("lru", "prefixshield")
FILL_CHUNK = 4096
"""Blocks taken, cached and freed per pool call while filling."""
PILOT_DURATION_S = 100.0
LINEAR_TOLERANCE = 0.25
MIN_TIMED_S = 1.0
"""A size is timed again (beyond ``repeats``) until its runs add up to this many seconds, at most
`MAX_REPEATS` times: a 0.02-0.3 s run timed twice on a shared machine moved by 2x between
bench runs, more than the linearity verdict tolerates."""
MAX_REPEATS = 10
"""Verdict band: linear when every step slope is within 1 +- this of the previous step's (the
machines are shared: timings of one run vary by 10-20% here)."""


def engine_setup() -> dict:
    """The requests part's engine settings as written with the results (JSON-able): the
    workload's overrides, blocks and profile."""
    return {"engine_overrides": {k: list(v) if isinstance(v, tuple) else v
                                 for k, v in ENGINE_OVERRIDES.items()},
            "engine_blocks": ENGINE_BLOCKS, "engine_profile": ENGINE_PROFILE}


def steps(quick: bool) -> int:
    """Progress steps this section announces."""
    sizes = QUICK_REQUEST_SIZES if quick else REQUEST_SIZES
    pools = QUICK_POOL_SIZES if quick else POOL_SIZES
    return len(sizes) + len(pools) * len(POOL_POLICIES)


def fit_line(sizes, costs) -> tuple[float, float]:
    """``(a, b)`` of the least-squares line ``cost = a + b size``."""
    b, a = np.polyfit(np.asarray(sizes, float), np.asarray(costs, float), 1)
    return float(a), float(b)


def add_slopes(rows: list[dict], costs: list[float], slope_key: str, ratio_key: str,
               per: float = 1.0) -> list[float]:
    """Set each row's step slope (``per`` x cost increase / size increase from the previous
    row; ``costs[i]`` is row i's) and its ratio to the previous step's; returns the ratios."""
    ratios = []
    for i in range(1, len(rows)):
        prev, row = rows[i - 1], rows[i]
        row[slope_key] = per * (costs[i] - costs[i - 1]) / (row["size"] - prev["size"])
        if i >= 2:
            row[ratio_key] = ratio(row[slope_key], rows[i - 1][slope_key])
            ratios.append(row[ratio_key])
    return ratios


def verdict(ratios: list[float], quick: bool = False) -> str:
    """"holds" when every step-slope ratio is within 1 +- `LINEAR_TOLERANCE`."""
    if quick:
        return "not judged under --quick (milliseconds of work)"
    if not ratios:
        return "not judged (fewer than three sizes)"
    ok = all(abs(r - 1.0) <= LINEAR_TOLERANCE for r in ratios)
    return ("holds" if ok else "does not hold") + \
        f" (step-slope ratios {', '.join(f'{r:.2f}' for r in ratios)})"


# ------------------------------------------------------------------------------ requests
def _system_s() -> float:
    """System (kernel) CPU seconds of this thread so far: page faults, and the zeroing of every
    fresh page on its first write; 0.0 where ``getrusage`` has no per-thread figure."""
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_THREAD).ru_stime
    except (ImportError, AttributeError, OSError):
        return 0.0


def engine_rows(sizes, repeats: int, tick: Tick) -> list[dict]:
    """Time ``Engine.run`` on the cheap ``one_touch`` at each target request count."""
    from prefixshield.experiments.single import RunSpec, build_trace
    from prefixshield.policies import make_policy
    from prefixshield.simulator.config import EngineConfig
    from prefixshield.simulator.costmodel import load_profile
    from prefixshield.simulator.engine import Engine

    profile = load_profile(ENGINE_PROFILE)
    config = EngineConfig(num_blocks=ENGINE_BLOCKS)

    def trace_for(duration_s: float):
        spec = RunSpec("one_touch", ("lru",), config, profile,
                       overrides={**ENGINE_OVERRIDES, "duration_s": float(duration_s)})
        return build_trace(spec)[0]

    def engine(trace):
        return Engine(trace, make_policy("lru", ENGINE_BLOCKS), profile.cost, config)

    pilot = trace_for(PILOT_DURATION_S)  # its rate sizes the others; also the JIT warm-up
    warmup = int((~pilot.requests["measured"].to_numpy()).sum())
    rate = (len(pilot) - warmup) / PILOT_DURATION_S
    engine(pilot).run()
    rows: list[dict] = []
    for n in sizes:
        tick(f"scale: engine, {n:,} requests")
        t0 = time.perf_counter()
        trace = trace_for(max(1.0, (n - warmup) / rate))
        build_s = time.perf_counter() - t0
        best, best_cpu, best_sys, path, num_steps = math.inf, math.inf, math.inf, "-", 0
        windows = 0
        timed, runs = 0.0, 0
        while runs < repeats or (timed < MIN_TIMED_S and runs < MAX_REPEATS):
            # the previous run's engine and result go first: each run holds only its own
            e = last = None
            e = engine(trace)
            fused = getattr(e, "fused_applies", None)
            path = ("fused" if fused() else "per-step") if fused else "default"
            c0, s0, t0 = time.thread_time(), _system_s(), time.perf_counter()
            last = e.run()
            dt = time.perf_counter() - t0
            cpu, sys_s = time.thread_time() - c0, _system_s() - s0
            best, timed, runs = min(best, dt), timed + dt, runs + 1
            best_cpu, best_sys = min(best_cpu, cpu), min(best_sys, sys_s)
            num_steps = int(last.num_steps)
            windows = int(getattr(e, "num_windows", 0))
        num = len(trace)
        rows.append({"part": "engine + lru", "size": num,
                     "unit": "requests", "wall_s": best, "us_per_unit": best / num * 1e6,
                     "cpu_s": best_cpu, "cpu_us_per_unit": best_cpu / num * 1e6,
                     "system_s": best_sys,
                     "detail": f"{path}, {num_steps:,} steps, {windows} window(s)",
                     "build_s": build_s,
                     "steps": num_steps, "runs": runs,
                     "simulated_s": float(trace.requests["arrival_s"].max())})
        del trace, e, last
        gc.collect()
    return rows


# ------------------------------------------------------------------------------ blocks
def fill_pool(pool, now: float = 0.0) -> None:
    """Take every usable block, cache each under its own hash, free them all (a full cache)."""
    usable = pool.num_blocks - 1
    held = []
    mult = np.uint64(0x9E3779B97F4A7C15)
    for start in range(0, usable, FILL_CHUNK):
        n = min(FILL_CHUNK, usable - start)
        blocks = pool.get_new_blocks(n, 0, now)
        hashes = (np.arange(start + 1, start + n + 1, dtype=np.uint64) * mult) | np.uint64(1)
        pool.cache_full_blocks(blocks, hashes, 0, 0, start // FILL_CHUNK, now)
        held.append(blocks)
    for blocks in held:
        pool.free_blocks(blocks[::-1].copy(), now)
    if pool.num_cached_blocks() != usable or pool.policy.num_free() != usable:
        raise AssertionError(f"scale bench: the {pool.num_blocks:,}-block pool was not filled")


def pool_row(num_blocks: int, policy_name: str, repeats: int = 1) -> dict:
    """Build and fill one pool: the fill's wall seconds (best of ``repeats`` runs or more, until
    they add up to `MIN_TIMED_S`; untraced), then
    one more build and fill under ``tracemalloc`` for its traced bytes and array bytes."""
    from prefixshield.experiments.overhead import CONTRACTS, state_bytes
    from prefixshield.policies import make_policy
    from prefixshield.simulator.blockpool import BlockPool

    def build():
        policy = make_policy(policy_name, num_blocks)
        policy.bind_tenants(["g0"], CONTRACTS)
        return BlockPool(num_blocks, policy, 1)

    fill_s, timed, runs = math.inf, 0.0, 0
    while runs < repeats or (timed < MIN_TIMED_S and runs < MAX_REPEATS):
        pool = build()
        t0 = time.perf_counter()
        fill_pool(pool)
        dt = time.perf_counter() - t0
        fill_s, timed, runs = min(fill_s, dt), timed + dt, runs + 1
        del pool
    gc.collect()
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        pool = build()
        fill_pool(pool)
        gc.collect()
        traced = tracemalloc.get_traced_memory()[0] - before
    finally:
        if not was_tracing:
            tracemalloc.stop()
    arrays, _ = state_bytes(pool)
    del pool
    return {"part": f"pool + {policy_name}", "size": num_blocks, "unit": "blocks",
            "wall_s": fill_s, "us_per_unit": fill_s / num_blocks * 1e6,
            "bytes_per_unit": traced / num_blocks, "array_bytes_per_unit": arrays / num_blocks,
            "traced_bytes": int(traced), "array_bytes": int(arrays), "runs": runs}


# ------------------------------------------------------------------------------ section
COLUMNS = [Column("part", "part"), Column("size", "size", ","), Column("unit", "unit"),
           Column("wall_s", "wall s", ".3f"), Column("us_per_unit", "us/unit", ".3f"),
           Column("time_slope", "slope us/unit", ".3f"),
           Column("time_slope_ratio", "slope ratio", ".2f", "x"),
           Column("cpu_us_per_unit", "CPU us/unit", ".3f"),
           Column("cpu_slope_ratio", "CPU slope ratio", ".2f", "x"),
           Column("bytes_per_unit", "traced B/block", ".1f"),
           Column("bytes_slope", "slope B/block", ".1f"),
           Column("bytes_slope_ratio", "slope ratio", ".2f", "x"),
           Column("array_bytes_per_unit", "array B/block", ".1f"),
           Column("detail", "detail")]
_OPTIONAL = ("time_slope", "time_slope_ratio", "cpu_us_per_unit", "cpu_slope", "cpu_slope_ratio",
             "bytes_per_unit", "bytes_slope",
             "bytes_slope_ratio", "array_bytes_per_unit", "detail")


def run(quick: bool = False, tick: Tick = no_progress) -> SectionResult:
    """Both parts (see the module docstring); ``quick``: small sizes, one repeat."""
    res = SectionResult(
        "scale", "scale: engine time per request, block-pool memory per block (slope: the cost "
                 "of one more unit from the previous size; its ratio to the previous slope)",
        list(COLUMNS))
    sizes = QUICK_REQUEST_SIZES if quick else REQUEST_SIZES
    pools = QUICK_POOL_SIZES if quick else POOL_SIZES
    repeats = 1 if quick else 2
    res.rows.extend(engine_rows(sizes, repeats, tick))
    for policy_name in POOL_POLICIES:
        pool_row(1 << 10, policy_name)  # warm-up: kernels loaded, one-time allocations made
        for n in pools:
            tick(f"scale: pool + {policy_name}, {n:,} blocks")
            res.rows.append(pool_row(n, policy_name, repeats=1 if quick else 3))
    for row in res.rows:
        for k in _OPTIONAL:
            row.setdefault(k, None)
    for part in dict.fromkeys(r["part"] for r in res.rows):
        rows = [r for r in res.rows if r["part"] == part]
        unit = rows[0]["unit"]
        t_ratios = add_slopes(rows, [r["wall_s"] for r in rows], "time_slope",
                              "time_slope_ratio", per=1e6)
        a, b = fit_line([r["size"] for r in rows], [r["wall_s"] for r in rows])
        res.extra[f"{part}: time fit"] = {"intercept_s": a, "us_per_unit": b * 1e6}
        paths = {r["detail"].split(",")[0] for r in rows if r.get("detail")}
        judged = verdict(t_ratios, quick) if len(paths) <= 1 else \
            f"not judged: the sizes took different engine paths ({', '.join(sorted(paths))})"
        line = (f"{part}: time = {a:.3f} s + {b * 1e6:.3f} us x {unit[:-1]} (least squares over "
                f"{rows[0]['size']:,}-{rows[-1]['size']:,} {unit}); linear in the "
                f"{unit}: {judged}")
        if rows[0]["bytes_per_unit"] is not None:
            traced = [r["traced_bytes"] for r in rows]
            m_ratios = add_slopes(rows, traced, "bytes_slope", "bytes_slope_ratio")
            a, b = fit_line([r["size"] for r in rows], traced)
            res.extra[f"{part}: memory fit"] = {"intercept_bytes": a, "bytes_per_unit": b}
            line += (f". Memory = {a / 1024:,.0f} KiB + {b:.1f} B x block; linear in the "
                     f"blocks: {verdict(m_ratios, quick)}")
        if rows[0].get("cpu_s") is not None:
            c_ratios = add_slopes(rows, [r["cpu_s"] for r in rows], "cpu_slope",
                                  "cpu_slope_ratio", per=1e6)
            a, b = fit_line([r["size"] for r in rows], [r["cpu_s"] for r in rows])
            res.extra[f"{part}: cpu fit"] = {"intercept_s": a, "us_per_unit": b * 1e6}
            line += (f". CPU time (this thread, user + system) = {a:.3f} s + {b * 1e6:.3f} us x "
                     f"{unit[:-1]}; linear: "
                     + (verdict(c_ratios, quick) if len(paths) <= 1 else "not judged")
                     + "; of it system (page faults, fresh pages zeroed): "
                     + ", ".join(f"{r['system_s'] / r['size'] * 1e6:.3f}" for r in rows)
                     + f" us/{unit[:-1]}")
        res.notes.append(line)
    res.extra.update(engine_setup(), repeats=repeats, linear_tolerance=LINEAR_TOLERANCE)
    res.notes.append(
        f"engine: Engine.run wall and CPU seconds (best of at least {repeats} runs, more until "
        f"they add "
        f"up to {MIN_TIMED_S:g} s, at most {MAX_REPEATS}: "
        + ", ".join(f"{r['runs']}" for r in res.rows if r["unit"] == "requests")
        + f") on one_touch at "
        f"{ENGINE_BLOCKS:,} blocks ({ENGINE_PROFILE}), 1 output token, 128-token prefixes; "
        f"building the traces (not timed) took "
        + ", ".join(f"{r['build_s']:.1f}" for r in res.rows if r["unit"] == "requests")
        + " s. pool: the simulator's BlockPool filled (every block cached under its own hash, "
          "then freed); traced = tracemalloc bytes from before the build to after the fill; "
          "array = nbytes of the pool's and the policy's numpy arrays; wall = the fill, best "
          f"of at least {1 if quick else 3} runs (the same rule)")
    return res
