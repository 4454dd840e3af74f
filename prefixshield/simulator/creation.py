"""Creation metering for every policy: who materialized how many blocks when, and the debt that
PrefixShield's token bucket (refill ``rho`` up to ``beta`` per contract) would hold for it.

The pool logs every materialization (one row per ``cache_full_blocks`` call: seconds, group,
contract, blocks), whatever the policy, so each run can report a tenant's *measured* creation
pressure (new blocks per second over its contracts' refill) and its mean debt, LRU runs
included. The bucket here is the design's (starts full, lazy refill capped at ``beta``, charged on
materialization, never repaid by eviction); PrefixShield keeps its own copy for its decisions.
"""

from __future__ import annotations

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
def _bucket_debt_integral(t, blocks, rho, beta, w0, w1):
    """Integral over ``[w0, w1]`` of the debt ``max(0, -B̂(t))`` of one bucket charged
    ``blocks[i]`` at ``t[i]`` (sorted), and the debt at ``w1``. Exact: between charges the
    debt falls linearly at ``rho`` until it reaches 0."""
    b = beta
    t_prev = 0.0
    integral = 0.0
    n = t.shape[0]
    for i in range(n + 1):
        t_next = t[i] if i < n else w1
        lo = max(t_prev, w0)
        hi = min(t_next, w1)
        if hi > lo:
            d = -(b + rho * (lo - t_prev))
            if d > 0.0:
                span = min(hi - lo, d / rho)
                integral += d * span - 0.5 * rho * span * span
        if i == n:
            break
        b = min(beta, b + rho * (t[i] - t_prev)) - blocks[i]
        t_prev = t[i]
    end_debt = max(0.0, -(b + rho * max(0.0, w1 - t_prev)))
    return integral, end_debt


def group_creation(log: dict[str, np.ndarray], group: int, rho: np.ndarray, beta: np.ndarray,
                   window: tuple[float, float]) -> dict[str, float]:
    """Creation of one group over ``window`` (seconds): blocks materialized in it, the pressure
    ratio (blocks per second over the summed refill of the contracts it used; 0 if it created
    nothing) and the time-weighted mean raw debt ``D_g`` (blocks, summed over its contracts)."""
    w0, w1 = float(window[0]), float(window[1])
    mine = log["group"] == group
    t, c, n = log["t_s"][mine], log["contract"][mine], log["blocks"][mine]
    in_window = (t >= w0) & (t < w1)
    created = int(n[in_window].sum())
    used = np.unique(c)
    integral = 0.0
    for k in used:
        sel = c == k
        part, _ = _bucket_debt_integral(t[sel], n[sel].astype(np.float64), float(rho[k]),
                                        float(beta[k]), w0, w1)
        integral += part
    span = w1 - w0
    if not span > 0:
        return {"created_blocks": created, "pressure_ratio": float("nan"),
                "mean_debt_blocks": float("nan")}
    return {
        "created_blocks": created,
        "pressure_ratio": created / (span * float(rho[used].sum())) if used.size else 0.0,
        "mean_debt_blocks": integral / span,
    }
