"""The vLLM plugin on vLLM's real ``KVCacheManager`` (no model): LRU through the plugin is vLLM
block for block, every policy keeps vLLM's invariants, quotas gate admission, request metadata
reaches the policy, and misconfiguration or a broken policy is a clear error."""

from __future__ import annotations

import os
from contextlib import nullcontext

import numpy as np
import pytest
from vllm_kv_driver import SALTS, Side, run_stream

from prefixshield.policies import POLICIES
from prefixshield.tenancy import DEFAULT_CONTRACTS
from prefixshield.live import plugin

GROUPS = ["default", "tenant-a", "tenant-b"]


def env(policy: str, **kw) -> dict:
    kw.setdefault("groups", GROUPS)
    return plugin.plugin_env(policy, **kw)


@pytest.mark.parametrize("seed", range(6))
def test_lru_through_the_plugin_is_vllm_block_for_block(seed):
    native = Side(36, 16)
    ours = Side(36, 16, env("lru", check_invariants=True))
    assert type(native.pool).__name__ == "BlockPool"
    assert isinstance(ours.pool, plugin.PolicyBlockPool)

    def same_order(side, op):
        # the policy's order *is* vLLM's queue order: the queue stays exact under the plugin
        assert side.free_queue() == side.pool.policy.free_order().tolist(), f"op {op}"

    expected = run_stream(native, seed)
    got = run_stream(ours, seed, after_op=same_order)
    assert got == expected
    assert ours.pool.prefixshield_stats()["num_evictions"] > 0  # the stream did reclaim


@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("seed", range(3))
def test_every_policy_keeps_vllm_invariants(policy, seed):
    side = Side(40, 16, env(policy, check_invariants=True))
    obs = run_stream(side, seed, num_ops=250)
    pool = side.pool
    pool.check_invariants()
    assert pool.free_block_queue.num_free_blocks == 39  # everything released at the end
    assert pool.get_num_free_blocks() == pool.policy.num_free() == 39
    assert any(o[0] == "admit" and o[2] for o in obs)
    stats = pool.prefixshield_stats()
    assert stats["policy"] == policy and stats["groups"] == GROUPS


def test_allocate_slots_takes_vllms_own_parameters():
    # the fast wrapper names vLLM 0.32.0's parameters (by name in, by position on); it is the
    # one in use only where vLLM's signature is the same, else the *args/**kwargs wrapper is
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    assert plugin._same_parameters(plugin._allocate_slots_0_32, KVCacheManager.allocate_slots)
    assert plugin.PolicyKVCacheManager.allocate_slots is plugin._allocate_slots_0_32
    assert not plugin._same_parameters(plugin._allocate_slots_0_32, plugin._allocate_slots_any)


@pytest.mark.parametrize("seed", range(2))
def test_the_generic_allocate_slots_wrapper_is_vllm_block_for_block(monkeypatch, seed):
    # what runs on a vLLM whose allocate_slots signature differs: same blocks, same requester
    native = Side(36, 16)
    fast = Side(36, 16, env("lru", check_invariants=True))
    monkeypatch.setattr(plugin.PolicyKVCacheManager, "allocate_slots", plugin._allocate_slots_any)
    generic = Side(36, 16, env("lru", check_invariants=True))
    expected = run_stream(native, seed)
    assert run_stream(generic, seed) == expected
    monkeypatch.undo()
    assert run_stream(fast, seed) == expected
    assert generic.free_queue() == fast.free_queue() == native.free_queue()
    assert generic.pool.eviction_table() == fast.pool.eviction_table()
    assert generic.pool.occupancy() == fast.pool.occupancy()


def test_reuse_watchers_see_the_victims_as_vllm_hands_them_out():
    # unpinned blocks (KV connectors) carry a watcher: vLLM calls it after the block left the
    # free queue and before its hash is dropped; the pool keeps that order (two passes then)
    def run(side):
        pool = side.pool
        req = side.make_request("a", list(range(64)), "tenant-a")   # 4 full blocks, cached
        assert side.admit(req, 1 << 20)[0]
        seen = []
        pinned = [pool.blocks[b] for b in side.block_ids(req)]
        pool.unpin_blocks(pinned, lambda blk: seen.append(
            (blk.block_id, blk.ref_cnt, blk.block_hash is not None, blk.prev_free_block)))
        serving = pool.serving(req) if isinstance(pool, plugin.PolicyBlockPool) else nullcontext()
        with serving:
            got = [blk.block_id for blk in pool.get_new_blocks(pool.get_num_free_blocks())]
        return seen, got, [(b.block_id, b.ref_cnt, b.block_hash) for b in pool.blocks]

    native = run(Side(12, 16))
    ours = run(Side(12, 16, env("lru", check_invariants=True)))
    assert ours == native
    assert len(native[0]) == 4 and all(s[1:] == (0, True, None) for s in native[0])


def test_static_quota_refuses_a_group_at_its_quota_while_blocks_are_free():
    side = Side(40, 16, env("static_quota", check_invariants=True))  # quota 39 // 3 = 13
    assert side.pool.policy.quota == 13
    big = side.make_request("big", list(range(14 * 16)), "tenant-a")
    ok, _, _ = side.admit(big, 1 << 20)
    assert not ok                                  # 14 blocks > quota, though 39 are free
    assert side.pool.free_block_queue.num_free_blocks == 39
    fits = side.make_request("fits", list(range(13 * 16 - 1)), "tenant-a")
    assert side.admit(fits, 1 << 20)[0]
    other = side.make_request("other", list(range(500, 500 + 5 * 16)), "tenant-b")
    assert side.admit(other, 1 << 20)[0]           # another group still has its own share
    assert side.pool.occupancy() == {"default": 0, "tenant-a": 13, "tenant-b": 5}


def test_request_metadata_reaches_the_policy():
    side = Side(40, 16, env("lru", contracts=["critical", "standard", "best_effort"]))
    calls = []
    pol = side.pool.policy
    orig = pol.on_materialize

    def record(blocks, hashes, group, contract, prefix_id, now, **request):
        calls.append((list(blocks), list(hashes), group, contract, prefix_id, now))
        return orig(blocks, hashes, group, contract, prefix_id, now, **request)

    pol.on_materialize = record
    prompt = list(range(40))
    req = side.make_request("a", prompt, "tenant-b",
                            {"prefixshield_contract": "best_effort", "prefixshield_prefix_id": 7})
    assert side.admit(req, 1 << 20)[0]
    blocks, hashes, group, contract, prefix_id, now = calls[0]
    assert blocks == side.block_ids(req)[:2]       # the two full blocks of a 40-token prompt
    assert (group, contract, prefix_id) == (2, 2, 7)
    assert hashes == [plugin.hash_key(h) for h in req.block_hashes[:2]]
    assert now >= 0
    # defaults: no salt -> the default group, no contract -> "standard", prefix_id from block 0
    req2 = side.make_request("b", [5] * 40, None)
    assert side.admit(req2, 1 << 20)[0]
    g, c, p = calls[1][2:5]
    assert (g, c) == (0, 1)
    assert p == plugin.hash_key(req2.block_hashes[0]) & 0x7FFFFFFFFFFFFFFF


def test_the_request_its_root_and_decode_blocks_reach_the_policy():
    """on_materialize names the request (the same id for its later chunks and decode blocks),
    its root (the key of its first block hash) and its decode blocks; on_hit gets the root; a
    finished request is forgotten, a preempted one is not."""
    side = Side(40, 16, env("prefixshield"))
    pol = side.pool.policy
    calls, hits, finished = [], [], []
    mat, hit, fin = pol.on_materialize, pol.on_hit, pol.on_request_finished

    def record(blocks, hashes, group, contract, prefix_id, now, **request):
        calls.append((len(blocks), request))
        return mat(blocks, hashes, group, contract, prefix_id, now, **request)

    def record_hit(blocks, group, contract, prefix_id, now, root=None):
        hits.append(root)
        return hit(blocks, group, contract, prefix_id, now, root=root)

    def record_finish(request_id):
        finished.append(request_id)
        return fin(request_id)

    pol.on_materialize, pol.on_hit, pol.on_request_finished = record, record_hit, record_finish
    a = side.make_request("a", list(range(40)), "tenant-a")
    assert side.admit(a, 20)[0]                   # a first chunk: block 0
    assert side.step(a, 20)                       # the rest of the prompt: block 1
    root = plugin.hash_key(a.block_hashes[0])
    for tok in range(8):                          # 8 output tokens fill block 2 (a decode block)
        side.append_output(a, 500 + tok)
        assert side.step(a, 1)
    assert [(n, r["num_decode"]) for n, r in calls] == [(1, 0), (1, 0), (1, 1)]
    ids = {r["request_id"] for _, r in calls}
    assert len(ids) == 1 and {r["root"] for _, r in calls} == {root}
    b = side.make_request("b", list(range(40)), "tenant-a")
    assert side.admit(b, 1 << 20)[0]
    assert hits == [plugin.hash_key(b.block_hashes[0])] == [root]
    side.free(b, preempted=True)
    assert finished == []
    side.free(a)
    assert finished == list(ids)


def test_an_unconfigured_contract_is_refused_even_where_the_policy_ignores_it():
    # LRU's on_materialize/on_hit are the base no-ops the pool does not call; the request's ids
    # are still resolved, so a contract that is not configured is an error under every policy
    side = Side(40, 16, env("lru", contracts=["standard"]))
    req = side.make_request("a", list(range(40)), "tenant-a",
                            {"prefixshield_contract": "best_effort"})
    with pytest.raises(plugin.PluginError, match="contract 'best_effort' is not configured"):
        side.admit(req, 1 << 20)


def test_a_hook_patched_on_the_instance_is_called():
    side = Side(40, 16, env("lru"))
    hits = []
    side.pool.policy.on_hit = lambda blocks, g, c, p, now, root=None: hits.append((list(blocks),
                                                                                   g))
    a = side.make_request("a", list(range(40)), "tenant-a")
    assert side.admit(a, 1 << 20)[0]
    b = side.make_request("b", list(range(40)), "tenant-a")
    ok, cached, _ = side.admit(b, 1 << 20)
    assert ok and cached == 32
    assert hits == [(side.block_ids(a)[:2], 1)]


def test_request_ids_are_looked_up_again_after_the_policy_is_rebuilt():
    # a request's ids are memoized per tenant table: a rebuilt policy (reset_prefix_cache)
    # discovers groups afresh, and another pool resolves the same request in its own table
    side = Side(40, 16, plugin.plugin_env("lru", max_groups=2))
    req = side.make_request("a", list(range(40)), "x")
    assert side.admit(req, 1 << 20)[0]
    assert side.pool.request_meta(req)[0] == 0
    side.free(req)
    assert side.mgr.reset_prefix_cache()
    other = side.make_request("b", list(range(100, 140)), "y")
    assert side.admit(other, 1 << 20)[0]          # "y" is group 0 of the new table
    assert side.pool.request_meta(other)[0] == 0
    assert side.pool.request_meta(req)[0] == 1    # "x" comes second now
    elsewhere = Side(40, 16, plugin.plugin_env("lru", groups=["y", "x"]))
    assert elsewhere.pool.request_meta(req)[0] == 1
    assert side.pool.request_meta(req)[0] == 1


def test_owner_and_eviction_snapshots_follow_the_pool():
    side = Side(8, 16, env("lru", check_invariants=True))    # 7 usable blocks
    a = side.make_request("a", list(range(64)), "tenant-a")  # 4 full blocks, all cached
    assert side.admit(a, 1 << 20)[0]
    pool = side.pool
    owner = pool.owner
    assert owner.dtype == np.int32 and owner.shape == (8,)
    assert sorted(np.flatnonzero(owner == 1).tolist()) == sorted(side.block_ids(a))
    side.free(a)
    b = side.make_request("b", list(range(500, 596)), "tenant-b")  # 6 blocks: reclaims
    assert side.admit(b, 1 << 20)[0]
    ev = pool.evictions
    assert ev.dtype == np.int64 and ev.shape == (3, 4)
    assert ev[2, 1] > 0 and ev.sum() == ev[2, 1]   # tenant-b reclaimed tenant-a's blocks
    assert pool.prefixshield_stats()["evictions"] == {"tenant-b": {"tenant-a": int(ev[2, 1])}}
    assert pool.occupancy()["tenant-b"] == 6


def test_the_same_content_gets_the_same_key_in_another_block():
    side = Side(40, 16, env("lru"))
    a = side.make_request("a", list(range(33)), "tenant-a")
    b = side.make_request("b", list(range(33)), "tenant-b")
    assert a.block_hashes[0] != b.block_hashes[0]  # the salt isolates groups
    c = side.make_request("c", list(range(33)), "tenant-a")
    assert plugin.hash_key(a.block_hashes[1]) == plugin.hash_key(c.block_hashes[1])


def test_groups_are_discovered_into_a_fixed_number_of_slots():
    side = Side(40, 16, plugin.plugin_env("lru", max_groups=2))
    pol = side.pool.policy
    assert pol.groups == ("<slot 0>", "<slot 1>")
    assert side.admit(side.make_request("a", [1] * 20, "x"), 1 << 20)[0]
    assert side.admit(side.make_request("b", [2] * 20, None), 1 << 20)[0]
    assert pol.groups == ("x", "default")
    with pytest.raises(plugin.PluginError, match="PREFIXSHIELD_MAX_GROUPS"):
        side.admit(side.make_request("c", [3] * 20, "z"), 1 << 20)


def test_a_policy_choosing_a_block_in_use_is_an_invariant_error():
    side = Side(20, 16, env("lru"))
    req = side.make_request("a", list(range(40)), "tenant-a")
    assert side.admit(req, 1 << 20)[0]
    in_use = side.block_ids(req)[0]
    side.pool.policy.select_victims = lambda n, now, g: np.full(n, in_use, dtype=np.int32)
    with pytest.raises(plugin.PolicyInvariantError, match=f"block {in_use} with ref_cnt 1"):
        side.admit(side.make_request("b", list(range(100, 140)), "tenant-a"), 1 << 20)


def test_a_policy_losing_track_of_a_free_block_is_caught_after_the_call():
    side = Side(20, 16, env("lru", check_invariants=True))
    req = side.make_request("a", list(range(40)), "tenant-a")
    assert side.admit(req, 1 << 20)[0]
    side.pool.policy.on_release = lambda blocks, cached, now: None   # drops every release
    with pytest.raises(plugin.PolicyInvariantError, match="after free_blocks: vLLM's free queue "
                                                          "holds 19 blocks, policy lru holds 16"):
        side.free(req)


def test_reset_prefix_cache_keeps_counts_exact_and_rebuilds_the_policy():
    side = Side(20, 16, env("lru", check_invariants=True))
    req = side.make_request("a", list(range(40)), "tenant-a")
    assert side.admit(req, 1 << 20)[0]
    side.free(req)
    old = side.pool.policy
    assert side.mgr.reset_prefix_cache()
    assert side.pool.policy is not old
    assert side.pool.get_num_free_blocks() == side.pool.policy.num_free() == 19
    again = side.make_request("b", list(range(40)), "tenant-a")
    assert side.admit(again, 1 << 20)[1] == 0      # nothing cached any more


def test_no_policy_in_the_environment_means_vllms_own_behaviour(monkeypatch):
    for k in plugin.ENV_NAMES:
        monkeypatch.delenv(k, raising=False)
    plugin.install()
    side = Side(20, 16, env=None)
    with plugin.environment({plugin.ENV_POLICY: ""}):
        pool = plugin.PolicyBlockPool(20, enable_caching=True, hash_block_size=16)
    assert pool.policy is None and type(side.pool).__name__ == "BlockPool"
    assert pool.get_new_blocks(3) == [pool.blocks[1], pool.blocks[2], pool.blocks[3]]


def test_register_installs_only_with_a_policy(monkeypatch):
    was = plugin.is_installed()
    try:
        plugin.uninstall()
        monkeypatch.delenv(plugin.ENV_POLICY, raising=False)
        plugin.register()
        assert not plugin.is_installed()
        monkeypatch.setenv(plugin.ENV_POLICY, "lru")
        plugin.register()
        plugin.register()                          # idempotent
        assert plugin.is_installed()
        import vllm.v1.core.kv_cache_coordinator as coord
        assert coord.BlockPool is plugin.PolicyBlockPool
        monkeypatch.setenv(plugin.ENV_POLICY, "no-such-policy")
        with pytest.raises(plugin.PluginError, match="unknown policy 'no-such-policy'"):
            plugin.register()
    finally:
        plugin.uninstall()
        if was:
            plugin.install()
    assert plugin.check_vllm_compatibility() == []


@pytest.mark.parametrize("variables, message", [
    ({"PREFIXSHIELD_POLICY_ARGS": "{nope"}, "PREFIXSHIELD_POLICY_ARGS: not valid JSON"),
    ({"PREFIXSHIELD_POLICY_ARGS": "[1]"}, "expected a JSON object"),
    ({"PREFIXSHIELD_CONTRACTS": '["gold"]'}, "unknown contract 'gold'"),
    ({"PREFIXSHIELD_CONTRACTS": '{"gold": [0, 5]}'}, "rho_blocks_per_s must be > 0"),
    ({"PREFIXSHIELD_GROUPS": "a,b,a"}, "duplicate group names"),
    ({"PREFIXSHIELD_GROUPS": "a,b", "PREFIXSHIELD_MAX_GROUPS": "1"}, "smaller than the 2 named"),
    ({"PREFIXSHIELD_MAX_GROUPS": "many"}, "expected an integer"),
])
def test_bad_configuration_names_the_variable(variables, message):
    with pytest.raises(plugin.PluginError, match=message):
        plugin.PluginConfig.from_env({"PREFIXSHIELD_POLICY": "lru", **variables})


def test_plugin_env_round_trips_through_the_environment():
    custom = [DEFAULT_CONTRACTS["critical"], DEFAULT_CONTRACTS["best_effort"]]
    e = plugin.plugin_env("static_quota", contracts=custom, groups=["v", "a"],
                          check_invariants=True)
    cfg = plugin.PluginConfig.from_env(e)
    assert cfg.policy == "static_quota" and cfg.groups == ("v", "a") and cfg.max_groups == 2
    assert [c.name for c in cfg.contracts] == ["critical", "best_effort"]
    assert cfg.contracts[1].rho_blocks_per_s == 16.0 and cfg.check_invariants
    assert plugin.PluginConfig.from_env({}) is None
    assert len(SALTS) == 3


def test_vllm_finds_register_through_the_installed_entry_point(monkeypatch):
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    from vllm.plugins import DEFAULT_PLUGINS_GROUP, load_plugins_by_group

    from prefixshield.validate import vllm_entry

    assert DEFAULT_PLUGINS_GROUP == "vllm.general_plugins"
    assert load_plugins_by_group(DEFAULT_PLUGINS_GROUP)["prefixshield"] is vllm_entry.register


_ENGINE_SCRIPT = """
import os, sys
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
from vllm import LLM, SamplingParams
llm = LLM(model=sys.argv[1], skip_tokenizer_init=True, dtype="float32", block_size=32,
          enable_prefix_caching=True, num_gpu_blocks_override=64, max_model_len=1024,
          enforce_eager=True, gpu_memory_utilization=0.2)
p = {"prompt_token_ids": list(range(70))}
out = llm.generate([p, p], SamplingParams(max_tokens=2, min_tokens=2, ignore_eos=True))
pool = llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_manager.block_pool
print("POOL", type(pool).__name__, "CACHED", out[1].num_cached_tokens)
"""


@pytest.mark.parametrize("policy, pool_class", [("", "BlockPool"), ("lru", "PolicyBlockPool")])
def test_plain_vllm_engine_with_prefixshield_installed(tiny_model_dir, policy, pool_class):
    """vLLM loads the entry point in every engine: with no policy set, nothing changes (and
    vLLM's CPU worker still starts: the entry point must not pull numba in); with one, vLLM
    builds our pool. Run in a fresh process, as a user's script would."""
    import subprocess
    import sys

    env = dict(os.environ, PREFIXSHIELD_POLICY=policy)
    proc = subprocess.run([sys.executable, "-c", _ENGINE_SCRIPT, tiny_model_dir],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"POOL {pool_class} CACHED 64" in proc.stdout
