"""Creation metering for every policy: who materialized how many blocks when, and the debt that
PrefixShield's token bucket (refill ``rho`` up to ``beta`` per contract) would hold for it.

The pool logs every materialization (one row per ``cache_full_blocks`` call: seconds, group,
contract, blocks), whatever the policy, so each run can report a tenant's *measured* creation
pressure (new blocks per second over its contracts' refill) and its mean debt, LRU runs
included. The bucket here is the design's (starts full, lazy refill capped at ``beta``, charged on
materialization, never repaid by eviction); PrefixShield keeps its own copy for its decisions.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
from numba import njit


class CreationLog:
    """Append-only log of materializations: ``(t_s, group, contract, blocks)`` per call."""

    def __init__(self) -> None:
        self._rows: list[tuple[float, int, int, int]] = []

    def append(self, t_s: float, group: int, contract: int, blocks: int) -> None:
        """Record that ``group`` under ``contract`` materialized ``blocks`` blocks at ``t_s``."""
        self._rows.append((float(t_s), int(group), int(contract), int(blocks)))

    def arrays(self) -> dict[str, np.ndarray]:
        """``t_s`` (float64), ``group``, ``contract``, ``blocks`` (int64) columns."""
        if not self._rows:
            return {"t_s": np.empty(0), "group": np.empty(0, np.int64),
                    "contract": np.empty(0, np.int64), "blocks": np.empty(0, np.int64)}
        t, g, c, b = zip(*self._rows)
        return {"t_s": np.asarray(t, np.float64), "group": np.asarray(g, np.int64),
                "contract": np.asarray(c, np.int64), "blocks": np.asarray(b, np.int64)}


@njit(cache=True)
def _bucket_debt_scan(t, blocks, rho, beta, w0, w1, carry, finish):
    """Continue the debt integral of one bucket over its next charges ``blocks[i]`` at sorted
    ``t[i]`` (`_bucket_debt_integral` a chunk at a time: the same operations in the same
    order). ``carry``: ``[balance, time of the last charge, integral so far]``, updated in
    place (``[beta, 0, 0]`` before the first chunk). ``finish``: this is the last chunk, so
    the span to ``w1`` is added too; returns then the debt at ``w1`` (else 0)."""
    b = carry[0]
    t_prev = carry[1]
    integral = carry[2]
    n = t.shape[0]
    end_debt = 0.0
    for i in range(n + 1):
        if i == n and not finish:
            break
        t_next = t[i] if i < n else w1
        lo = max(t_prev, w0)
        hi = min(t_next, w1)
        if hi > lo:
            d = -(b + rho * (lo - t_prev))
            if d > 0.0:
                span = min(hi - lo, d / rho)
                integral += d * span - 0.5 * rho * span * span
        if i == n:
            end_debt = max(0.0, -(b + rho * max(0.0, w1 - t_prev)))
            break
        b = min(beta, b + rho * (t[i] - t_prev)) - blocks[i]
        t_prev = t[i]
    carry[0] = b
    carry[1] = t_prev
    carry[2] = integral
    return end_debt


@njit(cache=True)
def _bucket_debt_integral(t, blocks, rho, beta, w0, w1):
    """Integral over ``[w0, w1]`` of the debt ``max(0, -B̂(t))`` of one bucket charged
    ``blocks[i]`` at ``t[i]`` (sorted), and the debt at ``w1``. Exact: between charges the
    debt falls linearly at ``rho`` until it reaches 0."""
    carry = np.array([beta, 0.0, 0.0])
    end_debt = _bucket_debt_scan(t, blocks, rho, beta, w0, w1, carry, True)
    return carry[2], end_debt


@njit(cache=True)
def _bucket_debt_spans(t, blocks, rho, beta, w0, w1, lo_out, hi_out):
    """Write into ``lo_out``/``hi_out`` the spans of ``[w0, w1]`` in which one bucket (charged
    ``blocks[i]`` at sorted ``t[i]``, starting full) is in debt, and return how many. At most
    one span follows each charge (the debt falls at ``rho`` until the next charge or 0), so the
    outputs need ``len(t)`` entries."""
    b = beta
    t_prev = 0.0
    k = 0
    n = t.shape[0]
    for i in range(n + 1):
        t_next = t[i] if i < n else w1
        if b < 0.0:
            lo = max(t_prev, w0)
            hi = min(min(t_next, t_prev - b / rho), w1)
            if hi > lo:
                lo_out[k] = lo
                hi_out[k] = hi
                k += 1
        if i == n:
            break
        b = min(beta, b + rho * (t[i] - t_prev)) - blocks[i]
        t_prev = t[i]
    return k


def debt_fraction(log: dict[str, np.ndarray], group: int, rho: np.ndarray, beta: np.ndarray,
                  window: tuple[float, float]) -> float:
    """Fraction (0..1) of ``window`` (seconds) in which ``group`` is in debt: ``D_g(t) > 0``,
    i.e. at least one of its contracts' buckets is below zero (the spans of its buckets are
    united, not added). NaN for an empty window."""
    w0, w1 = float(window[0]), float(window[1])
    if not w1 > w0:
        return float("nan")
    mine = log["group"] == group
    t, c, n = log["t_s"][mine], log["contract"][mine], log["blocks"][mine]
    los, his = [], []
    for k in np.unique(c):
        sel = c == k
        lo, hi = np.empty(int(sel.sum())), np.empty(int(sel.sum()))
        m = _bucket_debt_spans(t[sel], n[sel].astype(np.float64), float(rho[k]), float(beta[k]),
                               w0, w1, lo, hi)
        los.append(lo[:m])
        his.append(hi[:m])
    lo = np.concatenate(los) if los else np.empty(0)
    hi = np.concatenate(his) if his else np.empty(0)
    if not lo.size:
        return 0.0
    order = np.argsort(lo, kind="stable")
    lo, hi = lo[order], hi[order]
    # merge overlapping spans: a span starts a new run when it begins after every earlier end
    starts = np.flatnonzero(np.r_[True, lo[1:] > np.maximum.accumulate(hi)[:-1]])
    covered = np.maximum.reduceat(hi, starts) - lo[starts]
    return float(covered.sum() / (w1 - w0))


def group_creation(log: dict[str, np.ndarray], group: int, rho: np.ndarray, beta: np.ndarray,
                   window: tuple[float, float]) -> dict[str, float]:
    """Creation of one group over ``window`` (seconds): blocks materialized in it, the pressure
    ratio (blocks per second over the summed refill of the contracts it used; 0 if it created
    nothing) and the time-weighted mean raw debt ``D_g`` (blocks, summed over its contracts)."""
    return group_creation_chunks([log], group, rho, beta, window)


def group_creation_chunks(chunks: Iterable[dict[str, np.ndarray]], group: int, rho: np.ndarray,
                          beta: np.ndarray, window: tuple[float, float]) -> dict[str, float]:
    """`group_creation` over a log given as consecutive chunks of its rows (columns
    ``t_s``, ``group``, ``contract``, ``blocks``, as `CreationLog.arrays`), one chunk in
    memory at a time: the same figures, bit for bit (each bucket's scan carries its state
    from chunk to chunk, `_bucket_debt_scan`)."""
    w0, w1 = float(window[0]), float(window[1])
    created = 0
    carries: dict[int, np.ndarray] = {}
    for log in chunks:
        mine = log["group"] == group
        t, c, n = log["t_s"][mine], log["contract"][mine], log["blocks"][mine]
        in_window = (t >= w0) & (t < w1)
        created += int(n[in_window].sum())
        for k in np.unique(c):
            carry = carries.setdefault(int(k), np.array([float(beta[k]), 0.0, 0.0]))
            sel = c == k
            _bucket_debt_scan(t[sel], n[sel].astype(np.float64), float(rho[k]),
                              float(beta[k]), w0, w1, carry, False)
    used = np.array(sorted(carries), dtype=np.int64)
    integral = 0.0
    none = np.empty(0)
    for k in used:
        _bucket_debt_scan(none, none, float(rho[k]), float(beta[k]), w0, w1, carries[int(k)],
                          True)
        integral += carries[int(k)][2]
    span = w1 - w0
    if not span > 0:
        return {"created_blocks": created, "pressure_ratio": float("nan"),
                "mean_debt_blocks": float("nan")}
    return {
        "created_blocks": created,
        "pressure_ratio": created / (span * float(rho[used].sum())) if used.size else 0.0,
        "mean_debt_blocks": integral / span,
    }
