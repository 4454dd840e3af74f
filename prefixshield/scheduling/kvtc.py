"""``kvtc``: a KV memory-time fair scheduler -- VTC's counter, charged also for the KV
block-seconds a tenant holds.

VTC (Sheng et al., "Fairness in Serving Large Language Models", OSDI 2024) counts the tokens a
tenant is *served*. A tenant whose requests decode long outputs over long prompts costs the
engine mostly memory-time: its running requests hold much of the KV pool while they decode, and
no token counter sees it (the long-output pinning attack: VTC lets it through). KVTC charges
what a tenant *holds*, as PrefixShield's debt charges the cache blocks a tenant creates and
holds -- and, like PrefixShield, acts only under contention: an idle tenant's share is
borrowable.

* **Counter.** Each group ``g`` has ``c_g = w_in * P_g + w_out * O_g + w_kv * K_g + lift_g``:
  ``P_g`` prompt tokens of its requests (charged at first admission, recomputation after a
  preemption not charged again, as in VTC), ``O_g`` output tokens (charged as emitted), ``K_g``
  the KV block-seconds its running requests held (block-table entries, cached or not, times the
  simulated seconds of each step and decode jump they ran through -- a recomputation's blocks
  included: they are held). ``w_in``, ``w_out`` are VTC's weights
  (`vtc_input_weight`, default 1 and 2, the
  paper's) and ``w_kv`` is `kvtc_kv_weight`.
* **Default ``w_kv``: memory priced at capacity.** ``w_kv = T / (N - 1)`` counter units per
  block-second, ``T`` the prompt tokens per second a full-budget prefill step computes (the
  cost model's ``max_num_batched_tokens / step_time``) and ``N - 1`` the usable blocks: holding
  the whole pool for one second costs what the engine's full compute for one second would serve
  at prompt weight 1. Each resource is priced by its capacity, as Dominant Resource Fairness
  normalizes resources (Ghodsi et al., NSDI 2011); no attack or workload was consulted. With the
  ``l4-qwen2.5-1.5b`` profile and 512 blocks it is ~38 per block-second.
* **Counter lift, order** (VTC's): a request arriving for a group with nothing waiting lifts the
  group's counter to the least counter of the waiting groups (or that of the group admitted
  last), so idling earns no credit; the next request tried is the oldest of the waiting group
  with the least counter. As in vLLM a request that is tried and does not fit stops admission
  for the step. It is work-conserving: nothing is held back while capacity is free.
* **Preemption victim** (when a running request's blocks do not fit; vLLM's recompute: the
  victim's blocks are freed and stay cached, it waits again at its group's head): the most
  recently admitted running request of the running group with the *largest* counter. Counters
  are lifted to a common level when a group becomes backlogged, so the largest counter is the
  group furthest above its fair share since; under memory pressure the block-seconds term is
  what separates the groups.

Counters charge simulated seconds only (no wall clock), as the engine's step and jump durations;
block-seconds of a jump are its blocks times its seconds, as the steps it stands for would give
up to rounding.
"""

from __future__ import annotations

import numpy as np

from prefixshield.scheduling.registry import register_scheduler
from prefixshield.scheduling.vtc import VTCScheduler


def capacity_price(usable_blocks: int, prompt_tokens_per_s: float) -> float:
    """The default ``w_kv``: counter units per block-second such that the whole pool
    (``usable_blocks``) held for one second costs ``prompt_tokens_per_s`` (the prompt tokens a
    full-budget prefill step computes per second) at prompt weight 1."""
    if not usable_blocks >= 1 or not (np.isfinite(prompt_tokens_per_s)
                                      and prompt_tokens_per_s > 0):
        raise ValueError(f"kvtc capacity price needs usable blocks >= 1 and a positive prompt "
                         f"token rate, got {usable_blocks} and {prompt_tokens_per_s}")
    return float(prompt_tokens_per_s) / float(usable_blocks)


@register_scheduler
class KVTCScheduler(VTCScheduler):
    """VTC over tokens served and KV block-seconds held: the least-charged waiting group first,
    the most-charged running group preempted first."""

    name = "kvtc"
    counts_block_seconds = True

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.block_s = np.zeros(len(self.groups), dtype=np.float64)
        w = self.config.kvtc_kv_weight
        self.kv_weight: float | None = None if w is None else float(w)

    @property
    def wants_capacity(self) -> bool:
        """Whether the KV weight is the capacity price (not given)."""
        return self.config.kvtc_kv_weight is None

    def bind_capacity(self, usable_blocks: int, prompt_tokens_per_s: float) -> None:
        if self.config.kvtc_kv_weight is None:
            self.kv_weight = capacity_price(usable_blocks, prompt_tokens_per_s)

    def _weight(self) -> float:
        if self.kv_weight is None:
            raise RuntimeError("kvtc's KV weight is the engine's capacity price: "
                               "bind_capacity must be called before the run")
        return self.kv_weight

    def counter(self, g: int) -> float:
        """``c_g``: VTC's counter plus ``w_kv`` times the group's block-seconds."""
        return super().counter(g) + self._weight() * float(self.block_s[g])

    def on_hold(self, held: np.ndarray, seconds: float) -> None:
        if seconds > 0:
            self.block_s += held * seconds

    def stats(self) -> dict:
        return {**super().stats(), "kvtc_kv_weight": self._weight(),
                "kvtc_block_s": {g: float(x) for g, x in zip(self.groups, self.block_s)}}
