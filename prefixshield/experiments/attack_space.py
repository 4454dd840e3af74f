"""The attack space ``prefixshield attack-search`` explores: typed, bounded coordinates of the
``searched_attack`` workload (`prefixshield.workloads.searched_attack`).

Each `Dim` names one field of `SearchedAttackParams`
and bounds it; the budget, the victim and the engine are fixed per search
and are not in the space. A dim may have a *mode*: the field may also be None (a distinct
behaviour: no pool, periodic arrivals, data outputs), which the optimizer picks as a categorical
choice before the value.

Bounds, and where they come from (none is chosen for the result it gives):

* ``intensity`` 0.05-1: from a twentieth of the budget (about a refill's worth at the default
  budget, the low-and-slow regime) to all of it.
* ``attacker_prefix_tokens`` 16-3,072: one block to twice the victim's prefix (192 blocks, 38% of
  the 511 usable at 512 blocks), so one request always fits the cache.
* ``rotation_s`` 0.5-300 s (or no pool), ``pool_size`` 1-64: a pool as short-lived as a request
  gap or as long as the run; up to 64 prefixes (6,144 blocks at 96 each, past any cache here).
* ``replay_fraction`` 0-0.9, ``replay_delay`` 0-2 clearance times: ``delayed_replay`` uses
  0, 0.5 and 1 (the reference setup's); 2 covers waiting past it.
* ``alt_contract_fraction`` 0-1: never to always under the second contract.
* ``cycle_s`` 1-120 s, ``duty`` 0.1-1, ``phase`` 0-1: bursts from a second to two minutes; the
  on-time is at least a tenth, so the peak rate is at most 10x the budget.
* ``burst_cv`` 0.25-4 (or periodic): ``bursty_sharegpt`` uses a CV of 4.
* ``attacker_output_tokens`` 1-1,000 (or the data's distribution): the Azure data's range.
* ``victim_sync`` 0-1, ``victim_lag`` -0.5-0.5 victim gaps: anywhere around a victim arrival.

**The routing dimension.** A search against a fleet (``replicas`` and ``router`` in its
base) whose router reads something an attacker chooses adds the aim (`space_for`):
``aim`` none/session under ``session`` keyed by prefix (the ring sends the attacker's chosen
session ids to the victim's replicas), and ``aim`` none/prefix with ``aim_blocks`` 1 to the
victim's prefix blocks (log scale) under ``prefix_affinity`` and ``kv_aware`` (the victim's
leading blocks before every prompt). Routers that read neither ids nor prompts
(``round_robin``, ``random``, ``least_loaded``, ``session`` keyed by group) get no aim: no
choice of the attacker's steers them. ``aim_replicas`` is not searched: the aimed attacker
knows the fleet (it is set to ``replicas``).

To add a coordinate: add a field (with its default and its validation) to
``SearchedAttackParams`` and use it in its generator, then add a `Dim` here; the
optimizer, the stored trials and the tables pick it up from `SPACE`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

MODE_SUFFIX = "__mode"
"""Optimizer parameter name of a dim's mode: ``<field>__mode``."""


@dataclass(frozen=True)
class Dim:
    """One coordinate of the attack space.

    Attributes:
        name: the ``SearchedAttackParams`` field it sets.
        kind: ``float``, ``int`` or ``choice`` (one of ``choices``; ``low``/``high`` unused).
        low, high: inclusive bounds (in the field's unit).
        log: sample on a log scale.
        none_label: when set, the field may also be None; the optimizer first picks
            ``none_label`` (None) or ``"value"``.
        unit: the unit, for tables.
        choices: the values of a ``choice`` dim (at least two).
    """

    name: str
    kind: str
    low: float = 0.0
    high: float = 1.0
    log: bool = False
    none_label: str | None = None
    unit: str = ""
    choices: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in ("float", "int", "choice"):
            raise ValueError(f"dim {self.name}: kind must be float, int or choice, got "
                             f"{self.kind!r}")
        if (self.kind == "choice") != (len(self.choices) >= 2):
            raise ValueError(f"dim {self.name}: a choice dim has two or more choices, no other "
                             f"dim has any, got {self.choices!r}")
        if not self.low < self.high or (self.log and self.low <= 0):
            raise ValueError(f"dim {self.name}: bounds must have low < high (and low > 0 on a "
                             f"log scale), got [{self.low}, {self.high}]")

    def contains(self, v: Any) -> bool:
        """Whether ``v`` is a value of this dim (None only for a dim with a mode)."""
        if v is None:
            return self.none_label is not None
        if self.kind == "choice":
            return v in self.choices
        return self.low <= v <= self.high

    def identity(self) -> list:
        """What a search's identity records of the dim (a choice dim adds its choices)."""
        out = [self.name, self.kind, self.low, self.high, self.log, self.none_label]
        return out + [list(self.choices)] if self.choices else out


SPACE: tuple[Dim, ...] = (
    Dim("intensity", "float", 0.05, 1.0, unit="of budget"),
    Dim("attacker_prefix_tokens", "int", 16, 3072, log=True, unit="tokens"),
    Dim("rotation_s", "float", 0.5, 300.0, log=True, none_label="no pool", unit="s"),
    Dim("pool_size", "int", 1, 64, log=True, unit="prefixes"),
    Dim("replay_fraction", "float", 0.0, 0.9),
    Dim("replay_delay", "float", 0.0, 2.0, unit="clearance times"),
    Dim("alt_contract_fraction", "float", 0.0, 1.0),
    Dim("cycle_s", "float", 1.0, 120.0, log=True, unit="s"),
    Dim("duty", "float", 0.1, 1.0),
    Dim("phase", "float", 0.0, 1.0 - 1e-9),
    Dim("burst_cv", "float", 0.25, 4.0, log=True, none_label="periodic"),
    Dim("attacker_output_tokens", "int", 1, 1000, log=True, none_label="data", unit="tokens"),
    Dim("victim_sync", "float", 0.0, 1.0),
    Dim("victim_lag", "float", -0.5, 0.5, unit="victim gaps"),
)
"""The attack space, in the order the optimizer asks for its coordinates."""

ROUTER_AIMS = {"session": "session", "prefix_affinity": "prefix", "kv_aware": "prefix"}
"""Router -> the ``aim`` that steers it (``session`` only when keyed by prefix)."""


def space_for(base: Mapping[str, Any], prefix_blocks: int) -> tuple[Dim, ...]:
    """The space of a search whose runs have the fixed fields ``base``: `SPACE`, plus
    the aim a fleet's router reads (module doc); ``prefix_blocks`` bounds ``aim_blocks``
    (the victim's prefix, in blocks)."""
    router = base.get("router", "round_robin") if "replicas" in base else None
    aim = ROUTER_AIMS.get(router)
    if aim == "session" and base.get("router_key", "prefix") != "prefix":
        aim = None   # the ring hashes the tenant alone: no id of the attacker's steers it
    if aim is None:
        return SPACE
    dims = [Dim("aim", "choice", choices=("none", aim))]
    if aim == "prefix":
        # a dim needs two values: over a one-block prefix, a 2-block lead fails as a trial
        dims.append(Dim("aim_blocks", "int", 1, max(2, prefix_blocks), log=True,
                        unit="blocks"))
    return (*SPACE, *dims)


def workload_fields(fields: Mapping[str, Any], base: Mapping[str, Any]) -> dict[str, Any]:
    """The ``searched_attack`` fields of a point of the space: ``aim_blocks`` only with
    ``aim=prefix`` (unaimed, it is a coordinate nothing reads), and ``aim_replicas`` the
    fleet's size with ``aim=session`` (the aimed attacker knows the fleet)."""
    out = dict(fields)
    if out.get("aim") != "prefix":
        out.pop("aim_blocks", None)
    if out.get("aim") == "session":
        out["aim_replicas"] = int(base["replicas"])
    return out


def suggest(trial, space: tuple[Dim, ...] = SPACE) -> dict[str, Any]:
    """Ask an optuna ``trial`` for one point: ``{field: value}`` (None for a dim's mode)."""
    out: dict[str, Any] = {}
    for d in space:
        if d.kind == "choice":
            out[d.name] = trial.suggest_categorical(d.name, list(d.choices))
            continue
        if d.none_label is not None:
            mode = trial.suggest_categorical(d.name + MODE_SUFFIX, [d.none_label, "value"])
            if mode == d.none_label:
                out[d.name] = None
                continue
        if d.kind == "int":
            out[d.name] = trial.suggest_int(d.name, int(d.low), int(d.high), log=d.log)
        else:
            out[d.name] = trial.suggest_float(d.name, float(d.low), float(d.high), log=d.log)
    return out


def to_optuna_params(fields: Mapping[str, Any], space: tuple[Dim, ...] = SPACE) -> dict:
    """The optuna parameters that give the point ``fields`` (for ``study.enqueue_trial``).
    Raises ValueError naming a field outside its dim."""
    out: dict[str, Any] = {}
    for d in space:
        v = fields[d.name]
        if not d.contains(v):
            where = list(d.choices) if d.kind == "choice" else f"[{d.low}, {d.high}]"
            raise ValueError(f"{d.name}={v!r} is outside the attack space {where}")
        if d.kind == "choice":
            out[d.name] = v
            continue
        if d.none_label is not None:
            out[d.name + MODE_SUFFIX] = d.none_label if v is None else "value"
        if v is not None:
            out[d.name] = int(v) if d.kind == "int" else float(v)
    return out


def known_points(budget_rate: Mapping[str, float], designed_rate: Mapping[str, float],
                 prefix_tokens: int, space: tuple[Dim, ...] = SPACE,
                 lead_blocks: int = 1) -> dict[str, dict[str, Any]]:
    """The hand-written attacks as points of the space (the search's warm start).

    ``budget_rate[w]`` is the budget in requests/s for workload ``w``'s request shape and
    ``designed_rate[w]`` its own attacker rate; each attack spends ``min(designed, budget)``.
    ``one_touch`` maps exactly (the point reproduces its attacker rows); ``low_and_slow`` is
    one_touch at its lower intensity; ``two_pass_replay`` (K = 1) is approximated by replaying
    half the requests as soon as due (delay 0), since the space draws the replays at random.
    All are unaimed (``aim`` none; ``aim_blocks``, read by nothing then, at ``lead_blocks``,
    the default lead, within the dim) where ``space`` has the routing dimension.
    """
    extra: dict[str, Any] = {}
    for d in space[len(SPACE):]:
        extra[d.name] = "none" if d.kind == "choice" else \
            int(min(max(lead_blocks, d.low), d.high))

    def base(intensity: float) -> dict[str, Any]:
        return {"intensity": min(1.0, max(SPACE[0].low, intensity)),
                "attacker_prefix_tokens": prefix_tokens, "rotation_s": None, "pool_size": 1,
                "replay_fraction": 0.0, "replay_delay": 1.0, "alt_contract_fraction": 0.0,
                "cycle_s": 20.0, "duty": 1.0, "phase": 0.0, "burst_cv": None,
                "attacker_output_tokens": None, "victim_sync": 0.0, "victim_lag": 0.0,
                **extra}

    out = {}
    for w in ("one_touch", "low_and_slow", "two_pass_replay"):
        intensity = spend_rate(designed_rate[w], budget_rate[w]) / budget_rate[w]
        out[w] = base(intensity)
    out["two_pass_replay"].update(replay_fraction=0.5, replay_delay=0.0)
    return out


def spend_rate(designed: float, budget: float) -> float:
    """What a hand-written attack sends under the budget (requests/s): its own rate, or the
    budget when it would exceed it (within 1e-12, so a rate equal to the budget is the
    budget's own float)."""
    return budget if designed >= budget * (1 - 1e-12) else designed


def describe(fields: Mapping[str, Any]) -> str:
    """A one-line human description of a point (what the attacker does)."""
    f = fields
    parts = [f"{100 * f['intensity']:.0f}% of budget",
             f"{f['attacker_prefix_tokens']}-token prefixes"]
    if f["rotation_s"] is None:
        parts.append("every prefix new")
    else:
        parts.append(f"pool of {f['pool_size']} rotated every {f['rotation_s']:.3g} s")
    if f["replay_fraction"] > 0:
        parts.append(f"{100 * f['replay_fraction']:.0f}% replays at "
                     f"{f['replay_delay']:.2f}x clearance")
    if f["alt_contract_fraction"] > 0:
        parts.append(f"{100 * f['alt_contract_fraction']:.0f}% under the alternate contract")
    if f["duty"] < 1:
        parts.append(f"on {100 * f['duty']:.0f}% of {f['cycle_s']:.3g} s cycles")
    parts.append("periodic" if f["burst_cv"] is None else f"gamma CV {f['burst_cv']:.2f}")
    parts.append("data outputs" if f["attacker_output_tokens"] is None
                 else f"{f['attacker_output_tokens']}-token outputs")
    if f["victim_sync"] > 0:
        parts.append(f"{100 * f['victim_sync']:.0f}% synced to victim arrivals "
                     f"({f['victim_lag']:+.2f} gaps)")
    if f.get("aim") == "session":
        parts.append("aimed by session ids at the victim's replicas")
    elif f.get("aim") == "prefix":
        parts.append(f"led by {f['aim_blocks']} of the victim's blocks")
    return ", ".join(parts)
