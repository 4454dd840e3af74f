"""``searched_attack``: an attacker whose every choice is a parameter, under a fixed budget.

The workload ``prefixshield attack-search`` optimizes over (its search space is
`prefixshield.experiments.attack_space.SPACE`; the fields below are its coordinates). The
victim is exactly ``one_touch``'s (same hot set, warm-up, contracts, RNG stream): at a seed, the
victim rows of every point, and of ``one_touch``'s own trace, are identical, and the no-attack
control (``attack=False``) is one trace whatever the attack parameters are (the attacker stays
configured on ``attacker_contract``). So a point's damage is paired, seed by seed, against one
control. (The control is generated without the attacker rather than with its rows removed, so
even its request ids do not depend on the attack parameters.)

**The budget.** The attacker may send, averaged over the pressure window (the whole measured
phase by default), at most: ``budget_requests`` requests per second, ``budget_prompt_tokens``
prompt tokens per second (a replay costs its whole prompt, as an API that bills input tokens
charges it), ``budget_tokens`` prompt plus output tokens per second, and ``budget_block_s`` KV
block-seconds per second (blocks its requests' block tables hold, times how long they hold
them). ``budget_limits`` says which apply: units joined by ``+`` (``requests``,
``prompt_tokens``, ``tokens``, ``block_s``), or ``both`` (``requests+prompt_tokens``, the
default here). A token limit left None is the one-touch flood rate
``min(0.75 C_prefill, 1.15 base_rate)`` requests/s (reference setup) times one_touch's mean
prompt (``prefix_tokens`` + mean suffix), plus its mean output for ``tokens``; a request limit
left None is that rate. The block-seconds limit has no workload default: it is measured
(``attack-search`` sets it to one_touch's measured attacker block-seconds per second).

Block-seconds cannot be known before the engine runs (they depend on queueing and batching),
so the generator charges an *estimate* per request, from the request's shape:
``block_s_scale x (ceil(P / B) x t_prefill(P) + O x t_decode(P, O) x (P + O / 2) / B)``, with
``P`` prompt and ``O`` output tokens, ``B`` the block size and, from the cost-model profile
``block_s_profile``, ``t_prefill(P) = a + b P + e`` (the prefill step of the request alone) and
``t_decode = a + c + d (P + O / 2)`` (one decode step of it alone): blocks held while it
prefills, then its growing table over its decode steps, as if uncontended;
``block_s_scale`` (1: uncontended) is the contention factor ``attack-search`` calibrates on
one_touch (measured / estimated) so that one_touch's estimate is its measurement. The
estimate is an expectation over the suffix and output distributions. ``attack-search``
measures every trial's block-seconds after the run as well (see there).

**How a point spends it** (per attacker request, in time order):

1. *When*: on/off cycles of ``cycle_s`` seconds, on for ``duty x cycle_s``, the first
   on-period starting ``phase x`` the off-time after the window starts (see
   `on_intervals`); inside on-time, periodic arrivals (``burst_cv=None``, one_touch's
   schedule) or Gamma gaps with coefficient of variation ``burst_cv``, normalized so exactly the
   budgeted count falls in the window. With probability ``victim_sync`` a request is moved to
   the victim's next arrival plus ``victim_lag x`` the victim's mean gap ``1 / base_rate``.
2. *Which prefix*: with probability ``replay_fraction`` a *replay*: the earliest admitted prefix
   whose replay is due (admitted at ``a``, due at ``a + replay_delay x clearance``, where
   ``clearance = max_c debt_c / rho_c`` is the designed clearance time of the attacker's buckets
   right after that admission (PrefixShield's gate reopens then), computed from the schedule as
   ``delayed_replay`` does); each admission is replayed at most once; when none is due the
   request is a pool request. Otherwise a *pool request*: round-robin over a pool of
   ``pool_size`` prefixes, all replaced by never-seen ones every ``rotation_s`` seconds (with
   ``rotation_s=None`` there is no pool: each pool request admits a never-seen prefix, as
   one_touch's do). A pool prefix's first request admits it; later ones reuse it (the same
   prompt: prefix and suffix, as ``two_pass_replay``'s replays).
3. *Under which contract*: ``attacker_alt_contract`` with probability ``alt_contract_fraction``
   (contract switching inside the group), else ``attacker_contract``.
4. *How long it decodes*: ``attacker_output_tokens`` tokens, or (None) ``output_dist`` draws
   as the victim.

Prefix ids are the admission ordinal, so at the point ``intensity=1, attacker_prefix_tokens =
prefix_tokens, rotation_s=None``, no replay, no switching, ``duty=1``, periodic arrivals, data
outputs and no victim sync (every default), the attacker rows are ``one_touch``'s at the same
rate, bit for bit (a test holds this).

**Aiming through a fleet's router** (``aim``, as ``one_touch``'s, see
`prefixshield.workloads.one_touch`): ``session`` gives the k-th admitted prefix the k-th
session id that the ``session`` ring sends to the victim's replicas (its reuses and replays
keep it; the content stays the attacker's own); ``prefix`` puts ``lead_blocks()`` blocks of
the victim's hot prefix ``k mod H`` before every prompt of the k-th admitted prefix. The lead
is part of the prompt the budget charges (requests pay their prompt tokens and block-seconds
with it), so an aimed point sends fewer requests under a token or block-seconds limit. The
designed creation (pressure ratio, debt, replay clearance) counts the lead as new blocks at
every admission; once the attacker has cached its own copy of a lead (tenant salt: never the
victim's), that overstates what it creates by up to ``lead_blocks()`` blocks an admission.

RNG: the attacker's suffixes and outputs come from its role stream (``STREAM_ATTACKER``) in
one_touch's order (a suffix per possible prefix, then an output per request); the schedule's
coin flips and Gamma gaps from a sub-stream ``[seed, STREAM_ATTACKER, 1]``, drawn in the same
amounts at every point (common random numbers: neighbouring points differ by their parameters,
not by fresh noise). Neither touches the victim's stream.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np

from prefixshield.traces.rows import RequestRows
from prefixshield.traces.schema import Trace
from prefixshield.traces.segments import SegmentKind, segment_ids
from prefixshield.workloads.attack import GI_ATTACKER, AttackParams, attack_meta, victim_and_window
from prefixshield.workloads.base import (STREAM_ATTACKER, check, periodic_times,
                                         prefix_suffix_prompts, rng_for, with_lead)
from prefixshield.workloads.one_touch import (DEFAULT_AIM_REPLICAS, check_aim, lead_blocks_for,
                                              prefix_aim, session_aim)
from prefixshield.workloads.registry import register

BUDGET_UNITS = ("requests", "prompt_tokens", "tokens", "block_s")
"""Units of the attacker's budget, each a limit per second (see the module doc)."""
BUDGET_ALIASES = {"both": ("requests", "prompt_tokens")}
"""Names of unit sets: ``both`` is the budget before block-seconds were charged."""


def parse_budget_limits(text: str) -> tuple[str, ...]:
    """``"requests+block_s"`` (or an alias) -> its units in `BUDGET_UNITS` order.
    Raises ValueError naming the bad text (unknown or repeated unit, empty)."""
    if text in BUDGET_ALIASES:
        return BUDGET_ALIASES[text]
    units = [u.strip() for u in str(text).split("+")]
    if not units or any(u not in BUDGET_UNITS for u in units) or len(set(units)) != len(units):
        raise ValueError(f"budget_limits must be units joined by '+' (each at most once) from "
                         f"{', '.join(BUDGET_UNITS)}, or both; got {text!r}")
    return tuple(u for u in BUDGET_UNITS if u in units)
MAX_OUTPUT_TOKENS = 1000
"""Largest output length in the Azure conversation trace (the packaged ``azure_conv`` data)."""


@dataclass(frozen=True)
class SearchedAttackParams(AttackParams):
    """``searched_attack``: victim as ``one_touch``; the attacker's choices are parameters.

    Every default reproduces ``one_touch``'s attacker (reference setup) except where
    a default says otherwise; the bounds the search explores are in
    `prefixshield.experiments.attack_space.SPACE`.

    Attributes:
        duration_s: one_touch's fitted attack window under the two-group population, 17 s.
        population: ``two_group`` only: the victim sends the whole base load, as when the
            search space was built (``victim_lag`` and ``victim_sync`` are in the victim's
            gaps; the search was not refitted to the background population).
        budget_limits: which limits apply: units joined by ``+`` from `BUDGET_UNITS`, or
            ``both`` (default: ``requests+prompt_tokens``, a rate limiter of requests and
            input tokens per minute, as API providers apply; not from the reference).
        budget_requests: the request limit, requests/s (None: the one-touch flood rate).
        budget_prompt_tokens: the prompt-token limit, tokens/s (None: the one-touch flood rate
            times one_touch's mean prompt, ``prefix_tokens`` + mean suffix).
        budget_tokens: the prompt + output token limit, tokens/s (None: the one-touch flood
            rate times one_touch's mean prompt plus its mean output).
        budget_block_s: the KV block-seconds limit, block-seconds per second (required when
            ``block_s`` applies; no default: it is measured).
        block_s_profile: the cost-model profile of the block-seconds estimate (module doc).
        block_s_scale: contention factor of that estimate (1: uncontended), > 0.
        intensity: fraction of the budget spent (the creation-rate knob: 1 floods at the
            budget, low values are low-and-slow); default 1 (one_touch spends its rate).
        attacker_prefix_tokens: tokens of each attacker prefix (None: ``prefix_tokens``, 1,536,
            one_touch's). A longer prefix costs more of a token budget per request.
        pool_size: prefixes of the pool (only with ``rotation_s``); 1: not from the reference
            (one_touch has no pool).
        rotation_s: seconds after which the pool is replaced by never-seen prefixes (None:
            no pool, every pool request admits a never-seen prefix: one_touch).
        replay_fraction: probability a request replays an admitted prefix (0: one_touch).
        replay_delay: replay delay in multiples of the designed clearance time (see module
            doc); 1.0: when the gate would reopen were the attacker quiet (``delayed_replay``'s
            default wait).
        alt_contract_fraction: probability a request goes under ``attacker_alt_contract``
            (0: one_touch).
        attacker_alt_contract: the second contract of the attacker's group: the victim's tier,
            ``standard`` (not from the reference: the attacker is entitled to no tier above the
            victim's). It must be the victim's or the attacker's contract, so the control's
            configured tenants do not depend on the attack.
        cycle_s: on/off period in seconds (20 s: a third of the 60 s measured phase it was
            chosen for, longer than one_touch's fitted 17 s; not from the reference;
            irrelevant at ``duty=1``).
        duty: on fraction of each cycle (1: always on, one_touch).
        phase: where in the first off-time the first on-period starts, as a fraction (0: at
            the window start).
        burst_cv: coefficient of variation of the gaps inside on-time (None: periodic, one_touch's
            schedule; 1: Poisson).
        attacker_output_tokens: every attacker request decodes this many tokens, at most 1,000
            (the Azure data's maximum); None: ``output_dist`` draws, as the victim (one_touch).
        victim_sync: probability a request is moved next to a victim arrival (0: one_touch).
        victim_lag: offset from that victim arrival in multiples of the victim's mean gap
            ``1 / base_rate``, in [-0.5, 0.5] (0: at the same instant, after it in the queue).
        aim, aim_replicas, aim_blocks: as ``one_touch``'s (module doc); ``none``: unaimed
            (one_touch).
    """

    duration_s: float = 17.0
    population: str = "two_group"
    budget_limits: str = "both"
    budget_requests: float | None = None
    budget_prompt_tokens: float | None = None
    budget_tokens: float | None = None
    budget_block_s: float | None = None
    block_s_profile: str = "l4-qwen2.5-1.5b"
    block_s_scale: float = 1.0
    intensity: float = 1.0
    attacker_prefix_tokens: int | None = None
    pool_size: int = 1
    rotation_s: float | None = None
    replay_fraction: float = 0.0
    replay_delay: float = 1.0
    alt_contract_fraction: float = 0.0
    attacker_alt_contract: str = "standard"
    cycle_s: float = 20.0
    duty: float = 1.0
    phase: float = 0.0
    burst_cv: float | None = None
    attacker_output_tokens: int | None = None
    victim_sync: float = 0.0
    victim_lag: float = 0.0
    aim: str = "none"
    aim_replicas: int = DEFAULT_AIM_REPLICAS
    aim_blocks: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.population == "two_group",
              f"searched_attack keeps the two_group population (its victim_lag and "
              f"victim_sync are in the victim's gaps), got population={self.population!r}")
        check(self.pressure_ratio is None and self.attacker_rate is None,
              "searched_attack spends a fixed budget: set budget_requests / "
              "budget_prompt_tokens and intensity, not pressure_ratio or attacker_rate")
        try:
            units = parse_budget_limits(self.budget_limits)
        except ValueError as e:
            check(False, str(e))
        for name in ("budget_requests", "budget_prompt_tokens", "budget_tokens",
                     "budget_block_s"):
            v = getattr(self, name)
            check(v is None or (v > 0 and math.isfinite(v)),
                  f"{name} must be a finite number > 0 per second, got {v}")
        check("block_s" not in units or self.budget_block_s is not None,
              "budget_limits charges block_s: set budget_block_s (block-seconds per second)")
        check(self.block_s_scale > 0 and math.isfinite(self.block_s_scale),
              f"block_s_scale must be a finite number > 0, got {self.block_s_scale}")
        check(0 < self.intensity <= 1, f"intensity must be in (0, 1], got {self.intensity}")
        check(self.attacker_prefix_tokens is None or self.attacker_prefix_tokens >= 1,
              f"attacker_prefix_tokens must be >= 1, got {self.attacker_prefix_tokens}")
        check(self.pool_size >= 1, f"pool_size must be >= 1, got {self.pool_size}")
        check(self.rotation_s is None or self.rotation_s > 0,
              f"rotation_s must be > 0 s (None: no pool), got {self.rotation_s}")
        for name in ("replay_fraction", "alt_contract_fraction", "victim_sync"):
            v = getattr(self, name)
            check(0 <= v <= 1, f"{name} must be in [0, 1], got {v}")
        check(self.replay_delay >= 0, f"replay_delay must be >= 0, got {self.replay_delay}")
        check(self.attacker_alt_contract in (self.victim_contract, self.attacker_contract),
              f"attacker_alt_contract must be the victim's ({self.victim_contract!r}) or the "
              f"attacker's ({self.attacker_contract!r}) contract, got "
              f"{self.attacker_alt_contract!r}")
        check(self.cycle_s > 0, f"cycle_s must be > 0 s, got {self.cycle_s}")
        check(0 < self.duty <= 1, f"duty must be in (0, 1], got {self.duty}")
        check(0 <= self.phase < 1, f"phase must be in [0, 1), got {self.phase}")
        check(self.burst_cv is None or self.burst_cv > 0,
              f"burst_cv must be > 0 (None: periodic), got {self.burst_cv}")
        check(self.attacker_output_tokens is None
              or 1 <= self.attacker_output_tokens <= MAX_OUTPUT_TOKENS,
              f"attacker_output_tokens must be in [1, {MAX_OUTPUT_TOKENS}], got "
              f"{self.attacker_output_tokens}")
        check(-0.5 <= self.victim_lag <= 0.5,
              f"victim_lag must be in [-0.5, 0.5], got {self.victim_lag}")
        check_aim(self)

    @property
    def attack_prefix_tokens(self) -> int:
        """Tokens of each attacker prefix."""
        return self.prefix_tokens if self.attacker_prefix_tokens is None \
            else self.attacker_prefix_tokens

    def lead_blocks(self) -> int:
        """``aim=prefix``'s lead in blocks (see ``one_touch``), for this point's prefix."""
        return lead_blocks_for(self, self.attack_prefix_tokens)

    @property
    def head_tokens(self) -> int:
        """Tokens of every attacker prompt before its suffix: the lead (``aim=prefix``) and
        the attacker's own prefix."""
        lead = self.lead_blocks() * self.block_size if self.aim == "prefix" else 0
        return lead + self.attack_prefix_tokens

    @property
    def mean_suffix_tokens(self) -> float:
        """Mean suffix length (uniform over ``suffix_tokens``)."""
        return (self.suffix_tokens[0] + self.suffix_tokens[1]) / 2

    def limits(self) -> dict[str, float]:
        """The applied limits per second by unit (`BUDGET_UNITS` order), defaults
        resolved (see the module doc)."""
        units = parse_budget_limits(self.budget_limits)
        ot_prompt = self.prefix_tokens + self.mean_suffix_tokens
        default = {"requests": self.one_touch_rate,
                   "prompt_tokens": self.one_touch_rate * ot_prompt,
                   "tokens": self.one_touch_rate * (ot_prompt + self._mean_output(None)),
                   "block_s": None}
        return {u: default[u] if getattr(self, f"budget_{u}") is None
                else getattr(self, f"budget_{u}") for u in units}

    def _output_support(self, fixed: int | None) -> tuple[np.ndarray, np.ndarray]:
        """(output lengths, probabilities): ``fixed`` tokens, or the data's distribution."""
        from prefixshield.workloads.outputs import output_support

        if fixed is not None:
            return output_support(self.output_dist, (fixed, fixed), None)
        return output_support(self.output_dist, self.output_tokens, self.max_output_tokens)

    def _mean_output(self, fixed: int | None) -> float:
        values, probs = self._output_support(fixed)
        return float(values @ probs)

    def request_costs(self) -> dict[str, float]:
        """Mean budget one attacker request of this point costs, by unit: 1 request, its
        prompt tokens, prompt + output tokens, and estimated block-seconds
        (`estimated_block_s`)."""
        prompt = self.head_tokens + self.mean_suffix_tokens
        return {"requests": 1.0, "prompt_tokens": prompt,
                "tokens": prompt + self._mean_output(self.attacker_output_tokens),
                "block_s": self.estimated_block_s(self.head_tokens,
                                                  self.attacker_output_tokens)}

    def estimated_block_s(self, prefix_tokens: int, output_tokens: int | None) -> float:
        """Expected KV block-seconds of one request with a ``prefix_tokens``-token prefix, this
        workload's suffixes and ``output_tokens`` outputs (None: the data's), estimated from
        its shape and the cost model ``block_s_profile`` times ``block_s_scale`` (module
        doc). Block-seconds."""
        from prefixshield.simulator.costmodel import load_profile

        cm = load_profile(self.block_s_profile).cost
        B = self.block_size
        values, probs = self._output_support(output_tokens)
        P = (prefix_tokens + np.arange(self.suffix_tokens[0], self.suffix_tokens[1] + 1,
                                       dtype=float))[:, None]
        O = values.astype(float)[None, :]
        t_prefill = cm.a_s + cm.b_s_per_prefill_token * P + cm.e_s_per_new_request
        t_decode = cm.a_s + cm.c_s_per_decode_seq + cm.d_s_per_context_token * (P + O / 2)
        est = np.ceil(P / B) * t_prefill + O * t_decode * (P + O / 2) / B
        return float(self.block_s_scale * np.mean(est @ probs))

    def budget_rate(self) -> float:
        """The budget in requests/s for this attacker's requests: the tightest limit."""
        return budget_request_rate(self.limits(), self.request_costs())

    def request_rate(self) -> float:
        """Mean attacker requests/s over the window: ``intensity x`` `budget_rate`."""
        return self.intensity * self.budget_rate()

    def attacker_blocks_per_request(self) -> float:
        """Expected blocks a fresh attacker request materializes (its prefix and outputs)."""
        out = (self.output_dist, self.output_tokens, self.max_output_tokens)
        if self.attacker_output_tokens is not None:
            out = (self.output_dist, (self.attacker_output_tokens,) * 2, None)
        from prefixshield.workloads.outputs import output_support

        values, probs = output_support(*out)
        prompt = self.head_tokens + np.arange(self.suffix_tokens[0], self.suffix_tokens[1] + 1)
        total = (prompt[:, None] + values[None, :] - 1) // self.block_size
        return float(np.mean(total @ probs))


def budget_request_rate(limits: dict[str, float], costs: dict[str, float]) -> float:
    """Requests/s the ``limits`` (per second, by unit) allow to requests costing ``costs`` each
    (mean, by unit; ``requests`` is 1): the smallest ``limit / cost``."""
    return min(v / (1.0 if u == "requests" else costs[u]) for u, v in limits.items())


def on_intervals(w0: float, w1: float, cycle_s: float, duty: float,
                 phase: float) -> np.ndarray:
    """The on-intervals ``[[start, end), ...]`` (seconds) of the on/off cycles inside
    ``[w0, w1)``: on for ``duty x cycle_s`` from ``w0 + off + j x cycle_s``, j = 0, 1, ...,
    where the first start ``off = phase x (1 - duty) x min(cycle_s, w1 - w0)`` lies inside
    the window's first off-time, so some on-time always falls in the window."""
    if duty >= 1.0:
        return np.array([[w0, w1]])
    off = phase * (1.0 - duty) * min(cycle_s, w1 - w0)
    starts = w0 + off + np.arange(0, math.ceil((w1 - w0) / cycle_s) + 1) * cycle_s
    ends = starts + duty * cycle_s
    s, e = np.maximum(starts, w0), np.minimum(ends, w1)
    keep = e > s
    return np.stack([s[keep], e[keep]], axis=1)


def on_time_to_wall(u: np.ndarray, intervals: np.ndarray) -> np.ndarray:
    """Map on-time positions ``u`` (seconds of on-time since the window start) to wall times."""
    lengths = intervals[:, 1] - intervals[:, 0]
    cum = np.concatenate([[0.0], np.cumsum(lengths)])
    k = np.clip(np.searchsorted(cum, u, side="right") - 1, 0, len(lengths) - 1)
    return intervals[k, 0] + (u - cum[k])


def attacker_times(p: SearchedAttackParams, rng: np.random.Generator, w0: float, w1: float,
                   victim_t: np.ndarray) -> np.ndarray:
    """Attacker arrival times (sorted): the budgeted count, shaped by the burst parameters and
    moved next to victim arrivals (see the module doc). Draws the same amounts from ``rng``
    at every point."""
    rate = p.request_rate()
    intervals = on_intervals(w0, w1, p.cycle_s, p.duty, p.phase)
    on_total = float(np.sum(intervals[:, 1] - intervals[:, 0])) if p.duty < 1.0 else w1 - w0
    rate_on = rate * ((w1 - w0) / on_total)
    n = max(0, math.ceil(on_total * rate_on - 1e-9))
    u_sync = rng.random(n)
    if p.burst_cv is None:
        u = periodic_times(rate_on, 0.0, on_total)
    else:
        shape = 1.0 / (p.burst_cv * p.burst_cv)
        gaps = rng.gamma(shape, 1.0, size=n + 1)
        u = np.cumsum(gaps)[:n] * (on_total / float(np.sum(gaps)))
    t = w0 + u if p.duty >= 1.0 else on_time_to_wall(u, intervals)
    if p.victim_sync > 0 and len(victim_t) and n:
        move = u_sync[:len(t)] < p.victim_sync
        idx = np.searchsorted(victim_t, t[move], side="left")
        ok = idx < len(victim_t)
        moved = t[move]
        moved[ok] = victim_t[idx[ok]] + p.victim_lag / p.base_rate
        t = t.copy()
        t[move] = np.clip(moved, w0, np.nextafter(w1, w0))
        t = np.sort(t, kind="stable")
    return t


def plan_prefixes(p: SearchedAttackParams, w0: float, t: np.ndarray, u_replay: np.ndarray,
                  u_contract: np.ndarray, suffix_len: np.ndarray,
                  out: np.ndarray) -> dict[str, np.ndarray]:
    """Per attacker request (times ``t`` sorted, pressure window from ``w0``): its prefix (dense
    admission ordinal), contract
    index (0: primary, 1: alternate) and kind (0 admission, 1 pool reuse, 2 replay), and the
    designed debt of the attacker's buckets after each request (blocks, summed over its
    contracts), from the PrefixShield bucket charged every full block a fresh request computes
    and, for a reuse or replay, the blocks beyond the hit cap ``floor((P - 1) / B)``."""
    contracts = p.contract_table
    names = [p.attacker_contract, p.attacker_alt_contract]
    rho = np.array([contracts[c].rho_blocks_per_s for c in names])
    beta = np.array([contracts[c].beta_blocks for c in names])
    bucket = beta.copy()
    t_last = np.full(2, np.nan)
    B = p.block_size
    prefix_of: dict[tuple[int, int], int] = {}
    due: list[tuple[float, int, int]] = []   # (due time, admission ordinal, prefix)
    n = len(t)
    prefix = np.empty(n, np.int64)
    kind = np.empty(n, np.int64)
    cidx = (u_contract[:n] < p.alt_contract_fraction).astype(np.int64)
    if p.attacker_alt_contract == p.attacker_contract:
        cidx[:] = 0   # one contract, one bucket
    debt = np.empty(n)
    rr = 0
    for i in range(n):
        ti = float(t[i])
        k = 0
        if u_replay[i] < p.replay_fraction and due and due[0][0] <= ti:
            _, _, pre = heapq.heappop(due)
            prefix[i], k = pre, 2
        else:
            if p.rotation_s is None:
                key = (-1, rr)   # no pool: a never-seen prefix
            else:
                key = (int((ti - w0) // p.rotation_s), rr % p.pool_size)
            rr += 1
            if key in prefix_of:
                prefix[i], k = prefix_of[key], 1
            else:
                prefix[i] = prefix_of[key] = len(prefix_of)
        kind[i] = k
        prompt = p.head_tokens + int(suffix_len[prefix[i]])
        blocks = (prompt + int(out[i]) - 1) // B
        if k:
            blocks -= (prompt - 1) // B
        c = int(cidx[i])
        for j in range(2):   # lazy refill of both buckets to ti
            if not np.isnan(t_last[j]):
                bucket[j] = min(beta[j], bucket[j] + rho[j] * (ti - t_last[j]))
            t_last[j] = ti
        bucket[c] -= blocks
        debt[i] = float(np.sum(np.maximum(0.0, -bucket)))
        if k == 0:
            clearance = float(np.max(np.maximum(0.0, -bucket) / rho))
            heapq.heappush(due, (ti + p.replay_delay * clearance, i, int(prefix[i])))
    return {"prefix": prefix, "contract": cidx, "kind": kind, "designed_debt": debt}


@register("searched_attack", SearchedAttackParams)
def searched_attack(params: SearchedAttackParams | None = None) -> Trace:
    """The victim of ``one_touch`` and an attacker spending its budget as the params say.

    ``meta`` adds ``budget_limits`` (per second, by unit), ``attacker_requests``,
    ``attacker_admissions`` / ``attacker_reuses`` / ``attacker_replays`` (counts by kind),
    ``attacker_prompt_tokens_per_s`` and ``attacker_tokens_per_s`` (prompt + output; sent, over
    the window), ``designed_pressure_ratio``
    (designed new blocks per second over the summed refill of the contracts used) and
    ``designed_final_debt_blocks``.
    """
    p = params or SearchedAttackParams()
    rows = RequestRows()
    victim, w0, w1 = victim_and_window(p, rows)
    rows.declare(p.attacker_group, p.attacker_contract)
    victim_t = np.sort(np.concatenate([a for a, (r, _) in zip(rows.cols["arrival_s"],
                                                              rows.roles())
                                       if r == "victim"] or [np.empty(0)]))
    victim_t = victim_t[victim_t >= victim["measure_start_s"]]
    if not p.attack:   # the control: the attacker configured, silent, never generated
        meta = attack_meta("searched_attack", p, victim, 0.0, (w0, w1), attacker_requests=0,
                           budget_limits=p.limits())
        return rows.finish(p.seed, p.vocab_size, meta)
    sched = np.random.default_rng([int(p.seed), STREAM_ATTACKER, 1])
    t = attacker_times(p, sched, w0, w1, victim_t)
    n = len(t)
    u_replay, u_contract = sched.random(n), sched.random(n)
    rng = rng_for(p.seed, STREAM_ATTACKER)
    suffix_len = p.draw_suffixes(rng, n)
    if p.attacker_output_tokens is None:
        out = p.draw_outputs(rng, n)
    else:
        out = np.full(n, p.attacker_output_tokens, dtype=np.int64)
    plan = plan_prefixes(p, w0, t, u_replay, u_contract, suffix_len, out)
    names = [p.attacker_contract, p.attacker_alt_contract]
    admitted = int(plan["prefix"].max()) + 1 if n else 0
    # by admission ordinal: the session id (the ordinal itself unaimed) and the lead
    aims = {"none": None, "session": session_aim, "prefix": prefix_aim}
    aim = aims[p.aim](p, admitted) if aims[p.aim] is not None else None
    session_id = aim.ids if aim is not None and aim.ids is not None else np.arange(admitted)
    prompt_tokens = 0
    for c in (0, 1):
        sel = plan["contract"] == c
        if not sel.any():
            continue
        local = plan["prefix"][sel]
        ids, lens = prefix_suffix_prompts(
            segment_ids(GI_ATTACKER, SegmentKind.PREFIX, local), p.attack_prefix_tokens,
            segment_ids(GI_ATTACKER, SegmentKind.SUFFIX, local), suffix_len[local])
        if aim is not None and aim.lead_segments is not None:
            ids, lens = with_lead(ids, lens, aim.lead_segments[local], aim.lead_tokens)
        rows.add(t[sel], p.attacker_group, names[c], "attacker", session_id[local], True,
                 out[sel], ids, lens)
        prompt_tokens += int(lens.sum())
    window = w1 - w0
    kinds = plan["kind"]
    used = {names[c] for c in np.unique(plan["contract"])} or {p.attacker_contract}
    rho_used = sum(p.contract_table[c].rho_blocks_per_s for c in used)
    designed = _designed_blocks(p, plan, suffix_len, out)
    meta = attack_meta(
        "searched_attack", p, victim, n / window if window > 0 else 0.0, (w0, w1),
        attacker_requests=n, budget_limits=p.limits(),
        attacker_admissions=int(np.sum(kinds == 0)), attacker_reuses=int(np.sum(kinds == 1)),
        attacker_replays=int(np.sum(kinds == 2)),
        attacker_prompt_tokens_per_s=prompt_tokens / window if window > 0 else 0.0,
        attacker_tokens_per_s=(prompt_tokens + int(np.sum(out))) / window if window > 0
        else 0.0,
        designed_pressure_ratio=designed / window / rho_used if window > 0 else 0.0,
        designed_final_debt_blocks=float(plan["designed_debt"][-1]) if n else 0.0,
        **(aim.meta if aim is not None else {}))
    return rows.finish(p.seed, p.vocab_size, meta)


def _designed_blocks(p: SearchedAttackParams, plan: dict, suffix_len: np.ndarray,
                     out: np.ndarray) -> float:
    """Designed new blocks of the whole attacker schedule (see `plan_prefixes`)."""
    prompt = p.head_tokens + suffix_len[plan["prefix"]]
    blocks = (prompt + out - 1) // p.block_size
    blocks = np.where(plan["kind"] > 0, blocks - (prompt - 1) // p.block_size, blocks)
    return float(np.sum(blocks))
