"""The one-kernel key-stream replay of LRU and S3-FIFO makes the generic driver's decisions."""

import numpy as np
import pytest

from prefixshield.policies import make_policy
from prefixshield.simulator.cachedriver import replay_keys


@pytest.mark.parametrize("policy", ["lru", "s3fifo"])
@pytest.mark.parametrize("compat", ["current", "0.10"])
@pytest.mark.parametrize("capacity", [20, 100, 1000])
def test_batch_replay_equals_one_call_at_a_time(policy, compat, capacity):
    rng = np.random.default_rng(capacity)
    keys = (rng.zipf(1.3, 20_000) % (5 * capacity)).astype(np.int64)
    fast = make_policy(policy, capacity + 1, vllm_compat=compat)
    slow = make_policy(policy, capacity + 1, vllm_compat=compat)
    assert np.array_equal(replay_keys(fast, keys, batch=True), replay_keys(slow, keys, batch=False))
    assert np.array_equal(fast.free_order(), slow.free_order())
    assert fast.stats() == slow.stats()
