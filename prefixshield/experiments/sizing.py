"""Pool sizing from a trace: ``--blocks auto[:FRACTION]``, and the up-front refusal of a pool in
which some request can never be admitted under a policy.

* A trace's *unique blocks* are the distinct full-block hashes of every request's prompt and
  output, as the engine computes them (tenant salt, block size and the scheduler's output caps
  included): what an infinite cache would end up holding. ``auto:F`` configures
  ``ceil(F x unique) + 1`` blocks (the null block on top), raised where needed to the smallest
  pool in which every request can be admitted under every policy of the run (said so).
* A request needs ``ceil((prompt + output) / block_size)`` blocks by the time it finishes (a
  request preempted late comes back with its output so far, as the engine's own fit check
  counts it). A policy says how many blocks one group may hold with nothing else running
  (`prefixshield.policies.base.Policy.group_capacity`: every usable block, or
  static_quota's share) and the smallest pool that lets a group hold a given number
  (`prefixshield.policies.base.Policy.pool_for`). `check_admissible` refuses a pool
  in which the largest request exceeds that, before any simulation, naming the request, what it
  needs and the smallest pool that serves it.
"""

from __future__ import annotations

import math

import numpy as np

# AutoBlocks lives at the typed edge (the CLI's --blocks type builds it without numpy)
from prefixshield.edges import DEFAULT_AUTO_FRACTION, AutoBlocks  # noqa: F401
from prefixshield.experiments.overrides import parse_policy_spec
from prefixshield.simulator.config import EngineConfig
from prefixshield.traces.schema import Trace


def unique_blocks(trace: Trace, engine: EngineConfig) -> int:
    """Distinct full-block hashes over every request's prompt and output under ``engine``'s
    block size, hash seed and output caps (the tenant salt included: two tenants' equal
    prompts are two blocks, as the engine caches them)."""
    from prefixshield.fleet.hashes import trace_hashes

    hashes, _offsets, _info = trace_hashes(trace, engine)
    return int(np.unique(hashes).shape[0])


def request_needs(trace: Trace, engine: EngineConfig) -> np.ndarray:
    """Blocks each request holds by its end, ``ceil((prompt + output) / block_size)`` (int64,
    trace order; outputs after the scheduler's ``max_output_tokens`` caps)."""
    from prefixshield.scheduling.config import capped_outputs

    groups = trace.group_names()
    _, limits = engine.scheduler.resolve(groups)
    df = trace.requests
    gid = df["group"].astype(str).map({g: i for i, g in enumerate(groups)}).to_numpy(np.int64)
    total = trace.prompt_lengths() + capped_outputs(limits, gid,
                                                    df["output_tokens"].to_numpy(np.int64))
    return -(-total // engine.block_size)


def smallest_pool(trace: Trace, engine: EngineConfig, policies) -> tuple[int, str, int, int]:
    """The smallest configured pool in which every request of ``trace`` can be admitted under
    every policy spec of ``policies``: ``(blocks, policy, request row, its blocks needed)``,
    the policy and the request being the ones that set it (the first such policy)."""
    from prefixshield.policies import POLICIES

    need = request_needs(trace, engine)
    row = int(np.argmax(need))
    groups = len(trace.group_names())
    best = (0, "", row, int(need[row]))
    for spec in policies:
        name, _kw = parse_policy_spec(spec)
        pool = POLICIES[name].pool_for(int(need[row]), groups)
        if pool > best[0]:
            best = (pool, spec, row, int(need[row]))
    return best


def unadmittable(trace: Trace, engine: EngineConfig, policies, source: str) -> dict[str, str]:
    """The policy specs of ``policies`` under which some request of ``trace`` can never be
    admitted on ``engine``'s pool, each with its one-line reason: the policy, the request, the
    blocks it needs, what the policy lets its group hold, and the smallest pool that serves
    every request under every policy given. Empty when every policy serves every request."""
    from prefixshield.policies import POLICIES

    need = request_needs(trace, engine)
    if not need.size:
        return {}
    row = int(np.argmax(need))
    groups = trace.group_names()
    bad: dict[str, str] = {}
    pool = None
    for spec in policies:
        name, _kw = parse_policy_spec(spec)
        cap = POLICIES[name].group_capacity(engine.num_blocks, len(groups))
        if need[row] <= cap:
            continue
        if pool is None:  # the same for every policy refused
            pool = smallest_pool(trace, engine, policies)[0]
        df = trace.requests
        share = ("" if cap == engine.num_blocks - 1 else
                 f" (its share: {engine.num_blocks - 1:,} usable blocks over {len(groups)} "
                 "groups)")
        bad[spec] = (
            f"{source}: under {spec}, request {int(df['request_id'].iloc[row])} of group "
            f"{str(df['group'].iloc[row])!r} needs {int(need[row]):,} blocks of prompt and "
            f"output but a group may hold at most {cap:,} of {engine.num_blocks:,}{share}: it "
            f"could never be admitted; the smallest pool that serves it is {pool:,} blocks "
            f"(--blocks {pool})")
    return bad


def check_admissible(trace: Trace, engine: EngineConfig, policies, source: str) -> None:
    """Raise ``ValueError`` (one line, before any simulation) if some request of ``trace`` can
    never be admitted on ``engine``'s pool under one of ``policies`` (specs); the message is
    the first policy's of [`unadmittable`][prefixshield.experiments.sizing.unadmittable]."""
    bad = unadmittable(trace, engine, policies, source)
    if bad:
        raise ValueError(next(iter(bad.values())))


def resolve_auto(workload: str, engine: EngineConfig, policies, blocks) -> tuple[
        EngineConfig, str | None]:
    """``engine`` with ``blocks`` (an int, or `AutoBlocks` for a trace file
    ``workload``: sized by `auto_blocks` on the file's trace) and the sizing line (None
    for an int). Raises ``ValueError`` for ``auto`` with a generated workload (its trace is
    built for its pool, not the pool for it)."""
    from dataclasses import replace

    if not isinstance(blocks, AutoBlocks):
        return replace(engine, num_blocks=int(blocks)), None
    from prefixshield.experiments.single import is_trace_file

    if not is_trace_file(workload):
        raise ValueError(f"--blocks auto sizes the pool from a trace file; {workload!r} is a "
                         "generated workload, built for the pool it is given: give --blocks N")
    from prefixshield.traces.io import read_trace

    num_blocks, line = auto_blocks(read_trace(workload), engine, policies, blocks)
    return replace(engine, num_blocks=num_blocks), line


def auto_blocks(trace: Trace, engine: EngineConfig, policies,
                auto: AutoBlocks) -> tuple[int, str]:
    """The configured blocks of ``--blocks auto:F`` for ``trace`` and the line that says how
    they were sized: ``ceil(F x unique blocks) + 1``, raised to `smallest_pool` where
    some request would not fit it under one of ``policies``."""
    unique = unique_blocks(trace, engine)
    blocks = max(2, math.ceil(auto.fraction * unique) + 1)
    line = (f"--blocks auto:{auto.fraction:g}: {blocks:,} blocks = {auto.fraction:g} x the "
            f"trace's {unique:,} unique blocks of {engine.block_size} tokens + the null block")
    pool, spec, row, need = smallest_pool(trace, engine, policies)
    if pool > blocks:
        blocks = pool
        line += (f"; raised to {pool:,}, the smallest pool in which {spec} admits request "
                 f"{int(trace.requests['request_id'].iloc[row])} ({need:,} blocks)")
    return blocks, line
