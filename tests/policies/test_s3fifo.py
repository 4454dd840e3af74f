"""S3-FIFO over blocks: insertion rules, pinned blocks, truly-free-first, and an engine run.

Most tests use 21 blocks: capacity 20, small 2, main 18, ghost 18 (libCacheSim's sizes), and
drive the policy directly the way the pool does: ``select_victims`` -> ``on_materialize`` ->
``on_release``; a prefix hit is ``on_hit`` (+ ``on_acquire`` if the block was free).
"""

from __future__ import annotations

import numpy as np
import pytest

from prefixshield.policies import POLICIES, make_policy
from prefixshield.policies.s3fifo import S3FIFOPolicy

T = np.ones(1, dtype=np.bool_)


def arr(*blocks) -> np.ndarray:
    """Block ids as the int32 array the pool passes."""
    return np.asarray(blocks, dtype=np.int32)


def put(p, key: int) -> int:
    """Take one block, cache ``key`` in it and release it (a one-block miss); returns the block."""
    b = p.select_victims(1, 0.0, 0)
    p.on_materialize(b, np.array([key], dtype=np.uint64), 0, 0, 0, 0.0)
    p.on_release(b, T, 0.0)
    return int(b[0])


def hit(p, block: int, times: int = 1) -> None:
    """``times`` prefix hits on a free cached block (pin, count, unpin)."""
    for _ in range(times):
        p.on_hit(arr(block), 0, 0, 0, 0.0)
        p.on_acquire(arr(block))
        p.on_release(arr(block), T, 0.0)


def full_policy(**params) -> S3FIFOPolicy:
    """21 blocks holding keys 100..119 in blocks 1..20: small [1, 2], main [3 .. 20]."""
    p = make_policy("s3fifo", 21, **params)
    for key in range(100, 120):
        put(p, key)
    return p


def test_s3fifo_is_registered_with_libcachesim_defaults():
    p = make_policy("s3fifo", 512)
    assert POLICIES["s3fifo"] is S3FIFOPolicy
    assert (p.small_size_ratio, p.ghost_size_ratio, p.move_to_main_threshold) == (0.1, 0.9, 2)
    assert p.num_free() == 511 and p.free_order().tolist() == list(range(1, 512))
    with pytest.raises(ValueError):
        make_policy("s3fifo", 512, small_size_ratio=1.5)
    with pytest.raises(ValueError):
        make_policy("s3fifo", 512, move_to_main_threshold=-1)


def test_small_fills_first_then_main_until_the_first_eviction():
    p = full_policy()
    assert p.queue("small").tolist() == [1, 2]
    assert p.queue("main").tolist() == list(range(3, 21))
    assert p.stats()["warmup_main_inserts"] == 18
    # first eviction: main is not over its size, small is not empty -> small head (freq 0) goes
    victim = p.select_victims(1, 0.0, 0)
    assert victim.tolist() == [1]
    assert p.ghost_keys().tolist() == [100]
    p.on_materialize(victim, np.array([500], dtype=np.uint64), 0, 0, 0, 0.0)
    assert p.queue("small").tolist() == [2, 1]  # after an eviction, new content goes to small


def test_ghost_hit_inserts_into_main_and_main_overflow_is_evicted_next():
    p = full_policy()
    b = put(p, 500)            # evicts block 1 (key 100) to the ghost, 500 -> small
    assert b == 1
    b = put(p, 100)            # key 100 is in the ghost: evicts small head 2 (key 101), -> main
    assert b == 2
    assert p.queue("main").tolist()[-1] == 2 and p.stats()["ghost_hits"] == 1
    assert 100 not in p.ghost_keys().tolist()
    # main holds 19 > 18: the next eviction comes from main's head
    assert put(p, 501) == 3
    assert p.stats()["evictions_main"] == 1


def test_hit_twice_in_small_promotes_to_main_with_freq_zero():
    p = full_policy()
    hit(p, 1, times=2)
    assert p.freq([1]).tolist() == [2]
    victim = p.select_victims(1, 0.0, 0)
    assert victim.tolist() == [2]                    # 1 was promoted, 2 evicted
    assert p.queue("main").tolist()[-1] == 1 and p.freq([1]).tolist() == [0]
    assert p.stats()["promotions"] == 1


def test_main_gives_second_chances_with_a_capped_counter():
    p = full_policy()
    hit(p, 3, times=5)                               # capped at 3
    assert p.freq([3]).tolist() == [3]
    p.on_acquire(arr(1, 2))                          # small fully pinned -> evict from main
    assert p.select_victims(1, 0.0, 0).tolist() == [4]
    assert p.queue("main").tolist()[-1] == 3 and p.freq([3]).tolist() == [2]


def test_pinned_block_at_small_head_moves_to_small_tail_and_keeps_its_freq():
    p = full_policy()
    p.on_hit(arr(1), 0, 0, 0, 0.0)
    p.on_acquire(arr(1))                              # block 1 in use, freq 1 (< threshold 2)
    victim = p.select_victims(1, 0.0, 0)
    assert victim.tolist() == [2]                     # 1 is kept, the next small block goes
    assert p.queue("small").tolist() == [1]
    assert p.freq([1]).tolist() == [1]
    assert p.stats()["pinned_kept_small"] == 1 and p.ghost_keys().tolist() == [101]
    p.on_materialize(victim, np.array([600], dtype=np.uint64), 0, 0, 0, 0.0)
    p.on_release(victim, T, 0.0)
    p.on_release(arr(1), T, 0.0)                      # releasing does not move it
    assert p.queue("small").tolist() == [1, 2]
    assert p.select_victims(1, 0.0, 0).tolist() == [1]  # now free, freq 1 < 2: reclaimed
    p.check_invariants()


def test_pinned_block_at_small_head_with_enough_freq_is_promoted():
    p = full_policy()
    p.on_hit(arr(1), 0, 0, 0, 0.0)
    p.on_hit(arr(1), 0, 0, 0, 0.0)
    p.on_acquire(arr(1))
    assert p.select_victims(1, 0.0, 0).tolist() == [2]
    assert p.queue("main").tolist()[-1] == 1
    assert p.stats()["pinned_main"] == 1 and p.stats()["pinned_small"] == 0
    p.check_invariants()


def test_pinned_block_at_main_head_moves_to_main_tail():
    p = full_policy()
    p.on_acquire(arr(1, 2, 3))                        # small fully pinned, main head pinned
    assert p.num_free() == 17
    victim = p.select_victims(1, 0.0, 0)
    assert victim.tolist() == [4]
    assert p.queue("main").tolist()[-1] == 3 and p.freq([3]).tolist() == [0]
    assert p.queue("small").tolist() == [1, 2]        # untouched: nothing evictable there
    assert p.stats()["pinned_kept_main"] == 1
    p.check_invariants()


def test_pinned_blocks_are_never_reclaimed():
    p = full_policy()
    others = [b for b in range(1, 21) if b != 13]
    p.on_acquire(arr(*others))
    assert p.num_free() == 1 and p.free_order().tolist() == [13]
    assert p.select_victims(1, 0.0, 0).tolist() == [13]
    assert p.num_free() == 0
    with pytest.raises(ValueError):
        p.select_victims(1, 0.0, 0)


def test_acquire_and_release_do_not_change_queue_positions():
    p = full_policy()
    hit(p, 5, times=1)
    before = (p.queue("small").tolist(), p.queue("main").tolist(), p.freq(range(1, 21)).tolist())
    p.on_acquire(arr(2, 7, 20))
    p.on_release(arr(20, 7, 2), np.ones(3, dtype=np.bool_), 0.0)
    after = (p.queue("small").tolist(), p.queue("main").tolist(), p.freq(range(1, 21)).tolist())
    assert before == after


def test_truly_free_blocks_are_reused_before_any_cached_block_is_reclaimed():
    p = full_policy()
    taken = p.select_victims(3, 0.0, 0)               # three evictions: 1, 2 from small, ...
    evictions = p.stats()["evictions_small"] + p.stats()["evictions_main"]
    assert evictions == 3
    p.on_release(taken, np.zeros(3, dtype=np.bool_), 0.0)  # never materialized: truly free
    assert p.queue("free").tolist() == taken.tolist()  # "current": head, in the order freed
    order = p.free_order()
    assert order[:3].tolist() == taken.tolist()
    got = p.select_victims(4, 0.0, 0)
    assert got[:3].tolist() == taken.tolist()
    assert p.stats()["evictions_small"] + p.stats()["evictions_main"] == evictions + 1
    assert got.tolist() == order[:4].tolist()


def test_truly_free_order_follows_the_compat_mode():
    for compat, expect in (("current", [3, 2, 1, 4, 5]), ("0.10", [4, 5, 3, 2, 1])):
        p = make_policy("s3fifo", 6, compat)
        got = p.select_victims(3, 0.0, 0)
        assert got.tolist() == [1, 2, 3]
        p.on_release(arr(3, 2, 1), np.zeros(3, dtype=np.bool_), 0.0)
        assert p.free_order().tolist() == expect, compat


def test_free_order_is_what_select_victims_returns_and_has_no_side_effect():
    p = full_policy()
    hit(p, 1, times=2)
    hit(p, 4, times=1)
    p.on_acquire(arr(5))
    stats = p.stats()
    order = p.free_order()
    assert p.stats() == stats
    assert sorted(order.tolist()) == [b for b in range(1, 21) if b != 5]
    assert p.select_victims(len(order), 0.0, 0).tolist() == order.tolist()


def test_a_reclaimed_block_materialized_again_is_a_new_object():
    p = full_policy()
    hit(p, 1, times=1)
    b = put(p, 700)                                   # freq 1 < 2: block 1 is reclaimed
    assert b == 1 and p.freq([1]).tolist() == [0]
    assert p.queue("small").tolist() == [2, 1]


def test_inconsistent_calls_raise():
    p = full_policy()
    with pytest.raises(ValueError):
        p.on_release(arr(3), T, 0.0)                  # not in use
    q = make_policy("s3fifo", 5)
    with pytest.raises(ValueError):
        q.on_acquire(arr(1))                          # truly free blocks are not hit-able
    with pytest.raises(ValueError):
        q.on_materialize(arr(1), np.array([9], dtype=np.uint64), 0, 0, 0, 0.0)


def test_stats_are_json_able():
    import json

    p = full_policy()
    put(p, 999)
    s = p.stats()
    assert json.loads(json.dumps(s)) == s
    assert s["small_blocks"] + s["main_blocks"] == 20 and s["ghost_keys"] == 1


def test_engine_runs_one_touch_under_s3fifo():
    from prefixshield.simulator.config import EngineConfig
    from prefixshield.simulator.costmodel import load_profile
    from prefixshield.simulator.engine import Engine
    from prefixshield.workloads import generate

    trace = generate("one_touch", duration_s=10)
    policy = make_policy("s3fifo", 512)
    r = Engine(trace, policy, load_profile("l4-qwen2.5-1.5b").cost,
               EngineConfig(check_invariants=True)).run()
    assert len(r.records) == len(trace.requests)
    s = r.policy_stats
    assert s["evictions_small"] + s["evictions_main"] == r.evictions.sum() > 0
    assert r.records["hit_fraction"].max() > 0
    policy.check_invariants()


def test_a_running_requests_hit_blocks_are_kept_in_the_pool():
    from helpers import make_manager, make_request, schedule

    m = make_manager(num_blocks=21, policy="s3fifo")   # 20 usable: small 2, main 18
    p = m.pool.policy
    a = make_request(0, np.arange(16 * 20))             # 20 full blocks fill the cache
    schedule(m, a)
    a_blocks = a.blocks[:20].tolist()
    m.free(a, 1.0)
    assert p.queue("small").tolist() == a_blocks[:2]
    assert p.queue("main").tolist() == a_blocks[2:]
    # b hits a's first two blocks (they are pinned while b runs) and needs one new block:
    # small holds only pinned blocks, so the eviction comes from main's head.
    b = make_request(1, np.arange(16 * 2 + 1))
    hits, cached = schedule(m, b, now=2.0)
    assert hits.tolist() == a_blocks[:2] and cached == 32
    assert b.blocks[2] == a_blocks[2]
    assert m.pool.last_evicted.tolist() == [a_blocks[2]]
    assert p.queue("small").tolist() == a_blocks[:2]
    assert p.freq(a_blocks[:2]).tolist() == [1, 1]
    m.pool.check_invariants()


def test_the_array_ghost_takes_any_uint64_key_and_keeps_fifo_order_through_compactions():
    # The ghost is a ring of keys plus a table of ring indices (no reserved key value): keys 0
    # and 2**64 - 1 must behave like any other. Many ghost hits leave stale ring entries, so
    # the ring (18 + 21 + 5 + 2 = 46 entries here) is compacted many times; the ghost must stay
    # the reference's OrderedDict, key for key, with multi-block allocations (untrimmed slack).
    from prefixshield.policies.reference import ReferenceS3FIFO

    rng = np.random.default_rng(7)
    universe = np.array([0, 2**64 - 1, 2**63, 1, 2**63 - 1]
                        + list(range(100, 135)), dtype=np.uint64)
    ours, ref = make_policy("s3fifo", 21), ReferenceS3FIFO(21)
    for step in range(3000):
        n = int(rng.integers(1, 4))
        keys = universe[rng.choice(universe.size, n, replace=False)]
        got = [p.select_victims(n, 0.0, 0) for p in (ours, ref)]
        assert got[0].tolist() == got[1].tolist(), step
        for p, b in zip((ours, ref), got):
            p.on_materialize(b, keys, 0, 0, 0, 0.0)
            p.on_release(b, np.ones(n, dtype=np.bool_), 0.0)
        if step % 3 == 0:  # a hit keeps some content in main
            b = arr(int(got[0][0]))
            for p in (ours, ref):
                p.on_hit(b, 0, 0, 0, 0.0)
        assert ours.ghost_keys().tolist() == [int(k) for k in ref.ghost], step
        ours.check_invariants()
    assert ours.stats()["ghost_hits"] == ref.counts["ghost_hits"] > 200
    assert ours._gpos[1] - ours._gpos[0] <= ours._gkeys.shape[0]
