"""The whole evaluation as one list of experiments (what ``reproduce`` runs).

Default setup mirrors the reference: ``compat 0.10``, the ``l4-qwen2.5-1.5b`` profile, 10 paired
runs (seeds 0-9), 512 blocks, alpha 0.6, each workload at its own defaults. ``quick`` keeps every
experiment and point and shrinks only the number of seeds (3) and the measured phase (at most
20 s: each workload's default where that is shorter), for CI: its tables have the same shape,
with wider CIs.
"""

from __future__ import annotations

from typing import Any

from prefixshield.experiments.spec import Experiment

ALL = ("lru", "s3fifo", "static_quota", "prefixshield")
ATTACKS = ("one_touch", "low_and_slow", "two_pass_replay")
BENIGN = ("sharegpt", "bursty_sharegpt")
GPU_PROFILES = ("l4-qwen2.5-1.5b", "a100-qwen2.5-1.5b", "a100-qwen2.5-7b", "h200-qwen2.5-7b")
QUICK_SEEDS = 3
QUICK_DURATION_S = 20.0
READINGS = (
    ("prefixshield", "as designed: per-request admission, root prefix, decode blocks charged"),
    ("prefixshield:admission=call", "admission per scheduler call"),
    ("prefixshield:prefix_source=declared", "logical prefix: the trace's declared prefix_id"),
    ("prefixshield:prefix_source=tenant", "logical prefix: one per tenant"),
    ("prefixshield:charge_decode=false", "decode blocks not charged"),
)
"""PrefixShield's readings of what its design leaves open: (policy spec, what it reads)."""
TENANT_MAX_RUNNING = 8
"""The per-tenant cap of the scheduler table: at most 8 running requests per tenant (a
gateway-style concurrency limit; not from a reference: the table shows what it costs benign
traffic)."""
SCHEDULER_SETTINGS = (
    ("fcfs", "fcfs", {}),
    ("vtc", "vtc", {"scheduler": "vtc"}),
    ("cap", f"fcfs, tenant_max_running={TENANT_MAX_RUNNING}",
     {"tenant_max_running": TENANT_MAX_RUNNING}),
    ("kvtc", "kvtc", {"scheduler": "kvtc"}),
)
"""(key, label, sweep fields) of the schedulers the evaluation compares: vLLM's default, the
Virtual Token Counter (its default weights), FCFS with a per-tenant concurrency cap and KVTC
(VTC charged also for KV block-seconds held; its default weights and capacity price)."""
SCHEDULER_BENIGN = ("sharegpt", "borrowing")
"""The benign workloads run under every scheduler (fcfs: the benign and borrowing tables')."""
SEARCH_TRIALS, SEARCH_SEEDS = 200, 5
"""The worst-case searches of the full evaluation: trials per policy, search (and held-out)
seeds."""
QUICK_SEARCH_TRIALS, QUICK_SEARCH_SEEDS = 3, 2
"""``--quick``: the warm start only (the hand-written attacks mapped into the space), 2 seeds."""
FLEET_REPLICAS = 8
"""Replicas of the fleet table (each a 512-block engine)."""
FLEET_ROUTERS = ("round_robin", "random", "session", "least_loaded", "prefix_affinity",
                 "kv_aware")
"""Routers of the fleet table (all registered ones)."""
FLEET_AIMS = (("session", ("session",)), ("prefix", ("prefix_affinity", "kv_aware")))
"""(one_touch ``aim``, the routers it is aimed at): each router that reads something an
attacker can choose is attacked by the aim that steers what it reads (session ids; prompt
content or the cache it fills). The others (round robin, random, least loaded) read neither:
against them an aimed attacker is the spread one, so the table has no aimed run for them."""
READING_CASES = (("one_touch", "lru", (512, 4096)), ("low_and_slow", "lru", (512,)),
                 ("sharegpt", "s3fifo", (512,)))
"""The readings table's cases: (workload, the baseline PrefixShield is compared with, blocks)."""
WORKLOAD_READINGS = (
    ("two_group", {"population": "two_group"},
     "workload: the two-group population (the victim sends the whole base load; its own "
     "fitted defaults)"),
    ("template", {"template_tokens": 32},
     "workload: 98-block hot prefixes (a cached two-block template after each prefix)"),
)
"""Readings of the *workload* the reference leaves open, each as (key, the workload fields it
sets, what it reads): the table gives PrefixShield - baseline under each on the attack cases
(the default population's row is the default reading's)."""
CAPACITY_READINGS = (
    ("prefixes", {}, "hot set grown by more 96-block prefixes (default), background population"),
    ("template", {"template_tokens": 32},
     "hot set of 98-block prefixes (a cached two-block template each), background population"),
    ("two_group", {"population": "two_group"},
     "hot set grown by more 96-block prefixes, two-group population"),
)
"""How the capacity sweep's hot set grows to the reference's 76.6% of usable blocks, under
each population: (key, workload fields, what it reads); PrefixShield - LRU at every size."""
CAPACITIES = (512, 1024, 2048, 4096)


def _default_duration(workload: str) -> float:
    """The measured phase of ``workload`` at its defaults (seconds)."""
    from prefixshield.workloads import WORKLOADS

    return WORKLOADS[workload].params_type().duration_s


def reproduce_experiments(quick: bool = False, seeds: int | None = None,
                          compat: str = "0.10", profile: str = "l4-qwen2.5-1.5b") -> list[Experiment]:
    """The experiments of the evaluation, in report order.

    Args:
        quick: 3 seeds and a 20 s measured phase (CI); the full run uses 10 seeds and each
            workload's own duration.
        seeds: number of paired seeds (overrides the default of the mode).
        compat: vLLM compat mode of every engine.
        profile: cost-model profile of every experiment but the profile sweep.
    """
    from prefixshield.workloads.one_touch import PRESSURE_SWEEP, PRESSURE_SWEEP_DURATION_S

    n = seeds if seeds is not None else (QUICK_SEEDS if quick else 10)
    seed_list = tuple(range(n))
    base = {"compat": compat, "profile": profile}
    no_profile = {k: v for k, v in base.items() if k != "profile"}

    def exp(name, workload, policies, title, grid=(), base_extra=None, b=None, **kw):
        settings = {**(b if b is not None else base), **(base_extra or {})}
        if quick:  # a shorter measured phase, never a longer one
            settings["duration_s"] = min(QUICK_DURATION_S, settings.get(
                "duration_s", _default_duration(workload)))
        return Experiment(name=name, workload=workload, policies=tuple(policies),
                          seeds=seed_list, base=settings,
                          grid=tuple(grid), title=title, **kw)

    out: list[Experiment] = []
    for w in ATTACKS:
        out.append(exp(f"attack-{w}", w, ALL, f"{w}: attack and no-attack control",
                       grid=[("attack", (True, False))]))
    for w in BENIGN:
        out.append(exp(f"benign-{w}", w, ALL, f"{w}: benign multi-tenant traffic"))
    out.append(exp("borrowing", "borrowing", ALL, "borrowing: an active and an idle tenant"))
    out.append(exp("sweep-capacity", "one_touch", ALL,
                   "one_touch: capacity sweep (C_prefill of the reference pool at every size)",
                   grid=[("blocks", CAPACITIES)],
                   base_extra={"c_prefill_basis": "reference"}))
    out.append(exp("sweep-pressure", "one_touch", ALL,
                   f"one_touch: creation-pressure sweep over a {PRESSURE_SWEEP_DURATION_S:g} s "
                   f"window (designed pressure_ratio "
                   f"{' / '.join(f'{d:g}' for _, d in PRESSURE_SWEEP)}: the reference's "
                   f"measured 0.54 / 1.02 / 2.14 / 4.23 for its 0.5 / 1 / 2 / 4)",
                   grid=[("pressure_ratio", tuple(d for _, d in PRESSURE_SWEEP))],
                   base_extra={"duration_s": PRESSURE_SWEEP_DURATION_S}))
    out.append(exp("sweep-pressure-low_and_slow", "low_and_slow", ALL,
                   "low_and_slow (not the reference's sweep, which is one-touch): "
                   "creation-pressure sweep (attacker creation / its refill)",
                   grid=[("pressure_ratio", (0.5, 1.0, 2.0, 4.0))]))
    out.append(exp("sweep-load", "one_touch", ALL, "one_touch: load sweep",
                   grid=[("alpha", (0.4, 0.6, 0.8))]))
    out.append(exp("sweep-profile", "one_touch", ALL, "one_touch: profile sweep",
                   grid=[("profile", GPU_PROFILES)], b=no_profile))
    for w in (*ATTACKS, "sharegpt"):
        out.append(exp(f"ablation-segmentation-{w}", w,
                       ("lru", "prefixshield", "prefixshield:segmentation=false"),
                       f"{w}: PrefixShield with and without retention classes"))
    out.append(exp("ablation-delayed-replay", "delayed_replay",
                   ("lru", "prefixshield", "prefixshield:debt_gate=false"),
                   "delayed_replay: the debt gate on and off",
                   grid=[("wait_factor", (0.0, 0.5, 1.0))]))
    for w, baseline, blocks in READING_CASES:
        out.append(exp(f"readings-{w}", w, (baseline, *(spec for spec, _ in READINGS)),
                       f"{w}: PrefixShield's readings against {baseline}",
                       grid=[("blocks", blocks)] if len(blocks) > 1 else (),
                       base_extra={} if len(blocks) > 1 else {"blocks": blocks[0]}))
    for key, fields, what in WORKLOAD_READINGS:
        for w, baseline, blocks in READING_CASES:
            if w == "sharegpt":  # the population is the attack workloads'
                continue
            out.append(exp(f"readings-workload-{key}-{w}", w, (baseline, "prefixshield"),
                           f"{w}: {what}",
                           grid=[("blocks", blocks)] if len(blocks) > 1 else (),
                           base_extra={**fields, **({} if len(blocks) > 1
                                                    else {"blocks": blocks[0]})}))
    for key, fields, what in CAPACITY_READINGS:
        out.append(exp(f"readings-capacity-{key}", "one_touch", ("lru", "prefixshield"),
                       f"one_touch capacity reading: {what}", grid=[("blocks", CAPACITIES)],
                       base_extra={"c_prefill_basis": "reference", **fields}))
    for key, _, fields in SCHEDULER_SETTINGS[1:]:
        for w in SCHEDULER_BENIGN:
            out.append(exp(f"sched-{key}-{w}", w, ALL, f"{w} under {key}", base_extra=fields))
    # every router even in --quick: the whole fleet grid at 3 seeds costs ~20 s of one core
    out.append(exp("fleet-attack", "one_touch", ALL,
                   f"one_touch over {FLEET_REPLICAS} replicas: spread attacker",
                   grid=[("router", FLEET_ROUTERS)],
                   base_extra={"replicas": FLEET_REPLICAS, "aim": "none"}))
    for aim, routers in FLEET_AIMS:
        out.append(exp(f"fleet-aimed-{aim}", "one_touch", ALL,
                       f"one_touch over {FLEET_REPLICAS} replicas: attacker aimed by {aim}",
                       grid=[("router", routers)],
                       base_extra={"replicas": FLEET_REPLICAS, "aim": aim,
                                   **({"aim_replicas": FLEET_REPLICAS}
                                      if aim == "session" else {})}))
    out.append(exp("fleet-control", "one_touch", ALL,
                   f"one_touch over {FLEET_REPLICAS} replicas: no attack",
                   grid=[("router", FLEET_ROUTERS)],
                   base_extra={"replicas": FLEET_REPLICAS, "attack": False}))
    out.append(Experiment(name="overhead", workload="-", policies=ALL, seeds=(0,),
                          grid=(("blocks", (512, 4096)), ("groups", (8, 32))),
                          kind="overhead",
                          title="victim-selection latency and policy state"))
    return out


REPRODUCE_SECTIONS = {
    "attack": [f"attack-{w}" for w in ATTACKS],
    "benign": [f"benign-{w}" for w in BENIGN],
    "borrowing": ["borrowing"],
    "sweeps": ["sweep-capacity", "sweep-pressure", "sweep-pressure-low_and_slow", "sweep-load",
               "sweep-profile"],
    "ablation-segmentation": [f"ablation-segmentation-{w}" for w in (*ATTACKS, "sharegpt")],
    "ablation-delayed-replay": ["ablation-delayed-replay"],
    "readings": [f"readings-{w}" for w, _, _ in READING_CASES]
    + [f"readings-workload-{k}-{w}" for k, _, _ in WORKLOAD_READINGS
       for w, _, _ in READING_CASES if w != "sharegpt"],
    "readings-capacity": [f"readings-capacity-{k}" for k, _, _ in CAPACITY_READINGS],
    "schedulers": ["benign-sharegpt", "borrowing",
                   *[f"sched-{k}-{w}" for k, _, _ in SCHEDULER_SETTINGS[1:]
                     for w in SCHEDULER_BENIGN]],
    "fleet": ["fleet-control", "fleet-attack", *[f"fleet-aimed-{a}" for a, _ in FLEET_AIMS]],
    "overhead": ["overhead"],
}
"""Report sections and the experiments each draws on."""


def worst_case_searches(quick: bool = False, compat: str = "0.10",
                        profile: str = "l4-qwen2.5-1.5b") -> list[tuple[str, str, Any]]:
    """The attack searches of the worst-case table, one per scheduler setting:
    ``(key, label, SearchConfig)``, every policy, the default budget (requests, prompt tokens
    and KV block-seconds at one_touch's level), 512 blocks, alpha 0.6. Each runs into
    ``OUT/attack-search/<key>/`` (its own resumable store)."""
    from prefixshield.experiments.attack_search import SearchConfig

    trials, seeds = ((QUICK_SEARCH_TRIALS, QUICK_SEARCH_SEEDS) if quick
                     else (SEARCH_TRIALS, SEARCH_SEEDS))
    out = []
    for key, label, fields in SCHEDULER_SETTINGS:
        base = {"blocks": 512, "compat": compat, "alpha": 0.6, "profile": profile, **fields}
        out.append((key, label, SearchConfig(policies=ALL, trials=trials, seeds=seeds,
                                             eval_seeds=seeds, base=base)))
    return out
