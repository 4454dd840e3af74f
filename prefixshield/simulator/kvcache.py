"""Request-level KV cache manager: vLLM's ``KVCacheManager`` over our `BlockPool`.

Holds the per-request block tables and implements vLLM's three calls the scheduler makes:
``get_computed_blocks`` (prefix lookup, no side effect), ``allocate_slots`` (touch hits, take new
blocks, cache the full blocks the scheduled tokens complete) and ``free`` (release blocks in
reverse order so chain tails are evicted first). Units: tokens unless a name says blocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from prefixshield.simulator.blockpool import BlockPool
from prefixshield.simulator.hashing import chain_block_hashes

_EMPTY = np.empty(0, dtype=np.int32)


@dataclass(eq=False)
class Sequence:
    """KV state of one request as the cache manager sees it.

    Attributes:
        request_id: the trace's request id.
        group, contract, prefix_id: accounting metadata (ints).
        token_ids: prompt then output token ids (int64); output ids are known up front so decode
            blocks hash exactly like a later request whose prompt contains the same text.
        num_prompt_tokens: prompt length.
        block_hashes: hashes of every full block of ``token_ids`` (uint64).
        num_output_done: output tokens generated so far (kept across preemption, as vLLM does).
        num_computed_tokens: tokens whose KV is computed or reused (reset by preemption).
        blocks: the block table (int32, first ``num_blocks`` entries valid).
        num_cached_blocks: leading blocks of the table that carry this request's hashes.
        num_materialized_blocks: full blocks this request computed and cached, over its life
            (recomputation after preemption counts again: the KV state is created again).
        block_s: KV block-seconds its block table held so far (blocks x seconds, summed over
            the intervals between changes of ``num_blocks``).
        held_since: simulated seconds of the last change of ``num_blocks``.
    """

    request_id: int
    group: int
    contract: int
    prefix_id: int
    token_ids: np.ndarray
    num_prompt_tokens: int
    block_hashes: np.ndarray
    num_output_done: int = 0
    num_computed_tokens: int = 0
    blocks: np.ndarray = field(default_factory=lambda: _EMPTY)
    num_blocks: int = 0
    num_cached_blocks: int = 0
    num_materialized_blocks: int = 0
    block_s: float = 0.0
    held_since: float = 0.0

    @property
    def num_tokens(self) -> int:
        """Prompt tokens plus output tokens generated so far (vLLM's ``request.num_tokens``)."""
        return self.num_prompt_tokens + self.num_output_done


def make_sequence(request_id: int, group: int, contract: int, prefix_id: int,
                  token_ids: np.ndarray, num_prompt_tokens: int, block_size: int,
                  hash_seed: int) -> Sequence:
    """Build a `Sequence`, hashing every full block of ``token_ids`` under ``group``."""
    hashes = chain_block_hashes(token_ids, token_ids.shape[0], block_size, group, hash_seed)
    max_blocks = -(-token_ids.shape[0] // block_size)
    return Sequence(request_id, group, contract, prefix_id, token_ids, num_prompt_tokens, hashes,
                    blocks=np.empty(max_blocks + 1, dtype=np.int32))


class KVCacheManager:
    """vLLM's ``KVCacheManager`` for one full-attention KV group with prefix caching enabled.

    Args:
        pool: the block pool (owns the blocks, consults the policy).
        block_size: tokens per block.
    """

    def __init__(self, pool: BlockPool, block_size: int) -> None:
        if not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
        self.pool = pool
        self.block_size = block_size
        # block-table entries of the running requests, per group (blocks held)
        self.held = np.zeros_like(pool.occupancy)

    def get_computed_blocks(self, seq: Sequence) -> tuple[np.ndarray, int]:
        """Longest cached prefix of ``seq``: (block ids, cached tokens).

        vLLM caps the hit at ``num_tokens - 1`` tokens so that at least one token is computed
        (the last token's logits are needed): at most ``(num_tokens - 1) // block_size`` blocks.
        """
        max_blocks = (seq.num_tokens - 1) // self.block_size
        hits = self.pool.find_cached_prefix(seq.block_hashes, max_blocks)
        return hits, hits.shape[0] * self.block_size

    def num_blocks_to_allocate(self, seq: Sequence, num_tokens_need_slot: int,
                               new_computed_blocks: np.ndarray) -> int:
        """Free blocks an allocation would consume: new blocks plus ref_cnt-0 hits it touches."""
        required = -(-num_tokens_need_slot // self.block_size)
        num_new = required - new_computed_blocks.shape[0] - seq.num_blocks
        num_evictable_hits = int(np.count_nonzero(self.pool.ref_cnt[new_computed_blocks] == 0))
        return max(num_new, 0) + num_evictable_hits

    def allocate_slots(self, seq: Sequence, num_new_tokens: int, now: float,
                       new_computed_blocks: np.ndarray = _EMPTY,
                       num_tokens_to_reserve: int = 0) -> bool:
        """Allocate blocks for ``num_new_tokens`` more tokens of ``seq``; False if they do not fit.

        Args:
            seq: the request.
            num_new_tokens: tokens to compute in this step (after the prefix hit).
            now: simulated seconds (for the policy's accounting clock).
            new_computed_blocks: prefix-hit blocks from `get_computed_blocks` (first
                allocation only); their tokens count as computed.
            num_tokens_to_reserve: if larger than the tokens this step needs, the free-block check
                is made for that many tokens instead (full-prompt reservation at admission);
                only the step's blocks are actually taken.
        """
        num_hit = new_computed_blocks.shape[0]
        num_computed = seq.num_computed_tokens + num_hit * self.block_size
        num_tokens_need_slot = num_computed + num_new_tokens
        check_tokens = max(num_tokens_need_slot, num_tokens_to_reserve)
        pool = self.pool
        if num_hit:
            need = self.num_blocks_to_allocate(seq, check_tokens, new_computed_blocks)
        else:
            # num_blocks_to_allocate without hits, inline: this is the call of every decode step
            # that opens or fills a block.
            need = max(-(-check_tokens // self.block_size) - seq.num_blocks, 0)
        # A free-block count is never negative, so asking for none always fits: skip the count.
        if need and need > pool.num_free_blocks(seq.group):
            return False
        if num_hit or -(-num_tokens_need_slot // self.block_size) > seq.num_blocks + num_hit:
            # the table grows: close its interval at the old size (only at a change, so a step
            # that takes no block adds nothing and every path sums the same terms)
            seq.block_s += seq.num_blocks * (now - seq.held_since)
            seq.held_since = now
        if num_hit:
            pool.touch(new_computed_blocks, seq.group, seq.contract, seq.prefix_id, now,
                       seq.block_hashes[0])
            seq.blocks[seq.num_blocks:seq.num_blocks + num_hit] = new_computed_blocks
            seq.num_blocks += num_hit
            self.held[seq.group] += num_hit
            seq.num_computed_tokens = num_computed
            if seq.num_cached_blocks == 0:
                seq.num_cached_blocks = num_hit
        required = -(-num_tokens_need_slot // self.block_size)
        num_new_blocks = required - seq.num_blocks
        if num_new_blocks > 0:
            if num_hit:
                new = pool.get_new_blocks(num_new_blocks, seq.group, now)
            else:
                # Nothing touched the pool since the check above: it is this take's check.
                new = pool.take_new_blocks(num_new_blocks, seq.group, now)
            seq.blocks[seq.num_blocks:seq.num_blocks + num_new_blocks] = new
            seq.num_blocks += num_new_blocks
            self.held[seq.group] += num_new_blocks
        num_full = min(num_computed + num_new_tokens, seq.num_tokens) // self.block_size
        if num_full > seq.num_cached_blocks:
            lo = seq.num_cached_blocks
            # blocks from the one holding the prompt's end on fill during decode
            num_decode = num_full - max(lo, seq.num_prompt_tokens // self.block_size)
            pool.cache_full_blocks(seq.blocks[lo:num_full], seq.block_hashes[lo:num_full],
                                   seq.group, seq.contract, seq.prefix_id, now,
                                   seq.request_id, seq.block_hashes[0], max(num_decode, 0))
            seq.num_materialized_blocks += num_full - lo
            seq.num_cached_blocks = num_full
        return True

    def free(self, seq: Sequence, now: float, finished: bool = False) -> None:
        """Release ``seq``'s blocks, tail first (vLLM frees in reverse so tails are evicted
        first); ``finished``: the request ended (else it was preempted and comes back)."""
        if seq.num_blocks:
            seq.block_s += seq.num_blocks * (now - seq.held_since)
            seq.held_since = now
            self.held[seq.group] -= seq.num_blocks
            self.pool.free_blocks(seq.blocks[seq.num_blocks - 1::-1].copy(), now)
        if finished:
            self.pool.request_finished(seq.request_id)
        seq.num_blocks = 0
        seq.num_cached_blocks = 0
        seq.num_computed_tokens = 0
