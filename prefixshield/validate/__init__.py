"""Live mode: the simulator's policies inside a real vLLM engine, and sim-vs-live reports.

* :mod:`~prefixshield.validate.tinymodel` — random-weight models with a named architecture
  (tiny Qwen2 for CPU tests; the public Qwen2.5-1.5B/7B shapes), written locally.
* :mod:`~prefixshield.validate.plugin` — the vLLM plugin (entry point group
  ``vllm.general_plugins``): a ``BlockPool`` whose victim selection is a prefixshield policy.
* :mod:`~prefixshield.validate.live` — replay a trace on an in-process vLLM with a policy.
* :mod:`~prefixshield.validate.compare` — the same trace in the simulator; the
  ``Metric / vLLM / Sim / Diff%`` report (Markdown, CSV, JSON).
* :mod:`~prefixshield.validate.forcing` — the logits processor that makes the live model
  generate the simulator's output tokens.
* :mod:`~prefixshield.validate.steptimes` — step-time replay (the simulator priced with the
  live engine's recorded steps) and the profile's step-time residuals.
* :mod:`~prefixshield.validate.matrix` — ``validate`` over workloads x policies x modes.
* :mod:`~prefixshield.validate.kvdriver`, :mod:`~prefixshield.validate.kvcalls` — drive vLLM's
  ``KVCacheManager`` without a model (differential tests, benchmarks).

Only this package imports vLLM: ``plugin`` at import time (it subclasses vLLM's classes),
``live`` when an engine is built; ``tinymodel`` needs ``torch``/``transformers``/``safetensors``
(vLLM's dependencies) when it writes. Importing ``prefixshield.validate``, ``live`` or
``compare`` needs nothing beyond the core dependencies.
"""
