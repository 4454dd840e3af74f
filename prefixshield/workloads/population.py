"""The traffic population of the attack workloads: the victim's share of the base load and the
benign background groups that send the rest.

The reference sets "the base arrival rate to alpha C_prefill" for its traces, and its overhead
section times victim selection "at the default-scale 512-block/8-group setting": its traces
carry more accounting groups than one victim and one attacker, and its text does not say that
the victim alone sends the base load. Two readings are kept:

* ``background`` (the default): the victim sends ``victim_share`` of ``base_rate`` (or
  ``victim_rate`` requests/s), and ``background_groups`` benign groups (6: the 8-group setting
  less the victim and the attacker) send the rest, an equal Poisson share each. A background
  request is its group's system prompt (``background_prefix_tokens``, one per group, cached
  after its first use) plus a unique suffix of the shared ``suffix_tokens`` range, with the
  shared output lengths: a benign tenant whose traffic reuses its own short template. The
  background groups are role ``benign`` on ``background_contract`` and are not judged (the
  judged population stays the measured victim requests).
* ``two_group``: the victim sends the whole base load; no background group (the simulator's
  reading before the population existed; every trace of it is the trace it was).

Each attack workload's params carry ``population`` (one of `POPULATIONS`); the fields
whose default depends on the reading (``background_groups``, ``victim_share`` and each
workload's own fitted values) default to None and are filled from the params class's
``POPULATION_DEFAULTS`` for that reading; a value given explicitly wins. The fitted values and
what they were fitted to: docs/fidelity.md.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from prefixshield.edges import check_count
from prefixshield.traces.rows import RequestRows
from prefixshield.traces.segments import MAX_GROUP_INDEX, SegmentKind, segment_ids
from prefixshield.workloads.base import prefix_suffix_prompts, renewal_times

POPULATIONS = ("background", "two_group")
"""The readings of whose arrivals make up the base load (see the module docstring)."""

GI_BACKGROUND = 3
"""Segment namespace of the first background group (0-2: victim, attacker, neutral)."""

MAX_BACKGROUND_GROUPS = 1024
"""Most background groups a trace may carry."""


def background_names(p) -> list[str]:
    """The background groups' names: ``{background_group}1`` ... ``{background_group}N``."""
    return [f"{p.background_group}{i + 1}" for i in range(p.background_groups)]


def background_rate(p) -> float:
    """Requests/s each background group sends: ``(base_rate - victim rate) / N`` (0 if N=0)."""
    if p.background_groups == 0:
        return 0.0
    return (p.base_rate - p.victim_request_rate) / p.background_groups


def check_population(p) -> None:
    """Raise ValueError unless the victim's rate and the background make up ``base_rate``:
    a victim rate above the base rate, or below it with no background group to send the rest,
    is refused (checked when the trace is drawn: ``base_rate`` is set after the params)."""
    v = p.victim_request_rate
    if v > p.base_rate * (1 + 1e-12):
        raise ValueError(f"victim_rate {v:.6g} req/s exceeds the base rate {p.base_rate:.6g} "
                         f"req/s (alpha x C_prefill, the whole trace's)")
    if p.background_groups == 0 and v < p.base_rate * (1 - 1e-12):
        raise ValueError(f"the victim sends {v:.6g} of the base rate's {p.base_rate:.6g} "
                         f"req/s and no background group sends the rest; set "
                         f"background_groups >= 1 or victim_share=1")


def add_background(rows: RequestRows, p, rng: np.random.Generator, a: float, b: float,
                   sent: list[int] | None = None) -> list[int]:
    """Each background group's Poisson arrivals in ``[a, b)`` (measured), drawn group after
    group from ``rng``: its system prompt (prefix_id 0) plus a unique suffix. ``sent``: requests
    each group sent before (their suffix segments go on from there; None: none). Returns the
    counts with this window's added."""
    names = background_names(p)
    sent = list(sent) if sent is not None else [0] * len(names)
    rate = background_rate(p)
    for i, name in enumerate(names):
        if rate <= 0:  # the victim sends the whole base load: configured, silent groups
            rows.declare(name, p.background_contract)
            continue
        t = renewal_times(rng, rate, a, b)
        n = len(t)
        suffix_len = p.draw_suffixes(rng, n)
        out = p.draw_outputs(rng, n)
        gi = GI_BACKGROUND + i
        ids, lens = prefix_suffix_prompts(
            segment_ids(gi, SegmentKind.SYSTEM, np.zeros(n, dtype=np.int64)),
            p.background_prefix_tokens,
            segment_ids(gi, SegmentKind.SUFFIX, sent[i] + np.arange(n)), suffix_len)
        rows.add(t, name, p.background_contract, "benign", 0, True, out, ids, lens)
        sent[i] += n
    return sent


def check_background_size(p) -> None:
    """Refuse a background whose groups exceed the segment namespaces or the limits."""
    check_count(p.background_groups, MAX_BACKGROUND_GROUPS, "background_groups")
    check_count(GI_BACKGROUND + p.background_groups - 1, MAX_GROUP_INDEX,
                "background group segment namespaces")


def population_meta(p) -> dict[str, Any]:
    """What a trace's meta records of its population: the reading, the victim's rate and share
    of the base load, and every group with its contract, role and rate (requests/s)."""
    v = p.victim_request_rate
    groups = [{"group": p.victim_group, "contract": p.victim_contract, "role": "victim",
               "rate_req_per_s": v}]
    rate = background_rate(p)
    groups += [{"group": g, "contract": p.background_contract, "role": "benign",
                "rate_req_per_s": rate, "prompt": f"{p.background_prefix_tokens}-token system "
                f"prompt + {p.suffix_tokens[0]}-{p.suffix_tokens[1]} suffix"}
               for g in background_names(p)]
    groups.append({"group": p.attacker_group, "contract": p.attacker_contract,
                   "role": "attacker", "rate_req_per_s": p.attacker_request_rate()
                   if p.attack else 0.0})
    return {"population": p.population, "victim_rate_req_per_s": v,
            "victim_share": v / p.base_rate, "background_groups": p.background_groups,
            "population_groups": groups}


def population_text(meta: dict) -> str | None:
    """One line for a run's header: how many groups, and each group's contract and rate
    (background groups grouped when they are alike); None for a trace without a population."""
    groups = meta.get("population_groups")
    if not groups:
        return None
    parts = []
    bg = [g for g in groups if g["role"] == "benign"]
    for g in groups:
        if g["role"] == "benign":
            continue
        parts.append(f"{g['group']} ({g['role']}, {g['contract']}) "
                     f"{g['rate_req_per_s']:.3g} req/s")
    if bg:
        first, last = bg[0], bg[-1]
        parts.insert(1, f"{len(bg)} background groups {first['group']}..{last['group']} "
                        f"(benign, {first['contract']}) {first['rate_req_per_s']:.3g} req/s "
                        f"each, {first['prompt']}")
    return (f"population ({meta['population']}): {len(groups)} groups; victim share "
            f"{meta['victim_share']:.3g} of the base rate; " + "; ".join(parts))


def canonical_tenants(meta: dict, p) -> dict:
    """``meta`` with its tenants in the population's order (victim, attacker, the background
    groups in turn): the order a streamed trace declares before it draws a row, so the two
    bind the same groups in the same order."""
    groups = [p.victim_group, p.attacker_group, *background_names(p)]
    contracts = list(dict.fromkeys([p.victim_contract, p.attacker_contract,
                                    *([p.background_contract] if p.background_groups else [])]))
    t = meta.get("tenants", {})
    return {**meta, "tenants": {
        "groups": list(dict.fromkeys([*groups, *t.get("groups", [])])),
        "contracts": list(dict.fromkeys([*contracts, *t.get("contracts", [])]))}}
