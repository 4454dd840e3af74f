"""Conformance of the block pool + LRU with vLLM's prefix caching, in the style of vLLM's
tests/v1/core/test_prefix_caching.py: exact block ids and exact free-queue order."""

import numpy as np
import pytest

from helpers import make_manager, make_request, schedule


def test_null_block_is_never_free_or_allocated():
    m = make_manager(num_blocks=512)
    assert m.pool.usable_blocks == 511
    assert m.pool.num_free_blocks() == 511
    assert 0 not in m.pool.policy.free_order()
    assert list(m.pool.policy.free_order()[:3]) == [1, 2, 3]


def test_prefill_allocates_from_queue_head_and_caches_full_blocks_only():
    m = make_manager()
    req = make_request(0, np.arange(3 * 16 + 4))
    hits, cached = schedule(m, req)
    assert cached == 0 and hits.size == 0
    assert list(req.blocks[:req.num_blocks]) == [1, 2, 3, 4]
    # three full blocks carry a hash; the partial fourth does not
    assert list(m.pool.block_hash[[1, 2, 3, 4]] != 0) == [True, True, True, False]
    assert m.pool.num_free_blocks() == 9 - 4


@pytest.mark.parametrize("compat, expected", [
    # "0.10": every freed block goes to the tail, in reverse order: tail blocks evicted first.
    ("0.10", [5, 6, 7, 8, 9, 4, 3, 2, 1]),
    # "current": the unhashed partial block goes to the head, the hashed chain tail-first to the tail.
    ("current", [4, 5, 6, 7, 8, 9, 3, 2, 1]),
])
def test_free_returns_tail_blocks_first(compat, expected):
    m = make_manager(compat=compat)
    req = make_request(0, np.arange(3 * 16 + 4))
    schedule(m, req)
    m.free(req, 1.0)
    assert list(m.pool.policy.free_order()) == expected


def test_hit_is_capped_at_num_tokens_minus_one():
    # A 96-token prompt is exactly 6 blocks; the last token must be computed: 5 blocks hit.
    m = make_manager(num_blocks=20)
    a = make_request(0, np.arange(96))
    schedule(m, a)
    m.free(a, 1.0)
    b = make_request(1, np.arange(96))
    hits, cached = m.get_computed_blocks(b)
    assert hits.size == 5 and cached == 80
    assert list(hits) == list(a.blocks[:5])


def test_lookup_has_no_side_effect_and_touch_removes_hits_from_queue():
    m = make_manager()
    a = make_request(0, np.arange(3 * 16 + 4))
    schedule(m, a)
    m.free(a, 1.0)
    before = m.pool.policy.free_order().copy()
    b = make_request(1, np.concatenate([np.arange(32), 1000 + np.arange(20)]))
    hits, cached = m.get_computed_blocks(b)
    assert list(hits) == [1, 2] and cached == 32
    assert np.array_equal(m.pool.policy.free_order(), before)
    assert m.allocate_slots(b, b.num_tokens - cached, 2.0, hits)
    # hits 1, 2 were touched (left the queue); two new blocks came from the head: 4 then 5
    assert list(b.blocks[:b.num_blocks]) == [1, 2, 4, 5]
    assert list(m.pool.policy.free_order()) == [6, 7, 8, 9, 3]
    assert list(m.pool.ref_cnt[[1, 2, 3]]) == [1, 1, 0]


def test_salt_isolates_groups():
    m = make_manager()
    a = make_request(0, np.arange(64), group=0)
    schedule(m, a)
    m.free(a, 1.0)
    b = make_request(1, np.arange(64), group=1)
    assert m.get_computed_blocks(b)[1] == 0
    c = make_request(2, np.arange(64), group=0)
    assert m.get_computed_blocks(c)[1] == 48


def test_evicting_a_cached_block_drops_its_hash_and_attributes_it():
    m = make_manager(num_blocks=5)  # 4 usable
    a = make_request(0, np.arange(64), group=0)  # 4 full blocks
    schedule(m, a)
    m.free(a, 1.0)
    assert m.pool.num_cached_blocks() == 4
    b = make_request(1, 5000 + np.arange(20), group=1)  # 2 blocks, no hit
    schedule(m, b)
    # LRU takes the head: a's chain tail first (blocks 4 then 3)
    assert list(b.blocks[:b.num_blocks]) == [4, 3]
    assert list(np.sort(m.pool.last_evicted)) == [3, 4]
    assert m.pool.evictions[1, 0] == 2
    c = make_request(2, np.arange(64), group=0)
    assert m.get_computed_blocks(c)[1] == 32  # blocks 1, 2 survive
    m.pool.check_invariants()


def test_admission_fails_when_hits_plus_new_exceed_free_blocks():
    m = make_manager(num_blocks=5)
    a = make_request(0, np.arange(64))
    schedule(m, a)
    m.free(a, 1.0)
    # 3 hit blocks (ref_cnt 0, so they count against the free blocks) + 2 new = 5 > 4 free
    b = make_request(1, np.concatenate([np.arange(48), 7000 + np.arange(32)]))
    hits, cached = m.get_computed_blocks(b)
    assert hits.size == 3
    assert not m.allocate_slots(b, b.num_tokens - cached, 2.0, hits)
    assert m.pool.num_free_blocks() == 4 and b.num_blocks == 0
    m.pool.check_invariants()


def test_shared_hit_blocks_are_ref_counted_and_survive_one_free():
    m = make_manager()
    a = make_request(0, np.arange(40))
    schedule(m, a)
    b = make_request(1, np.arange(40))
    hits, cached = schedule(m, b)
    assert cached == 32 and list(m.pool.ref_cnt[hits]) == [2, 2]
    m.free(a, 1.0)
    assert list(m.pool.ref_cnt[hits]) == [1, 1]
    assert not set(hits) & set(m.pool.policy.free_order())
    m.free(b, 2.0)
    m.pool.check_invariants()


def test_decode_blocks_are_cached_as_they_fill():
    m = make_manager()
    toks = np.arange(40)  # prompt 24 tokens, then 16 output tokens
    seq = make_request(0, toks, num_prompt_tokens=24)
    schedule(m, seq)  # computes 24 prompt tokens: 1 full block cached
    assert seq.num_cached_blocks == 1
    for _ in range(9):  # outputs arrive one per step; the 8th decode step fills block 2
        seq.num_output_done += 1
        assert m.allocate_slots(seq, 1, 0.0)
        seq.num_computed_tokens += 1
    assert seq.num_cached_blocks == 2
    assert seq.num_materialized_blocks == 2


def test_duplicate_blocks_stay_cached_and_lookup_returns_the_first():
    m = make_manager(num_blocks=10)
    a = make_request(0, np.arange(33))
    b = make_request(1, np.arange(33))
    # both admitted before either computed anything: b misses, computes the same blocks
    ha, _ = m.get_computed_blocks(a)
    hb, _ = m.get_computed_blocks(b)
    assert ha.size == hb.size == 0
    assert m.allocate_slots(a, 33, 0.0) and m.allocate_slots(b, 33, 0.0)
    assert list(a.blocks[:3]) == [1, 2, 3] and list(b.blocks[:3]) == [4, 5, 6]
    c = make_request(2, np.arange(33))
    assert list(m.get_computed_blocks(c)[0]) == [1, 2]
    m.free(a, 1.0)
    m.free(b, 1.0)
    # queue: 6, 3 (unhashed partials at the head), 7, 8, 9, then a's chain 2, 1, then b's 5, 4
    assert list(m.pool.policy.free_order()) == [6, 3, 7, 8, 9, 2, 1, 5, 4]
    d = make_request(3, 9000 + np.arange(100))  # 7 blocks: evicts a's copies, b's remain
    schedule(m, d)
    m.pool.check_invariants()
    assert list(m.get_computed_blocks(c)[0]) == [4, 5]


@pytest.mark.parametrize("compat, admitted", [("0.10", True), ("current", False)])
def test_current_mode_admits_only_if_the_whole_prompt_fits(compat, admitted):
    # 4 usable blocks; a 5-block prompt whose first 32-token chunk fits. vLLM >= 0.19 checks the
    # full prompt at admission (scheduler_reserve_full_isl); 0.10 checks only the chunk.
    from prefixshield.simulator.config import EngineConfig

    m = make_manager(num_blocks=5, compat=compat)
    req = make_request(0, np.arange(80))
    reserve = req.num_tokens if EngineConfig(vllm_compat=compat).reserves_full_prompt else 0
    assert m.allocate_slots(req, 32, 0.0, num_tokens_to_reserve=reserve) is admitted
    assert req.num_blocks == (2 if admitted else 0)


@pytest.mark.parametrize("seed", range(8))
def test_hash_map_with_colliding_slots_matches_a_dict_model(seed):
    # The pool's open-addressing hash map (linear probing, backward-shift deletion) against a
    # dict of hash -> blocks in insertion order. The 24-block pool's table has 64 slots; the
    # hashes' low bits put them at home slot 60, 62 or 1, so they form one long probe run
    # that wraps past the table's end, with entries of three homes interleaved: inserts, lookups
    # and deletions in the middle of it are what get exercised. Blocks are cached with
    # duplicate hashes too.
    import random

    from prefixshield.policies import make_policy
    from prefixshield.simulator.blockpool import BlockPool

    rng = random.Random(seed)
    num_blocks = 24
    pool = BlockPool(num_blocks, make_policy("lru", num_blocks), 1, hash_map_slots=64)
    assert pool._map_keys.shape[0] == 64
    universe = [np.uint64((k << 16) | (0x3C, 0x3E, 0x01)[k % 3]) for k in range(1, 16)]
    model: dict[int, list[int]] = {}
    in_use: list[int] = []
    unhashed_in_use: list[int] = []
    for step in range(400):
        op = rng.random()
        now = float(step)
        if op < 0.35 and pool.num_free_blocks(0):
            victims = pool.get_new_blocks(rng.randint(1, min(3, pool.num_free_blocks(0))), 0, now)
            for b in victims.tolist():
                for h, blocks in list(model.items()):
                    if b in blocks:
                        blocks.remove(b)
                        if not blocks:
                            del model[h]
                in_use.append(b)
                unhashed_in_use.append(b)
        elif op < 0.7 and unhashed_in_use:
            b = unhashed_in_use.pop(rng.randrange(len(unhashed_in_use)))
            h = rng.choice(universe)
            pool.cache_full_blocks(np.array([b], np.int32), np.array([h], np.uint64), 0, 0, 0,
                                   now)
            model.setdefault(int(h), []).append(b)
        elif in_use:
            b = in_use.pop(rng.randrange(len(in_use)))
            if b in unhashed_in_use:
                unhashed_in_use.remove(b)
            pool.free_blocks(np.array([b], np.int32), now)
        for h in universe:
            found = pool.find_cached_prefix(np.array([h], np.uint64), 1).tolist()
            assert found == model.get(int(h), [])[:1], (step, hex(int(h)))
        assert pool.num_hashes() == len(model)
        pool.check_invariants()
