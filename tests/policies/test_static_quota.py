"""StaticQuota: equal hard partition, own-oldest reclamation, no borrowing."""

import numpy as np

from helpers import make_request, schedule
from prefixshield.policies import make_policy
from prefixshield.simulator.blockpool import BlockPool
from prefixshield.simulator.kvcache import KVCacheManager
from prefixshield.tenancy import DEFAULT_CONTRACTS


def make_quota_manager(num_blocks=9, groups=("a", "b")):
    policy = make_policy("static_quota", num_blocks)
    policy.bind_tenants(groups, list(DEFAULT_CONTRACTS.values()))
    return KVCacheManager(BlockPool(num_blocks, policy, len(groups)), 16)


def test_quota_is_floor_of_usable_over_groups():
    m = make_quota_manager(num_blocks=512, groups=("a", "b", "c"))
    assert m.pool.policy.quota == 511 // 3
    assert m.pool.num_free_blocks(0) == 170


def test_group_capacity_is_the_bound_quota_and_pool_for_its_smallest_pool():
    from prefixshield.policies import POLICIES

    cls = POLICIES["static_quota"]
    for blocks, groups in ((512, 3), (9, 2), (773, 2), (2, 1)):
        m = make_quota_manager(num_blocks=blocks, groups=tuple("abc"[:groups]))
        assert cls.group_capacity(blocks, groups) == m.pool.policy.quota
    for need, groups in ((386, 2), (1, 3), (4, 2)):
        pool = cls.pool_for(need, groups)
        assert cls.group_capacity(pool, groups) == need  # it serves the need ...
        assert cls.group_capacity(pool - 1, groups) < need  # ... and one block less does not
    lru = POLICIES["lru"]
    assert lru.group_capacity(512, 3) == 511 and lru.pool_for(511, 3) == 512


def test_group_at_quota_reclaims_its_own_oldest_cached_block():
    m = make_quota_manager()  # 8 usable, quota 4 each
    a1 = make_request(0, np.arange(64), group=0)  # 4 blocks: a's whole quota
    schedule(m, a1)
    m.free(a1, 1.0)  # cached, freed tail first: a's oldest candidate is the chain tail
    assert m.pool.num_free_blocks(0) == 4  # its own 4 cached blocks, no truly free ones
    a2 = make_request(1, 5000 + np.arange(20), group=0)  # 2 new blocks for a
    schedule(m, a2)
    assert list(a2.blocks[:2]) == list(a1.blocks[[3, 2]])
    assert m.pool.evictions[0, 0] == 2 and m.pool.evictions[0, 1] == 0
    assert m.pool.occupancy[0] == 4
    m.pool.check_invariants()


def test_no_borrowing_from_an_idle_group():
    m = make_quota_manager()
    big = make_request(0, np.arange(80), group=0)  # 5 blocks > quota 4, though 8 are free
    hits, cached = m.get_computed_blocks(big)
    assert not m.allocate_slots(big, big.num_tokens, 0.0, hits)
    assert m.pool.num_free_blocks(1) == 4  # b's share stays whole


def test_borrowing_workload_never_exceeds_the_quota():
    from prefixshield.simulator.config import EngineConfig
    from prefixshield.simulator.costmodel import load_profile
    from prefixshield.simulator.engine import Engine
    from prefixshield.workloads import generate

    trace = generate("borrowing", duration_s=20)
    r = Engine(trace, make_policy("static_quota", 512), load_profile("l4-qwen2.5-1.5b").cost,
               EngineConfig(check_invariants=True)).run()
    active = r.groups.index("active")
    assert r.occupancy[:, active].max() == 511 // 2
