"""The fleet's settings: how many replicas and which router."""

from __future__ import annotations

from dataclasses import dataclass, field

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
        replicas: engines behind the router (1..:data:`MAX_REPLICAS`), each with the run's
            engine settings, its own pool, policy and scheduler.
        router: the router and its options.
        mode: one of :data:`MODES`.
    """

    replicas: int = 1
    router: RouterConfig = field(default_factory=RouterConfig)
    mode: str = "auto"

    def __post_init__(self) -> None:
        if not 1 <= self.replicas <= MAX_REPLICAS:
            raise ValueError(f"replicas must be in [1, {MAX_REPLICAS}], got {self.replicas}")
        if self.mode not in MODES:
            raise ValueError(f"fleet mode must be one of {', '.join(MODES)}, got {self.mode!r}")
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

    def resolved_mode(self) -> str:
        """``split`` or ``lockstep``; ``split`` for a state-reading router raises."""
        if self.mode == "auto":
            return "lockstep" if self.reads_state() else "split"
        if self.mode == "split" and self.reads_state():
            raise ValueError(f"router {self.router.name} reads replica state: it runs in "
                             "lockstep mode only")
        return self.mode
