"""Multi-turn conversations: the packaged ShareGPT turn table and the rows of a conversation.

Shared by the ``sharegpt`` workloads and the ShareGPT importer. A conversation is a list of turns
``(user tokens, assistant tokens)``; turn k's prompt is ``[system] + u0, a0, ..., uk`` and it
generates ``ak``, so every turn's prompt extends the previous turn's prompt and output.
"""

from __future__ import annotations

import functools
import gzip
import io
from importlib import resources
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from prefixshield.traces.rows import RequestRows
from prefixshield.traces.schema import TraceError
from prefixshield.traces.segments import SegmentKind, segment_ids

SHAREGPT_TURNS_FILE = "sharegpt_turns.csv.gz"
"""Packaged turn table: ``conversation, source_id, turn, user_tokens, assistant_tokens``."""

TURN_COLUMNS = ("conversation", "source_id", "turn", "user_tokens", "assistant_tokens")


@functools.lru_cache(maxsize=4)
def _load_turns(path: str | None) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    if path is None:
        raw = resources.files("prefixshield.traces").joinpath("data", SHAREGPT_TURNS_FILE)
        data = raw.read_bytes()
        src = f"prefixshield/traces/data/{SHAREGPT_TURNS_FILE}"
    else:
        data = Path(path).read_bytes()
        src = str(path)
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    df = pd.read_csv(io.BytesIO(data))
    missing = [c for c in TURN_COLUMNS if c not in df.columns]
    if missing:
        raise TraceError(f"{src}: missing column(s) {', '.join(missing)}")
    df = df.sort_values(["conversation", "turn"], kind="stable")
    convs = []
    for _, g in df.groupby("conversation", sort=True):
        u = g["user_tokens"].to_numpy(np.int64)
        a = g["assistant_tokens"].to_numpy(np.int64)
        if (u < 1).any() or (a < 1).any():
            raise TraceError(f"{src}: conversation {g['conversation'].iloc[0]}: token counts must "
                             f"be >= 1")
        u.flags.writeable = False
        a.flags.writeable = False
        convs.append((u, a))
    return tuple(convs)


def sharegpt_turns(path: str | None = None) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    """Per conversation, (user_tokens, assistant_tokens) per turn from a turn table.

    Args:
        path: a turn CSV (optionally gzipped) with ``TURN_COLUMNS``; None: the packaged one.
    """
    return _load_turns(None if path is None else str(path))


def cap_turns(user: np.ndarray, assistant: np.ndarray, system_tokens: int,
              max_tokens: int | None, max_turns: int | None = None) -> int:
    """Leading turns that fit: ``system + cumsum(user + assistant) <= max_tokens`` (tokens)."""
    n = len(user)
    if max_turns is not None:
        n = min(n, max_turns)
    if max_tokens is None:
        return n
    cum = system_tokens + np.cumsum(user[:n] + assistant[:n])
    return int(np.searchsorted(cum, max_tokens, side="right"))


def add_conversations(rows: RequestRows, *, convs: Sequence[tuple[np.ndarray, np.ndarray]],
                      starts: np.ndarray, group_of: np.ndarray, groups: Sequence[str],
                      contract: str, role: str, system_prompt_tokens: int,
                      gaps: np.ndarray, horizon_s: float, warmup_s: float,
                      conversation_ids: np.ndarray) -> int:
    """Append multi-turn conversation rows; returns the number of rows added.

    Conversation i starts at ``starts[i]`` in group ``groups[group_of[i]]`` with turns
    ``convs[i]``; ``gaps`` holds one inter-turn gap (seconds) per turn of all conversations in
    order (the gap before turn 0 is ignored). Turn k's prompt: ``[system] + u0, a0, ..., uk``;
    it generates ``ak``. Segment ids come from the group's SYSTEM / SUFFIX / OUTPUT namespaces
    (group index = position in ``groups``); prefix_id = ``conversation_ids[i]``. Turns at or
    after ``horizon_s`` are cut; rows before ``warmup_s`` are unmeasured.
    """
    counters = np.zeros(len(groups), dtype=np.int64)
    g_pos = 0
    added = 0
    for i, (u, a) in enumerate(convs):
        n = len(u)
        if n == 0:
            continue
        gi = int(group_of[i])
        t = starts[i] + np.concatenate([[0.0], np.cumsum(gaps[g_pos + 1:g_pos + n])])
        g_pos += n
        n_keep = int(np.searchsorted(t, horizon_s, side="left"))
        if n_keep == 0:
            continue
        local = counters[gi] + np.arange(n)
        counters[gi] += n
        useg = segment_ids(gi, SegmentKind.SUFFIX, local)
        aseg = segment_ids(gi, SegmentKind.OUTPUT, local)
        hist_ids = np.empty(2 * n, dtype=np.int64)
        hist_ids[0::2], hist_ids[1::2] = useg, aseg
        hist_len = np.empty(2 * n, dtype=np.int64)
        hist_len[0::2], hist_len[1::2] = u, a
        if system_prompt_tokens > 0:
            hist_ids = np.concatenate([segment_ids(gi, SegmentKind.SYSTEM, [0]), hist_ids])
            hist_len = np.concatenate([[system_prompt_tokens], hist_len])
            off = 1
        else:
            off = 0
        ids = [hist_ids[:off + 2 * k + 1] for k in range(n_keep)]
        lens = [hist_len[:off + 2 * k + 1] for k in range(n_keep)]
        rows.add(t[:n_keep], groups[gi], contract, role, conversation_ids[i],
                 t[:n_keep] >= warmup_s, a[:n_keep], ids, lens, output_segment_id=aseg[:n_keep])
        added += n_keep
    return added

