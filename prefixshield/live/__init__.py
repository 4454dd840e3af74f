"""The real vLLM engine, shared by calibration and validation: the only package that imports vLLM.

* [`engine`][prefixshield.live.engine] -- an in-process vLLM engine with a policy installed: its
  construction, the replay of a trace (serialized or timed), the recorded engine steps.
* `plugin` -- the vLLM plugin (entry point group
  ``vllm.general_plugins``, via `prefixshield.validate.vllm_entry`): a ``BlockPool`` whose
  victim selection is a prefixshield policy.
* `forcing` -- the logits processor that makes the live model generate
  the simulator's output tokens.
* `vllm_workarounds` -- what starting vLLM beside numba needs.
* `tinymodel` -- random-weight models with a named architecture (tiny
  Qwen2 for CPU tests; the public Qwen2.5-1.5B/7B shapes), written locally.
* `kvdriver`, `kvcalls` -- drive vLLM's
  ``KVCacheManager`` without a model (differential tests, benchmarks).

`prefixshield.calibrate` times this engine's steps to fit a profile;
`prefixshield.validate` replays a trace on it and compares with the simulator. ``plugin``
imports vLLM at import time (it subclasses vLLM's classes), ``engine`` when an engine is built;
``tinymodel`` needs ``torch``/``transformers``/``safetensors`` (vLLM's dependencies) when it
writes. Importing this package, ``engine`` or ``forcing`` needs nothing beyond the core
dependencies.
"""
