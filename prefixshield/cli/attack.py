"""Command line: ``prefixshield attack-search`` (registered on the group by
`prefixshield.cli`).

Parses options, calls `prefixshield.experiments.attack_search` and prints; no search logic
lives here.
"""

from __future__ import annotations

import functools
import shlex
import sys

import click
from rich.table import Table

from prefixshield.cli.common import (ALPHA, WORKERS, _policy_names, _refuse_option_keys,
                                     _user_errors, console, count)
from prefixshield.edges import MAX_SEEDS, MAX_TRIALS
from prefixshield.fleet.config import MAX_REPLICAS


def _budget(items: tuple[str, ...]) -> dict:
    """``--budget`` items ``UNIT[=RATE]`` (per second) -> the config's budget fields. The units
    given are the limits that apply (none given: requests, prompt tokens and block-seconds); a
    unit without a rate is at one_touch's level."""
    import math

    from prefixshield.experiments.attack_search import BUDGET_FIELDS, DEFAULT_BUDGET
    from prefixshield.workloads.searched_attack import BUDGET_UNITS

    out: dict = {f: None for f in BUDGET_FIELDS}
    seen = []
    for text in items:
        unit, sep, value = text.partition("=")
        unit = unit.strip()
        if unit not in BUDGET_UNITS or unit in seen:
            raise click.BadParameter(f"expected UNIT[=RATE] with UNIT one of "
                                     f"{', '.join(BUDGET_UNITS)} (each at most once), got "
                                     f"{text!r}", param_hint="--budget")
        seen.append(unit)
        if sep:
            try:
                rate = float(value)
            except ValueError:
                raise click.BadParameter(f"{unit}: expected a number per second, got {value!r}",
                                         param_hint="--budget") from None
            if not (rate > 0 and math.isfinite(rate)):
                raise click.BadParameter(f"{unit}: must be a finite number > 0 per second, got "
                                         f"{value!r}", param_hint="--budget")
            out[f"budget_{unit}"] = rate
    out["budget_limits"] = "+".join(u for u in BUDGET_UNITS if u in seen) or DEFAULT_BUDGET
    return out


def _scheduler_fields(scheduler: str, tenant_limits: tuple[str, ...]) -> dict:
    """``--scheduler`` and ``--tenant-limit KEY=N`` -> the sweep fields ``scheduler`` and
    ``tenant_max_KEY`` (every tenant), checked before any work."""
    from prefixshield.experiments.spec import SCHEDULER_KEYS, SpecError, type_field
    from prefixshield.scheduling import SCHEDULERS

    if scheduler not in SCHEDULERS:
        raise click.BadParameter(f"unknown scheduler {scheduler!r}; known: "
                                 f"{', '.join(SCHEDULERS)}", param_hint="--scheduler")
    out: dict = {"scheduler": scheduler} if scheduler != "fcfs" else {}
    for item in tenant_limits:
        key, sep, value = item.partition("=")
        field = "tenant_" + key.strip()
        if not sep or field not in SCHEDULER_KEYS or field == "tenant_scheduler" or \
                field in out:
            keys = ", ".join(k[len("tenant_"):] for k in SCHEDULER_KEYS if k != "scheduler")
            raise click.BadParameter(f"expected KEY=N with KEY one of {keys} (each at most "
                                     f"once), got {item!r}",
                                     param_hint="--tenant-limit")
        try:
            out[field] = type_field("searched_attack", field, value.strip(), "--tenant-limit")
        except SpecError as e:
            raise click.BadParameter(str(e), param_hint="--tenant-limit") from None
    return out


def _base_fields(num_blocks, vllm_compat, profile, alpha, fixed) -> dict:
    """The fixed fields of every run: engine, profile, load, and ``--set`` fields, each checked
    against every workload the search runs (the victim must be the same in all of them). A
    ``--set`` key that an option of the command sets (``blocks``, ``replicas``, ``router``,
    ``router_key``, ``scheduler``, ``tenant_max_*``, ...) is a ``click.BadParameter`` naming
    that option, as in ``run``: no rule decides which of the two wins."""
    from prefixshield.experiments.attack_search import FIXED_ATTACKS, WORKLOAD
    from prefixshield.experiments.spec import parse_set_option, type_field

    _refuse_option_keys(fixed)
    base = {"blocks": num_blocks, "compat": vllm_compat, "alpha": alpha,
            "profile": type_field(WORKLOAD, "profile", profile, "--profile")}
    space = _space_names()
    for item in fixed:
        key, value = parse_set_option(WORKLOAD, item)
        if key in space or key.startswith("budget") or key in ("attack", "attacker_rate",
                                                               "pressure_ratio"):
            raise click.BadParameter(f"{key} is searched or set by the search itself; --set "
                                     "fixes engine, load and victim fields", param_hint="--set")
        for w in FIXED_ATTACKS:
            parse_set_option(w, item)   # the hand-written attacks must take it too
        base[key] = value
    return base


def _space_names() -> set[str]:
    """Fields the search sets: every dim, and the aim (searched, or fixed by the fleet)."""
    from prefixshield.experiments.attack_space import SPACE

    return {d.name for d in SPACE} | {"aim", "aim_replicas", "aim_blocks"}


def _fleet_fields(replicas, router, router_key) -> dict:
    """``--replicas``/``--router``/``--router-key`` -> the experiment's fleet fields (none
    without ``--replicas``), checked as ``run`` checks them."""
    from prefixshield.cli.common import _fleet_config

    fleet = _fleet_config(replicas, router, None, None, router_key, None)
    if fleet is None:
        return {}
    out = {"replicas": fleet.replicas, "router": fleet.router.name}
    if router_key is not None:
        out["router_key"] = router_key
    return out


_BASE_OPTIONS = ("num_blocks", "vllm_compat", "profile", "alpha", "fixed", "scheduler",
                 "tenant_limits", "replicas", "router", "router_key")
"""The command's options that become the config's ``base`` (see `_base`)."""


def _base(num_blocks, vllm_compat, profile, alpha, fixed, scheduler, tenant_limits, replicas,
          router, router_key) -> dict:
    """The fixed fields of every run from the engine, load, ``--set``, scheduler and fleet
    options (`_base_fields`, `_scheduler_fields`, `_fleet_fields`, checked in that
    order)."""
    return {**_base_fields(num_blocks, vllm_compat, profile, alpha, fixed),
            **_scheduler_fields(scheduler, tenant_limits),
            **_fleet_fields(replicas, router, router_key)}


def _search_config(fn):
    """Build the command's
    [`SearchConfig`][prefixshield.experiments.attack_search.SearchConfig] once, from its search,
    budget, engine, load, scheduler and fleet options, and hand it to the command as one
    ``config`` argument (as `prefixshield.cli.common.run_options` hands ``run`` its
    [`RunOptions`][prefixshield.experiments.options.RunOptions]); ``--out`` and the executor
    options pass through. Checks ``--budget``, then the base fields (`_base`), then the
    config; a bad value is one line, naming its option where the check is this module's.
    Apply under `_user_errors`.

    Not `run_options` itself: attack-search's options of the same names have their own
    defaults and help (``--blocks`` 512, no ``auto``), and become a search's sweep fields
    (``base``), not one run's engine."""
    @functools.wraps(fn)
    def wrapper(*args, policies, budget_items, trials, seeds, eval_seeds, objective, sampler,
                sampler_seed, batch, warm_start, **kwargs):
        from prefixshield.experiments import attack_search as AS

        budget = _budget(budget_items)
        base = _base(**{name: kwargs.pop(name) for name in _BASE_OPTIONS})
        config = AS.SearchConfig(policies=_policy_names(policies), trials=trials, seeds=seeds,
                                 eval_seeds=seeds if eval_seeds is None else eval_seeds,
                                 objective=objective, **budget,
                                 sampler=sampler, sampler_seed=sampler_seed, batch=batch,
                                 warm_start=warm_start, base=base)
        return fn(*args, config=config, **kwargs)
    return wrapper


@click.command("attack-search")
@click.option("--policy", "-p", "policies", multiple=True, default=("all",), show_default=True,
              help="Policies to search against (names, 'all', or NAME:KEY=VALUE specs); each "
                   "gets its own search.")
@click.option("--budget", "budget_items", multiple=True, metavar="UNIT[=RATE]",
              help="A limit of the attacker's budget, the same for every policy: requests=R "
                   "(requests/s), prompt_tokens=R (prompt tokens/s), tokens=R (prompt + output "
                   "tokens/s) or block_s=R (KV block-seconds/s); repeatable. A unit without a "
                   "rate is at one_touch's level: the one-touch flood rate, min(0.75 "
                   "C_prefill, 1.15 base rate), in requests or tokens, and one_touch's "
                   "block-seconds/s measured under LRU at this setup [default: requests, "
                   "prompt_tokens and block_s, each at that level]. '--budget prompt_tokens' "
                   "alone is the prompt-token budget of earlier versions.")
@click.option("--scheduler", default="fcfs", show_default=True, metavar="NAME",
              help="The engine's scheduler in every run: fcfs, priority, vtc or kvtc (part of "
                   "the search's identity: one store per scheduler).")
@click.option("--tenant-limit", "tenant_limits", multiple=True, metavar="KEY=N",
              help="A per-tenant admission limit of every tenant in every run: max_running, "
                   "max_blocks or max_output_tokens. Repeatable.")
@click.option("--replicas", type=count(1, MAX_REPLICAS), default=None,
              help="Search against a fleet of N engines behind --router (every run, controls "
                   "and hand-written attacks included; part of the search's identity). The "
                   "aim the router reads is searched (docs/attack-search.md). Without it: one "
                   "engine.")
@click.option("--router", default=None, metavar="NAME",
              help="With --replicas: round_robin (default), random, session, least_loaded, "
                   "prefix_affinity or kv_aware.")
@click.option("--router-key", type=click.Choice(["prefix", "group"]), default=None,
              help="session: hash the group and prefix_id, or the group alone [default: "
                   "prefix].")
@click.option("--trials", type=count(1, MAX_TRIALS), default=200, show_default=True,
              help="Trials per policy (a rerun with more extends the search).")
@click.option("--seeds", type=count(1, MAX_SEEDS), default=5, show_default=True,
              help="Paired seeds per trial (0..N-1): the victim trace the loss is paired on.")
@click.option("--eval-seeds", type=count(1, MAX_SEEDS), default=None,
              help="Held-out seeds of the transfer check (N..N+E-1) [default: --seeds].")
@click.option("--objective", type=click.Choice(["hit_ratio", "p95_ttft"]), default="hit_ratio",
              show_default=True,
              help="Maximize the victim's paired hit-ratio loss, or its P95 TTFT increase.")
@click.option("--sampler", type=click.Choice(["tpe", "cmaes"]), default="tpe",
              show_default=True, help="optuna sampler.")
@click.option("--sampler-seed", type=count(0, 2 ** 32 - 1), default=0, show_default=True,
              help="The sampler's seed (same seed: same trials).")
@click.option("--batch", type=count(1, MAX_TRIALS), default=4, show_default=True,
              help="Trials asked per policy per round (part of what fixes the trials).")
@click.option("--warm-start/--no-warm-start", default=True, show_default=True,
              help="Start each search at the hand-written attacks mapped into the space.")
@click.option("--blocks", "num_blocks", type=count(2), default=512, show_default=True,
              help="KV blocks configured, null block included.")
@click.option("--compat", "vllm_compat", type=click.Choice(["0.10", "current"]),
              default="current", show_default=True, help="vLLM compat mode.")
@click.option("--profile", default="l4-qwen2.5-1.5b", show_default=True,
              help="Cost-model profile.")
@click.option("--alpha", type=ALPHA, default=0.6, show_default=True,
              help="Nominal load of the victim (base rate = alpha x C_prefill).")
@click.option("--set", "fixed", multiple=True, metavar="KEY=VALUE",
              help="A fixed engine, load or victim field of every run (e.g. duration_s=30); "
                   "attack-space fields are what the search chooses.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True,
              help="Results store and report folder (a rerun resumes).")
@click.option("--executor", type=click.Choice(["process", "inprocess", "ray"]),
              default="process", show_default=True, help="Where runs execute.")
@click.option("--workers", type=WORKERS, default=None,
              help="Process-pool workers (or local Ray CPUs) [default: one per core].")
@click.option("--address", default=None, help="Ray cluster address (with --executor ray).")
@_user_errors
@_search_config
def attack_search(config, out_dir, executor, workers, address):
    """Find, per policy, the attack that hurts the victim most under a fixed attacker budget.

    \b
    Examples:
      prefixshield attack-search --policy lru --trials 50 --seeds 3 --out results/as-lru
      prefixshield attack-search --budget requests=0.5 --budget prompt_tokens=800 \\
          --objective p95_ttft --out results/as
      prefixshield attack-search --scheduler vtc --trials 200 --out results/as-vtc
      prefixshield attack-search -p lru --replicas 8 --router prefix_affinity --out r/as-pa

    An optuna search (seeded; trials in rounds, told in trial order) over the searched_attack
    space maximizes the victim's paired loss against the no-attack control. Every trial's runs
    are cells of a results store in --out: a killed search rerun with the same arguments
    resumes and ends identical. Prints and writes (tables/, figures/, attack_search.md) the
    worst-case table, with the hand-written attacks at the same budget, and the transfer matrix:
    each policy's worst attack against every policy on held-out seeds.
    """
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn, TimeRemainingColumn)

    from prefixshield.experiments import attack_search as AS
    from prefixshield.experiments.executors import make_executor

    from prefixshield.experiments.cells import check_policy_specs

    check_policy_specs(config.policies, config.base)  # before the store, not once per trial
    AS._import_optuna()
    with console.status("measuring the load and the budget..."):
        resolved = AS.resolve(config)
    store = AS.open_store(out_dir, config, resolved, command="prefixshield " + " ".join(
        shlex.quote(a) for a in sys.argv[1:]))
    for line in AS.header_lines(_Preview(config, resolved)):
        console.print(line)
    ex = make_executor(executor, workers, address)
    try:
        with Progress(TextColumn("[bold]attack-search"), BarColumn(), MofNCompleteColumn(),
                      TextColumn("traces"), TimeElapsedColumn(), TextColumn("ETA"),
                      TimeRemainingColumn(), console=console,
                      transient=not sys.stdout.isatty()) as progress:
            bar = progress.add_task("search", total=None)

            def on_progress(done, total):
                progress.update(bar, completed=done, total=total)

            res = AS.run_search(store, config, resolved, ex, on_progress=on_progress)
    finally:
        ex.close()
    _print(res)
    written = AS.write_outputs(out_dir, res)
    console.print(f"wrote {len(written)} files (tables/, figures/, attack_search.md) to "
                  f"{out_dir}/")
    lost = [p for p, w in res.worst.items() if w is None]
    if lost:  # a search with nothing found is a failure, not a result
        first = next((t.result.failed for p in lost for t in res.trials.get(p, [])
                      if t.result.failed), "no trial ran")
        raise click.ClickException(f"every trial failed against {', '.join(lost)} (first "
                                   f"error: {first})")


class _Preview:
    """The config and resolved budget in the shape `header_lines` reads."""

    def __init__(self, config, resolved) -> None:
        self.config, self.resolved = config, resolved


def _print(res) -> None:
    """The worst-case table (its main columns; the written tables have all), the worst attacks
    in words, their eviction matrices and the transfer matrix."""
    from prefixshield.experiments import attack_search as AS

    u = AS.loss_unit(res.config.objective)
    worst = AS.worst_case_table(res)
    main_cols = [c for c in worst.columns if not c.startswith(("evicted", "worst: "))]
    ev_cols = ["policy"] + [c for c in worst.columns if c.startswith("evicted")]
    attacks = AS.worst_attacks_table(res)
    for title, df in (
            (f"worst case per policy ({res.config.objective}, {u}; search seeds, 95% bootstrap "
             "CI over seeds; held-out: the same attack on held-out seeds)", worst[main_cols]),
            ("the worst attacks", attacks[["policy", "trial", "what it does"]]
             if not attacks.empty else None),
            ("evictions under the worst attack (mean blocks per run, requester->owner)",
             worst[ev_cols] if len(ev_cols) > 1 else None),
            (f"transfer: worst attack found against ROW run against COLUMN (held-out seeds, "
             f"{u})", AS.transfer_table(res))):
        if df is None or df.empty:
            continue
        table = Table(title=title)
        for col in df.columns:
            table.add_column(str(col), overflow="fold")
        for _, r in df.iterrows():
            table.add_row(*[str(r[c]) for c in df.columns])
        console.print(table)
