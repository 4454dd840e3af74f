"""Fit the step-time cost model to measured steps and write it as a profile with provenance."""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

from prefixshield.atomic import write_text
from prefixshield.calibrate.measure import Measurement
from prefixshield.simulator.costmodel import CostModel, parse_profile


@dataclass(frozen=True)
class Fit:
    """A fitted cost model and how well it explains the samples.

    Attributes:
        cost: the coefficients (all >= 0: non-negative least squares).
        r2: coefficient of determination over all samples.
        median_abs_rel_error: median of ``|predicted - measured| / measured``.
        num_samples: samples used.
    """

    cost: CostModel
    r2: float
    median_abs_rel_error: float
    num_samples: int


def fit_cost_model(measurement: Measurement) -> Fit:
    """Non-negative least squares of step seconds on ``[1, prefill, decode, context]``; the
    per-new-request cost ``e`` is the median measured ``add_request`` time.

    Each sample is weighted by ``1 / seconds`` so that short decode steps count as much as long
    prefill steps (the fit minimises relative, not absolute, error).
    """
    x, y = measurement.arrays()
    if len(y) < 4:
        raise ValueError(f"need at least 4 samples to fit 4 coefficients, got {len(y)}")
    w = 1.0 / np.maximum(y, 1e-9)
    coef, _ = nnls(x * w[:, None], y * w)
    pred = x @ coef
    ss_res = float(np.sum((y - pred) ** 2))
    ss_tot = float(np.sum((y - y.mean()) ** 2)) or 1.0
    # Input processing happens outside the step, so it is measured directly, not fitted.
    e = float(np.median(measurement.add_request_s)) if measurement.add_request_s else 0.0
    cost = CostModel(a_s=float(coef[0]), b_s_per_prefill_token=float(coef[1]),
                     c_s_per_decode_seq=float(coef[2]), d_s_per_context_token=float(coef[3]),
                     e_s_per_new_request=e)
    return Fit(cost, 1.0 - ss_res / ss_tot, float(np.median(np.abs(pred - y) / y)), len(y))


def profile_toml(name: str, fit: Fit, facts: dict, grid_text: str) -> str:
    """The profile file text: coefficients plus provenance of the measurement."""
    c = fit.cost
    date = _dt.date.today().isoformat()
    method = (f"prefixshield calibrate: {fit.num_samples} timed engine steps ({grid_text}); "
              f"non-negative least squares weighted by 1/step time; e = median add_request time "
              f"of the measured requests; R^2 = {fit.r2:.4f}, median "
              f"|relative error| = {100 * fit.median_abs_rel_error:.1f}%; engine block size "
              f"{facts.get('block_size')}, {facts.get('num_gpu_blocks')} blocks, dtype "
              f"{facts.get('dtype')}")
    return (
        f'name = "{name}"\n\n'
        "# t_step = a + b*prefill_tokens + c*decode_seqs + d*context_tokens + e*new_requests (s)\n"
        "[cost]\n"
        f"a_s = {c.a_s!r}\n"
        f"b_s_per_prefill_token = {c.b_s_per_prefill_token!r}\n"
        f"c_s_per_decode_seq = {c.c_s_per_decode_seq!r}\n"
        f"d_s_per_context_token = {c.d_s_per_context_token!r}\n"
        f"e_s_per_new_request = {c.e_s_per_new_request!r}\n\n"
        "[provenance]\n"
        'status = "measured"\n'
        f"hardware = {_q(facts.get('device', 'unknown'))}\n"
        f"model = {_q(str(facts.get('model', 'unknown')) + ' (' + str(facts.get('architecture', '')) + ')')}\n"
        f"vllm_version = {_q(facts.get('vllm_version', 'unknown'))}\n"
        f"attention_backend = {_q(facts.get('attention_backend', 'unknown'))}\n"
        f'date = "{date}"\n'
        f"method = {_q(method)}\n"
    )


def _q(s: str) -> str:
    return '"' + str(s).replace("\\", "\\\\").replace('"', '\\"') + '"'


def write_profile(path: str, name: str, fit: Fit, facts: dict, grid_text: str) -> None:
    """Write the profile atomically, after checking it parses back."""
    text = profile_toml(name, fit, facts, grid_text)
    parse_profile(text, str(path))
    write_text(path, text)
