"""Soak: random pool operations through the cache manager, every invariant checked after each.

A seeded random driver plays the part of a scheduler, without its politeness: requests of 4
groups on 3 contracts arrive with prompts that share a few prefixes; admissions look up the
prefix and allocate a chunk with the full-prompt reservation of the compat mode; running requests
take chunked prefill steps and decode steps (which open and fill blocks); random requests are
preempted (freed, then re-admitted later: recomputation) or finish; the clock jumps by random
amounts, sometimes far (debt clears, buckets refill). After every operation the pool's invariants
(free set == ref-count-0 blocks, null block, occupancy == owners, hash map) and the policy's own
(`check_invariants`) are checked; a violation raises
with the operation number, so a failure is reproducible from ``(policy, compat, seed, op)``.

``python -m prefixshield.simulator.soak --ops 1000000`` runs the full size for every policy and
compat mode (the tests run a quick size).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

import numpy as np

from prefixshield.policies import POLICIES, make_policy
from prefixshield.policies.base import COMPAT_MODES
from prefixshield.simulator.blockpool import BlockPool
from prefixshield.simulator.kvcache import KVCacheManager, make_sequence
from prefixshield.tenancy import DEFAULT_CONTRACTS

GROUPS = ("g0", "g1", "g2", "g3")
BLOCK_SIZE = 4


@dataclass
class SoakStats:
    """Operations done per kind, and the most blocks in use at once."""

    ops: int = 0
    admissions: int = 0
    refused: int = 0
    steps: int = 0
    preemptions: int = 0
    finishes: int = 0
    jumps: int = 0
    evictions: int = 0
    peak_in_use: int = 0


def soak(policy_name: str, compat: str, num_ops: int, seed: int = 0, num_blocks: int = 48,
         check_every: int = 1) -> SoakStats:
    """Run ``num_ops`` random operations on a fresh pool of ``num_blocks`` blocks.

    Raises ``AssertionError`` (naming the operation) at the first broken invariant.
    """
    rng = np.random.default_rng([seed, 0x50A4])
    policy = make_policy(policy_name, num_blocks, vllm_compat=compat)
    policy.bind_tenants(GROUPS, list(DEFAULT_CONTRACTS.values()))
    pool = BlockPool(num_blocks, policy, len(GROUPS))
    kv = KVCacheManager(pool, BLOCK_SIZE)
    prefixes = [rng.integers(0, 50, size=int(rng.integers(4, 40))) for _ in range(6)]
    waiting: list = []
    running: list = []
    stats = SoakStats()
    now = 0.0
    next_id = 0
    reserve_full = compat == "current"
    for op in range(num_ops):
        r = rng.random()
        if r < 0.22 or (not waiting and not running):
            # a new request: a shared prefix (or none) + a unique suffix + an output
            g = int(rng.integers(len(GROUPS)))
            parts = [prefixes[int(rng.integers(len(prefixes)))]] if rng.random() < 0.7 else []
            parts.append(rng.integers(50, 1000, size=int(rng.integers(1, 24))))
            prompt = np.concatenate(parts).astype(np.int64)
            out = rng.integers(0, 1000, size=int(rng.integers(1, 12))).astype(np.int64)
            seq = make_sequence(next_id, g, g % 3, int(rng.integers(8)),
                                np.concatenate([prompt, out]), len(prompt), BLOCK_SIZE, 0)
            seq.num_output_tokens = len(out)
            next_id += 1
            waiting.append(seq)
        elif r < 0.45 and waiting:
            # admit the head (or a random waiting request) with a chunk of its prompt
            seq = waiting[0] if rng.random() < 0.7 else waiting[int(rng.integers(len(waiting)))]
            hits, hit_tokens = kv.get_computed_blocks(seq)
            remaining = seq.num_tokens - hit_tokens
            k = int(min(remaining, rng.integers(1, 3 * BLOCK_SIZE + 2)))
            reserve = seq.num_tokens if reserve_full else 0
            if kv.allocate_slots(seq, k, now, hits, reserve):
                seq.num_computed_tokens = hit_tokens + k
                waiting.remove(seq)
                running.append(seq)
                stats.admissions += 1
            else:
                stats.refused += 1
        elif r < 0.80 and running:
            # a step of a random running request: the rest of a chunked prefill, or a decode
            seq = running[int(rng.integers(len(running)))]
            if seq.num_computed_tokens < seq.num_tokens:
                k = int(min(seq.num_tokens - seq.num_computed_tokens, rng.integers(1, 9)))
            else:
                k = 1  # decode one token
            if kv.allocate_slots(seq, k, now):
                seq.num_computed_tokens += k
                if seq.num_computed_tokens >= seq.num_tokens:
                    seq.num_output_done += 1  # the token of this step
                stats.steps += 1
                if seq.num_output_done >= seq.num_output_tokens:
                    kv.free(seq, now, finished=True)
                    running.remove(seq)
                    stats.finishes += 1
            else:
                # vLLM preempts the most recently admitted request to make room
                victim = running.pop()
                kv.free(victim, now)
                waiting.insert(0, victim)
                stats.preemptions += 1
        elif r < 0.88 and running:
            victim = running.pop(int(rng.integers(len(running))))
            preempted = rng.random() < 0.5
            kv.free(victim, now, finished=not preempted)
            if preempted:
                waiting.append(victim)  # preempted: recomputed later
                stats.preemptions += 1
            else:
                stats.finishes += 1  # aborted
        else:
            now += float(rng.exponential(0.05)) if rng.random() < 0.9 else float(
                rng.uniform(5.0, 50.0))
            stats.jumps += 1
        stats.ops += 1
        in_use = int(np.count_nonzero(pool.ref_cnt[1:]))
        stats.peak_in_use = max(stats.peak_in_use, in_use)
        if op % check_every == 0:
            try:
                pool.check_invariants()
            except AssertionError as e:
                raise AssertionError(f"{policy_name} ({compat}, seed {seed}): operation {op}: "
                                     f"{e}") from None
    stats.evictions = int(pool.evictions.sum()) if hasattr(pool, "evictions") else 0
    return stats


def main(argv: list[str] | None = None) -> int:
    """Command line: every policy x compat mode at ``--ops`` operations; exit 1 on a violation."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--blocks", type=int, default=48)
    args = ap.parse_args(argv)
    failed = 0
    for name in sorted(POLICIES):
        for compat in COMPAT_MODES:
            t0 = time.perf_counter()
            try:
                s = soak(name, compat, args.ops, seed=args.seed, num_blocks=args.blocks)
            except AssertionError as e:
                print(f"FAIL {e}")
                failed += 1
                continue
            print(f"{name:13s} {compat:8s} {s.ops:,} ops, 0 violations: {s.admissions:,} "
                  f"admissions ({s.refused:,} refused), {s.steps:,} steps, {s.preemptions:,} "
                  f"preemptions, {s.finishes:,} finishes, {s.jumps:,} clock jumps, "
                  f"{s.evictions:,} evictions, peak {s.peak_in_use} blocks in use "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
