"""``prefixshield attack-search``: each policy judged by the worst attack a search finds.

What runs, for a set of policies at one setup (engine, profile, load, victim) and one attacker
budget (`prefixshield.workloads.searched_attack`):

1. **Controls and the hand-written attacks.** The no-attack control of ``searched_attack`` (one
   trace per seed, whatever the attack) on the search seeds and on the held-out seeds, and
   ``one_touch``, ``low_and_slow``, ``two_pass_replay`` at the same budget, each with its own
   control, on the search seeds. A hand-written attack at the same budget sends its own rate, or
   the budget's when its own is higher (`spend_rate`);
   every run uses the search's duration, so every victim trace is the same.
2. **The search**, per policy: an optuna study (TPE by default, seeded) over
   `SPACE`, maximizing the objective: the mean
   over the search seeds of the victim's paired hit-ratio loss against the control
   (``hit_ratio``: control minus attack, per seed) or of its P95 TTFT increase (``p95_ttft``:
   attack minus control, seconds). With ``warm_start`` the first trials are the hand-written
   attacks mapped into the space (one_touch exactly), so the worst case found is never below
   them at the search seeds by construction of the search; the tables say which trial it is.
3. **Transfer**: the worst attack found against each policy, replayed against every policy on
   held-out seeds (never used by the search), against the held-out control: the policies x
   attacks matrix, and an unbiased estimate of each worst case (the maximum of many noisy
   trials at the search seeds is biased upwards).

**Determinism and resume.** Trials are asked in rounds: each round asks up to ``batch`` trials
of every policy (policies in order), adds them to the results store as experiments (one per
trial, named ``search.<policy>.t<NNNN>``), computes their missing cells on the executor, and
tells every trial's value back in trial order. The sampler's state therefore depends only on
its seed and the values told, never on which worker finished first; on a rerun the same rounds
are asked again, their stored cells are found (nothing is recomputed) and told again, so a
search killed at any point ends identical to an uninterrupted one. A stored trial whose
parameters differ from what the sampler asks now (other code or optuna version) is an error.

The store is of kind ``attack-search`` (`ADAPTIVE_KINDS`):
its fixed part is the controls and hand-written attacks; ``meta["search"]`` holds the search
configuration (all but ``trials``: a rerun with more trials extends the search, with fewer
reports its first trials); a store of another configuration is refused before any work.
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import pandas as pd

from prefixshield.experiments.attack_space import (describe, known_points, space_for,
                                                   spend_rate, suggest, to_optuna_params,
                                                   workload_fields)
from prefixshield.experiments.spec import Experiment, SpecError, fleet_of, jsonable
from prefixshield.experiments.store import ResultsStore
from prefixshield.parquetfiles import read_frame

FIXED_ATTACKS = ("one_touch", "low_and_slow", "two_pass_replay")
FIXED_FIELDS = {"population": "two_group"}
"""What the hand-written attacks (and one_touch's budget measurement) run with: the population
``searched_attack``'s victim has, ``two_group`` (the search space was not refitted to the
background population, so its victim and the fixed attacks' are the same victim)."""
OBJECTIVES = ("hit_ratio", "p95_ttft")
SAMPLERS = ("tpe", "cmaes")
N_RESAMPLES = 10_000
WORKLOAD = "searched_attack"
DEFAULT_BUDGET = "requests+prompt_tokens+block_s"
"""The default budget: one_touch's requests/s, prompt tokens/s and KV block-seconds/s."""
BUDGET_FIELDS = ("budget_requests", "budget_prompt_tokens", "budget_tokens", "budget_block_s")


@dataclass(frozen=True)
class SearchConfig:
    """One attack search.

    Attributes:
        policies: policy specs, each searched on its own study.
        trials: trials per policy.
        seeds: search seeds ``0 .. seeds-1`` (every trial runs all of them).
        eval_seeds: held-out seeds ``seeds .. seeds+eval_seeds-1`` of the transfer check.
        objective: ``hit_ratio`` (victim hit-ratio loss, fraction) or ``p95_ttft`` (victim P95
            TTFT increase, seconds).
        budget_limits: which limits of the attacker's budget apply: units joined by ``+``
            from ``requests``, ``prompt_tokens``, ``tokens`` (prompt + output), ``block_s`` (KV
            block-seconds), or ``both`` (``requests+prompt_tokens``); see
            `prefixshield.workloads.searched_attack`. Default: requests, prompt tokens and
            block-seconds, each at one_touch's level.
        budget_requests: the request limit, requests/s (None: the one-touch flood rate
            of the reference setup).
        budget_prompt_tokens: the prompt-token limit, tokens/s (None: the one-touch flood rate
            times one_touch's mean prompt).
        budget_tokens: the prompt + output token limit, tokens/s (None: the one-touch flood
            rate times one_touch's mean prompt + mean output).
        budget_block_s: the KV block-seconds limit, block-seconds per second (None: one_touch's
            attacker block-seconds per second measured at this setup, see `resolve`).
        sampler: ``tpe`` (optuna's TPESampler, constant liar for batches) or ``cmaes``.
        sampler_seed: the sampler's seed.
        batch: trials asked per policy per round (part of the identity: rounds fix the order).
        warm_start: start every study with the hand-written attacks mapped into the space.
        base: fixed fields of every run (typed, as `Experiment`
            ``base``): engine, ``profile``, ``alpha``, victim/workload fields and,
            for a search against a fleet, ``replicas``, ``router`` and ``router_key`` (every
            run, controls and hand-written attacks included, is then that fleet; the aim its
            router reads is searched, see `space`).
    """

    policies: tuple[str, ...]
    trials: int = 200
    seeds: int = 5
    eval_seeds: int = 5
    objective: str = "hit_ratio"
    budget_limits: str = DEFAULT_BUDGET
    budget_requests: float | None = None
    budget_prompt_tokens: float | None = None
    budget_tokens: float | None = None
    budget_block_s: float | None = None
    sampler: str = "tpe"
    sampler_seed: int = 0
    batch: int = 4
    warm_start: bool = True
    base: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.policies:
            raise SpecError("attack-search: no policy given")
        if len(set(self.policies)) != len(self.policies):
            raise SpecError("attack-search: a policy is listed twice")
        for name, lo in (("trials", 1), ("seeds", 1), ("eval_seeds", 1), ("batch", 1)):
            if getattr(self, name) < lo:
                raise SpecError(f"attack-search: {name} must be >= {lo}, got "
                                f"{getattr(self, name)}")
        if self.objective not in OBJECTIVES:
            raise SpecError(f"attack-search: objective must be one of {', '.join(OBJECTIVES)}, "
                            f"got {self.objective!r}")
        if self.sampler not in SAMPLERS:
            raise SpecError(f"attack-search: sampler must be one of {', '.join(SAMPLERS)}, got "
                            f"{self.sampler!r}")
        from prefixshield.scheduling import SCHEDULERS
        from prefixshield.workloads.searched_attack import parse_budget_limits

        try:
            parse_budget_limits(self.budget_limits)
        except ValueError as e:
            raise SpecError(f"attack-search: {e}") from None
        for name in BUDGET_FIELDS:
            v = getattr(self, name)
            if v is not None and not (v > 0 and math.isfinite(v)):
                raise SpecError(f"attack-search: {name} must be a finite number > 0 per "
                                f"second, got {v}")
        sched = self.base.get("scheduler", "fcfs")
        if sched not in SCHEDULERS:
            raise SpecError(f"attack-search: unknown scheduler {sched!r}; known: "
                            f"{', '.join(SCHEDULERS)}")
        try:
            fleet_of(self.base)  # e.g. a router_key its router does not read
        except SpecError as e:
            raise SpecError(f"attack-search: {e}") from None

    @property
    def units(self) -> tuple[str, ...]:
        """The budget's units in force (``requests``, ``prompt_tokens``, ``tokens``,
        ``block_s``)."""
        from prefixshield.workloads.searched_attack import parse_budget_limits

        return parse_budget_limits(self.budget_limits)

    @property
    def space(self):
        """The attack space searched: `SPACE`,
        plus the aim the fleet's router reads (`space_for`;
        ``aim_blocks`` up to the victim's prefix blocks)."""
        from prefixshield.workloads.searched_attack import SearchedAttackParams as P

        prefix_blocks = int(self.base.get("prefix_tokens", P.prefix_tokens)) // int(
            self.base.get("block_size", P.block_size))
        return space_for(self.base, prefix_blocks)

    @property
    def search_seeds(self) -> tuple[int, ...]:
        """Seeds every trial runs."""
        return tuple(range(self.seeds))

    @property
    def held_out_seeds(self) -> tuple[int, ...]:
        """Seeds of the transfer check (disjoint from the search seeds)."""
        return tuple(range(self.seeds, self.seeds + self.eval_seeds))

    def identity(self) -> dict:
        """What fixes the sequence of trials (everything but ``trials``), as JSON."""
        return {"policies": list(self.policies), "seeds": self.seeds,
                "eval_seeds": self.eval_seeds, "objective": self.objective,
                "budget_limits": self.budget_limits,
                **{f: getattr(self, f) for f in BUDGET_FIELDS}, "sampler": self.sampler,
                "sampler_seed": self.sampler_seed, "batch": self.batch,
                "warm_start": self.warm_start,
                "base": {k: jsonable(v) for k, v in sorted(self.base.items())},
                "space": [d.identity() for d in self.space]}


@dataclass
class Resolved:
    """The budget and load of a search, resolved once (C_prefill measured as every run does).

    Attributes:
        limits: the applied limits per second by unit (``requests``, ``prompt_tokens``,
            ``tokens``, ``block_s``).
        base_rate: the victim's rate (requests/s) = alpha x C_prefill.
        c_prefill: requests/s.
        budget_rate: per hand-written workload, the budget in requests/s for its requests.
        designed_rate: per hand-written workload, its own attacker rate (requests/s).
        spend: per hand-written workload, what it sends under the budget (requests/s).
        prefix_tokens: the victim's (and one_touch's attacker's) prefix length.
        window_s: the pressure window every attack spends its budget over (seconds).
        one_touch_block_s: one_touch's attacker block-seconds per second of the window,
            measured under LRU at this setup (scheduler included), mean over the search
            seeds, at what it sends under the other limits (NaN when block_s is not charged).
        block_s_scale: measured / estimated block-seconds of one_touch's requests: the
            contention factor of the block-seconds estimate (1 when not measured).
        lead_blocks: the ``prefix`` aim's default lead for one_touch's attacker prompt
            (blocks): the warm start's value of ``aim_blocks`` (unread while unaimed).
    """

    limits: dict[str, float]
    base_rate: float
    c_prefill: float
    budget_rate: dict[str, float]
    designed_rate: dict[str, float]
    spend: dict[str, float]
    prefix_tokens: int
    window_s: float = float("nan")
    one_touch_block_s: float = float("nan")
    block_s_scale: float = 1.0
    lead_blocks: int = 1


def _policy_dir(label: str) -> str:
    from prefixshield.experiments.single import label_dir

    return label_dir(label)


def resolve(config: SearchConfig) -> Resolved:
    """Measure the load and turn the budget into numbers (raises ValueError naming a bad
    field of ``base``).

    With ``block_s`` in the budget, one_touch is run under LRU at every search seed (at what
    it sends under the other limits, or its own rate when block_s is the only one) and its
    attacker's block-seconds per second of the window, averaged over the seeds, ``M``, is
    measured. The limit defaults to ``M``. The estimate a generated attack is charged
    before it runs is calibrated on it: ``block_s_scale = M / (rate x E)``, with ``E`` the
    uncontended estimate of one one_touch request, so one_touch at its rate estimates to
    exactly ``M``, and other shapes are charged the same contention factor."""
    from dataclasses import replace

    from prefixshield.experiments.cells import run_spec
    from prefixshield.experiments.single import resolve_params

    from prefixshield.workloads.one_touch import fewest_lead_blocks
    from prefixshield.workloads.searched_attack import budget_request_rate

    units = config.units
    pre = "+".join(u for u in units if u != "block_s")
    fields = {"budget_limits": pre or "requests",
              **{f: getattr(config, f) for f in BUDGET_FIELDS if f != "budget_block_s"},
              "block_s_profile": config.base.get("profile", "l4-qwen2.5-1.5b")}
    p, info = resolve_params(run_spec(WORKLOAD, {**config.base, **fields}, 0, ("lru",)))
    limits = p.limits() if pre else {}
    shapes, designed = {}, {}
    for w in FIXED_ATTACKS:
        pw, _ = resolve_params(run_spec(w, {**config.base, **FIXED_FIELDS}, 0, ("lru",)))
        # The hand-written attackers send prefix + suffix prompts with the data's outputs.
        shapes[w] = replace(p, attacker_prefix_tokens=pw.prefix_tokens,
                            attacker_output_tokens=None)
        designed[w] = pw.attacker_request_rate()

    def spends(lim):
        if not lim:
            return dict(designed), dict(designed)
        rate = {w: budget_request_rate(lim, shapes[w].request_costs()) for w in FIXED_ATTACKS}
        return rate, {w: spend_rate(designed[w], rate[w]) for w in FIXED_ATTACKS}

    budget_rate, spend = spends(limits)
    window = _window_s(config)
    m, scale = float("nan"), 1.0
    if "block_s" in units:
        m = _measure_block_s(config, spend["one_touch"], window)
        est = shapes["one_touch"].estimated_block_s(p.prefix_tokens, None)
        scale = m / (spend["one_touch"] * est)
        limits = {**limits, "block_s": m if config.budget_block_s is None
                  else config.budget_block_s}
        shapes = {w: replace(q, block_s_scale=scale) for w, q in shapes.items()}
        budget_rate, spend = spends(limits)
    limits = {u: limits[u] for u in units}
    return Resolved(limits=limits, base_rate=p.base_rate,
                    c_prefill=float(info.get("c_prefill_req_per_s") or p.c_prefill),
                    budget_rate=budget_rate, designed_rate=designed, spend=spend,
                    prefix_tokens=p.prefix_tokens, window_s=window, one_touch_block_s=m,
                    block_s_scale=scale, lead_blocks=fewest_lead_blocks(
                        (p.prefix_tokens + p.suffix_tokens[1] - 1) // p.block_size))


def _window_s(config: SearchConfig) -> float:
    """The pressure window of the search's traces (seconds), from the control's meta."""
    from prefixshield.experiments.cells import run_spec
    from prefixshield.experiments.single import build_trace

    trace, _ = build_trace(run_spec(WORKLOAD, {**config.base, "budget_limits": "requests",
                                               "attack": False}, 0, ("lru",)))
    w0, w1 = trace.meta["pressure_window_s"]
    return float(w1 - w0)


def _measure_block_s(config: SearchConfig, rate: float, window: float) -> float:
    """one_touch at ``rate`` requests/s under LRU at the search's setup: its attacker's
    block-seconds per second of the window, mean over the search seeds."""
    from prefixshield.experiments.cells import run_spec
    from prefixshield.experiments.single import build_trace, run_policies
    from prefixshield.simulator.metrics import summarize

    vals = []
    for seed in config.search_seeds:
        spec = run_spec("one_touch", {**config.base, **FIXED_FIELDS, "attacker_rate": rate},
                        seed, ("lru",))
        trace, _ = build_trace(spec)
        vals.append(summarize(run_policies(trace, spec)["lru"])["attacker_block_s"] / window)
    return float(np.mean(vals))


def _search_base(config: SearchConfig, r: Resolved) -> dict:
    """Fields of every searched_attack run: the setup and the budget as resolved numbers."""
    out = {**config.base, "budget_limits": "+".join(config.units),
           **{f"budget_{u}": v for u, v in r.limits.items()}}
    if "block_s" in r.limits:
        out.update(block_s_profile=config.base.get("profile", "l4-qwen2.5-1.5b"),
                   block_s_scale=r.block_s_scale)
    return out


def fixed_experiments(config: SearchConfig, r: Resolved) -> list[Experiment]:
    """The fixed part of the store: controls (search and held-out seeds) and the hand-written
    attacks at the same budget with their controls (search seeds)."""
    base = _search_base(config, r)
    exps = [Experiment("control", WORKLOAD, config.policies, config.search_seeds,
                       base={**base, "attack": False}, title="no-attack control"),
            Experiment("heldout.control", WORKLOAD, config.policies, config.held_out_seeds,
                       base={**base, "attack": False}, title="no-attack control, held-out seeds")]
    for w in FIXED_ATTACKS:
        wb = {**config.base, **FIXED_FIELDS, "attacker_rate": r.spend[w]}
        exps.append(Experiment(f"fixed.{w}", w, config.policies, config.search_seeds, base=wb,
                               title=f"{w} at the budget"))
        exps.append(Experiment(f"fixed.{w}.control", w, config.policies, config.search_seeds,
                               base={**wb, "attack": False}, title=f"{w} control"))
    return exps


def trial_experiment(config: SearchConfig, r: Resolved, policy: str, number: int,
                     fields: Mapping[str, Any]) -> Experiment:
    """The experiment of one trial: ``searched_attack`` at the point, one policy."""
    return Experiment(f"search.{_policy_dir(policy)}.t{number:04d}", WORKLOAD, (policy,),
                      config.search_seeds,
                      base={**_search_base(config, r), **workload_fields(fields, config.base)},
                      title=f"trial {number} against {policy}")


def transfer_experiment(config: SearchConfig, r: Resolved, policy: str, number: int,
                        fields: Mapping[str, Any]) -> Experiment:
    """The worst attack found against ``policy`` (its trial ``number``), run against every
    policy on the held-out seeds."""
    return Experiment(f"transfer.{_policy_dir(policy)}.t{number:04d}", WORKLOAD,
                      config.policies, config.held_out_seeds,
                      base={**_search_base(config, r), **workload_fields(fields, config.base)},
                      title=f"worst attack against {policy}, held-out seeds")


# ------------------------------------------------------------------------------ cells
def cells_of(store: ResultsStore, exp: Experiment) -> pd.DataFrame:
    """The stored cells of ``exp`` (grid-less: point ``p000``), in policy then seed order."""
    frames = []
    for label in exp.policies:
        for seed in exp.seeds:
            path = store.cell_path(exp.name, "p000", label, seed)
            if path.exists():
                frames.append(read_frame(path))
    if not frames:
        return pd.DataFrame(columns=["policy", "seed", "status"])
    return pd.concat(frames, ignore_index=True)


@dataclass
class Paired:
    """A paired comparison of an attack with its control for one policy over seeds.

    ``hit_loss`` = control - attack hit ratio (fraction), ``ttft_increase`` = attack - control
    P95 TTFT (s): mean and 95% bootstrap CI (``None`` CIs until `with_ci`); ``pressure``
    and ``debt``: the attacker's measured creation-pressure ratio and mean debt (blocks), mean
    over seeds; ``evictions``: the mean eviction matrix; ``control_hit`` / ``attack_hit``: the
    victim's mean hit ratio without and with the attack; ``attacker_block_s``: the attacker's
    KV block-seconds per run (mean over seeds); ``p95_ttft`` / ``p95_queue``: the victim's P95
    TTFT and P95 queueing delay (arrival to first admission) under the attack, and
    ``control_p95_queue`` without it (seconds, mean over seeds); ``failed``: the first error,
    if any."""

    seeds: int
    hit_loss: tuple[float, float | None, float | None]
    ttft_increase: tuple[float, float | None, float | None]
    pressure: float
    debt: float
    evictions: pd.DataFrame | None
    control_hit: float = float("nan")
    attack_hit: float = float("nan")
    attacker_block_s: float = float("nan")
    p95_ttft: float = float("nan")
    p95_queue: float = float("nan")
    control_p95_queue: float = float("nan")
    failed: str = ""
    _a: tuple = ()

    def with_ci(self) -> "Paired":
        """Fill in the bootstrap CIs (10,000 resamples, fixed seed 0, as every paired table)."""
        from prefixshield.simulator.metrics import paired_difference

        if self.failed or self.hit_loss[1] is not None or not self._a:
            return self
        ch, ah, ct, at = self._a
        d1 = paired_difference(ch, ah, n_resamples=N_RESAMPLES, seed=0)
        d2 = paired_difference(at, ct, n_resamples=N_RESAMPLES, seed=0)
        self.hit_loss = (d1["mean_diff"], d1["ci_low"], d1["ci_high"])
        self.ttft_increase = (d2["mean_diff"], d2["ci_low"], d2["ci_high"])
        return self

    def value(self, objective: str) -> float:
        """The objective's value (mean over seeds)."""
        return self.hit_loss[0] if objective == "hit_ratio" else self.ttft_increase[0]


def paired(attack: pd.DataFrame, control: pd.DataFrame, policy: str) -> Paired:
    """Pair ``attack`` cells with ``control`` cells of ``policy`` by seed."""
    a = attack[attack["policy"] == policy].set_index("seed").sort_index()
    c = control[control["policy"] == policy].set_index("seed").sort_index()
    bad = [str(x["error"]) for _, x in pd.concat([a, c]).iterrows() if x["status"] != "ok"]
    seeds = sorted(set(a.index) & set(c.index))
    if bad or not seeds:
        nan = (float("nan"), float("nan"), float("nan"))
        return Paired(len(seeds), nan, nan, float("nan"), float("nan"), None,
                      failed=bad[0] if bad else "no paired cells")
    ch, ah = c.loc[seeds, "hit_ratio"].to_numpy(float), a.loc[seeds, "hit_ratio"].to_numpy(float)
    ct = c.loc[seeds, "p95_ttft_s"].to_numpy(float)
    at = a.loc[seeds, "p95_ttft_s"].to_numpy(float)
    mats = []
    for s in seeds:
        ev = json.loads(a.loc[s, "evictions_json"])
        mats.append(pd.DataFrame(ev["matrix"], index=pd.Index(ev["groups"], name="requester"),
                                 columns=pd.Index(ev["groups"], name="owner")))
    ev_mean = sum(mats) / len(mats)
    return Paired(len(seeds), (float(np.mean(ch - ah)), None, None),
                  (float(np.mean(at - ct)), None, None),
                  float(a.loc[seeds, "attacker_pressure_ratio"].astype(float).mean()),
                  float(a.loc[seeds, "attacker_mean_debt_blocks"].astype(float).mean()),
                  ev_mean, control_hit=float(np.mean(ch)), attack_hit=float(np.mean(ah)),
                  attacker_block_s=_mean(a, seeds, "attacker_block_s"),
                  p95_ttft=float(np.mean(at)), p95_queue=_mean(a, seeds, "p95_queue_s"),
                  control_p95_queue=_mean(c, seeds, "p95_queue_s"), _a=(ch, ah, ct, at))


def _mean(frame: pd.DataFrame, seeds: list, col: str) -> float:
    """Mean of ``col`` over ``seeds`` (NaN for a store written before the column existed)."""
    if col not in frame.columns:
        return float("nan")
    return float(frame.loc[seeds, col].astype(float).mean())


# ------------------------------------------------------------------------------ search
@dataclass
class TrialRecord:
    """One trial: its policy, number, origin (``tpe``/``cmaes`` or ``warm start: NAME``), the
    point (``fields``), its paired result, and whether it kept the block-seconds budget as
    measured (`over_budget`)."""

    policy: str
    number: int
    source: str
    fields: dict
    result: Paired
    feasible: bool = True


@dataclass
class SearchResult:
    """What `run_search` found: the trials per policy, the hand-written attacks' results
    (per workload, per policy), the worst trial per policy, and the transfer matrix
    (``transfer[attacked policy][evaluated policy]``, held-out seeds)."""

    config: SearchConfig
    resolved: Resolved
    trials: dict[str, list[TrialRecord]]
    fixed: dict[str, dict[str, Paired]]
    worst: dict[str, TrialRecord | None]
    transfer: dict[str, dict[str, Paired]]


def block_s_rate(p: Paired, r: Resolved) -> float:
    """The attacker's measured KV block-seconds per second of the pressure window."""
    return p.attacker_block_s / r.window_s


ROUNDING = 1e-9
"""Relative excess over the block-seconds limit that is floating-point rounding, not spending:
the default limit is a mean of per-seed rates and a trial's rate a mean total over the window,
so one_touch's own point can measure one ulp above the level it defines."""


def over_budget(p: Paired, r: Resolved) -> float:
    """By how much a run exceeded the block-seconds budget as measured: ``measured / limit -
    1`` (<= `ROUNDING`: kept it; -inf when block-seconds are not charged)."""
    if "block_s" not in r.limits:
        return -math.inf
    v = block_s_rate(p, r)
    return v / r.limits["block_s"] - 1.0 if math.isfinite(v) else math.inf


def _constraint(trial) -> tuple[float]:
    """optuna's constraint of a trial (<= 0: feasible), set before it is told."""
    return (trial.user_attrs.get("over_budget", 0.0),)


def _sampler(config: SearchConfig):
    import optuna

    if config.sampler == "cmaes":
        try:
            import cmaes  # noqa: F401
        except ImportError:
            raise ValueError("--sampler cmaes needs the cmaes package: pip install cmaes") \
                from None
        return optuna.samplers.CmaEsSampler(seed=config.sampler_seed,
                                            warn_independent_sampling=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        # Trials over the block-seconds budget as measured are infeasible: TPE models them
        # apart, so the search learns where the budget binds instead of discarding them.
        kw = {"constraints_func": _constraint} if "block_s" in config.units else {}
        return optuna.samplers.TPESampler(seed=config.sampler_seed, constant_liar=True, **kw)


def _import_optuna():
    try:
        import optuna
    except ImportError:
        raise ValueError("attack-search needs optuna: pip install 'prefixshield[search]'") \
            from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def open_store(out: str | Path, config: SearchConfig, r: Resolved,
               command: str = "") -> ResultsStore:
    """Create or reopen the search's store; refuse one of another search configuration."""
    ident = config.identity()
    store = ResultsStore.create(out, fixed_experiments(config, r), kind="attack-search",
                                extra={"search": ident, "command": command})
    if store.meta.get("kind") != "attack-search" or store.meta.get("search") != ident:
        old = store.meta.get("search") or {}
        diff = sorted(k for k in set(old) | set(ident) if old.get(k) != ident.get(k))
        raise SpecError(f"{out}: holds another attack search (differs in "
                        f"{', '.join(diff) or 'kind'}); choose another --out or remove it")
    return store


def run_search(store: ResultsStore, config: SearchConfig, r: Resolved, executor,
               on_progress: Callable[[int, int], None] | None = None) -> SearchResult:
    """Run (or resume) the search in ``store`` and its transfer check; see the module doc.

    ``on_progress(done, total)`` counts traces (tasks) run or found stored."""
    from prefixshield.experiments.runner import run_store

    optuna = _import_optuna()
    known = {e.name: e for e in store.experiments}
    fixed = fixed_experiments(config, r)
    total = _estimate_tasks(config, store, fixed)
    progress = [0]

    def tick(n_tasks: int) -> None:
        progress[0] += n_tasks
        if on_progress:
            on_progress(progress[0], total)

    def run(exps: list[Experiment]) -> None:
        start = progress[0]

        def cb(n, _t):
            if on_progress:
                on_progress(start + n, total)
        stats = run_store(store, executor, on_progress=cb, experiments=exps)
        progress[0] = start + stats.tasks

    if on_progress:
        on_progress(0, total)
    run(fixed)
    cells = {e.name: cells_of(store, e) for e in fixed}
    control = cells["control"]
    fixed_res = {w: {p: paired(cells[f"fixed.{w}"], cells[f"fixed.{w}.control"], p).with_ci()
                     for p in config.policies} for w in FIXED_ATTACKS}

    studies, warm = {}, {}
    points = known_points(r.budget_rate, r.designed_rate, r.prefix_tokens, config.space,
                          r.lead_blocks)
    for pol in config.policies:
        study = optuna.create_study(direction="maximize", sampler=_sampler(config))
        warm[pol] = []
        if config.warm_start:
            for w in FIXED_ATTACKS:
                study.enqueue_trial(to_optuna_params(points[w], config.space),
                                    skip_if_exists=False)
                warm[pol].append(w)
        studies[pol] = study
    records: dict[str, list[TrialRecord]] = {p: [] for p in config.policies}
    while any(len(records[p]) < config.trials for p in config.policies):
        asked = []
        for pol in config.policies:
            for _ in range(min(config.batch, config.trials - len(records[pol]))):
                trial = studies[pol].ask()
                fields = suggest(trial, config.space)
                exp = trial_experiment(config, r, pol, trial.number, fields)
                if exp.name in known and known[exp.name].to_dict() != exp.to_dict():
                    raise SpecError(
                        f"{store.root}: stored trial {exp.name} has other parameters than the "
                        "sampler asks now (another prefixshield or optuna version?); use a "
                        "new --out")
                asked.append((pol, trial, fields, exp))
        new = [e for _, _, _, e in asked if e.name not in known]
        if new:
            store.append_experiments(new)
            known.update({e.name: e for e in new})
        run([e for _, _, _, e in asked])
        for pol, trial, fields, exp in asked:
            res = paired(cells_of(store, exp), control, pol)
            n = trial.number
            source = f"warm start: {warm[pol][n]}" if n < len(warm[pol]) else config.sampler
            over = over_budget(res, r)
            feasible = not over > ROUNDING
            if feasible:
                over = min(over, 0.0)
            records[pol].append(TrialRecord(pol, n, source, fields, res, feasible))
            if res.failed or not math.isfinite(res.value(config.objective)) or (
                    not feasible and config.sampler == "cmaes"):   # CMA-ES has no constraints
                studies[pol].tell(trial, state=optuna.trial.TrialState.FAIL)
            else:
                trial.set_user_attr("over_budget", over if math.isfinite(over) else -1.0)
                studies[pol].tell(trial, res.value(config.objective))

    worst: dict[str, TrialRecord | None] = {}
    for pol in config.policies:
        ok = [t for t in records[pol] if not t.result.failed and t.feasible
              and math.isfinite(t.result.value(config.objective))]
        worst[pol] = max(ok, key=lambda t: (t.result.value(config.objective), -t.number)) \
            if ok else None
        if worst[pol] is not None:
            worst[pol].result.with_ci()
    transfer_exps = {}
    for pol, t in worst.items():
        if t is None:
            continue
        exp = transfer_experiment(config, r, pol, t.number, t.fields)
        if exp.name not in known:
            store.append_experiments([exp])
            known[exp.name] = exp
        transfer_exps[pol] = exp
    held = [e for e in fixed if e.name == "heldout.control"]
    run(held + list(transfer_exps.values()))
    held_cells = cells_of(store, held[0])
    transfer = {pol: {q: paired(cells_of(store, exp), held_cells, q).with_ci()
                      for q in config.policies} for pol, exp in transfer_exps.items()}
    return SearchResult(config, r, records, fixed_res, worst, transfer)


def _estimate_tasks(config: SearchConfig, store: ResultsStore, fixed: list[Experiment]) -> int:
    """Traces the whole search runs (for the progress bar's total)."""
    from prefixshield.experiments.cells import plan_tasks

    tasks, _ = plan_tasks(fixed, set())
    return len(tasks) + len(config.policies) * (config.trials * config.seeds
                                                + config.eval_seeds)


# ------------------------------------------------------------------------------ tables
def _fmt(x: float, scale: float, digits: int, signed: bool = True) -> str:
    if x is None or x != x:
        return "-"
    return f"{scale * x:+.{digits}f}" if signed else f"{scale * x:.{digits}f}"


def fmt_loss(t: tuple, objective: str) -> str:
    """``+12.34 [+8.00, +15.10]``: pp for the hit-ratio loss, seconds for P95 TTFT."""
    scale, digits = (100.0, 2) if objective == "hit_ratio" else (1.0, 3)
    m, lo, hi = t
    if m != m:
        return "-"
    if lo is None:
        return _fmt(m, scale, digits)
    return f"{_fmt(m, scale, digits)} [{_fmt(lo, scale, digits)}, {_fmt(hi, scale, digits)}]"


def _metric(p: Paired, objective: str) -> tuple:
    return p.hit_loss if objective == "hit_ratio" else p.ttft_increase


def loss_unit(objective: str) -> str:
    """The unit of the objective in tables."""
    return "pp" if objective == "hit_ratio" else "s"


def _evictions_cell(ev: pd.DataFrame | None, requester: str, owner: str) -> str:
    if ev is None or requester not in ev.index or owner not in ev.columns:
        return "-"
    return f"{float(ev.loc[requester, owner]):.0f}"


def worst_case_table(res: SearchResult) -> pd.DataFrame:
    """Per policy: the worst attack found (search seeds, CI over seeds), where it was found, its
    held-out loss, the hand-written attacks at the same budget, the attacker's measured
    pressure and debt, and the eviction matrix of the worst attack (mean blocks per run)."""
    obj = res.config.objective
    u = loss_unit(obj)
    rows = []
    for pol in res.config.policies:
        t = res.worst[pol]
        done = len(res.trials[pol])
        row: dict[str, Any] = {"policy": pol, "trials": done}
        if t is None:
            row.update({f"worst loss ({u}) [95% CI]": "all trials failed"})
            rows.append(row)
            continue
        w = t.result
        held = res.transfer.get(pol, {}).get(pol)
        row.update({
            f"worst loss ({u}) [95% CI]": fmt_loss(_metric(w, obj), obj),
            "found at trial": f"{t.number} ({t.source})",
            f"held-out ({u}) [95% CI]": fmt_loss(_metric(held, obj), obj) if held else "-",
            "victim hit ratio: control -> worst": f"{100 * w.control_hit:.1f}% -> "
                                                  f"{100 * w.attack_hit:.1f}%",
        })
        for a in FIXED_ATTACKS:
            row[f"{a} ({u}) [95% CI]"] = fmt_loss(_metric(res.fixed[a][pol], obj), obj)
        other = "hit_ratio" if obj == "p95_ttft" else "p95_ttft"
        row[f"worst: {'P95 TTFT +' if other == 'p95_ttft' else 'hit loss'} "
            f"({loss_unit(other)})"] = fmt_loss(_metric(w, other)[:1] + (None, None), other)
        row["victim P95 TTFT / P95 queue (s), held-out"] = (
            f"{held.p95_ttft:.2f} / {held.p95_queue:.2f}" if held else "-")
        row["victim P95 queue (s): control -> worst"] = (f"{w.control_p95_queue:.2f} -> "
                                                         f"{w.p95_queue:.2f}")
        row["attacker block-s/s (measured)"] = _block_s_text(w, res.resolved)
        row["trials over budget"] = sum(not x.feasible for x in res.trials[pol])
        row["attacker pressure"] = f"{w.pressure:.2f}"
        row["attacker debt (blocks)"] = f"{w.debt:.0f}"
        for req, own in (("attacker", "victim"), ("attacker", "attacker"),
                         ("victim", "victim"), ("victim", "attacker")):
            row[f"evicted {req}->{own}"] = _evictions_cell(w.evictions, req, own)
        rows.append(row)
    return pd.DataFrame(rows)


def _block_s_text(p: Paired, r: Resolved) -> str:
    """The attacker's measured block-seconds per second, and the share of the budget."""
    v = block_s_rate(p, r)
    if v != v:
        return "-"
    lim = r.limits.get("block_s")
    return f"{v:,.0f}" + (f" ({100 * v / lim:.0f}% of budget)" if lim else "")


def worst_attacks_table(res: SearchResult) -> pd.DataFrame:
    """Per policy: the worst attack's parameters (every dim of the space) and a description."""
    rows = []
    for pol in res.config.policies:
        t = res.worst[pol]
        if t is None:
            continue
        rows.append({"policy": pol, "trial": t.number, "source": t.source,
                     **{d.name: _param_text(t.fields[d.name]) for d in res.config.space},
                     "what it does": describe(t.fields)})
    return pd.DataFrame(rows)


def _param_text(v: Any) -> str:
    if v is None:
        return "none"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def transfer_table(res: SearchResult) -> pd.DataFrame:
    """Rows: the worst attack found against a policy; columns: the policy it is run against
    (held-out seeds): objective loss with 95% CI."""
    obj = res.config.objective
    rows = []
    for pol, by in res.transfer.items():
        rows.append({"attack (worst found against)": pol,
                     **{q: fmt_loss(_metric(by[q], obj), obj) for q in res.config.policies}})
    return pd.DataFrame(rows)


def trials_frame(res: SearchResult) -> pd.DataFrame:
    """Every trial: policy, number, source, status, whether it kept the block-seconds budget as
    measured, both losses (means), the victim's P95 TTFT and queueing delay (s), the attacker's
    measured block-seconds per second, pressure and debt, and the point."""
    rows = []
    for pol in res.config.policies:
        for t in res.trials[pol]:
            r = t.result
            rows.append({"policy": pol, "trial": t.number, "source": t.source,
                         "status": "failed" if r.failed else "ok", "error": r.failed,
                         "feasible": t.feasible,
                         "hit_ratio_loss": r.hit_loss[0], "p95_ttft_increase_s":
                         r.ttft_increase[0], "victim_p95_ttft_s": r.p95_ttft,
                         "victim_p95_queue_s": r.p95_queue,
                         "attacker_block_s_per_s": block_s_rate(r, res.resolved),
                         "attacker_pressure_ratio": r.pressure,
                         "attacker_mean_debt_blocks": r.debt,
                         **{d.name: t.fields[d.name] for d in res.config.space}})
    return pd.DataFrame(rows)


def evictions_table(res: SearchResult) -> pd.DataFrame:
    """The worst attack's mean eviction matrix per policy, long form (policy, requester,
    owner, blocks per run)."""
    rows = []
    for pol in res.config.policies:
        t = res.worst[pol]
        if t is None or t.result.evictions is None:
            continue
        ev = t.result.evictions
        for req in ev.index:
            for own in ev.columns:
                rows.append({"policy": pol, "requester": req, "owner": own,
                             "evicted blocks per run": round(float(ev.loc[req, own]), 1)})
    return pd.DataFrame(rows)


def to_markdown(df: pd.DataFrame) -> str:
    """A GitHub Markdown table (no extra dependency)."""
    cols = list(df.columns)
    lines = ["| " + " | ".join(map(str, cols)) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for _, r in df.iterrows():
        lines.append("| " + " | ".join(str(r[c]) for c in cols) + " |")
    return "\n".join(lines) + "\n"


def header_lines(res: SearchResult) -> list[str]:
    """What the search was: setup, budget, seeds, sampler, objective."""
    c, r = res.config, res.resolved
    base = ", ".join(f"{k}={v}" for k, v in sorted(c.base.items()))
    return [
        f"setup: {base or 'defaults'}; victim base rate {r.base_rate:.3f} req/s = alpha x "
        f"C_prefill {r.c_prefill:.3f} req/s",
        budget_line(c, r) + "; hand-written attacks send "
        + ", ".join(f"{w} {r.spend[w]:.3f} req/s" for w in FIXED_ATTACKS),
        f"search: {c.sampler} (seed {c.sampler_seed}), {c.trials} trials per policy in rounds of "
        f"{c.batch}, objective {c.objective}, search seeds 0-{c.seeds - 1}, held-out seeds "
        f"{c.seeds}-{c.seeds + c.eval_seeds - 1}"
        + (", warm start with the hand-written attacks" if c.warm_start else ""),
    ]


BUDGET_TEXT = {"requests": ("{:,.3f} requests/s", "the one-touch flood rate"),
               "prompt_tokens": ("{:,.1f} prompt tokens/s", "one_touch's"),
               "tokens": ("{:,.1f} prompt + output tokens/s", "one_touch's"),
               "block_s": ("{:,.1f} KV block-seconds/s", "one_touch's measured under LRU")}


def budget_line(c: SearchConfig, r: Resolved) -> str:
    """The budget in force, in words: every limit, whether it is a default, and how
    block-seconds are charged."""
    parts = []
    for u, v in r.limits.items():
        fmt, default = BUDGET_TEXT[u]
        parts.append(fmt.format(v) + (f" ({default})" if getattr(c, f"budget_{u}") is None
                                      else ""))
    line = "attacker budget: at most " + " and ".join(parts)
    if "block_s" in r.limits:
        line += (f"; block-seconds charged before the run by the shape estimate x "
                 f"{r.block_s_scale:.2f} (one_touch's measured / uncontended estimate), "
                 "checked after it (a trial over the budget as measured is infeasible)")
    return line


def write_outputs(out: str | Path, res: SearchResult) -> list[Path]:
    """Write ``tables/`` (Markdown and CSV), ``figures/`` (PNG) and ``attack_search.md`` into
    ``out``, each atomically. Returns the paths written."""
    from prefixshield.atomic import write_text, write_with

    out = Path(out)
    written: list[Path] = []
    tables = {"worst_case": worst_case_table(res), "worst_attacks": worst_attacks_table(res),
              "transfer": transfer_table(res), "worst_evictions": evictions_table(res)}
    for name, df in tables.items():
        write_text(out / "tables" / f"{name}.md", to_markdown(df))
        write_with(out / "tables" / f"{name}.csv", lambda tmp, d=df: d.to_csv(tmp, index=False))
        written += [out / "tables" / f"{name}.md", out / "tables" / f"{name}.csv"]
    tf = trials_frame(res)
    write_with(out / "tables" / "trials.csv", lambda tmp: tf.to_csv(tmp, index=False))
    written.append(out / "tables" / "trials.csv")
    figs = write_figures(out / "figures", res)
    written += figs
    u = loss_unit(res.config.objective)
    md = ["# Attack search: every policy judged by its worst case", "",
          *[f"- {line}" for line in header_lines(res)], "",
          f"## Worst case per policy (objective: {res.config.objective}, {u})", "",
          to_markdown(tables["worst_case"]), "## The worst attacks", "",
          to_markdown(tables["worst_attacks"]),
          "## Transfer: each worst attack against every policy (held-out seeds)", "",
          to_markdown(tables["transfer"]), "## Figures", "",
          *[f"![{p.stem}](figures/{p.name})" for p in figs], ""]
    write_text(out / "attack_search.md", "\n".join(md))
    written.append(out / "attack_search.md")
    return written


def write_figures(folder: Path, res: SearchResult) -> list[Path]:
    """Search progress (loss per trial and running worst, with the hand-written attacks), the
    transfer matrix as a heatmap, and the worst attacks' eviction matrices."""
    from prefixshield import figures as F

    obj = res.config.objective
    scale = 100.0 if obj == "hit_ratio" else 1.0
    u = loss_unit(obj)
    plt = F._plt()
    pols = list(res.config.policies)
    cols = min(2, len(pols))
    nrows = (len(pols) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(6.5 * cols, 3.6 * nrows), squeeze=False)
    for ax, pol in zip(axes.flat, pols):
        recs = res.trials[pol]
        x = np.array([t.number for t in recs])
        y = np.array([t.result.value(obj) for t in recs], dtype=float) * scale
        ax.scatter(x, y, s=10, color="0.55", label="trial")
        best = np.fmax.accumulate(np.where(np.isfinite(y), y, -np.inf)) if len(y) else y
        ax.step(x, best, where="post", color="C3", lw=1.6, label="worst so far")
        for k, w in enumerate(FIXED_ATTACKS):
            ax.axhline(res.fixed[w][pol].value(obj) * scale, color=f"C{k}", ls="--", lw=1,
                       label=f"{w} (same budget)")
        ax.set_title(pol)
        ax.set_xlabel("trial")
        ax.set_ylabel(f"victim {'hit-ratio loss' if obj == 'hit_ratio' else 'P95 TTFT +'} ({u})")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(pols):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(f"attack search progress ({res.config.sampler}, "
                 f"{res.config.seeds} seeds per trial)")
    paths = [folder / "search_progress.png"]
    F._save(fig, paths[0])
    if res.transfer:
        attacks = list(res.transfer)
        m = np.array([[res.transfer[a][q].value(obj) * scale for q in pols] for a in attacks])
        fig, ax = plt.subplots(figsize=(1.6 * len(pols) + 3, 1.0 * len(attacks) + 2))
        im = ax.imshow(m, cmap="Reds")
        ax.set_xticks(range(len(pols)), pols, rotation=30, ha="right")
        ax.set_yticks(range(len(attacks)), [f"worst vs {a}" for a in attacks])
        for i in range(len(attacks)):
            for j in range(len(pols)):
                ax.text(j, i, f"{m[i, j]:+.1f}" if scale == 100 else f"{m[i, j]:+.2f}",
                        ha="center", va="center", fontsize=8)
        ax.set_xlabel("policy attacked (held-out seeds)")
        fig.colorbar(im, ax=ax, label=f"victim loss ({u})")
        ax.set_title("transfer of the worst attacks")
        paths.append(folder / "transfer.png")
        F._save(fig, paths[-1])
    mats = {pol: res.worst[pol].result.evictions for pol in pols
            if res.worst[pol] is not None and res.worst[pol].result.evictions is not None}
    if mats:
        paths.append(folder / "worst_evictions.png")
        F.eviction_heatmaps(paths[-1], "evictions under each policy's worst attack "
                            "(mean blocks per run)", mats)
    return paths


def config_of_store(store: ResultsStore) -> SearchConfig:
    """The `SearchConfig` a search store was written by (its ``meta["search"]``), with
    ``trials`` the most trials stored for a policy. Raises SpecError for another kind."""
    ident = store.meta.get("search")
    if store.meta.get("kind") != "attack-search" or not ident:
        raise SpecError(f"{store.root}: not an attack-search store")
    names = [e.name for e in store.experiments if e.name.startswith("search.")]
    per = {}
    for n in names:
        pol = n.rsplit(".t", 1)[0]
        per[pol] = per.get(pol, 0) + 1
    keep = {k: v for k, v in ident.items() if k not in ("space", "policies", "base")}
    return SearchConfig(policies=tuple(ident["policies"]), trials=max(per.values(), default=1),
                        base=dict(ident["base"]), **keep)


def load_result(root: str | Path, executor=None) -> SearchResult:
    """The result of the search stored in ``root`` (re-asked from its stored trials; a trial
    or transfer run missing is computed on ``executor``, in-process when None)."""
    from prefixshield.experiments.executors import make_executor

    store = ResultsStore.open(root)
    config = config_of_store(store)
    r = resolve(config)
    store = open_store(root, config, r)
    ex = executor or make_executor("inprocess", None)
    try:
        return run_search(store, config, r, ex)
    finally:
        if executor is None:
            ex.close()


def worst_case_rows(label: str, res: SearchResult) -> list[dict]:
    """Rows of the per-(scheduler, policy) worst-case table: the worst loss at the search
    seeds and held out, the victim's P95 TTFT and P95 queueing delay held out (control ->
    worst), and the attacker's measured block-seconds per second."""
    obj = res.config.objective
    u = loss_unit(obj)
    rows = []
    for pol in res.config.policies:
        t = res.worst[pol]
        held = res.transfer.get(pol, {}).get(pol) if t is not None else None
        if t is None or held is None:
            rows.append({"scheduler": label, "policy": pol, "trials": len(res.trials[pol]),
                         f"worst loss ({u}) [95% CI]": "no feasible trial"})
            continue
        w = t.result
        rows.append({
            "scheduler": label, "policy": pol, "trials": len(res.trials[pol]),
            f"worst loss ({u}) [95% CI]": fmt_loss(_metric(w, obj), obj),
            f"held-out ({u}) [95% CI]": fmt_loss(_metric(held, obj), obj),
            "victim hit ratio held-out: control -> worst":
                f"{100 * held.control_hit:.1f}% -> {100 * held.attack_hit:.1f}%",
            "victim P95 TTFT held-out (s): control -> worst":
                f"{held.p95_ttft - held.ttft_increase[0]:.2f} -> {held.p95_ttft:.2f}",
            "victim P95 queue held-out (s): control -> worst":
                f"{held.control_p95_queue:.2f} -> {held.p95_queue:.2f}",
            "attacker block-s/s (measured)": _block_s_text(w, res.resolved),
            "found at trial": f"{t.number} ({t.source})",
            "what it does": describe(t.fields)})
    return rows
