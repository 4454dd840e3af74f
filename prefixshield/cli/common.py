"""What every command of the command line shares: the console, the error handling, the policy
and workload option parsing, and how a command loads its modules.

The command modules (`run`, `trace`, `live`, `experiments`,
`attack`, `bench`) import this module; it imports none of them.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import sys

from prefixshield.machine import START_ENV  # noqa: E402  (imports nothing heavy)

for _name, _value in START_ENV.items():
    os.environ.setdefault(_name, _value)

import click  # noqa: E402
from rich.console import Console  # noqa: E402

# SEED is re-exported: the command modules take their option types from here.
from prefixshield.edges import MAX_WORKERS, SEED, count, finite  # noqa: E402,F401
from prefixshield.edges import DEFAULT_AUTO_FRACTION, AutoBlocks  # noqa: E402
# light: the defaults the options show are read from these dataclasses (written once there)
from prefixshield.experiments.options import (CONTRACT_MODES, C_PREFILL_BASES,  # noqa: E402
                                              DEFAULT_ALPHA, DEFAULT_PROFILE, RunOptions,
                                              default_of, engine_config)
from prefixshield.scheduling.config import SchedulerConfig  # noqa: E402
from prefixshield.simulator.config import EngineConfig  # noqa: E402


def _make_console() -> Console:
    """The CLI's console: piped output (CI logs, files) gets a wide fixed width so tables are not
    squeezed to 80 columns; without colours, no highlighting."""
    width = None if sys.stdout.isatty() else 160
    out = Console(width=width)
    if out.color_system is None:
        # Without a colour system highlighting only computes styles that are never written (the
        # text is identical); compiling rich's highlighter regexes and matching them cost ~5 ms
        # of the ~0.1 CPU-s our own code takes in `prefixshield run`.
        out = Console(width=width, highlight=False)
    return out


console = _make_console()

POSITIVE = count(1)
"""A positive integer option (at most `prefixshield.edges.MAX_INT`)."""
ALPHA = finite(0, 100, min_open=True)
"""Nominal load: > 0 and at most 100 x C_prefill (a rate the simulator can still hold)."""
WORKERS = count(1, MAX_WORKERS)
"""Executor workers."""

# Errors that are the user's input, not our bugs: shown as one line.
_USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, KeyError, FileNotFoundError,
                                                 OSError)


def _user_errors(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with _loading():  # numpy, pandas, simpy, numba
            from prefixshield.simulator.engine import EngineError

        try:
            return fn(*args, **kwargs)
        except (EngineError, *_USER_ERRORS) as e:
            msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
            raise click.ClickException(msg) from None
    return wrapper


def _policy_names(values: tuple[str, ...]) -> tuple[str, ...]:
    """Expand 'all' and comma-separated lists that mix plain names and specs with constructor
    arguments: ``lru,prefixshield:segmentation=false,debt_gate=false,s3fifo`` is three policies
    (a comma starts a new policy unless what follows is a ``key=value`` of the spec before)."""
    from prefixshield.policies import POLICIES

    names: list[str] = []
    for v in values:
        specs: list[str] = []
        for part in v.split(","):
            part = part.strip()
            if not part:
                continue
            head = part.partition(":")[0]
            if specs and ":" in specs[-1] and "=" in part and ":" not in part \
                    and head not in POLICIES:
                specs[-1] += "," + part  # another key=value of the previous spec
            else:
                specs.append(part)
        for name in specs:
            if name == "all":
                names.extend(sorted(POLICIES))
            else:
                names.append(name)
    return tuple(dict.fromkeys(names))


def _workload_overrides(workload: str, overrides: tuple[str, ...]) -> dict:
    """Check WORKLOAD (a generated workload or a trace file) and type its ``--set`` items."""
    from prefixshield.experiments.overrides import parse_overrides
    from prefixshield.experiments.single import is_trace_file
    from prefixshield.workloads import WORKLOADS

    if not is_trace_file(workload) and workload not in WORKLOADS:
        raise click.BadParameter(f"unknown workload {workload!r}; known: {_workload_names()} "
                                 "(or a .parquet trace file)", param_hint="WORKLOAD")
    if not overrides:
        return {}
    if is_trace_file(workload):
        raise click.BadParameter("--set applies to generated workloads, not trace files",
                                 param_hint="--set")
    _refuse_option_keys(overrides)
    return parse_overrides(WORKLOADS[workload].params_type, overrides)


_OPTION_ALIASES = {"num_blocks": "blocks", "seed": "seeds",
                   "tenant_max_running": "tenant_limit", "tenant_max_blocks": "tenant_limit",
                   "tenant_max_output_tokens": "tenant_limit"}
"""``--set`` keys that name an option by its field name rather than its option name (``seed``:
the paired commands set seeds with ``--seeds``; ``tenant_max_*``: ``--tenant-limit``)."""


def _refuse_option_keys(overrides: tuple[str, ...]) -> None:
    """Refuse a ``--set KEY`` that one of the running command's own options sets (``seed``,
    ``blocks``/``num_blocks``, ``block_size``, ``alpha``, ``tenant_max_*``; in attack-search
    also ``replicas``, ``router``, ``router_key``, ``scheduler``; and any option added later):
    the trace would be built for another setup than the header, the engine and ``config.json``
    record. Driven by the command's declared click options (and `_OPTION_ALIASES`), not
    by a list; the ``click.BadParameter`` names the option and its metavar."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return
    options = {}
    for p in ctx.command.params:
        if isinstance(p, click.Option):
            for opt in p.opts:
                options[opt.lstrip("-").replace("-", "_")] = (opt, p.metavar)
            if p.name:
                options.setdefault(p.name, (p.opts[0], p.metavar))
    options.pop("set", None)
    for item in overrides:
        key = item.partition("=")[0].strip()
        opt, metavar = options.get(key) or options.get(_OPTION_ALIASES.get(key, ""), (None, None))
        if opt:
            raise click.BadParameter(f"{key} is set by {opt}, not --set (use {opt} "
                                     f"{metavar or 'VALUE'})", param_hint="--set")


def _workload_names() -> str:
    from prefixshield.workloads import WORKLOADS

    return ", ".join(sorted(WORKLOADS))


class _Program(click.Group):
    """The top-level group. Called as the program -- the console script and ``python -m
    prefixshield`` call ``main()`` -- it runs the command and ends the process with the
    command's own status through `prefixshield.exitcode.leave`: threads joined, every
    ``atexit`` handler run and the standard streams flushed, then ``os._exit`` before the
    interpreter's teardown, where a native thread still finishing its work could abort a command
    that had succeeded (exit 134). Called with ``standalone_mode=False`` it returns, or raises,
    as any click group does, and `click.testing.CliRunner` (which calls ``main.main()``)
    is not touched at all.
    """

    running = False
    """Set once the program runs: `_loading` pauses the collector only then."""

    def __call__(self, *args, **kwargs):
        _Program.running = True
        if not kwargs.get("standalone_mode", True):
            return super().__call__(*args, **kwargs)
        from prefixshield import exitcode

        try:
            super().__call__(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 -- SystemExit is how click returns
            status = exitcode.status_of(exc)
        else:
            status = 0
        exitcode.leave(status)


@contextlib.contextmanager
def _loading():
    """Import a command's modules with the collector paused, then freeze what they built.

    Loading numpy, pandas, numba, simpy and our modules builds ~170,000 objects that live until
    the process exits; with the collector on, ``prefixshield run`` collected ~370 times while they
    loaded (twice over all of them), ~0.1 CPU-s, to find ~800 objects of garbage. Paused while
    they load and moved out of the collector's reach after (``gc.freeze()``), they cost no
    collection; what a command builds later is collected as usual. Only as the program (see
    `_Program`); in-process callers such as CliRunner keep their collector as it is.
    """
    if not (_Program.running and gc.isenabled()):
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()


def _load_numba_target() -> None:
    """Load numba's CPU target, as a command's first kernel call (compiled or from the cache)
    would: its registries and the ``scipy.linalg`` it imports to probe BLAS are ~56,000 objects
    more, loaded here under `_loading` (~110 collections fewer in `prefixshield run`)."""
    from numba.core.registry import cpu_target

    cpu_target.target_context.refresh()



class _Blocks(click.ParamType):
    """``--blocks``: an integer >= 2 (`prefixshield.edges.MAX_INT` at most), or
    ``auto[:FRACTION]`` (a `prefixshield.experiments.sizing.AutoBlocks`, sized from the
    trace file when it is read)."""

    name = "N|auto[:F]"

    def convert(self, value, param, ctx):
        if not isinstance(value, str) or not value.strip().lower().startswith("auto"):
            return count(2).convert(value, param, ctx)
        head, sep, frac = value.strip().partition(":")
        if head.lower() != "auto":
            self.fail(f"expected an integer >= 2 or auto[:FRACTION], got {value!r}", param, ctx)
        try:
            f = float(frac) if sep else DEFAULT_AUTO_FRACTION
            return AutoBlocks(f)
        except ValueError as e:
            msg = str(e) if "FRACTION" in str(e) else f"FRACTION must be a number, got {frac!r}"
            self.fail(msg, param, ctx)


def _engine_options(fn):
    opts = [
        click.option("--blocks", "num_blocks", type=_Blocks(),
                     default=default_of(EngineConfig, "num_blocks"),
                     show_default=True,
                     help="KV blocks configured, null block included (usable = blocks - 1); "
                          "or, for a trace file, auto[:FRACTION]: FRACTION x the trace's "
                          "unique blocks (distinct block hashes of its prompts and outputs) + "
                          f"1 [FRACTION default: {DEFAULT_AUTO_FRACTION:g}], raised if needed "
                          "to the smallest pool in which every request can be admitted under "
                          "every policy given (the run prints how it sized the pool)."),
        click.option("--block-size", type=POSITIVE, default=default_of(EngineConfig, "block_size"),
                     show_default=True, help="Tokens per KV block."),
        click.option("--compat", "vllm_compat", type=click.Choice(["0.10", "current"]),
                     default=default_of(EngineConfig, "vllm_compat"), show_default=True,
                     help="vLLM free-queue/admission semantics to reproduce."),
        click.option("--max-num-seqs", type=POSITIVE,
                     default=default_of(EngineConfig, "max_num_seqs"), show_default=True,
                     help="Most running requests per step."),
        click.option("--max-num-batched-tokens", type=POSITIVE,
                     default=default_of(EngineConfig, "max_num_batched_tokens"),
                     show_default=True,
                     help="Token budget per step (chunked prefill)."),
        click.option("--profile", default=DEFAULT_PROFILE, show_default=True,
                     help="Cost-model profile: a shipped name (see `prefixshield profiles`) or "
                          "a .toml path."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def _scheduler_options(fn):
    """``--scheduler``, ``--priority``, ``--vtc-weights``, ``--tenant-limit``: the engine's
    scheduling policy and per-tenant limits, handed to the command as one ``scheduler``
    argument (a `SchedulerConfig`). Bad values are a one-line
    error naming the option before any work; a group the trace does not have is one when the
    trace is built."""
    @functools.wraps(fn)
    def wrapper(*args, scheduler, priorities, vtc_weights, tenant_limits, **kwargs):
        return fn(*args, scheduler=_scheduler_config(scheduler, priorities, vtc_weights,
                                                    tenant_limits), **kwargs)

    opts = [
        click.option("--scheduler", default=default_of(SchedulerConfig, "name"),
                     show_default=True, metavar="NAME",
                     help="Scheduling policy of the engine: fcfs (vLLM's default), priority "
                          "(vLLM's priority policy; see --priority), vtc (Virtual Token "
                          "Counter: the least-served waiting tenant first) or kvtc (VTC "
                          "charged also for the KV block-seconds a tenant holds)."),
        click.option("--priority", "priorities", multiple=True, metavar="GROUP=N",
                     help="With --scheduler priority: GROUP's priority (lower is served "
                          "first, as in vLLM; groups not named have 0). Repeatable."),
        click.option("--vtc-weights", default=None, metavar="IN,OUT[,KV]",
                     help="With --scheduler vtc or kvtc: the counter's weight of a prompt token "
                          "and of an output token [default: 1,2]; with kvtc, KV: of one "
                          "block-second held [default: the engine's capacity price]."),
        click.option("--tenant-limit", "tenant_limits", multiple=True,
                     metavar="[GROUP:]KEY=N",
                     help="A per-tenant admission limit, for GROUP or (no GROUP) every group: "
                          "max_running (requests), max_blocks (blocks held by running "
                          "requests, checked at admission), max_output_tokens (per request). "
                          "Repeatable; works with every scheduler."),
    ]
    for opt in reversed(opts):
        wrapper = opt(wrapper)
    return wrapper


EXECUTOR_NAMES = ("process", "inprocess", "ray")
"""The ``--executor`` choices (`prefixshield.experiments.executors.EXECUTORS`, not
imported here: the CLI's start stays light)."""


def executor_options(default: str, what: str):
    """A decorator adding ``--executor`` (default ``default``), ``--workers`` and ``--address``
    to a command; ``what`` ends the ``--executor`` help ("Where ... run")."""
    opts = [
        click.option("--executor", type=click.Choice(list(EXECUTOR_NAMES)), default=default,
                     show_default=True,
                     help=f"Where {what} run: a local process pool, this process, or Ray."),
        click.option("--workers", type=WORKERS, default=None,
                     help="Process-pool workers (or local Ray CPUs) [default: one per core]."),
        click.option("--address", default=None,
                     help="Ray cluster address (with --executor ray) [default: a local Ray]."),
    ]

    def decorate(fn):
        for opt in reversed(opts):
            fn = opt(fn)
        return fn

    return decorate


@contextlib.contextmanager
def fleet_executor(spec):
    """The executor of ``spec`` (``(name, workers, address)`` from `_fleet_options`, or
    None: yields None, replicas run here), closed on leaving."""
    if spec is None:
        yield None
        return
    from prefixshield.experiments.executors import make_executor

    ex = make_executor(*spec)
    try:
        yield ex
    finally:
        ex.close()


def _fleet_options(fn):
    """``--replicas``, ``--router``, ``--router-imbalance``, ``--router-match``,
    ``--router-key``, ``--fleet-mode``, ``--ledger``, ``--ledger-staleness``: a fleet of
    engines behind a router (and where PrefixShield's ledger lives), handed to the command as
    one ``fleet`` argument (a `FleetConfig`, or
    None without ``--replicas``); and ``--executor``, ``--workers``, ``--address``: where a
    split fleet's replicas run, handed as ``executor_spec`` (``(name, workers, address)``
    for `fleet_executor`, or None: in this process). Bad values are a one-line error
    naming the option before any work."""
    from prefixshield.fleet.config import MAX_REPLICAS, MODES
    from prefixshield.fleet.ledger import LEDGERS, MAX_STALENESS_S

    @functools.wraps(fn)
    def wrapper(*args, replicas, router, router_imbalance, router_match, router_key,
                fleet_mode, ledger, ledger_staleness, executor, workers, address, **kwargs):
        fleet = _fleet_config(replicas, router, router_imbalance, router_match, router_key,
                              fleet_mode, ledger, ledger_staleness)
        return fn(*args, fleet=fleet,
                  executor_spec=_fleet_executor_spec(fleet, executor, workers, address),
                  **kwargs)

    opts = [
        click.option("--replicas", type=count(1, MAX_REPLICAS), default=None,
                     help="Simulate a fleet of N engines behind --router, each with its own "
                          "pool, policy and scheduler (the engine options apply to each). "
                          "Without it: one engine."),
        click.option("--router", default=None, metavar="NAME",
                     help="With --replicas: round_robin (default), random, session, "
                          "least_loaded, prefix_affinity or kv_aware (docs/fleet.md)."),
        click.option("--router-imbalance", type=count(0, 1_000_000), default=None,
                     help="prefix_affinity: the largest spread of requests (waiting + "
                          "running) between replicas under which prefix affinity decides "
                          "[default: 8]."),
        click.option("--router-match", type=finite(0, 1), default=None,
                     help="prefix_affinity: the smallest matched share of the prompt's blocks "
                          "that wins a replica [default: 0.1]."),
        click.option("--router-key", type=click.Choice(["prefix", "group"]), default=None,
                     help="session: hash the request's group and prefix_id (its "
                          "conversation) or its group alone [default: prefix]."),
        click.option("--fleet-mode", type=click.Choice(list(MODES)), default=None,
                     help="split: replicas run independently on their share of the trace "
                          "(routers that read no replica state); lockstep: one loop advances "
                          "every replica to each arrival; auto picks [default: auto]."),
        click.option("--ledger", type=click.Choice(list(LEDGERS)), default=None,
                     help="PrefixShield's debt buckets: one set per replica (what a deployment "
                          "gets with no shared state) or one per group and contract for the "
                          "whole fleet (runs in lockstep; other policies have no ledger) "
                          "[default: replica]."),
        click.option("--ledger-staleness", type=finite(0, MAX_STALENESS_S), default=None,
                     metavar="S",
                     help="With --ledger fleet: seconds before a charge made on one replica "
                          "reaches the others (a shared counter's propagation delay) "
                          "[default: 0]."),
    ]
    for opt in reversed(opts):
        wrapper = opt(wrapper)
    # a lockstep fleet is one loop over every replica: only split replicas can be spread
    return executor_options("inprocess", "a split fleet's replicas")(wrapper)


def _fleet_executor_spec(fleet, executor, workers, address):
    """``(executor, workers, address)`` when a split fleet's replicas run on an executor other
    than this process, else None; an executor option without a split fleet (nothing it could
    run), or ``--workers`` with ``--executor inprocess`` (no pool to size), is a
    ``click.BadParameter``."""
    given = [k for k, v in (("--workers", workers), ("--address", address)) if v is not None]
    if executor != "inprocess":
        given.insert(0, "--executor")
    if not given:
        return None
    if fleet is None:
        raise click.BadParameter("needs --replicas N (a fleet)", param_hint=given[0])
    if fleet.resolved_mode() != "split":
        raise click.BadParameter("runs a split fleet's replicas; this fleet runs in lockstep "
                                 "(one loop drives every replica)", param_hint=given[0])
    if address is not None and executor != "ray":
        raise click.BadParameter("needs --executor ray", param_hint="--address")
    if workers is not None and executor == "inprocess":
        raise click.BadParameter("needs --executor process or ray (inprocess runs the "
                                 "replicas in this process, with no workers)",
                                 param_hint="--workers")
    return (executor, workers, address) if executor != "inprocess" else None


def _fleet_config(replicas, router, imbalance, match, key, mode, ledger=None, staleness=None):
    """The options of `_fleet_options` -> a ``FleetConfig`` or None; a bad value is a
    ``click.BadParameter`` naming its option."""
    from prefixshield.fleet.config import FleetConfig
    from prefixshield.fleet.routers.base import ROUTERS, RouterConfig

    given = {"--router": router, "--router-imbalance": imbalance, "--router-match": match,
             "--router-key": key, "--fleet-mode": mode, "--ledger": ledger,
             "--ledger-staleness": staleness}
    if replicas is None:
        extra = [k for k, v in given.items() if v is not None]
        if extra:
            raise click.BadParameter("needs --replicas N (a fleet)", param_hint=extra[0])
        return None
    name = router or "round_robin"
    if name not in ROUTERS:
        raise click.BadParameter(f"unknown router {name!r}; known: {', '.join(ROUTERS)}",
                                 param_hint="--router")
    for opt, value, reader in (("--router-imbalance", imbalance, "prefix_affinity"),
                               ("--router-match", match, "prefix_affinity"),
                               ("--router-key", key, "session")):
        if value is not None and name != reader:
            raise click.BadParameter(f"{opt} is read by --router {reader}, not {name}",
                                     param_hint=opt)
    if staleness is not None and ledger != "fleet":
        raise click.BadParameter("needs --ledger fleet", param_hint="--ledger-staleness")
    defaults = RouterConfig()
    cfg = RouterConfig(name=name,
                       imbalance=defaults.imbalance if imbalance is None else imbalance,
                       match_ratio=defaults.match_ratio if match is None else match,
                       session_key=key or defaults.session_key)
    try:
        fleet = FleetConfig(replicas=replicas, router=cfg, mode=mode or "auto",
                            ledger=ledger or "replica", ledger_staleness_s=staleness or 0.0)
        fleet.resolved_mode()
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--fleet-mode") from None
    return fleet


def _scheduler_config(name: str, priorities: tuple[str, ...], vtc_weights: str | None,
                      tenant_limits: tuple[str, ...]):
    """The options of `_scheduler_options` -> a ``SchedulerConfig``; a bad value is a
    ``click.BadParameter`` naming its option."""
    from prefixshield.scheduling import (SCHEDULERS, SchedulerConfig, limits_from_items,
                                         parse_limit, parse_priority)

    if name not in SCHEDULERS:
        raise click.BadParameter(f"unknown scheduler {name!r}; known: "
                                 f"{', '.join(SCHEDULERS)}", param_hint="--scheduler")
    kw: dict = {"name": name}
    try:
        kw["priorities"] = tuple(parse_priority(p) for p in priorities)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--priority") from None
    if kw["priorities"] and name != "priority":
        raise click.BadParameter(f"--priority is read by --scheduler priority, not {name}",
                                 param_hint="--priority")
    if vtc_weights is not None:
        if name not in ("vtc", "kvtc"):
            raise click.BadParameter(f"--vtc-weights is read by --scheduler vtc or kvtc, not "
                                     f"{name}", param_hint="--vtc-weights")
        parts = vtc_weights.split(",")
        n = 3 if name == "kvtc" and len(parts) == 3 else 2
        try:
            if len(parts) != n:
                raise ValueError
            weights = [float(x) for x in parts]
        except ValueError:
            want = "IN,OUT or IN,OUT,KV (numbers)" if name == "kvtc" else "IN,OUT (two numbers)"
            raise click.BadParameter(f"expected {want}, got {vtc_weights!r}",
                                     param_hint="--vtc-weights") from None
        kw["vtc_input_weight"], kw["vtc_output_weight"] = weights[:2]
        if n == 3:
            kw["kvtc_kv_weight"] = weights[2]
    try:
        kw["limits"] = limits_from_items([parse_limit(t) for t in tenant_limits])
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--tenant-limit") from None
    try:
        return SchedulerConfig(**kw)
    except ValueError as e:
        hint = ("--vtc-weights" if "weight" in str(e) else
                "--priority" if "priorit" in str(e) else "--scheduler")
        raise click.BadParameter(str(e), param_hint=hint) from None


def _workload_options(fn):
    """``--alpha`` and ``--set``: how a generated workload is sized and parameterized."""
    fn = click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
                      help="Override a workload parameter (repeatable); e.g. "
                           "--set duration_s=30.")(fn)
    return click.option("--alpha", type=ALPHA, default=DEFAULT_ALPHA, show_default=True,
                        help="Nominal load: base arrival rate = alpha x C_prefill of the "
                             "profile.")(fn)



_ENGINE_FIELDS = ("block_size", "vllm_compat", "max_num_seqs", "max_num_batched_tokens")
"""`_engine_options`' options that are `EngineConfig` fields of the same name, taken as
given (``--blocks`` is not: it may be ``auto``)."""


def run_options(fn):
    """Build a command's [`RunOptions`][prefixshield.experiments.options.RunOptions] once, from its
    shared options, and hand it to the command as one ``opts`` argument.

    Reads WORKLOAD and ``--policy``; the engine options (`_engine_options`,
    ``--check-invariants`` where the command has it); ``scheduler`` (`_scheduler_options`);
    ``fleet`` and ``executor_spec`` (`_fleet_options`); ``--alpha`` and ``--set``
    (`_workload_options`); ``--seed`` (one seed) or ``--seeds N`` (0..N-1); and
    ``--c-prefill-basis``, ``--contracts``, ``--scale-to-engine``. The command's other options
    pass through. A bad WORKLOAD or ``--set`` is a ``click.BadParameter`` naming it; apply
    under `_user_errors` so that a bad value elsewhere (a profile) is one line too."""
    @functools.wraps(fn)
    def wrapper(*args, workload, policies, num_blocks, profile, scheduler, fleet, executor_spec,
                alpha, overrides, c_prefill_basis, contracts_mode, scale_to_load, **kwargs):
        with _loading():
            from prefixshield.experiments import single  # noqa: F401  (what the run needs)
            from prefixshield.simulator.costmodel import load_profile

        check_invariants = kwargs.pop("check_invariants", False)
        seeds = (kwargs.pop("seed"),) if "seed" in kwargs else tuple(range(kwargs.pop("seeds")))
        typed = _workload_overrides(workload, overrides)
        auto = num_blocks if isinstance(num_blocks, AutoBlocks) else None
        # under auto the pool is sized from the trace later; the default stands in till then
        engine = engine_config(num_blocks=None if auto else num_blocks,
                               check_invariants=check_invariants, scheduler=scheduler,
                               **{name: kwargs.pop(name) for name in _ENGINE_FIELDS})
        every = any(part.strip() == "all" for v in policies for part in v.split(","))
        opts = RunOptions(workload=workload, policies=_policy_names(policies), engine=engine,
                          every_policy=every,
                          auto_blocks=auto, profile=load_profile(profile), alpha=alpha,
                          seeds=seeds, overrides=typed, fleet=fleet, executor=executor_spec,
                          c_prefill_basis=c_prefill_basis, contracts=contracts_mode,
                          scale_to_load=scale_to_load)
        return fn(*args, opts=opts, **kwargs)
    return wrapper


class Stages:
    """What a command is doing, as it does it: on a terminal a rich display (a spinner, the
    stage, a bar over the steps and the elapsed time); otherwise (a log, a pipe, a test) one
    line per stage as it starts, and one when a step ends.

    Use as a context manager; `stage` starts a stage, `done` ends one of the
    ``total`` steps the bar counts, with a line saying what it did."""

    def __init__(self, total: int = 0, out: Console | None = None) -> None:
        self.out = out or console
        self.total = total
        self.live = self.out.is_terminal
        self._progress = None
        self._task = None

    def __enter__(self) -> "Stages":
        if self.live:
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn,
                                       TextColumn, TimeElapsedColumn)

            self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"),
                                      BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                      console=self.out, transient=True)
            self._progress.__enter__()
            self._task = self._progress.add_task("", total=self.total or None)
        return self

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)

    def stage(self, text: str) -> None:
        """Start a stage described by ``text``."""
        if self._progress is not None:
            self._progress.update(self._task, description=text)
        else:
            self.out.print(f"{text}...")
            self._flush()

    def done(self, text: str | None = None) -> None:
        """End a step (the bar advances); ``text``: a line saying what it did."""
        if self._progress is not None:
            self._progress.advance(self._task)
        if text:
            self.out.print(text)
            self._flush()

    def _flush(self) -> None:
        # a pipe or a log file gets the line now, not when the buffer fills or the run ends
        try:
            self.out.file.flush()
        except (AttributeError, OSError, ValueError):
            pass


def compile_note(fleet=None) -> str:
    """A stage line's note that numba is compiling the kernels (about a minute; later runs load
    them from the cache) when the kernel cache is cold, else ``""``. ``fleet``: the run's
    `FleetConfig` or None; one that may run in lockstep needs the fleet's loop too."""
    from prefixshield.kernelcache import is_warm

    lockstep = fleet is not None and fleet.resolved_mode() == "lockstep"
    loops = ("engine", "fleet") if lockstep else ("engine",)
    return ("" if is_warm(loops=loops) else " (first run of these kernels: numba compiles "
            "them, about a minute; later runs load them from the cache)")
