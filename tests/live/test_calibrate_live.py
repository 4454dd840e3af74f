"""`prefixshield calibrate` end to end on the real (CPU) vLLM engine, in its own process."""

import os
import subprocess
import sys

from prefixshield.simulator.costmodel import load_profile


def test_calibrate_cli_measures_a_profile_that_loads(tiny_model_dir, tmp_path):
    out = tmp_path / "cpu-test.toml"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, "-m", "prefixshield.cli", "calibrate", "--model",
                           tiny_model_dir, "--name", "cpu-test", "--out", str(out), "--quick"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    prof = load_profile(str(out))
    c = prof.cost
    assert prof.provenance["status"] == "measured"
    assert prof.provenance["vllm_version"] == "0.32.0"
    # a step has a fixed cost, prefill tokens cost something, and input processing was timed
    assert c.a_s > 0 and c.b_s_per_prefill_token > 0 and c.e_s_per_new_request > 0
    assert "fitted" in proc.stdout
