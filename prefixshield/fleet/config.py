"""The fleet's settings: how many replicas and which router."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from prefixshield.fleet.ledger import LEDGERS, MAX_STALENESS_S

from prefixshield.fleet.routers.base import ROUTERS, RouterConfig

MAX_REPLICAS = 1024
"""Most replicas a fleet may have (each is a whole engine with its own pool)."""

MODES = ("auto", "split", "lockstep")
"""How replicas run: ``split`` (the trace split ahead, replicas independent: routers that read
no state only), ``lockstep`` (one loop, every replica advanced to each arrival), ``auto``
(split when the router allows it)."""


@dataclass(frozen=True)
class FleetConfig:
    """Attributes:
        replicas: engines behind the router (1..`MAX_REPLICAS`), each with the run's
            engine settings, its own pool, policy and scheduler.
        router: the router and its options.
        mode: one of `MODES`.
        ledger: where PrefixShield's buckets live (`LEDGERS`):
            ``replica`` (each pool its own, the default), ``fleet`` (one bucket per
            group and contract across the fleet; needs lockstep mode). Other policies have no
            ledger (StaticQuota's quota stays per replica).
        ledger_staleness_s: with ``ledger="fleet"``, seconds after which a charge made on one
            replica reaches the others' copies of the buckets (0: at once).
    """

    replicas: int = 1
    router: RouterConfig = field(default_factory=RouterConfig)
    mode: str = "auto"
    ledger: str = "replica"
    ledger_staleness_s: float = 0.0

    def __post_init__(self) -> None:
        if not 1 <= self.replicas <= MAX_REPLICAS:
            raise ValueError(f"replicas must be in [1, {MAX_REPLICAS}], got {self.replicas}")
        if self.mode not in MODES:
            raise ValueError(f"fleet mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.ledger not in LEDGERS:
            raise ValueError(f"ledger must be one of {', '.join(LEDGERS)}, got {self.ledger!r}")
        if not (math.isfinite(self.ledger_staleness_s)
                and 0.0 <= self.ledger_staleness_s <= MAX_STALENESS_S):
            raise ValueError(f"ledger staleness must be in [0, {MAX_STALENESS_S:g}] s, got "
                             f"{self.ledger_staleness_s}")
        if self.ledger_staleness_s > 0 and self.ledger != "fleet":
            raise ValueError("a ledger staleness needs the fleet ledger")
        r = self.router
        if r.name not in ROUTERS:
            raise ValueError(f"unknown router {r.name!r}; known: {', '.join(sorted(ROUTERS))}")
        if not 0 <= r.imbalance <= 1_000_000:
            raise ValueError(f"router imbalance must be in [0, 1000000], got {r.imbalance}")
        if not 0.0 <= r.match_ratio <= 1.0:
            raise ValueError(f"router match ratio must be in [0, 1], got {r.match_ratio}")
        if r.session_key not in ("prefix", "group"):
            raise ValueError(f"router session key must be prefix or group, got "
                             f"{r.session_key!r}")

    def reads_state(self) -> bool:
        """Whether the router reads replica state (then only lockstep can run it)."""
        return ROUTERS[self.router.name].reads_state

    def resolved_mode(self, shares_ledger: bool | None = None) -> str:
        """``split`` or ``lockstep``; ``split`` for a state-reading router or a shared ledger
        raises. ``shares_ledger``: whether the policy run shares its ledger (a PrefixShield
        under ``ledger="fleet"``); None: whether ``ledger`` is ``fleet`` (any policy might)."""
        shared = self.ledger == "fleet" if shares_ledger is None else shares_ledger
        if self.mode == "auto":
            return "lockstep" if self.reads_state() or shared else "split"
        if self.mode == "split" and self.reads_state():
            raise ValueError(f"router {self.router.name} reads replica state: it runs in "
                             "lockstep mode only")
        if self.mode == "split" and shared:
            raise ValueError("a fleet ledger couples the replicas between arrivals: it runs in "
                             "lockstep mode only")
        return self.mode
