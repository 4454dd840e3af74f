"""Step-time replay: separate the simulator's scheduler/queueing error from its cost-model error.

The live replay records every engine step it ran (`StepRecorder`:
the step's charged wall seconds and its cost-model features). Replaying the trace
in the simulator with `RecordedStepTimes` as its cost model gives the k-th simulated step
the k-th live step's seconds, so whatever TTFT difference remains comes from the scheduler and
queueing model (or from the two runs scheduling different batches, which
`RecordedStepTimes.comparison` counts), not from the profile. `profile_residuals`
measures the profile against the live steps directly, and `fit_live_steps` fits the cost
model to them, so a report can say which term is off and by how much.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from prefixshield.simulator.costmodel import CostModel

FEATURES = ("prefill_tokens", "decode_seqs", "context_tokens", "new_requests")
"""The cost model's features, in `CostModel.step_time` argument order."""

TERMS = (("a_s", "per step"), ("b_s_per_prefill_token", "per prefill token"),
         ("c_s_per_decode_seq", "per decoding sequence"),
         ("d_s_per_context_token", "per context token"),
         ("e_s_per_new_request", "per new request"))
"""Cost-model coefficients with what each is charged per."""


class RecordedStepTimes:
    """A cost model that prices the k-th step asked for with the k-th recorded live step.

    Duck-typed like [`CostModel`][prefixshield.simulator.costmodel.CostModel] for the simulator's
    step-by-step engine (``Engine(..., batched=False, coalesce_decode=False)``: one
    `step_time` call per step, in order). Steps beyond the recording are priced by
    ``fallback``. Every call's features are kept for `comparison`.

    Args:
        steps: the live steps ([`STEP_COLUMNS`][prefixshield.live.engine.STEP_COLUMNS]), in order.
        fallback: the cost model for steps the recording does not have.
    """

    def __init__(self, steps: pd.DataFrame, fallback: CostModel) -> None:
        self.seconds = steps["seconds"].to_numpy(np.float64)
        self.live_features = steps[list(FEATURES)].to_numpy(np.int64)
        self.fallback = fallback
        self.calls: list[tuple[int, int, int, int]] = []

    def step_time(self, prefill_tokens: int, decode_seqs: int, context_tokens: int,
                  new_requests: int = 0) -> float:
        """Seconds of the next step: the recorded live step at this position."""
        k = len(self.calls)
        self.calls.append((int(prefill_tokens), int(decode_seqs), int(context_tokens),
                           int(new_requests)))
        if k < len(self.seconds):
            return float(self.seconds[k])
        return self.fallback.step_time(prefill_tokens, decode_seqs, context_tokens, new_requests)

    def comparison(self) -> dict:
        """How the simulated steps line up with the live ones: counts, how many of the common
        positions have identical features, and the first position that differs (None if
        none)."""
        sim = np.asarray(self.calls, dtype=np.int64).reshape(-1, len(FEATURES))
        live = self.live_features
        m = min(len(sim), len(live))
        same = np.all(sim[:m] == live[:m], axis=1)
        first = None
        if not same.all():
            k = int(np.argmin(same))
            first = {"step": k, "live": dict(zip(FEATURES, map(int, live[k]))),
                     "sim": dict(zip(FEATURES, map(int, sim[k])))}
        elif len(sim) != len(live):
            first = {"step": m, "live": None if m >= len(live) else
                     dict(zip(FEATURES, map(int, live[m]))),
                     "sim": None if m >= len(sim) else dict(zip(FEATURES, map(int, sim[m])))}
        return {"live_steps": int(len(live)), "sim_steps": int(len(sim)), "compared": int(m),
                "identical": int(same.sum()), "first_difference": first}


def _coefficients(cost: CostModel) -> list[float]:
    return [float(getattr(cost, t)) for t, _ in TERMS]


def predicted_seconds(steps: pd.DataFrame, cost: CostModel) -> np.ndarray:
    """The profile's seconds for each recorded step (from its features)."""
    x = steps[list(FEATURES)].to_numpy(np.float64)
    c = np.asarray(_coefficients(cost))
    return c[0] + x @ c[1:]


def profile_residuals(steps: pd.DataFrame, cost: CostModel) -> dict:
    """The profile against the live steps: relative error ``(predicted - live) / live`` per
    step, summarised as the median and P95 of its magnitude and its signed median (negative:
    the profile is faster than the machine), the signed median over the steps that prefill and
    over the pure-decode steps (TTFT is made of the first kind), and the totals in seconds."""
    if not len(steps):
        return {"steps": 0}
    live = steps["seconds"].to_numpy(np.float64)
    pred = predicted_seconds(steps, cost)
    rel = (pred - live) / np.maximum(live, 1e-12)
    out = {"steps": int(len(live)), "median_abs_rel_error": float(np.median(np.abs(rel))),
           "p95_abs_rel_error": float(np.percentile(np.abs(rel), 95)),
           "median_rel_error": float(np.median(rel)),
           "live_total_s": float(live.sum()), "profile_total_s": float(pred.sum())}
    # By step kind: TTFT is made of steps that prefill, decode latency of the others.
    prefill = steps["prefill_tokens"].to_numpy() > 0
    for kind, mask in (("prefill", prefill), ("decode", ~prefill)):
        out[f"{kind}_steps"] = int(mask.sum())
        out[f"{kind}_median_rel_error"] = (float(np.median(rel[mask])) if mask.any()
                                           else float("nan"))
    return out


@dataclass(frozen=True)
class LiveFit:
    """The cost model fitted to the live steps of one replay, term by term against a profile.

    Attributes:
        cost: fitted coefficients (non-negative least squares on the five features, weighted by
            1 / seconds, as ``prefixshield calibrate`` fits).
        r2: coefficient of determination of the fit.
        terms: per coefficient ``{"term", "per", "profile", "live_fit", "ratio", "share"}``
            (ratio = live fit / profile, NaN where the profile's is 0; share = the fraction of
            the fitted live step time that term accounts for).
        identifiable: False when a feature never varies across the steps (its term is then
            confounded with ``a``; the fit is reported but not to be read term by term).
    """

    cost: CostModel
    r2: float
    terms: list[dict]
    identifiable: bool


def fit_live_steps(steps: pd.DataFrame, profile: CostModel) -> LiveFit | None:
    """Fit the cost model to the recorded live steps and set it beside ``profile`` (None with
    fewer steps than coefficients)."""
    from scipy.optimize import nnls  # only for reports: kept off the import path

    if len(steps) < len(TERMS):
        return None
    y = steps["seconds"].to_numpy(np.float64)
    x = np.column_stack([np.ones(len(y)), steps[list(FEATURES)].to_numpy(np.float64)])
    w = 1.0 / np.maximum(y, 1e-9)
    coef, _ = nnls(x * w[:, None], y * w)
    pred = x @ coef
    ss_tot = float(np.sum((y - y.mean()) ** 2)) or 1.0
    r2 = 1.0 - float(np.sum((y - pred) ** 2)) / ss_tot
    cost = CostModel(*map(float, coef))
    prof = _coefficients(profile)
    parts = coef * x.sum(axis=0)  # seconds of the fitted live time per term
    total = float(parts.sum()) or 1.0
    terms = [{"term": t, "per": per, "profile": p, "live_fit": float(c),
              "ratio": float(c / p) if p > 0 else float("nan"), "share": float(part / total)}
             for (t, per), p, c, part in zip(TERMS, prof, coef, parts)]
    identifiable = bool(np.all(np.ptp(x[:, 1:], axis=0) > 0))
    return LiveFit(cost=cost, r2=r2, terms=terms, identifiable=identifiable)
