"""Policy overhead: victim-selection latency and policy-state bytes per block.

The pool is driven through the policy interface only, so every policy is measured the same way:
a seeded request stream over ``num_groups`` groups (Zipf-like group choice, contracts critical /
standard / best_effort round-robin, 1-8 new blocks per request, creation at twice the total
refill so some groups owe and others do not) first fills the pool with cached free blocks; then
each timed round asks ``select_victims(1)`` (every victim is a reclamation: no truly free block is
left) and, untimed, the requester materializes and releases the block, so the pool stays full.

Latency is wall-clock time of the whole Python call (wrapper, dispatch, kernel), in microseconds:
a measurement of this machine, not a simulated quantity (``regress`` never compares it).
State bytes count the numpy arrays a policy holds (its struct-of-arrays state, per-group tables
included) divided by the configured blocks; hash-map entries (admission history, ghost queue) are
counted separately by entries. PrefixShield's debt-over-time series (``debt_log``, bounded by
``max_debt_samples``) is an observability buffer, not decision state: it is reported apart as
``observability_bytes``.
"""

from __future__ import annotations

import time

import numpy as np

from prefixshield.tenancy import DEFAULT_CONTRACTS

CONTRACTS = list(DEFAULT_CONTRACTS.values())
TIMED_ROUNDS = 2000
OBSERVABILITY_ATTRS = ("debt_log",)
"""Policy attributes that record history for reports and take no part in decisions."""


class RequestStream:
    """Deterministic requests ``(group, contract, prefix_id, new blocks, time s)`` over
    ``num_groups`` groups (seeded; see the module docstring)."""

    def __init__(self, num_groups: int, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        weights = 1.0 / np.arange(1, num_groups + 1)
        self.p = weights / weights.sum()
        self.contract_of = np.arange(num_groups) % len(CONTRACTS)
        refill = sum(CONTRACTS[c].rho_blocks_per_s for c in self.contract_of)
        self.dt = 4.5 / (2.0 * refill)  # mean 4.5 blocks per request, at 2x the total refill
        self.num_groups = num_groups
        self.t = 0.0
        self.prefix = 0

    def next(self) -> tuple[int, int, int, int, float]:
        """The next request."""
        self.t += self.dt
        g = int(self.rng.choice(self.num_groups, p=self.p))
        self.prefix += 1
        pid = int(self.rng.integers(4)) if self.rng.random() < 0.5 else self.prefix
        return g, int(self.contract_of[g]), pid, int(self.rng.integers(1, 9)), self.t


def _request(policy, stream: RequestStream, n: int | None = None,
             used: np.ndarray | None = None) -> int:
    """Select, materialize and release one request's blocks; returns ns spent selecting.
    ``used[b]`` is set for every block materialized (to know when none is truly free)."""
    g, c, pid, new, t = stream.next()
    if n is not None:
        new = n
    new = min(new, policy.available(g))
    if new == 0:
        return 0
    t0 = time.perf_counter_ns()
    blocks = policy.select_victims(new, t, g)
    dt = time.perf_counter_ns() - t0
    if used is not None:
        used[blocks] = True
    keys = stream.rng.integers(1, 2 ** 62, size=blocks.size).astype(np.uint64)
    policy.on_materialize(blocks, keys, g, c, pid, t)
    policy.on_release(blocks[::-1].copy(), np.ones(blocks.size, dtype=np.bool_), t)
    return dt


def state_bytes(obj, seen: set | None = None) -> tuple[int, int]:
    """(bytes of numpy arrays, hash-map entries) reachable from ``obj``'s attributes."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0, 0
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        base = obj.base if obj.base is not None else obj
        if id(base) in seen and base is not obj:
            return 0, 0
        seen.add(id(base))
        return int(base.nbytes if isinstance(base, np.ndarray) else obj.nbytes), 0
    nbytes = entries = 0
    if type(obj).__name__ in ("Dict", "DictType") or hasattr(obj, "_dict_type"):
        return 0, len(obj)
    attrs = getattr(obj, "__dict__", None)
    if attrs is None:
        if isinstance(obj, (list, tuple)):
            for x in obj:
                b, e = state_bytes(x, seen)
                nbytes += b
                entries += e
        return nbytes, entries
    for v in attrs.values():
        if isinstance(v, (np.ndarray, list, tuple)) or hasattr(v, "__dict__") \
                or hasattr(v, "_dict_type"):
            b, e = state_bytes(v, seen)
            nbytes += b
            entries += e
    return nbytes, entries


def measure_overhead(policy_spec: str, num_blocks: int, num_groups: int,
                     rounds: int = TIMED_ROUNDS) -> dict:
    """Latency of ``select_victims(1)`` (mean, median, P95; microseconds) and state bytes per block
    of ``policy_spec`` on a full pool of ``num_blocks`` blocks shared by ``num_groups`` groups."""
    from prefixshield.experiments.overrides import parse_policy_spec
    from prefixshield.policies import make_policy

    name, kwargs = parse_policy_spec(policy_spec)

    def filled():
        policy = make_policy(name, num_blocks, **kwargs)
        policy.bind_tenants([f"g{i}" for i in range(num_groups)], CONTRACTS)
        stream = RequestStream(num_groups)
        # released blocks stay cached, so once every block was materialized at least once no
        # truly free block is left: from then on every victim is a reclamation
        used = np.zeros(num_blocks, dtype=np.bool_)
        used[0] = True  # the null block
        count = 0
        while not used.all() and count < 4 * num_blocks:
            _request(policy, stream, used=used)
            count += 1
        for _ in range(count):
            _request(policy, stream)
        return policy, stream

    warm, ws = filled()  # JIT and caches warm
    for _ in range(50):
        _request(warm, ws, 1)
    policy, stream = filled()
    samples = np.array([_request(policy, stream, 1) for _ in range(rounds)], dtype=np.float64)
    samples = samples[samples > 0] / 1e3
    policy.check_invariants()
    observability = [getattr(policy, a) for a in OBSERVABILITY_ATTRS if hasattr(policy, a)]
    obs_bytes, _ = state_bytes(observability)
    nbytes, entries = state_bytes(policy, {id(o) for o in observability})
    return {"select_mean_us": float(samples.mean()),
            "select_median_us": float(np.median(samples)),
            "select_p95_us": float(np.percentile(samples, 95)),
            "state_bytes_per_block": nbytes / num_blocks, "hash_entries": int(entries),
            "observability_bytes": int(obs_bytes), "blocks": num_blocks, "groups": num_groups}
