"""The ``vllm.general_plugins`` entry point, kept light on purpose.

vLLM imports the entry-point module in every engine process of every environment where
prefixshield is installed, policy or not. Importing the plugin itself pulls in numba (the policy
kernels), whose llvmlite breaks vLLM 0.32's CPU worker start-up (see
`prefixshield.live.vllm_workarounds`); so this module imports nothing heavy, and the
plugin is imported, with the work-around applied, only when ``PREFIXSHIELD_POLICY`` asks for it.
"""

from __future__ import annotations

import os

ENV_POLICY = "PREFIXSHIELD_POLICY"


def register() -> None:
    """Install the prefixshield plugin if ``PREFIXSHIELD_POLICY`` is set; otherwise do nothing."""
    if not os.environ.get(ENV_POLICY, "").strip():
        return
    from prefixshield.live import plugin
    from prefixshield.live.vllm_workarounds import guard_llvmlite_for_vllm

    guard_llvmlite_for_vllm()
    plugin.register()
