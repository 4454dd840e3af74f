"""Typed scheduler configuration: which scheduling policy orders the waiting queue, its
parameters (per-tenant priorities, VTC and KVTC weights) and per-tenant admission limits.

Validated at construction (the edge). Group names are checked against a trace's groups by
`SchedulerConfig.resolve`, before any simulation.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

ALL_GROUPS = "*"
"""The group name of a limit that applies to every group without one of its own."""

LIMIT_KEYS = ("max_running", "max_blocks", "max_output_tokens")
"""Per-tenant admission limits: running requests, block-table entries of running requests
(blocks), output tokens per request (tokens)."""

MAX_LIMIT = 2**40
"""Largest limit value accepted (beyond any pool or trace this tool can hold)."""


@dataclass(frozen=True)
class TenantLimits:
    """Admission limits of one group (None: no limit).

    Attributes:
        max_running: most running requests of the group at once.
        max_blocks: most block-table entries (blocks) held by the group's running requests; a
            waiting request is admitted only if its group's running requests hold at most
            ``max_blocks`` minus the blocks of its own known tokens (prompt and output so far).
            Checked at admission, as a gateway's limit is: a running request's decode blocks
            may take the group past it.
        max_output_tokens: output tokens of any one request are cut to this (a gateway's
            ``max_tokens`` cap).
    """

    max_running: int | None = None
    max_blocks: int | None = None
    max_output_tokens: int | None = None

    def __post_init__(self) -> None:
        for key in LIMIT_KEYS:
            v = getattr(self, key)
            if v is None:
                continue
            if not isinstance(v, int) or isinstance(v, bool):
                raise ValueError(f"limit {key} must be an integer, got {v!r}")
            if not 1 <= v <= MAX_LIMIT:
                raise ValueError(f"limit {key} must be between 1 and {MAX_LIMIT}, got {v}")

    def merged(self, other: "TenantLimits") -> "TenantLimits":
        """These limits with ``other``'s set values taking precedence."""
        return TenantLimits(**{k: (getattr(other, k) if getattr(other, k) is not None
                                   else getattr(self, k)) for k in LIMIT_KEYS})

    @property
    def any(self) -> bool:
        """Whether any limit is set."""
        return any(getattr(self, k) is not None for k in LIMIT_KEYS)


@dataclass(frozen=True)
class SchedulerConfig:
    """The engine's scheduling policy and per-tenant limits.

    Attributes:
        name: a registered scheduler (`prefixshield.scheduling.SCHEDULERS`): ``fcfs``
            (vLLM's default), ``priority`` (vLLM's ``priority`` policy), ``vtc`` (the Virtual
            Token Counter), ``kvtc`` (the KV memory-time counter).
        priorities: ``(group, priority)`` pairs for ``priority``; lower is served first, as in
            vLLM; a group not named has priority 0.
        vtc_input_weight, vtc_output_weight: VTC's (and KVTC's) weights of a prompt token and
            an output token (the paper's defaults: 1 and 2).
        kvtc_kv_weight: KVTC's weight of one KV block-second held (counter units per
            block-second); None prices it at the engine's capacity (see
            `prefixshield.scheduling.kvtc`). Read by ``kvtc`` only.
        limits: ``(group, TenantLimits)`` pairs; group `ALL_GROUPS` applies to every
            group, a named group's own values override it.
    """

    name: str = "fcfs"
    priorities: tuple[tuple[str, int], ...] = ()
    vtc_input_weight: float = 1.0
    vtc_output_weight: float = 2.0
    kvtc_kv_weight: float | None = None
    limits: tuple[tuple[str, TenantLimits], ...] = field(default=())

    def __post_init__(self) -> None:
        from prefixshield.scheduling.registry import SCHEDULERS

        if self.name not in SCHEDULERS:
            raise ValueError(f"unknown scheduler {self.name!r}; known: "
                             f"{', '.join(SCHEDULERS)}")
        seen = set()
        for item in self.priorities:
            if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)):
                raise ValueError(f"priorities must be (group, int) pairs, got {item!r}")
            group, prio = item
            if not isinstance(prio, int) or isinstance(prio, bool) or abs(prio) > 2**31:
                raise ValueError(f"priority of group {group!r} must be an integer in "
                                 f"[-2^31, 2^31], got {prio!r}")
            if group in seen:
                raise ValueError(f"priority of group {group!r} given twice")
            seen.add(group)
        if self.priorities and self.name != "priority":
            raise ValueError(f"priorities are read by the priority scheduler only, not by "
                             f"{self.name!r}")
        for name in ("vtc_input_weight", "vtc_output_weight"):
            w = getattr(self, name)
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) \
                    or w < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {w!r}")
        w = self.kvtc_kv_weight
        if w is not None:
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) \
                    or w < 0:
                raise ValueError(f"kvtc_kv_weight must be a finite number >= 0, got {w!r}")
            if self.name != "kvtc":
                raise ValueError(f"kvtc_kv_weight is read by the kvtc scheduler only, not by "
                                 f"{self.name!r}")
        if self.vtc_input_weight == 0 and self.vtc_output_weight == 0:
            if self.name != "kvtc":
                raise ValueError("vtc_input_weight and vtc_output_weight cannot both be 0")
            if w == 0:
                raise ValueError("kvtc weights charge nothing: vtc_input_weight, "
                                 "vtc_output_weight and kvtc_kv_weight are all 0")
        seen = set()
        for item in self.limits:
            if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
                    and isinstance(item[1], TenantLimits)):
                raise ValueError(f"limits must be (group, TenantLimits) pairs, got {item!r}")
            if item[0] in seen:
                raise ValueError(f"limits of group {item[0]!r} given twice")
            seen.add(item[0])

    @property
    def is_default(self) -> bool:
        """Whether this is vLLM's default scheduling: FCFS without limits."""
        return self == SchedulerConfig()

    def resolve(self, groups: list[str]) -> tuple[list[int], list[TenantLimits]]:
        """Per group (in ``groups`` order): its priority and its limits. A priority or limit
        naming a group that is not one of ``groups`` raises ``ValueError``."""
        known = set(groups)
        for group, _ in self.priorities:
            if group not in known:
                raise ValueError(f"priority for group {group!r}, which the trace does not have; "
                                 f"its groups: {', '.join(groups)}")
        for group, _ in self.limits:
            if group != ALL_GROUPS and group not in known:
                raise ValueError(f"limit for group {group!r}, which the trace does not have; "
                                 f"its groups: {', '.join(groups)} (or {ALL_GROUPS} for all)")
        prio = dict(self.priorities)
        lim = dict(self.limits)
        base = lim.get(ALL_GROUPS, TenantLimits())
        return ([prio.get(g, 0) for g in groups],
                [base.merged(lim[g]) if g in lim else base for g in groups])

    def to_dict(self) -> dict:
        """Plain dict for writing next to results."""
        d = asdict(self)
        if d["kvtc_kv_weight"] is None:
            del d["kvtc_kv_weight"]  # the capacity price: a config written before kvtc reads so
        d["priorities"] = {g: p for g, p in self.priorities}
        d["limits"] = {g: {k: v for k, v in asdict(lim).items() if v is not None}
                       for g, lim in self.limits}
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "SchedulerConfig":
        """The inverse of `to_dict` (unknown keys raise ``ValueError``)."""
        if not isinstance(d, dict):
            raise ValueError(f"scheduler must be a table, got {d!r}")
        unknown = set(d) - {"name", "priorities", "vtc_input_weight", "vtc_output_weight",
                            "kvtc_kv_weight", "limits"}
        if unknown:
            raise ValueError(f"unknown scheduler field(s): {', '.join(sorted(unknown))}")
        kw = dict(d)
        if "priorities" in kw:
            if not isinstance(kw["priorities"], dict):
                raise ValueError(f"scheduler priorities must be a table group -> int, got "
                                 f"{kw['priorities']!r}")
            kw["priorities"] = tuple(kw["priorities"].items())
        if "limits" in kw:
            if not isinstance(kw["limits"], dict):
                raise ValueError(f"scheduler limits must be a table group -> limits, got "
                                 f"{kw['limits']!r}")
            pairs = []
            for g, lim in kw["limits"].items():
                if not isinstance(lim, dict) or set(lim) - set(LIMIT_KEYS):
                    raise ValueError(f"limits of group {g!r} must be a table of "
                                     f"{', '.join(LIMIT_KEYS)}, got {lim!r}")
                pairs.append((g, TenantLimits(**lim)))
            kw["limits"] = tuple(pairs)
        return cls(**kw)


def parse_limit(text: str) -> tuple[str, str, int]:
    """``[GROUP:]KEY=N`` (a ``--tenant-limit`` item) -> ``(group, key, n)``; group
    `ALL_GROUPS` when none is given. ``ValueError`` names what is wrong."""
    head, sep, value = text.partition("=")
    if not sep:
        raise ValueError(f"expected [GROUP:]KEY=N, got {text!r}")
    group, colon, key = head.rpartition(":")
    group = group.strip() if colon else ALL_GROUPS
    key = key.strip()
    if key not in LIMIT_KEYS:
        raise ValueError(f"unknown limit {key!r} in {text!r}; known: {', '.join(LIMIT_KEYS)}")
    if colon and not group:
        raise ValueError(f"empty group name in {text!r}")
    try:
        n = int(value.strip())
    except ValueError:
        raise ValueError(f"limit {key} must be an integer, got {value.strip()!r}") from None
    TenantLimits(**{key: n})  # range check
    return group, key, n


def limits_from_items(items: list[tuple[str, str, int]]) -> tuple[tuple[str, TenantLimits], ...]:
    """``(group, key, n)`` items (e.g. from `parse_limit`) -> ``limits`` pairs; the same
    group and key twice raises ``ValueError``."""
    by_group: dict[str, dict[str, int]] = {}
    for group, key, n in items:
        d = by_group.setdefault(group, {})
        if key in d:
            raise ValueError(f"limit {key} of {group} given twice")
        d[key] = n
    return tuple((g, TenantLimits(**d)) for g, d in by_group.items())


def parse_priority(text: str) -> tuple[str, int]:
    """``GROUP=N`` (a ``--priority`` item) -> ``(group, n)``."""
    group, sep, value = text.rpartition("=")
    if not sep or not group.strip():
        raise ValueError(f"expected GROUP=N, got {text!r}")
    try:
        return group.strip(), int(value.strip())
    except ValueError:
        raise ValueError(f"priority of {group.strip()!r} must be an integer, got "
                         f"{value.strip()!r}") from None


def capped_outputs(limits: list[TenantLimits], group_id: np.ndarray,
                   output_tokens: np.ndarray) -> np.ndarray:
    """Each request's output tokens cut to its group's ``max_output_tokens`` (a copy)."""
    caps = np.array([lim.max_output_tokens or 0 for lim in limits], dtype=np.int64)
    if not caps.any():
        return output_tokens.copy()
    cap = caps[group_id]
    return np.where(cap > 0, np.minimum(output_tokens, cap), output_tokens)


def over_block_limit(limits: list[TenantLimits], group_id: np.ndarray,
                     total_tokens: np.ndarray, block_size: int) -> tuple[int, int, int] | None:
    """The first request that its group's ``max_blocks`` could hold back for ever: one whose
    prompt and output (``total_tokens``, after `capped_outputs`) need more blocks than the
    limit -- a request preempted late comes back with its output so far. Returns ``(row,
    blocks needed, limit)`` or None."""
    caps = np.array([lim.max_blocks or 0 for lim in limits], dtype=np.int64)
    if not caps.any():
        return None
    cap = caps[group_id]
    need = -(-total_tokens // block_size)
    over = np.flatnonzero((cap > 0) & (need > cap))
    if not over.size:
        return None
    i = int(over[0])
    return i, int(need[i]), int(cap[i])
