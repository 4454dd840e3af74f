"""Validation: the same trace on a real vLLM (`prefixshield.live`) and in the simulator,
and the sim-vs-live reports.

* [`compare`][prefixshield.validate.compare] -- the trace in the simulator beside its live replay;
  the ``Metric / vLLM / Sim / Diff%`` report (Markdown, CSV, JSON).
* `steptimes` -- step-time replay (the simulator priced with the
  live engine's recorded steps) and the profile's step-time residuals.
* `matrix` -- ``validate`` over workloads x policies x modes.
* `vllm_entry` -- the ``vllm.general_plugins`` entry point: installs
  `prefixshield.live.plugin` in every vLLM engine process when ``PREFIXSHIELD_POLICY`` is
  set.

Importing ``prefixshield.validate`` or ``compare`` needs nothing beyond the core dependencies.
"""
