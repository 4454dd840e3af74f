"""Where a trace's requests diverge, and whether a tenant model gave every group requests.

A trace without tenants gets them from a tenant model (``--assign``). The prefix-root models
(``session``, ``prefix``, ``zipf`` on Mooncake) keep requests that share a *root* together. A
block that every request of the trace starts with (a shared system prompt) is not a tenant: on
Mooncake's conversation trace every request begins with the same 512-token block, so rooting at
the first block puts every request in one group. The root is therefore the first block where
the trace's requests diverge: the block after their longest common prefix.

A model can still yield fewer groups than asked (fewer units than groups, or a seeded draw that
leaves a group empty). :func:`check_group_count` makes that an error unless the caller accepts
it, so a user never studies four tenants that are silently one.
"""

from __future__ import annotations

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
    :func:`shared_prefix_blocks`. With ``shared == 0`` the roots are the first blocks.
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
