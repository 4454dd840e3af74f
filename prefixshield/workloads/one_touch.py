"""``one_touch``: one-touch flooding; the attacker sends never-seen prefixes.

Aiming through a fleet's router (``aim``), and the attacker each aim assumes:

* ``session``: the attacker knows the ``session`` router's ring (the endpoint list and the
  hash: a client of the vLLM production stack's router can learn both) and the victim's hot
  prefix ids (e.g. by timing probes), and picks the session ids the ring sends to the
  victim's replicas.
* ``prefix``: the attacker knows the victim's leading tokens -- a public or leaked system
  prompt, a shared template, or text recovered by timing probes of the cache -- and starts
  every prompt with ``lead_blocks`` blocks of one of the victim's hot prefixes (dealt over
  them in turn), then its own fresh prefix and suffix, unchanged. A router that matches
  prompt content (``prefix_affinity``, as Ray's and SGLang's trees do) sends it where the
  victim's prefix went. The engine salts blocks by tenant (vLLM's ``cache_salt``), so the
  lead is the attacker's own copy: its first request with a lead misses and caches it under
  the attacker's salt, later ones hit that copy; it never touches or refreshes the victim's
  blocks. A router that reads the engines' caches (``kv_aware``) therefore sees no victim
  block in the attacker's prompt: the lead pulls it towards the attacker's own copies.
  The default lead is the fewest blocks with which every attacker prompt reaches the
  ``prefix_affinity`` router's default match ratio (Ray's 10% of the prompt's blocks): 11
  blocks at one_touch's defaults (a 97-block prompt after the lead).

Either way the trace stays a pure function of the parameters (no engine is consulted) and
only the attacker's prompts (``prefix``) or ids (``session``) differ from the unaimed trace.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from prefixshield.traces.schema import Trace
from prefixshield.traces.segments import SegmentKind, segment_ids
from prefixshield.workloads.attack import (GI_VICTIM, Aim, AttackParams, fresh_prefix_attack,
                                           population_defaults)
from prefixshield.workloads.base import check
from prefixshield.workloads.registry import register

AIMS = ("none", "session", "prefix")
"""How the attacker steers the router: ``none`` (its ordinals as prefix ids, its own prompts:
the router spreads it as it spreads anyone), ``session`` (prefix ids that the ``session``
router, keyed by prefix, sends to the replicas serving the victim's hot prefixes) or
``prefix`` (its prompts start with the victim's leading blocks)."""

PREFIX_AIM_MATCH_RATIO = 0.1
"""The match ratio the default lead is sized for: Ray's ``PrefixCacheAffinityRouter``
default, which is `RouterConfig`'s too (tested)."""

MAX_AIM_REPLICAS = 1024
"""Largest fleet an aim may assume (the fleet's own limit)."""

DEFAULT_AIM_REPLICAS = 8
"""``aim_replicas``' default: the only value taken with an aim other than ``session``."""


PRESSURE_SWEEP_DURATION_S = 40.0
"""The creation-pressure sweep's window (seconds; the reference's Fig. 2 sweep is a one-touch
sweep): fitted, under the ``background`` population, to the attacker's mean debt the reference
measured at ratios 2.14 and 4.23 (docs/fidelity.md, ``docs/fit_workloads.py``)."""

PRESSURE_SWEEP = ((0.5, 0.5177), (1.0, 0.9185), (2.0, 2.0712), (4.0, 4.0935))
"""(nominal point, designed ``pressure_ratio``) of the sweep: the designed pressure whose
measured ratio over `PRESSURE_SWEEP_DURATION_S` under LRU is the reference's measured
0.54 / 1.02 / 2.14 / 4.23."""


@dataclass(frozen=True)
class OneTouchParams(AttackParams):
    """``one_touch``: every default as in `AttackParams`;
    the attacker rate is the reference's ``min(0.75 C_prefill, 1.15 base_rate)`` unless
    ``pressure_ratio`` or ``attacker_rate`` is given.

    Attributes:
        duration_s: the measured phase, which the attack covers whole (the attack window;
            None: the population's). Fitted (the reference does not state it) to its capacity
            sweep, where the window is the same at every capacity and the 4,096-block run
            materializes 5.64 full-cache turnovers: 20 s under ``background`` (5.65 here over
            10 seeds at the 512-block C_prefill; the 512-block LRU P95 TTFT is then 1,653 ms
            against the reference's 1,440), 17 s under ``two_group`` (5.72; P95 3,896 ms:
            docs/fidelity.md).
        aim: one of `AIMS`. ``session`` models an attacker that knows the fleet's
            ``session`` ring (the endpoint list and the hash, as a client of the production
            stack's router can learn them) and which replicas serve the victim (the victim's
            hot prefix ids, e.g. learned by timing probes: a strong attacker). Its requests
            then cycle over those replicas. Routers that do not hash the prefix id do not
            read the choice: under them an aimed attacker is an unaimed one.
        aim_replicas: the fleet size the ``session`` aim assumes (1..1024; other aims take
            only the default, 8).
        aim_blocks: ``prefix``: the victim's leading blocks before each attacker prompt
            (1..the victim's prefix blocks; None: the fewest with which every attacker prompt
            reaches `PREFIX_AIM_MATCH_RATIO`, see `lead_blocks`).
    """

    POPULATION_DEFAULTS = population_defaults(
        AttackParams.POPULATION_DEFAULTS,
        background={"duration_s": 20.0}, two_group={"duration_s": 17.0})

    duration_s: float | None = None
    aim: str = "none"
    aim_replicas: int = DEFAULT_AIM_REPLICAS
    aim_blocks: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check_aim(self)

    def lead_blocks(self) -> int:
        """``aim=prefix``'s lead in blocks: ``aim_blocks``, else `fewest_lead_blocks`
        for one_touch's attacker prompt (``prefix_tokens`` + the longest suffix)."""
        return lead_blocks_for(self, self.prefix_tokens)


def fewest_lead_blocks(after: int, ratio: float = PREFIX_AIM_MATCH_RATIO) -> int:
    """The fewest lead blocks ``L`` with ``L >= ratio x (L + after)``: ``prefix_affinity``'s
    own test for a prompt whose lookup has ``after`` blocks after the lead, so a lead that
    matches wins the affinity tier."""
    lead = 1
    while lead < ratio * (lead + after):
        lead += 1
    return lead


def lead_blocks_for(p, attacker_prefix_tokens: int) -> int:
    """``p.aim_blocks``, else `fewest_lead_blocks` for the longest attacker prompt of
    ``p`` (its ``attacker_prefix_tokens``-token prefix and longest suffix), in blocks."""
    if p.aim_blocks is not None:
        return p.aim_blocks
    return fewest_lead_blocks((attacker_prefix_tokens + p.suffix_tokens[1] - 1)
                              // p.block_size)


def check_aim(p) -> None:
    """Validate the aim fields of ``p`` (``aim``, ``aim_replicas``, ``aim_blocks``; any attack
    params with them and a ``lead_blocks()``); raises ValueError naming the field. A field the
    aim does not read is refused: ``aim_blocks`` unless ``aim=prefix``, ``aim_replicas`` other
    than its default `DEFAULT_AIM_REPLICAS` unless ``aim=session`` (the default is what
    every trace's meta records). ``aim=prefix`` needs a victim prefix of one block or more."""
    check(p.aim in AIMS, f"aim must be one of {', '.join(AIMS)}, got {p.aim!r}")
    check(1 <= p.aim_replicas <= MAX_AIM_REPLICAS,
          f"aim_replicas must be in [1, {MAX_AIM_REPLICAS}], got {p.aim_replicas}")
    check(p.aim_replicas == DEFAULT_AIM_REPLICAS or p.aim == "session",
          f"aim_replicas is read by aim=session only (aim is {p.aim!r})")
    check(p.aim_blocks is None or p.aim == "prefix",
          f"aim_blocks is read by aim=prefix only (aim is {p.aim!r})")
    if p.aim != "prefix":
        return
    check(p.prefix_blocks >= 1,
          f"aim=prefix: the victim's {p.prefix_tokens}-token prefix is shorter than one "
          f"{p.block_size}-token block, so it has no leading block to copy; set prefix_tokens "
          f">= {p.block_size}")
    check(p.aim_blocks is None or 1 <= p.aim_blocks <= p.prefix_blocks,
          f"aim_blocks must be in [1, {p.prefix_blocks}] (the victim's prefix blocks), "
          f"got {p.aim_blocks}")
    check(p.lead_blocks() <= p.prefix_blocks,
          f"aim=prefix: a {PREFIX_AIM_MATCH_RATIO:.0%} match needs {p.lead_blocks()} "
          f"leading blocks, more than the victim's {p.prefix_blocks}-block prefix; set "
          f"aim_blocks")


def session_aim(p, n: int) -> Aim:
    """``n`` distinct attacker prefix ids that the ``session`` router (key ``prefix``) over
    ``p.aim_replicas`` replicas sends to the replicas of the victim's hot prefixes, request k
    to the (k mod T)-th of those T replicas (ascending), with the meta recording the aim.

    The ids are the smallest that do it (a scan upward from 0), so the trace is a pure
    function of the parameters: no engine or run is consulted. ``p``: attack params with the
    aim fields (one_touch's or searched_attack's)."""
    from prefixshield.fleet.routers.session import replica_of, ring, routing_key

    points, owners = ring(p.aim_replicas)
    targets = sorted({replica_of(points, owners, routing_key(p.victim_group, h))
                      for h in range(p.hot_prefixes)})
    pools: dict[int, list[int]] = {r: [] for r in targets}
    need = {r: len(range(i, n, len(targets))) for i, r in enumerate(targets)}
    c = 0
    while any(len(pools[r]) < need[r] for r in targets):
        r = replica_of(points, owners, routing_key(p.attacker_group, c))
        if r in pools and len(pools[r]) < need[r]:
            pools[r].append(c)
        c += 1
    taken = {r: iter(v) for r, v in pools.items()}
    ids = np.array([next(taken[targets[k % len(targets)]]) for k in range(n)], dtype=np.int64)
    return Aim(ids=ids, meta={"aim": "session", "aim_replicas": p.aim_replicas,
                              "aim_targets": targets})


def prefix_aim(p, n: int) -> Aim:
    """The lead of ``n`` attacker requests: request k starts with the first
    `lead_blocks` blocks of the victim's hot prefix ``k mod H`` (its
    prefix segment, so the tokens equal the victim's), dealt over the hot set in turn.
    ``p``: attack params with the aim fields and a ``lead_blocks()``."""
    lead = p.lead_blocks()
    hot = np.arange(n, dtype=np.int64) % p.hot_prefixes
    return Aim(lead_segments=segment_ids(GI_VICTIM, SegmentKind.PREFIX, hot),
               lead_tokens=lead * p.block_size,
               meta={"aim": "prefix", "aim_lead_blocks": lead})


@register("one_touch", OneTouchParams)
def one_touch(params: OneTouchParams | None = None) -> Trace:
    """One-touch flooding: the attacker sends never-seen prefixes during the pressure window.

    Victim: warm-up (each of the ``hot_prefixes`` prefixes once, unmeasured), then Poisson
    requests at ``base_rate`` cycling over the hot prefixes (prefix_id = hot prefix index), each
    prefix plus a unique suffix. Attacker (``attacker_contract``, role ``attacker``): one request
    every ``1 / rate`` seconds through the window, each with its own fresh prefix (prefix_id =
    its ordinal, or chosen to steer the ``session`` router with ``aim="session"``) and suffix,
    after the victim's leading blocks with ``aim="prefix"`` (see the module docstring).
    """
    p = params or OneTouchParams()
    aims = {"none": None, "session": lambda n: session_aim(p, n),
            "prefix": lambda n: prefix_aim(p, n)}
    return fresh_prefix_attack("one_touch", p, aim=aims[p.aim])
