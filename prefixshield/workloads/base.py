"""What every synthetic workload shares: its base params and the building blocks of a trace.

Every generator is a pure function of one frozen params dataclass and returns a validated
[`Trace`][prefixshield.traces.schema.Trace]. Randomness comes only from
``numpy.random.default_rng([seed, stream])`` with one fixed stream per role of the workload
(victim, attacker, neutral/benign, ...), never from a global RNG or the wall clock; so the same
params give a bit-identical trace, and switching a role off leaves every other row unchanged.

Units: times in seconds, rates in requests per second, lengths in tokens unless a name says
blocks. ``base_rate`` is the rate ``alpha * C_prefill`` that the caller computes from a profile
with the workload's own request shapes (every params class has ``probe_shapes(n)``);
``C_prefill`` is recovered as ``base_rate / alpha``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from prefixshield.edges import MAX_REQUESTS, check_count, check_requests
from prefixshield.traces.rows import RequestRows
from prefixshield.traces.schema import DEFAULT_VOCAB_SIZE, MAX_VOCAB_SIZE
from prefixshield.traces.segments import SegmentKind, segment_ids
from prefixshield.workloads.outputs import (DEFAULT_OUTPUT_DIST, check_outputs,
                                            describe_outputs, draw_output_tokens,
                                            output_support)

# RNG streams: one per role, so removing one role's rows changes no other row.
STREAM_VICTIM = 1
STREAM_ATTACKER = 2
STREAM_NEUTRAL = 3
STREAM_CONVERSATIONS = 4
STREAM_ACTIVE = 5
STREAM_IDLE = 6
STREAM_PROBE = 7
"""The C_prefill probe's requests: a fixed stream and seed, so C_prefill is a property of the
workload's shape, the profile and the engine, not of a trace seed."""

PROBE_SEED = 0
STREAM_BACKGROUND = 8
"""The background groups of an attack trace's population (one stream, drawn group after
group)."""


def check(cond: bool, msg: str) -> None:
    """Raise ValueError(msg) unless ``cond``."""
    if not cond:
        raise ValueError(msg)


def check_range(name: str, rng: tuple[int, int], lo: int) -> None:
    """Raise unless ``rng`` is ``(min, max)`` with ``lo <= min <= max``."""
    check(len(rng) == 2 and lo <= rng[0] <= rng[1],
          f"{name} must be (min, max) with {lo} <= min <= max, got {rng!r}")


@dataclass(frozen=True)
class WorkloadParams:
    """Parameters every workload shares.

    Attributes:
        seed: RNG seed of the workload and token seed of the trace (segment token ids).
        base_rate: the workload's base arrival rate in requests/s; the caller sets it to
            ``alpha * C_prefill``.
        alpha: nominal load; ``C_prefill = base_rate / alpha`` (requests/s); 0.6: the
            reference setup.
        block_size: tokens per KV block (16: the reference setup).
        num_blocks: configured KV blocks; usable = ``num_blocks - 1`` (block 0 is the null block);
            512: the reference setup.
        duration_s: length of the measured phase in seconds. 60 s is not stated by the
            reference; it is the project's first default, kept as it was (no duration here was
            chosen for the result it gives).
        vocab_size: token ids are drawn in ``[0, vocab_size)`` (1,000 fits the tiny live-mode
            model; token values do not change any cache decision).
    """

    seed: int = 0
    base_rate: float = 2.0
    alpha: float = 0.6
    block_size: int = 16
    num_blocks: int = 512
    duration_s: float = 60.0
    vocab_size: int = DEFAULT_VOCAB_SIZE

    def __post_init__(self) -> None:
        check(0 <= self.seed < 2 ** 63, f"seed must be in [0, 2**63), got {self.seed}")
        check(self.base_rate > 0 and math.isfinite(self.base_rate),
              f"base_rate must be > 0 requests/s, got {self.base_rate}")
        check(0 < self.alpha, f"alpha must be > 0, got {self.alpha}")
        check(self.block_size >= 1, f"block_size must be >= 1, got {self.block_size}")
        check(self.num_blocks >= 2, f"num_blocks must be >= 2, got {self.num_blocks}")
        check(0 < self.duration_s < math.inf, f"duration_s must be a finite number > 0 s, got "
              f"{self.duration_s}")
        check(2 <= self.vocab_size <= MAX_VOCAB_SIZE,
              f"vocab_size must be in [2, {MAX_VOCAB_SIZE}], got {self.vocab_size}")

    @property
    def c_prefill(self) -> float:
        """Unique-prefill capacity C_prefill in requests/s (``base_rate / alpha``)."""
        return self.base_rate / self.alpha

    @property
    def usable_blocks(self) -> int:
        """Blocks available to requests: ``num_blocks - 1``."""
        return self.num_blocks - 1


@dataclass(frozen=True)
class PrefixParams(WorkloadParams):
    """Workloads whose requests are a shared or fresh prefix plus a unique suffix.

    Attributes:
        prefix_tokens: tokens of every prefix (1,536 = 96 blocks of 16: the reference setup).
        suffix_tokens: (min, max) tokens of the unique suffix after each prefix, uniform
            inclusive. 1-22 is fitted (the reference does not state it) to the reference's LRU
            hit ratios without attack, 99.19% (low_and_slow, two_pass_replay) and 99.33%
            (borrowing): a hit covers the prefix only, so the suffix sets how far below 100%
            a fully cached victim stays (docs/fidelity.md).
        warmup_gap_s: spacing of the warm-up requests in seconds (None: `warmup_gap`).
        output_dist: output-length distribution (see `prefixshield.workloads.outputs`):
            ``azure_conv`` (default: a production chat service's output lengths, mean 211
            tokens) or ``sharegpt``. Requests decode real outputs; one output token is an
            option, never a default.
        output_tokens: ``(min, max)``: draw output lengths uniformly from this stated range
            instead (``1,1``: the one-output-token prefill study); None: ``output_dist``.
        max_output_tokens: clip of ``output_dist`` lengths (vLLM's ``max_tokens``; None: none).
            8 is fitted (the reference does not state its output lengths) to the ~5.955
            requests/s LRU sustained at 60% load on the L4 with Qwen2.5-1.5B: on the shipped
            ``l4-qwen2.5-1.5b`` profile, ``0.6 x C_prefill`` of this request shape is 5.979
            requests/s (docs/fidelity.md). Requests decode 8 tokens (7 for the 0.005% of
            Azure's outputs that are shorter).
    """

    prefix_tokens: int = 1536
    suffix_tokens: tuple[int, int] = (1, 22)
    warmup_gap_s: float | None = None
    output_dist: str = DEFAULT_OUTPUT_DIST
    output_tokens: tuple[int, int] | None = None
    max_output_tokens: int | None = 8

    def __post_init__(self) -> None:
        super().__post_init__()
        check_outputs(self.output_dist, self.output_tokens, self.max_output_tokens)
        check(self.prefix_tokens >= 1, f"prefix_tokens must be >= 1, got {self.prefix_tokens}")
        check_range("suffix_tokens", self.suffix_tokens, 1)
        check(self.warmup_gap_s is None or self.warmup_gap_s >= 0,
              f"warmup_gap_s must be >= 0 s, got {self.warmup_gap_s}")

    @property
    def prefix_blocks(self) -> int:
        """Full blocks in one prefix (``prefix_tokens // block_size``)."""
        return self.prefix_tokens // self.block_size

    def draw_outputs(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` output lengths (tokens): ``output_tokens`` range, else ``output_dist``."""
        return draw_output_tokens(rng, self.output_dist, self.output_tokens,
                                  self.max_output_tokens, n)

    def draw_suffixes(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` suffix lengths (tokens), uniform in ``suffix_tokens``."""
        return rng.integers(self.suffix_tokens[0], self.suffix_tokens[1] + 1, size=n,
                            dtype=np.int64)

    def probe_shapes(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(prompt tokens, output tokens) of ``n`` distinct-prefix requests shaped like this
        workload's, for measuring ``C_prefill``: prefix-plus-suffix prompts with this workload's
        output lengths (fixed RNG: independent of ``seed``). Every workload defines this."""
        rng = np.random.default_rng([PROBE_SEED, STREAM_PROBE])
        return self.prefix_tokens + self.draw_suffixes(rng, n), self.draw_outputs(rng, n)

    def shape_summary(self) -> str:
        """E.g. ``1,536-token prefix + 32-64 suffix, azure_conv outputs (mean 211 tokens)``."""
        return (f"{self.prefix_tokens:,}-token prefix + {self.suffix_tokens[0]}-"
                f"{self.suffix_tokens[1]} suffix, "
                f"{describe_outputs(self.output_dist, self.output_tokens, self.max_output_tokens)}")

    def expected_request_blocks(self, replay: bool = False) -> float:
        """Expected full blocks a request materializes (prompt and decode blocks, PrefixShield
        charges both): ``floor((P + O - 1) / B)`` for a fresh prefix (the last output token is
        never computed); for a replay whose prompt is fully cached, only the blocks beyond vLLM's
        hit cap ``floor((P - 1) / B)``. Exact over the suffix range and the output
        distribution."""
        B = self.block_size
        prompt = self.prefix_tokens + np.arange(self.suffix_tokens[0], self.suffix_tokens[1] + 1)
        out, p_out = output_support(self.output_dist, self.output_tokens,
                                    self.max_output_tokens)
        total = (prompt[:, None] + out[None, :] - 1) // B
        if replay:
            total = total - ((prompt[:, None] - 1) // B)
        return float(np.mean(total @ p_out))

    def warmup_gap(self, rho_blocks_per_s: float) -> float:
        """``warmup_gap_s``, or the spacing at which one fresh request per gap stays within a
        refill of ``rho_blocks_per_s`` (no faster than ``base_rate``): the warm-up populates a
        hot set within its group's creation entitlement, so the measured phase does not start
        with the group in debt for its own hot set."""
        if self.warmup_gap_s is not None:
            return self.warmup_gap_s
        return max(1.0 / self.base_rate, self.expected_request_blocks() / rho_blocks_per_s)


def rng_for(seed: int, stream: int) -> np.random.Generator:
    """The generator of one role's stream."""
    return np.random.default_rng([int(seed), stream])


def renewal_times(rng: np.random.Generator, rate: float, start: float, end: float,
                  cv: float = 1.0) -> np.ndarray:
    """Arrival times in ``[start, end)`` of a renewal process with mean rate ``rate`` (1/s).

    ``cv == 1``: Poisson (exponential gaps); otherwise Gamma gaps with shape ``1/cv**2``.
    The first arrival is one gap after ``start``.
    """
    span = end - start
    if span <= 0:
        return np.empty(0)
    check_requests(rate, span, "arrivals")  # before drawing: 1e12 s would ask for TiB
    mean_n = rate * span
    times = np.empty(0)
    t0 = start
    while True:
        n = int(mean_n * 1.2 + 10.0 * math.sqrt(mean_n + 1.0) * max(1.0, cv) + 16)
        if cv == 1.0:
            gaps = rng.exponential(1.0 / rate, size=n)
        else:
            shape = 1.0 / (cv * cv)
            gaps = rng.gamma(shape, 1.0 / (rate * shape), size=n)
        t = t0 + np.cumsum(gaps)
        times = np.concatenate([times, t[t < end]])
        if t[-1] >= end:
            return times
        t0 = float(t[-1])


def periodic_times(rate: float, start: float, end: float, limit: int | None = None) -> np.ndarray:
    """``start, start + 1/rate, ...`` below ``end`` (at most ``limit`` of them)."""
    if limit is None or limit > MAX_REQUESTS:
        check_requests(rate, end - start, "arrivals")
    n = max(0, math.ceil((end - start) * rate - 1e-9))
    if limit is not None:
        n = min(n, limit)
    t = start + np.arange(n) / rate
    return t[t < end]


def prefix_suffix_prompts(prefix_seg: np.ndarray, prefix_tokens: int, suffix_seg: np.ndarray,
                          suffix_len: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Segment ids and lengths (tokens) of ``[prefix, suffix]`` prompts: two ``(n, 2)`` int64
    arrays, row ``i`` = request ``i`` (the 2-D form `RequestRows.add` takes whole)."""
    suffix_len = np.asarray(suffix_len, dtype=np.int64)
    ids = np.stack([np.asarray(prefix_seg, dtype=np.int64),
                    np.asarray(suffix_seg, dtype=np.int64)], axis=1)
    lens = np.stack([np.full(len(suffix_len), prefix_tokens, dtype=np.int64), suffix_len],
                    axis=1)
    return ids, lens


def with_template(ids: np.ndarray, lens: np.ndarray, group_index: int, prefix_idx: np.ndarray,
                  template_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """``[prefix, suffix]`` prompts with a template of ``template_tokens`` tokens between the
    two, one per prefix (segment ``SYSTEM`` of the group, local id = the prefix index), shared
    by every request of that prefix; unchanged when ``template_tokens`` is 0."""
    if template_tokens == 0:
        return ids, lens
    tid = segment_ids(group_index, SegmentKind.SYSTEM, prefix_idx)
    return (np.column_stack([ids[:, 0], tid, ids[:, 1]]),
            np.column_stack([lens[:, 0], np.full(len(tid), template_tokens, dtype=np.int64),
                             lens[:, 1]]))


def add_cyclic_stream(rows: RequestRows, p: PrefixParams, *, stream: int, group_index: int,
                      group: str, contract: str, role: str, num_prefixes: int,
                      warmup_gap: float, rate: float | None = None,
                      template_tokens: int = 0) -> dict[str, float]:
    """Warm-up (each prefix once, ``warmup_gap`` s apart, unmeasured), then Poisson(``rate``;
    None: base_rate) requests cycling over the prefixes (prefix_id = prefix index), each with a
    unique suffix (after the prefix's template of ``template_tokens``, see
    `with_template`). Returns the measured window and request counts."""
    rng = rng_for(p.seed, stream)
    check_count(num_prefixes, MAX_REQUESTS, f"{role} prefixes (one warm-up request each)")
    warm_t = np.arange(num_prefixes) * warmup_gap
    start = num_prefixes * warmup_gap
    end = start + p.duration_s
    meas_t = renewal_times(rng, p.base_rate if rate is None else rate, start, end)
    n_w, n_m = len(warm_t), len(meas_t)
    n = n_w + n_m
    t = np.concatenate([warm_t, meas_t])
    prefix_idx = np.concatenate([np.arange(n_w), np.arange(n_m)]) % num_prefixes
    suffix_len = p.draw_suffixes(rng, n)
    out = p.draw_outputs(rng, n)
    ids, lens = prefix_suffix_prompts(
        segment_ids(group_index, SegmentKind.PREFIX, prefix_idx), p.prefix_tokens,
        segment_ids(group_index, SegmentKind.SUFFIX, np.arange(n)), suffix_len)
    ids, lens = with_template(ids, lens, group_index, prefix_idx, template_tokens)
    measured = np.arange(n) >= n_w
    rows.add(t, group, contract, role, prefix_idx, measured, out, ids, lens)
    return {"measure_start_s": float(start), "measure_end_s": float(end),
            "warmup_requests": int(n_w), "measured_requests": int(n_m)}


def add_fresh_prefixes(rows: RequestRows, p: PrefixParams, rng: np.random.Generator,
                       t: np.ndarray, local: np.ndarray, *, group_index: int, group: str,
                       contract: str, role: str, suffix_len: np.ndarray | None = None,
                       output_tokens: np.ndarray | None = None,
                       lead: tuple[np.ndarray, int] | None = None) -> np.ndarray:
    """Requests at times ``t`` with prefixes ``local`` (prefix_id = local id) of a namespace.

    Rows with equal ``local`` share prefix *and* suffix segment (a replay); ``suffix_len`` is
    indexed by local id (drawn here when None). Every row has its own output length
    (``output_tokens`` per row, drawn here when None). ``lead`` (segment id per row, tokens)
    puts that many tokens of a row's segment before its prefix (None: nothing). Returns the
    suffix lengths by local id.
    """
    local = np.asarray(local, dtype=np.int64)
    if suffix_len is None:
        n_local = int(local.max()) + 1 if local.size else 0
        suffix_len = p.draw_suffixes(rng, n_local)
    out = p.draw_outputs(rng, len(t)) if output_tokens is None else output_tokens
    ids, lens = prefix_suffix_prompts(
        segment_ids(group_index, SegmentKind.PREFIX, local), p.prefix_tokens,
        segment_ids(group_index, SegmentKind.SUFFIX, local), suffix_len[local])
    if lead is not None:
        ids, lens = with_lead(ids, lens, *lead)
    rows.add(t, group, contract, role, local, True, out, ids, lens)
    return suffix_len


def with_lead(ids: np.ndarray, lens: np.ndarray, lead_ids: np.ndarray,
              lead_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """``(n, k)`` segment ids and lengths (tokens) with a first column put before them:
    segment ``lead_ids[i]`` of ``lead_tokens`` tokens in row ``i``."""
    return (np.column_stack([np.asarray(lead_ids, dtype=np.int64), ids]),
            np.column_stack([np.full(len(ids), lead_tokens, dtype=np.int64), lens]))
