"""SimPy model of one vLLM engine: arrivals, a continuous-batching scheduler, timed steps.

The scheduler follows vLLM v1's ``Scheduler.schedule``:

1. Running requests first, in admission order, each asking for its next tokens (decode: 1;
   prefill: the rest of the prompt, cut to the step's token budget = chunked prefill). If the
   cache cannot give a running request its blocks, the most recently admitted running request is
   preempted (recompute: its blocks are freed and stay cached; it goes back to the head of the
   waiting queue), until the allocation fits or the request itself was preempted.
2. Only if nothing was preempted in this step: waiting requests in FCFS order, while the token
   budget and ``max_num_seqs`` allow. A waiting request that does not fit blocks all behind it
   (head-of-line blocking).

That is vLLM's default scheduling (``EngineConfig.scheduler`` = FCFS without limits). Another
scheduler (`prefixshield.scheduling`: ``priority``, ``vtc``, ``kvtc``) chooses the waiting
order and the preemption victim, and per-tenant limits hold requests back; the step-by-step and
per-step batched paths call ``Engine.scheduler``'s methods, and the fused loop its compiled
form (`prefixshield.scheduling.kernels`), with the same decisions.

Every path records, per request, the first admission time, the prefix cached at arrival and
the KV block-seconds its block table held, and per group the blocks held by running requests
over time ([`RunResult`][prefixshield.simulator.engine.RunResult] ``held_t`` / ``held``).

A step lasts ``CostModel.step_time``; tokens count as computed at its end, and a request whose
known tokens are all computed emits one output token then (the first one sets TTFT).

Cost grows with events, not tokens: a run of steps in which no request completes, fills or opens a
block, and nothing can be admitted, is taken in one jump (closed-form sum of step times).

Two implementations of the step give bit-identical runs (records, occupancy, evictions, policy
state, creations, step counts); ``Engine(..., batched=False)`` selects the step-by-step one,
kept as the executable spec the batched one is tested against:

* step-by-step (``_step``): every running request goes through
  `KVCacheManager.allocate_slots` every step;
* batched (``_step_batched``, the default): the running batch lives in a struct-of-arrays
  matrix and the per-request work of a step is a few numba kernel calls
  (`prefixshield.simulator.batch`); ``allocate_slots`` is called only for the requests
  whose step opens or fills a block, and Python otherwise touches only the requests that are
  admitted, preempted or finish. Most decode steps of a request (14 of every 16 with 16-token
  blocks) cost no Python at all;
* fused (the default where it applies: any of the four policies, the linear
  `CostModel`, no ``observe``): the batched step's whole event loop -- arrivals, steps,
  coalesced decode jumps, the pool and the policy's state -- runs in one numba kernel call
  per run
  (`prefixshield.simulator.fused`), with SimPy's event order replayed exactly;
  ``fused=False`` keeps the per-step batched path.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np
import pandas as pd
import simpy

from prefixshield.policies import hooks as policy_hooks
from prefixshield.policies.base import POLICIES, Policy
from prefixshield.scheduling import kernels as sk
from prefixshield.scheduling.config import capped_outputs, over_block_limit
from prefixshield.scheduling.registry import make_scheduler
from prefixshield.simulator import batch as bk
from prefixshield.simulator import fused as fz
from prefixshield.simulator import requests as rq
from prefixshield.simulator.arrivals import ArrivalSource, TraceArrivals
from prefixshield.simulator.blockpool import BlockPool
from prefixshield.simulator.config import EngineConfig
from prefixshield.simulator.costmodel import CostModel
from prefixshield.simulator.kvcache import KVCacheManager, Sequence, make_sequence
from prefixshield.simulator.records import build_records
from prefixshield.tenancy import DEFAULT_CONTRACTS, Contract
from prefixshield.traces.schema import Trace
from prefixshield.traces.tokens import prompt_token_ids

OUTPUT_SEED_SALT = 0x0DEC0DE
"""Mixed into the trace seed for the tokens of requests without an ``output_segment_id``."""


FUSED_WINDOW_HASHES = 1 << 22
"""Block hashes the fused loop holds at once (32 MiB of hashes, ~16 MiB of block tables with
16-token blocks): a longer trace is hashed a window of arrivals at a time (see
`Engine._run_fused`). Any window gives the same run, bit for bit; this one costs ~1 ms
of Python per window of ~10^5-10^6 requests and keeps the loop's per-block memory at tens of
MiB whatever the trace's length."""


def _index_of(column: pd.Series, names: list[str]) -> np.ndarray:
    """Position in ``names`` of every cell of ``column`` as a string (int64): what
    ``column.astype(str).map(index)`` gives, with one lookup per distinct cell."""
    codes, uniques = pd.factorize(column, use_na_sentinel=False)
    index = {name: i for i, name in enumerate(names)}
    return np.array([index[str(u)] for u in uniques], dtype=np.int64)[codes]


class _Chunks:
    """Token ids and block hashes of consecutive requests (arrival order), built for a chunk of
    them per kernel call (`batch.build_sequences`) and kept until a request outside the
    chunk is asked for: at most `Engine.CHUNK_REQUESTS` requests and
    `Engine.CHUNK_TOKENS` tokens unless one is longer."""

    def __init__(self, engine: "Engine") -> None:
        self.engine = engine
        self.lo = self.hi = 0

    def get(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Request ``i``'s token ids (prompt then output) and full-block hashes (views)."""
        if not self.lo <= i < self.hi:
            self._build(i)
        j = i - self.lo
        t0, t1 = int(self.token_offsets[j]), int(self.token_offsets[j + 1])
        h0, h1 = int(self.hash_offsets[j]), int(self.hash_offsets[j + 1])
        return self.tokens[t0:t1], self.hashes_flat[h0:h1]

    def hashes(self, i: int) -> np.ndarray:
        """Request ``i``'s full-block hashes (a view)."""
        return self.get(i)[1]

    def _build(self, lo: int) -> None:
        eng = self.engine
        n = len(eng.arrival_s)
        hi = min(n, lo + eng.CHUNK_REQUESTS)
        totals = eng._total_tokens[lo:hi]
        fits = int(np.searchsorted(np.cumsum(totals), eng.CHUNK_TOKENS, side="right"))
        hi = lo + max(1, fits)
        B = eng.config.block_size
        num_tokens = int(eng._total_tokens[lo:hi].sum())
        num_hashes = int((eng._total_tokens[lo:hi] // B).sum())
        self.tokens = np.empty(num_tokens, dtype=np.int64)
        self.hashes_flat = np.empty(num_hashes, dtype=np.uint64)
        self.token_offsets = np.empty(hi - lo + 1, dtype=np.int64)
        self.hash_offsets = np.empty(hi - lo + 1, dtype=np.int64)
        tr = eng.trace
        rows = (eng._seg_ids_flat, eng._seg_lens_flat, eng._seg_offsets, eng.output_segment_id,
                eng.output_tokens, eng.group_id)
        bk.build_sequences(np.int64(tr.seed), np.int64(tr.vocab_size),
                           np.int64(tr.seed ^ OUTPUT_SEED_SALT), np.int64(eng.config.hash_seed),
                           rows, B, lo, hi,
                           (self.tokens, self.token_offsets, self.hashes_flat, self.hash_offsets))
        self.lo, self.hi = lo, hi


_NO_TOKENS = np.empty(0, dtype=np.int64)


@dataclass
class FusedRun:
    """One engine's state in a fused run (`Engine.fused_begin`): what `fused.run_loop` is
    called with besides the per-request arrays and the window.

    Attributes:
        ctl, fctl: the loop's control arrays (`prefixshield.simulator.fused`'s slots).
        pol: the policy's arrays (``Engine._fused_policy_state``; the last, its debt log).
        queue: ``(waiting, sch)``: the FCFS ring and the scheduler's compiled state.
        scratch: the per-block scratch (``hits`` .. ``order``).
        materialized, held_since: per request (shared by a fleet's replicas).
        series: ``(occ_t, occ, cre_t, [cre_g, cre_c, cre_b], held_t, held_rows)``, replaced
            when they grow (`Engine.fused_grow`).
    """

    ctl: np.ndarray
    fctl: np.ndarray
    pol: tuple
    queue: tuple
    scratch: tuple
    materialized: np.ndarray
    held_since: np.ndarray
    series: tuple


class EngineError(RuntimeError):
    """The trace cannot run on this engine (e.g. a request larger than the whole pool)."""


def check_fits(config: EngineConfig, prompt_tokens: np.ndarray, output_tokens: np.ndarray,
               request_ids: np.ndarray, row_base: int = 0) -> EngineError | None:
    """The error for the first request whose prompt and output (tokens) exceed the pool's
    usable blocks, None if all fit; ``request_ids`` of the same rows, the first being trace
    row ``row_base``."""
    usable_tokens = (config.num_blocks - 1) * config.block_size
    too_big = np.flatnonzero(prompt_tokens + output_tokens > usable_tokens)
    if not too_big.size:
        return None
    i = int(too_big[0])
    return EngineError(
        f"request {int(request_ids[i])} (row {row_base + i}) needs "
        f"{int(prompt_tokens[i] + output_tokens[i])} tokens of KV cache but the "
        f"pool holds {usable_tokens} ({config.num_blocks - 1} usable blocks x "
        f"{config.block_size} tokens)")

def check_block_limits(limits, group_id: np.ndarray, total_tokens: np.ndarray,
                       block_size: int, request_ids: np.ndarray, groups: list[str],
                       row_base: int = 0) -> EngineError | None:
    """The error for the first request its group's ``max_blocks`` limit could hold back for
    ever (`over_block_limit`: prompt and output, ``total_tokens``, need more blocks), None if
    none; ``request_ids`` of the same rows, the first being trace row ``row_base``."""
    over = over_block_limit(limits, group_id, total_tokens, block_size)
    if over is None:
        return None
    i, need, cap = over
    return EngineError(
        f"request {int(request_ids[i])} (row {row_base + i}) of group "
        f"{groups[group_id[i]]!r} needs up to {need} blocks, more than the "
        f"group's max_blocks limit {cap}: it could be held back for ever")


def bind_capacity(scheduler, config: EngineConfig, cost: CostModel) -> None:
    """Tell ``scheduler`` the engine's capacity (see ``Scheduler.bind_capacity``) if it wants
    it: the usable blocks and the prompt tokens per simulated second of a full-budget prefill
    step. Only then is ``cost`` asked (a recorded cost model prices its calls in order)."""
    if not scheduler.wants_capacity:
        return
    m = config.max_num_batched_tokens
    scheduler.bind_capacity(config.num_blocks - 1, m / cost.step_time(m, 0, m, 0))


def init_request_arrays(target, n: int) -> None:
    """Set ``target``'s per-request result arrays for ``n`` requests, before any runs: every
    field of [`RESULT_FIELDS`][prefixshield.simulator.requests.RESULT_FIELDS] (``first_token_s`` ..
    ``block_s``) at its declared initial value (`allocate`)."""
    
    rq.allocate(target, n)


@dataclass
class RunResult:
    """Everything one simulated run produced.

    Attributes:
        records: one row per request (see `Engine.records`).
        groups: group names by id.
        occupancy_t: seconds at which occupancy changed (float64).
        occupancy: blocks owned per group at those times (``[len(occupancy_t), num_groups]``).
        evictions: cached blocks reclaimed, ``[requesting group, owner group]``.
        held_t: seconds at which the blocks held by running requests changed (float64).
        held: block-table entries of each group's running requests at those times
            (``[len(held_t), num_groups]``): the KV the group holds, cached or not.
        num_steps: engine steps simulated (coalesced decode runs count each step).
        num_events: scheduler iterations actually executed (the simulator's work).
        policy_stats: the policy's own counters at the end.
        creations: every materialization: ``t_s``, ``group``, ``contract`` (ids) and
            ``blocks`` arrays (see `prefixshield.simulator.creation`).
        contracts: contract names by id; ``contract_rho`` / ``contract_beta`` their refill
            (blocks/s) and burst (blocks).
        trace_meta: the trace's ``meta`` (workload, parameters, windows).
        fleet: a fleet run's replicas, routing and mode
            (`prefixshield.fleet.run.FleetRun`); None for one engine.
    """

    records: pd.DataFrame
    groups: list[str]
    occupancy_t: np.ndarray
    occupancy: np.ndarray
    evictions: np.ndarray
    num_steps: int
    num_events: int
    policy_stats: dict = field(default_factory=dict)
    creations: dict = field(default_factory=dict)
    contracts: list[str] = field(default_factory=list)
    contract_rho: np.ndarray = field(default_factory=lambda: np.empty(0))
    contract_beta: np.ndarray = field(default_factory=lambda: np.empty(0))
    trace_meta: dict = field(default_factory=dict)
    held_t: np.ndarray = field(default_factory=lambda: np.zeros(1))
    held: np.ndarray = field(default_factory=lambda: np.zeros((1, 0), dtype=np.int64))
    fleet: object | None = None


class Engine:
    """One simulated engine replaying ``trace`` under ``policy``.

    Args:
        trace: the requests (validated).
        policy: a fresh policy sized ``config.num_blocks``.
        cost: the step-time model.
        config: scheduler and cache settings.
        contracts: contract name -> entitlement; every contract the trace names must be here.
        coalesce_decode: jump over quiet decode steps (same results; False steps one by one,
            which the tests use to check the jump).
        batched: run the batched step (struct-of-arrays running batch, numba kernels); False
            runs the step-by-step path, the oracle it is tested bit-identical to.
        fused: with ``batched``, run the whole event loop in one numba kernel
            (`prefixshield.simulator.fused`) when the run allows it (see
            `fused_applies`); False always takes the per-step batched path. Same results.
        arrivals: which rows arrive and when on the SimPy paths
            ([`ArrivalSource`][prefixshield.simulator.arrivals.ArrivalSource]); None: every row of
            ``trace`` (`TraceArrivals`). The fused loop
            reads the trace's arrivals itself (it needs every arrival up front).
        rows_of: an engine over the same ``trace``, ``cost``, ``config`` and ``contracts``
            whose per-request arrays (`prefixshield.simulator.requests`) and trace inputs
            this one shares instead of building its own, each row being written only by the
            engine that serves it (fleet replicas, `prefixshield.fleet.replica`); its
            ``coalesce_decode``, ``batched`` and ``fused`` are taken too. None: build them.

    While the batched step runs, the token counters (``num_computed_tokens``,
    ``num_output_done``) of the `Sequence` objects in `running` are not kept up to
    date: the matrix ``_state`` holds them, and they are copied into a sequence only when it is
    handed to the cache manager (allocation, preemption, completion). The block tables, and
    everything about waiting sequences, are always in the sequences.

    The fused loop builds no `Sequence` at all: ``_state``, flat block tables and flat
    block hashes are the whole request state, `running` and `waiting` stay empty,
    and after the run ``pool.creations`` is a `ColumnCreationLog`
    and ``env`` a fresh environment at the run's end time.
    """

    def __init__(self, trace: Trace, policy: Policy, cost: CostModel, config: EngineConfig,
                 contracts: Mapping[str, Contract] = DEFAULT_CONTRACTS,
                 coalesce_decode: bool = True, batched: bool = True, fused: bool = True,
                 arrivals: ArrivalSource | None = None,
                 rows_of: "Engine | None" = None) -> None:
        if rows_of is not None:
            self._share_rows(rows_of, trace, cost, config, arrivals)
            self._new_run_state(policy)
            return
        self.trace = trace
        self.coalesce_decode = coalesce_decode
        self.batched = batched
        self.fused = fused
        self.config = config
        self.cost = cost
        df = trace.requests
        # Declared tenants included: a silent (configured, request-less) group still counts.
        self.groups: list[str] = trace.group_names()
        self.contracts: list[str] = trace.contract_names()
        self.group_id = _index_of(df["group"], self.groups)
        self.contract_id = _index_of(df["contract"], self.contracts)
        self.arrival_s = df["arrival_s"].to_numpy(np.float64)
        self.prefix_id = df["prefix_id"].to_numpy(np.int64)
        self.output_tokens = df["output_tokens"].to_numpy(np.int64)
        self.scheduler = self._new_scheduler(config, cost)
        # a gateway's max_tokens: a request decodes at most its group's cap
        self.output_tokens = capped_outputs(self.scheduler.limits, self.group_id,
                                            self.output_tokens)
        # Schedulers other than vLLM's default FCFS without limits order, preempt and admit
        # through self.scheduler (the step-by-step and per-step batched paths) or its compiled
        # form (the fused loop); vLLM's default takes the paths' own FIFO.
        self.scheduled_by_policy = not config.scheduler.is_default
        # Row access through pandas costs tens of microseconds; the arrival path reads these.
        self._segment_ids = df["segment_ids"].tolist()
        self._segment_lengths = df["segment_lengths"].tolist()
        self.output_segment_id = df["output_segment_id"].to_numpy(np.int64)
        n = len(df)
        # The segments flat (request i's at _seg_offsets[i]:_seg_offsets[i+1]), for the
        # batched path's token kernel (built once per trace, see Trace.segments); the prompt
        # lengths fall out of them.
        segments = trace.segments()
        self._seg_offsets = segments.offsets
        self._seg_lens_flat = segments.lengths
        self._seg_ids_flat = segments.ids
        summed = np.zeros(self._seg_lens_flat.shape[0] + 1, dtype=np.int64)
        np.cumsum(self._seg_lens_flat, out=summed[1:])
        self.prompt_tokens = summed[self._seg_offsets[1:]] - summed[self._seg_offsets[:-1]]
        too_big = check_fits(config, self.prompt_tokens, self.output_tokens,
                             df["request_id"].to_numpy(np.int64))
        if too_big is not None:
            raise too_big
        held_back = check_block_limits(self.scheduler.limits, self.group_id,
                                       self.prompt_tokens + self.output_tokens,
                                       config.block_size, df["request_id"].to_numpy(np.int64),
                                       self.groups)
        if held_back is not None:
            raise held_back
        unknown = [c for c in self.contracts if c not in contracts]
        if unknown:
            raise EngineError(f"trace names contract {unknown[0]!r}, which is not configured; "
                              f"known: {', '.join(sorted(contracts))}")
        self._contract_table = [contracts[c] for c in self.contracts]
        # Per-request results, by row: every row is written by the one engine that serves it
        # (fleet replicas over one trace share these, see prefixshield.fleet.replica).
        init_request_arrays(self, n)
        # Batched step: per-request counters by request id (prompt, output length known up
        # front), the running order as request ids, and per-position scratch of one step.
        self._state = rq.state_matrix(self.prompt_tokens, self.output_tokens)
        if batched:
            self._total_tokens = self.prompt_tokens + self.output_tokens
        # what an engine sharing these rows takes (see rows_of); the rest is the run's
        self._row_names = frozenset(vars(self))
        self.arrivals = TraceArrivals() if arrivals is None else arrivals
        self._new_run_state(policy)

    def _new_scheduler(self, config: EngineConfig, cost: CostModel):
        """This engine's own scheduler over its groups and arrivals, told the capacity it
        wants (`bind_capacity`); a bad scheduler configuration is an EngineError."""
        try:
            scheduler = make_scheduler(config.scheduler, self.groups, self.arrival_s,
                                       self.group_id)
        except ValueError as e:
            raise EngineError(f"scheduler {config.scheduler.name}: {e}") from None
        bind_capacity(scheduler, config, cost)
        return scheduler

    def _share_rows(self, template: "Engine", trace: Trace, cost: CostModel,
                    config: EngineConfig, arrivals: ArrivalSource | None) -> None:
        """`__init__` with ``rows_of=template``: its per-request arrays and what else
        it built before its run state, a scheduler of this engine's own."""
        if trace is not template.trace or config is not template.config or (
                cost is not template.cost):
            raise ValueError("engines sharing rows run the same trace, cost and config")
        vars(self).update({k: getattr(template, k) for k in template._row_names
                           if k != "scheduler"})
        self._row_names = template._row_names
        self.scheduler = self._new_scheduler(config, cost)
        self.arrivals = TraceArrivals() if arrivals is None else arrivals

    @property
    def request_id(self) -> np.ndarray:
        """The trace's request ids by row (int64, read from the trace on each access)."""
        return self.trace.requests["request_id"].to_numpy(np.int64)

    @property
    def role(self) -> np.ndarray:
        """The trace's roles by row (object array of str, read on each access)."""
        return self.trace.requests["role"].astype(str).to_numpy()

    @property
    def measured(self) -> np.ndarray:
        """Whether each row is measured (bool, read from the trace on each access)."""
        return self.trace.requests["measured"].to_numpy(bool)

    def _new_run_state(self, policy: Policy) -> None:
        """What one engine's run owns and nothing else reads: the pool under ``policy`` (bound
        to the trace's tenants), the SimPy environment, the queues, the logs and counters, one
        step's scratch, the token chunks. Everything built before it in `__init__` is
        per request (read-only, or written only at the rows this engine serves)."""
        config, n = self.config, len(self.arrival_s)
        policy.bind_tenants(self.groups, self._contract_table)
        self.arrivals.bind(self)
        self.pool = BlockPool(config.num_blocks, policy, len(self.groups))
        self.kv = KVCacheManager(self.pool, config.block_size)
        self.env = simpy.Environment()
        # Requests wait as their row index and become Sequences (token ids, block hashes) when
        # they first reach the head (see _waiting_head): an overloaded engine's queue holds an
        # int per request, not its prompt.
        self.waiting: deque[Sequence | int] = deque()
        self.running: list[Sequence] = []
        self._wakeup: simpy.Event | None = None
        self._occ_t: list[float] = [0.0]
        self._occ: list[np.ndarray] = [self.pool.occupancy.copy()]
        self._held_t: list[float] = [0.0]
        self._held: list[np.ndarray] = [self.kv.held.copy()]
        self.num_steps = 0
        self.num_events = 0
        # windows of hashes and tables the fused loop took (1: the whole trace at once)
        self.num_windows = 0
        cap = min(config.max_num_seqs, n) + 1
        self._run_ids = np.zeros(cap, dtype=np.int64)
        self._num_new = np.zeros(cap, dtype=np.int64)
        self._needs_pool = np.zeros((cap, 3), dtype=np.int64)
        self._finished = np.zeros(cap, dtype=np.int64)
        if self.batched:
            # Token ids and block hashes are built for a chunk of arrivals per kernel call
            # (batch.build_sequences) instead of a handful of calls per request.
            self._head_chunks = _Chunks(self)
            # the arrivals' lookups build their own chunks: heads lag arrivals by the queue
            self._arrival_chunks = _Chunks(self)

    # ------------------------------------------------------------------ processes
    def start(self) -> simpy.Process:
        """Create the run's SimPy processes, the arrival source's first (its
        [`process`][prefixshield.simulator.arrivals.ArrivalSource.process]), then the engine's;
        returns the engine's (it ends with the run). `run` calls it; a caller driving
        the environment itself (a fleet replica) calls it once before stepping."""
        self.env.process(self.arrivals.process())
        return self.env.process(self._engine())

    def arrive(self, i: int) -> None:
        """Request row ``i`` arrives now (called by the arrival source's process): it joins
        the waiting requests with the prefix cached at arrival recorded, and an engine idle
        for want of requests resumes."""
        self._arrive(i)
        self._wake()

    def _arrive(self, i: int) -> None:
        """Request ``i`` arrives now: it joins the waiting queue, with the prefix cached at
        arrival (what it would hit if admitted at once) recorded."""
        B = self.config.block_size
        if self.batched and not self.scheduled_by_policy:
            hashes = self._arrival_chunks.hashes(i)
            max_blocks = (int(self.prompt_tokens[i]) - 1) // B
            self.arrival_cached_tokens[i] = (
                self.pool.find_cached_prefix(hashes, max_blocks).shape[0] * B)
            self.waiting.append(i)
        else:
            # with the scheduler's queue a request is built on arrival (the scheduler orders
            # requests by what they are) and keeps its block hashes, not its token ids (16x
            # smaller with 16-token blocks): nothing reads them once hashed
            seq = (self._make_sequence_batched(i) if self.batched
                   else self._make_sequence(i))
            seq.token_ids = _NO_TOKENS
            hits, num_hit_tokens = self.kv.get_computed_blocks(seq)
            self.arrival_cached_tokens[i] = num_hit_tokens
            self.scheduler.arrive(seq)

    def _wake(self) -> None:
        """Resume the engine process if it waits for an arrival."""
        if self._wakeup is not None and not self._wakeup.triggered:
            self._wakeup.succeed()

    @property
    def _scheduler_queue(self) -> bool:
        """Whether the waiting requests are in the scheduler's queue (the step-by-step path,
        and any path under a scheduler other than plain FCFS) rather than `waiting`."""
        return self.scheduled_by_policy or not self.batched

    def _has_waiting(self) -> bool:
        """Whether any request waits."""
        return bool(self.scheduler) if self._scheduler_queue else bool(self.waiting)

    def _waiting_head(self) -> Sequence:
        """The head of the waiting queue, built into a `Sequence` on its first visit
        (batched path under FCFS) -- or the scheduler's next request (`_scheduler_queue`).

        Heads are built in arrival order (FCFS; a preempted request returns to the head already
        built), so the batched path's chunks of token ids are built in the same order as if every
        request were built on arrival: the same tokens, the same hashes, the same results."""
        if self._scheduler_queue:
            return self.scheduler.peek()
        head = self.waiting[0]
        if isinstance(head, int):
            head = self._make_sequence_batched(head)
            self.waiting[0] = head
        return head

    def _make_sequence(self, i: int) -> Sequence:
        tr = self.trace
        prompt = prompt_token_ids(tr.seed, self._segment_ids[i], self._segment_lengths[i],
                                  tr.vocab_size)
        n_out = int(self.output_tokens[i])
        seg = int(self.output_segment_id[i])
        if seg >= 0:
            out = prompt_token_ids(tr.seed, [seg], [n_out], tr.vocab_size)
        else:
            out = prompt_token_ids(tr.seed ^ OUTPUT_SEED_SALT, [i], [n_out], tr.vocab_size)
        tokens = np.concatenate([prompt, out])
        return make_sequence(i, int(self.group_id[i]), int(self.contract_id[i]),
                             int(self.prefix_id[i]), tokens, prompt.shape[0],
                             self.config.block_size, self.config.hash_seed)

    CHUNK_REQUESTS = 256
    """Most requests whose tokens `_make_sequence_batched` builds in one kernel call."""
    CHUNK_TOKENS = 1 << 20
    """Token budget of one such chunk (8 MiB of ids); a longer request gets a chunk alone."""

    def _make_sequence_batched(self, i: int) -> Sequence:
        """`_make_sequence` from chunks built ahead (same tokens, same hashes)."""
        tokens, hashes = self._head_chunks.get(i)
        max_blocks = -(-tokens.shape[0] // self.config.block_size)
        return Sequence(i, int(self.group_id[i]), int(self.contract_id[i]),
                        int(self.prefix_id[i]), tokens, int(self.prompt_tokens[i]), hashes,
                        blocks=np.empty(max_blocks + 1, dtype=np.int32))

    def _engine(self):
        env = self.env
        n = len(self.arrival_s)
        while True:
            if not self.running and not self._has_waiting():
                if not self.arrivals.left():
                    return
                self._wakeup = env.event()
                yield self._wakeup
                self._wakeup = None
                continue
            if self.batched:
                quiet = yield from self._step_batched()
                if quiet and self.coalesce_decode:
                    yield from self._coalesced_decode_batched()
            else:
                quiet = yield from self._step()
                if quiet and self.coalesce_decode:
                    yield from self._coalesced_decode()

    # ------------------------------------------------------------------ one step
    def _preempt_last(self, now: float) -> Sequence:
        """The batched path's preemption: vLLM's FCFS rule, the newest running request."""
        victim = self.running.pop()
        self.kv.free(victim, now)
        self.num_preemptions[victim.request_id] += 1
        self.waiting.appendleft(victim)
        return victim

    def _preempt(self, now: float) -> tuple[Sequence, int]:
        """The step-by-step path's preemption: the scheduler's victim leaves the running list
        (freed, to wait again). Returns it and the position it had."""
        j = self.scheduler.victim(self.running)
        victim = self.running.pop(j)
        self.kv.free(victim, now)
        self.num_preemptions[victim.request_id] += 1
        self.scheduler.requeue(victim)
        return victim, j

    def _eligible(self):
        """The per-tenant admission test of the waiting requests (None without limits): the
        group runs fewer than ``max_running`` requests, and its running requests' block tables
        plus the request's own known tokens' blocks fit ``max_blocks``."""
        limits = self.scheduler.limits
        if not any(lim.max_running or lim.max_blocks for lim in limits):
            return None
        running_count = np.zeros(len(self.groups), dtype=np.int64)
        held = np.zeros(len(self.groups), dtype=np.int64)
        for s in self.running:
            running_count[s.group] += 1
            held[s.group] += s.num_blocks
        B = self.config.block_size

        def eligible(seq: Sequence) -> bool:
            lim = limits[seq.group]
            if lim.max_running is not None and running_count[seq.group] >= lim.max_running:
                return False
            return lim.max_blocks is None or (
                held[seq.group] + -(-seq.num_tokens // B) <= lim.max_blocks)

        def admitted(seq: Sequence) -> None:
            running_count[seq.group] += 1
            held[seq.group] += seq.num_blocks

        eligible.admitted = admitted
        return eligible

    def _step(self):
        """One scheduler iteration and its timed step. Returns True if the next steps are quiet."""
        env, kv, cfg = self.env, self.kv, self.config
        now = env.now
        self.num_events += 1
        sched = self.scheduler
        budget = cfg.max_num_batched_tokens
        scheduled: list[tuple[Sequence, int]] = []
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            seq_preempted = False
            while not kv.allocate_slots(seq, num_new, now):
                preempted = True
                victim, j = self._preempt(now)
                if j < i:
                    # scheduled earlier in this step: it leaves the step and its tokens go
                    # back to the budget (vLLM's priority path; FCFS never gets here)
                    k = next(x for x, (s, _) in enumerate(scheduled) if s is victim)
                    budget += scheduled.pop(k)[1]
                    i -= 1
                if victim is seq:
                    seq_preempted = True
                    break
            if seq_preempted:
                break
            scheduled.append((seq, num_new))
            budget -= num_new
            i += 1
        admitted = 0
        first_admissions = 0
        head_blocked = False
        held_back = False
        if not preempted:
            eligible = self._eligible()
            while sched and budget > 0 and len(self.running) < cfg.max_num_seqs:
                seq = sched.peek(eligible)
                if seq is None:
                    held_back = True  # every waiting request is held back by its group's limit
                    break
                hits, num_hit_tokens = kv.get_computed_blocks(seq)
                num_new = min(seq.num_tokens - num_hit_tokens, budget)
                reserve = seq.num_tokens if cfg.reserves_full_prompt else 0
                if not kv.allocate_slots(seq, num_new, now, hits, reserve):
                    head_blocked = True
                    break
                sched.pop(seq)
                self.running.append(seq)
                if eligible is not None:
                    eligible.admitted(seq)
                first = self.cached_tokens[seq.request_id] < 0
                if first:
                    self.cached_tokens[seq.request_id] = num_hit_tokens
                    self.admitted_s[seq.request_id] = now
                    first_admissions += 1
                sched.on_admit(seq, first, now)
                scheduled.append((seq, num_new))
                budget -= num_new
                admitted += 1
        self._record_held(now)

        if not scheduled:
            if preempted:
                # The last running request preempted itself: nothing ran, and admissions were
                # skipped in this step, as vLLM skips them; the next iteration may admit again.
                return False
            # Nothing runs and the waiting head does not fit: only an arrival can change that
            # (vLLM would poll with empty steps; no state changes in between).
            yield from self._idle_until_arrival()
            return False
        prefill_tokens = decode_seqs = context = 0
        for seq, k in scheduled:
            if k == 1 and seq.num_output_done > 0 and seq.num_computed_tokens == seq.num_tokens - 1:
                decode_seqs += 1
            else:
                prefill_tokens += k
            context += seq.num_computed_tokens + k
        dt = self.cost.step_time(prefill_tokens, decode_seqs, context, first_admissions)
        yield env.timeout(dt)
        self.num_steps += 1
        now = env.now
        if sched.counts_block_seconds:  # the blocks held through the step, before it frees
            sched.on_hold(kv.held, dt)
        finished = []
        for seq, k in scheduled:
            seq.num_computed_tokens += k
            if seq.num_computed_tokens == seq.num_tokens:
                self._emit_token(seq, now, finished)
        for seq in finished:
            self.running.remove(seq)
            self.kv.free(seq, now, finished=True)
            self.block_s[seq.request_id] = seq.block_s
        self._record_occupancy(now)
        if cfg.check_invariants:
            self.pool.check_invariants()
        if preempted or admitted or finished:
            return False
        # Quiet decode steps change no block table and free nothing, so a request held back by
        # a limit stays held, and one that did not fit still does not -- unless the scheduler's
        # order moves with decoding (VTC's counters) and may try another one next step.
        waiting_stuck = ((not sched) or (head_blocked and sched.order_fixed) or held_back
                         or len(self.running) >= cfg.max_num_seqs)
        return waiting_stuck and bool(self.running) and all(
            s.num_computed_tokens == s.num_tokens - 1 and s.num_output_done > 0 for s in self.running)

    def _idle_until_arrival(self):
        if not self.arrivals.left():
            seq = self._waiting_head()
            raise self._never_admitted(seq.request_id, seq.num_tokens)
        self._wakeup = self.env.event()
        yield self._wakeup
        self._wakeup = None

    def _never_admitted(self, row: int, num_tokens: int) -> EngineError:
        """The error of a waiting head (trace row ``row``, ``num_tokens`` tokens) that cannot
        fit with nothing running when no request is left to arrive."""
        return self.never_admitted_error(int(self.trace.requests['request_id'].iloc[row]),
                                         int(self.group_id[row]), num_tokens)

    def never_admitted_error(self, request_id: int, group: int,
                             num_tokens: int) -> EngineError:
        """`_never_admitted`'s error for request ``request_id`` of group id ``group``."""
        return EngineError(
            f"request {request_id} of group "
            f"{self.groups[group]!r} can never be admitted: it needs "
            f"{-(-num_tokens // self.config.block_size)} blocks and the policy lets its "
            f"group take at most {self.pool.num_free_blocks(group)} with nothing running")

    def _emit_token(self, seq: Sequence, now: float, finished: list) -> None:
        rid = seq.request_id
        seq.num_output_done += 1
        self.scheduler.on_output(seq.group, 1)
        if seq.num_output_done == 1:
            self.first_token_s[rid] = now
        if seq.num_output_done >= self.output_tokens[rid]:
            self.finish_s[rid] = now
            self.num_new_blocks[rid] = seq.num_materialized_blocks
            finished.append(seq)

    def _coalesced_decode(self):
        """Jump over decode steps in which nothing but token counts changes.

        A decode step of a sequence whose next token position p has ``p % B`` in ``[1, B-2]``
        neither opens a block (p % B == 0) nor fills one (p % B == B-1), so its
        ``allocate_slots`` is a no-op; if the step also completes no request and the next arrival
        comes later, the scheduler state after it equals the state before, up to token counts.
        """
        B = self.config.block_size
        running = self.running
        pos = np.fromiter((s.num_computed_tokens for s in running), np.int64, len(running))
        left = np.fromiter((self.output_tokens[s.request_id] - s.num_output_done for s in running),
                           np.int64, len(running))
        q = pos % B
        quiet = np.where((q >= 1) & (q <= B - 2), B - 1 - q, 0)
        k = int(min(quiet.min(), (left - 1).min()))
        if k <= 0:
            return
        cm = self.cost
        nseq = len(running)
        ctx0 = int(pos.sum()) + nseq
        per_step = cm.a_s + cm.c_s_per_decode_seq * nseq + cm.d_s_per_context_token * ctx0
        steps = np.arange(1, k + 1, dtype=np.float64)
        cum = steps * per_step + cm.d_s_per_context_token * nseq * steps * (steps - 1) / 2
        order_fixed = self.scheduler.order_fixed

        def plan(wait: float | None) -> tuple[int, float]:
            if wait is None:
                return k, float(cum[k - 1])
            # Stop at the first step boundary at or after the next arrival: it may be admitted.
            # A scheduler whose order moves with decoding (VTC: an arrival reads the counters
            # the steps before it charged) stops before the step the arrival falls in, which
            # then runs on its own, as it would without jumps.
            end = int(np.searchsorted(cum, wait, side="left"))
            j = min(k, end + 1 if order_fixed else end)
            return j, (float(cum[j - 1]) if j > 0 else 0.0)

        t0 = self.env.now
        k = yield from self.arrivals.jump(plan)
        if k <= 0:
            return
        self.num_steps += k
        if self.scheduler.counts_block_seconds:  # no block opens or fills in a jump
            self.scheduler.on_hold(self.kv.held, self.env.now - t0)
        for s in running:
            s.num_computed_tokens += k
            s.num_output_done += k
            self.scheduler.on_output(s.group, k)

    # ------------------------------------------------------------------ the batched step
    def _sync_sequence(self, seq: Sequence) -> None:
        """Copy the batch's token counters of running ``seq`` into it (before the cache manager
        reads it)."""
        row = self._state[seq.request_id]
        seq.num_computed_tokens = int(row[bk.COMPUTED])
        seq.num_output_done = int(row[bk.OUTPUT_DONE])

    def _store_blocks(self, seq: Sequence) -> None:
        """Copy ``seq``'s block-table counters into the batch (after the cache manager ran)."""
        row = self._state[seq.request_id]
        row[bk.NUM_BLOCKS] = seq.num_blocks
        row[bk.NUM_CACHED] = seq.num_cached_blocks

    def _preempt_last_batched(self, now: float) -> Sequence:
        victim = self.running[-1]
        self._sync_sequence(victim)  # it waits with its output count (vLLM keeps it)
        return self._preempt_last(now)

    def _step_batched(self):
        """`_step` over the struct-of-arrays batch; same decisions, same pool calls in the
        same order. Returns True if the next steps are quiet."""
        env, kv, cfg = self.env, self.kv, self.config
        now = env.now
        self.num_events += 1
        state, run_ids, num_new = self._state, self._run_ids, self._num_new
        running = self.running
        sched = self.scheduler
        by_policy = self.scheduled_by_policy
        if by_policy:
            m, budget, touched, preempted = self._running_phase_scheduled(now)
            prefill_tokens, decode_seqs, context = bk.step_load(state, run_ids, 0, m, num_new)
            num_flagged = 0
        else:
            m, num_flagged, budget, prefill_tokens, decode_seqs, context = bk.plan_running(
                state, run_ids, len(running), cfg.max_num_batched_tokens, cfg.block_size,
                num_new, self._needs_pool)
        # Requests that need no block and fill none: allocate_slots would be a no-op for them
        # (zero blocks asked, so it cannot fail), so only the flagged ones, in order, reach the
        # cache manager. A preemption pops from the end of the batch, so the scheduled requests
        # stay a prefix of it: the first min(m, len(running)).
        if not by_policy:
            touched = num_flagged > 0
            preempted = False
        for i, computed, output_done in self._needs_pool[:num_flagged].tolist():
            if i >= len(running):
                break  # preempted by an earlier request's allocation
            seq = running[i]
            seq.num_computed_tokens = computed
            seq.num_output_done = output_done
            k = int(num_new[i])
            seq_preempted = False
            while not kv.allocate_slots(seq, k, now):
                preempted = True
                if self._preempt_last_batched(now) is seq:
                    seq_preempted = True
                    break
            if seq_preempted:
                break
            # plan_running already gave the row the block counters this success leaves
        if len(running) < m:  # preemptions cut the scheduled prefix short
            m = len(running)
            budget = cfg.max_num_batched_tokens - int(num_new[:m].sum())
            prefill_tokens, decode_seqs, context = bk.step_load(state, run_ids, 0, m, num_new)
        admitted = 0
        first_admissions = 0
        head_blocked = False
        held_back = False
        if not preempted:
            eligible = self._eligible() if by_policy else None
            queue = sched if by_policy else self.waiting
            while queue and budget > 0 and len(running) < cfg.max_num_seqs:
                seq = sched.peek(eligible) if by_policy else self._waiting_head()
                if seq is None:
                    held_back = True  # every waiting request is held back by its group's limit
                    break
                hits, num_hit_tokens = kv.get_computed_blocks(seq)
                k = min(seq.num_tokens - num_hit_tokens, budget)
                reserve = seq.num_tokens if cfg.reserves_full_prompt else 0
                if not kv.allocate_slots(seq, k, now, hits, reserve):
                    head_blocked = True
                    break
                touched = True
                if by_policy:
                    sched.pop(seq)
                    if eligible is not None:
                        eligible.admitted(seq)
                else:
                    self.waiting.popleft()
                pos = len(running)
                running.append(seq)
                r = seq.request_id
                run_ids[pos] = r
                num_new[pos] = k
                row = state[r]
                row[bk.COMPUTED] = seq.num_computed_tokens
                row[bk.OUTPUT_DONE] = seq.num_output_done
                row[bk.PROMPT] = seq.num_prompt_tokens
                self._store_blocks(seq)
                first = self.cached_tokens[r] < 0
                if first:
                    self.cached_tokens[r] = num_hit_tokens
                    self.admitted_s[r] = now
                    first_admissions += 1
                if by_policy:
                    sched.on_admit(seq, first, now)
                budget -= k
                admitted += 1
        num_scheduled = m + admitted  # admissions append right after the scheduled prefix
        if touched or preempted:
            self._record_held(now)

        if not num_scheduled:
            if preempted:
                return False  # see _step: the last running request preempted itself
            yield from self._idle_until_arrival()
            return False
        if admitted:
            p, d, c = bk.step_load(state, run_ids, m, num_scheduled, num_new)
            prefill_tokens += p
            decode_seqs += d
            context += c
        dt = self.cost.step_time(int(prefill_tokens), int(decode_seqs), int(context),
                                 first_admissions)
        yield env.timeout(dt)
        self.num_steps += 1
        now = env.now
        if by_policy and sched.counts_block_seconds:  # as in _step
            sched.on_hold(kv.held, dt)
        counts_outputs = by_policy and sched.counts_outputs
        if counts_outputs:
            rows = run_ids[:num_scheduled].copy()
            out_before = state[rows, bk.OUTPUT_DONE]
        num_finished, decoding = bk.advance_scheduled(state, run_ids, len(running),
                                                      num_scheduled, num_new, now,
                                                      self.first_token_s, self.finish_s,
                                                      self._finished)
        if counts_outputs:
            self._charge_outputs(rows, state[rows, bk.OUTPUT_DONE] - out_before)
        if num_finished:
            touched = True
            positions = self._finished[:num_finished].tolist()
            for i in positions:  # freed in schedule order, as _step frees them
                seq = running[i]
                self._sync_sequence(seq)
                self.num_new_blocks[seq.request_id] = seq.num_materialized_blocks
                kv.free(seq, now, finished=True)
                self.block_s[seq.request_id] = seq.block_s
            for i in reversed(positions):
                del running[i]
            bk.remove_positions(run_ids, len(running) + num_finished, self._finished,
                                num_finished)
        self._record_occupancy(now)  # (it records only a change)
        if cfg.check_invariants:
            self.pool.check_invariants()
            self._check_batch()
        if preempted or admitted or num_finished:
            return False
        if by_policy:  # as in _step
            waiting_stuck = ((not sched) or (head_blocked and sched.order_fixed) or held_back
                             or len(running) >= cfg.max_num_seqs)
        else:
            waiting_stuck = (not self.waiting) or head_blocked or len(running) >= cfg.max_num_seqs
        return waiting_stuck and decoding

    def _charge_outputs(self, rows: np.ndarray, tokens: np.ndarray) -> None:
        """Tell the scheduler the output tokens ``tokens[i]`` of requests ``rows[i]`` emitted,
        summed per group (its counters add integers: the order does not matter)."""
        per_group = np.bincount(self.group_id[rows], weights=tokens,
                                minlength=len(self.groups)).astype(np.int64)
        for g in np.flatnonzero(per_group).tolist():
            self.scheduler.on_output(g, int(per_group[g]))

    def _preempt_batched(self, now: float) -> tuple[Sequence, int]:
        """`_preempt` on the batch: the scheduler's victim leaves the running list, the
        running order (``run_ids``) and the step's tokens (``num_new``) at its position."""
        j = self.scheduler.victim(self.running)
        victim = self.running[j]
        self._sync_sequence(victim)  # it waits with its output count (vLLM keeps it)
        n = len(self.running)
        del self.running[j]
        self._run_ids[j:n - 1] = self._run_ids[j + 1:n]
        self._num_new[j:n - 1] = self._num_new[j + 1:n]
        self.kv.free(victim, now)
        self.num_preemptions[victim.request_id] += 1
        self.scheduler.requeue(victim)
        return victim, j

    def _running_phase_scheduled(self, now: float) -> tuple[int, int, bool, bool]:
        """The running requests' part of a batched step under a scheduler whose preemption
        victim may be any running request (`_step`'s loop, over the batch).

        The step is planned as `batch.plan_running` plans it. When a preemption takes a
        request other than the newest, the plan for the requests after the current one is
        stale (a victim scheduled earlier gives its tokens back; one later no longer asks for
        any): their block counters are put back from their sequences and they are planned
        again with the budget left. When the current request is its own victim, the requests
        after it are not scheduled in this step (vLLM stops its loop there).

        Returns:
            ``(m, budget_left, touched, preempted)``: the scheduled requests are
            ``run_ids[:m]``.
        """
        cfg, kv = self.config, self.kv
        state, run_ids, num_new = self._state, self._run_ids, self._num_new
        running = self.running
        max_tokens = cfg.max_num_batched_tokens
        start, budget = 0, max_tokens
        touched = preempted = False
        while True:
            m, num_flagged, budget = bk.plan_running_from(
                state, run_ids, start, len(running), budget, cfg.block_size, num_new,
                self._needs_pool)
            touched = touched or num_flagged > 0
            # (request id, position, computed, output done): positions hold until a preemption
            # takes a request other than the newest, and then the rest is planned again
            plan = [(int(run_ids[p]), p, c, o) for p, c, o in
                    self._needs_pool[:num_flagged].tolist()]
            replan = None
            for idx, (_, pos, computed, output_done) in enumerate(plan):
                if pos >= len(running):
                    break  # preempted (as the newest) by an earlier request's allocation
                seq = running[pos]
                seq.num_computed_tokens = computed
                seq.num_output_done = output_done
                k = int(num_new[pos])
                moved = False
                while not kv.allocate_slots(seq, k, now):
                    preempted = True
                    victim, j = self._preempt_batched(now)
                    if victim is seq:
                        # vLLM's loop ends here: the requests after it are not scheduled
                        self._unplan(plan[idx + 1:])
                        return j, max_tokens - int(num_new[:j].sum()), touched, preempted
                    moved = moved or j != len(running)  # not the newest: the plan moved
                if moved:
                    self._unplan(plan[idx + 1:])
                    replan = running.index(seq) + 1
                    break
            if replan is None:
                m = min(m, len(running))
                return m, max_tokens - int(num_new[:m].sum()), touched, preempted
            start = replan
            budget = max_tokens - int(num_new[:start].sum())

    def _unplan(self, plan: list) -> None:
        """Give the requests of ``plan`` rows not yet handed to the cache manager their
        sequences' block counters back (the plan set them ahead of the call). Requests
        preempted since are skipped: their rows are rewritten when they are admitted again."""
        if not plan:
            return
        by_id = {s.request_id: s for s in self.running}
        for r, _, _, _ in plan:
            seq = by_id.get(r)
            if seq is not None:
                self._store_blocks(seq)

    def _check_batch(self) -> None:
        """Raise ``AssertionError`` unless the batch mirrors the running sequences: same order,
        and every row's block counters equal its sequence's (``check_invariants``)."""
        ids = [s.request_id for s in self.running]
        if self._run_ids[:len(ids)].tolist() != ids:
            raise AssertionError(f"batch order {self._run_ids[:len(ids)].tolist()} != running "
                                 f"{ids}")
        for seq in self.running:
            row = self._state[seq.request_id]
            got = (int(row[bk.NUM_BLOCKS]), int(row[bk.NUM_CACHED]), int(row[bk.PROMPT]))
            want = (seq.num_blocks, seq.num_cached_blocks, seq.num_prompt_tokens)
            if got != want:
                raise AssertionError(f"request {seq.request_id}: batch row (blocks, cached, "
                                     f"prompt) {got} != sequence {want}")

    def _coalesced_decode_batched(self):
        """`_coalesced_decode` over the batch (same jump length, same seconds)."""
        running = self.running
        nseq = len(running)
        k, pos_sum = bk.quiet_decode_steps(self._state, self._run_ids, nseq,
                                           self.config.block_size)
        if k <= 0:
            return
        cm = self.cost
        ctx0 = int(pos_sum) + nseq
        per_step = cm.a_s + cm.c_s_per_decode_seq * nseq + cm.d_s_per_context_token * ctx0
        slope = cm.d_s_per_context_token * nseq
        sched = self.scheduler
        # a scheduler whose order moves with decoding (VTC) ends a jump before the step the
        # next arrival falls in, as _coalesced_decode does
        before = self.scheduled_by_policy and not sched.order_fixed

        def plan(wait: float | None) -> tuple[int, float]:
            if wait is None:
                return bk.coalesced_time(per_step, slope, int(k), 0.0, False)
            j, seconds = bk.coalesced_time(per_step, slope, int(k), float(wait), True)
            if not before:
                return j, seconds
            j = j - 1 if seconds >= wait else j
            if j <= 0:
                return 0, 0.0
            return bk.coalesced_time(per_step, slope, j, 0.0, False)

        t0 = self.env.now
        k = yield from self.arrivals.jump(plan)
        self.num_steps += k
        if k > 0 and self.scheduled_by_policy and sched.counts_block_seconds:  # as in
            sched.on_hold(self.kv.held, self.env.now - t0)  # _coalesced_decode
        bk.advance_decode(self._state, self._run_ids, nseq, k)
        if self.scheduled_by_policy and sched.counts_outputs:
            rows = self._run_ids[:nseq]
            self._charge_outputs(rows, np.full(nseq, k, dtype=np.int64))

    def _record_occupancy(self, now: float) -> None:
        occ = self.pool.occupancy
        if bk.differs(occ, self._occ[-1]):
            self._occ_t.append(now)
            self._occ.append(occ.copy())
        self._record_held(now)

    def _record_held(self, now: float) -> None:
        """A row of the held-blocks series if it changed: called after a step's scheduling
        (allocations and preemptions happen at its start) and at its end (completions), so the
        series changes when the tables do and its integral is the requests' block-seconds."""
        held = self.kv.held
        if bk.differs(held, self._held[-1]):
            self._held_t.append(now)
            self._held.append(held.copy())

    # ------------------------------------------------------------------ results
    def run(self, observe: Callable[["Engine", float], None] | None = None,
            every_s: float = 1.0) -> RunResult:
        """Simulate the whole trace; returns the records and run-level state.

        Args:
            observe: called as ``observe(engine, t)`` at ``t = every_s, 2 * every_s, ...``
                simulated seconds while the run lasts, to sample state over time (the pool, the
                policy's classes); it must not change anything. The results do not depend on it.
            every_s: the sampling period in simulated seconds (> 0).
        """
        if observe is None and self.fused_applies():
            self._run_fused()
            return self._result()
        done = self.start()
        if observe is None:
            self.env.run(until=done)
        else:
            if not every_s > 0:
                raise ValueError(f"every_s must be > 0 s, got {every_s}")
            t = every_s
            while not done.triggered:
                self.env.run(until=t)
                if not done.triggered:
                    observe(self, t)
                t += every_s
        return self._result()

    def _result(self) -> RunResult:
        return RunResult(records=self.records(), groups=self.groups,
                         occupancy_t=np.asarray(self._occ_t), occupancy=np.vstack(self._occ),
                         evictions=self.pool.evictions.copy(), num_steps=self.num_steps,
                         num_events=self.num_events, policy_stats=self.pool.policy.stats(),
                         creations=self.pool.creations.arrays(), contracts=self.contracts,
                         contract_rho=np.array([c.rho_blocks_per_s for c in self._contract_table]),
                         contract_beta=np.array([c.beta_blocks for c in self._contract_table]),
                         trace_meta=self.trace.meta, held_t=np.asarray(self._held_t),
                         held=np.vstack(self._held))

    # ------------------------------------------------------------------ the fused loop
    FUSED_WINDOW_HASHES = FUSED_WINDOW_HASHES
    """Most block hashes the fused loop holds at once (`FUSED_WINDOW_HASHES`; an
    instance may set its own, the tests force small windows). Unlike the fixed up-front budget
    it replaces, it never decides the path: a longer trace runs in windows, not per step."""

    fused_feed = np.empty(0, dtype=np.int64)
    """The fused loop's ``feed`` (a fleet replica's rows, linked; a single engine reads none)."""

    fused_ledger = (np.empty(0, dtype=np.float64), *(np.empty(0, dtype=np.int64) for _ in range(4)),
                    np.zeros(3, dtype=np.int64), np.zeros(1, dtype=np.float64),
                    np.empty(0, dtype=np.float64), np.empty(0, dtype=np.int64))
    """The fused loop's fleet ledger (``series[9:]``, `fused.ledger_post`; a fleet replica's
    under a fleet-wide ledger, `prefixshield.fleet.fused`; a single engine posts nothing)."""

    FUSED_FIRST_ROWS: int | None = None
    """Rows of the fused loop's first occupancy and creation buffers; None sizes them from the
    trace (they grow when a step might not fit)."""

    FUSED_POLICIES = tuple(fz.KERNELS)
    """The kernel sets of the fused loop (`fused.KERNELS`): an exactly registered policy
    whose [`fused_arrays`][prefixshield.policies.base.Policy.fused_arrays] names one runs
    there (the registered ``lru``, ``prefixshield``, ``static_quota`` and ``s3fifo``); a
    policy of any class whose kernels are ``hooks`` runs its own compiled hooks
    (`prefixshield.policies.hooks`)."""

    def fused_applies(self) -> bool:
        """Whether `run` (without ``observe``) takes the fused loop: ``batched`` and
        ``fused`` are set, the policy is exactly a registered class and gives its
        [`fused_arrays`][prefixshield.policies.base.Policy.fused_arrays] (the kernels drive its
        state through its own event kernels; a subclass may change an event) or, of any class,
        gives compiled hooks (`prefixshield.policies.hooks`), the cost model
        is exactly `CostModel` (the kernel evaluates its formula), the scheduler is
        vLLM's default or exactly one of the registered classes of
        [`FUSED_KINDS`][prefixshield.scheduling.kernels.FUSED_KINDS] (their compiled form is in
        `prefixshield.scheduling.kernels`) and the arrivals are the trace's own
        ([`TraceArrivals`][prefixshield.simulator.arrivals.TraceArrivals]: the loop reads them up
        front). The trace's length does not matter: the hashes and block tables are held a
        window at a time (`FUSED_WINDOW_HASHES`)."""
        return self.fused and type(self.arrivals) is TraceArrivals and self.fused_capable()

    def fused_capable(self) -> bool:
        """Whether the fused loop's kernels can drive this engine's run, whatever its
        arrivals: `fused_applies` without its ``fused`` flag and arrival source (a fleet's
        compiled lockstep, `prefixshield.fleet.fused`, drives replicas whose rows the router
        sends)."""
        return (self.batched
                and (not self.scheduled_by_policy or sk.fused_kind(self.scheduler) is not None)
                and self._fused_policy() is not None and type(self.cost) is CostModel)

    def _fused_policy(self):
        """The policy's [`FusedArrays`][prefixshield.policies.base.FusedArrays] if the fused
        loop drives it (its exact registered class, naming one of `FUSED_POLICIES`; or any
        class naming ``"hooks"``, checked by
        [`check_fused`][prefixshield.policies.hooks.check_fused]), else None. (Its module is
        loaded already: looking it up imports nothing.)"""
        policy = self.pool.policy
        arrays = policy.fused_arrays()
        if arrays is not None and arrays.kernels == "hooks":
            # a policy's own compiled hooks are its events, whatever its class
            policy_hooks.check_fused(arrays.packed, arrays.hooks)
            return arrays
        cls = type(policy)
        name = getattr(cls, "name", None)
        if name not in POLICIES or POLICIES[name] is not cls:
            return None
        if arrays is None or arrays.kernels not in fz.KERNELS:
            return None
        return arrays

    def _run_fused(self) -> None:
        """The whole run in `fused.run_loop` calls: one, or one per step when
        ``check_invariants`` (the pool's and the batch's invariants are checked after every
        step, where `_step_batched` checks them), plus one per buffer enlargement and
        one per window.

        Windows: the block hashes and block tables of requests ``lo .. hi-1`` are held
        (`FUSED_WINDOW_HASHES` hashes, more only when the requests waiting or running
        need more); an arrival at ``hi`` returns `fused.NEED_WINDOW`, and the next window
        starts at the oldest request still waiting or running, carrying over what the two
        windows share. The loop reads a request's hashes and table only while it waits or runs,
        so every window gives the same run as one holding the whole trace."""
        n = len(self.arrival_s)
        hash_off, table_off = self.fused_offsets()
        run = self.fused_begin(n)
        ctl = run.ctl
        hashes, table = self._fused_window(ctl, hash_off, table_off, 0, 0, None, None)
        fz.start(ctl, run.fctl, self.arrival_s, self.group_id, *run.queue)
        # the requests due at t = 0 arrive to an empty pool
        self.arrival_cached_tokens[:int(ctl[fz.NEXT_ARRIVAL])] = 0
        while True:
            code = self._fused_call(ctl, run.fctl, self, run.materialized, run.held_since, table,
                                    table_off, hashes, hash_off, run.queue, run.scratch,
                                    run.pol, run.series)
            if code == fz.DONE:
                break
            if code == fz.CHECK:
                self._fused_check(ctl, self._state, table, table_off, hashes, hash_off)
            elif code == fz.NEED_WINDOW:
                hashes, table = self._fused_window(
                    ctl, hash_off, table_off, self._oldest_live(ctl, run.queue),
                    int(ctl[fz.NEXT_ARRIVAL]), hashes, table)
            elif code == fz.GROW:
                self.fused_grow(run)
            else:  # fz.NEVER_ADMITTED
                raise self.fused_error(ctl)
        self.arrivals.next_row = int(ctl[fz.NEXT_ARRIVAL])
        self.fused_end(run)

    def fused_offsets(self) -> tuple[np.ndarray, np.ndarray]:
        """Every request's offsets in the fused loop's flat hashes and block tables:
        ``(hash_off, table_off)``, request r's at ``[off[r]:off[r + 1]]`` (int64, n + 1 each):
        its full blocks of prompt and output, and room for every block of it plus one (a
        `Sequence`'s table)."""
        B = self.config.block_size
        total = self._total_tokens
        n = total.shape[0]
        hash_off = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(total // B, out=hash_off[1:])
        table_off = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(-(-total // B) + 1, out=table_off[1:])
        return hash_off, table_off

    def fused_begin(self, n: int, shared: "FusedRun | None" = None,
                    served: int | None = None) -> "FusedRun":
        """The state of a fused run over ``n`` requests, before `fused.start`: the loop's
        control arrays, the policy's and the scheduler's state, the scratch and the series'
        first buffers (`FusedRun`). ``shared``: another engine's run over the same rows (a
        fleet replica's), whose per-request arrays (``materialized``, ``held_since``) this one
        then uses. ``served``: about how many of the rows this engine serves (a replica's
        share), which sizes the first buffers; None: all ``n``."""
        pool = self.pool
        ctl, fctl, pol = self._fused_setup(n)
        # First guesses (a run records about one occupancy row per step that touches the pool
        # and a few creations per request); run_loop asks for more when a step might not fit.
        rows = self.FUSED_FIRST_ROWS
        served = n if served is None else served
        occ_t = np.empty(rows or 2 * served + 1024, dtype=np.float64)
        occ = np.empty((occ_t.shape[0], pool.num_groups), dtype=np.int64)
        occ_t[0] = self._occ_t[0]
        occ[0] = self._occ[0]
        ctl[fz.NUM_OCC] = 1
        cap = rows or 4 * served + self._run_ids.shape[0] + 1024
        held_t = np.empty(occ_t.shape[0], dtype=np.float64)
        held_rows = np.empty((held_t.shape[0], pool.num_groups), dtype=np.int64)
        held_t[0] = self._held_t[0]
        held_rows[0] = self._held[0]
        ctl[fz.NUM_HELD] = 1
        series = (occ_t, occ, np.empty(cap, dtype=np.float64),
                  [np.empty(cap, dtype=np.int64) for _ in range(3)], held_t, held_rows)
        if shared is None:
            materialized = np.zeros(n, dtype=np.int64)
            held_since = np.zeros(n, dtype=np.float64)
        else:
            materialized, held_since = shared.materialized, shared.held_since
        return FusedRun(ctl, fctl, pol, self._fused_queue(n), self._fused_scratch(),
                        materialized, held_since, series)

    def fused_grow(self, run: "FusedRun") -> None:
        """Enlarge what `fused.GROW` asked for: the series' buffers that might not hold the
        next step's rows, the debt log's room."""
        ctl = run.ctl
        occ_t, occ, cre_t, cre, held_t, held_rows = run.series
        more = max(occ_t.shape[0], 1)
        if ctl[fz.NUM_OCC] + 1 > occ_t.shape[0]:
            occ_t = np.concatenate([occ_t, np.empty(more, dtype=np.float64)])
            occ = np.concatenate([occ, np.empty((more, occ.shape[1]), dtype=np.int64)])
        if ctl[fz.NUM_HELD] + 2 > held_t.shape[0]:
            more_held = held_t.shape[0]
            held_t = np.concatenate([held_t, np.empty(more_held, dtype=np.float64)])
            held_rows = np.concatenate([held_rows, np.empty(
                (more_held, held_rows.shape[1]), dtype=np.int64)])
        more = max(cre_t.shape[0], self._run_ids.shape[0])
        if ctl[fz.NUM_CRE] + self._run_ids.shape[0] > cre_t.shape[0]:
            cre_t = np.concatenate([cre_t, np.empty(more, dtype=np.float64)])
            cre = [np.concatenate([c, np.empty(more, dtype=np.int64)]) for c in cre]
        log = run.pol[-1]
        if log is not None:
            log.reserve(max(log.t.shape[0], self._run_ids.shape[0]))
        run.series = (occ_t, occ, cre_t, cre, held_t, held_rows)

    def fused_error(self, ctl: np.ndarray) -> "EngineError":
        """The error of `fused.NEVER_ADMITTED`: the waiting head ``ctl[ERR_REQUEST]`` can never
        be admitted."""
        r = int(ctl[fz.ERR_REQUEST])
        return self._never_admitted(r, int(self.prompt_tokens[r]
                                           + self._state[r, bk.OUTPUT_DONE]))

    def fused_end(self, run: "FusedRun") -> None:
        """What the run's objects keep outside the loop's arrays, from a finished fused run:
        the counters, the scheduler's, the pool's last evictions, the series and the creation
        log as `_result` reads them."""
        ctl, fctl, pool = run.ctl, run.fctl, self.pool
        occ_t, occ, cre_t, cre, held_t, held_rows = run.series
        self.num_steps = int(ctl[fz.NUM_STEPS])
        self.num_events = int(ctl[fz.NUM_EVENTS])
        sk.write_back(self.scheduler, run.queue[1])
        pool.num_evicted_total += int(ctl[fz.NUM_EVICTED])
        k = int(ctl[fz.LAST_EVICTED_N])
        if k:
            pool.last_evicted = run.scratch[2][:k].copy()
        k = int(ctl[fz.NUM_OCC])
        # the series as _result reads them (np.asarray / np.vstack): one block of rows
        self._occ_t = occ_t[:k].copy()
        self._occ = [occ[:k]]
        k = int(ctl[fz.NUM_HELD])
        self._held_t = held_t[:k].copy()
        self._held = [held_rows[:k]]
        k = int(ctl[fz.NUM_CRE])
        pool.creations = fz.ColumnCreationLog(cre_t[:k], *(c[:k] for c in cre))
        self.env = simpy.Environment(initial_time=float(fctl[fz.NOW]))

    def _fused_check(self, ctl: np.ndarray, state: np.ndarray, table: np.ndarray,
                     table_off: np.ndarray, hashes: np.ndarray, hash_off: np.ndarray) -> None:
        """``check_invariants`` after a fused step (`fused.CHECK`): the pool's, and the
        running requests' tables against it; raises AssertionError."""
        pool = self.pool
        pool.check_invariants()
        bad = fz.check_tables(state, self._run_ids, int(ctl[fz.NUM_RUNNING]), table, table_off,
                              hashes, hash_off, pool.ref_cnt, pool.block_hash,
                              np.zeros(pool.num_blocks, dtype=np.int64), ctl[fz.HASH_BASE],
                              ctl[fz.TABLE_BASE])
        if bad != -1:
            raise AssertionError(
                "fused batch disagrees with the pool: " + (
                    "ref_cnt != running tables" if bad == -2
                    else f"request {bad}'s block table or counters"))

    def _fused_setup(self, n: int) -> tuple[np.ndarray, np.ndarray, tuple]:
        """``ctl`` and ``fctl`` of a fused run over ``n`` requests (configuration slots set),
        and the policy's arrays (`_fused_policy_state`)."""
        cfg, pool = self.config, self.pool
        ctl = np.zeros(fz.NUM_CTL, dtype=np.int64)
        ctl[fz.N] = n
        ctl[fz.BLOCK_SIZE] = cfg.block_size
        ctl[fz.MAX_SEQS] = cfg.max_num_seqs
        ctl[fz.MAX_TOKENS] = cfg.max_num_batched_tokens
        ctl[fz.RESERVE_FULL] = cfg.reserves_full_prompt
        ctl[fz.CURRENT_MODE] = pool.policy.vllm_compat == "current"
        ctl[fz.COALESCE] = self.coalesce_decode
        ctl[fz.STOP_AFTER_STEP] = cfg.check_invariants
        ctl[fz.POOL_BLOCKS] = pool.num_blocks
        ctl[fz.CLOSED] = 1
        ctl[fz.LAST_FED] = -1
        pol = self._fused_policy_state(ctl)
        fctl = np.zeros(fz.NUM_FCTL, dtype=np.float64)
        fctl[fz.LIMIT] = np.inf
        cm = self.cost
        fctl[fz.COST_A:fz.COST_E + 1] = (cm.a_s, cm.b_s_per_prefill_token, cm.c_s_per_decode_seq,
                                         cm.d_s_per_context_token, cm.e_s_per_new_request)
        return ctl, fctl, pol

    def _fused_queue(self, n: int) -> tuple[np.ndarray, tuple]:
        """The fused loop's waiting requests over ``n`` requests: ``(waiting, sch)``, the ring
        of vLLM's default scheduling (``n + 1`` ids) and the scheduler's compiled state
        (`prefixshield.scheduling.kernels.fused_state`; its kind says which of them is used)."""
        sch = sk.fused_state(self.scheduler, n, self._run_ids.shape[0], self.config.block_size,
                             (bk.PROMPT, bk.OUTPUT_DONE), not self.scheduled_by_policy)
        return np.empty(n + 1, dtype=np.int64), sch

    def _fused_scratch(self) -> tuple:
        """The loop's per-block scratch: ``hits, victims, evicted, was_free, freed, cached,
        order`` (one entry per pool block)."""
        nb = self.pool.num_blocks
        hits, victims, evicted, was_free, freed, order = (np.empty(nb, dtype=np.int32)
                                                          for _ in range(6))
        return hits, victims, evicted, was_free, freed, np.empty(nb, dtype=np.bool_), order

    def _fused_policy_state(self, ctl: np.ndarray) -> tuple:
        """The policy's arrays as `fused.run_loop` takes them, ``(lists, ps, quota_state,
        s3_state, hooks, log)`` (arrays a policy does not use are empty; ``hooks``: a hooks
        policy's addresses; ``log``: PrefixShield's debt log, else None); sets ``ctl``'s
        policy slots."""
        # the policy's state (`Policy.fused_arrays`): arrays it does not use are empty, of the
        # same dtypes as the real ones (one compiled loop serves every policy)
        lists = (np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int32),
                 np.zeros(0, dtype=np.int32), np.zeros(1, dtype=np.int64))
        ps = np.zeros(0, dtype=np.uint8)
        quota_state = (np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int64))
        s3_state = (np.zeros(0, dtype=np.int8), np.zeros(0, dtype=np.bool_),
                    np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.int64),
                    np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.uint64),
                    np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int64))
        arrays = self._fused_policy()
        ctl[fz.POLICY] = fz.KERNELS[arrays.kernels]
        ctl[fz.QUOTA] = arrays.quota
        ctl[fz.S3_GHOST_SLACK] = arrays.ghost_slack
        lists = arrays.lists or lists
        ps = ps if arrays.packed is None else arrays.packed
        quota_state = arrays.quota_state or quota_state
        s3_state = arrays.s3_state or s3_state
        hooks = arrays.hooks if arrays.kernels == "hooks" else np.zeros(0, dtype=np.int64)
        log = self._fused_log = arrays.debt_log
        if log is not None:
            ctl[fz.MAX_SAMPLES] = log.max_samples
            # room for the first step's samples (run_loop asks for more, as for the buffers)
            log.reserve(self._run_ids.shape[0])
        return lists, ps, quota_state, s3_state, hooks, log

    def _fused_call(self, ctl: np.ndarray, fctl: np.ndarray, rows, materialized: np.ndarray,
                    held_since: np.ndarray, table: np.ndarray, table_off: np.ndarray,
                    hashes: np.ndarray, hash_off: np.ndarray, queue: tuple,
                    scratch: tuple, pol: tuple, series: tuple) -> int:
        """One `fused.run_loop` call over `fused_args`' arguments (the same parameters);
        returns its code, after `fused_after`."""
        args = self.fused_args(ctl, fctl, rows, materialized, held_since, table, table_off,
                               hashes, hash_off, queue, scratch, pol, series)
        code = fz.run_loop(*args)
        self.fused_after(args)
        return code

    def fused_args(self, ctl: np.ndarray, fctl: np.ndarray, rows, materialized: np.ndarray,
                   held_since: np.ndarray, table: np.ndarray, table_off: np.ndarray,
                   hashes: np.ndarray, hash_off: np.ndarray, queue: tuple,
                   scratch: tuple, pol: tuple, series: tuple) -> tuple:
        """`fused.run_loop`'s eleven arguments. ``rows``: the object holding the
        per-request arrays by the engine's names (the engine, or a streamed run's window of
        rows, `prefixshield.simulator.stream`); ``queue``: `_fused_queue`; ``scratch``: the
        per-block scratch
        (``hits`` .. ``order``); ``pol``: `_fused_policy_state`; ``series``: ``(occ_t,
        occ, cre_t, [cre_g, cre_c, cre_b], held_t, held_rows)``. The debt log's counters are
        copied into a small array the loop updates: `fused_after` copies them back."""
        pool = self.pool
        lists, ps, quota_state, s3_state, hooks, log = pol
        occ_t, occ, cre_t, cre, held_t, held_rows = series
        if log is None:
            log_cols = (np.zeros(0, dtype=np.float64), np.zeros(0, dtype=np.int32),
                        np.zeros(0, dtype=np.float64), np.zeros((0, 0), dtype=np.int64))
            log_meta = np.zeros(3, dtype=np.int64)
        else:
            log_cols = (log.t, log.group, log.debt, log.classes)
            log_meta = np.array([log.size, log.stride, log.num_charges], dtype=np.int64)
        req = (rows.arrival_s, rows.group_id, rows.contract_id, rows.prefix_id, rows._state,
               materialized, table_off, hash_off)
        rec = (rows.first_token_s, rows.finish_s, rows.cached_tokens, rows.num_preemptions,
               rows.num_new_blocks, rows.admitted_s, rows.arrival_cached_tokens, rows.block_s,
               held_since)
        batch = (self._run_ids, self._num_new, self._finished, queue[0], self.fused_feed)
        pool_arrays = (pool.ref_cnt, pool.block_hash, pool.hash_next, pool.owner_group,
                       pool.occupancy, pool.evictions, pool._map_keys, pool._map_vals,
                       pool._map_size)
        pol_arrays = (*lists, ps, *log_cols, log_meta, *quota_state, *s3_state, hooks)
        return (ctl, fctl, req, (table, hashes), rec, batch, queue[1], tuple(scratch),
                pool_arrays, pol_arrays, (occ_t, occ, cre_t, *cre, self.kv.held, held_t,
                                          held_rows, *self.fused_ledger))

    def fused_after(self, args: tuple) -> None:
        """After `fused.run_loop` returned over `fused_args`' ``args``: write back what the
        policy's Python side keeps (the debt log's counters, S3-FIFO's ghost slack)."""
        log = self._fused_log
        if log is not None:
            log.size, log.stride, log.num_charges = (int(x) for x in args[9][9])
        self.pool.policy.fused_done(int(args[0][fz.S3_GHOST_SLACK]))

    def _oldest_live(self, ctl: np.ndarray, queue: tuple) -> int:
        """The oldest request (row) the fused loop still reads: waiting (in ``queue``,
        `_fused_queue`), running, or the next to arrive."""
        oldest = int(ctl[fz.NEXT_ARRIVAL])
        if ctl[fz.ROUTED]:  # a fleet replica: its next row, if one was delivered
            oldest = (int(ctl[fz.CURSOR]) if ctl[fz.NEXT_ARRIVAL] < ctl[fz.N]
                      else len(self.arrival_s))
        num_running, count = int(ctl[fz.NUM_RUNNING]), int(ctl[fz.WAIT_COUNT])
        if num_running:
            oldest = min(oldest, int(self._run_ids[:num_running].min()))
        waiting, sch = queue
        if count and sch[0][sk.KIND] != sk.KIND_NONE:
            oldest = min(oldest, int(sk.oldest_waiting(sch)))
        elif count:
            ring = (int(ctl[fz.WAIT_HEAD]) + np.arange(count)) % waiting.shape[0]
            oldest = min(oldest, int(waiting[ring].min()))
        return oldest

    def _fused_window(self, ctl: np.ndarray, hash_off: np.ndarray, table_off: np.ndarray,
                      lo: int, need: int, old_hashes: np.ndarray | None,
                      old_table: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """The fused loop's next window: hashes and block tables of requests ``lo .. hi-1``,
        ``hi`` as far as `FUSED_WINDOW_HASHES` hashes from ``lo`` allow, and at least
        half of that many past ``need`` (the next arrival; at least one request); sets
        ``ctl``'s window slots. What the previous window (``old_*``, from ``ctl``'s slots)
        holds of ``lo ..`` is carried over: the tables of running requests, and hashes already
        built."""
        n = len(hash_off) - 1
        room = self.FUSED_WINDOW_HASHES
        hi = int(np.searchsorted(hash_off, hash_off[lo] + room, side="right")) - 1
        # room for half a window of new arrivals whatever the live requests hold: with a long
        # backlog each slide would otherwise admit one arrival and copy the whole backlog
        ahead = int(np.searchsorted(hash_off, hash_off[need] + room // 2, side="right")) - 1
        hi = min(n, max(hi, ahead, need + 1))
        hbase, tbase = int(hash_off[lo]), int(table_off[lo])
        hashes = np.empty(int(hash_off[hi]) - hbase, dtype=np.uint64)
        table = np.zeros(int(table_off[hi]) - tbase, dtype=np.int32)
        built = lo
        if old_hashes is not None:
            built = int(ctl[fz.WINDOW_END])   # the old window holds lo .. built-1
            old_h, old_t = int(ctl[fz.HASH_BASE]), int(ctl[fz.TABLE_BASE])
            hashes[:hash_off[built] - hbase] = old_hashes[hbase - old_h:hash_off[built] - old_h]
            table[:table_off[built] - tbase] = old_table[tbase - old_t:table_off[built] - old_t]
        tr, cfg = self.trace, self.config
        rows = (self._seg_ids_flat, self._seg_lens_flat, self._seg_offsets,
                self.output_segment_id, self.output_tokens, self.group_id)
        fz.build_hashes(np.int64(tr.seed), np.int64(tr.vocab_size),
                        np.int64(tr.seed ^ OUTPUT_SEED_SALT), np.int64(cfg.hash_seed), rows,
                        np.int64(cfg.block_size), hash_off, hashes, np.int64(built),
                        np.int64(hi), np.int64(hbase))
        ctl[fz.HASH_BASE], ctl[fz.TABLE_BASE], ctl[fz.WINDOW_END] = hbase, tbase, hi
        self.num_windows += 1
        return hashes, table

    def records(self) -> pd.DataFrame:
        """Per-request records: arrival, identity, tokens, new blocks, TTFT, latency, preemptions
        (built by `prefixshield.simulator.records.build_records`; columns and dtypes
        [`RECORD_COLUMNS`][prefixshield.simulator.records.RECORD_COLUMNS])."""
        return build_records(self)
