"""S3-FIFO over KV blocks, following libCacheSim's ``S3FIFO.c`` for equal-size objects.

Objects are cached blocks (one object = one block holding one content key). Sizes are computed
exactly as libCacheSim computes them from ``capacity = num_blocks - 1`` (C ``int64`` truncation
of a ``double`` product):

* ``small_size = int(capacity * small_size_ratio)``           (default ratio 0.10)
* ``main_size  = capacity - small_size``
* ``ghost_size = int(capacity * ghost_size_ratio)``           (default ratio 0.90; 0 = no ghost)

Semantics (libCacheSim ``S3FIFO_find`` / ``_insert`` / ``_evict`` / ``_evict_small`` /
``_evict_main``):

* hit (``on_hit``): ``freq += 1``, capped at ``max(3, move_to_main_threshold)`` (libCacheSim keeps
  an uncapped int64 and caps with ``MIN(freq, 3)`` in main; the cap changes no decision);
* insert (``on_materialize``): content key in the ghost -> removed from the ghost, block appended
  to main; else, if no block was ever reclaimed and small holds ``>= small_size`` blocks -> main;
  else -> small. ``freq = 0``;
* one eviction (libCacheSim ``S3FIFO_evict``): if main holds more than ``main_size`` blocks or
  small is empty -> evict from main, else from small;
* evict from small: pop the small head; ``freq >= move_to_main_threshold`` -> append it to main
  with ``freq = 0`` (a promotion) and continue; else reclaim it and append its key to the ghost
  (bounded to ``ghost_size`` keys, oldest dropped first; see below). Stops at the first
  reclaimed block or when small is empty (then the caller evicts again);
* evict from main: pop the main head; ``freq >= 1`` -> append it to main with
  ``freq = min(freq, 3) - 1`` and continue; else reclaim it (no ghost entry).

Where the block pool adds to the cache model:

* **truly free blocks first.** Blocks without content (``1 .. num_blocks-1`` at start, and blocks
  released with ``cached=False``) are handed out before any cached block is reclaimed (vLLM
  >= 0.28 behaviour, work conservation). They are kept in vLLM's free-queue order: initially
  ``1, 2, ...``; released ones go to the head, reading in the order given (``"current"``), or to
  the tail (``"0.10"``). Taking one is not an eviction and does not set "has evicted".
* **acquire / release** only pin and unpin a queued block; its queue position and ``freq`` are
  untouched. (The pool calls ``on_hit`` for every hit block, in use or free.)
* **pinned blocks** (in use: the pool's ``ref_cnt > 0``) are never reclaimed; what eviction does
  when it meets one is specified in `S3FIFOPolicy`.
* a reclaimed block leaves the queues; if it is materialized again it is a new object (freq 0,
  small unless its new key is in the ghost).
* the ghost is keyed by content key (``hashes`` of ``on_materialize``) and bounded as in
  libCacheSim: ``ghost_size`` keys, FIFO, a key already present is not moved. libCacheSim looks
  the missed key up in the ghost *before* evicting to make room for it; the pool allocates
  (evicts) before it materializes. So keys evicted by one ``select_victims`` call are appended
  untrimmed, and the ghost is trimmed back to ``ghost_size`` (oldest first) right after the next
  ``on_materialize`` has looked up its keys, or at the start of the next ``select_victims``.
  Under the pure cache driver this gives libCacheSim's ghost contents exactly; in between, the
  ghost may hold up to ``ghost_size + n`` keys (``n`` = blocks of the last allocation).
* libCacheSim refuses to insert anything when ``small_size <= 1`` (capacities below 20 at the
  default ratio) and aborts when ``small_size`` or ``main_size`` is 0; a block pool cannot refuse
  to cache a computed block, so here those configurations simply run the rules above.
"""

from __future__ import annotations

import numpy as np

from prefixshield.policies.base import FusedArrays, Policy, register_policy
from prefixshield.policies.kernels import s3fifo_kernels as k
from prefixshield.policies.kernels.linkedlist import LinkedLists


MAX_GHOST_SIZE_RATIO = 64.0
"""Largest ghost queue in entries per cache block (libCacheSim's default is 0.9)."""


@register_policy
class S3FIFOPolicy(Policy):
    """S3-FIFO (small FIFO + main 2-bit CLOCK-like FIFO + ghost) over blocks, with libCacheSim's
    rules (module docstring) and vLLM's pinning.

    Pinned blocks. A queued block is pinned from ``on_materialize`` (it is being computed) or
    ``on_acquire`` (a hit took it back) until ``on_release``; pinning never moves it. A pinned
    block is never returned by `select_victims`. When eviction meets one:

    * at the small head: if ``freq >= move_to_main_threshold`` it is promoted to main with
      freq 0, exactly as an unpinned block; otherwise it is **moved to the small tail with its
      freq unchanged** (it stays a small-queue object and must still earn its hits to reach
      main, so a long-running one-touch request cannot smuggle its blocks into main) and
      eviction continues with the next small head;
    * at the main head: if ``freq >= 1`` it is reinserted at the main tail with
      ``min(freq, 3) - 1``, exactly as an unpinned block; otherwise it is **moved to the main
      tail with freq 0** and eviction continues;
    * queue choice counts only unpinned blocks: evict from main iff (main holds more than
      ``main_size`` blocks, pinned included, **or** small has no unpinned block) **and** main
      has an unpinned block, else from small. A pass over a queue stops as soon as that queue
      has no unpinned block left, and the choice is made again. Without pinned blocks this is
      libCacheSim's rule exactly.

    This terminates whenever a free block exists (the pool checks before it asks): an unpinned
    block reaching a queue head is promoted, reclaimed or has its freq lowered, and a pinned one
    is only rotated past. Stats count the rotations (``pinned_kept_small``/``_main``).

    Args:
        num_blocks: configured blocks, null block included (capacity = ``num_blocks - 1``).
        vllm_compat: order of truly free blocks released later (``"current"``: head; ``"0.10"``:
            tail). Truly free blocks are reused before any reclamation in both modes.
        small_size_ratio: small FIFO share of capacity (libCacheSim ``small-size-ratio``, 0.10).
        ghost_size_ratio: ghost entries per capacity (libCacheSim ``ghost-size-ratio``, 0.90).
        move_to_main_threshold: small-queue freq needed for promotion to main (libCacheSim
            ``move-to-main-threshold``, 2).
    """

    name = "s3fifo"

    def __init__(self, num_blocks: int, vllm_compat: str = "current",
                 small_size_ratio: float = 0.1, ghost_size_ratio: float = 0.9,
                 move_to_main_threshold: int = 2) -> None:
        super().__init__(num_blocks, vllm_compat)
        if not 0.0 <= small_size_ratio <= 1.0:
            raise ValueError(f"small_size_ratio must be in [0, 1], got {small_size_ratio}")
        if not 0.0 <= ghost_size_ratio <= MAX_GHOST_SIZE_RATIO:
            raise ValueError(f"ghost_size_ratio must be in [0, {MAX_GHOST_SIZE_RATIO:g}] (ghost "
                             f"entries per cache block), got {ghost_size_ratio}")
        if (not isinstance(move_to_main_threshold, (int, np.integer))
                or not 0 <= move_to_main_threshold <= 100):
            raise ValueError("move_to_main_threshold must be an integer in [0, 100], "
                             f"got {move_to_main_threshold!r}")
        self.small_size_ratio = float(small_size_ratio)
        self.ghost_size_ratio = float(ghost_size_ratio)
        self.move_to_main_threshold = int(move_to_main_threshold)
        capacity = self.num_blocks - 1
        self.capacity = capacity
        self.small_size = int(capacity * self.small_size_ratio)
        self.main_size = capacity - self.small_size
        self.ghost_size = int(capacity * self.ghost_size_ratio)
        self.freq_cap = max(3, self.move_to_main_threshold)

        self._lists = LinkedLists(self.num_blocks, k.NUM_LISTS)
        lists = self._lists
        initial = np.arange(1, self.num_blocks, dtype=np.int32)
        # initial free list 1 .. num_blocks-1 (vLLM's initial free queue), linked vectorised
        nb = self.num_blocks
        if initial.size:
            head, tail = nb + 2 * k.FREE, nb + 2 * k.FREE + 1
            chain = np.concatenate(([head], initial, [tail])).astype(np.int32)
            lists.nxt[chain[:-1]] = chain[1:]
            lists.prev[chain[1:]] = chain[:-1]
            lists.member[initial] = k.FREE
            lists.length[k.FREE] = initial.size
        self._freq = np.zeros(self.num_blocks, dtype=np.int8)
        self._in_use = np.zeros(self.num_blocks, dtype=np.bool_)
        self._key = np.zeros(self.num_blocks, dtype=np.uint64)
        self._cnt = np.zeros(k.NUM_COUNTERS, dtype=np.int64)
        self._params = np.zeros(k.NUM_PARAMS, dtype=np.int64)
        self._params[k.P_SMALL_SIZE] = self.small_size
        self._params[k.P_MAIN_SIZE] = self.main_size
        self._params[k.P_GHOST_SIZE] = self.ghost_size
        self._params[k.P_THRESHOLD] = self.move_to_main_threshold
        self._params[k.P_FREQ_CAP] = self.freq_cap
        self._params[k.P_CURRENT_MODE] = int(self.vllm_compat == "current")
        # the ghost: a ring of keys in FIFO order and an int32 table of ring indices (no typed
        # Dict, so the fused event loop, compiled without numba's runtime, drives it; sizes and
        # layout in the kernels' module docstring and k.ghost_sizes)
        ring, bits = k.ghost_sizes(self.num_blocks, self.ghost_size)
        if ring >= 2 ** 31 - 1:
            raise ValueError(f"s3fifo: a ghost of {self.ghost_size:,} keys over "
                             f"{self.num_blocks:,} blocks needs a ring of {ring:,} entries, more "
                             "than int32 indices reach")
        self._gkeys = np.zeros(ring, dtype=np.uint64)
        self._gtab = np.full(1 << bits, -1, dtype=np.int32)
        self._gpos = np.zeros(k.NUM_GPOS, dtype=np.int64)
        self._gpos[k.G_BITS] = bits
        self._ghost_slack = 0  # keys the last allocation appended untrimmed (see kernels doc)

    # -- pool interface -------------------------------------------------------------------------

    def fused_arrays(self) -> FusedArrays:
        """The loop's ``s3fifo`` kernels on its lists (truly free, small, main), counters,
        parameters and ghost."""
        q = self._lists
        return FusedArrays("s3fifo", lists=(q.prev, q.nxt, q.member, q.length),
                           s3_state=(self._freq, self._in_use, self._key, self._cnt,
                                     self._params, self._gkeys, self._gtab, self._gpos),
                           ghost_slack=self._ghost_slack)

    def fused_done(self, ghost_slack: int) -> None:
        """The ghost slack the loop's last allocation left (see the kernels' docstring)."""
        self._ghost_slack = int(ghost_slack)

    def on_release(self, blocks: np.ndarray, cached: np.ndarray, now: float) -> None:
        """Unpin ``blocks``: cached ones stay where they are in small/main; the others join the
        truly free list (head in ``"current"``, tail in ``"0.10"``)."""
        q = self._lists
        bad = k.on_release(np.asarray(blocks, dtype=np.int32), np.asarray(cached, dtype=np.bool_),
                           q.prev, q.nxt, q.member, q.length, q.num_blocks, self._in_use,
                           self._key, self._cnt, self.vllm_compat == "current")
        if bad:
            raise ValueError(f"s3fifo: {bad} released block(s) were not in use, or cached but "
                             f"never materialized: {blocks}")

    def on_acquire(self, blocks: np.ndarray) -> None:
        """Pin free cached ``blocks`` (taken back by a hit); their queue positions do not move."""
        bad = k.on_acquire(np.asarray(blocks, dtype=np.int32), self._lists.member, self._in_use,
                           self._cnt)
        if bad:
            raise ValueError(f"s3fifo: {bad} acquired block(s) were not free cached blocks: "
                             f"{blocks}")

    def select_victims(self, n: int, now: float, requester: int) -> np.ndarray:
        """Take ``n`` free blocks: truly free ones first, then S3-FIFO evictions (pinned blocks
        are skipped as the class docstring says). The blocks returned are in use."""
        out = np.empty(n, dtype=np.int32)
        q = self._lists
        got = k.select_victims(n, out, (q.prev, q.nxt, q.member, q.length), q.num_blocks,
                               self._freq, self._in_use, self._key, self._cnt, self._params,
                               (self._gkeys, self._gtab, self._gpos), True)
        self._ghost_slack = got
        if got != n:
            raise ValueError(f"s3fifo: asked for {n} free blocks, only {got} were free")
        return out

    def on_materialize(self, blocks: np.ndarray, hashes: np.ndarray, group: int, contract: int,
                       prefix_id: int, now: float, *, request_id: int = -1, root=None,
                       num_decode: int = 0) -> None:
        """Insert newly cached ``blocks`` under content keys ``hashes`` (see module docstring)."""
        q = self._lists
        bad = k.on_materialize(np.asarray(blocks, dtype=np.int32),
                               np.asarray(hashes, dtype=np.uint64),
                               (q.prev, q.nxt, q.member, q.length), q.num_blocks, self._freq,
                               self._in_use, self._key, self._cnt, self._params,
                               (self._gkeys, self._gtab, self._gpos))
        self._ghost_slack = 0
        if bad:
            raise ValueError(f"s3fifo: {bad} materialized block(s) were truly free (never "
                             f"taken with select_victims): {blocks}")

    def on_hit(self, blocks: np.ndarray, group: int, contract: int, prefix_id: int,
               now: float, *, root=None) -> None:
        """Count one access of each hit block (freq += 1, capped)."""
        k.on_hit(np.asarray(blocks, dtype=np.int32), self._lists.member, self._freq,
                 self.freq_cap)

    def replay_keys(self, keys: np.ndarray, block_of, key_of: np.ndarray,
                    fused: bool = True) -> np.ndarray:
        """The pure cache driver's loop in one kernel (see
        `prefixshield.simulator.cachedriver.replay_keys`); same decisions, no Python per key.

        Args:
            keys: int64 content keys, one per request.
            block_of: numba typed Dict content key -> block (updated).
            key_of: int64 per block, its content key or -1 (updated).
            fused: run `replay_keys_fused`
                (the miss path inlined, one array hash table for cached and ghost keys) when its
                preconditions hold (every key >= 0, no block pinned, a state the pure driver
                leaves: ``block_of`` maps exactly the queued blocks); False (or preconditions
                unmet) runs
                `replay_keys`, which calls the
                policy's own kernels per request -- the oracle the fused kernel is tested equal to.

        Returns:
            bool per request, True where it hit.
        """
        q = self._lists
        hits = np.zeros(keys.shape[0], dtype=np.bool_)
        pinned = self._cnt[k.SMALL] or self._cnt[k.MAIN] or self._in_use.any()
        bad = -1
        if fused and not pinned and (keys.shape[0] == 0 or int(keys.min()) >= 0):
            bits, ring_len = k.fused_table_sizes(self.num_blocks, self.ghost_size,
                                                 int(self._gpos[k.G_LIVE]))
            scratch = (np.full(2 << bits, -1, dtype=np.int64),
                       np.zeros(self.num_blocks, dtype=np.int64),
                       np.zeros(ring_len, dtype=np.int64))
            bad = k.replay_keys_fused(
                keys, hits, block_of, key_of, (q.prev, q.nxt, q.member, q.length), q.num_blocks,
                self._freq, self._key, self._cnt, self._params,
                (self._gkeys, self._gtab, self._gpos), scratch, bits)
        if bad < 0:  # not fused, or a state the fused kernel does not take (it changed nothing)
            bad = k.replay_keys(keys, hits, block_of, key_of, (q.prev, q.nxt, q.member, q.length),
                                q.num_blocks, self._freq, self._in_use, self._key, self._cnt,
                                self._params, (self._gkeys, self._gtab, self._gpos),
                                self.freq_cap, self.vllm_compat == "current")
        self._ghost_slack = 0
        if bad:
            raise ValueError(f"s3fifo: {bad} illegal calls while replaying keys")
        return hits

    def num_free(self) -> int:
        """Truly free blocks plus unpinned cached blocks."""
        return int(k.num_free(self._lists.length, self._cnt))

    def free_order(self) -> np.ndarray:
        """Free blocks in the order `select_victims` would hand them out if no other event
        happened: truly free ones, then the reclamation order (computed by running the eviction
        kernel on a copy of the state, ghost untouched)."""
        q = self._lists
        n = self.num_free()
        out = np.empty(n, dtype=np.int32)
        got = k.select_victims(n, out, (q.prev.copy(), q.nxt.copy(), q.member.copy(),
                                        q.length.copy()), q.num_blocks, self._freq.copy(),
                               self._in_use.copy(), self._key.copy(), self._cnt.copy(),
                               self._params, (self._gkeys, self._gtab, self._gpos), False)
        return out[:got]

    # -- introspection --------------------------------------------------------------------------

    def queue(self, which: str) -> np.ndarray:
        """Block ids of queue ``which`` (``"free"``, ``"small"`` or ``"main"``), head first."""
        idx = {"free": k.FREE, "small": k.SMALL, "main": k.MAIN}[which]
        return self._lists.to_array(idx)

    def freq(self, blocks) -> np.ndarray:
        """Current access counters of ``blocks``."""
        return self._freq[np.asarray(blocks, dtype=np.int64)].astype(np.int64)

    def ghost_keys(self) -> np.ndarray:
        """Content keys in the ghost, oldest first."""
        keys, _ = k.ghost_live_keys(self._gkeys, self._gtab, self._gpos)
        return keys

    def stats(self) -> dict:
        """Queue sizes and targets, and event counters (all ints)."""
        length, cnt = self._lists.length, self._cnt
        return {
            "small_blocks": int(length[k.SMALL]),
            "main_blocks": int(length[k.MAIN]),
            "ghost_keys": int(self._gpos[k.G_LIVE]),
            "truly_free_blocks": int(length[k.FREE]),
            "pinned_small": int(cnt[k.SMALL]),
            "pinned_main": int(cnt[k.MAIN]),
            "small_size": self.small_size,
            "main_size": self.main_size,
            "ghost_size": self.ghost_size,
            "promotions": int(cnt[k.C_PROMOTIONS]),
            "evictions_small": int(cnt[k.C_EVICTED_SMALL]),
            "evictions_main": int(cnt[k.C_EVICTED_MAIN]),
            "main_reinsertions": int(cnt[k.C_MAIN_REINSERTS]),
            "ghost_hits": int(cnt[k.C_GHOST_HITS]),
            "warmup_main_inserts": int(cnt[k.C_WARMUP_MAIN_INSERTS]),
            "pinned_kept_small": int(cnt[k.C_PINNED_KEPT_SMALL]),
            "pinned_kept_main": int(cnt[k.C_PINNED_KEPT_MAIN]),
            "truly_free_taken": int(cnt[k.C_TRULY_FREE_TAKEN]),
        }

    def check_invariants(self) -> None:
        """Raise ``AssertionError`` on the first broken S3-FIFO invariant (lists well formed,
        pinned counts, every block either listed or in use, truly free blocks unpinned, freq in
        range, ghost bounded and consistent)."""
        q = self._lists
        seen = np.zeros(self.num_blocks, dtype=np.int64)
        for idx, name in ((k.FREE, "free"), (k.SMALL, "small"), (k.MAIN, "main")):
            arr = q.to_array(idx)
            if arr.size and (arr.min() < 1 or arr.max() >= self.num_blocks):
                raise AssertionError(f"{name} list holds an invalid block id")
            if not np.all(q.member[arr] == idx):
                raise AssertionError(f"{name} list and member[] disagree")
            if q.nxt[arr[-1] if arr.size else self.num_blocks + 2 * idx] != \
                    self.num_blocks + 2 * idx + 1:
                raise AssertionError(f"{name} list length {q.length[idx]} does not reach its tail")
            np.add.at(seen, arr, 1)
            if idx == k.FREE:
                if self._in_use[arr].any():
                    raise AssertionError("a truly free block is marked in use")
            else:
                pinned = int(np.count_nonzero(self._in_use[arr]))
                if pinned != self._cnt[idx]:
                    raise AssertionError(f"{name}: {pinned} pinned blocks, counter says "
                                         f"{self._cnt[idx]}")
        if seen[0] or (seen > 1).any():
            raise AssertionError("a block is listed twice, or the null block is listed")
        if not np.array_equal(seen[1:] == 0, q.member[1:] < 0):
            raise AssertionError("member[] marks a block listed that is not")
        unlisted = np.flatnonzero(seen[1:] == 0) + 1
        if not self._in_use[unlisted].all():
            raise AssertionError("a block is neither listed nor in use (lost)")
        if self._in_use[0]:
            raise AssertionError("the null block is in use")
        if self._freq.min() < 0 or self._freq.max() > self.freq_cap:
            raise AssertionError("freq out of range")
        queued = q.member >= k.SMALL
        if (self._freq[~queued] != 0).any():
            raise AssertionError("a block outside the queues has a nonzero freq")
        _, n_live = k.ghost_live_keys(self._gkeys, self._gtab, self._gpos)
        live = int(self._gpos[k.G_LIVE])
        in_table = int(np.count_nonzero(self._gtab >= 0))
        bound = self.ghost_size + self._ghost_slack if self.ghost_size > 0 else 0
        if n_live != live or in_table != live or live > bound:
            raise AssertionError(f"ghost holds {live} keys ({n_live} live ring entries, "
                                 f"{in_table} in its table), bound {bound}")
        if not 0 <= self._gpos[k.G_TAIL] - self._gpos[k.G_HEAD] <= self._gkeys.shape[0]:
            raise AssertionError("ghost ring window out of range")
