"""Derive ``data/servegen_m_large.json`` from ServeGen's per-client fits (Apache-2.0).

ServeGen (Alibaba Cloud Model Studio, "ServeGen: Workload Characterization and Generation of
Large Language Model Serving in Production", 2025) publishes, per client of a production model,
its request rate, inter-arrival CV and fitted inter-arrival distribution (Gamma or Weibull
shape/scale) for every 10-minute window of 14 days (``chunk-N-trace.csv``), and its input and
output token-length distributions for every 6-hour window (``chunk-N-dataset.json``).

What is kept (the ``language/m-large`` model, the first day, 144 ten-minute windows):

* the ``NUM_CLIENTS`` clients with the most requests that day whose length distributions are
  non-empty, in that order;
* per client and window: rate (requests/s), CV, distribution name, shape, scale;
* per client and 6-hour window: 101 quantiles (0, 1, ..., 100 %) of input and of output tokens.

Run ``python -m prefixshield.traces.derive_servegen SERVEGEN_DATA_DIR [--check]`` with
``SERVEGEN_DATA_DIR`` the ``data/language/m-large`` folder of a ServeGen checkout: it writes the
file (or, with ``--check``, compares it with the shipped one and exits 1 on a difference).
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import numpy as np

NUM_CLIENTS = 8
DAY_WINDOWS = 144
WINDOW_S = 600
QUANTILES = np.linspace(0, 100, 101)
OUT = Path(__file__).resolve().parent / "data" / "servegen_m_large.json"


def _trace_rows(path: Path) -> list[tuple]:
    rows = []
    for line in path.read_text().splitlines():
        ts, rate, cv, pat, a, b = line.strip().split(",")
        rows.append((int(ts), float(rate), float(cv), pat, float(a), float(b)))
    return rows


def _quantiles(pdf_text: str) -> list[float] | None:
    pdf = ast.literal_eval(pdf_text)
    if not pdf:
        return None
    values = np.array(sorted(pdf), dtype=np.float64)
    probs = np.array([pdf[int(v)] for v in values], dtype=np.float64)
    cdf = np.cumsum(probs) / probs.sum()
    # the smallest value whose CDF reaches q (the usual inverse CDF of a discrete distribution)
    idx = np.searchsorted(cdf, QUANTILES / 100.0 - 1e-12, side="left")
    return [int(values[min(i, len(values) - 1)]) for i in idx]


def derive(src: Path) -> dict:
    """The derived document from a ServeGen ``data/language/m-large`` folder."""
    volume = {}
    for trace in sorted(src.glob("chunk-*-trace.csv")):
        cid = int(trace.name.split("-")[1])
        dataset = src / f"chunk-{cid}-dataset.json"
        if not dataset.exists():
            continue
        rows = [r for r in _trace_rows(trace) if r[0] < DAY_WINDOWS * WINDOW_S]
        volume[cid] = sum(r[1] * WINDOW_S for r in rows)
    clients = []
    for cid in sorted(volume, key=lambda c: (-volume[c], c)):
        ds = json.loads((src / f"chunk-{cid}-dataset.json").read_text())
        lengths = []
        for ts in sorted(ds, key=int):
            if int(ts) >= DAY_WINDOWS * WINDOW_S:
                continue
            qi = _quantiles(ds[ts]["input_tokens"])
            qo = _quantiles(ds[ts]["output_tokens"])
            if qi is None or qo is None:
                lengths = []
                break
            lengths.append({"start_s": int(ts), "input_tokens": qi, "output_tokens": qo})
        if not lengths:
            continue  # no length data that day: cannot shape its requests
        rows = [r for r in _trace_rows(src / f"chunk-{cid}-trace.csv")
                if r[0] < DAY_WINDOWS * WINDOW_S]
        clients.append({
            "client": cid, "requests_that_day": round(volume[cid]),
            "windows": [{"start_s": ts, "rate": rate, "cv": cv, "dist": pat or None,
                         "shape": a, "scale": b} for ts, rate, cv, pat, a, b in rows],
            "lengths": lengths})
        if len(clients) == NUM_CLIENTS:
            break
    return {"source": "ServeGen data/language/m-large (github alibaba/ServeGen @f891d11), "
                      "Apache-2.0; first day, clients with the most requests that day",
            "window_s": WINDOW_S, "quantiles_percent": QUANTILES.tolist(), "clients": clients}


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print(__doc__)
        return 2
    doc = derive(Path(argv[0]))
    text = json.dumps(doc, separators=(",", ":"), sort_keys=True) + "\n"
    if "--check" in argv:
        same = OUT.read_text() == text
        print("servegen_m_large.json: " + ("matches" if same else "DIFFERS"))
        return 0 if same else 1
    OUT.write_text(text)
    print(f"wrote {OUT} ({len(text):,} bytes, {len(doc['clients'])} clients)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
