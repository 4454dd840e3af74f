"""Benchmark (not a test): our LRU and S3-FIFO against libCacheSim on the same key stream.

Both sides are driven one request at a time from Python (ours: ``replay_keys``, a policy call
per request into numba kernels; libCacheSim: ``cache.get`` per request into C), so the ratio
compares the per-request decision paths. Same hit count on both sides is asserted. Run:
``.venv/bin/python benchmarks/bench_oracle.py``.
"""

from __future__ import annotations

import math
import time

import libcachesim
import numpy as np
from rich.console import Console
from rich.table import Table

from prefixshield.policies import make_policy
from prefixshield.simulator.cachedriver import replay_keys


def zipf_keys(n: int, num_keys: int, alpha: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    cdf = np.cumsum(1.0 / np.arange(1, num_keys + 1) ** alpha)
    cdf /= cdf[-1]
    ranks = np.minimum(np.searchsorted(cdf, rng.random(n)), num_keys - 1)
    return rng.permutation(num_keys)[ranks].astype(np.int64)


def theirs(cache, keys: np.ndarray) -> int:
    req = libcachesim.Request()
    req.obj_size = 1
    get = cache.get
    hits = 0
    for key in keys.tolist():
        req.obj_id = key
        hits += bool(get(req))
    return hits


def main() -> None:
    console = Console(width=140)
    table = Table(title="key-stream replay: ours (numba kernels) vs libCacheSim (C), same stream")
    for col in ("policy", "capacity", "requests", "hits (both)", "ours req/s", "libCacheSim req/s",
                "ours / libCacheSim"):
        table.add_column(col, justify="right")
    n = 200_000
    for capacity in (512, 4096, 65536):
        keys = zipf_keys(n, 5 * capacity, 0.8)
        for ours_name, their_cls in (("lru", libcachesim.LRU), ("s3fifo", libcachesim.S3FIFO)):
            replay_keys(make_policy(ours_name, capacity + 1), keys[:2000])  # JIT warm-up
            t0 = time.perf_counter()
            ours_hits = int(replay_keys(make_policy(ours_name, capacity + 1), keys).sum())
            t_ours = time.perf_counter() - t0
            cache = their_cls(capacity, hashpower=int(math.log2(capacity)) + 1)
            t0 = time.perf_counter()
            their_hits = theirs(cache, keys)
            t_theirs = time.perf_counter() - t0
            assert ours_hits == their_hits, (ours_name, capacity, ours_hits, their_hits)
            table.add_row(ours_name, f"{capacity:,}", f"{n:,}", f"{ours_hits:,}",
                          f"{n / t_ours:,.0f}", f"{n / t_theirs:,.0f}",
                          f"{t_theirs / t_ours:.2f}x")
    console.print(table)


if __name__ == "__main__":
    main()
