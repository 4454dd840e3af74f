"""The cost of a scheduler: simulated requests per wall second under ``fcfs`` with per-tenant
limits, ``priority``, ``vtc`` and ``kvtc``, against ``fcfs`` (vLLM's default).

Every scheduler runs in the fused loop (its compiled form, `prefixshield.scheduling.kernels`)
and, for comparison, on the per-step batched path (``Engine(..., fused=False)``: the Python
scheduler orders, admits and preempts there), which is what a scheduler cost before the loop
compiled it. The anchor of every row is the default engine (FCFS, fused loop) on the same trace
in the same run; ``slowdown`` is the row's wall time over the anchor's. LRU; traces built once,
not timed; JIT warm-up runs first; interleaved, best of ``repeats``.
"""

from __future__ import annotations

from prefixshield.bench.common import (Column, SectionResult, Tick, best_of_interleaved,
                                       no_progress, ratio)


def cases(quick: bool) -> list[tuple[str, int, dict]]:
    """``(workload, blocks, overrides)`` of every trace."""
    short = {"duration_s": 15.0} if quick else {}
    return [("one_touch", 512, dict(short)), ("sharegpt", 512, dict(short)),
            ("one_touch", 4096, {"output_tokens": (16, 64), **short})]


def schedulers():
    """``(label, SchedulerConfig)`` of every row after the anchor."""
    from prefixshield.scheduling import SchedulerConfig, TenantLimits

    return [("fcfs + limits", SchedulerConfig("fcfs", limits=(
                ("*", TenantLimits(max_running=64)),))),
            ("priority", SchedulerConfig("priority")),
            ("vtc", SchedulerConfig("vtc")),
            ("kvtc", SchedulerConfig("kvtc"))]


PATHS = (("fused", {}), ("per-step", {"fused": False}))
"""``(label, Engine keyword arguments)`` of the two paths each scheduler is timed on."""


def steps(quick: bool) -> int:
    """Progress steps this section announces."""
    return len(cases(quick))


def run(quick: bool = False, tick: Tick = no_progress) -> SectionResult:
    """Measure every scheduler on every case (``quick``: 15 simulated seconds, best of 1)."""
    from prefixshield.experiments.single import RunSpec, build_trace
    from prefixshield.policies import make_policy
    from prefixshield.simulator.config import EngineConfig
    from prefixshield.simulator.costmodel import load_profile
    from prefixshield.simulator.engine import Engine

    repeats = 1 if quick else 3
    profile = load_profile("l4-qwen2.5-1.5b")
    res = SectionResult(
        "schedulers", "scheduler cost: simulated requests per wall second, LRU (same trace, "
        "same run)",
        [Column("workload", "workload"), Column("blocks", "blocks", ","),
         Column("scheduler", "scheduler"), Column("path", "path"),
         Column("requests", "requests", ","),
         Column("req_per_s", "req/s", ",.0f"),
         Column("anchor_req_per_s", "fcfs (fused) req/s", ",.0f"),
         Column("slowdown", "slowdown", ".1f", "x")])
    for workload, blocks, overrides in cases(quick):
        tick(f"schedulers: {workload} at {blocks} blocks")
        base = EngineConfig(num_blocks=blocks)
        trace, _ = build_trace(RunSpec(workload, ("lru",), base, profile, overrides=overrides))

        def engine_run(config, **kw):
            return Engine(trace, make_policy("lru", blocks), profile.cost, config, **kw).run()

        for label, sched in schedulers():
            config = EngineConfig(num_blocks=blocks, scheduler=sched)
            for path, kw in PATHS:
                engine_run(base), engine_run(config, **kw)  # JIT warm-up of both
                best = best_of_interleaved({"anchor": lambda: engine_run(base),
                                            "sched": lambda: engine_run(config, **kw)},
                                           repeats)
                n = len(trace)
                res.rows.append({"workload": workload, "blocks": blocks, "scheduler": label,
                                 "path": path, "requests": n, "req_per_s": n / best["sched"],
                                 "anchor_req_per_s": n / best["anchor"],
                                 "slowdown": ratio(best["sched"], best["anchor"]),
                                 "wall_s": best["sched"], "anchor_wall_s": best["anchor"]})
    res.notes.append(f"anchor: the default engine (fcfs, fused loop) on the same trace, "
                     f"interleaved, best of {repeats}; path fused: the scheduler compiled in "
                     f"the fused loop; per-step: the per-step batched path (Python scheduler).")
    return res
