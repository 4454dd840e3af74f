"""Validation: the same trace on a real vLLM (:mod:`prefixshield.live`) and in the simulator,
and the sim-vs-live reports.

* :mod:`~prefixshield.validate.compare` -- the trace in the simulator beside its live replay;
  the ``Metric / vLLM / Sim / Diff%`` report (Markdown, CSV, JSON).
* :mod:`~prefixshield.validate.steptimes` -- step-time replay (the simulator priced with the
  live engine's recorded steps) and the profile's step-time residuals.
* :mod:`~prefixshield.validate.matrix` -- ``validate`` over workloads x policies x modes.
* :mod:`~prefixshield.validate.vllm_entry` -- the ``vllm.general_plugins`` entry point: installs
  :mod:`prefixshield.live.plugin` in every vLLM engine process when ``PREFIXSHIELD_POLICY`` is
  set.

Importing ``prefixshield.validate`` or ``compare`` needs nothing beyond the core dependencies.
"""
