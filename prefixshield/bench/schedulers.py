"""The cost of a scheduler: simulated requests per wall second under ``fcfs`` (vLLM's default,
the fused loop), ``fcfs`` with per-tenant limits, ``priority`` and ``vtc``.

Schedulers other than plain FCFS, and any per-tenant limit, run on the per-step batched path
(the scheduler orders, admits and preempts there; see `prefixshield.scheduling`); the
fused loop compiles vLLM's FCFS only. The anchor of
every row is the default engine (FCFS, fused loop) on the same trace in the same run;
``slowdown`` is its wall time over the anchor's. LRU; traces built once, not timed; JIT warm-up
runs first; interleaved, best of ``repeats``.
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
            ("vtc", SchedulerConfig("vtc"))]


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
         Column("scheduler", "scheduler"), Column("requests", "requests", ","),
         Column("req_per_s", "req/s", ",.0f"),
         Column("anchor_req_per_s", "fcfs (fused) req/s", ",.0f"),
         Column("slowdown", "slowdown", ".1f", "x")])
    for workload, blocks, overrides in cases(quick):
        tick(f"schedulers: {workload} at {blocks} blocks")
        base = EngineConfig(num_blocks=blocks)
        trace, _ = build_trace(RunSpec(workload, ("lru",), base, profile, overrides=overrides))

        def engine_run(config):
            return Engine(trace, make_policy("lru", blocks), profile.cost, config).run()

        for label, sched in schedulers():
            config = EngineConfig(num_blocks=blocks, scheduler=sched)
            engine_run(base), engine_run(config)  # JIT warm-up of both paths
            best = best_of_interleaved({"anchor": lambda: engine_run(base),
                                        "sched": lambda: engine_run(config)}, repeats)
            n = len(trace)
            res.rows.append({"workload": workload, "blocks": blocks, "scheduler": label,
                             "requests": n, "req_per_s": n / best["sched"],
                             "anchor_req_per_s": n / best["anchor"],
                             "slowdown": ratio(best["sched"], best["anchor"]),
                             "wall_s": best["sched"], "anchor_wall_s": best["anchor"]})
    res.notes.append(f"anchor: the default engine (fcfs, fused loop) on the same trace, "
                     f"interleaved, best of {repeats}; every other scheduler, and fcfs with any "
                     f"per-tenant limit, runs the per-step batched path.")
    return res
