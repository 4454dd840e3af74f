"""``borrowing``: an active tenant whose working set exceeds half the cache, beside an idle one."""

from __future__ import annotations

from dataclasses import dataclass

from prefixshield.tenancy import DEFAULT_CONTRACTS
from prefixshield.traces.rows import RequestRows
from prefixshield.traces.schema import Trace
from prefixshield.workloads.base import STREAM_ACTIVE, PrefixParams, add_cyclic_stream, check
from prefixshield.workloads.registry import params_to_dict, register

GI_ACTIVE = 0


@dataclass(frozen=True)
class BorrowingParams(PrefixParams):
    """``borrowing``: an active group whose working set exceeds half the cache, and an idle one.

    The active group cycles (round-robin) over ``working_set_prefixes`` prefixes of
    ``prefix_tokens`` each (default ``round(0.95 * usable / prefix_blocks)`` = 5 x 96 = 480
    blocks = 94% of 511 > half: the reference's "working set exceeds half the cache"), each with
    a unique suffix, Poisson at ``base_rate``, after a warm-up that sends each prefix once. The
    idle group is configured (``meta["tenants"]``, so a static partition counts it) and sends
    nothing.

    Attributes:
        working_set_fraction: active working set as a fraction of usable blocks. 0.95 (5
            prefixes at 512 blocks) is fitted (the reference states only "more than half") to
            the reference's unrestricted borrower occupying 509-510 of 511 blocks: 5 prefixes
            give a peak of 497.6 blocks under LRU (10 seeds), 4 give 441, 6 exceed the pool;
            the requests' uncached last blocks keep the peak below 509 (docs/fidelity.md).
        working_set_prefixes: explicit number of prefixes (None: derived).
        active_group, idle_group, contract: names in the trace (both groups on ``contract``).
        (prefix, suffix, output and warm-up parameters as in ``PrefixParams``.)
    """

    working_set_fraction: float = 0.95
    working_set_prefixes: int | None = None
    active_group: str = "active"
    idle_group: str = "idle"
    contract: str = "standard"

    def __post_init__(self) -> None:
        super().__post_init__()
        check(0 < self.working_set_fraction, "working_set_fraction must be > 0")
        check(self.working_set_prefixes is None or self.working_set_prefixes >= 1,
              "working_set_prefixes must be >= 1")
        check(self.active_group != self.idle_group, "active_group and idle_group must differ")
        check(self.contract in DEFAULT_CONTRACTS,
              f"contract {self.contract!r} is not in contracts ({', '.join(DEFAULT_CONTRACTS)})")

    @property
    def num_prefixes(self) -> int:
        """Prefixes in the active working set."""
        if self.working_set_prefixes is not None:
            return self.working_set_prefixes
        return max(1, round(self.working_set_fraction * self.usable_blocks
                            / max(1, self.prefix_blocks)))


@register("borrowing", BorrowingParams)
def borrowing(params: BorrowingParams | None = None) -> Trace:
    """Borrowing: an active group cycling a working set above half the cache, one idle group.

    See `BorrowingParams`. The active group has role ``benign``.
    """
    p = params or BorrowingParams()
    rows = RequestRows()
    rows.declare(p.idle_group, p.contract)
    gap = p.warmup_gap(DEFAULT_CONTRACTS[p.contract].rho_blocks_per_s)
    active = add_cyclic_stream(rows, p, stream=STREAM_ACTIVE, group_index=GI_ACTIVE,
                               group=p.active_group, contract=p.contract, role="benign",
                               num_prefixes=p.num_prefixes, warmup_gap=gap)
    meta = {"workload": "borrowing", "params": params_to_dict(p),
            "usable_blocks": p.usable_blocks, "prefix_blocks": p.prefix_blocks,
            "working_set_prefixes": p.num_prefixes,
            "working_set_blocks": p.num_prefixes * p.prefix_blocks, **active}
    return rows.finish(p.seed, p.vocab_size, meta)
