"""Victim selection latency: PrefixShield's ``select_victims(1)`` on a full pool.

The method of `prefixshield.experiments.overhead.measure_overhead` (the overhead table of
``prefixshield reproduce``), with its seeded multi-group request stream
(`RequestStream`): requests fill the pool until no
truly free block is left, then as many again; then every timed round is one reclamation
(``select_victims(1)``, the whole Python call: wrapper, numba dispatch, kernel), the requester
materializing and releasing the block untimed. (``measure_overhead`` itself fills until
``num_free() == 0``, which counts free *cached* blocks too, so it always runs to its cap of 20
requests per block -- minutes at a million blocks; hence the fill here.)

Sizes (blocks / groups): 512/8, 4,096/32, 65,536/256, 1,048,576/1,024 (``--quick``: the first
two, 200 rounds instead of 2,000).

Anchor, same run, same pool size: LRU's ``select_victims(1)`` (vLLM's free-queue head as a
policy call) -- the floor of a Python call into a numba kernel on this machine.

The same rounds are also timed *inside one kernel* (`_ps_rounds`, `_lru_rounds`),
as the fused event loop and the key-stream replay run them: the policy's selection kernel
called from compiled code, each call timed by the cycle counter
(`prefixshield.bench.cycles`; counts converted to ns with the wall time of the same kernel
call), the requester's materialize and release between rounds untimed. This is the cost of the
selection itself; the Python call above adds the wrapper and numba's dispatch (the plugin's
path).
"""

from __future__ import annotations

import time

import numpy as np
from numba import njit

from prefixshield.bench.common import Column, SectionResult, Tick, no_progress, ratio
from prefixshield.bench.cycles import cycle_count, ns_per_count
from prefixshield.policies import lru as lru_module
from prefixshield.policies.kernels import linkedlist as ll
from prefixshield.policies.kernels import prefixshield_kernels as psk

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


@njit(cache=True)
def _lru_rounds(prev, nxt, member, length, num_blocks, rounds, counts):
    """``rounds`` LRU selections of one block as the fused loop makes them (the free queue's
    head), each released back cached; ``counts[i]``: cycle counts of selection i. Returns the
    counts of the whole loop."""
    blk = np.empty(1, dtype=np.int32)
    cached = np.ones(1, dtype=np.bool_)
    start = cycle_count()
    for i in range(rounds):
        c0 = cycle_count()
        ll.pop_head(prev, nxt, member, length, num_blocks, 0, 1, blk, 0)
        counts[i] = cycle_count() - c0
        lru_module._release(blk, cached, True, prev, nxt, member, length, num_blocks)
    return cycle_count() - start


def lru_kernel_select_us(num_blocks: int, rounds: int) -> np.ndarray:
    """Microseconds of each of ``rounds`` LRU selections inside one kernel call."""
    from prefixshield.policies import make_policy

    q = make_policy("lru", num_blocks)._queue
    counts = np.empty(rounds, dtype=np.uint64)
    _lru_rounds(q.prev, q.nxt, q.member, q.length, q.num_blocks, 50, counts)  # warm
    t0 = time.perf_counter_ns()
    total = _lru_rounds(q.prev, q.nxt, q.member, q.length, q.num_blocks, rounds, counts)
    wall_ns = time.perf_counter_ns() - t0
    return counts.astype(np.float64) * ns_per_count(wall_ns, int(total)) / 1e3


@njit(cache=True)
def _ps_rounds(st, groups, contracts, prefix_ids, times, counts):
    """One PrefixShield selection of one block per round, as the fused loop makes it
    (`select` on the packed buffer,
    which advances the clock), then the requester materializes and releases the block;
    ``counts[i]``: cycle counts of selection i. Returns the counts of the whole loop, or -1 if
    a selection or materialization failed."""
    blk = np.empty(1, dtype=np.int32)
    cached = np.ones(1, dtype=np.bool_)
    start = cycle_count()
    for i in range(groups.shape[0]):
        c0 = cycle_count()
        got = psk.select(st, 1, times[i], groups[i], blk, 0)
        counts[i] = cycle_count() - c0
        if got < 0:
            return -1
        # each round is a request of its own (no class carried over), no decode block
        _d, bad, _k = psk.materialize(st, blk, groups[i], contracts[i], prefix_ids[i], times[i],
                                      psk.NO_CLASS, 0)
        if bad >= 0 or psk.release(st, blk, cached) >= 0:
            return -1
    return np.int64(cycle_count() - start)


def ps_kernel_select_us(policy, stream, rounds: int) -> np.ndarray:
    """Microseconds of each of ``rounds`` PrefixShield selections inside one kernel call, the
    requests drawn from ``stream`` (the pool stays full: each block is released cached)."""
    draws = [stream.next() for _ in range(rounds)]
    groups = np.array([d[0] for d in draws], dtype=np.int64)
    contracts = np.array([d[1] for d in draws], dtype=np.int64)
    prefix_ids = np.array([d[2] for d in draws], dtype=np.int64)
    times = np.array([d[4] for d in draws], dtype=np.float64)
    counts = np.empty(rounds, dtype=np.uint64)
    t0 = time.perf_counter_ns()
    total = _ps_rounds(policy._state, groups, contracts, prefix_ids, times, counts)
    wall_ns = time.perf_counter_ns() - t0
    if total < 0:
        raise RuntimeError("in-kernel selection rounds failed (a selection or materialization "
                           "returned an error)")
    return counts.astype(np.float64) * ns_per_count(wall_ns, int(total)) / 1e3


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


def prefixshield_select_us(num_blocks: int, num_groups: int,
                           rounds: int) -> tuple[np.ndarray, np.ndarray]:
    """Microseconds of each of ``rounds`` timed ``select_victims(1)`` calls on a full pool, then
    of ``rounds`` more selections inside one kernel call (the same pool, the stream going on)."""
    warm, ws = filled(64, min(num_groups, 8))  # JIT warm (kernels are cached on disk)
    for _ in range(50):
        _request(warm, ws, 1)
    ps_kernel_select_us(warm, ws, 50)
    policy, stream = filled(num_blocks, num_groups)
    out = np.array([_request(policy, stream, 1) for _ in range(rounds)], dtype=np.float64)
    kernel = ps_kernel_select_us(policy, stream, rounds)
    policy.check_invariants()
    return out[out > 0] / 1e3, kernel


def trimmed_mean(us: np.ndarray) -> float:
    """Mean of the samples at or below their 99th percentile: the call's cost without the
    slowest 1%, where a shared machine's preemptions land (a single one is tens of us, enough to
    move a 2,000-round mean by a microsecond). Shown beside the plain mean, never instead."""
    return float(us[us <= np.percentile(us, 99)].mean())


def run(quick: bool = False, tick: Tick = no_progress) -> SectionResult:
    """Measure every size of `sizes`."""
    rounds = 200 if quick else 2000
    res = SectionResult(
        "selector", f"victim selection latency, one block from a full pool (us, {rounds:,} "
                    f"rounds): select_victims(1) as a Python call, and inside a kernel",
        [Column("blocks", "blocks", ","), Column("groups", "groups", ","),
         Column("mean_us", "PrefixShield call mean", ".2f"),
         Column("median_us", "median", ".2f"),
         Column("trimmed_mean_us", "mean <= P99", ".2f"),
         Column("lru_mean_us", "LRU call mean (anchor)", ".2f"),
         Column("over_lru", "call / LRU", ".2f", "x"),
         Column("kernel_mean_us", "PrefixShield in-kernel mean", ".3f"),
         Column("kernel_median_us", "median", ".3f"),
         Column("kernel_p95_us", "P95", ".3f"),
         Column("lru_kernel_mean_us", "LRU in-kernel mean (anchor)", ".3f"),
         Column("kernel_over_lru", "in-kernel / LRU", ".1f", "x"),
         Column("target_us", "target mean", ".1f")])
    for blocks, groups in sizes(quick):
        tick(f"selection: {blocks:,} blocks / {groups:,} groups")
        ps, ps_kernel = prefixshield_select_us(blocks, groups, rounds)
        lru = lru_select_us(blocks, rounds)
        lru_kernel = lru_kernel_select_us(blocks, rounds)
        res.rows.append({"blocks": blocks, "groups": groups, "mean_us": float(ps.mean()),
                         "median_us": float(np.median(ps)),
                         "p95_us": float(np.percentile(ps, 95)),
                         "trimmed_mean_us": trimmed_mean(ps), "max_us": float(ps.max()),
                         "lru_trimmed_mean_us": trimmed_mean(lru),
                         "lru_mean_us": float(lru.mean()),
                         "lru_median_us": float(np.median(lru)),
                         "over_lru": ratio(float(ps.mean()), float(lru.mean())),
                         "kernel_mean_us": float(ps_kernel.mean()),
                         "kernel_median_us": float(np.median(ps_kernel)),
                         "kernel_p95_us": float(np.percentile(ps_kernel, 95)),
                         "kernel_max_us": float(ps_kernel.max()),
                         "lru_kernel_mean_us": float(lru_kernel.mean()),
                         "lru_kernel_median_us": float(np.median(lru_kernel)),
                         "kernel_over_lru": ratio(float(ps_kernel.mean()),
                                                  float(lru_kernel.mean())),
                         "target_us": TARGETS_US.get((blocks, groups))})
    for (blocks, groups), target in TARGETS_US.items():
        got = [r for r in res.rows if r["blocks"] == blocks and r["groups"] == groups]
        if got:
            r = got[0]
            res.notes.append(f"target at {blocks:,}/{groups:,}: mean <= {target:g} us; measured "
                             f"{r['kernel_mean_us']:.3f} us inside the kernel (the fused engine's "
                             f"and the replay's path), {r['mean_us']:.2f} us as a Python call "
                             f"(the plugin's path; LRU's call: {r['lru_mean_us']:.2f} us)")
    res.notes.append("anchors: LRU's selection on a pool of the same size, same run: as a "
                     "Python call (select_victims(1): the cost of a call into a numba kernel "
                     "here) and inside a kernel (the free queue's head, as the fused loop takes "
                     "it)")
    res.notes.append("in-kernel: each selection timed by the cycle counter inside one kernel "
                     "call of all rounds, counts converted with that call's wall time; the "
                     "requester's materialize and release between rounds are not timed")
    res.notes.append("mean <= P99: the call's mean without the slowest 1% of rounds (load "
                     "spikes of a shared machine); the target is on the plain mean")
    return res
