"""Regenerate ``traces/data/sharegpt_turns.csv.gz`` from the ShareGPT sample in ``../shared/data``.

Usage (from the repository root)::

    python -m prefixshield.traces.derive_sharegpt [--source FILE] [--out FILE] [--check]

The derivation (see ``traces/data/PROVENANCE.md``): `prefixshield.traces.importers.parse_sharegpt`
with 4 characters per token (chunks ``<conv>_<k>`` joined, sides merged), then
each conversation cut to its leading turns whose cumulative tokens stay within
``STORED_CAP_TOKENS``; conversations left with no turn are dropped and renumbered. The output is
byte-for-byte reproducible (gzip without a timestamp). ``--check`` compares instead of writing
and also prints the sanity comparison against the Sarathi-Serve Llama-2 token counts.
"""

from __future__ import annotations

import argparse
import gzip
import io
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from prefixshield.traces.conversations import SHAREGPT_TURNS_FILE, TURN_COLUMNS, cap_turns
from prefixshield.traces.importers import parse_sharegpt

CHARS_PER_TOKEN = 4.0
"""Characters per token of the length estimate."""

STORED_CAP_TOKENS = 16384
"""Cap on a stored conversation's cumulative (user + assistant) tokens."""

_REPO = Path(__file__).resolve().parents[2]
DEFAULT_SOURCE = (_REPO.parent / "shared" / "data" / "sharegpt"
                  / "ShareGPT_V3_unfiltered_cleaned_split.first570.json")
DEFAULT_SARATHI = (_REPO.parent / "shared" / "data" / "sarathi-serve"
                   / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv")
DEFAULT_OUT = Path(__file__).resolve().parent / "data" / SHAREGPT_TURNS_FILE


def derive(source: Path) -> tuple[pd.DataFrame, dict[str, int]]:
    """The capped turn table (``TURN_COLUMNS``) and the parse statistics of ``source``."""
    turns, stats = parse_sharegpt(source, chars_per_token=CHARS_PER_TOKEN)
    parts = []
    for _, g in turns.groupby("conversation", sort=True):
        n = cap_turns(g["user_tokens"].to_numpy(), g["assistant_tokens"].to_numpy(), 0,
                      STORED_CAP_TOKENS)
        if n:
            parts.append(g.iloc[:n])
    out = pd.concat(parts, ignore_index=True)
    out["conversation"] = pd.factorize(out["conversation"])[0].astype(np.int64)
    stats = dict(stats, stored_conversations=int(out["conversation"].nunique()),
                 stored_turns=len(out))
    return out[list(TURN_COLUMNS)], stats


def to_bytes(table: pd.DataFrame) -> bytes:
    """Deterministic gzipped CSV of a turn table."""
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as gz:
        gz.write(table.to_csv(index=False, lineterminator="\n").encode())
    return buf.getvalue()


def sarathi_comparison(table: pd.DataFrame, sarathi: Path) -> str:
    """One line comparing our estimated lengths with Sarathi-Serve's Llama-2 token counts."""
    s = pd.read_csv(sarathi)
    first = table[table["turn"] == 0]
    return (f"first-turn user tokens (chars/4) mean {first['user_tokens'].mean():.0f} "
            f"median {first['user_tokens'].median():.0f}; assistant tokens mean "
            f"{table['assistant_tokens'].mean():.0f} median "
            f"{table['assistant_tokens'].median():.0f} | sarathi llama2 prefill mean "
            f"{s['num_prefill_tokens'].mean():.0f} median {s['num_prefill_tokens'].median():.0f};"
            f" decode mean {s['num_decode_tokens'].mean():.0f} median "
            f"{s['num_decode_tokens'].median():.0f}")


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--check", action="store_true",
                    help="compare with --out instead of writing it")
    ap.add_argument("--sarathi", type=Path, default=DEFAULT_SARATHI)
    args = ap.parse_args(argv)
    table, stats = derive(args.source)
    data = to_bytes(table)
    print(", ".join(f"{k}={v}" for k, v in stats.items()))
    if args.sarathi.exists():
        print(sarathi_comparison(table, args.sarathi))
    if args.check:
        same = args.out.exists() and args.out.read_bytes() == data
        print(f"{args.out}: {'up to date' if same else 'DIFFERS'}")
        return 0 if same else 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(args.out)
    print(f"wrote {args.out} ({len(data)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
