"""Scheduling policies of the simulated engine: which waiting request is admitted next, which
running request is preempted, and per-tenant admission limits.

``fcfs`` (vLLM's default), ``priority`` (vLLM's ``priority`` policy), ``vtc`` (the Virtual
Token Counter) and ``kvtc`` (VTC charged also for KV block-seconds held) are registered in
`SCHEDULERS`; `SchedulerConfig` chooses one per run, with `TenantLimits`
per group.
"""

from prefixshield.scheduling.config import (ALL_GROUPS, LIMIT_KEYS, SchedulerConfig,
                                            TenantLimits, limits_from_items, parse_limit,
                                            parse_priority)
from prefixshield.scheduling.registry import SCHEDULERS, make_scheduler, register_scheduler

__all__ = ["ALL_GROUPS", "LIMIT_KEYS", "SCHEDULERS", "SchedulerConfig", "TenantLimits",
           "limits_from_items", "make_scheduler", "parse_limit", "parse_priority",
           "register_scheduler"]
