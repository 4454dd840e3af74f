"""Importers: external traces onto the trace schema.

- `import_mooncake`: Mooncake JSONL (``timestamp`` ms, ``input_length``, ``output_length``,
  ``hash_ids`` at 512-token granularity; timed and sized by a `MooncakeImport`).
- `import_sharegpt`: ShareGPT JSON conversations -> multi-turn requests (timed and sized by a
  `ShareGPTImport`).
- `import_azure`: Azure LLM inference CSV (``TIMESTAMP``, ``ContextTokens``,
  ``GeneratedTokens``; timed and sized by an `AzureImport`).

Every malformed record raises [`TraceError`][prefixshield.traces.schema.TraceError] naming the file,
the line number and the field; no record is ever skipped silently. Groups: ``groups`` lists the
group names, or ``num_groups`` asks for `group_names` (default: one group ``"default"``);
records (conversations for ShareGPT) are assigned to them by a tenant model
(`TENANT_MODELS`; default round-robin in file order). Every import records the requests
each group received (``meta["requests_per_group"]``) and refuses, unless
``allow_fewer_groups``, a model that left a group without requests
(`check_group_count`).
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Sequence

import numpy as np
import pandas as pd

from prefixshield.traces.conversations import add_conversations, cap_turns
from prefixshield.traces.rows import RequestRows
from prefixshield.traces.schema import DEFAULT_VOCAB_SIZE, ROLES, Trace, TraceError
from prefixshield.traces.segments import LOCAL_BITS, SegmentKind, segment_ids
from prefixshield.traces.tenants import (check_enough_sessions, check_group_count, deal_tenants,
                                         divergence_roots, root_sessions)

MOONCAKE_BLOCK_TOKENS = 512
"""Tokens per Mooncake ``hash_ids`` entry."""

USER_ROLES = frozenset({"human", "user", "system"})
"""ShareGPT ``from`` values whose text is prompt-side (system text joins the user turn)."""
ASSISTANT_ROLES = frozenset({"gpt", "chatgpt", "bard", "bing", "assistant", "model"})
"""ShareGPT ``from`` values whose text the model generated."""


def group_names(num_groups: int) -> list[str]:
    """Default group names: ``["default"]`` for one group, else ``group0 .. group{n-1}``."""
    if num_groups < 1:
        raise ValueError(f"num_groups must be >= 1, got {num_groups}")
    return ["default"] if num_groups == 1 else [f"group{i}" for i in range(num_groups)]


TENANT_MODELS = ("round_robin", "session", "prefix", "zipf", "servegen", "map", "trace")
"""How an importer assigns records to groups (tenants):

- ``trace``: the trace's own tenant column (Mooncake: a ``tenant`` field on every record;
  Azure: a ``tenant`` column), its values used as the group names as they are; the default
  when the trace has one;
- ``round_robin``: record i (conversation i for ShareGPT) to group ``i mod G``, in file order;
  the default otherwise;
- ``session``: keep what belongs together in one group: a ShareGPT conversation's turns
  (ShareGPT's only unit); on Mooncake a *root* (the first 512-token block after the prefix
  *every* request shares: a system prompt where the trace has several, a conversation or
  document where it has none), or, on a trace with fewer roots than groups, a *session* within
  a root (the block after the root's own shared prefix); see
  `deal_tenants`. Azure has neither;
- ``prefix``: by root (or session) key mod G (Mooncake);
- ``zipf``: heterogeneous tenants: each unit (conversation, root or session, or record for
  Azure) goes to group g with probability proportional to ``1 / (g + 1) ** tenant_skew``
  (seeded), so tenant 0 sends the most and the last the least;
- ``servegen``: like ``zipf``, with the shares of real clients: group g gets the share of
  requests that ServeGen's g-th busiest ``m-large`` client sent in their busiest hour (the
  ``servegen`` workload's data; at most 8 groups);
- ``map``: an explicit CSV (`read_tenant_map`): ``record,group`` and optional
  ``contract`` and ``priority`` columns.

Every model but ``map`` and ``trace`` fills all G groups when there are at least G units to
deal; fewer sessions than groups is a one-line error before any request is built.
"""


def assign_tenants(model: str, units: np.ndarray, groups: Sequence[str], seed: int,
                   tenant_skew: float = 1.0, mapping=None,
                   sessions: np.ndarray | None = None) -> np.ndarray:
    """Group index of every record under tenant ``model`` (see `TENANT_MODELS`).

    Args:
        units: per record, the key of what must stay together (record index, conversation,
            prefix root); records with equal keys get the same group unless ``sessions``
            splits them (see `deal_tenants`).
        groups: the group names (G of them).
        seed: seed of the ``zipf`` draw (one stream, independent of token ids).
        tenant_skew: ``zipf`` exponent (> 0; larger: more skewed).
        mapping: for ``map``: the per-record group indices (see `read_tenant_map`).
        sessions: per record, its session within its unit (None: the unit itself).
    """
    units = np.asarray(units, dtype=np.int64)
    if model == "map":
        if mapping is None or len(mapping) != len(units):
            raise ValueError("the map tenant model needs one group per record "
                             f"({len(units)} records, {0 if mapping is None else len(mapping)} "
                             "mapped)")
        return np.asarray(mapping, dtype=np.int64)
    if model not in TENANT_MODELS or model == "trace":
        raise ValueError(f"unknown tenant model {model!r}; known: {', '.join(TENANT_MODELS)}")
    return deal_tenants(model, units, units if sessions is None else sessions, len(groups),
                        seed, tenant_skew)[0]


class TenantMap(NamedTuple):
    """A ``--tenant-map`` CSV read (see `read_tenant_map`)."""

    groups: list[str]
    """Group names, in order of first use (or as given)."""
    record_group: np.ndarray | None
    """Group index per record (a map with a ``record`` column), else None (a tenant table)."""
    contracts: dict[str, str]
    """Contract per group that the map gives one."""
    priorities: dict[str, int]
    """Scheduler priority per group that the map gives one (lower is served first)."""


MAP_COLUMNS = ("record", "group", "contract", "priority")
"""The columns a tenant map may have (``group`` is required)."""


def read_tenant_map(path: str | os.PathLike, num_records: int, groups: list[str] | None = None
                    ) -> TenantMap:
    """Read a tenant map CSV: ``group`` plus optional ``record``, ``contract``, ``priority``.

    With a ``record`` column it is the ``map`` tenant model: one row per record, ``record``
    the 0-based index of the record in file order (a JSONL line, a CSV row, a ShareGPT
    conversation; blank lines are not records), every record listed exactly once. Without one
    it is a tenant table for any other model: one row per group, naming its ``contract`` and/or
    ``priority``. ``contract`` is a tier (``critical``, ``standard``, ``best_effort`` or one
    named by ``--contracts``), one per group; ``priority`` an integer (lower served first, as
    vLLM's ``priority`` scheduler; used by ``run --scheduler priority`` when no ``--priority``
    is given), one per group. Errors name the file, the line and the field.
    """
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"{path}: no such tenant map")
    names: list[str] = list(groups or [])
    index = {g: i for i, g in enumerate(names)}
    out = np.full(num_records, -1, dtype=np.int64)
    contracts: dict[str, str] = {}
    priorities: dict[str, int] = {}
    with open_text(path, newline="") as f:
        reader = csv.DictReader(_DecodingLines(path, f))
        cols = [c.strip() for c in (reader.fieldnames or [])]
        unknown = [c for c in cols if c not in MAP_COLUMNS]
        if "group" not in cols or unknown or ("record" not in cols and len(cols) < 2):
            raise TraceError(f"{path}: line 1: expected a header with columns group and "
                             "record (the map model) or contract/priority (a tenant table), "
                             f"of {','.join(MAP_COLUMNS)}; got {reader.fieldnames}")
        reader.fieldnames = cols
        by_record = "record" in cols
        for row in reader:
            where = f"{path}: line {reader.line_num}"
            g = (row["group"] or "").strip()
            if not g:
                raise TraceError(f"{where}: field group: empty")
            if by_record:
                try:
                    r = int(row["record"])
                except (TypeError, ValueError):
                    raise TraceError(f"{where}: field record: expected an integer, got "
                                     f"{row['record']!r}") from None
                if not 0 <= r < num_records:
                    raise TraceError(f"{where}: field record: {r} is not a record of the trace "
                                     f"(0..{num_records - 1})")
                if out[r] >= 0:
                    raise TraceError(f"{where}: field record: record {r} is mapped twice")
            elif g in index and (g in contracts or g in priorities):
                raise TraceError(f"{where}: field group: {g!r} is listed twice (a tenant "
                                 "table has one row per group)")
            if g not in index:
                if groups and by_record:
                    raise TraceError(f"{where}: field group: {g!r} is not one of {groups}")
                index[g] = len(names)
                names.append(g)
            if by_record:
                out[r] = index[g]
            c = (row.get("contract") or "").strip()
            if c and contracts.setdefault(g, c) != c:
                raise TraceError(f"{where}: field contract: group {g!r} is on "
                                 f"{contracts[g]!r} already, got {c!r} (one contract a group)")
            pr = (row.get("priority") or "").strip()
            if pr:
                try:
                    p = int(pr)
                except ValueError:
                    raise TraceError(f"{where}: field priority: expected an integer, got "
                                     f"{pr!r}") from None
                if priorities.setdefault(g, p) != p:
                    raise TraceError(f"{where}: field priority: group {g!r} has priority "
                                     f"{priorities[g]} already, got {p} (one a group)")
    if not by_record:
        return TenantMap(names, None, contracts, priorities)
    missing = np.flatnonzero(out < 0)
    if missing.size:
        raise TraceError(f"{path}: record {int(missing[0])} is not mapped ({missing.size} of "
                         f"{num_records} records are not)")
    return TenantMap(names, out, contracts, priorities)


class Tenants(NamedTuple):
    """What a tenant model gave an import: group names, group index per record, the contract
    and priority a map gave each group, and the plan (`deal_tenants`) for the summary."""

    groups: list[str]
    index: np.ndarray
    contracts: dict[str, str]
    priorities: dict[str, int]
    plan: dict


def _tenants(model: str, roots: np.ndarray, sessions: np.ndarray, groups: list[str], seed: int,
             tenant_skew: float, tenant_map, allow_fewer: bool,
             own: list[str | None] | None = None, root_prefix: dict | None = None) -> Tenants:
    """The tenants of an import under ``model``: ``session``/``prefix``/``zipf``/``servegen``
    deal ``roots`` (split into ``sessions`` where roots are fewer than groups),
    ``round_robin`` deals records, ``map`` reads the map, ``trace`` takes ``own`` (the trace's
    tenant column, per record) as it is. A ``tenant_map`` without a record column gives the
    groups of any other model their contracts and priorities."""
    n = len(roots)
    if model == "map":
        if tenant_map is None:
            raise ValueError("--assign map needs --tenant-map FILE (columns record,group"
                             "[,contract][,priority])")
        m = read_tenant_map(tenant_map, n, groups if len(groups) > 1 else None)
        if m.record_group is None:
            raise TraceError(f"{tenant_map}: --assign map needs a record column (one row per "
                             "record); without one the file is a tenant table for another "
                             "--assign")
        return Tenants(m.groups, m.record_group, m.contracts, m.priorities,
                       {"unit": "record", "roots": n, "sessions": n})
    if model == "trace":
        if own is None:
            raise ValueError("--assign trace: the trace has no tenant column (Mooncake: a "
                             "tenant field on every record; Azure: a tenant column)")
        names = list(dict.fromkeys(own))
        if len(groups) > 1 and len(groups) != len(names):
            raise ValueError(f"--groups {len(groups)}: the trace names its own {len(names)} "
                             "tenants (its tenant column); drop --groups, or re-deal them with "
                             "another --assign")
        lookup = {g: i for i, g in enumerate(names)}
        idx = np.fromiter((lookup[g] for g in own), dtype=np.int64, count=n)
        out = Tenants(names, idx, {}, {}, {"unit": "tenant column", "roots": len(names),
                                            "sessions": len(names)})
    else:
        if model == "round_robin":
            roots = sessions = np.arange(n)
        plan_sessions = len(np.unique(np.stack([roots, sessions], axis=1), axis=0))
        if model != "round_robin":
            check_enough_sessions(model, len(groups), plan_sessions,
                                  len(np.unique(roots)), allow_fewer)
        idx, plan = deal_tenants(model, roots, sessions, len(groups), seed, tenant_skew,
                                 root_prefix)
        if model == "round_robin":
            plan["unit"] = "record"
        out = Tenants(list(groups), idx, {}, {}, plan)
    if tenant_map is not None:
        m = read_tenant_map(tenant_map, n)
        if m.record_group is not None:
            raise ValueError("--tenant-map with a record column is the map model: give "
                             "--assign map (a table of group,contract,priority serves any "
                             "other --assign)")
        stray = [g for g in m.groups if g not in out.groups]
        if stray:
            more = ", ..." if len(out.groups) > 8 else ""
            raise TraceError(f"{tenant_map}: group {stray[0]!r} is not a group of this import "
                             f"({', '.join(out.groups[:8])}{more})")
        out = out._replace(contracts=m.contracts, priorities=m.priorities)
    return out


def _units(plan: dict) -> int:
    """How many units a tenant model dealt out (records, roots or sessions; see
    `deal_tenants`)."""
    return int(plan["sessions"] if plan["unit"] == "session" else plan["roots"])


def _counted(rows: RequestRows, groups: list[str], assign: str, units: int,
             allow_fewer_groups: bool) -> dict[str, int]:
    """Requests per group of ``rows``; refuses a group left without any (see
    `check_group_count`)."""
    counts = rows.count_by_group(groups)
    check_group_count(assign, counts, units, allow_fewer_groups)
    return counts


def _check_common(path: Path, groups: Sequence[str] | None, num_groups: int | None,
                  role: str) -> list[str]:
    if not path.exists():
        raise TraceError(f"{path}: no such file")
    if not path.is_file():
        raise TraceError(f"{path}: not a file")
    if groups is None:
        groups = group_names(1 if num_groups is None else num_groups)
    elif num_groups is not None and num_groups != (1 if isinstance(groups, str) else len(groups)):
        raise ValueError(f"num_groups={num_groups} contradicts groups={groups!r}")
    groups = [groups] if isinstance(groups, str) else list(groups)
    if not groups or len(set(groups)) != len(groups):
        raise ValueError(f"groups must be a non-empty list of distinct names, got {groups!r}")
    if role not in ROLES:
        raise ValueError(f"role must be one of {'|'.join(ROLES)}, got {role!r}")
    return groups


def _check_time_scale(time_scale: float) -> None:
    """Refuse a ``time_scale`` that is not a finite number > 0 (the importers' dataclasses
    call it when built)."""
    if not (time_scale > 0 and math.isfinite(time_scale)):
        raise ValueError(f"time_scale must be a finite number > 0, got {time_scale}")


def open_text(path: Path, newline: str | None = None):
    """Open a trace file for reading text: gzip-compressed files (by their magic bytes, whatever
    the name) are decompressed on the fly and a UTF-8 byte-order mark is skipped. Bytes that are
    not UTF-8 raise `TraceError` naming the file (see `read_text`)."""
    with open(path, "rb") as raw:
        magic = raw.read(2)
    if magic == b"\x1f\x8b":
        import gzip

        return gzip.open(path, "rt", encoding="utf-8-sig", newline=newline)
    return open(path, encoding="utf-8-sig", newline=newline)


def read_text(path: Path) -> str:
    """The whole text of ``path`` (gzip and BOM as `open_text`); errors name the file."""
    with open_text(path) as f:
        return _decoded(path, f.read)


def _decoded(path: Path, fn):
    try:
        return fn()
    except UnicodeDecodeError as e:
        raise TraceError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason}); expected a "
                         "UTF-8 or gzip-compressed UTF-8 file") from None
    except (EOFError, OSError, zlib.error) as e:  # a truncated or corrupt gzip stream
        raise TraceError(f"{path}: cannot read: {e}") from None


def _lines(path: Path, f):
    """``enumerate(f, start=1)`` that turns decoding errors into `TraceError`."""
    it = iter(f)
    lineno = 0
    while True:
        lineno += 1
        line = _decoded(path, lambda: next(it, None))
        if line is None:
            return
        yield lineno, line


class _DecodingLines:
    """An iterator over a text file's lines for ``csv.reader`` whose decoding errors name the
    file (the reader counts lines itself)."""

    def __init__(self, path: Path, f) -> None:
        self.path, self.f = path, f

    def __iter__(self):
        return self

    def __next__(self) -> str:
        line = _decoded(self.path, lambda: next(self.f, None))
        if line is None:
            raise StopIteration
        return line


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    return (isinstance(x, (int, float)) and not isinstance(x, bool)
            and math.isfinite(x))


# --------------------------------------------------------------------------------------------
# Mooncake
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class MooncakeImport:
    """How `import_mooncake` times and sizes a Mooncake trace's records, checked when built.

    Attributes:
        block_tokens: tokens per hash id (512 in every Mooncake release), an integer >= 1.
        time_scale: arrival_s = (timestamp - first timestamp) / 1000 * time_scale (seconds),
            a finite number > 0.
    """

    block_tokens: int = MOONCAKE_BLOCK_TOKENS
    time_scale: float = 1.0

    def __post_init__(self) -> None:
        if not (_is_int(self.block_tokens) and self.block_tokens >= 1):
            raise ValueError(f"block_tokens must be an integer >= 1, got {self.block_tokens!r}")
        _check_time_scale(self.time_scale)


def import_mooncake(path: str | os.PathLike, *, groups: Sequence[str] | None = None,
                    num_groups: int | None = None,
                    assign: str | None = None, contract: str = "standard",
                    role: str = "benign", shape: MooncakeImport = MooncakeImport(),
                    seed: int = 0, vocab_size: int = DEFAULT_VOCAB_SIZE,
                    warmup_s: float = 0.0,
                    limit: int | None = None, tenant_skew: float = 1.0,
                    tenant_map: str | os.PathLike | None = None,
                    allow_fewer_groups: bool = False) -> Trace:
    """Import a Mooncake JSONL trace.

    Each line ``{"timestamp": ms, "input_length": tokens, "output_length": tokens,
    "hash_ids": [...]}`` becomes one request: hash id ``h`` becomes segment ``h`` of
    ``shape.block_tokens`` tokens, the last one shortened so the prompt has exactly ``input_length``
    tokens (segment token ids are prefix-consistent, so a shortened block is a prefix of the
    full one). ``prefix_id`` = the request's root: its first hash id after the prefix that
    every record shares (a shared system prompt is no prefix of its own; with no shared
    prefix, the first hash id); ``meta["shared_prefix_blocks"]`` says how long that prefix is.

    Args:
        path: the JSONL file; blank lines are allowed and ignored.
        groups: group names (None: `group_names` of ``num_groups``); see ``assign``.
        num_groups: number of groups when ``groups`` is None (default 1: ``"default"``).
        assign: a tenant model (`TENANT_MODELS`): ``round_robin`` over records,
            ``session``/``prefix`` by prefix root (see ``prefix_id``; split into sessions
            where the roots are fewer than the groups), ``zipf``/``servegen`` (roots or
            sessions to skewed tenants, ``tenant_skew``), ``map`` (``tenant_map`` CSV),
            ``trace`` (each record's own ``tenant`` field). None: ``trace`` when every record
            has a ``tenant`` field, else ``round_robin``.
        tenant_map: the ``map`` model's CSV, or for another model a table
            ``group,contract,priority`` (see `read_tenant_map`).
        allow_fewer_groups: accept a tenant model that leaves a group without requests
            (otherwise a ``ValueError`` naming ``--allow-fewer-groups``).
        contract, role: of every request.
        shape: tokens per hash id and the arrivals' time scale (`MooncakeImport`); ``meta``
            records each of its fields under its own name.
        seed, vocab_size: token seed and vocabulary of the trace.
        warmup_s: requests arriving before this are unmeasured.
        limit: import only the first ``limit`` records.

    Raises:
        TraceError: ``<file>: line N: field F: ...`` for a malformed record: invalid JSON, a
            missing or ill-typed field, ``input_length`` inconsistent with ``hash_ids``
            (needs ``(len-1)*block_tokens < input_length <= len*block_tokens``), or a hash id
            outside ``[0, 2**40)``. Records out of timestamp order are sorted stably.
    """
    block_tokens, time_scale = shape.block_tokens, shape.time_scale
    path = Path(path)
    groups = _check_common(path, groups, num_groups, role)
    if assign is not None and assign not in TENANT_MODELS:
        raise ValueError(f"assign must be one of {', '.join(TENANT_MODELS)}, got {assign!r}")
    ts, inp, out, hashes, lines = [], [], [], [], []
    own: list[str | None] = []
    with open_text(path) as f:
        for lineno, line in _lines(path, f):
            if limit is not None and len(ts) >= limit:
                break
            if not line.strip():
                continue
            where = f"{path}: line {lineno}"
            try:
                rec = json.loads(line)
            except RecursionError:  # arrays nested thousands deep: not a trace record
                raise TraceError(f"{where}: not valid JSON (nested too deeply)") from None
            except json.JSONDecodeError as e:
                if e.pos >= len(line.rstrip()):
                    raise TraceError(f"{where}: not valid JSON: the line ends mid-record after "
                                     f"{len(line.rstrip())} characters (a truncated file?)") \
                        from None
                raise TraceError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") \
                    from None
            if not isinstance(rec, dict):
                raise TraceError(f"{where}: record must be a JSON object, got "
                                 f"{type(rec).__name__}")
            for key in ("timestamp", "input_length", "output_length", "hash_ids"):
                if key not in rec:
                    raise TraceError(f"{where}: field {key}: missing")
            t = rec["timestamp"]
            if not _is_number(t) or t < 0:
                raise TraceError(f"{where}: field timestamp: expected a number >= 0 (ms), "
                                 f"got {t!r}")
            for key in ("input_length", "output_length"):
                if not _is_int(rec[key]) or rec[key] < 1:
                    raise TraceError(f"{where}: field {key}: expected an integer >= 1, "
                                     f"got {rec[key]!r}")
            h = rec["hash_ids"]
            if not isinstance(h, list) or not h:
                raise TraceError(f"{where}: field hash_ids: expected a non-empty list, got {h!r}")
            for j, x in enumerate(h):
                if not _is_int(x) or not 0 <= x < (1 << LOCAL_BITS):
                    raise TraceError(f"{where}: field hash_ids[{j}]: expected an integer in "
                                     f"[0, 2**{LOCAL_BITS}), got {x!r}")
            n = len(h)
            L = rec["input_length"]
            if not (n - 1) * block_tokens < L <= n * block_tokens:
                raise TraceError(f"{where}: field input_length: {L} tokens does not match "
                                 f"{n} hash_ids of {block_tokens} tokens (expected "
                                 f"{(n - 1) * block_tokens + 1}..{n * block_tokens})")
            tenant = rec.get("tenant")
            if tenant is not None:
                if not (isinstance(tenant, str) and tenant.strip()) and not _is_int(tenant):
                    raise TraceError(f"{where}: field tenant: expected a non-empty string or "
                                     f"an integer, got {tenant!r}")
                tenant = str(tenant).strip()
            if own and (own[-1] is None) != (tenant is None):
                raise TraceError(f"{where}: field tenant: "
                                 + ("missing (earlier records have one)" if tenant is None
                                    else "earlier records have none (all or none must)"))
            own.append(tenant)
            ts.append(float(t))
            inp.append(L)
            out.append(rec["output_length"])
            hashes.append(np.asarray(h, dtype=np.int64))
            lines.append(lineno)
    if not ts:
        raise TraceError(f"{path}: no records")
    t_ms = np.asarray(ts)
    arrival = (t_ms - t_ms.min()) / 1000.0 * time_scale
    order = np.argsort(arrival, kind="stable")
    resorted = bool(np.any(order != np.arange(len(order))))
    roots, shared = divergence_roots(hashes)
    has_own = own[0] is not None
    if assign is None:
        assign = "trace" if has_own else "round_robin"
    sessions, root_prefix = (root_sessions(hashes, roots, shared)
                             if assign in ("session", "prefix", "zipf", "servegen")
                             else (roots, {}))
    ten = _tenants(assign, roots, sessions, groups, seed, tenant_skew, tenant_map,
                   allow_fewer_groups, own if has_own else None, root_prefix)
    groups, gidx, contracts = ten.groups, ten.index, ten.contracts
    rows = RequestRows()
    for i in order:
        h = hashes[i]
        lens = np.full(len(h), block_tokens, dtype=np.int64)
        lens[-1] = inp[i] - (len(h) - 1) * block_tokens
        prefix_id = int(roots[i])
        g = groups[gidx[i]]
        rows.add([arrival[i]], g, contracts.get(g, contract), role,
                 prefix_id, arrival[i] >= warmup_s, out[i], [h], [lens])
    meta = {"importer": "mooncake", "source": path.name, "records": len(ts),
            "groups": groups, "assign": assign, "tenant_skew": tenant_skew,
            "contract": contract, "role": role,
            "block_tokens": block_tokens, "time_scale": time_scale, "warmup_s": warmup_s,
            "limit": limit, "resorted": resorted, "shared_prefix_blocks": shared,
            "tenant_plan": ten.plan, "priorities": ten.priorities,
            "tenant_map_contracts": ten.contracts,
            "tenant_column": "ignored" if has_own and assign != "trace" else has_own,
            "requests_per_group": _counted(rows, groups, assign, _units(ten.plan),
                                           allow_fewer_groups)}
    return rows.finish(seed, vocab_size, meta)


# --------------------------------------------------------------------------------------------
# Azure
# --------------------------------------------------------------------------------------------

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


@dataclass(frozen=True)
class AzureImport:
    """How `import_azure` times and sizes an Azure trace's records, checked when built.

    Attributes:
        system_prompt_tokens: a shared system prompt of this many tokens per group at the head
            of every prompt (an integer >= 0; 0: none, every prompt unique).
        time_scale: arrival_s = seconds after the earliest timestamp * time_scale, a finite
            number > 0.
    """

    system_prompt_tokens: int = 0
    time_scale: float = 1.0

    def __post_init__(self) -> None:
        if not (_is_int(self.system_prompt_tokens) and self.system_prompt_tokens >= 0):
            raise ValueError(f"system_prompt_tokens must be an integer >= 0, got "
                             f"{self.system_prompt_tokens!r}")
        _check_time_scale(self.time_scale)


def import_azure(path: str | os.PathLike, *, groups: Sequence[str] | None = None,
                 num_groups: int | None = None, contract: str = "standard", role: str = "benign",
                 shape: AzureImport = AzureImport(), seed: int = 0,
                 vocab_size: int = DEFAULT_VOCAB_SIZE,
                 warmup_s: float = 0.0, limit: int | None = None, assign: str | None = None,
                 tenant_skew: float = 1.0, tenant_map: str | os.PathLike | None = None,
                 allow_fewer_groups: bool = False) -> Trace:
    """Import an Azure LLM inference trace (CSV ``TIMESTAMP,ContextTokens,GeneratedTokens``).

    Arrivals are seconds after the earliest timestamp (times ``shape.time_scale``). Each prompt
    has ``ContextTokens`` tokens: its first ``min(system_prompt_tokens, ContextTokens)`` tokens
    (``shape.system_prompt_tokens``) are the group's shared system-prompt segment (when
    ``system_prompt_tokens > 0``; a shorter prompt uses a prefix of it), the rest a unique
    segment. ``output_tokens`` = ``GeneratedTokens``. prefix_id = 0 (the system prompt) when
    ``system_prompt_tokens > 0``, else the record index. Requests are assigned to ``groups``
    (or `group_names` of ``num_groups``; default: the single group ``"default"``) by the
    tenant model ``assign``:
    ``round_robin`` (file order), ``zipf`` (records to skewed tenants) or ``map``; Azure has no
    sessions or prefixes to keep together. A ``tenant`` column, where the file has one, is the
    ``trace`` model (the default then): its values are the groups, as they are. A group left
    without requests is an error unless ``allow_fewer_groups``. ``meta`` records every field of
    ``shape`` (an `AzureImport`) under its own name.

    Raises:
        TraceError: ``<file>: line N: field F: ...`` for a missing column, a row with the wrong
            number of fields, an unparsable timestamp, or a token count that is not an integer
            >= 1. Rows out of timestamp order are sorted stably.
    """
    system_prompt_tokens, time_scale = shape.system_prompt_tokens, shape.time_scale
    path = Path(path)
    groups = _check_common(path, groups, num_groups, role)
    with open_text(path, newline="") as f:
        reader = csv.reader(_DecodingLines(path, f))
        try:
            header = next(reader)
        except StopIteration:
            raise TraceError(f"{path}: line 1: empty file, expected header "
                             f"{','.join(AZURE_COLUMNS)}") from None
        except csv.Error as e:
            raise TraceError(f"{path}: line 1: not CSV ({e})") from None
        header = [h.strip() for h in header]
        for c in AZURE_COLUMNS:
            if c not in header:
                raise TraceError(f"{path}: line 1: field {c}: missing column (header: "
                                 f"{','.join(header)})")
        cols = AZURE_COLUMNS + (("tenant",) if "tenant" in header else ())
        col = {c: header.index(c) for c in cols}
        raw: dict[str, list[str]] = {c: [] for c in cols}
        lines: list[int] = []
        try:
            for row in reader:
                if limit is not None and len(lines) >= limit:
                    break
                lineno = reader.line_num
                if not row or all(not x.strip() for x in row):
                    continue
                if len(row) != len(header):
                    raise TraceError(f"{path}: line {lineno}: expected {len(header)} fields, "
                                     f"got {len(row)}")
                for c in cols:
                    raw[c].append(row[col[c]].strip())
                if "tenant" in col and not raw["tenant"][-1]:
                    raise TraceError(f"{path}: line {lineno}: field tenant: empty")
                lines.append(lineno)
        except csv.Error as e:
            raise TraceError(f"{path}: line {reader.line_num}: not CSV ({e})") from None
    if not lines:
        raise TraceError(f"{path}: no records")
    line_no = np.asarray(lines)
    stamps = pd.to_datetime(pd.Series(raw["TIMESTAMP"]), format="ISO8601", errors="coerce")
    bad = np.flatnonzero(stamps.isna().to_numpy())
    if bad.size:
        i = int(bad[0])
        raise TraceError(f"{path}: line {line_no[i]}: field TIMESTAMP: expected a date-time like "
                         f"2023-11-16 18:15:46.6805900, got {raw['TIMESTAMP'][i]!r}")
    tokens = {}
    for c in ("ContextTokens", "GeneratedTokens"):
        v = pd.to_numeric(pd.Series(raw[c]), errors="coerce").to_numpy(dtype=np.float64)
        bad = np.flatnonzero(~np.isfinite(v) | (v < 1) | (v != np.floor(v)))
        if bad.size:
            i = int(bad[0])
            raise TraceError(f"{path}: line {line_no[i]}: field {c}: expected an integer >= 1, "
                             f"got {raw[c][i]!r}")
        tokens[c] = v.astype(np.int64)
    ns = stamps.to_numpy(dtype="datetime64[ns]").astype(np.int64)
    arrival = (ns - ns.min()) / 1e9 * time_scale
    order = np.argsort(arrival, kind="stable")
    resorted = bool(np.any(order != np.arange(len(order))))
    ctx, gen = tokens["ContextTokens"], tokens["GeneratedTokens"]
    has_own = "tenant" in raw
    if assign is None:
        assign = "trace" if has_own else "round_robin"
    if assign in ("session", "prefix"):
        raise ValueError(f"--assign {assign}: Azure traces have no sessions or prefixes; use "
                         "round_robin, zipf, servegen or map")
    if assign not in TENANT_MODELS:
        raise ValueError(f"assign must be one of {', '.join(TENANT_MODELS)}, got {assign!r}")
    records = np.arange(len(ctx))
    ten = _tenants(assign, records, records, groups, seed, tenant_skew, tenant_map,
                   allow_fewer_groups, raw["tenant"] if has_own else None)
    groups, gidx, contracts = ten.groups, ten.index, ten.contracts
    if ten.plan["unit"] == "root":
        ten.plan["unit"] = "record"
    rows = RequestRows()
    for gi, g in enumerate(groups):
        sel = order[gidx[order] == gi]
        if not sel.size:
            continue
        uniq = segment_ids(gi, SegmentKind.SUFFIX, sel)
        sys_seg = int(segment_ids(gi, SegmentKind.SYSTEM, [0])[0])
        ids, lens = [], []
        for j, i in enumerate(sel):
            c = int(ctx[i])
            s = min(system_prompt_tokens, c)
            if s > 0 and c > s:
                ids.append([sys_seg, uniq[j]])
                lens.append([s, c - s])
            elif s > 0:
                ids.append([sys_seg])
                lens.append([s])
            else:
                ids.append([uniq[j]])
                lens.append([c])
        pid = np.zeros(len(sel), dtype=np.int64) if system_prompt_tokens > 0 else sel
        rows.add(arrival[sel], g, contracts.get(g, contract), role, pid, arrival[sel] >= warmup_s, gen[sel],
                 ids, lens)
    meta = {"importer": "azure", "source": path.name, "records": len(lines), "groups": groups,
            "assign": assign, "tenant_skew": tenant_skew,
            "contract": contract, "role": role, "system_prompt_tokens": system_prompt_tokens,
            "time_scale": time_scale, "warmup_s": warmup_s, "limit": limit,
            "resorted": resorted, "tenant_plan": ten.plan, "priorities": ten.priorities,
            "tenant_map_contracts": ten.contracts,
            "tenant_column": "ignored" if has_own and assign != "trace" else has_own,
            "requests_per_group": _counted(rows, groups, assign, _units(ten.plan),
                                           allow_fewer_groups)}
    return rows.finish(seed, vocab_size, meta)


# --------------------------------------------------------------------------------------------
# ShareGPT
# --------------------------------------------------------------------------------------------

_WS = re.compile(r"\s*")
_CHUNK_ID = re.compile(r"^(.*)_(\d+)$")


def _iter_json_array(text: str, path: Path):
    """Yield ``(index, line, column, record)`` for the elements of a top-level JSON array."""
    dec = json.JSONDecoder()

    def fail(pos: int, msg: str):
        line = text.count("\n", 0, pos) + 1
        col = pos - (text.rfind("\n", 0, pos) + 1) + 1
        raise TraceError(f"{path}: line {line} column {col}: {msg}")

    pos = _WS.match(text, 0).end()
    if pos >= len(text) or text[pos] != "[":
        fail(pos, "expected a JSON array of conversation records")
    pos = _WS.match(text, pos + 1).end()
    if pos < len(text) and text[pos] == "]":
        return
    line, line_start, scanned = 1, 0, 0
    index = 0
    while True:
        nl = text.count("\n", scanned, pos)
        if nl:
            line += nl
            line_start = text.rfind("\n", scanned, pos) + 1
        scanned = pos
        try:
            rec, end = dec.raw_decode(text, pos)
        except json.JSONDecodeError as e:
            raise TraceError(f"{path}: line {e.lineno} column {e.colno}: record {index}: "
                             f"not valid JSON ({e.msg})") from None
        except RecursionError:  # arrays nested thousands deep: not a conversation record
            raise TraceError(f"{path}: line {line}: record {index}: not valid JSON (nested too "
                             "deeply)") from None
        yield index, line, pos - line_start + 1, rec
        index += 1
        pos = _WS.match(text, end).end()
        if pos < len(text) and text[pos] == ",":
            pos = _WS.match(text, pos + 1).end()
            continue
        if pos < len(text) and text[pos] == "]":
            if text[pos + 1:].strip():
                fail(pos + 1, "unexpected data after the JSON array")
            return
        fail(pos, "expected ',' or ']' after a record")


def estimate_tokens(text: str, chars_per_token: float = 4.0) -> int:
    """Estimated tokens of ``text``: ``max(1, ceil(len(text) / chars_per_token))``.

    Four characters per token is the usual rule of thumb for English with BPE tokenizers; an
    empty message still costs at least one token (chat templates add role markers).
    """
    return max(1, math.ceil(len(text) / chars_per_token))


def parse_sharegpt(path: str | os.PathLike, *, chars_per_token: float = 4.0,
                   limit: int | None = None) -> tuple[pd.DataFrame, dict[str, int]]:
    """Per-turn token counts of a ShareGPT JSON file.

    Records are ``{"id": str, "conversations": [{"from": role, "value": text}, ...]}``.
    Consecutive records whose ids are ``<conv>_<k>`` with the same ``<conv>`` are chunks of one
    conversation (ShareGPT's ``split_long_conversation``) and are joined in file order. Within
    a conversation, messages map to sides (``USER_ROLES`` / ``ASSISTANT_ROLES``), consecutive
    messages of one side merge, and a turn is (user tokens, assistant tokens). Assistant text
    before any user message is folded into the first user prompt (it is context the model
    sees); a trailing user message without a reply has no output and ends the conversation
    (counted in the stats). Tokens per message: `estimate_tokens`.

    Args:
        path: the JSON file (a top-level array).
        chars_per_token: characters per token of the estimate.
        limit: read only the first ``limit`` records.

    Returns:
        ``(turns, stats)``: turns has ``conversation`` (0-based, file order), ``source_id``
        (``<conv>``), ``turn``, ``user_tokens``, ``assistant_tokens``; stats counts
        ``records``, ``conversations``, ``turns``, ``empty_conversations`` (no complete turn)
        and ``trailing_user_messages``.

    Raises:
        TraceError: ``<file>: line L column C: record i (id X): field F: ...`` for a record that
            is not an object, lacks ``conversations`` (a list) or a string ``id``, or has a
            message that is not an object with a known string ``from`` and a string ``value``.
    """
    path = Path(path)
    if not path.exists():
        raise TraceError(f"{path}: no such file")
    if not path.is_file():
        raise TraceError(f"{path}: not a file")
    text = read_text(path)
    known = sorted(USER_ROLES | ASSISTANT_ROLES)
    convs: list[tuple[str, list[tuple[bool, int]]]] = []
    n_records = 0
    for index, line, column, rec in _iter_json_array(text, path):
        if limit is not None and index >= limit:
            break
        n_records += 1
        where = f"{path}: line {line} column {column}: record {index}"
        if not isinstance(rec, dict):
            raise TraceError(f"{where}: expected an object, got {type(rec).__name__}")
        rid = rec.get("id")
        if not isinstance(rid, str):
            raise TraceError(f"{where}: field id: expected a string, got {rid!r}")
        where += f" (id {rid!r})"
        msgs = rec.get("conversations")
        if not isinstance(msgs, list):
            raise TraceError(f"{where}: field conversations: expected a list, got "
                             f"{type(msgs).__name__ if msgs is not None else 'nothing'}")
        sides = []
        for j, m in enumerate(msgs):
            if not isinstance(m, dict):
                raise TraceError(f"{where}: field conversations[{j}]: expected an object")
            who, val = m.get("from"), m.get("value")
            if not isinstance(who, str) or who not in USER_ROLES | ASSISTANT_ROLES:
                raise TraceError(f"{where}: field conversations[{j}].from: expected one of "
                                 f"{'|'.join(known)}, got {who!r}")
            if not isinstance(val, str):
                raise TraceError(f"{where}: field conversations[{j}].value: expected a string, "
                                 f"got {type(val).__name__}")
            sides.append((who in USER_ROLES, estimate_tokens(val, chars_per_token)))
        mo = _CHUNK_ID.match(rid)
        conv = mo.group(1) if mo else rid
        if convs and mo and convs[-1][0] == conv and int(mo.group(2)) > 0:
            convs[-1][1].extend(sides)
        else:
            convs.append((conv, sides))
    out = {k: [] for k in ("conversation", "source_id", "turn", "user_tokens",
                           "assistant_tokens")}
    stats = {"records": n_records, "conversations": 0, "turns": 0, "empty_conversations": 0,
             "trailing_user_messages": 0}
    for conv, sides in convs:
        turns: list[tuple[int, int]] = []
        user = asst = 0
        for is_user, tok in sides:
            if is_user:
                if asst:
                    turns.append((user, asst))
                    user = asst = 0
                user += tok
            elif user == 0 and not turns:
                user += tok
            else:
                asst += tok
        if asst:
            turns.append((user, asst))
        elif user:
            stats["trailing_user_messages"] += 1
        if not turns:
            stats["empty_conversations"] += 1
            continue
        c = stats["conversations"]
        for k, (u, a) in enumerate(turns):
            out["conversation"].append(c)
            out["source_id"].append(conv)
            out["turn"].append(k)
            out["user_tokens"].append(u)
            out["assistant_tokens"].append(a)
        stats["conversations"] += 1
        stats["turns"] += len(turns)
    df = pd.DataFrame(out).astype({"conversation": np.int64, "turn": np.int64,
                                   "user_tokens": np.int64, "assistant_tokens": np.int64})
    return df, stats


@dataclass(frozen=True)
class ShareGPTImport:
    """How `import_sharegpt` times and sizes ShareGPT's conversations (ShareGPT has no
    timestamps and no token counts), checked when built.

    Attributes:
        base_rate: conversation starts per second (Poisson), > 0.
        think_time_s: mean of the exponential part of the gap between turns, seconds (>= 0;
            0: none).
        min_think_time_s: the gap's fixed part, seconds (>= 0).
        system_prompt_tokens: a shared system prompt of this many tokens per group at the
            head of every prompt (>= 0; 0: none).
        max_conversation_tokens: keep each conversation's leading turns whose prompts and
            outputs, system prompt included, fit in this many tokens (>= 1); None: every turn.
        chars_per_token: characters per token of the estimate (`estimate_tokens`), finite
            and > 0.
    """

    base_rate: float = 1.0
    think_time_s: float = 10.0
    min_think_time_s: float = 1.0
    system_prompt_tokens: int = 0
    max_conversation_tokens: int | None = None
    chars_per_token: float = 4.0

    def __post_init__(self) -> None:
        if not self.base_rate > 0:
            raise ValueError(f"base_rate must be > 0 conversations/s, got {self.base_rate}")
        for name in ("think_time_s", "min_think_time_s"):
            v = getattr(self, name)
            if not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"{name} must be a finite number >= 0 s, got {v}")
        if not (_is_int(self.system_prompt_tokens) and self.system_prompt_tokens >= 0):
            raise ValueError(f"system_prompt_tokens must be an integer >= 0, got "
                             f"{self.system_prompt_tokens!r}")
        m = self.max_conversation_tokens
        if m is not None and not (_is_int(m) and m >= 1):
            raise ValueError(f"max_conversation_tokens must be an integer >= 1 or None, got "
                             f"{m!r}")
        if not (self.chars_per_token > 0 and math.isfinite(self.chars_per_token)):
            raise ValueError(f"chars_per_token must be a finite number > 0, got "
                             f"{self.chars_per_token}")


def import_sharegpt(path: str | os.PathLike, *, groups: Sequence[str] | None = None,
                    num_groups: int | None = None,
                    contract: str = "standard", role: str = "benign",
                    shape: ShareGPTImport = ShareGPTImport(), seed: int = 0,
                    vocab_size: int = DEFAULT_VOCAB_SIZE, warmup_s: float = 0.0,
                    limit: int | None = None, assign: str | None = None,
                    tenant_skew: float = 1.0,
                    tenant_map: str | os.PathLike | None = None,
                    allow_fewer_groups: bool = False) -> Trace:
    """Import ShareGPT JSON conversations as multi-turn requests (as the ``sharegpt`` workload).

    Turns come from `parse_sharegpt` (``shape.chars_per_token``). Every conversation is used
    once, in file order, assigned whole to one of ``groups`` by the tenant model ``assign``
    (``round_robin`` and ``session``: conversation i to group i mod G; ``zipf``:
    conversations to skewed tenants; ``map``: records are conversations); conversation starts
    are Poisson at ``shape.base_rate`` (conversations/s) and turn k+1 arrives
    ``min_think_time_s + Exponential(think_time_s)`` seconds (of ``shape``) after turn k
    (ShareGPT has no timestamps; both drawn from ``seed``). Turn k's prompt = group system
    prompt (if ``shape.system_prompt_tokens > 0``) + all earlier user and assistant segments
    + the new user segment; it generates the turn's assistant segment
    (``output_segment_id``; ``output_tokens`` = its length); prefix_id = conversation index.
    ``shape.max_conversation_tokens`` keeps each conversation's leading turns that fit (a
    conversation whose first turn does not fit contributes no request; counted in meta).
    A group left without requests is an error unless ``allow_fewer_groups``. ``meta`` records
    every field of ``shape`` under its own name.

    Raises:
        TraceError: for malformed records, see `parse_sharegpt`.
    """
    base_rate, think_time_s = shape.base_rate, shape.think_time_s
    min_think_time_s, system_prompt_tokens = shape.min_think_time_s, shape.system_prompt_tokens
    max_conversation_tokens, chars_per_token = shape.max_conversation_tokens, shape.chars_per_token
    path = Path(path)
    groups = _check_common(path, groups, num_groups, role)
    turns, stats = parse_sharegpt(path, chars_per_token=chars_per_token, limit=limit)
    convs = []
    dropped = 0
    for _, g in turns.groupby("conversation", sort=True):
        u = g["user_tokens"].to_numpy(np.int64)
        a = g["assistant_tokens"].to_numpy(np.int64)
        n = cap_turns(u, a, system_prompt_tokens, max_conversation_tokens)
        if n == 0:
            dropped += 1
        convs.append((u[:n], a[:n]))
    rng = np.random.default_rng([int(seed), 7])
    starts = np.cumsum(rng.exponential(1.0 / base_rate, size=len(convs)))
    n_turns = int(sum(len(u) for u, _ in convs))
    gaps = min_think_time_s + (rng.exponential(think_time_s, size=n_turns)
                               if think_time_s > 0 else np.zeros(n_turns))
    assign = "round_robin" if assign is None else assign
    if assign == "prefix":
        raise ValueError("--assign prefix: ShareGPT conversations are their own prefixes; use "
                         "session (the same as round_robin), zipf or map")
    if assign == "trace":
        raise ValueError("--assign trace: ShareGPT records have no tenant field; use "
                         "session, zipf, servegen or map")
    if assign not in TENANT_MODELS:
        raise ValueError(f"assign must be one of {', '.join(TENANT_MODELS)}, got {assign!r}")
    conv_ids = np.arange(len(convs))
    ten = _tenants(assign, conv_ids, conv_ids, groups, seed, tenant_skew, tenant_map,
                   allow_fewer_groups)
    groups, group_of, contracts = ten.groups, ten.index, ten.contracts
    if ten.plan["unit"] == "root":
        ten.plan["unit"] = "conversation"
    if contracts and len(set(contracts.values()) | {contract}) > 1:
        raise ValueError("per-group contracts in a tenant map are not supported for ShareGPT "
                         "imports; give --contract")
    rows = RequestRows()
    n_rows = add_conversations(rows, convs=convs, starts=starts,
                               group_of=group_of, groups=groups,
                               contract=next(iter(contracts.values()), contract), role=role,
                               system_prompt_tokens=system_prompt_tokens, gaps=gaps,
                               horizon_s=math.inf, warmup_s=warmup_s,
                               conversation_ids=np.arange(len(convs)))
    if n_rows == 0:
        raise TraceError(f"{path}: no complete turn to import")
    meta = {"importer": "sharegpt", "source": path.name, **stats, "requests": n_rows,
            "conversations_over_cap": dropped, "groups": groups, "assign": assign,
            "tenant_skew": tenant_skew, "contract": contract,
            "role": role, "base_rate": base_rate, "think_time_s": think_time_s,
            "min_think_time_s": min_think_time_s, "system_prompt_tokens": system_prompt_tokens,
            "max_conversation_tokens": max_conversation_tokens,
            "chars_per_token": chars_per_token, "warmup_s": warmup_s, "limit": limit,
            "tenant_plan": ten.plan, "priorities": ten.priorities,
            "tenant_map_contracts": ten.contracts,
            "requests_per_group": _counted(rows, groups, assign, _units(ten.plan),
                                           allow_fewer_groups)}
    return rows.finish(seed, vocab_size, meta)
