"""Tenancy: service contracts, the creation entitlement ``(rho blocks/s, beta blocks)`` of a
group's tier.

A tenant (a *group*: its blocks are never shared with another group) is served under a contract:
a token bucket that refills at ``rho_blocks_per_s`` up to ``beta_blocks``. Traces name a contract
per request (column ``contract``); the policies that meter creation (PrefixShield) look the name
up here unless they are configured with custom contracts. This module sits at the bottom of the
package: traces, workloads, policies, the simulator and the vLLM plugin all import it, and it
imports none of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping


@dataclass(frozen=True)
class Contract:
    """A service tier's creation entitlement.

    Attributes:
        name: contract name as it appears in a trace's ``contract`` column.
        rho_blocks_per_s: refill rate of the creation bucket, in full KV blocks per second (> 0).
        beta_blocks: bucket capacity (burst allowance), in full KV blocks (>= 0).
    """

    name: str
    rho_blocks_per_s: float
    beta_blocks: float

    def __post_init__(self) -> None:
        if not self.rho_blocks_per_s > 0:
            raise ValueError(f"contract {self.name!r}: rho_blocks_per_s must be > 0, "
                             f"got {self.rho_blocks_per_s}")
        if not self.beta_blocks >= 0:
            raise ValueError(f"contract {self.name!r}: beta_blocks must be >= 0, "
                             f"got {self.beta_blocks}")


DEFAULT_CONTRACTS: Mapping[str, Contract] = MappingProxyType({
    "critical": Contract("critical", 64.0, 256.0),
    "standard": Contract("standard", 40.0, 192.0),
    "best_effort": Contract("best_effort", 16.0, 128.0),
})
"""The default tiers (read-only): critical (64 blocks/s, 256 blocks), standard
(40, 192), best_effort (16, 128)."""
