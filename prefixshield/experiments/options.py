"""A run's options as one typed, validated object (`RunOptions`), and the one place the
engine of a run is built from its options (`engine_config`).

``prefixshield run``, ``compare`` and ``trace generate`` build a `RunOptions` once, at
the command line's edge (`prefixshield.cli.common.run_options`), and pass it whole; the
defaults a command line shows are read from these dataclasses (and
[`EngineConfig`][prefixshield.simulator.config.EngineConfig]), not written again there.

Light on purpose: the CLI imports this module to read its defaults before any command runs
(no numba, pandas or engine here; `RunOptions.spec` imports the experiment lazily).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from prefixshield.edges import AutoBlocks
from prefixshield.simulator.config import EngineConfig
from prefixshield.simulator.costmodel import Profile

DEFAULT_PROFILE = "l4-qwen2.5-1.5b"
"""The cost-model profile a run uses unless told otherwise (the reference's L4 deployment)."""
DEFAULT_ALPHA = 0.6
"""Nominal load unless told otherwise: a generated workload's base rate is 0.6 x C_prefill."""
C_PREFILL_BASES = ("reference", "capacity")
"""Where ``C_prefill`` is measured (`prefixshield.experiments.single.RunSpec.c_prefill_basis`;
the first is the default)."""
CONTRACT_MODES = ("reference", "fit")
"""Where the tiers' contracts come from (`RunOptions.contracts`; the first is the
default)."""


def default_of(cls: type, name: str) -> Any:
    """The default of dataclass ``cls``'s field ``name`` (what a command line shows as its
    option's default, read from the one place it is written)."""
    for f in dataclasses.fields(cls):
        if f.name == name:
            if f.default is not dataclasses.MISSING:
                return f.default
            if f.default_factory is not dataclasses.MISSING:
                return f.default_factory()
            break
    raise KeyError(f"{cls.__name__} has no default for {name!r}")


def check_one_of(name: str, value: Any, choices: tuple) -> None:
    """``ValueError`` naming ``name`` and its ``choices`` unless ``value`` is one of them."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(str, choices))}, got {value!r}")


def engine_config(**fields: Any) -> EngineConfig:
    """The `EngineConfig` of ``fields`` (its attribute names); a field given as None is
    left at the dataclass's default. The one place a run's options become an engine."""
    return EngineConfig(**{k: v for k, v in fields.items() if v is not None})


@dataclass(frozen=True)
class RunOptions:
    """What a run of a workload under policies was asked for, typed and checked once.

    Attributes:
        workload: a registered workload name, or the path of a trace Parquet file.
        policies: policy specs (``name`` or ``name:key=value,...``), ``all`` already expanded.
        engine: the engine of every run (blocks, block size, batching, compat mode, scheduler,
            invariant checks); under ``auto_blocks`` its ``num_blocks`` is a placeholder until
            the pool is sized from the trace.
        every_policy: ``--policy all`` was asked for: a policy that cannot serve the trace
            is left out with a line saying why, not refused.
        auto_blocks: ``--blocks auto[:FRACTION]``: size the pool from the trace file
            (`prefixshield.experiments.sizing`); None: ``engine.num_blocks`` as given.
        profile: the cost-model profile.
        alpha: nominal load (> 0); a generated workload's base rate is ``alpha x C_prefill``.
        seeds: the trace seeds to run, in order (``run``: one; ``compare``: 0..N-1).
        overrides: typed workload parameter overrides (``--set``).
        fleet: replicas and router (a `prefixshield.fleet.config.FleetConfig`); None:
            one engine.
        executor: ``(name, workers, address)`` where a split fleet's replicas run; None: in
            this process.
        c_prefill_basis: one of `C_PREFILL_BASES`.
        contracts: one of `CONTRACT_MODES`: the reference contracts, or contracts fitted
            to the trace under LRU.
        scale_to_load: for a trace file: rescale its arrivals to this multiple of
            ``C_prefill`` (> 0); None: its own times.
    """

    workload: str
    policies: tuple[str, ...]
    engine: EngineConfig = field(default_factory=EngineConfig)
    every_policy: bool = False
    auto_blocks: AutoBlocks | None = None
    profile: Profile | None = None
    alpha: float = DEFAULT_ALPHA
    seeds: tuple[int, ...] = (0,)
    overrides: Mapping[str, Any] = field(default_factory=dict)
    fleet: Any = None
    executor: tuple | None = None
    c_prefill_basis: str = C_PREFILL_BASES[0]
    contracts: str = CONTRACT_MODES[0]
    scale_to_load: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.workload, str) or not self.workload:
            raise ValueError(f"workload must be a name or a trace file, got {self.workload!r}")
        if not isinstance(self.policies, tuple) or not self.policies:
            raise ValueError("no policy given")
        if not isinstance(self.engine, EngineConfig):
            raise ValueError(f"engine must be an EngineConfig, got {self.engine!r}")
        if self.auto_blocks is not None and not isinstance(self.auto_blocks, AutoBlocks):
            raise ValueError(f"auto_blocks must be an AutoBlocks, got {self.auto_blocks!r}")
        if self.profile is None:
            from prefixshield.simulator.costmodel import load_profile

            object.__setattr__(self, "profile", load_profile(DEFAULT_PROFILE))
        if not isinstance(self.profile, Profile):
            raise ValueError(f"profile must be a Profile, got {self.profile!r}")
        if not (isinstance(self.alpha, (int, float)) and self.alpha > 0):
            raise ValueError(f"alpha must be > 0, got {self.alpha}")
        if not self.seeds or any(not isinstance(s, int) or isinstance(s, bool) or s < 0
                                 for s in self.seeds):
            raise ValueError(f"seeds must be one or more integers >= 0, got {self.seeds!r}")
        check_one_of("c_prefill_basis", self.c_prefill_basis, C_PREFILL_BASES)
        check_one_of("contracts", self.contracts, CONTRACT_MODES)
        if self.scale_to_load is not None and not self.scale_to_load > 0:
            raise ValueError(f"scale_to_load must be > 0, got {self.scale_to_load}")
        if self.executor is not None and self.fleet is None:
            raise ValueError("an executor runs a split fleet's replicas: no fleet given")

    @property
    def seed(self) -> int:
        """The first seed (a single run's trace seed)."""
        return self.seeds[0]

    def spec(self, **changes: Any):
        """The [`RunSpec`][prefixshield.experiments.single.RunSpec] of these options (seed: the
        first), with ``changes`` (``engine=``, ``seed=``, ``resample=`` ...) applied."""
        from prefixshield.experiments.single import RunSpec

        kw = dict(workload=self.workload, policies=self.policies, engine=self.engine,
                  profile=self.profile, alpha=self.alpha, seed=self.seed,
                  overrides=dict(self.overrides), scale_to_load=self.scale_to_load,
                  c_prefill_basis=self.c_prefill_basis, fleet=self.fleet)
        kw.update(changes)
        return RunSpec(**kw)
