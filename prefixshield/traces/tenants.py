"""Where a trace's requests diverge, and whether a tenant model gave every group requests.

A trace without tenants gets them from a tenant model (``--assign``). The prefix-root models
(``session``, ``prefix``, ``zipf`` on Mooncake) keep requests that share a *root* together. A
block that every request of the trace starts with (a shared system prompt) is not a tenant: on
Mooncake's conversation trace every request begins with the same 512-token block, so rooting at
the first block puts every request in one group. The root is therefore the first block where
the trace's requests diverge: the block after their longest common prefix.

A model can still yield fewer groups than asked (fewer units than groups, or a seeded draw that
leaves a group empty). `check_group_count` makes that an error unless the caller accepts
it, so a user never studies four tenants that are silently one.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np


def shared_prefix_blocks(blocks: Sequence[np.ndarray]) -> int:
    """Length (in blocks) of the longest prefix that every request's block-key list shares.

    Args:
        blocks: per request, its prompt's block keys in order (e.g. Mooncake ``hash_ids``);
            each non-empty.

    Returns:
        0 when two requests differ in their first block (no shared prefix); at most the
        shortest request's length.
    """
    if not len(blocks):
        return 0
    shortest = min(len(b) for b in blocks)
    head = np.stack([np.asarray(b[:shortest], dtype=np.int64) for b in blocks])
    same = np.all(head == head[0], axis=0)
    # the first column where some request differs, or the whole head if none does
    return int(np.argmin(same)) if not same.all() else shortest


def divergence_roots(blocks: Sequence[np.ndarray]) -> tuple[np.ndarray, int]:
    """Each request's root: its first block after the prefix every request shares.

    Returns ``(roots, shared)``: ``roots[i]`` is ``blocks[i][shared]``, or the request's last
    block when the whole request lies inside the shared prefix; ``shared`` is
    `shared_prefix_blocks`. With ``shared == 0`` the roots are the first blocks.
    """
    shared = shared_prefix_blocks(blocks)
    roots = np.fromiter((int(b[min(shared, len(b) - 1)]) for b in blocks), dtype=np.int64,
                        count=len(blocks))
    return roots, shared


def check_group_count(model: str, counts: dict[str, int], units: int,
                      allow_fewer: bool) -> None:
    """Refuse a tenant assignment that left a group without requests.

    Args:
        model: the tenant model's name (``--assign`` value), for the message.
        counts: requests per group, every asked group listed (0 for an empty one).
        units: how many units (records, sessions, prefix roots) the model assigned.
        allow_fewer: accept the assignment anyway (``--allow-fewer-groups``).

    Raises:
        ValueError: one line naming ``--assign``/``--groups`` and ``--allow-fewer-groups``.
    """
    used = sum(1 for n in counts.values() if n > 0)
    if used == len(counts) or allow_fewer:
        return
    empty = [g for g, n in counts.items() if n == 0]
    raise ValueError(f"--assign {model} --groups {len(counts)}: only {used} of {len(counts)} "
                     f"groups received requests ({units:,} units to assign; empty: "
                     f"{', '.join(empty[:4])}{', ...' if len(empty) > 4 else ''}); use another "
                     "--assign or fewer --groups, or accept it with --allow-fewer-groups")


def root_sessions(blocks: Sequence[np.ndarray], roots: np.ndarray, shared: int
                  ) -> tuple[np.ndarray, dict[int, int]]:
    """Each request's session within its root, and each root's own shared prefix.

    A root (see `divergence_roots`) may be a system prompt that many sessions share (on a
    trace with several system prompts every request's root is its prompt's first block), or
    one conversation or document. Its *own* shared prefix is the longest prefix, from the root
    block on, that all its requests have; a request's session is the block right after it, so
    the turns of a conversation (each extends the last) stay in one session and the
    conversations under one system prompt are separate sessions. A request that lies wholly
    inside its root's shared prefix forms the root's "prefix-only" session.

    Args:
        blocks: per request, its block keys (e.g. Mooncake ``hash_ids``).
        roots: per request, its root key (`divergence_roots`).
        shared: blocks every request shares before its root (`divergence_roots`).

    Returns:
        ``(session, root_prefix)``: ``session[i]`` is a dense session index, numbered in order
        of first appearance across the whole trace (sessions of different roots never share
        one); ``root_prefix[root]`` is that root's own shared prefix in blocks (>= 1).
    """
    roots = np.asarray(roots, dtype=np.int64)
    members: dict[int, list[int]] = {}
    for i, r in enumerate(roots.tolist()):
        members.setdefault(r, []).append(i)
    keys = np.empty(len(roots), dtype=np.int64)
    root_prefix: dict[int, int] = {}
    for r, idx in members.items():
        tails = [np.asarray(blocks[i][shared:], dtype=np.int64) for i in idx]
        k = shared_prefix_blocks(tails) if len(idx) > 1 else len(tails[0])
        root_prefix[r] = max(k, 1)
        for i, t in zip(idx, tails):
            keys[i] = int(t[k]) if len(t) > k else -1  # -1: the prefix-only session
    # dense ids over (root, key), in order of first appearance
    pairs = np.stack([roots, keys], axis=1)
    _, first, inverse = np.unique(pairs, axis=0, return_index=True, return_inverse=True)
    rank = np.argsort(np.argsort(first, kind="stable"), kind="stable")
    return rank[np.asarray(inverse).reshape(-1)].astype(np.int64), root_prefix


def first_order(units: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(dense, count)``: each record's unit renumbered 0..U-1 in order of first appearance,
    and U."""
    units = np.asarray(units, dtype=np.int64)
    _, first, inverse = np.unique(units, return_index=True, return_inverse=True)
    rank = np.argsort(np.argsort(first, kind="stable"), kind="stable")
    return rank[np.asarray(inverse).reshape(-1)].astype(np.int64), np.int64(len(first))


def fill_empty_groups(unit_group: np.ndarray, num_groups: int) -> np.ndarray:
    """Give every empty group one unit, so that G groups over at least G units are all used.

    A group left empty (a seeded ``zipf`` draw that missed it, ``prefix`` keys that all fall on
    other residues) takes the last-arriving unit of the group with the most units (ties: the
    lower group index), until no group is empty or no group has two units. An assignment that
    uses every group is returned unchanged, so it only touches what used to be refused.

    Args:
        unit_group: the group index of each unit, units in order of first appearance.
        num_groups: G.
    """
    out = np.asarray(unit_group, dtype=np.int64).copy()
    while True:
        counts = np.bincount(out, minlength=num_groups)
        empty = np.flatnonzero(counts == 0)
        donor = int(np.argmax(counts))
        if not empty.size or counts[donor] < 2:
            return out
        out[np.flatnonzero(out == donor)[-1]] = int(empty[0])


def apportion_groups(root_requests: np.ndarray, root_sessions: np.ndarray, num_groups: int
                     ) -> np.ndarray:
    """How many of ``num_groups`` groups each of R < G roots gets: one each, then every further
    group to the root with the most requests per group it would have (D'Hondt; ties: the
    earlier root), never more groups than a root has sessions.

    Args:
        root_requests, root_sessions: per root (in order of first appearance), its requests and
            sessions.

    Returns:
        groups per root (sum ``min(num_groups, sessions)``).
    """
    req = np.asarray(root_requests, dtype=np.float64)
    cap = np.asarray(root_sessions, dtype=np.int64)
    k = np.ones(len(req), dtype=np.int64)
    for _ in range(num_groups - len(req)):
        score = np.where(k < cap, req / (k + 1), -1.0)
        j = int(np.argmax(score))
        if score[j] < 0:
            break
        k[j] += 1
    return k


def check_enough_sessions(model: str, num_groups: int, sessions: int, roots: int,
                          allow_fewer: bool) -> None:
    """Refuse, before dealing, ``num_groups`` groups over fewer ``sessions`` (the finest unit a
    model keeps together), unless ``allow_fewer`` (``--allow-fewer-groups``).

    Raises:
        ValueError: one line naming ``--groups``, the sessions and roots, and the way out.
    """
    if sessions >= num_groups or allow_fewer:
        return
    raise ValueError(f"--assign {model} --groups {num_groups}: the trace has only {sessions:,} "
                     f"session{'s' if sessions != 1 else ''} ({roots:,} root"
                     f"{'s' if roots != 1 else ''}), fewer than the groups; give --groups "
                     f"{sessions} or fewer, use round_robin, or accept empty groups with "
                     "--allow-fewer-groups")


def _model_weights(model: str, G: int, tenant_skew: float) -> np.ndarray:
    """The group shares of ``zipf`` (``1/(g+1)^skew``) or ``servegen`` (real clients)."""
    if model == "servegen":
        from prefixshield.traces.shipped import (SHARES_WINDOW_S, busiest_hour_start,
                                                 rate_shares, servegen_clients)

        if G > 8:
            raise ValueError(f"--assign servegen: at most 8 groups (the shipped clients), got {G}")
        clients = servegen_clients()[:G]
        return np.asarray(rate_shares(clients, busiest_hour_start(clients), SHARES_WINDOW_S),
                          dtype=np.float64)
    if not (math.isfinite(tenant_skew) and tenant_skew > 0):
        raise ValueError(f"tenant_skew must be a finite number > 0, got {tenant_skew}")
    return 1.0 / np.arange(1, G + 1, dtype=np.float64) ** tenant_skew


def _deal_units(model: str, keys: np.ndarray, G: int, seed: int, tenant_skew: float
                ) -> np.ndarray:
    """Group index per unit (units in order of first appearance; ``keys``: each unit's key,
    for ``prefix``), every group used when there are at least G units."""
    n = len(keys)
    if model == "prefix":
        out = np.asarray(keys, dtype=np.int64) % G
    elif model in ("zipf", "servegen"):
        w = _model_weights(model, G, tenant_skew)
        rng = np.random.default_rng([int(seed), 11])
        draw = rng.choice(G, size=n, p=w / w.sum()).astype(np.int64)
        # one draw per unit in order of its key (as before sessions existed: the same seed
        # gives the same tenants it always gave)
        out = draw[np.argsort(np.argsort(np.asarray(keys), kind="stable"), kind="stable")]
    else:  # round_robin, session: dealt in order of first appearance
        out = np.arange(n, dtype=np.int64) % G
    return fill_empty_groups(out, G) if n >= G else out


def deal_tenants(model: str, roots: np.ndarray, sessions: np.ndarray, num_groups: int,
                 seed: int, tenant_skew: float = 1.0, root_prefix: dict[int, int] | None = None
                 ) -> tuple[np.ndarray, dict]:
    """Group index of every record under the tenant model ``model``, and how it dealt them.

    The unit a model keeps together is a *root* (a system prompt, or a conversation or document
    when the trace has none) while the trace has at least as many roots as groups, and a
    *session* within a root otherwise (`root_sessions`):

    - ``session``: roots dealt round-robin in order of first appearance. With fewer roots than
      groups each root gets one group, the rest go to the roots with the most requests per
      group (`apportion_groups`), and a root's sessions are dealt round-robin over its
      groups: a group never mixes system prompts;
    - ``prefix``: root key mod G; with fewer roots than groups, groups apportioned as for
      ``session`` and each root's sessions by session key mod its groups;
    - ``zipf``, ``servegen``: each unit (roots, or with fewer roots than groups every session)
      drawn to group g with the model's shares (seeded); with sessions, a group may hold
      sessions of several roots;
    - ``round_robin``: records (pass ``roots = sessions = record index``).

    Every model then gives each group left empty one unit of the group with the most
    (`fill_empty_groups`), so G groups over at least G units are all used; fewer units
    than groups leave groups empty (see `check_enough_sessions`).

    Args:
        roots: per record, its root key (any int64; for ``prefix`` its value matters).
        sessions: per record, its session: records with equal (root, session) stay together;
            equal to ``roots`` where the trace has no finer unit.
        num_groups: G.
        seed: seed of the ``zipf``/``servegen`` draw.
        root_prefix: per root key, its own shared prefix in blocks (for the plan only).

    Returns:
        ``(group_index, plan)``: ``plan`` says what was dealt: ``unit`` (``root`` or
        ``session``), ``roots``, ``sessions`` and, where roots were split, ``split``: per root
        (in order of first appearance) its key, requests, sessions, own prefix blocks and
        group indices.
    """
    G = num_groups
    roots = np.asarray(roots, dtype=np.int64)
    sessions = np.asarray(sessions, dtype=np.int64)
    root_of, n_roots = first_order(roots)
    pairs = np.stack([root_of, sessions], axis=1)
    _, first, inv = np.unique(pairs, axis=0, return_index=True, return_inverse=True)
    rank = np.argsort(np.argsort(first, kind="stable"), kind="stable")
    sess_of = rank[np.asarray(inv).reshape(-1)].astype(np.int64)
    n_sessions = len(first)
    plan: dict = {"roots": int(n_roots), "sessions": int(n_sessions)}
    root_keys = np.empty(n_roots, dtype=np.int64)
    root_keys[root_of] = roots
    if n_roots >= G or n_sessions == n_roots or model == "round_robin":
        plan["unit"] = "root"
        return _deal_units(model, root_keys, G, seed, tenant_skew)[root_of], plan
    plan["unit"] = "session"
    # each session's root and key (its first record's session value)
    sess_root = np.empty(n_sessions, dtype=np.int64)
    sess_root[sess_of] = root_of
    sess_key = np.empty(n_sessions, dtype=np.int64)
    sess_key[sess_of[::-1]] = sessions[::-1]  # the first record of each session wins
    if model in ("zipf", "servegen"):
        return _deal_units(model, sess_key, G, seed, tenant_skew)[sess_of], plan
    per_root_req = np.bincount(root_of, minlength=n_roots)
    per_root_sess = np.bincount(sess_root, minlength=n_roots)
    k = apportion_groups(per_root_req, per_root_sess, G)
    base = np.concatenate([[0], np.cumsum(k)[:-1]])
    sess_group = np.empty(n_sessions, dtype=np.int64)
    split = []
    for r in range(n_roots):
        mine = np.flatnonzero(sess_root == r)  # in order of first appearance
        local = _deal_units(model, sess_key[mine], int(k[r]), seed, tenant_skew)
        sess_group[mine] = base[r] + local
        split.append({"root": int(root_keys[r]), "requests": int(per_root_req[r]),
                      "sessions": int(per_root_sess[r]),
                      "prefix_blocks": (root_prefix or {}).get(int(root_keys[r])),
                      "groups": [int(base[r] + j) for j in range(int(k[r]))]})
    plan["split"] = split
    return sess_group[sess_of], plan
