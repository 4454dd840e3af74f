"""Benchmark (not a test): PrefixShield victim-selection latency per victim (DESIGN §5.4, G4).

At 512 blocks / 8 groups and 4096 blocks / 32 groups, the pool is first filled with cached free
candidates by a stream of requests (1..8 new blocks each, groups drawn Zipf-like, contracts
critical/standard/best_effort round-robin, creation at 2x the total refill so that some groups
owe and others do not). Then each timed round selects ``m`` victims (``select_victims``; no truly
free block is left, so every victim is a reclamation) and, untimed, the requester materializes
and releases them so the pool stays full. Reported per victim, in microseconds:

* numba ``select_victims(1)`` (the whole Python call: wrapper, dispatch, kernel);
* numba ``select_victims(16)`` / 16 (one kernel call for 16 victims);
* the pure-Python reference, which scans every candidate per victim (the prototype's method).

DESIGN quotes the original prototype at 480 us (512/8) and 3,100 us (4096/32) per victim.
Run: ``.venv/bin/python benchmarks/bench_selector.py``. Writes nothing.
"""

from __future__ import annotations

import time

import numpy as np
from rich.console import Console
from rich.table import Table

from prefixshield.experiments.overhead import CONTRACTS, RequestStream
from prefixshield.policies import make_policy
from prefixshield.policies.reference.prefixshield import ReferencePrefixShield

# The same seeded request stream as the overhead table of `prefixshield reproduce`.
Workload = RequestStream


def request(policy, wl: Workload, timed_m: int | None = None) -> tuple[int, int]:
    """One request: select, materialize, release. Returns (ns spent selecting, victims) when
    ``timed_m`` is given (then exactly ``timed_m`` blocks are taken)."""
    g, c, pid, n, t = wl.next()
    if timed_m is not None:
        n = timed_m
    t0 = time.perf_counter_ns()
    blocks = policy.select_victims(n, t, g)
    dt = time.perf_counter_ns() - t0
    if wl.rng.random() < 0.3:   # sometimes the request also hits one free candidate
        free = some_candidate(policy)
        if free.size:
            policy.on_hit(free, g, c, pid, t)
            policy.on_acquire(free)
            blocks = np.concatenate([blocks, free])
    policy.on_materialize(blocks[:n], np.zeros(n, dtype=np.uint64), g, c, pid, t)
    policy.on_release(blocks[::-1].copy(), np.ones(blocks.shape[0], dtype=np.bool_), t)
    return dt, n


def some_candidate(policy) -> np.ndarray:
    """One free cached block (the oldest-stamped one the structure yields first), or none."""
    if isinstance(policy, ReferencePrefixShield):
        return np.asarray(list(policy.candidates)[:1], dtype=np.int32)
    return np.flatnonzero(policy.cached & policy.free_mask())[:1].astype(np.int32)


def filled(policy, num_blocks: int, wl: Workload):
    """Bind and run requests until the pool holds no truly free block, then as many again."""
    policy.bind_tenants([f"g{i}" for i in range(wl.num_groups)], CONTRACTS)
    count = 0
    while (policy.num_truly_free() if hasattr(policy, "num_truly_free")
           else len(policy.truly_free)) > 0:
        request(policy, wl)
        count += 1
    for _ in range(count):
        request(policy, wl)
    return policy


def per_victim_us(policy, wl: Workload, m: int, rounds: int) -> float:
    total_ns = total = 0
    for _ in range(rounds):
        ns, n = request(policy, wl, timed_m=m)
        total_ns += ns
        total += n
    return total_ns / total / 1e3


def indebted_groups(policy, t: float) -> int:
    return sum(policy.debt(g, t) > 1e-9 for g in range(len(policy.groups)))


def main() -> None:
    console = Console(width=140)
    table = Table(title="PrefixShield selection latency per victim (microseconds)")
    for col in ("blocks", "groups", "indebted groups", "numba m=1", "numba m=16 (per victim)",
                "reference m=1", "reference m=16 (per victim)", "speedup m=1",
                "prototype (DESIGN)"):
        table.add_column(col, justify="right")
    # JIT warm-up on a small pool (compilation is cached on disk after the first run)
    warm = filled(make_policy("prefixshield", 64), 64, Workload(4))
    per_victim_us(warm, Workload(4), 4, 10)
    for num_blocks, num_groups, proto in ((512, 8, 480), (4096, 32, 3100)):
        fast = filled(make_policy("prefixshield", num_blocks), num_blocks, Workload(num_groups))
        wl = Workload(num_groups, seed=1)
        wl.t = fast._now
        fast_1 = min(per_victim_us(fast, wl, 1, 2000) for _ in range(3))
        fast_16 = min(per_victim_us(fast, wl, 16, 500) for _ in range(3))
        debtors = indebted_groups(fast, wl.t)
        fast.check_invariants()
        ref = filled(ReferencePrefixShield(num_blocks), num_blocks, Workload(num_groups))
        wr = Workload(num_groups, seed=1)
        wr.t = ref.clock
        ref_1 = per_victim_us(ref, wr, 1, 100 if num_blocks > 1000 else 300)
        ref_16 = per_victim_us(ref, wr, 16, 10 if num_blocks > 1000 else 30)
        table.add_row(str(num_blocks), str(num_groups), str(debtors), f"{fast_1:.2f}",
                      f"{fast_16:.2f}", f"{ref_1:.0f}", f"{ref_16:.0f}",
                      f"{ref_1 / fast_1:.0f}x", str(proto))
    console.print(table)


if __name__ == "__main__":
    main()
