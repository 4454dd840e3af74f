"""Policy-state bytes per block of every registered policy.

Counted with `prefixshield.experiments.overhead.state_bytes`: the bytes of every numpy
array a freshly built policy holds after ``bind_tenants`` (its struct-of-arrays state is
allocated up front, so a full pool holds the same arrays), divided by the configured blocks;
PrefixShield's debt-over-time series is an observability buffer and is left out (as in the
overhead table). Every policy's state is numpy arrays, hash indexes included: S3-FIFO's ghost
(a ring of keys and a table of ring positions) and PrefixShield's admission history
(``history_factor x blocks`` entries, default 4x) are counted at their full, preallocated size. Sizes: 4,096 blocks / 32 groups and 1,048,576 / 1,024 (``--quick``: the
first).

Anchor: LRU (vLLM's free queue as intrusive lists), same size.
"""

from __future__ import annotations

from prefixshield.bench.common import Column, SectionResult, Tick, no_progress, ratio

SIZES = ((4096, 32), (1_048_576, 1024))
TARGET_BYTES = 48
"""Issue 10: policy state per block, bytes."""


def steps(quick: bool) -> int:
    """Progress steps this section announces."""
    return 1 if quick else len(SIZES)


def run(quick: bool = False, tick: Tick = no_progress) -> SectionResult:
    """Count the state of every policy at every size."""
    from prefixshield.experiments.overhead import CONTRACTS, OBSERVABILITY_ATTRS, state_bytes
    from prefixshield.policies import POLICIES, make_policy

    res = SectionResult(
        "state", "policy state bytes per block (numpy arrays, hash indexes included)",
        [Column("blocks", "blocks", ","), Column("groups", "groups", ","),
         Column("policy", "policy"), Column("bytes_per_block", "bytes / block", ".1f"),
         Column("over_lru", "/ LRU", ".2f", "x"),
         Column("target_bytes", "target", ",")])
    for blocks, groups in SIZES[:steps(quick)]:
        tick(f"state: {blocks:,} blocks / {groups:,} groups")
        per: dict[str, float] = {}
        for name in sorted(POLICIES):
            policy = make_policy(name, blocks)
            policy.bind_tenants([f"g{i}" for i in range(groups)], CONTRACTS)
            skip = {id(getattr(policy, a)) for a in OBSERVABILITY_ATTRS if hasattr(policy, a)}
            nbytes, _ = state_bytes(policy, skip)
            per[name] = nbytes / blocks
        for name, b in per.items():
            res.rows.append({"blocks": blocks, "groups": groups, "policy": name,
                             "bytes_per_block": b, "over_lru": ratio(b, per["lru"]),
                             "target_bytes": TARGET_BYTES})
    worst = {r["policy"]: r["bytes_per_block"] for r in res.rows}
    res.notes.append(f"target: <= {TARGET_BYTES} bytes of policy state per block; measured "
                     + ", ".join(f"{k} {v:.1f}" for k, v in worst.items())
                     + " (at the largest size run)")
    ps = [r for r in res.rows if r["policy"] == "prefixshield"]
    if ps:
        from prefixshield.policies.kernels import prefixshield_kernels as K

        blocks = ps[-1]["blocks"]
        policy = make_policy("prefixshield", blocks)
        hist = K.history_bytes(policy.history_capacity) / blocks
        res.notes.append(f"prefixshield: {hist:.1f} of its bytes per block are the admission "
                         f"history ({policy.history_capacity:,} (group, prefix_id) entries = "
                         f"{policy.history_factor:g} x blocks, the default), the rest "
                         f"{ps[-1]['bytes_per_block'] - hist:.1f}")
    res.notes.append("anchor: LRU, whose state is exactly vLLM's free queue (prev/next/member "
                     "per block)")
    return res
