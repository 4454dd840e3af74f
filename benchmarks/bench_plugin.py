"""Benchmark (not a test): vLLM's own ``BlockPool`` against ``PolicyBlockPool`` + LRU.

Two levels, each the identical operation stream on both pools, best of ``--repeats``:

1. *Pool calls*: the ``get_new_blocks`` / ``touch`` / ``cache_full_blocks`` / ``free_blocks``
   calls that vLLM's ``KVCacheManager`` made during a seeded request stream (recorded once on a
   native pool), replayed straight into a fresh pool. This isolates the plugin's own overhead.
2. *Cache manager*: the whole request stream through ``KVCacheManager.allocate_slots`` / ``free``
   (lookups, block hashing of new requests, the scheduler's view) — what a serving step pays.

Both replays must leave the same free-queue order (LRU through the plugin is vLLM's order), which
is checked. Prints time per operation for each pool and the ratio plugin / native.

Run: ``.venv/bin/python benchmarks/bench_plugin.py [--blocks 1024] [--ops 4000]``. Writes nothing.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # vllm_kv_driver

from vllm_kv_driver import Side, run_stream  # noqa: E402

from prefixshield.validate import plugin  # noqa: E402

GROUPS = ["default", "tenant-a", "tenant-b"]


def record_pool_calls(num_blocks: int, block_size: int, seed: int, num_ops: int) -> list[tuple]:
    """Run the request stream on a native pool and log every pool call with its arguments."""
    side = Side(num_blocks, block_size)
    pool, mgr = side.pool, side.mgr
    log: list[tuple] = []
    current = [None]
    orig_alloc = mgr.allocate_slots

    def allocate_slots(request, *a, **kw):
        current[0] = request
        try:
            return orig_alloc(request, *a, **kw)
        finally:
            current[0] = None

    mgr.allocate_slots = allocate_slots
    orig_new, orig_touch = pool.get_new_blocks, pool.touch
    orig_free, orig_cache = pool.free_blocks, pool.cache_full_blocks

    def get_new_blocks(n):
        out = orig_new(n)
        log.append(("new", n, current[0]))
        return out

    def touch(blocks):
        log.append(("touch", [b.block_id for b in blocks], current[0]))
        return orig_touch(blocks)

    def free_blocks(ordered):
        ordered = list(ordered)
        log.append(("free", [b.block_id for b in ordered]))
        return orig_free(ordered)

    def cache_full_blocks(request, blocks, num_cached_blocks, num_full_blocks, block_size,
                          kv_cache_group_id, block_mask=None):
        log.append(("cache", request, [b.block_id for b in blocks], num_cached_blocks,
                    num_full_blocks, block_size, kv_cache_group_id))
        return orig_cache(request, blocks, num_cached_blocks, num_full_blocks, block_size,
                          kv_cache_group_id, block_mask)

    pool.get_new_blocks, pool.touch = get_new_blocks, touch
    pool.free_blocks, pool.cache_full_blocks = free_blocks, cache_full_blocks
    run_stream(side, seed, num_ops=num_ops, observe=False)
    return log


def replay_pool_calls(pool, log: list[tuple]) -> float:
    """Replay ``log`` into ``pool``; returns wall seconds."""
    blocks = pool.blocks
    policy = isinstance(pool, plugin.PolicyBlockPool) and pool.policy is not None
    t0 = time.perf_counter()
    for op in log:
        kind = op[0]
        if kind == "new":
            if policy:
                pool._current = op[2]
            pool.get_new_blocks(op[1])
        elif kind == "touch":
            if policy:
                pool._current = op[2]
            pool.touch([blocks[i] for i in op[1]])
        elif kind == "free":
            pool.free_blocks([blocks[i] for i in op[1]])
        else:
            _, req, ids, nc, nf, bs, gid = op
            pool.cache_full_blocks(req, [blocks[i] for i in ids], nc, nf, bs, gid)
        if policy:
            pool._current = None
    return time.perf_counter() - t0


def free_queue(pool) -> list[int]:
    q = pool.free_block_queue
    out, cur = [], q.fake_free_list_head.next_free_block
    while cur is not q.fake_free_list_tail:
        out.append(cur.block_id)
        cur = cur.next_free_block
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--blocks", type=int, default=1024)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--ops", type=int, default=4000, help="request-stream operations")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    env = plugin.plugin_env("lru", groups=GROUPS)

    # warm-up: numba kernels of the LRU policy, vLLM imports
    run_stream(Side(64, args.block_size, env), 1, num_ops=200, observe=False)

    log = record_pool_calls(args.blocks, args.block_size, args.seed, args.ops)
    counts = {k: sum(1 for o in log if o[0] == k) for k in ("new", "touch", "cache", "free")}
    native_t, plugin_t = [], []
    for _ in range(args.repeats):
        a = Side(args.blocks, args.block_size).pool
        native_t.append(replay_pool_calls(a, log))
        b = Side(args.blocks, args.block_size, env).pool
        plugin_t.append(replay_pool_calls(b, log))
        assert free_queue(a) == free_queue(b) == b.policy.free_order().tolist(), \
            "the two pools diverged"
    n = len(log)
    tn, tp = min(native_t), min(plugin_t)
    print(f"vLLM {plugin.vllm.__version__}, {args.blocks} blocks of {args.block_size} tokens, "
          f"request stream of {args.ops} ops (seed {args.seed}), best of {args.repeats}")
    print(f"1. pool calls: {n} ({', '.join(f'{k} {v}' for k, v in counts.items())})")
    print(f"   native BlockPool        {tn * 1e3:8.1f} ms  {tn / n * 1e6:7.2f} us/call")
    print(f"   PolicyBlockPool + LRU   {tp * 1e3:8.1f} ms  {tp / n * 1e6:7.2f} us/call")
    print(f"   ratio plugin / native   {tp / tn:8.2f}x")

    native_t, plugin_t = [], []
    for _ in range(args.repeats):
        a = Side(args.blocks, args.block_size)
        t0 = time.perf_counter()
        run_stream(a, args.seed, num_ops=args.ops, observe=False)
        native_t.append(time.perf_counter() - t0)
        b = Side(args.blocks, args.block_size, env)
        t0 = time.perf_counter()
        run_stream(b, args.seed, num_ops=args.ops, observe=False)
        plugin_t.append(time.perf_counter() - t0)
        assert a.free_queue() == b.free_queue(), "the two managers diverged"
    tn, tp = min(native_t), min(plugin_t)
    print(f"2. cache manager: {args.ops} request-stream ops")
    print(f"   native KVCacheManager   {tn * 1e3:8.1f} ms  {tn / args.ops * 1e6:7.2f} us/op")
    print(f"   with the plugin + LRU   {tp * 1e3:8.1f} ms  {tp / args.ops * 1e6:7.2f} us/op")
    print(f"   ratio plugin / native   {tp / tn:8.2f}x")


if __name__ == "__main__":
    main()
