"""Experiment specs: a workload, its policies, paired seeds, fixed settings and a grid of fields.

An `Experiment` is what ``prefixshield sweep`` runs and what ``reproduce`` is made of. Its
settings (``base``) and its ``grid`` axes are *fields*, each named by one key:

=================================  ==========================================================
key                                what it sets
=================================  ==========================================================
``blocks`` ``block_size``          engine: configured KV blocks / tokens per block
``compat`` ``max_num_seqs``        engine: vLLM compat mode / scheduler limits
``max_num_batched_tokens``
``reserve_full_prompt``
``scheduler``                      engine: scheduling policy (``fcfs``, ``priority``, ``vtc``,
                                   ``kvtc``)
``tenant_max_running``             engine: per-tenant admission limits applied to every group
``tenant_max_blocks``              (running requests; blocks held by running requests; output
``tenant_max_output_tokens``       tokens per request)
``alpha`` ``profile``              nominal load; cost-model profile (shipped name or TOML path)
``replicas`` ``router``            a fleet: that many engines (each with the point's engine
``router_key``                     fields) behind a router; ``router_key`` is the ``session``
                                   router's key (``prefix`` or ``group``); docs/fleet.md
``ledger``                         with ``replicas``: where PrefixShield's buckets live,
``ledger_staleness_s``             ``replica`` (default) or ``fleet``; with ``fleet``, seconds
                                   before one replica's charge reaches the others (default 0)
``c_prefill_basis``                ``reference`` (C_prefill measured once on the reference
                                   pool of 512 blocks: the same rates at every capacity) or
                                   ``capacity`` (measured at each point's own pool)
any workload parameter             e.g. ``pressure_ratio``, ``duration_s``, ``attack``,
                                   ``output_tokens`` (the fields ``--set`` takes)
``POLICY.PARAM``                   a constructor argument of every policy named POLICY,
                                   e.g. ``prefixshield.rho_scale``, ``s3fifo.small_size_ratio``
``contract.NAME.rho|beta``         a contract's refill (blocks/s) or burst (blocks), for the
                                   trace (attack sizing) and the engine's policies alike
=================================  ==========================================================

Values are typed at the edge (here): from text (CLI ``--grid KEY=V1,V2``; a tuple-valued field
takes ``;`` between values, e.g. ``output_tokens=1,1;16,64``) or from TOML values. A grid is the
full factorial of its axes, in the order given; each point is run on every seed with every policy
on the identical trace.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from prefixshield.edges import (MAX_SEEDS, EdgeError, check_cells, check_name,
                                check_points)
from prefixshield.experiments.overrides import (OverrideError, parse_overrides,
                                                parse_policy_spec)

ENGINE_KEYS = {"blocks": "num_blocks", "num_blocks": "num_blocks", "block_size": "block_size",
               "compat": "vllm_compat", "vllm_compat": "vllm_compat",
               "max_num_seqs": "max_num_seqs", "max_num_batched_tokens": "max_num_batched_tokens",
               "reserve_full_prompt": "reserve_full_prompt"}
"""Field key -> [`EngineConfig`][prefixshield.simulator.config.EngineConfig] attribute."""

ENGINE_MINIMUM = {"num_blocks": 2, "block_size": 1, "max_num_seqs": 1,
                  "max_num_batched_tokens": 1}
"""The least value of each integer engine field (``num_blocks``: block 0 is the null block)."""

RUN_KEYS = ("alpha", "profile", "c_prefill_basis")
SCHEDULER_KEYS = {"scheduler": None, "tenant_max_running": "max_running",
                  "tenant_max_blocks": "max_blocks",
                  "tenant_max_output_tokens": "max_output_tokens"}
"""Field key -> the `TenantLimits` attribute it sets for every
group (``scheduler``: the scheduler's name)."""
FLEET_KEYS = ("replicas", "router", "router_key", "ledger", "ledger_staleness_s")
"""Fields of a fleet (`fleet_of`); a point without ``replicas`` runs one engine."""


def fleet_of(settings: Mapping[str, Any]):
    """The `FleetConfig` of a point's ``FLEET_KEYS`` (None
    without ``replicas``); ``router`` defaults to ``round_robin``, ``router_key`` to
    ``prefix``, ``ledger`` to ``replica``, ``ledger_staleness_s`` to 0 s. Raises
    `SpecError` for a fleet field without ``replicas``, a ``router_key`` with a router
    other than ``session`` (the only one that reads it, as ``--router-key``), or a staleness
    without the fleet ledger."""
    if "replicas" not in settings:
        if any(k in settings for k in FLEET_KEYS):
            raise SpecError("router, router_key, ledger and ledger_staleness_s need replicas "
                            "(a fleet)")
        return None
    router = settings.get("router", "round_robin")
    if "router_key" in settings and router != "session":
        raise SpecError(f"router_key is read by router session, not {router}")
    from prefixshield.fleet.config import FleetConfig
    from prefixshield.fleet.routers.base import RouterConfig

    rc = RouterConfig(name=router, session_key=settings.get("router_key", "prefix"))
    try:
        return FleetConfig(replicas=int(settings["replicas"]), router=rc,
                           ledger=settings.get("ledger", "replica"),
                           ledger_staleness_s=float(settings.get("ledger_staleness_s", 0.0)))
    except ValueError as e:
        raise SpecError(str(e)) from None


def scheduler_of(settings: Mapping[str, Any]):
    """The `SchedulerConfig` of a point's ``SCHEDULER_KEYS``
    fields."""
    from prefixshield.scheduling import ALL_GROUPS, SchedulerConfig, TenantLimits

    limits = {SCHEDULER_KEYS[k]: int(v) for k, v in settings.items()
              if k in SCHEDULER_KEYS and k != "scheduler"}
    return SchedulerConfig(name=str(settings.get("scheduler", "fcfs")),
                           limits=((ALL_GROUPS, TenantLimits(**limits)),) if limits else ())
WORKLOAD_OWNED = ("seed", "alpha", "block_size", "num_blocks", "contracts")
"""Workload params set from elsewhere (the seed list, ``alpha``, the engine, ``contract.*``)."""

KINDS = ("simulate", "overhead")


class SpecError(ValueError):
    """An experiment spec names an unknown field, a value of the wrong type, or is inconsistent."""


def value_text(v: Any) -> str:
    """The text form of a typed or TOML value (the inverse of field typing): ``True`` ->
    ``true``, ``None`` -> ``none``, ``(16, 64)`` -> ``16,64``."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "none"
    if isinstance(v, (list, tuple)):
        return ",".join(value_text(x) for x in v)
    if isinstance(v, float):
        return repr(v)
    return str(v)


def jsonable(v: Any) -> Any:
    """A typed field value as JSON (tuples become lists)."""
    if isinstance(v, tuple):
        return [jsonable(x) for x in v]
    return v


@dataclass(frozen=True)
class Experiment:
    """One experiment: a workload under several policies, over paired seeds and a grid.

    Attributes:
        name: identifier (folder name in the results store): letters, digits, ``-_.``.
        workload: a registered workload name.
        policies: policy specs (``name`` or ``name:key=value,...``); the first is the baseline of
            paired differences unless ``baseline`` names another.
        seeds: trace seeds; every point runs every seed.
        base: fixed fields (key -> typed value), see the module docstring.
        grid: swept fields, ``(key, values)`` in order; the full factorial is run.
        baseline: the policy paired differences are taken against (default: the first).
        kind: ``simulate`` (default) or ``overhead`` (victim-selection latency and policy-state
            bytes: ``grid`` sweeps ``blocks`` and ``groups``; timings are measured, not
            simulated, and never regressed).
        records: also store per-request records for every cell.
        title: a human title for tables and figures.
    """

    name: str
    workload: str
    policies: tuple[str, ...]
    seeds: tuple[int, ...] = tuple(range(10))
    base: Mapping[str, Any] = field(default_factory=dict)
    grid: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    baseline: str | None = None
    kind: str = "simulate"
    records: bool = False
    title: str = ""

    def __post_init__(self) -> None:
        try:  # a folder name under cells/ and a figure label: no '..', '/', '$'
            check_name(self.name, "experiment name")
        except EdgeError as e:
            raise SpecError(str(e)) from None
        if self.kind not in KINDS:
            raise SpecError(f"experiment {self.name}: kind must be one of {KINDS}, got "
                            f"{self.kind!r}")
        if not self.policies:
            raise SpecError(f"experiment {self.name}: no policy given")
        if len(set(self.policies)) != len(self.policies):
            raise SpecError(f"experiment {self.name}: a policy is listed twice")
        if not self.seeds:
            raise SpecError(f"experiment {self.name}: no seed given")
        if len(set(self.seeds)) != len(self.seeds):  # a cell counted twice in every mean
            raise SpecError(f"experiment {self.name}: a seed is listed twice")
        if len(self.seeds) > MAX_SEEDS:
            raise SpecError(f"experiment {self.name}: {len(self.seeds):,} seeds, more than the "
                            f"{MAX_SEEDS:,} allowed")
        if not isinstance(self.records, bool):
            raise SpecError(f"experiment {self.name}: records must be true or false, got "
                            f"{self.records!r}")
        for s in self.seeds:
            if not isinstance(s, int) or isinstance(s, bool) or not 0 <= s < 2 ** 63:
                raise SpecError(f"experiment {self.name}: seed {s!r} must be an integer in "
                                "[0, 2**63)")
        if self.baseline is not None and self.baseline not in self.policies:
            raise SpecError(f"experiment {self.name}: baseline {self.baseline!r} is not one of "
                            f"its policies {list(self.policies)}")
        if self.baseline == self.policies[0]:
            object.__setattr__(self, "baseline", None)  # one spelling of the default
        keys = [k for k, _ in self.grid]
        if len(set(keys)) != len(keys):
            raise SpecError(f"experiment {self.name}: a grid field is listed twice")
        for k, vals in self.grid:
            if not vals:
                raise SpecError(f"experiment {self.name}: grid field {k!r} has no value")
            if k in self.base:
                raise SpecError(f"experiment {self.name}: {k!r} is both fixed and swept")
        try:  # before points() builds them
            check_points([len(v) for _, v in self.grid], f"experiment {self.name}")
            check_cells(math.prod(len(v) for _, v in self.grid) * len(self.policies)
                        * len(self.seeds), f"experiment {self.name}")
        except EdgeError as e:
            raise SpecError(str(e)) from None
        if self.kind == "simulate":
            for p in self.policies:
                try:
                    parse_policy_spec(p)
                except OverrideError as e:
                    raise SpecError(f"experiment {self.name}: {e}") from None
            for point in self.points():
                try:
                    resolve_contracts(point.settings)
                    fleet_of(point.settings)  # a bad fleet before any cell runs
                except SpecError as e:
                    at = f", point {point.label()}" if self.grid else ""
                    raise SpecError(f"experiment {self.name}{at}: {e}") from None

    @property
    def baseline_policy(self) -> str:
        """The policy paired differences are taken against."""
        return self.baseline or self.policies[0]

    @property
    def grid_keys(self) -> list[str]:
        """The swept field keys, in order."""
        return [k for k, _ in self.grid]

    def points(self) -> list["Point"]:
        """The grid's points (one empty point without a grid), in factorial order."""
        axes = [vals for _, vals in self.grid]
        out = []
        for i, combo in enumerate(itertools.product(*axes)):
            values = dict(zip(self.grid_keys, combo))
            out.append(Point(f"p{i:03d}", values, {**self.base, **values}))
        return out

    def to_dict(self) -> dict:
        """Canonical JSON form (written beside the results; `experiment_from_dict`)."""
        return {"name": self.name, "title": self.title, "kind": self.kind,
                "workload": self.workload, "policies": list(self.policies),
                "baseline": self.baseline_policy, "seeds": list(self.seeds),
                "records": self.records,
                "base": {k: jsonable(v) for k, v in self.base.items()},
                "grid": [[k, [jsonable(v) for v in vals]] for k, vals in self.grid]}


@dataclass(frozen=True)
class Point:
    """One grid point: ``id`` (``p000``...), the swept ``values`` and all ``settings``
    (base and swept fields together)."""

    id: str
    values: Mapping[str, Any]
    settings: Mapping[str, Any]

    def label(self) -> str:
        """``blocks=1024, alpha=0.6`` (or ``-`` for the single point of a grid-less spec)."""
        return ", ".join(f"{k}={value_text(v)}" for k, v in self.values.items()) or "-"


def resolve_contracts(settings: Mapping[str, Any]):
    """The contract table of the point: the defaults with ``contract.NAME.rho|beta`` applied
    (None when the point sets none). A new contract NAME needs both rho and beta."""
    from prefixshield.tenancy import DEFAULT_CONTRACTS, Contract

    fields = {k: v for k, v in settings.items() if k.startswith("contract.")}
    if not fields:
        return None
    table = dict(DEFAULT_CONTRACTS)
    for key, v in sorted(fields.items()):
        _, name, what = key.split(".")
        old = table.get(name)
        if old is None:
            rho = fields.get(f"contract.{name}.rho")
            beta = fields.get(f"contract.{name}.beta")
            if rho is None or beta is None:
                raise SpecError(f"contract {name!r} is not a default contract: give both "
                                f"contract.{name}.rho and contract.{name}.beta")
            table[name] = Contract(name, float(rho), float(beta))
        elif what == "rho":
            table[name] = dataclasses.replace(old, rho_blocks_per_s=float(v))
        else:
            table[name] = dataclasses.replace(old, beta_blocks=float(v))
    return table


# ------------------------------------------------------------------------------ field typing
def _engine_hints() -> dict[str, Any]:
    from prefixshield.simulator.config import EngineConfig

    return typing.get_type_hints(EngineConfig)


def type_field(workload: str, key: str, text: str, where: str = "") -> Any:
    """Type the text ``text`` of field ``key`` of an experiment on ``workload``.

    Raises `SpecError` naming ``where`` (e.g. ``--grid``) for an unknown key or a value
    of the wrong type.
    """
    from prefixshield.experiments.overrides import _convert
    from prefixshield.policies import POLICIES
    from prefixshield.workloads import WORKLOADS

    prefix = f"{where} " if where else ""
    try:
        if key in ENGINE_KEYS:
            attr = ENGINE_KEYS[key]
            value = _convert(text, _engine_hints()[attr], key)
            low = ENGINE_MINIMUM.get(attr)
            if low is not None and value < low:  # else only EngineConfig's message, no field
                raise SpecError(f"{prefix}{key}: must be an integer >= {low}, got {text!r}")
            return value
        if key == "scheduler":
            from prefixshield.scheduling import SCHEDULERS

            return _one_of(prefix, key, text, SCHEDULERS)
        if key in SCHEDULER_KEYS:
            return _int_within(prefix, key, text, 2**40, "between 1 and 2^40")
        if key == "replicas":
            from prefixshield.fleet.config import MAX_REPLICAS

            return _int_within(prefix, key, text, MAX_REPLICAS, f"in [1, {MAX_REPLICAS}]")
        if key == "router":
            from prefixshield.fleet.routers.base import ROUTERS

            return _one_of(prefix, key, text, ROUTERS)
        if key == "router_key":
            if text not in ("prefix", "group"):
                raise SpecError(f"{prefix}router_key: must be prefix or group, got {text!r}")
            return text
        if key == "ledger":
            from prefixshield.fleet.ledger import LEDGERS

            return _one_of(prefix, key, text, LEDGERS)
        if key == "ledger_staleness_s":
            from prefixshield.fleet.ledger import MAX_STALENESS_S

            value = _convert(text, float, key)
            if not (math.isfinite(value) and 0 <= value <= MAX_STALENESS_S):
                raise SpecError(f"{prefix}ledger_staleness_s: must be a number of seconds in "
                                f"[0, {MAX_STALENESS_S:g}], got {text!r}")
            return value
        if key == "alpha":
            value = _convert(text, float, key)
            if not (math.isfinite(value) and 0 < value <= 100):
                raise SpecError(f"{prefix}alpha: must be a finite number in (0, 100], got "
                                f"{text!r}")
            return value
        if key == "c_prefill_basis":
            from prefixshield.experiments.single import C_PREFILL_BASES

            if text not in C_PREFILL_BASES:
                raise SpecError(f"{prefix}c_prefill_basis: must be one of "
                                f"{', '.join(C_PREFILL_BASES)}, got {text!r}")
            return text
        if key == "profile":
            from prefixshield.simulator.costmodel import load_profile

            try:
                load_profile(text)
            except ValueError as e:  # ProfileError names the profile and what is shipped
                raise SpecError(f"{prefix}profile: {e}") from None
            return text
        if key.startswith("contract."):
            parts = key.split(".")
            if len(parts) != 3 or parts[2] not in ("rho", "beta") or not parts[1]:
                raise SpecError(f"{prefix}{key}: contract fields are contract.NAME.rho "
                                "(blocks/s) or contract.NAME.beta (blocks)")
            value = _convert(text, float, key)
            if not math.isfinite(value) or value < 0 or (parts[2] == "rho" and value <= 0):
                raise SpecError(f"{prefix}{key}: must be a finite number "
                                f"{'> 0' if parts[2] == 'rho' else '>= 0'}, got {text!r}")
            return value
        if "." in key:
            name, _, param = key.partition(".")
            if name not in POLICIES:
                raise SpecError(f"{prefix}{key}: no policy {name!r}; known: "
                                f"{', '.join(sorted(POLICIES))}")
            _, kwargs = parse_policy_spec(f"{name}:{param}={text}")
            return kwargs[param]
        if workload not in WORKLOADS:
            raise SpecError(f"unknown workload {workload!r}; known: {', '.join(sorted(WORKLOADS))}")
        if key in WORKLOAD_OWNED:
            raise SpecError(f"{prefix}{key}: set it as "
                            + {"seed": "the experiment's seeds", "alpha": "alpha",
                               "block_size": "block_size", "num_blocks": "blocks",
                               "contracts": "contract.NAME.rho / contract.NAME.beta"}[key])
        return parse_overrides(WORKLOADS[workload].params_type, [f"{key}={text}"])[key]
    except OverrideError as e:
        msg = str(e)
        if msg.startswith("--set "):
            msg = msg[len("--set "):]
        raise SpecError(f"{prefix}{msg}") from None
    except (KeyError, FileNotFoundError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        raise SpecError(f"{prefix}{key}: {msg}") from None


def _one_of(prefix: str, key: str, text: str, names) -> str:
    """``text`` if it is one of the registered ``names``, else a `SpecError`."""
    if text not in names:
        raise SpecError(f"{prefix}{key}: must be one of {', '.join(names)}, got {text!r}")
    return text


def _int_within(prefix: str, key: str, text: str, high: int, shown: str) -> int:
    """``text`` as an integer in ``[1, high]`` (``shown``: that range in the message), else a
    [`SpecError`][prefixshield.experiments.spec.SpecError]."""
    from prefixshield.experiments.overrides import _convert

    value = _convert(text, int, key)
    if not 1 <= value <= high:
        raise SpecError(f"{prefix}{key}: must be an integer {shown}, got {text!r}")
    return value


def _is_tuple_field(workload: str, key: str) -> bool:
    from prefixshield.workloads import WORKLOADS

    if (workload not in WORKLOADS or key in ENGINE_KEYS or key in SCHEDULER_KEYS or "." in key
            or key in FLEET_KEYS):
        return False
    hints = typing.get_type_hints(WORKLOADS[workload].params_type)
    tp = hints.get(key)
    args = (tp,) + typing.get_args(tp) if tp is not None else ()
    return any(typing.get_origin(a) is tuple or a is tuple for a in args)


def parse_grid_option(workload: str, item: str) -> tuple[str, tuple[Any, ...]]:
    """``KEY=V1,V2,...`` (``;`` between values for a tuple-valued field) -> typed axis."""
    key, sep, rest = item.partition("=")
    key = key.strip()
    if not sep or not key or not rest.strip():
        raise SpecError(f"--grid {item!r}: expected KEY=V1,V2,...")
    sep_char = ";" if (";" in rest or _is_tuple_field(workload, key)) else ","
    texts = [t.strip() for t in rest.split(sep_char) if t.strip()]
    values = tuple(type_field(workload, key, t, "--grid") for t in texts)
    if len(set(map(value_text, values))) != len(values):
        raise SpecError(f"--grid {key}: a value is listed twice")
    return key, values


def parse_set_option(workload: str, item: str, where: str = "--set") -> tuple[str, Any]:
    """``KEY=VALUE`` -> (key, typed value), for any field key."""
    key, sep, rest = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise SpecError(f"{where} {item!r}: expected KEY=VALUE")
    return key, type_field(workload, key, rest.strip(), where)


# ------------------------------------------------------------------------------ spec files
def experiment_from_dict(d: Mapping[str, Any], where: str = "spec") -> Experiment:
    """Build an `Experiment` from a TOML table or `Experiment.to_dict` output.

    Keys: ``name``, ``workload``, ``policies`` (list), ``seeds`` (a count N meaning 0..N-1, or a
    list), ``baseline``, ``kind``, ``records``, ``title``, ``base`` (table of fields), ``grid``
    (table key -> list of values, or a list of ``[key, [values]]`` pairs to keep an order).
    """
    known = {"name", "workload", "policies", "seeds", "baseline", "kind", "records", "title",
             "base", "grid"}
    bad = sorted(set(d) - known)
    if bad:
        raise SpecError(f"{where}: unknown key(s) {', '.join(bad)}; known: "
                        f"{', '.join(sorted(known))}")
    for req in ("name", "workload", "policies"):
        if req not in d:
            raise SpecError(f"{where}: missing key {req!r}")
    name = str(d["name"])
    where = f"{where} [{name}]"
    workload = str(d["workload"])
    kind = str(d.get("kind", "simulate"))
    policies = d["policies"]
    if isinstance(policies, str) or not isinstance(policies, (list, tuple)):
        raise SpecError(f"{where}: policies must be a list of policy specs")
    for p in policies:
        try:
            parse_policy_spec(str(p))
        except OverrideError as e:
            raise SpecError(f"{where}: {e}") from None
    seeds = d.get("seeds", 10)
    if isinstance(seeds, bool):
        raise SpecError(f"{where}: seeds must be a count or a list of integers")
    if isinstance(seeds, int):
        if seeds < 1:
            raise SpecError(f"{where}: seeds must be >= 1, got {seeds}")
        if seeds > MAX_SEEDS:  # before range() builds them
            raise SpecError(f"{where}: seeds must be <= {MAX_SEEDS:,}, got {seeds:,}")
        seeds = tuple(range(seeds))
    elif isinstance(seeds, (list, tuple)):
        seeds = tuple(seeds)
    else:
        raise SpecError(f"{where}: seeds must be a count or a list of integers")

    def typed(key: str, v: Any, sub: str) -> Any:
        if kind == "overhead":
            return _overhead_field(key, v, f"{where} {sub}")
        return type_field(workload, key, value_text(v), f"{where} {sub}")

    base_in = d.get("base", {})
    if not isinstance(base_in, Mapping):
        raise SpecError(f"{where}: base must be a table of fields")
    base = {k: typed(k, v, "base") for k, v in base_in.items()}
    grid_in = d.get("grid", {})
    if not isinstance(grid_in, (Mapping, list, tuple)):
        raise SpecError(f"{where}: grid must map each field to a list of values, got "
                        f"{type(grid_in).__name__} {grid_in!r}")
    items = list(grid_in.items()) if isinstance(grid_in, Mapping) else list(grid_in)
    grid = []
    for item in items:
        if not (isinstance(item, (list, tuple)) and len(item) == 2
                and isinstance(item[1], (list, tuple))):
            raise SpecError(f"{where}: grid must map each field to a list of values")
        k, vals = str(item[0]), item[1]
        grid.append((k, tuple(typed(k, v, "grid") for v in vals)))
    records = d.get("records", False)
    if not isinstance(records, bool):  # "no" would read as true
        raise SpecError(f"{where}: records must be true or false, got {records!r}")
    try:
        return Experiment(name=name, workload=workload, policies=tuple(map(str, policies)),
                          seeds=seeds, base=base, grid=tuple(grid),
                          baseline=d.get("baseline"), kind=kind,
                          records=records, title=str(d.get("title", "")))
    except SpecError as e:
        raise SpecError(f"{where}: {e}") from None


OVERHEAD_MAX = {"blocks": 1 << 22, "groups": 4096}
"""Largest overhead sizes: the benchmark allocates per-block and per-group state; 4 Mi blocks
is 1,000 x the largest pool the overhead table measures (4,096)."""


def _overhead_field(key: str, v: Any, where: str) -> Any:
    if key not in OVERHEAD_MAX or isinstance(v, bool) or not isinstance(v, int) \
            or not 2 <= v <= OVERHEAD_MAX[key]:
        raise SpecError(f"{where}: overhead experiments take integer blocks in [2, "
                        f"{OVERHEAD_MAX['blocks']}] and groups in [2, {OVERHEAD_MAX['groups']}], "
                        f"got {key}={v!r}")
    return v


def load_spec_file(path: str | Path) -> list[Experiment]:
    """Experiments from a TOML spec file: one experiment at the top level, or an array of tables
    ``[[experiment]]``. Errors name the file and the experiment."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise SpecError(f"{path}: no such spec file") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise SpecError(f"{path}: not valid TOML: {e}") from None
    if "experiment" in data:
        tables = data["experiment"]
        if not isinstance(tables, list) or set(data) - {"experiment"}:
            raise SpecError(f"{path}: use either one experiment at the top level or "
                            "[[experiment]] tables only")
    else:
        tables = [data]
    exps = [experiment_from_dict(t, where=str(path)) for t in tables]
    names = [e.name for e in exps]
    if len(set(names)) != len(names):
        raise SpecError(f"{path}: two experiments share a name")
    return exps


def spec_digest(experiments: list[Experiment]) -> str:
    """A short hash of the experiments' canonical JSON (identifies a results store's spec)."""
    text = json.dumps([e.to_dict() for e in experiments], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def with_seeds(exp: Experiment, seeds: tuple[int, ...]) -> Experiment:
    """``exp`` with another seed list."""
    return dataclasses.replace(exp, seeds=tuple(seeds))
