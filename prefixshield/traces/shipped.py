"""The data files shipped under ``traces/data/`` (provenance in ``traces/data/PROVENANCE.md``):
their names, and the facts read straight from ServeGen's client data.

ServeGen's ``language/m-large`` clients (``servegen_m_large.json``, Apache-2.0): per client,
per 10-minute window of the day, a published request rate and its inter-arrival and length
fits. The ``servegen`` workload generates tenants from them; ``trace import --assign servegen``
splits a trace by their rate shares. Both read them here.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources

import numpy as np

AZURE_CONV_FILE = "azure_conv_generated_tokens.csv"
"""Packaged histogram of Azure conv ``GeneratedTokens``: ``generated_tokens, count``."""
SERVEGEN_FILE = "servegen_m_large.json"
"""ServeGen's ``language/m-large`` clients, most requests first."""
WINDOW_S = 600
"""Length of one of the data's windows (seconds)."""
SHARES_WINDOW_S = 60.0
"""``--assign servegen`` takes the clients' rate shares over this many seconds from the start of
their busiest hour: the window the ``servegen`` workload generates at its defaults."""


@lru_cache(maxsize=1)
def servegen_clients() -> tuple[dict, ...]:
    """The shipped clients, most requests first."""
    text = resources.files("prefixshield.traces").joinpath("data", SERVEGEN_FILE).read_text()
    return tuple(json.loads(text)["clients"])


def windows(client: dict, start: float, end: float):
    """``(window, lo, hi)`` for each of ``client``'s windows with a fit and a positive rate that
    overlaps ``[start, end)`` seconds of the day (``[lo, hi)``: the overlap)."""
    for w in client["windows"]:
        lo, hi = w["start_s"], w["start_s"] + WINDOW_S
        if hi > start and lo < end and w["dist"] is not None and w["rate"] > 0:
            yield w, max(lo, start), min(hi, end)


def mean_rate(client: dict, start: float, end: float) -> float:
    """The client's published requests over ``[start, end)`` per second."""
    return sum(w["rate"] * (b - a) for w, a, b in windows(client, start, end)) / (end - start)


def busiest_hour_start(clients) -> float:
    """Second of the day at which ``clients`` together send the most requests in an hour (six
    windows, by the published rates)."""
    rates = np.sum([[w["rate"] for w in c["windows"]] for c in clients], axis=0)
    hourly = np.convolve(rates, np.ones(3600 // WINDOW_S), mode="valid")
    return float(clients[0]["windows"][int(np.argmax(hourly))]["start_s"])


def rate_shares(clients, start: float, duration_s: float) -> np.ndarray:
    """Each client's share of the published requests over ``[start, start + duration_s)``;
    raises ``ValueError`` if none sends any."""
    mean = np.array([mean_rate(c, start, start + duration_s) for c in clients])
    total = mean.sum()
    if total <= 0:
        raise ValueError(f"no tenant sends a request between {start:g} and "
                         f"{start + duration_s:g} s of the shipped day")
    return mean / total
