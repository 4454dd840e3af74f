"""Regenerate ``traces/data/azure_conv_generated_tokens.csv`` from the Azure LLM inference trace.

Usage (from the repository root)::

    python -m prefixshield.traces.derive_outputs [--source FILE] [--out FILE] [--check]

The file is the histogram of the ``GeneratedTokens`` column of Azure's 2023 conversation trace
(``AzureLLMInferenceTrace_conv.csv``, 19,366 requests of a production conversation service,
counted with the service's own tokenizer): one row per distinct output length, columns
``generated_tokens, count``, ascending. No timestamps or context lengths are stored. The output is
byte-for-byte reproducible; ``--check`` compares instead of writing. See ``data/PROVENANCE.md``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from prefixshield.atomic import write_text
from prefixshield.traces.shipped import AZURE_CONV_FILE

_REPO = Path(__file__).resolve().parents[2]
DEFAULT_SOURCE = _REPO.parent / "shared" / "data" / "azure-llm-2023" / \
    "AzureLLMInferenceTrace_conv.csv"
DEFAULT_OUT = Path(__file__).resolve().parent / "data" / AZURE_CONV_FILE


def derive(source: Path) -> str:
    """The histogram CSV text of ``source``'s ``GeneratedTokens`` column."""
    df = pd.read_csv(source, usecols=["GeneratedTokens"])
    counts = df["GeneratedTokens"].astype("int64").value_counts().sort_index()
    table = pd.DataFrame({"generated_tokens": counts.index, "count": counts.to_numpy()})
    return table.to_csv(index=False, lineterminator="\n")


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--check", action="store_true", help="compare with --out instead of writing")
    args = ap.parse_args(argv)
    text = derive(args.source)
    table = pd.read_csv(args.source, usecols=["GeneratedTokens"])["GeneratedTokens"]
    print(f"{len(table)} requests, {text.count(chr(10)) - 1} distinct lengths; mean "
          f"{table.mean():.1f}, median {table.median():.0f}, min {table.min()}, max {table.max()}")
    if args.check:
        same = args.out.exists() and args.out.read_text() == text
        print(f"{args.out}: {'up to date' if same else 'DIFFERS'}")
        return 0 if same else 1
    write_text(args.out, text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
