"""Synthetic workload generators (DESIGN §7), registered in one place: :data:`WORKLOADS`.

Every generator is a pure function of one frozen params dataclass and returns a validated
:class:`~prefixshield.traces.schema.Trace`. Randomness comes only from
``numpy.random.default_rng([seed, stream])`` with one fixed stream per role of the workload
(victim, attacker, neutral/benign, ...), never from a global RNG or the wall clock; so the same
params give a bit-identical trace, and switching the attacker off (``attack=False``) leaves every
other row, ``request_id`` included, unchanged: the no-attack control *is* the attack trace minus
its attacker rows (request ids then have gaps; they still increase with arrival).

Units: times in seconds, rates in requests per second, lengths in tokens unless a name says
blocks. ``base_rate`` is the victim request rate ``alpha * C_prefill`` that the caller computes
from a profile (DESIGN §6); ``C_prefill`` is recovered as ``base_rate / alpha``.

Timeline of the attack workloads and ``borrowing``::

    t = 0                      measure_start_s                              measure_end_s
    |-- warm-up (measured=False) --|------------ measured phase (duration_s) ----------|
     each hot prefix once,          victim: Poisson(base_rate), cycling the hot prefixes
     warmup_gap_s apart             attacker: window [pressure_start_s, +pressure_duration_s)
                                    (relative to measure_start_s; default: the whole phase)

Hot set: the prefix length is fixed (``prefix_tokens``, 1,536 tokens = 96 blocks of 16) and the
*number* of hot prefixes scales with the cache: ``round(hot_fraction * usable / prefix_blocks)``
with ``usable = num_blocks - 1`` (512 blocks -> 4 prefixes = 384 blocks = 75.1% of 511; 1024 -> 8;
2048 -> 16; 4096 -> 32), unless ``num_hot_prefixes`` is given.
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import io
import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from prefixshield.traces.contracts import DEFAULT_CONTRACTS, Contract
from prefixshield.traces.schema import DEFAULT_VOCAB_SIZE, Trace, TraceError, build_requests
from prefixshield.traces.segments import SegmentKind, segment_ids

# RNG streams: one per role, so removing one role's rows changes no other row.
_STREAM_VICTIM = 1
_STREAM_ATTACKER = 2
_STREAM_NEUTRAL = 3
_STREAM_CONVERSATIONS = 4
_STREAM_ACTIVE = 5
_STREAM_IDLE = 6

# Group indices of the segment-id namespaces (fixed per role, see segments.py).
_GI_VICTIM = 0
_GI_ATTACKER = 1
_GI_NEUTRAL = 2
_GI_ACTIVE = 0
_GI_IDLE = 1


# --------------------------------------------------------------------------------------------
# params
# --------------------------------------------------------------------------------------------

def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def _check_range(name: str, rng: tuple[int, int], lo: int) -> None:
    _check(len(rng) == 2 and lo <= rng[0] <= rng[1],
           f"{name} must be (min, max) with {lo} <= min <= max, got {rng!r}")


@dataclass(frozen=True)
class WorkloadParams:
    """Parameters every workload shares.

    Attributes:
        seed: RNG seed of the workload and token seed of the trace (segment token ids).
        base_rate: victim (or, for the ShareGPT workloads, conversation) arrival rate in
            requests/s; the caller sets it to ``alpha * C_prefill``.
        alpha: nominal load; ``C_prefill = base_rate / alpha`` (requests/s).
        block_size: tokens per KV block.
        num_blocks: configured KV blocks; usable = ``num_blocks - 1`` (block 0 is the null block).
        duration_s: length of the measured phase in seconds.
        output_tokens: (min, max) decode length in tokens, uniform inclusive, for synthetic
            requests (ShareGPT workloads use the data's assistant lengths instead).
        vocab_size: token ids are drawn in ``[0, vocab_size)``.
    """

    seed: int = 0
    base_rate: float = 2.0
    alpha: float = 0.6
    block_size: int = 16
    num_blocks: int = 512
    duration_s: float = 60.0
    output_tokens: tuple[int, int] = (16, 32)
    vocab_size: int = DEFAULT_VOCAB_SIZE

    def __post_init__(self) -> None:
        _check(self.seed >= 0, f"seed must be >= 0, got {self.seed}")
        _check(self.base_rate > 0 and math.isfinite(self.base_rate),
               f"base_rate must be > 0 requests/s, got {self.base_rate}")
        _check(0 < self.alpha, f"alpha must be > 0, got {self.alpha}")
        _check(self.block_size >= 1, f"block_size must be >= 1, got {self.block_size}")
        _check(self.num_blocks >= 2, f"num_blocks must be >= 2, got {self.num_blocks}")
        _check(self.duration_s > 0, f"duration_s must be > 0 s, got {self.duration_s}")
        _check_range("output_tokens", self.output_tokens, 1)
        _check(self.vocab_size >= 2, f"vocab_size must be >= 2, got {self.vocab_size}")

    @property
    def c_prefill(self) -> float:
        """Unique-prefill capacity C_prefill in requests/s (``base_rate / alpha``)."""
        return self.base_rate / self.alpha

    @property
    def usable_blocks(self) -> int:
        """Blocks available to requests: ``num_blocks - 1``."""
        return self.num_blocks - 1


@dataclass(frozen=True)
class AttackParams(WorkloadParams):
    """Victim-plus-attacker workloads (``one_touch`` and its variants).

    Attributes:
        prefix_tokens: tokens of every shared / attacker prefix (1,536 = 96 blocks of 16).
        suffix_tokens: (min, max) tokens of the unique suffix after each prefix, uniform
            inclusive; attacker requests carry one too, so they look like victim requests.
        hot_fraction: victim hot set as a fraction of usable blocks (sets the number of hot
            prefixes when ``num_hot_prefixes`` is None).
        num_hot_prefixes: explicit number of hot prefixes (None: derived, see module doc).
        warmup_gap_s: spacing of the warm-up requests in seconds (None: see ``warmup_gap``).
        attack: False gives the no-attack control (the same trace without attacker rows).
        attacker_rate: attacker requests/s (None: the workload's formula).
        pressure_start_s: start of the attacker's pressure window, seconds after the measured
            phase starts.
        pressure_duration_s: length of the window in seconds (None: to the end of the run).
        victim_group, victim_contract, attacker_group, attacker_contract: names in the trace.
        contracts: contract table used to size attacks (None: ``DEFAULT_CONTRACTS``).
        output_tokens: decode length of every request; default 1: these are prefill (TTFT)
            studies, and with one output token a request's blocks are released as soon as its
            prefill step ends, so the cache is driven by prompts alone. With longer outputs each
            in-flight 96-block attack request keeps its blocks pinned, which with a 75% hot set
            leaves the victim no room under any policy (see the README).
    """

    output_tokens: tuple[int, int] = (1, 1)
    prefix_tokens: int = 1536
    suffix_tokens: tuple[int, int] = (32, 64)
    hot_fraction: float = 0.75
    num_hot_prefixes: int | None = None
    warmup_gap_s: float | None = None
    attack: bool = True
    attacker_rate: float | None = None
    pressure_start_s: float = 0.0
    pressure_duration_s: float | None = None
    victim_group: str = "victim"
    victim_contract: str = "standard"
    attacker_group: str = "attacker"
    attacker_contract: str = "best_effort"
    contracts: Mapping[str, Contract] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.prefix_tokens >= 1, f"prefix_tokens must be >= 1, got {self.prefix_tokens}")
        _check_range("suffix_tokens", self.suffix_tokens, 1)
        _check(0 < self.hot_fraction <= 1,
               f"hot_fraction must be in (0, 1], got {self.hot_fraction}")
        _check(self.num_hot_prefixes is None or self.num_hot_prefixes >= 1,
               f"num_hot_prefixes must be >= 1, got {self.num_hot_prefixes}")
        _check(self.warmup_gap_s is None or self.warmup_gap_s >= 0,
               f"warmup_gap_s must be >= 0 s, got {self.warmup_gap_s}")
        _check(self.attacker_rate is None or self.attacker_rate > 0,
               f"attacker_rate must be > 0 requests/s, got {self.attacker_rate}")
        _check(self.pressure_start_s >= 0,
               f"pressure_start_s must be >= 0 s, got {self.pressure_start_s}")
        _check(self.pressure_duration_s is None or self.pressure_duration_s > 0,
               f"pressure_duration_s must be > 0 s, got {self.pressure_duration_s}")
        _check(self.victim_group != self.attacker_group,
               "victim_group and attacker_group must differ")
        _check(self.victim_contract in self.contract_table,
               f"victim_contract {self.victim_contract!r} is not in contracts "
               f"({', '.join(self.contract_table)})")
        _check(self.attacker_contract in self.contract_table,
               f"attacker_contract {self.attacker_contract!r} is not in contracts "
               f"({', '.join(self.contract_table)})")

    @property
    def contract_table(self) -> Mapping[str, Contract]:
        """``contracts`` or the defaults."""
        return DEFAULT_CONTRACTS if self.contracts is None else self.contracts

    @property
    def prefix_blocks(self) -> int:
        """Full blocks in one prefix (``prefix_tokens // block_size``)."""
        return self.prefix_tokens // self.block_size

    @property
    def hot_prefixes(self) -> int:
        """Number of victim hot prefixes (explicit, or scaled with the cache)."""
        if self.num_hot_prefixes is not None:
            return self.num_hot_prefixes
        return max(1, round(self.hot_fraction * self.usable_blocks / max(1, self.prefix_blocks)))

    @property
    def warmup_gap(self) -> float:
        """Warm-up spacing in seconds.

        Default: ``max(1 / base_rate, request blocks / rho of the victim's contract)``, so that
        the warm-up populates the hot set within the victim's creation entitlement and the
        measured phase starts with the victim owing nothing (a warm-up faster than the refill
        would start every debt-aware policy with the victim in debt for its own hot set).
        """
        rho = self.contract_table[self.victim_contract].rho_blocks_per_s
        return _entitled_gap(self, rho)

    @property
    def one_touch_rate(self) -> float:
        """DESIGN §7 attacker rate: ``min(0.75 C_prefill, 1.15 base_rate)`` requests/s."""
        return min(0.75 * self.c_prefill, 1.15 * self.base_rate)

    def expected_request_blocks(self) -> float:
        """Expected full blocks of a fresh attacker-shaped prompt (prefix + uniform suffix)."""
        s = np.arange(self.suffix_tokens[0], self.suffix_tokens[1] + 1)
        return float(np.mean((self.prefix_tokens + s) // self.block_size))


@dataclass(frozen=True)
class OneTouchParams(AttackParams):
    """``one_touch``: never-seen prefixes at ``min(0.75 C_prefill, 1.15 base_rate)`` (default)."""


@dataclass(frozen=True)
class LowAndSlowParams(AttackParams):
    """``low_and_slow``: unseen prefixes at a rate just above the attacker's refill.

    Attributes:
        pressure_ratio: attacker creation rate / its contract's refill ``rho``; the request rate
            is ``pressure_ratio * rho / expected_request_blocks()`` (default 1.25 * 16 / 98.55
            = 0.203 requests/s; 96 prefix blocks + 2-4 suffix blocks). ``attacker_rate``
            overrides it.
        duration_s: 120 s by default (slow pressure needs time to accumulate).
    """

    duration_s: float = 120.0
    pressure_ratio: float = 1.25

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.pressure_ratio > 0, f"pressure_ratio must be > 0, got {self.pressure_ratio}")


@dataclass(frozen=True)
class TwoPassReplayParams(AttackParams):
    """``two_pass_replay``: admit K fresh prefixes, replay them, repeat (manufactured reuse).

    Attributes:
        replay_set: K, prefixes per round (None: the number of hot prefixes).
        replays: replay passes per round after the first (admitting) pass.
        rounds: rounds of (K fresh + ``replays`` x K replays); None: as many as the pressure
            window holds. Requests go out back to back at the attacker rate.
    """

    replay_set: int | None = None
    replays: int = 1
    rounds: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.replay_set is None or self.replay_set >= 1, "replay_set must be >= 1")
        _check(self.replays >= 1, f"replays must be >= 1, got {self.replays}")
        _check(self.rounds is None or self.rounds >= 1, f"rounds must be >= 1, got {self.rounds}")


@dataclass(frozen=True)
class DelayedReplayParams(AttackParams):
    """``delayed_replay`` (ablation): admit K, wait, replay, then neutral pressure.

    The attacker admits K fresh prefixes at the attacker rate from the pressure window start,
    waits ``max(1 / attacker_rate, wait_factor x clearance_s)`` after its last admission, where
    ``clearance_s = debt / rho`` is the designed clearance time (debt of its contract's bucket
    after the admissions, computed from the arrival schedule; see ``meta``), replays the K
    prefixes ``replay_passes`` times, and then a neutral group creates unique prefixes at
    ``neutral_rate`` until the end of the run. ``attack=False`` removes the attacker rows only
    (the neutral pressure stays).

    Defaults differ from one_touch so that the replay can hit at all: the victim's hot set is
    half the cache (``hot_fraction=0.5``) and suffixes stay inside one partial block
    (``suffix_tokens=(1, 15)``, so no request creates cached blocks beyond its prefix). Then the
    K = 2 admitted attacker prefixes (2 x 96 blocks, more than the best-effort burst of 128, so
    the attacker is in debt) fit beside the hot set and survive, unevicted, until the replay;
    the replay's hits are exactly the promotion-eligible blocks the debt gate decides on.

    Attributes:
        wait_factor: multiple of the clearance time to wait (the ablation uses 0, 0.5, 1.0).
        replay_set: K (None: the number of hot prefixes).
        replay_passes: passes over the K prefixes in the replay phase.
        neutral_group, neutral_contract: the neutral-pressure group (role ``benign``).
        neutral_rate: its requests/s (None: the one-touch attacker rate).
    """

    wait_factor: float = 1.0
    replay_set: int | None = 2
    replay_passes: int = 1
    hot_fraction: float = 0.5
    suffix_tokens: tuple[int, int] = (1, 15)
    neutral_group: str = "benign"
    neutral_contract: str = "standard"
    neutral_rate: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.wait_factor >= 0, f"wait_factor must be >= 0, got {self.wait_factor}")
        _check(self.replay_set is None or self.replay_set >= 1, "replay_set must be >= 1")
        _check(self.replay_passes >= 1, f"replay_passes must be >= 1, got {self.replay_passes}")
        _check(self.neutral_rate is None or self.neutral_rate > 0, "neutral_rate must be > 0")
        _check(self.neutral_group not in (self.victim_group, self.attacker_group),
               "neutral_group must differ from victim_group and attacker_group")


@dataclass(frozen=True)
class ShareGPTParams(WorkloadParams):
    """``sharegpt``: multi-turn conversations of several benign groups.

    Requests arrive at about ``base_rate`` per second: conversation *starts* arrive at
    ``base_rate / mean turns per conversation`` (Poisson, or Gamma with ``cv``), so the nominal
    load ``alpha`` means requests per second as for the other workloads. Each start draws a conversation (uniformly, with replacement) from the
    shipped turn table (``traces/data/sharegpt_turns.csv.gz``, see PROVENANCE.md), keeping its
    leading turns while ``system_prompt_tokens + sum(user + assistant tokens)`` stays within
    ``max_conversation_tokens`` (conversations whose first turn does not fit are never drawn),
    and a group uniformly at random. Turn k's prompt is the group's system prompt, all earlier
    user and assistant segments, and the new user segment; it generates the turn's assistant
    segment (``output_segment_id``, ``output_tokens`` = its length). The next turn arrives
    ``min_think_time_s + Exponential(think_time_s)`` seconds later. Requests arriving before
    ``warmup_s`` are not measured; turns at or after ``warmup_s + duration_s`` are cut.

    Attributes:
        num_groups: number of benign groups.
        group_names: explicit group names (None: ``tenant0 .. tenant{num_groups-1}``).
        contract: contract of every group.
        system_prompt_tokens: per-group shared system prompt (0: none).
        max_conversation_tokens: cap on a conversation's total tokens.
        max_turns: cap on turns per conversation (None: no cap).
        think_time_s: mean of the exponential part of the gap between turns, seconds.
        min_think_time_s: fixed part of the gap, seconds.
        warmup_s: unmeasured lead-in, seconds.
        cv: coefficient of variation of the conversation inter-arrival times (1: Poisson;
            > 1: Gamma renewal process, bursts).
        turns_path: a turn table to use instead of the packaged one (same CSV columns).
    """

    num_groups: int = 4
    group_names: tuple[str, ...] | None = None
    contract: str = "standard"
    system_prompt_tokens: int = 256
    max_conversation_tokens: int = 2048
    max_turns: int | None = None
    think_time_s: float = 10.0
    min_think_time_s: float = 1.0
    warmup_s: float = 10.0
    cv: float = 1.0
    turns_path: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.num_groups >= 1, f"num_groups must be >= 1, got {self.num_groups}")
        _check(self.group_names is None or (len(self.group_names) == self.num_groups
                                            and len(set(self.group_names)) == self.num_groups),
               "group_names must hold num_groups distinct names")
        _check(self.system_prompt_tokens >= 0, "system_prompt_tokens must be >= 0")
        _check(self.max_conversation_tokens > self.system_prompt_tokens,
               "max_conversation_tokens must exceed system_prompt_tokens")
        _check(self.max_turns is None or self.max_turns >= 1, "max_turns must be >= 1")
        _check(self.think_time_s >= 0 and self.min_think_time_s >= 0,
               "think_time_s and min_think_time_s must be >= 0 s")
        _check(self.warmup_s >= 0, f"warmup_s must be >= 0 s, got {self.warmup_s}")
        _check(self.cv > 0, f"cv must be > 0, got {self.cv}")

    @property
    def groups(self) -> tuple[str, ...]:
        """Group names."""
        return self.group_names or tuple(f"tenant{i}" for i in range(self.num_groups))


@dataclass(frozen=True)
class BurstyShareGPTParams(ShareGPTParams):
    """``bursty_sharegpt``: ``sharegpt`` with Gamma-renewal conversation starts, CV 4."""

    cv: float = 4.0


@dataclass(frozen=True)
class BorrowingParams(WorkloadParams):
    """``borrowing``: an active group whose working set exceeds half the cache, and an idle one.

    The active group cycles (round-robin) over ``working_set_prefixes`` prefixes of
    ``prefix_tokens`` each (default ``round(0.75 * usable / prefix_blocks)`` = 4 x 96 = 384
    blocks = 75% of 511 > half), each with a unique suffix, Poisson at ``base_rate``, after a
    warm-up that sends each prefix once. The idle group sends exactly one small unmeasured
    request at t = 0 when ``idle_probe`` is True (so that the group exists in the trace and a
    static partition counts it), and nothing else.

    Attributes:
        prefix_tokens, suffix_tokens: as in :class:`AttackParams`.
        working_set_fraction: active working set as a fraction of usable blocks.
        working_set_prefixes: explicit number of prefixes (None: derived).
        warmup_gap_s: warm-up spacing in seconds (None: ``max(1 / base_rate, request blocks /
            rho of the contract)``, the warm-up stays within the group's creation entitlement).
        active_group, idle_group, contract: names in the trace (both groups on ``contract``).
        idle_probe: send the idle group's single request.
        idle_probe_tokens: its prompt length in tokens.
    """

    prefix_tokens: int = 1536
    suffix_tokens: tuple[int, int] = (32, 64)
    working_set_fraction: float = 0.75
    working_set_prefixes: int | None = None
    warmup_gap_s: float | None = None
    active_group: str = "active"
    idle_group: str = "idle"
    contract: str = "standard"
    idle_probe: bool = True
    idle_probe_tokens: int = 32

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.prefix_tokens >= 1, "prefix_tokens must be >= 1")
        _check_range("suffix_tokens", self.suffix_tokens, 1)
        _check(0 < self.working_set_fraction, "working_set_fraction must be > 0")
        _check(self.working_set_prefixes is None or self.working_set_prefixes >= 1,
               "working_set_prefixes must be >= 1")
        _check(self.warmup_gap_s is None or self.warmup_gap_s >= 0, "warmup_gap_s must be >= 0")
        _check(self.active_group != self.idle_group, "active_group and idle_group must differ")
        _check(self.idle_probe_tokens >= 1, "idle_probe_tokens must be >= 1")

    @property
    def prefix_blocks(self) -> int:
        """Full blocks in one prefix."""
        return self.prefix_tokens // self.block_size

    @property
    def num_prefixes(self) -> int:
        """Prefixes in the active working set."""
        if self.working_set_prefixes is not None:
            return self.working_set_prefixes
        return max(1, round(self.working_set_fraction * self.usable_blocks
                            / max(1, self.prefix_blocks)))

    @property
    def warmup_gap(self) -> float:
        """Warm-up spacing in seconds (see ``warmup_gap_s``)."""
        c = DEFAULT_CONTRACTS.get(self.contract)
        return _entitled_gap(self, c.rho_blocks_per_s) if c else \
            (1.0 / self.base_rate if self.warmup_gap_s is None else self.warmup_gap_s)


def _entitled_gap(p, rho_blocks_per_s: float) -> float:
    """``warmup_gap_s``, or the spacing at which one prefix-plus-suffix request per gap stays
    within a refill of ``rho_blocks_per_s`` (and no faster than ``base_rate``)."""
    if p.warmup_gap_s is not None:
        return p.warmup_gap_s
    mean_suffix = 0.5 * (p.suffix_tokens[0] + p.suffix_tokens[1])
    request_blocks = (p.prefix_tokens + mean_suffix) / p.block_size
    return max(1.0 / p.base_rate, request_blocks / rho_blocks_per_s)


# --------------------------------------------------------------------------------------------
# registry
# --------------------------------------------------------------------------------------------

WORKLOADS: dict[str, Callable[..., Trace]] = {}
"""Workload name -> generator ``fn(params=None) -> Trace``; ``fn.params_type`` is its params
dataclass. The only place a workload is registered."""


def _register(name: str, params_type: type) -> Callable[[Callable], Callable]:
    def deco(fn: Callable) -> Callable:
        if name in WORKLOADS:
            raise RuntimeError(f"workload {name!r} registered twice")
        fn.params_type = params_type  # type: ignore[attr-defined]
        fn.workload_name = name  # type: ignore[attr-defined]
        WORKLOADS[name] = fn
        return fn
    return deco


def make_params(name: str, **overrides: Any) -> WorkloadParams:
    """Params of workload ``name`` with ``overrides``; unknown names or fields raise ValueError."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(sorted(WORKLOADS))}")
    ptype = WORKLOADS[name].params_type  # type: ignore[attr-defined]
    known = {f.name for f in dataclasses.fields(ptype)}
    bad = sorted(set(overrides) - known)
    if bad:
        raise ValueError(f"workload {name!r} has no parameter(s) {', '.join(bad)}; "
                         f"known: {', '.join(sorted(known))}")
    return ptype(**overrides)


def generate(name: str, **overrides: Any) -> Trace:
    """Generate workload ``name`` with its default params updated by ``overrides``."""
    return WORKLOADS[name](make_params(name, **overrides))


def params_to_dict(params: WorkloadParams) -> dict[str, Any]:
    """JSON-able dict of a params dataclass (tuples become lists, contracts dicts)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(params):
        v = getattr(params, f.name)
        if isinstance(v, tuple):
            v = list(v)
        elif isinstance(v, Mapping):
            v = {k: dataclasses.asdict(c) if isinstance(c, Contract) else c for k, c in v.items()}
        out[f.name] = v
    return out


# --------------------------------------------------------------------------------------------
# building blocks
# --------------------------------------------------------------------------------------------

def _rng(seed: int, stream: int) -> np.random.Generator:
    return np.random.default_rng([int(seed), stream])


def _renewal_times(rng: np.random.Generator, rate: float, start: float, end: float,
                   cv: float = 1.0) -> np.ndarray:
    """Arrival times in ``[start, end)`` of a renewal process with mean rate ``rate`` (1/s).

    ``cv == 1``: Poisson (exponential gaps); otherwise Gamma gaps with shape ``1/cv**2``.
    The first arrival is one gap after ``start``.
    """
    span = end - start
    if span <= 0:
        return np.empty(0)
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


def _periodic_times(rate: float, start: float, end: float, limit: int | None = None) -> np.ndarray:
    """``start, start + 1/rate, ...`` below ``end`` (at most ``limit`` of them)."""
    n = max(0, math.ceil((end - start) * rate - 1e-9))
    if limit is not None:
        n = min(n, limit)
    t = start + np.arange(n) / rate
    return t[t < end]


class RequestRows:
    """Row accumulator shared by generators and importers.

    ``add`` appends a batch of rows of one group; ``finish`` sorts all rows by arrival (ties
    keep insertion order), numbers them ``request_id = 0..n-1`` and builds the validated trace.
    """

    def __init__(self) -> None:
        self.cols: dict[str, list] = {k: [] for k in (
            "arrival_s", "group", "contract", "role", "prefix_id", "measured", "output_tokens",
            "segment_ids", "segment_lengths", "output_segment_id")}

    def add(self, arrival_s, group: str, contract: str, role: str, prefix_id, measured,
            output_tokens, seg_ids: Sequence, seg_lens: Sequence, output_segment_id=None) -> None:
        """Append ``n = len(arrival_s)`` rows; scalars broadcast, ``seg_*`` are per-row lists."""
        arrival_s = np.asarray(arrival_s, dtype=np.float64)
        n = len(arrival_s)
        c = self.cols
        c["arrival_s"].append(arrival_s)
        c["group"].append(np.full(n, group, dtype=object))
        c["contract"].append(np.full(n, contract, dtype=object))
        c["role"].append(np.full(n, role, dtype=object))
        c["prefix_id"].append(np.broadcast_to(np.asarray(prefix_id, dtype=np.int64), (n,)))
        c["measured"].append(np.broadcast_to(np.asarray(measured, dtype=bool), (n,)))
        c["output_tokens"].append(np.broadcast_to(np.asarray(output_tokens, dtype=np.int64), (n,)))
        osid = -1 if output_segment_id is None else output_segment_id
        c["output_segment_id"].append(np.broadcast_to(np.asarray(osid, dtype=np.int64), (n,)))
        if len(seg_ids) != n or len(seg_lens) != n:
            raise AssertionError("segment lists must have one entry per row")
        c["segment_ids"].extend(seg_ids)
        c["segment_lengths"].extend(seg_lens)

    def finish(self, seed: int, vocab_size: int, meta: dict[str, Any],
               drop_role: str | None = None) -> Trace:
        """The trace; rows of ``drop_role`` are removed *after* numbering (no-attack controls)."""
        cols: dict[str, Any] = {}
        for k, v in self.cols.items():
            if k in ("segment_ids", "segment_lengths"):
                arr = np.empty(len(v), dtype=object)
                arr[:] = [np.asarray(x, dtype=np.int64) for x in v]
                cols[k] = arr
            else:
                cols[k] = np.concatenate(v) if v else np.empty(0)
        order = np.argsort(cols["arrival_s"], kind="stable")
        cols = {k: v[order] for k, v in cols.items()}
        cols["request_id"] = np.arange(len(order), dtype=np.int64)
        if drop_role is not None:
            keep = cols["role"] != drop_role
            cols = {k: v[keep] for k, v in cols.items()}
        trace = Trace(build_requests(cols), seed=seed, vocab_size=vocab_size, meta=meta)
        return trace.validate(f"<{meta.get('workload', 'trace')}>")


def _prefix_suffix_prompts(prefix_seg: np.ndarray, prefix_tokens: int,
                           suffix_seg: np.ndarray, suffix_len: np.ndarray):
    ids = [np.array([p, s], dtype=np.int64) for p, s in zip(prefix_seg, suffix_seg)]
    lens = [np.array([prefix_tokens, s], dtype=np.int64) for s in suffix_len]
    return ids, lens


def _output_lengths(rng: np.random.Generator, rng_range: tuple[int, int], n: int) -> np.ndarray:
    return rng.integers(rng_range[0], rng_range[1] + 1, size=n, dtype=np.int64)


def _add_cyclic_stream(rows: RequestRows, p, *, stream: int, group_index: int, group: str,
                       contract: str, role: str, num_prefixes: int) -> dict[str, float]:
    """Warm-up (each prefix once) then Poisson(base_rate) requests cycling the prefixes."""
    rng = _rng(p.seed, stream)
    gap = p.warmup_gap
    warm_t = np.arange(num_prefixes) * gap
    start = num_prefixes * gap
    end = start + p.duration_s
    meas_t = _renewal_times(rng, p.base_rate, start, end)
    n_w, n_m = len(warm_t), len(meas_t)
    n = n_w + n_m
    t = np.concatenate([warm_t, meas_t])
    prefix_idx = np.concatenate([np.arange(n_w), np.arange(n_m)]) % num_prefixes
    suffix_len = rng.integers(p.suffix_tokens[0], p.suffix_tokens[1] + 1, size=n, dtype=np.int64)
    out = _output_lengths(rng, p.output_tokens, n)
    ids, lens = _prefix_suffix_prompts(
        segment_ids(group_index, SegmentKind.PREFIX, prefix_idx), p.prefix_tokens,
        segment_ids(group_index, SegmentKind.SUFFIX, np.arange(n)), suffix_len)
    measured = np.arange(n) >= n_w
    rows.add(t, group, contract, role, prefix_idx, measured, out, ids, lens)
    return {"measure_start_s": float(start), "measure_end_s": float(end),
            "warmup_requests": int(n_w), "measured_requests": int(n_m)}


def _add_fresh_prefixes(rows: RequestRows, p: AttackParams, rng: np.random.Generator, t: np.ndarray,
                        local: np.ndarray, *, group_index: int, group: str, contract: str,
                        role: str, suffix_len: np.ndarray | None = None) -> np.ndarray:
    """Requests at times ``t`` with prefixes ``local`` (prefix_id = local id) of a namespace.

    Rows with equal ``local`` share prefix *and* suffix segment (a replay); ``suffix_len`` is
    indexed by local id (drawn here when None). Returns the suffix lengths by local id.
    """
    local = np.asarray(local, dtype=np.int64)
    if suffix_len is None:
        n_local = int(local.max()) + 1 if local.size else 0
        suffix_len = rng.integers(p.suffix_tokens[0], p.suffix_tokens[1] + 1, size=n_local,
                                  dtype=np.int64)
    out = _output_lengths(rng, p.output_tokens, len(t))
    ids, lens = _prefix_suffix_prompts(
        segment_ids(group_index, SegmentKind.PREFIX, local), p.prefix_tokens,
        segment_ids(group_index, SegmentKind.SUFFIX, local), suffix_len[local])
    rows.add(t, group, contract, role, local, True, out, ids, lens)
    return suffix_len


def _attack_meta(name: str, p: AttackParams, victim: dict[str, float],
                 attacker_rate: float, window: tuple[float, float], **extra: Any) -> dict:
    meta = {
        "workload": name,
        "params": params_to_dict(p),
        "c_prefill": p.c_prefill,
        "usable_blocks": p.usable_blocks,
        "prefix_blocks": p.prefix_blocks,
        "num_hot_prefixes": p.hot_prefixes,
        "hot_blocks": p.hot_prefixes * p.prefix_blocks,
        "attacker_rate": attacker_rate,
        "pressure_window_s": list(window),
        **victim,
    }
    meta.update(extra)
    return meta


def _victim_and_window(p: AttackParams, rows: RequestRows) -> tuple[dict, float, float]:
    victim = _add_cyclic_stream(rows, p, stream=_STREAM_VICTIM, group_index=_GI_VICTIM,
                                group=p.victim_group, contract=p.victim_contract, role="victim",
                                num_prefixes=p.hot_prefixes)
    w0 = victim["measure_start_s"] + p.pressure_start_s
    w1 = victim["measure_end_s"] if p.pressure_duration_s is None else \
        min(victim["measure_end_s"], w0 + p.pressure_duration_s)
    return victim, w0, w1


def _drop(p: AttackParams) -> str | None:
    return None if p.attack else "attacker"


# --------------------------------------------------------------------------------------------
# attack workloads
# --------------------------------------------------------------------------------------------

@_register("one_touch", OneTouchParams)
def one_touch(params: OneTouchParams | None = None) -> Trace:
    """One-touch flooding: the attacker sends never-seen prefixes during the pressure window.

    Victim: warm-up (each of the ``hot_prefixes`` prefixes once, unmeasured), then Poisson
    requests at ``base_rate`` cycling over the hot prefixes (prefix_id = hot prefix index), each
    prefix (``prefix_tokens``) plus a unique suffix. Attacker (``attacker_contract``, role
    ``attacker``): one request every ``1 / attacker_rate`` seconds through the window, each with
    its own fresh prefix (prefix_id = its ordinal) and suffix; default rate
    ``min(0.75 C_prefill, 1.15 base_rate)``.
    """
    p = params or OneTouchParams()
    rows = RequestRows()
    victim, w0, w1 = _victim_and_window(p, rows)
    rate = p.attacker_rate or p.one_touch_rate
    t = _periodic_times(rate, w0, w1)
    _add_fresh_prefixes(rows, p, _rng(p.seed, _STREAM_ATTACKER), t, np.arange(len(t)),
                        group_index=_GI_ATTACKER, group=p.attacker_group,
                        contract=p.attacker_contract, role="attacker")
    meta = _attack_meta("one_touch", p, victim, rate, (w0, w1), attacker_requests=len(t))
    return rows.finish(p.seed, p.vocab_size, meta, drop_role=_drop(p))


@_register("low_and_slow", LowAndSlowParams)
def low_and_slow(params: LowAndSlowParams | None = None) -> Trace:
    """Low-and-slow: never-seen prefixes spread evenly over the window, creation just above refill.

    As :func:`one_touch`, but the attacker rate defaults to
    ``pressure_ratio * rho_attacker / expected_request_blocks()`` requests/s, so that its
    creation rate in blocks/s is ``pressure_ratio`` times its contract's refill.
    """
    p = params or LowAndSlowParams()
    rows = RequestRows()
    victim, w0, w1 = _victim_and_window(p, rows)
    rho = p.contract_table[p.attacker_contract].rho_blocks_per_s
    rate = p.attacker_rate or p.pressure_ratio * rho / p.expected_request_blocks()
    t = _periodic_times(rate, w0, w1)
    _add_fresh_prefixes(rows, p, _rng(p.seed, _STREAM_ATTACKER), t, np.arange(len(t)),
                        group_index=_GI_ATTACKER, group=p.attacker_group,
                        contract=p.attacker_contract, role="attacker")
    meta = _attack_meta("low_and_slow", p, victim, rate, (w0, w1), attacker_requests=len(t),
                        creation_blocks_per_s=rate * p.expected_request_blocks(),
                        attacker_rho_blocks_per_s=rho)
    return rows.finish(p.seed, p.vocab_size, meta, drop_role=_drop(p))


@_register("two_pass_replay", TwoPassReplayParams)
def two_pass_replay(params: TwoPassReplayParams | None = None) -> Trace:
    """Two-pass replay: per round, K fresh prefixes then ``replays`` passes replaying them.

    Attacker requests go out back to back at the attacker rate (default as one_touch) through
    the window: round r sends prefixes ``r*K .. r*K+K-1`` fresh, then the same prefixes again
    (identical segments and prefix_ids, so the replays hit the cache: manufactured reuse) while
    the debt of the first pass is still outstanding. Victim stream as in :func:`one_touch`.
    """
    p = params or TwoPassReplayParams()
    rows = RequestRows()
    victim, w0, w1 = _victim_and_window(p, rows)
    rate = p.attacker_rate or p.one_touch_rate
    k = p.replay_set or p.hot_prefixes
    per_round = k * (1 + p.replays)
    limit = None if p.rounds is None else p.rounds * per_round
    t = _periodic_times(rate, w0, w1, limit=limit)
    slot = np.arange(len(t))
    rnd, pos = slot // per_round, slot % per_round
    local = rnd * k + pos % k
    _add_fresh_prefixes(rows, p, _rng(p.seed, _STREAM_ATTACKER), t, local,
                        group_index=_GI_ATTACKER, group=p.attacker_group,
                        contract=p.attacker_contract, role="attacker")
    meta = _attack_meta("two_pass_replay", p, victim, rate, (w0, w1), attacker_requests=len(t),
                        replay_set=k, attacker_replay_requests=int(np.sum(pos >= k)))
    return rows.finish(p.seed, p.vocab_size, meta, drop_role=_drop(p))


def designed_debt_blocks(arrival_s: np.ndarray, new_blocks: np.ndarray,
                         contract: Contract) -> float:
    """Debt (blocks) of a bucket that starts full, refills lazily and is charged ``new_blocks``.

    The DESIGN §5.4 bucket applied to an arrival schedule (seconds) as if every request
    materialized all its full blocks on arrival: the generator's *design* value, not what a
    simulated policy observes. Returns ``max(0, -B)`` after the last charge.
    """
    b, t_prev = contract.beta_blocks, None
    for t, n in zip(np.asarray(arrival_s, float), np.asarray(new_blocks, float)):
        if t_prev is not None:
            b = min(contract.beta_blocks, b + contract.rho_blocks_per_s * (t - t_prev))
        b -= n
        t_prev = t
    return float(max(0.0, -b))


@_register("delayed_replay", DelayedReplayParams)
def delayed_replay(params: DelayedReplayParams | None = None) -> Trace:
    """Delayed replay (ablation): admit K prefixes, wait ``wait_factor x`` clearance, replay.

    Then neutral pressure: the neutral group (role ``benign``) creates unique prefixes until
    the end of the run. ``meta`` records ``designed_debt_blocks``, ``clearance_s``,
    ``replay_start_s`` and ``neutral_start_s``. Raises ValueError when the schedule does not
    fit in ``duration_s``.
    """
    p = params or DelayedReplayParams()
    rows = RequestRows()
    victim, w0, w1 = _victim_and_window(p, rows)
    rate = p.attacker_rate or p.one_touch_rate
    k = p.replay_set or p.hot_prefixes
    rng_a = _rng(p.seed, _STREAM_ATTACKER)
    t_admit = w0 + np.arange(k) / rate
    suffix_len = rng_a.integers(p.suffix_tokens[0], p.suffix_tokens[1] + 1, size=k,
                                dtype=np.int64)
    contract = p.contract_table[p.attacker_contract]
    debt = designed_debt_blocks(t_admit, (p.prefix_tokens + suffix_len) // p.block_size, contract)
    clearance = debt / contract.rho_blocks_per_s
    replay_start = float(t_admit[-1]) + max(1.0 / rate, float(p.wait_factor * clearance))
    n_replay = k * p.replay_passes
    t_replay = replay_start + np.arange(n_replay) / rate
    neutral_start = float(t_replay[-1]) + 1.0 / rate
    if neutral_start >= w1:
        raise ValueError(f"delayed_replay: the schedule (replays end at {neutral_start:.3f} s) "
                         f"does not fit the pressure window ending at {w1:.3f} s; "
                         f"raise duration_s or lower wait_factor/replay_set")
    t_att = np.concatenate([t_admit, t_replay])
    local = np.concatenate([np.arange(k), np.tile(np.arange(k), p.replay_passes)])
    _add_fresh_prefixes(rows, p, rng_a, t_att, local, group_index=_GI_ATTACKER,
                        group=p.attacker_group, contract=p.attacker_contract, role="attacker",
                        suffix_len=suffix_len)
    n_rate = p.neutral_rate or p.one_touch_rate
    t_n = _periodic_times(n_rate, neutral_start, w1)
    _add_fresh_prefixes(rows, p, _rng(p.seed, _STREAM_NEUTRAL), t_n, np.arange(len(t_n)),
                        group_index=_GI_NEUTRAL, group=p.neutral_group,
                        contract=p.neutral_contract, role="benign")
    meta = _attack_meta("delayed_replay", p, victim, rate, (w0, w1),
                        attacker_requests=len(t_att), replay_set=k,
                        designed_debt_blocks=debt, clearance_s=clearance,
                        replay_start_s=replay_start, neutral_start_s=neutral_start,
                        neutral_rate=n_rate, neutral_requests=len(t_n))
    return rows.finish(p.seed, p.vocab_size, meta, drop_role=_drop(p))


# --------------------------------------------------------------------------------------------
# ShareGPT workloads
# --------------------------------------------------------------------------------------------

SHAREGPT_TURNS_FILE = "sharegpt_turns.csv.gz"
"""Packaged turn table: ``conversation, source_id, turn, user_tokens, assistant_tokens``."""

TURN_COLUMNS = ("conversation", "source_id", "turn", "user_tokens", "assistant_tokens")


@functools.lru_cache(maxsize=4)
def _load_turns(path: str | None) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    if path is None:
        raw = resources.files("prefixshield.traces").joinpath("data", SHAREGPT_TURNS_FILE)
        data = raw.read_bytes()
        src = f"prefixshield/traces/data/{SHAREGPT_TURNS_FILE}"
    else:
        data = Path(path).read_bytes()
        src = str(path)
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    df = pd.read_csv(io.BytesIO(data))
    missing = [c for c in TURN_COLUMNS if c not in df.columns]
    if missing:
        raise TraceError(f"{src}: missing column(s) {', '.join(missing)}")
    df = df.sort_values(["conversation", "turn"], kind="stable")
    convs = []
    for _, g in df.groupby("conversation", sort=True):
        u = g["user_tokens"].to_numpy(np.int64)
        a = g["assistant_tokens"].to_numpy(np.int64)
        if (u < 1).any() or (a < 1).any():
            raise TraceError(f"{src}: conversation {g['conversation'].iloc[0]}: token counts must "
                             f"be >= 1")
        u.flags.writeable = False
        a.flags.writeable = False
        convs.append((u, a))
    return tuple(convs)


def sharegpt_turns(path: str | None = None) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    """Per conversation, (user_tokens, assistant_tokens) per turn from a turn table.

    Args:
        path: a turn CSV (optionally gzipped) with ``TURN_COLUMNS``; None: the packaged one.
    """
    return _load_turns(None if path is None else str(path))


def cap_turns(user: np.ndarray, assistant: np.ndarray, system_tokens: int,
              max_tokens: int | None, max_turns: int | None = None) -> int:
    """Leading turns that fit: ``system + cumsum(user + assistant) <= max_tokens`` (tokens)."""
    n = len(user)
    if max_turns is not None:
        n = min(n, max_turns)
    if max_tokens is None:
        return n
    cum = system_tokens + np.cumsum(user[:n] + assistant[:n])
    return int(np.searchsorted(cum, max_tokens, side="right"))


def add_conversations(rows: RequestRows, *, convs: Sequence[tuple[np.ndarray, np.ndarray]],
                      starts: np.ndarray, group_of: np.ndarray, groups: Sequence[str],
                      contract: str, role: str, system_prompt_tokens: int,
                      gaps: np.ndarray, horizon_s: float, warmup_s: float,
                      conversation_ids: np.ndarray) -> int:
    """Append multi-turn conversation rows; returns the number of rows added.

    Conversation i starts at ``starts[i]`` in group ``groups[group_of[i]]`` with turns
    ``convs[i]``; ``gaps`` holds one inter-turn gap (seconds) per turn of all conversations in
    order (the gap before turn 0 is ignored). Turn k's prompt: ``[system] + u0, a0, ..., uk``;
    it generates ``ak``. Segment ids come from the group's SYSTEM / SUFFIX / OUTPUT namespaces
    (group index = position in ``groups``); prefix_id = ``conversation_ids[i]``. Turns at or
    after ``horizon_s`` are cut; rows before ``warmup_s`` are unmeasured.
    """
    counters = np.zeros(len(groups), dtype=np.int64)
    g_pos = 0
    added = 0
    for i, (u, a) in enumerate(convs):
        n = len(u)
        if n == 0:
            continue
        gi = int(group_of[i])
        t = starts[i] + np.concatenate([[0.0], np.cumsum(gaps[g_pos + 1:g_pos + n])])
        g_pos += n
        n_keep = int(np.searchsorted(t, horizon_s, side="left"))
        if n_keep == 0:
            continue
        local = counters[gi] + np.arange(n)
        counters[gi] += n
        useg = segment_ids(gi, SegmentKind.SUFFIX, local)
        aseg = segment_ids(gi, SegmentKind.OUTPUT, local)
        hist_ids = np.empty(2 * n, dtype=np.int64)
        hist_ids[0::2], hist_ids[1::2] = useg, aseg
        hist_len = np.empty(2 * n, dtype=np.int64)
        hist_len[0::2], hist_len[1::2] = u, a
        if system_prompt_tokens > 0:
            hist_ids = np.concatenate([segment_ids(gi, SegmentKind.SYSTEM, [0]), hist_ids])
            hist_len = np.concatenate([[system_prompt_tokens], hist_len])
            off = 1
        else:
            off = 0
        ids = [hist_ids[:off + 2 * k + 1] for k in range(n_keep)]
        lens = [hist_len[:off + 2 * k + 1] for k in range(n_keep)]
        rows.add(t[:n_keep], groups[gi], contract, role, conversation_ids[i],
                 t[:n_keep] >= warmup_s, a[:n_keep], ids, lens, output_segment_id=aseg[:n_keep])
        added += n_keep
    return added


def _sharegpt(name: str, p: ShareGPTParams) -> Trace:
    convs_all = sharegpt_turns(p.turns_path)
    capped = []
    for u, a in convs_all:
        n = cap_turns(u, a, p.system_prompt_tokens, p.max_conversation_tokens, p.max_turns)
        if n:
            capped.append((u[:n], a[:n]))
    if not capped:
        raise ValueError(f"{name}: no conversation fits max_conversation_tokens="
                         f"{p.max_conversation_tokens}")
    rng = _rng(p.seed, _STREAM_CONVERSATIONS)
    horizon = p.warmup_s + p.duration_s
    mean_turns = float(np.mean([len(u) for u, _ in capped]))
    starts = _renewal_times(rng, p.base_rate / mean_turns, 0.0, horizon, cv=p.cv)
    pick = rng.integers(0, len(capped), size=len(starts))
    group_of = rng.integers(0, p.num_groups, size=len(starts))
    convs = [capped[j] for j in pick]
    n_turns = int(sum(len(u) for u, _ in convs))
    gaps = p.min_think_time_s + (rng.exponential(p.think_time_s, size=n_turns)
                                 if p.think_time_s > 0 else np.zeros(n_turns))
    rows = RequestRows()
    n_rows = add_conversations(rows, convs=convs, starts=starts, group_of=group_of,
                               groups=p.groups, contract=p.contract, role="benign",
                               system_prompt_tokens=p.system_prompt_tokens, gaps=gaps,
                               horizon_s=horizon, warmup_s=p.warmup_s,
                               conversation_ids=np.arange(len(starts)))
    meta = {"workload": name, "params": params_to_dict(p),
            "turns_source": p.turns_path or f"prefixshield/traces/data/{SHAREGPT_TURNS_FILE}",
            "conversations": len(starts), "requests": n_rows,
            "conversation_pool": len(capped), "measure_start_s": p.warmup_s,
            "measure_end_s": horizon}
    return rows.finish(p.seed, p.vocab_size, meta)


@_register("sharegpt", ShareGPTParams)
def sharegpt(params: ShareGPTParams | None = None) -> Trace:
    """Multi-turn ShareGPT conversations of several benign groups (see :class:`ShareGPTParams`)."""
    return _sharegpt("sharegpt", params or ShareGPTParams())


@_register("bursty_sharegpt", BurstyShareGPTParams)
def bursty_sharegpt(params: BurstyShareGPTParams | None = None) -> Trace:
    """:func:`sharegpt` with conversation starts from a Gamma renewal process (CV ``cv``, 4)."""
    return _sharegpt("bursty_sharegpt", params or BurstyShareGPTParams())


# --------------------------------------------------------------------------------------------
# borrowing
# --------------------------------------------------------------------------------------------

@_register("borrowing", BorrowingParams)
def borrowing(params: BorrowingParams | None = None) -> Trace:
    """Borrowing: an active group cycling a working set above half the cache, one idle group.

    See :class:`BorrowingParams`. Both groups have role ``benign``.
    """
    p = params or BorrowingParams()
    rows = RequestRows()
    if p.idle_probe:
        rng_i = _rng(p.seed, _STREAM_IDLE)
        out = _output_lengths(rng_i, p.output_tokens, 1)
        rows.add([0.0], p.idle_group, p.contract, "benign", 0, False, out,
                 [segment_ids(_GI_IDLE, SegmentKind.SUFFIX, [0])],
                 [np.array([p.idle_probe_tokens])])
    active = _add_cyclic_stream(rows, p, stream=_STREAM_ACTIVE, group_index=_GI_ACTIVE,
                                group=p.active_group, contract=p.contract, role="benign",
                                num_prefixes=p.num_prefixes)
    meta = {"workload": "borrowing", "params": params_to_dict(p),
            "usable_blocks": p.usable_blocks, "prefix_blocks": p.prefix_blocks,
            "working_set_prefixes": p.num_prefixes,
            "working_set_blocks": p.num_prefixes * p.prefix_blocks, **active}
    return rows.finish(p.seed, p.vocab_size, meta)
