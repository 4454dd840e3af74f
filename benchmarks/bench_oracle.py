"""Benchmark (not a test): our LRU and S3-FIFO against libCacheSim on the same key stream.

Three ways through the same 200,000 Zipf(0.8) keys, in one run (equal hit counts asserted):

* ours: ``replay_keys`` with the policy's one-kernel batch replay (numba, no Python per key);
* libCacheSim, C: ``cache.process_trace`` over the keys written as an oracleGeneral binary trace
  (its native path: C from the first request to the last);
* libCacheSim, per request: ``cache.get`` called from a Python loop.

Run: ``.venv/bin/python benchmarks/bench_oracle.py``. Writes only a temp file.
"""

from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path

import libcachesim
import numpy as np
from rich.console import Console
from rich.table import Table

from prefixshield.policies import make_policy
from prefixshield.simulator.cachedriver import replay_keys

ORACLE_GENERAL = np.dtype([("t", "<u4"), ("id", "<u8"), ("size", "<u4"), ("next", "<i8")])


def zipf_keys(n: int, num_keys: int, alpha: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    cdf = np.cumsum(1.0 / np.arange(1, num_keys + 1) ** alpha)
    cdf /= cdf[-1]
    ranks = np.minimum(np.searchsorted(cdf, rng.random(n)), num_keys - 1)
    return rng.permutation(num_keys)[ranks].astype(np.int64)


def write_oracle_general(keys: np.ndarray, path: Path) -> None:
    rec = np.zeros(keys.shape[0], dtype=ORACLE_GENERAL)
    rec["t"] = np.arange(keys.shape[0])
    rec["id"] = keys
    rec["size"] = 1
    rec["next"] = -1
    rec.tofile(path)


def per_request(cache, keys: np.ndarray) -> int:
    req = libcachesim.Request()
    req.obj_size = 1
    get = cache.get
    hits = 0
    for key in keys.tolist():
        req.obj_id = key
        hits += bool(get(req))
    return hits


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main() -> None:
    console = Console(width=150)
    table = Table(title="key-stream replay, same 200,000 Zipf(0.8) keys, same run (requests/s)")
    for col in ("policy", "capacity", "hits (all)", "ours (numba batch)", "libCacheSim C",
                "libCacheSim get() loop", "ours / C", "ours / get() loop"):
        table.add_column(col, justify="right")
    n = 200_000
    with tempfile.TemporaryDirectory() as tmp:
        for capacity in (512, 4096, 65536):
            keys = zipf_keys(n, 5 * capacity, 0.8)
            path = Path(tmp) / f"zipf-{capacity}.oracleGeneral.bin"
            write_oracle_general(keys, path)
            hp = int(math.log2(capacity)) + 1
            for ours_name, their_cls in (("lru", libcachesim.LRU), ("s3fifo", libcachesim.S3FIFO)):
                replay_keys(make_policy(ours_name, capacity + 1), keys[:2000])  # JIT warm-up
                hits, t_ours = timed(lambda: int(replay_keys(make_policy(ours_name, capacity + 1),
                                                             keys).sum()))
                reader = libcachesim.TraceReader(
                    str(path), trace_type=libcachesim.TraceType.ORACLE_GENERAL_TRACE)
                (miss_ratio, _), t_c = timed(lambda: their_cls(capacity, hashpower=hp)
                                             .process_trace(reader))
                hits_loop, t_loop = timed(lambda: per_request(their_cls(capacity, hashpower=hp),
                                                              keys))
                assert hits == hits_loop == round(n * (1 - miss_ratio)), \
                    (ours_name, capacity, hits, hits_loop, miss_ratio)
                table.add_row(ours_name, f"{capacity:,}", f"{hits:,}", f"{n / t_ours:,.0f}",
                              f"{n / t_c:,.0f}", f"{n / t_loop:,.0f}", f"{t_c / t_ours:.2f}x",
                              f"{t_loop / t_ours:.2f}x")
    console.print(table)


if __name__ == "__main__":
    main()
