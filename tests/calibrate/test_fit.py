"""The cost-model fit recovers known coefficients and writes a profile that loads back."""

import numpy as np
import pytest

from prefixshield.calibrate.fit import fit_cost_model, write_profile
from prefixshield.calibrate.measure import Measurement, StepSample
from prefixshield.simulator.costmodel import CostModel, load_profile

TRUE = CostModel(a_s=0.004, b_s_per_prefill_token=2e-5, c_s_per_decode_seq=1e-4,
                 d_s_per_context_token=3e-8)


def synthetic(noise: float = 0.0, seed: int = 0) -> Measurement:
    rng = np.random.default_rng(seed)
    samples = []
    for new in (64, 256, 1024):
        for cached in (0, 512, 1536):
            for k in (1, 4):
                s = TRUE.step_time(k * new, 0, k * (new + cached))
                samples.append(StepSample("prefill", k * new, 0, k * (new + cached), s))
    for b in (1, 4, 16):
        for c in (128, 1024):
            s = TRUE.step_time(0, b, b * c)
            samples.append(StepSample("decode", 0, b, b * c, s))
    for s in samples:
        s.seconds *= 1 + noise * rng.standard_normal()
    return Measurement(samples, {"device": "test", "model": "m", "architecture": "A",
                                 "vllm_version": "0", "attention_backend": "x",
                                 "block_size": 32, "num_gpu_blocks": 64, "dtype": "float32"})


def test_exact_samples_give_back_the_coefficients():
    fit = fit_cost_model(synthetic())
    for f in ("a_s", "b_s_per_prefill_token", "c_s_per_decode_seq", "d_s_per_context_token"):
        assert getattr(fit.cost, f) == pytest.approx(getattr(TRUE, f), rel=1e-6)
    assert fit.r2 == pytest.approx(1.0)


def test_noisy_samples_fit_within_tolerance_and_stay_non_negative():
    fit = fit_cost_model(synthetic(noise=0.03))
    assert fit.median_abs_rel_error < 0.05
    assert min(fit.cost.a_s, fit.cost.b_s_per_prefill_token, fit.cost.c_s_per_decode_seq,
               fit.cost.d_s_per_context_token) >= 0


def test_written_profile_loads_with_its_provenance(tmp_path):
    fit = fit_cost_model(synthetic())
    path = tmp_path / "p.toml"
    write_profile(str(path), "p", fit, synthetic().facts, "grid")
    prof = load_profile(str(path))
    assert prof.provenance["status"] == "measured"
    assert prof.cost.b_s_per_prefill_token == pytest.approx(2e-5, rel=1e-6)


def test_too_few_samples_is_an_error():
    m = synthetic()
    m.samples = m.samples[:3]
    with pytest.raises(ValueError, match="at least 4 samples"):
        fit_cost_model(m)
