"""Typed engine configuration, validated at construction (the edge)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from prefixshield.policies.base import COMPAT_MODES
from prefixshield.scheduling.config import SchedulerConfig


@dataclass(frozen=True)
class EngineConfig:
    """Scheduler and cache settings of one simulated vLLM engine.

    Attributes:
        num_blocks: configured KV blocks, null block included (usable = num_blocks - 1).
        block_size: tokens per block.
        max_num_seqs: most running requests at once.
        max_num_batched_tokens: token budget of one step (chunked prefill splits prompts to fit).
        vllm_compat: ``"0.10"`` or ``"current"`` free-queue and admission semantics.
        reserve_full_prompt: check free blocks for the whole prompt when admitting a request, even
            if chunked prefill schedules only part of it; ``None`` follows ``vllm_compat``
            (off for "0.10", on for "current").
        hash_seed: seed of the block hash chain (fixed; never from os.urandom).
        check_invariants: verify the pool's invariants after every step (slow; for debugging).
        scheduler: the scheduling policy and per-tenant limits (default: vLLM's FCFS, no
            limits).
    """

    num_blocks: int = 512
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    vllm_compat: str = "current"
    reserve_full_prompt: bool | None = None
    hash_seed: int = 0
    check_invariants: bool = False
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)

    def __post_init__(self) -> None:
        if isinstance(self.scheduler, dict):
            object.__setattr__(self, "scheduler", SchedulerConfig.from_dict(self.scheduler))
        if not isinstance(self.scheduler, SchedulerConfig):
            raise ValueError(f"scheduler must be a SchedulerConfig, got {self.scheduler!r}")
        for name in ("num_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool):
                raise ValueError(f"{name} must be an integer, got {v!r}")
        if self.num_blocks < 2:
            raise ValueError(f"num_blocks must be >= 2 (block 0 is the null block), got {self.num_blocks}")
        if self.block_size < 1:
            raise ValueError(f"block_size must be a positive integer, got {self.block_size}")
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be >= 1")
        if self.vllm_compat not in COMPAT_MODES:
            raise ValueError(f"vllm_compat must be one of {', '.join(COMPAT_MODES)}, "
                             f"got {self.vllm_compat!r}")

    @property
    def reserves_full_prompt(self) -> bool:
        """Whether admission checks blocks for the full prompt (resolved from ``vllm_compat``)."""
        if self.reserve_full_prompt is None:
            return self.vllm_compat == "current"
        return self.reserve_full_prompt

    def to_dict(self) -> dict:
        """Plain dict for writing next to results. The scheduler appears only when it is not
        vLLM's default (FCFS, no limits): a configuration written before schedulers existed
        describes the same engine, and keys derived from it (stored cells, cached
        measurements) stay valid."""
        d = {k: v for k, v in asdict(self).items() if k != "scheduler"}
        if not self.scheduler.is_default:
            d["scheduler"] = self.scheduler.to_dict()
        return d
