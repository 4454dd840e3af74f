"""Victim selection latency: PrefixShield's ``select_victims(1)`` on a full pool.

The method of :func:`prefixshield.experiments.overhead.measure_overhead` (the overhead table of
``prefixshield reproduce``), with its seeded multi-group request stream
(:class:`~prefixshield.experiments.overhead.RequestStream`): requests fill the pool until no
truly free block is left, then as many again; then every timed round is one reclamation
(``select_victims(1)``, the whole Python call: wrapper, numba dispatch, kernel), the requester
materializing and releasing the block untimed. (``measure_overhead`` itself fills until
``num_free() == 0``, which counts free *cached* blocks too, so it always runs to its cap of 20
requests per block -- minutes at a million blocks; hence the fill here.)

Sizes (blocks / groups): 512/8, 4,096/32, 65,536/256, 1,048,576/1,024 (``--quick``: the first
two, 200 rounds instead of 2,000).

Anchor, same run, same pool size: LRU's ``select_victims(1)`` (vLLM's free-queue head as a
policy call) -- the floor of a Python call into a numba kernel on this machine.
"""

from __future__ import annotations

import time

import numpy as np

from prefixshield.bench.common import Column, SectionResult, Tick, no_progress, ratio

SIZES = ((512, 8), (4096, 32), (65536, 256), (1_048_576, 1024))
TARGETS_US = {(4096, 32): 1.0, (1_048_576, 1024): 2.0}
"""Issue 10: mean selection latency targets, microseconds."""


def sizes(quick: bool) -> tuple[tuple[int, int], ...]:
    """(blocks, groups) measured."""
    return SIZES[:2] if quick else SIZES


def steps(quick: bool) -> int:
    """Progress steps this section announces."""
    return len(sizes(quick))


def lru_select_us(num_blocks: int, rounds: int) -> np.ndarray:
    """Microseconds of each of ``rounds`` LRU ``select_victims(1)`` calls (the block is released
    back, cached, untimed)."""
    from prefixshield.policies import make_policy

    policy = make_policy("lru", num_blocks)
    cached = np.ones(1, dtype=np.bool_)
    for _ in range(50):  # warm
        policy.on_release(policy.select_victims(1, 0.0, 0), cached, 0.0)
    out = np.empty(rounds, dtype=np.float64)
    for i in range(rounds):
        t0 = time.perf_counter_ns()
        b = policy.select_victims(1, float(i), 0)
        out[i] = time.perf_counter_ns() - t0
        policy.on_release(b, cached, float(i))
    return out / 1e3


def _request(policy, stream, n: int | None = None) -> int:
    """One request of ``stream``: select, materialize, release; returns ns spent selecting."""
    g, c, pid, new, t = stream.next()
    new = min(new if n is None else n, policy.available(g))
    if new == 0:
        return 0
    t0 = time.perf_counter_ns()
    blocks = policy.select_victims(new, t, g)
    dt = time.perf_counter_ns() - t0
    keys = stream.rng.integers(1, 2 ** 62, size=blocks.size).astype(np.uint64)
    policy.on_materialize(blocks, keys, g, c, pid, t)
    policy.on_release(blocks[::-1].copy(), np.ones(blocks.size, dtype=np.bool_), t)
    return dt


def filled(num_blocks: int, num_groups: int, seed: int = 0):
    """A PrefixShield policy with no truly free block left, and its request stream."""
    from prefixshield.experiments.overhead import CONTRACTS, RequestStream
    from prefixshield.policies import make_policy

    policy = make_policy("prefixshield", num_blocks)
    policy.bind_tenants([f"g{i}" for i in range(num_groups)], CONTRACTS)
    stream = RequestStream(num_groups, seed)
    count = 0
    while policy.num_truly_free() > 0:
        _request(policy, stream)
        count += 1
    for _ in range(count):
        _request(policy, stream)
    return policy, stream


def prefixshield_select_us(num_blocks: int, num_groups: int, rounds: int) -> np.ndarray:
    """Microseconds of each of ``rounds`` timed ``select_victims(1)`` on a full pool."""
    warm, ws = filled(64, min(num_groups, 8))  # JIT warm (kernels are cached on disk)
    for _ in range(50):
        _request(warm, ws, 1)
    policy, stream = filled(num_blocks, num_groups)
    out = np.array([_request(policy, stream, 1) for _ in range(rounds)], dtype=np.float64)
    policy.check_invariants()
    return out[out > 0] / 1e3


def trimmed_mean(us: np.ndarray) -> float:
    """Mean of the samples at or below their 99th percentile: the call's cost without the
    slowest 1%, where a shared machine's preemptions land (a single one is tens of us, enough to
    move a 2,000-round mean by a microsecond). Shown beside the plain mean, never instead."""
    return float(us[us <= np.percentile(us, 99)].mean())


def run(quick: bool = False, tick: Tick = no_progress) -> SectionResult:
    """Measure every size of :func:`sizes`."""
    rounds = 200 if quick else 2000
    res = SectionResult(
        "selector", f"victim selection latency, select_victims(1) on a full pool (us, {rounds:,} "
                    f"rounds)",
        [Column("blocks", "blocks", ","), Column("groups", "groups", ","),
         Column("mean_us", "PrefixShield mean", ".2f"),
         Column("median_us", "median", ".2f"), Column("p95_us", "P95", ".2f"),
         Column("trimmed_mean_us", "mean <= P99", ".2f"), Column("max_us", "max", ".1f"),
         Column("lru_mean_us", "LRU mean (anchor)", ".2f"),
         Column("over_lru", "PrefixShield / LRU", ".2f", "x"),
         Column("target_us", "target mean", ".1f")])
    for blocks, groups in sizes(quick):
        tick(f"selection: {blocks:,} blocks / {groups:,} groups")
        ps = prefixshield_select_us(blocks, groups, rounds)
        lru = lru_select_us(blocks, rounds)
        res.rows.append({"blocks": blocks, "groups": groups, "mean_us": float(ps.mean()),
                         "median_us": float(np.median(ps)),
                         "p95_us": float(np.percentile(ps, 95)),
                         "trimmed_mean_us": trimmed_mean(ps), "max_us": float(ps.max()),
                         "lru_trimmed_mean_us": trimmed_mean(lru),
                         "lru_mean_us": float(lru.mean()),
                         "lru_median_us": float(np.median(lru)),
                         "over_lru": ratio(float(ps.mean()), float(lru.mean())),
                         "target_us": TARGETS_US.get((blocks, groups))})
    for (blocks, groups), target in TARGETS_US.items():
        got = [r for r in res.rows if r["blocks"] == blocks and r["groups"] == groups]
        if got:
            res.notes.append(f"target at {blocks:,}/{groups:,}: mean <= {target:g} us; measured "
                             f"{got[0]['mean_us']:.2f} us")
    res.notes.append("anchor: LRU select_victims(1) on a pool of the same size, same run (the "
                     "cost of a Python call into a numba kernel here)")
    res.notes.append("mean <= P99: the mean without the slowest 1% of rounds (load spikes of a "
                     "shared machine); the target is on the plain mean")
    return res
