"""Synthetic workloads (DESIGN §7), one module each, registered in :data:`WORKLOADS`.

- :mod:`.base`: ``WorkloadParams`` / ``PrefixParams`` and the building blocks of a trace.
- :mod:`.outputs`: output-length distributions from data (Azure conv, ShareGPT) or a range.
- :mod:`.attack`: the victim-plus-attacker setup and the creation-pressure knob.
- one module per workload: ``one_touch``, ``low_and_slow``, ``two_pass_replay``,
  ``delayed_replay``, ``sharegpt`` (and ``bursty_sharegpt``), ``borrowing``, and
  ``searched_attack`` (the attacker as a parameter space, for ``prefixshield attack-search``),
  ``servegen`` (tenants that are real clients of a production model).

Every params docstring says where each default comes from: the reference setup (DESIGN §7) or
data. ``prefixshield.experiments.single.build_trace`` sizes the load from the workload's own
request shapes (``probe_shapes``) and a profile.
"""

from prefixshield.workloads.attack import AttackParams
from prefixshield.workloads.base import PrefixParams, WorkloadParams
from prefixshield.workloads.borrowing import BorrowingParams, borrowing
from prefixshield.workloads.delayed_replay import (DelayedReplayParams, delayed_replay,
                                                   designed_debt_blocks)
from prefixshield.workloads.low_and_slow import LowAndSlowParams, low_and_slow
from prefixshield.workloads.one_touch import OneTouchParams, one_touch
from prefixshield.workloads.searched_attack import SearchedAttackParams, searched_attack
from prefixshield.workloads.servegen import ServeGenParams, servegen
from prefixshield.workloads.registry import WORKLOADS, generate, make_params, params_to_dict
from prefixshield.workloads.sharegpt import (BurstyShareGPTParams, ShareGPTParams,
                                             bursty_sharegpt, sharegpt)
from prefixshield.workloads.two_pass_replay import TwoPassReplayParams, two_pass_replay

__all__ = [
    "AttackParams", "BorrowingParams", "BurstyShareGPTParams", "DelayedReplayParams",
    "LowAndSlowParams", "OneTouchParams", "PrefixParams", "SearchedAttackParams", "ServeGenParams",
    "ShareGPTParams",
    "TwoPassReplayParams", "WORKLOADS", "WorkloadParams", "borrowing", "bursty_sharegpt",
    "delayed_replay", "designed_debt_blocks", "generate", "low_and_slow", "make_params",
    "one_touch", "params_to_dict", "searched_attack", "servegen", "sharegpt", "two_pass_replay",
]
