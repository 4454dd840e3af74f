"""The victim-plus-attacker setup shared by ``one_touch``, ``low_and_slow``, ``two_pass_replay``
and ``delayed_replay``.

Timeline::

    t = 0                      measure_start_s                              measure_end_s
    |-- warm-up (measured=False) --|------------ measured phase (duration_s) ----------|
     each hot prefix once, within   victim: Poisson(victim share x base_rate), cycling the
     the victim's entitlement               hot prefixes
                                    background groups: Poisson(the rest of base_rate)
                                    attacker: window [pressure_start_s, +pressure_duration_s)
                                    (relative to measure_start_s; default: the whole phase)

The base load ``base_rate = alpha x C_prefill`` is the whole trace's: who sends it is the
population (`prefixshield.workloads.population`; ``two_group``: the victim alone).

Defaults and where they come from ("the reference setup" is the reference study's stated setup):

* 512 blocks of 16 tokens, 1,536-token prefixes (96 blocks), alpha 0.6, victim on ``standard``,
  attacker on ``best_effort``: the reference setup.
* Hot set: the prefix length is fixed and the *number* of hot prefixes scales with the cache,
  ``round(hot_fraction * usable / prefix_blocks)`` with ``hot_fraction = 0.75`` (reference: 4
  prefixes = 384 of 511 blocks = 75.1% at 512 blocks; 8/16/32 at 1,024/2,048/4,096, the
  capacity sweep's "hot set ≈ 76.6% of usable").
* Suffixes of 1-22 tokens and outputs of ``azure_conv`` lengths clipped at 8 tokens (see
  `prefixshield.workloads.outputs`): not stated by the reference; fitted to its no-attack
  LRU hit ratios and to the request rate LRU sustained at 60% load (``PrefixParams``,
  docs/fidelity.md). Every request decodes its output and keeps its blocks pinned while it
  does.
* Warm-up: each hot prefix once, spaced so that the victim's creation stays within its refill
  (``PrefixParams.warmup_gap``); the reference's "warm-up phase that first populates the
  victim's hot set is not measured".

Attack intensity is the **creation-pressure ratio**: the attacker's new-block creation rate
(prompt and decode blocks) over its contract's refill ``rho``. ``pressure_ratio`` sets it (the
attacker's request rate is then ``pressure_ratio * rho / blocks per attacker request``);
``attacker_rate`` sets the request rate directly and wins over both. Every trace records the
designed ratio in ``meta["designed_pressure_ratio"]``; a run reports the *measured* one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Iterator, Mapping, NamedTuple

import numpy as np

from prefixshield.edges import MAX_REQUESTS, check_count, check_requests
from prefixshield.tenancy import DEFAULT_CONTRACTS, Contract
from prefixshield.traces.rows import RequestRows
from prefixshield.traces.schema import Trace
from prefixshield.traces.segments import SegmentKind, segment_ids
from prefixshield.traces.stream import TraceStream, concat_traces
from prefixshield.workloads.base import (STREAM_ATTACKER, STREAM_BACKGROUND, STREAM_VICTIM,
                                         PrefixParams, add_cyclic_stream, add_fresh_prefixes,
                                         check, periodic_times, prefix_suffix_prompts,
                                         renewal_times, rng_for, with_template)
from prefixshield.workloads.population import (POPULATIONS, add_background, background_names,
                                               canonical_tenants, check_background_size,
                                               check_population, population_meta)
from prefixshield.workloads.registry import params_to_dict

# Group indices of the segment-id namespaces (fixed per role, see traces/segments.py).
GI_VICTIM = 0
GI_ATTACKER = 1
GI_NEUTRAL = 2


@dataclass(frozen=True)
class AttackParams(PrefixParams):
    """Victim-plus-attacker workloads (``one_touch`` and its variants).

    Attributes:
        hot_fraction: victim hot set as a fraction of usable blocks (sets the number of hot
            prefixes when ``num_hot_prefixes`` is None); reference: 0.75.
        num_hot_prefixes: explicit number of hot prefixes (None: derived, see module doc).
        attack: False gives the no-attack control: the same trace without attacker rows, the
            attacker still configured (``meta["tenants"]``), so quotas are sized the same.
        pressure_ratio: attacker creation rate / its contract's refill (None: the workload's
            own default rate).
        attacker_rate: attacker requests/s (None: from ``pressure_ratio`` or the workload).
        pressure_start_s: start of the attacker's pressure window, seconds after the measured
            phase starts (0: the attack covers the whole measured phase).
        pressure_duration_s: length of the window in seconds (None: to the end of the run).
        victim_group, victim_contract, attacker_group, attacker_contract: names in the trace.
        contracts: contract table used to size attacks (None: ``DEFAULT_CONTRACTS``).
        population: whose arrivals make up the base load, one of
            `POPULATIONS` (see
            `prefixshield.workloads.population`): ``background`` (default) or
            ``two_group``; it fills every field below left at None, and each workload's own
            reading-dependent defaults (``POPULATION_DEFAULTS``).
        background_groups: benign background groups sending the base load the victim does not
            (None: the population's; ``background``: 6, the reference's 8-group setting less
            the victim and the attacker; ``two_group``: 0).
        victim_share: the victim's share of ``base_rate`` (None: the population's; fitted for
            ``background``, 1 for ``two_group``).
        victim_rate: the victim's requests/s, given directly (wins over ``victim_share``; at
            most ``base_rate``).
        background_prefix_tokens: each background group's system prompt (tokens), shared by
            its requests (256, one 16-block template: not stated by the reference, not fitted).
        background_contract: the background groups' contract.
        background_group: name stem of the background groups (``tenant1`` ... ``tenantN``).
        template_tokens: a template after each of the victim's hot prefixes, shared by every
            request of that prefix (0: none). 32 (two blocks) is the capacity sweep's
            98-block reading: the hot set is then 76.6% of the usable blocks at 1,024-4,096,
            as the reference observed (the number of hot prefixes stays as
            ``hot_fraction`` sets it from the 96-block prefix).
    """

    POPULATION_DEFAULTS: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        "background": {"background_groups": 6, "victim_share": 0.575},
        "two_group": {"background_groups": 0, "victim_share": 1.0},
    }
    """Per population: the value of each reading-dependent field left at None."""

    hot_fraction: float = 0.75
    num_hot_prefixes: int | None = None
    attack: bool = True
    pressure_ratio: float | None = None
    attacker_rate: float | None = None
    pressure_start_s: float = 0.0
    pressure_duration_s: float | None = None
    victim_group: str = "victim"
    victim_contract: str = "standard"
    attacker_group: str = "attacker"
    attacker_contract: str = "best_effort"
    contracts: Mapping[str, Contract] | None = None
    population: str = "background"
    background_groups: int | None = None
    victim_share: float | None = None
    victim_rate: float | None = None
    background_prefix_tokens: int = 256
    background_contract: str = "standard"
    background_group: str = "tenant"
    template_tokens: int = 0

    def __post_init__(self) -> None:
        check(self.population in POPULATIONS, f"population must be one of "
              f"{', '.join(POPULATIONS)}, got {self.population!r}")
        for name, value in self.POPULATION_DEFAULTS[self.population].items():
            if getattr(self, name) is None:  # an explicit value wins over the reading's
                object.__setattr__(self, name, value)
        super().__post_init__()
        check(self.background_groups >= 0,
              f"background_groups must be >= 0, got {self.background_groups}")
        check_background_size(self)
        check(0 < self.victim_share <= 1,
              f"victim_share must be in (0, 1], got {self.victim_share}")
        check(self.victim_rate is None or self.victim_rate > 0,
              f"victim_rate must be > 0 requests/s, got {self.victim_rate}")
        check(self.background_prefix_tokens >= 1,
              f"background_prefix_tokens must be >= 1, got {self.background_prefix_tokens}")
        check(self.background_contract in self.contract_table,
              f"background_contract {self.background_contract!r} is not in contracts "
              f"({', '.join(self.contract_table)})")
        clash = sorted({self.victim_group, self.attacker_group} & set(background_names(self)))
        check(not clash, f"background group name {clash[0] if clash else ''} is the victim's "
                         f"or the attacker's group; set background_group")
        check(self.template_tokens >= 0,
              f"template_tokens must be >= 0, got {self.template_tokens}")
        check(0 < self.hot_fraction <= 1,
              f"hot_fraction must be in (0, 1], got {self.hot_fraction}")
        check(self.num_hot_prefixes is None or self.num_hot_prefixes >= 1,
              f"num_hot_prefixes must be >= 1, got {self.num_hot_prefixes}")
        check(self.pressure_ratio is None or self.pressure_ratio > 0,
              f"pressure_ratio must be > 0, got {self.pressure_ratio}")
        check(self.attacker_rate is None or self.attacker_rate > 0,
              f"attacker_rate must be > 0 requests/s, got {self.attacker_rate}")
        check(self.pressure_start_s >= 0,
              f"pressure_start_s must be >= 0 s, got {self.pressure_start_s}")
        check(self.pressure_duration_s is None or self.pressure_duration_s > 0,
              f"pressure_duration_s must be > 0 s, got {self.pressure_duration_s}")
        check(self.victim_group != self.attacker_group,
              "victim_group and attacker_group must differ")
        for role in ("victim", "attacker"):
            name = getattr(self, f"{role}_contract")
            check(name in self.contract_table, f"{role}_contract {name!r} is not in contracts "
                                               f"({', '.join(self.contract_table)})")

    @property
    def contract_table(self) -> Mapping[str, Contract]:
        """``contracts`` or the defaults."""
        return DEFAULT_CONTRACTS if self.contracts is None else self.contracts

    @property
    def attacker_rho(self) -> float:
        """Refill of the attacker's contract, blocks/s."""
        return self.contract_table[self.attacker_contract].rho_blocks_per_s

    @property
    def hot_prefixes(self) -> int:
        """Number of victim hot prefixes (explicit, or scaled with the cache)."""
        if self.num_hot_prefixes is not None:
            return self.num_hot_prefixes
        return max(1, round(self.hot_fraction * self.usable_blocks / max(1, self.prefix_blocks)))

    @property
    def victim_request_rate(self) -> float:
        """The victim's requests/s: ``victim_rate``, else ``victim_share x base_rate``."""
        return self.victim_rate if self.victim_rate is not None \
            else self.victim_share * self.base_rate

    @property
    def victim_warmup_gap(self) -> float:
        """Warm-up spacing (s): within the victim contract's refill (see ``warmup_gap``), no
        faster than the victim's own rate."""
        if self.warmup_gap_s is not None:
            return self.warmup_gap_s
        rho = self.contract_table[self.victim_contract].rho_blocks_per_s
        return max(1.0 / self.victim_request_rate, self.expected_request_blocks() / rho)

    @property
    def one_touch_rate(self) -> float:
        """The reference's one-touch flood rate, ``min(0.75 C_prefill, 1.15 base_rate)``
        requests/s."""
        return min(0.75 * self.c_prefill, 1.15 * self.base_rate)

    def attacker_blocks_per_request(self) -> float:
        """Expected blocks one attacker request materializes (fresh prefix; workloads that
        replay override this with their mix)."""
        return self.expected_request_blocks()

    def attacker_request_rate(self) -> float:
        """Attacker requests/s: ``attacker_rate``, else from ``pressure_ratio``, else the
        one-touch flood rate."""
        if self.attacker_rate is not None:
            return self.attacker_rate
        if self.pressure_ratio is not None:
            return self.pressure_ratio * self.attacker_rho / self.attacker_blocks_per_request()
        return self.one_touch_rate

    def designed_pressure_ratio(self, rate: float) -> float:
        """Creation pressure of ``rate`` attacker requests/s: blocks/s over the refill."""
        return rate * self.attacker_blocks_per_request() / self.attacker_rho


def population_defaults(base: Mapping[str, Mapping[str, Any]],
                        **extra: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``base``'s reading-dependent defaults with a workload's own added, per population
    (``extra``: population name -> {field: value})."""
    return {name: {**fields, **extra.get(name, {})} for name, fields in base.items()}


def victim_and_window(p: AttackParams, rows: RequestRows) -> tuple[dict, float, float]:
    """Add the victim's warm-up and measured stream, and the background groups' measured
    streams (`population`); return the victim's meta and the
    pressure window."""
    check_population(p)
    victim = add_cyclic_stream(rows, p, stream=STREAM_VICTIM, group_index=GI_VICTIM,
                               group=p.victim_group, contract=p.victim_contract, role="victim",
                               num_prefixes=p.hot_prefixes, warmup_gap=p.victim_warmup_gap,
                               rate=p.victim_request_rate, template_tokens=p.template_tokens)
    if p.background_groups:
        add_background(rows, p, rng_for(p.seed, STREAM_BACKGROUND), victim["measure_start_s"],
                       victim["measure_end_s"])
    w0 = victim["measure_start_s"] + p.pressure_start_s
    w1 = victim["measure_end_s"] if p.pressure_duration_s is None else \
        min(victim["measure_end_s"], w0 + p.pressure_duration_s)
    return victim, w0, w1


def attack_meta(name: str, p: AttackParams, victim: dict[str, float], attacker_rate: float,
                window: tuple[float, float], **extra: Any) -> dict:
    """The ``meta`` of an attack trace: params, sizes, rates, the pressure window and ratio."""
    meta = {
        "workload": name,
        "params": params_to_dict(p),
        "c_prefill": p.c_prefill,
        "usable_blocks": p.usable_blocks,
        "prefix_blocks": p.prefix_blocks,
        "num_hot_prefixes": p.hot_prefixes,
        "hot_blocks": p.hot_prefixes * ((p.prefix_tokens + p.template_tokens) // p.block_size),
        "victim_group": p.victim_group,
        "attacker_group": p.attacker_group,
        "attacker_rate": attacker_rate,
        "attacker_blocks_per_request": p.attacker_blocks_per_request(),
        "attacker_rho_blocks_per_s": p.attacker_rho,
        "designed_pressure_ratio": p.designed_pressure_ratio(attacker_rate),
        "pressure_window_s": list(window),
        **victim,
    }
    meta.update(population_meta(p))
    meta.update(extra)
    return meta


def finish_attack(rows: RequestRows, p: AttackParams, meta: dict) -> Trace:
    """The attack trace of ``rows`` (the attacker dropped in a control), its tenants in the
    population's order when it has background groups (`canonical_tenants`)."""
    trace = rows.finish(p.seed, p.vocab_size, meta, drop_role=drop_role(p))
    if p.background_groups:
        trace.meta = canonical_tenants(trace.meta, p)
    return trace


def drop_role(p: AttackParams) -> str | None:
    """The role a control removes (the attacker), or None."""
    return None if p.attack else "attacker"


GEN_WINDOW_S = 600.0
"""Seconds of the measured phase one generated window covers (`fresh_prefix_windows`):
a trace whose measured phase is at most this long is drawn whole, as it always was (every
pinned digest); a longer one is drawn a window at a time, in memory or streamed, the same
rows either way."""


def window_rng(seed: int, stream: int, k: int) -> np.random.Generator:
    """The generator of one role's stream in window ``k``: the role's own stream for window
    0 (`rng_for`), ``default_rng([seed, stream, k])`` after it."""
    return rng_for(seed, stream) if k == 0 else np.random.default_rng([int(seed), stream, k])


def _periodic_count(rate: float, w0: float, w1: float, x: float) -> int:
    """How many times of `periodic_times` ``(rate, w0, w1)`` (``w0 + j / rate``, the
    same float operations) are below ``x``: an estimate, then the exact times around it."""
    n = max(0, math.ceil((w1 - w0) * rate - 1e-9))
    j = min(n, max(0, math.floor((min(x, w1) - w0) * rate) - 2))
    while j < n and w0 + j / rate < min(x, w1):
        j += 1
    return j


def _periodic_slice(rate: float, w0: float, w1: float, a: float, b: float) -> np.ndarray:
    """The ordinals ``j`` of `periodic_times` ``(rate, w0, w1)`` whose time is in
    ``[a, b)``, without drawing the others."""
    return np.arange(_periodic_count(rate, w0, w1, a), _periodic_count(rate, w0, w1, b),
                     dtype=np.int64)


class _Window(NamedTuple):
    """What `fresh_prefix_windows` draws and keeps from window to window."""

    rows: int               # rows numbered so far (request ids, before a control drops any)
    victim_rows: int        # victim rows so far (its suffix segments)
    victim_measured: int    # victim measured rows so far (its hot-prefix cycle)
    background: list        # requests each background group sent so far (its suffixes)


def fresh_prefix_windows(name: str, p: AttackParams) -> tuple[dict, Iterator[Trace]]:
    """`fresh_prefix_attack` (unaimed) a window of `GEN_WINDOW_S` seconds of the
    measured phase at a time: the meta of the whole trace (``measured_requests`` None: not
    known before the last window) and an iterator of validated window traces, rows in arrival
    order, request ids going on from window to window.

    Window ``k`` covers ``[start + k W, start + (k + 1) W)`` of the measured phase (window 0
    also the warm-up). The victim's Poisson arrivals, suffixes and outputs there are drawn from
    `window_rng` ``(seed, STREAM_VICTIM, k)``, its hot prefixes cycling on from the
    previous window; the attacker's times are those of the whole trace (periodic: the same
    floats), its suffixes and outputs drawn from ``window_rng(seed, STREAM_ATTACKER, k)``,
    prefix ids its ordinals. Poisson arrivals restarted at a window's start are the same
    process (memoryless); what changes against one draw over the whole phase is which random
    numbers fall where. Every window declares both tenants (the meta's ``tenants`` are the
    whole trace's)."""
    hot = p.hot_prefixes
    gap = p.victim_warmup_gap
    check_count(hot, MAX_REQUESTS, "victim prefixes (one warm-up request each)")
    start = hot * gap
    end = start + p.duration_s
    w0 = start + p.pressure_start_s
    w1 = end if p.pressure_duration_s is None else min(end, w0 + p.pressure_duration_s)
    rate = p.attacker_request_rate()
    victim = {"measure_start_s": float(start), "measure_end_s": float(end),
              "warmup_requests": int(hot), "measured_requests": None}
    meta = attack_meta(name, p, victim, rate, (w0, w1),
                       attacker_requests=_periodic_count(rate, w0, w1, w1))
    meta["tenants"] = {
        "groups": list(dict.fromkeys([p.victim_group, p.attacker_group])),
        "contracts": list(dict.fromkeys([p.victim_contract, p.attacker_contract]))}
    if p.background_groups:
        meta = canonical_tenants(meta, p)
    windows = max(1, math.ceil(p.duration_s / GEN_WINDOW_S))

    def draw() -> Iterator[Trace]:
        state = _Window(0, 0, 0, [0] * p.background_groups)
        for k in range(windows):
            a, b = start + k * GEN_WINDOW_S, min(end, start + (k + 1) * GEN_WINDOW_S)
            rows = RequestRows()
            rows.declare(p.victim_group, p.victim_contract)
            rows.declare(p.attacker_group, p.attacker_contract)
            for g in background_names(p):
                rows.declare(g, p.background_contract)
            rng = window_rng(p.seed, STREAM_VICTIM, k)
            warm_t = np.arange(hot) * gap if k == 0 else np.empty(0)
            meas_t = renewal_times(rng, p.victim_request_rate, a, b)
            n_w, n_m = len(warm_t), len(meas_t)
            n = n_w + n_m
            prefix_idx = np.concatenate([np.arange(n_w),
                                         state.victim_measured + np.arange(n_m)]) % hot
            suffix_len = p.draw_suffixes(rng, n)
            out = p.draw_outputs(rng, n)
            ids, lens = prefix_suffix_prompts(
                segment_ids(GI_VICTIM, SegmentKind.PREFIX, prefix_idx), p.prefix_tokens,
                segment_ids(GI_VICTIM, SegmentKind.SUFFIX, state.victim_rows + np.arange(n)),
                suffix_len)
            ids, lens = with_template(ids, lens, GI_VICTIM, prefix_idx, p.template_tokens)
            rows.add(np.concatenate([warm_t, meas_t]), p.victim_group, p.victim_contract,
                     "victim", prefix_idx, np.arange(n) >= n_w, out, ids, lens)
            sent = state.background
            if p.background_groups:
                sent = add_background(rows, p, window_rng(p.seed, STREAM_BACKGROUND, k), a, b,
                                      state.background)
            js = _periodic_slice(rate, w0, w1, a, b)
            rng = window_rng(p.seed, STREAM_ATTACKER, k)
            att_suffix = p.draw_suffixes(rng, len(js))
            att_out = p.draw_outputs(rng, len(js))
            ids, lens = prefix_suffix_prompts(
                segment_ids(GI_ATTACKER, SegmentKind.PREFIX, js), p.prefix_tokens,
                segment_ids(GI_ATTACKER, SegmentKind.SUFFIX, js), att_suffix)
            rows.add(w0 + js / rate, p.attacker_group, p.attacker_contract, "attacker", js,
                     True, att_out, ids, lens)
            trace = rows.finish(p.seed, p.vocab_size, meta, drop_role=drop_role(p))
            trace.requests["request_id"] += state.rows
            trace.meta = meta
            n_bg = sum(sent) - sum(state.background)
            state = _Window(state.rows + n + n_bg + len(js), state.victim_rows + n,
                            state.victim_measured + n_m, sent)
            yield trace

    return meta, draw()


class Aim(NamedTuple):
    """What an attacker aiming through a fleet's router changes of its requests (see
    `prefixshield.workloads.one_touch`); every field at its default leaves the request as
    the unaimed attacker sends it.

    Attributes:
        ids: distinct non-negative prefix (session) ids, one per attacker request in order
            (None: the request's ordinal).
        lead_segments: a segment id per request, of which ``lead_tokens`` tokens go before the
            request's own prompt (None: no lead).
        lead_tokens: tokens of the lead (a whole number of blocks).
        meta: what the trace's meta records of the aim.
    """

    ids: np.ndarray | None = None
    lead_segments: np.ndarray | None = None
    lead_tokens: int = 0
    meta: dict | None = None


def fresh_prefix_attack(name: str, p: AttackParams, aim=None) -> Trace:
    """The victim stream plus an attacker sending a never-seen prefix and suffix every
    ``1 / attacker_request_rate()`` seconds through the pressure window.

    ``aim`` (None: unaimed) maps the number of attacker requests to an `Aim`: the ids
    an attacker chooses to steer a router by its session key, or a lead put before every
    prompt to steer one by content. The attacker's own content stays fresh either way and the
    suffix and output lengths are drawn in the same order, so an aimed trace differs from the
    unaimed one only in its attacker's prefix ids and token ids (``ids``) or in its attacker's
    leading segment (a lead).

    An unaimed trace whose measured phase is longer than `GEN_WINDOW_S` is the
    concatenation of `fresh_prefix_windows` (the rows a streamed run of it reads); each
    role's stream may still hold at most `MAX_REQUESTS` requests
    in memory."""
    if aim is None and p.duration_s > GEN_WINDOW_S:
        check_population(p)
        check_requests(p.base_rate, p.duration_s, "victim and background arrivals")
        check_requests(p.attacker_request_rate(), p.duration_s, "attacker arrivals")
        meta, parts = fresh_prefix_windows(name, p)
        parts = list(parts)
        measured = sum(int((t.requests["role"] == "victim").sum()) for t in parts) \
            - p.hot_prefixes
        meta = {**meta, "measured_requests": measured}
        return concat_traces(parts, p.seed, p.vocab_size, meta)
    rows = RequestRows()
    victim, w0, w1 = victim_and_window(p, rows)
    rate = p.attacker_request_rate()
    t = periodic_times(rate, w0, w1)
    rng = rng_for(p.seed, STREAM_ATTACKER)
    a = Aim() if aim is None else aim(len(t))
    if a.ids is None:
        ids, suffix_len = np.arange(len(t)), None
    else:
        ids = np.asarray(a.ids, dtype=np.int64)
        drawn = p.draw_suffixes(rng, len(t))  # by ordinal: the unaimed trace's lengths
        suffix_len = np.zeros(int(ids.max()) + 1 if ids.size else 0, dtype=drawn.dtype)
        suffix_len[ids] = drawn
    lead = None if a.lead_segments is None else (a.lead_segments, a.lead_tokens)
    add_fresh_prefixes(rows, p, rng, t, ids, group_index=GI_ATTACKER, group=p.attacker_group,
                       contract=p.attacker_contract, role="attacker", suffix_len=suffix_len,
                       lead=lead)
    meta = attack_meta(name, p, victim, rate, (w0, w1), attacker_requests=len(t),
                       **(a.meta or {}))
    return finish_attack(rows, p, meta)


STREAMED_WORKLOADS = ("one_touch", "low_and_slow")
"""The workloads whose generator draws windows of time (`fresh_prefix_windows`): a
streamed run reads them a window at a time (unaimed ``one_touch``)."""


def stream_attack(name: str, p: AttackParams) -> TraceStream:
    """Workload ``name`` (one of `STREAMED_WORKLOADS`) with params ``p`` as a
    `TraceStream` of windows: the rows
    `fresh_prefix_attack` builds, one window in memory at a time.

    Raises:
        ValueError: the workload draws its whole trace at once (or ``one_touch`` is aimed:
            its prefix ids depend on every attacker request).
    """
    if name not in STREAMED_WORKLOADS or getattr(p, "aim", "none") != "none":
        why = (f"an aimed attacker (aim={p.aim}) is drawn whole" if name in STREAMED_WORKLOADS
               else "its generator draws the whole trace at once")
        raise ValueError(f"workload {name!r} cannot be streamed: {why}; streamed generation: "
                         f"{', '.join(STREAMED_WORKLOADS)} (aim=none), or a trace file")
    meta, _ = fresh_prefix_windows(name, p)
    tenants = meta["tenants"]
    return TraceStream(p.seed, p.vocab_size, meta, tenants["groups"], tenants["contracts"],
                       lambda: fresh_prefix_windows(name, p)[1], source=f"<{name}>")
