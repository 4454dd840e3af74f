"""Small helpers shared by the trace tests."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from prefixshield.traces.schema import Trace

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SHARED_DATA = Path(__file__).resolve().parents[3] / "shared" / "data"

_REAL = {
    "mooncake": SHARED_DATA / "mooncake" / "synthetic_trace.jsonl",
    "azure": SHARED_DATA / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv",
    "sharegpt": SHARED_DATA / "sharegpt" / "ShareGPT_V3_unfiltered_cleaned_split.first570.json",
}
_FIXTURE = {
    "mooncake": FIXTURES / "mooncake_synthetic_head60.jsonl",
    "azure": FIXTURES / "azure_conv_head40.csv",
    "sharegpt": FIXTURES / "sharegpt_first6.json",
}


def data_file(kind: str) -> Path:
    """The real public file when ../shared/data is present, else its committed cut.

    Set ``PREFIXSHIELD_TEST_FIXTURES_ONLY=1`` to use the cuts anyway (what CI sees).
    """
    real = _REAL[kind]
    if os.environ.get("PREFIXSHIELD_TEST_FIXTURES_ONLY") or not real.exists():
        return _FIXTURE[kind]
    return real


def rows(trace: Trace, role: str | None = None, group: str | None = None) -> pd.DataFrame:
    """Request rows of one role and/or group, index reset."""
    df = trace.requests
    mask = np.ones(len(df), dtype=bool)
    if role is not None:
        mask &= (df["role"] == role).to_numpy()
    if group is not None:
        mask &= (df["group"] == group).to_numpy()
    return df[mask].reset_index(drop=True)


def segment_lengths_by_id(df: pd.DataFrame) -> dict[int, set[int]]:
    """Every segment id -> the set of lengths it appears with."""
    out: dict[int, set[int]] = {}
    for ids, lens in zip(df["segment_ids"], df["segment_lengths"]):
        for s, n in zip(ids, lens):
            out.setdefault(int(s), set()).add(int(n))
    return out


def full_blocks(tokens: int, block_size: int = 16) -> int:
    """Full KV blocks of ``tokens`` tokens."""
    return tokens // block_size


def write_text(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` and return the path."""
    path.write_text(text, encoding="utf-8")
    return path
