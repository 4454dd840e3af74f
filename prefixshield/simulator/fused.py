"""The batched engine's whole event loop in one numba kernel (LRU, PrefixShield, StaticQuota,
S3-FIFO, or a policy's compiled hooks; linear cost model).

`Engine._step_batched` already does the per-request work of a step in kernels, but every
step still costs a SimPy event, a few kernel calls and Python for every request that opens or
fills a block, is admitted, preempted or finishes. `run_loop` runs the same loop --
arrivals, the scheduler iteration, the step's timeout, decode coalescing -- in numba, for as
long as nothing needs Python: one call per run, or one per step with ``check_invariants``.

What it models, decision for decision the same as the step-by-step oracle
(``Engine(..., batched=False)``, tested bit-identical in ``tests/simulator/test_fused_loop.py``):

* **The two SimPy processes and their event order.** The arrival process and the engine
  process each have at most one pending event; SimPy processes events in order of
  ``(time, priority, eid)`` where eid counts schedulings, so the kernel keeps a scheduling
  counter and compares ``(time, eid)`` of the two pending events (all of them have SimPy's
  NORMAL priority; the two ``Initialize`` events at t = 0 are replayed in order before the
  loop). Times are computed with SimPy's arithmetic: a timeout of ``delay`` at ``now`` fires
  at ``now + delay``; an arrival's delay is ``arrival_s - now``. A wake-up (``succeed``) is
  scheduled at the arrival's time, after the arrivals of that instant were appended.
* **The scheduler iteration** of `Engine._step` (running requests first with preemption of
  the scheduler's victim, then admissions in the scheduler's order with head-of-line blocking
  and per-tenant limits, the token budget, full-prompt reservation), over the struct-of-arrays
  batch of `batch` (whose kernels it calls) instead of `Sequence` objects. vLLM's default
  scheduling (FCFS without limits) is the loop's own ring of waiting ids; ``priority``, ``vtc``,
  ``kvtc`` and any limit go through the schedulers' compiled queues, victims and counters
  (`prefixshield.scheduling.kernels`), including VTC's rule of ending a decode jump before the
  step the next arrival falls in.
* **The cache manager and block pool** (``get_computed_blocks``, ``allocate_slots``, ``free``)
  through the pool's own kernels (``_find_hits``, ``_touch``, ``_claim``, ``_cache``,
  ``_release``), on the pool's arrays in place, calling the policy's events where
  [`BlockPool`][prefixshield.simulator.blockpool.BlockPool] calls them, through the policy's own
  kernels on its own arrays (``ctl[POLICY]`` says which): vLLM's free queue (the LRU
  policy's linked list, both compat modes; its ``on_hit`` and ``on_materialize`` are no-ops);
  PrefixShield's packed state (every event, its clock and its debt-log samples, as the
  policy's methods make them); StaticQuota's lists, owners and quota (its ``available``);
  S3-FIFO's queues, counters and ghost (a ring and an array hash table, no typed dict), and
  its ``_ghost_slack`` bookkeeping (``ctl[S3_GHOST_SLACK]``); any other policy through the
  six compiled hooks it hands the loop (`POLICY_HOOKS`, `prefixshield.policies.hooks`: each
  called by address, with the policy's packed state, where the pool calls its events). The
  policies' kernels report an illegal event (a block released twice, say) by a return value,
  which their Python methods turn into ``ValueError``; the loop does not read them: the pool
  hands a policy only what its own reference counts make legal (the oracle would raise
  first), and ``check_invariants`` checks the pool and the policy after every step.
* **The linear** [`CostModel`][prefixshield.simulator.costmodel.CostModel] evaluated in the same
  operation order as its ``step_time`` (a duck-typed cost object takes the per-step path).

Per-request block tables live in one flat int32 array (``table[table_off[r] - base:]``, room
for ``ceil(tokens / B) + 1`` blocks, as a ``Sequence`` has) and block hashes in one flat uint64
array (``hashes[hash_off[r] - base:hash_off[r + 1] - base]``, every full block of prompt and
output), built by `build_hashes` (the same hashes as
`chain_block_hashes` of the same token ids) for a
*window* of requests ``ctl[HASH_BASE]``-relative: the caller holds the requests from the
oldest one still waiting or running to ``ctl[WINDOW_END]``, and an arrival past it returns
`NEED_WINDOW` (a short trace is one window, base 0). A request's hashes and table are
read only between its arrival and its end, so the window never changes a decision.

The same kernel runs each replica of a lockstep fleet (`prefixshield.fleet.fused`): under
``ctl[ROUTED]`` its arrivals are the rows the router delivers (linked through ``feed``), it
returns `PAUSED` where it must wait for the router or for the fleet's other replicas, and
under ``ctl[LEDGER]`` PrefixShield's charges are posted to the fleet ledger's heap
(`ledger_post`). A single engine never sets them and never pauses.

The kernel is resumable: every piece of loop state is in ``ctl`` (int64) / ``fctl`` (float64)
and the arrays. It returns `DONE`, `CHECK` (after a step's occupancy record, where
the oracle checks invariants), `GROW` (an output buffer is full: enlarge and call
again), `NEED_WINDOW` (slide the window of hashes and tables),
`NEVER_ADMITTED` (the waiting head cannot fit with nothing running and no request is
left to arrive: the oracle's ``EngineError``) or, for a fleet's replica, `PAUSED`.

Speed notes. `run_loop`, `_allocate` and `_free_request` are compiled without
numba's reference-counted runtime (``_nrt=False``; they allocate nothing, and copy slices with
loops): with it, every call of ``_allocate`` increfs and decrefs each of its ~35 array
arguments and slices atomically, which was half of the loop's time. The policies' event kernels
that the loop calls are separate functions compiled the same way (PrefixShield's through the
``_ps_*`` wrappers below, S3-FIFO's in `s3fifo_kernels`),
called, not inlined: with a policy's kernels inlined into ``_allocate`` the loop took minutes
to compile. Requests whose step needs no block and fills none skip ``_allocate`` altogether
(most decode steps).

Units: tokens; blocks where a name says so; seconds (float64) for times.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from prefixshield.policies import hooks as hk
from prefixshield.policies import lru
from prefixshield.policies.kernels import linkedlist as ll
from prefixshield.policies.kernels import prefixshield_kernels as psk
from prefixshield.policies.kernels import s3fifo_kernels as s3k
from prefixshield.policies import static_quota as sq
from prefixshield.scheduling import kernels as sk
from prefixshield.simulator import batch as bk
from prefixshield.simulator.blockpool import _cache, _claim, _find_hits, _release, _touch
from prefixshield.simulator.creation import CreationLog
from prefixshield.simulator.hashing import GROUP_SHIFT, LOW_MASK
from prefixshield.traces.tokens import splitmix64

class ColumnCreationLog(CreationLog):
    """A `CreationLog` whose first rows came as columns (written by `run_loop`);
    rows appended later follow them."""

    def __init__(self, t_s: np.ndarray, group: np.ndarray, contract: np.ndarray,
                 blocks: np.ndarray) -> None:
        super().__init__()
        self._columns = {"t_s": np.asarray(t_s, np.float64), "group": np.asarray(group, np.int64),
                         "contract": np.asarray(contract, np.int64),
                         "blocks": np.asarray(blocks, np.int64)}

    def arrays(self) -> dict[str, np.ndarray]:
        """``t_s`` (float64), ``group``, ``contract``, ``blocks`` (int64) columns."""
        if not self._rows:
            return {k: v.copy() for k, v in self._columns.items()}
        later = super().arrays()
        return {k: np.concatenate([v, later[k]]) for k, v in self._columns.items()}


# Kernel results.
DONE = 0
"""The engine process returned: every request finished."""
CHECK = 1
"""A step ended and its occupancy was recorded (``ctl[STOP_AFTER_STEP]`` set): check invariants."""
GROW = 2
"""The occupancy or creation buffer may not hold the next step's rows: enlarge, call again."""
NEVER_ADMITTED = 3
"""Nothing runs, the waiting head (``ctl[ERR_REQUEST]``) does not fit and no request is left
to arrive (the step-by-step path raises ``EngineError`` there)."""
NEED_WINDOW = 4
"""The next arrival is past ``ctl[WINDOW_END]``: slide the window of hashes and tables
(every live request stays in it) and call again."""
PAUSED = 5
"""A routed replica (``ctl[ROUTED]``, `prefixshield.fleet.fused`) stopped: its next event
comes at or after ``fctl[LIMIT]``, or it waits for the router (its next row, or the length of
a decode jump that the next row bounds). A single engine never pauses."""

# What the engine process is doing (ctl[ESTATE]).
E_TOP = 0
"""Runnable at the top of ``Engine._engine``'s loop (at ``fctl[NOW]``)."""
E_AFTER_STEP = 1
"""Runnable right after a step's occupancy record: next, the decode-coalescing decision."""
E_STEP = 2
"""Waiting for its step's timeout (at ``fctl[TE]``, scheduling number ``ctl[EE]``)."""
E_JUMP = 3
"""Waiting for a coalesced decode jump's timeout (``ctl[JUMP_K]`` steps)."""
E_IDLE = 4
"""Waiting for the next arrival's wake-up; scheduled at ``fctl[TE]`` once ``ctl[WAKE_SCHED]``."""
E_DONE = 5

# ctl slots (int64).
ESTATE = 0
NEXT_ARRIVAL = 1
"""Requests appended to the waiting queue so far (``TraceArrivals.next_row``)."""
EID = 2
"""SimPy's scheduling counter (only its order matters)."""
EA = 3
"""Scheduling number of the arrival process's pending timeout (at ``fctl[TA]``)."""
EE = 4
"""Scheduling number of the engine's pending event (at ``fctl[TE]``)."""
WAKE_SCHED = 5
NUM_RUNNING = 6
WAIT_HEAD = 7
"""Ring index of the waiting queue's head in ``waiting``."""
WAIT_COUNT = 8
NUM_STEPS = 9
NUM_EVENTS = 10
NUM_EVICTED = 11
LAST_EVICTED_N = 12
"""Blocks the last take evicted (they are ``evicted[:n]``; the pool's ``last_evicted``)."""
NUM_OCC = 13
NUM_CRE = 14
JUMP_K = 15
QUIET = 16
ERR_REQUEST = 17
NUM_SCHEDULED = 18
STEP_PREEMPTED = 19
STEP_ADMITTED = 20
STEP_HEAD_BLOCKED = 21
N = 22
BLOCK_SIZE = 23
MAX_SEQS = 24
MAX_TOKENS = 25
RESERVE_FULL = 26
CURRENT_MODE = 27
COALESCE = 28
STOP_AFTER_STEP = 29
POOL_BLOCKS = 30
POLICY = 31
"""Which policy the loop drives: `POLICY_LRU`, `POLICY_PREFIXSHIELD`,
`POLICY_STATIC_QUOTA` or `POLICY_S3FIFO`."""
MAX_SAMPLES = 32
"""PrefixShield's ``max_debt_samples`` (its debt log's bound, see ``_debt_log_append``)."""
QUOTA = 33
"""StaticQuota's per-group quota (blocks)."""
S3_GHOST_SLACK = 34
"""S3-FIFO's ``_ghost_slack``: blocks its last ``select_victims`` took, 0 after an
``on_materialize`` (read in and written back by the caller)."""
NUM_HELD = 35
"""Rows used of the held-blocks series (``held_t``, ``held_rows``)."""
HASH_BASE = 36
"""Hash offset of the window's first request: request r's hashes are
``hashes[hash_off[r] - ctl[HASH_BASE]:...]`` (0 when the whole trace's hashes are held)."""
TABLE_BASE = 37
"""Table offset of the window's first request (the same, for ``table`` and ``table_off``)."""
WINDOW_END = 38
"""First request whose hashes and table are not in the window: its arrival returns
`NEED_WINDOW` (``n`` when the window holds every request)."""
STEP_HELD_BACK = 39
"""Whether the step's admissions stopped because every waiting request was held back by its
group's limits (`Engine._step`'s ``held_back``)."""
ROUTED = 40
"""A fleet replica's loop (`prefixshield.fleet.fused`): its arrivals are the rows the router
sends it, linked through ``feed`` (the next row of the same replica, by row) from
``ctl[CURSOR]``, and ``ctl[N]`` counts the rows delivered so far. 0: every row of the trace
arrives, in order (``feed`` unread)."""
CLOSED = 41
"""No row will be delivered beyond ``ctl[N]`` (always 1 for a single engine)."""
CURSOR = 42
"""A routed replica's next row to arrive (valid while ``ctl[NEXT_ARRIVAL] < ctl[N]``)."""
LAST_FED = 43
"""A routed replica's last delivered row (-1: none), whose ``feed`` entry the next links."""
A_SLOT = 44
"""The arrival process waits for its next row (`prefixshield.fleet.slots.Slot`): its event
id is ``ctl[EA]``, taken at ``fctl[SLOT_AT]``; the delivery sets its time."""
J_WAIT = 45
"""A decode jump of ``ctl[J_K]`` quiet steps waits for the router (its event id ``ctl[EE]``,
taken at ``sw[JUMP_T0]``): the next row's time bounds it."""
J_K = 46
DEFERRED_JUMPS = 47
"""Decode jumps that waited for the router (`RoutedArrivals.deferred_jumps`)."""
LEDGER = 48
"""PrefixShield's charges are posted to a fleet ledger (``series``' ledger arrays,
`prefixshield.fleet.fused`) as replica ``ctl[REPLICA_ID]``'s."""
REPLICA_ID = 49
ONE_EVENT = 50
"""Process one event (and what its process does until it waits again), then return
`PAUSED`: a fleet ledger's one time order over every replica's events."""
EVENT_TAKEN = 51
NUM_CTL = 52

# Policies the loop drives (ctl[POLICY]).
POLICY_LRU = 0
"""vLLM's free queue, the LRU policy's linked list (``prev`` .. ``length``)."""
POLICY_PREFIXSHIELD = 1
"""PrefixShield's packed state (``ps``) and debt log (``log_*``), through its own event kernels."""
POLICY_STATIC_QUOTA = 2
"""StaticQuota's lists (``prev`` .. ``length``: truly free, then one per group) and its own
``owner``/``occupancy`` (``q_owner``, ``q_occupancy``), through its kernels."""
POLICY_S3FIFO = 3
"""S3-FIFO's lists (``prev`` .. ``length``: truly free, small, main) and its own arrays
(``s3_freq`` .. ``s3_gpos``: freq, pinned flags, keys, counters, parameters, ghost ring, ghost
table, ghost positions), through its own event kernels (compiled without numba's runtime)."""
POLICY_HOOKS = 4
"""A policy's own compiled hooks (`prefixshield.policies.hooks`): their addresses in
``pol[20]`` (`hooks.EVENTS` order) and its packed state in ``ps``, called through
`hooks.call_hook` where the pool calls the policy's events."""


KERNELS = {"lru": POLICY_LRU, "prefixshield": POLICY_PREFIXSHIELD,
           "static_quota": POLICY_STATIC_QUOTA, "s3fifo": POLICY_S3FIFO, "hooks": POLICY_HOOKS}
"""The loop's kernel sets by the name a policy's
[`FusedArrays.kernels`][prefixshield.policies.base.FusedArrays] gives (-> ``ctl[POLICY]``)."""


# fctl slots (float64).
NOW = 0
TA = 1
TE = 2
COST_A = 3
COST_B = 4
COST_C = 5
COST_D = 6
COST_E = 7
LIMIT = 8
"""A routed replica processes its events before this time only (inf for a single engine)."""
SLOT_AT = 9
ARRIVE_T = 10
"""The arrival the replica is advanced to (a waiting jump this arrival cannot shorten is
settled: `RoutedArrivals.jump_settles`)."""
J_PER_STEP = 11
J_SLOPE = 12
"""A waiting jump's first step's seconds and their growth per step."""
NUM_FCTL = 13


@njit(cache=True, inline="always")
def _cdiv(a, b):
    return -(-a // b)


@njit(cache=True, inline="always")
def _schedule_engine_event(ctl, fctl, t):
    """The engine's pending event fires at ``t`` with the next SimPy event id (ties between
    events at the same time go to the smaller id, as SimPy orders them)."""
    fctl[TE] = t
    ctl[EE] = ctl[EID]
    ctl[EID] += 1


@njit(cache=True, inline="always")
def _row(ctl, a):
    """The trace row of the ``a``-th arrival: ``a`` itself, or a routed replica's
    ``ctl[CURSOR]`` (``a`` is then ``ctl[NEXT_ARRIVAL]``)."""
    return ctl[CURSOR] if ctl[ROUTED] else a


@njit(cache=True, inline="always")
def _await_row(ctl, fctl, now):
    """A routed replica's arrival process waits for the router's next row
    (`prefixshield.fleet.slots.Slot`): its event id is taken now, its time set at the
    delivery."""
    ctl[A_SLOT] = 1
    fctl[SLOT_AT] = now
    ctl[EA] = ctl[EID]
    ctl[EID] += 1


@njit(cache=True, inline="always")
def _after(ctl, feed, row):
    """The row arriving after ``row`` (its arrival is known: ``ctl[NEXT_ARRIVAL] < ctl[N]``)."""
    return feed[row] if ctl[ROUTED] else row + 1


@njit(cache=True)
def jump_plan(ctl, fctl, wait, bounded, order_fixed):
    """``Engine._coalesced_decode_batched``'s ``plan(wait)`` of the jump in ``ctl[J_K]`` /
    ``fctl[J_PER_STEP]`` / ``fctl[J_SLOPE]``: ``(steps, seconds)``, ``(0, 0.0)`` for none.
    ``bounded`` False: no arrival bounds it (``wait`` unread)."""
    per_step, slope = fctl[J_PER_STEP], fctl[J_SLOPE]
    k, seconds = bk.coalesced_time(per_step, slope, ctl[J_K], wait, bounded)
    if bounded and not order_fixed:
        # a scheduler whose order moves with decoding (VTC) ends the jump before the step the
        # next arrival falls in, which then runs on its own
        k = k - 1 if seconds >= wait else k
        if k <= 0:
            return 0, 0.0
        k, seconds = bk.coalesced_time(per_step, slope, k, 0.0, False)
    return k, seconds


@njit(cache=True)
def resolve_jump(ctl, fctl, sw, wait, bounded, order_fixed):
    """The jump waiting for the router takes ``jump_plan(wait)`` (`RoutedArrivals`'s
    ``_resolve_jump``): its event fires with its id taken when it began, after its seconds
    (0 steps: at once, and the engine goes on)."""
    k, seconds = jump_plan(ctl, fctl, wait, bounded, order_fixed)
    ctl[J_WAIT] = 0
    if k > 0:
        ctl[NUM_EVENTS] += 1
    ctl[JUMP_K] = k
    fctl[TE] = sw[sk.JUMP_T0] + seconds


@njit(cache=True)
def jump_settles(ctl, fctl, sw, t, order_fixed):
    """`RoutedArrivals.jump_settles`: if a jump waits for the router and an arrival at ``t`` or
    later would leave it as long as no arrival does, settle it now; returns whether it did."""
    if ctl[J_WAIT] == 0 or (jump_plan(ctl, fctl, t - sw[sk.JUMP_T0], True, order_fixed)
                            != jump_plan(ctl, fctl, 0.0, False, order_fixed)):
        return False
    resolve_jump(ctl, fctl, sw, 0.0, False, order_fixed)
    return True


# A fleet ledger's log and its deliveries due (``series[9:]``): the charges' columns
# ``(t_s, replica, group, contract, blocks)``, then ``meta`` (charges logged, heap entries)
# and the heap of deliveries by (due time, charge number), as `FleetLedger` keeps them.
L_COUNT = 0
L_HEAP = 1
L_REPLICAS = 2
L_STALENESS = 0
"""Of the ledger's float meta: seconds after which a charge reaches the other copies."""


@njit(cache=True, inline="always")
def _heap_less(key, idx, a, b):
    return key[a] < key[b] or (key[a] == key[b] and idx[a] < idx[b])


@njit(cache=True)
def ledger_post(led, replica, t, g, c, n):
    """`FleetLedger.post`: replica ``replica`` charged ``n`` blocks to (g, c) at ``t``: logged,
    and due to the others at ``t + staleness`` (ties in the order the charges were made)."""
    led_t, led_r, led_g, led_c, led_b, meta, fmeta, heap_key, heap_idx = led
    k = meta[L_COUNT]
    led_t[k], led_r[k], led_g[k], led_c[k], led_b[k] = t, replica, g, c, n
    meta[L_COUNT] = k + 1
    if meta[L_REPLICAS] > 1:
        i = meta[L_HEAP]
        heap_key[i] = t + fmeta[L_STALENESS]
        heap_idx[i] = k
        meta[L_HEAP] = i + 1
        while i > 0:
            parent = (i - 1) // 2
            if not _heap_less(heap_key, heap_idx, i, parent):
                break
            heap_key[i], heap_key[parent] = heap_key[parent], heap_key[i]
            heap_idx[i], heap_idx[parent] = heap_idx[parent], heap_idx[i]
            i = parent


@njit(cache=True)
def ledger_next_due(led):
    """`FleetLedger.next_due`: the earliest delivery's time (inf: none)."""
    return led[7][0] if led[5][L_HEAP] > 0 else np.inf


@njit(cache=True)
def ledger_pop(led):
    """Take the earliest delivery off the heap: ``(due time, charge number)``."""
    heap_key, heap_idx, meta = led[7], led[8], led[5]
    at, k = heap_key[0], heap_idx[0]
    m = meta[L_HEAP] - 1
    meta[L_HEAP] = m
    heap_key[0], heap_idx[0] = heap_key[m], heap_idx[m]
    i = 0
    while True:
        best, left, right = i, 2 * i + 1, 2 * i + 2
        if left < m and _heap_less(heap_key, heap_idx, left, best):
            best = left
        if right < m and _heap_less(heap_key, heap_idx, right, best):
            best = right
        if best == i:
            break
        heap_key[i], heap_key[best] = heap_key[best], heap_key[i]
        heap_idx[i], heap_idx[best] = heap_idx[best], heap_idx[i]
        i = best
    return at, k


@njit(cache=True, _nrt=False)
def ps_remote_charge(ps, n, g, c, now):
    """PrefixShield's ``remote_charge`` on its packed state (its clock advanced first)."""
    s = psk.state(ps)
    _tick(s, now)
    psk.remote_charge(ps, n, g, c, now)


# PrefixShield's events on its packed state ``ps``, each a function of its own (not inlined:
# with its kernels inlined into _allocate the loop took minutes to compile). Each advances the
# policy's clock first, as the policy's methods do (``_tick``).
@njit(cache=True, inline="always")
def _tick(s, now):
    if now > s.fctl[psk.F_CLOCK]:
        s.fctl[psk.F_CLOCK] = now


@njit(cache=True, _nrt=False)
def _ps_hit(ps, blocks, g, c, pid, now):
    """``on_hit``."""
    s = psk.state(ps)
    _tick(s, now)
    psk._hit(s, blocks, g, c, pid, now)


@njit(cache=True, _nrt=False)
def _ps_acquire(ps, blocks):
    """``on_acquire``."""
    psk._acquire(psk.state(ps), blocks)


@njit(cache=True, _nrt=False)
def _ps_select(ps, n, now, requester, out):
    """``select_victims`` into ``out[:n]`` (it advances the clock itself)."""
    psk._select(psk.state(ps), n, now, requester, out, 0)


@njit(cache=True, _nrt=False)
def _ps_materialize(ps, blocks, g, c, pid, now, k_req, num_decode, log_t, log_g, log_d, log_cls,
                    log_meta, max_samples):
    """``on_materialize`` of a request whose class is ``k_req`` (``psk.NO_CLASS`` before its
    admission), its debt-log sample included; returns the class of the blocks."""
    s = psk.state(ps)
    _tick(s, now)
    k = psk._materialize(s, blocks, g, c, pid, now, k_req, num_decode)[1]
    psk._debt_log_append(log_t, log_g, log_d, log_cls, log_meta, max_samples, now, g, s)
    return k


@njit(cache=True, inline="always")
def _ps_prefix(ps, declared, hashes, h0):
    """The request's logical prefix under the policy's ``prefix_source`` (its root: the key of
    its first full block, ``hashes[h0]``, with the bits of an int64)."""
    return psk.prefix_key(psk.state(ps).ctl[psk.C_PREFIX_SOURCE], declared, np.int64(hashes[h0]))


@njit(cache=True, _nrt=False)
def _ps_release(ps, blocks, cached, now):
    """``on_release``."""
    s = psk.state(ps)
    _tick(s, now)
    psk._release(s, blocks, cached)


@njit(cache=True, _nrt=False)
def _ps_num_free(ps):
    """``num_free``."""
    glen = psk.state(ps).glen
    return glen[0] + glen[1] + glen[2] + glen[3]


@njit(cache=True, _nrt=False)
def _free_request(r, ctl, now, req, win, rec, scr, pool, pol, held):
    """``KVCacheManager.free``: release request ``r``'s blocks tail first, hand the ones
    reaching ref_cnt 0 to the policy (``on_release``); the row's blocks and computed tokens
    drop to 0. (The tuples are `run_loop`'s.)"""
    state, group_id = req[4], req[1]
    table, table_off = win[0], req[6]
    block_s, held_since = rec[7], rec[8]
    freed, cached, order = scr[4], scr[5], scr[6]
    ref_cnt, block_hash, owner, occupancy = pool[0], pool[1], pool[3], pool[4]
    prev, nxt, member, length, ps = pol[0], pol[1], pol[2], pol[3], pol[4]
    q_owner, q_occupancy = pol[10], pol[11]
    s3_in_use, s3_key, s3_cnt = pol[13], pol[14], pol[15]
    nb = state[r, bk.NUM_BLOCKS]
    if nb:
        block_s[r] += nb * (now - held_since[r])
        held_since[r] = now
        held[group_id[r]] -= nb
        off = table_off[r] - ctl[TABLE_BASE]
        for j in range(nb):
            order[j] = table[off + nb - 1 - j]
        k = _release(order[:nb], ref_cnt, block_hash, owner, occupancy, freed, cached)
        if k:
            if ctl[POLICY] == POLICY_LRU:
                lru._release(freed[:k], cached[:k], ctl[CURRENT_MODE] != 0, prev, nxt, member,
                             length, ctl[POOL_BLOCKS])
            elif ctl[POLICY] == POLICY_STATIC_QUOTA:
                sq._release(prev, nxt, member, length, ctl[POOL_BLOCKS], q_owner, q_occupancy,
                            freed[:k], cached[:k])
            elif ctl[POLICY] == POLICY_S3FIFO:
                s3k.on_release(freed[:k], cached[:k], prev, nxt, member, length,
                               ctl[POOL_BLOCKS], s3_in_use, s3_key, s3_cnt,
                               ctl[CURRENT_MODE] != 0)
            elif ctl[POLICY] == POLICY_HOOKS:
                hk.call_hook(pol[20][hk.ON_RELEASE], ps, freed[:k], cached[:k], k, -1, -1, -1,
                             now)
            else:
                _ps_release(ps, freed[:k], cached[:k], now)
    state[r, bk.NUM_BLOCKS] = 0
    state[r, bk.NUM_CACHED] = 0
    state[r, bk.COMPUTED] = 0


@njit(cache=True, inline="always")
def _append_if_changed(ctl, slot, values, times, rows, now):
    """Append ``values`` at ``now`` to a series (``times``, ``rows``; ``ctl[slot]`` rows used)
    if they differ from its last row: Engine._record_occupancy and Engine._record_held."""
    last = ctl[slot] - 1
    if bk.differs(values, rows[last]):
        times[last + 1] = now
        for g in range(values.shape[0]):
            rows[last + 1, g] = values[g]
        ctl[slot] = last + 2


@njit(cache=True, inline="always")
def _available(ctl, length, ps, q_occupancy, s3_cnt, requester, hooks):
    """The policy's ``available(requester)``: every free block (``num_free``) for LRU,
    PrefixShield and S3-FIFO (truly free plus unpinned queued blocks), StaticQuota's cap for
    its groups."""
    if ctl[POLICY] == POLICY_LRU:
        return length[0]
    if ctl[POLICY] == POLICY_STATIC_QUOTA:
        return sq._available(length, q_occupancy, ctl[QUOTA], requester)
    if ctl[POLICY] == POLICY_S3FIFO:
        return s3k.num_free(length, s3_cnt)
    if ctl[POLICY] == POLICY_HOOKS:
        return hk.call_hook(hooks[hk.AVAILABLE], ps, None, None, -1, requester, -1, -1, 0.0)
    return _ps_num_free(ps)


@njit(cache=True, _nrt=False)
def _allocate(r, num_new_tokens, num_hit, reserve, ctl, now, req, win, rec, scr, pool, pol,
              series):
    """``KVCacheManager.allocate_slots`` of request ``r`` (hits ``hits[:num_hit]``, reservation
    ``reserve`` tokens) under the policy ``ctl[POLICY]``; False if the blocks do not fit
    (nothing changed then). The pool calls the policy's events in `BlockPool`'s order:
    ``on_hit`` then ``on_acquire`` (touch), ``select_victims`` (take), ``on_materialize`` after
    the creation record (cache). (The tuples are `run_loop`'s.)"""
    (arrival_s, group_id, contract_id, prefix_id, state, materialized, table_off,
     hash_off) = req
    table, hashes = win
    block_s, held_since = rec[7], rec[8]
    hits, victims, evicted, was_free = scr[0], scr[1], scr[2], scr[3]
    (ref_cnt, block_hash, hash_next, owner, occupancy, evictions, map_keys, map_vals,
     map_size) = pool
    (prev, nxt, member, length, ps, log_t, log_g, log_d, log_cls, log_meta, q_owner,
     q_occupancy, s3_freq, s3_in_use, s3_key, s3_cnt, s3_params, s3_gkeys, s3_gtab,
     s3_gpos, hooks) = pol
    cre_t, cre_g, cre_c, cre_b, held = series[2], series[3], series[4], series[5], series[6]
    B = ctl[BLOCK_SIZE]
    kind = ctl[POLICY]
    nb0 = state[r, bk.NUM_BLOCKS]
    num_computed = state[r, bk.COMPUTED] + num_hit * B
    need_slot = num_computed + num_new_tokens
    check = max(need_slot, reserve)
    need = max(_cdiv(check, B) - num_hit - nb0, 0)
    for j in range(num_hit):
        if ref_cnt[hits[j]] == 0:
            need += 1
    g = group_id[r]
    if need and need > _available(ctl, length, ps, q_occupancy, s3_cnt, g, hooks):
        return False
    if num_hit or _cdiv(need_slot, B) > nb0 + num_hit:
        # KVCacheManager.allocate_slots' block-seconds: the table grows
        block_s[r] += nb0 * (now - held_since[r])
        held_since[r] = now
    c = contract_id[r]
    off = table_off[r] - ctl[TABLE_BASE]
    if num_hit:
        # pool.touch: on_hit (a no-op for LRU and StaticQuota), then on_acquire of the blocks
        # that were free (LRU and StaticQuota unlink them from their lists; S3-FIFO pins them
        # where they are)
        if kind == POLICY_PREFIXSHIELD:
            _ps_hit(ps, hits[:num_hit], g, c,
                    _ps_prefix(ps, prefix_id[r], hashes, hash_off[r] - ctl[HASH_BASE]), now)
        elif kind == POLICY_S3FIFO:
            s3k.on_hit(hits[:num_hit], member, s3_freq, s3_params[s3k.P_FREQ_CAP])
        elif kind == POLICY_HOOKS:
            hk.call_hook(hooks[hk.ON_HIT], ps, hits[:num_hit], None, num_hit, g, c,
                         prefix_id[r], now)
        nf = _touch(ref_cnt, hits[:num_hit], was_free)
        if nf:
            if kind == POLICY_PREFIXSHIELD:
                _ps_acquire(ps, was_free[:nf])
            elif kind == POLICY_S3FIFO:
                s3k.on_acquire(was_free[:nf], member, s3_in_use, s3_cnt)
            elif kind == POLICY_HOOKS:
                hk.call_hook(hooks[hk.ON_ACQUIRE], ps, was_free[:nf], None, nf, -1, -1, -1,
                             0.0)
            else:
                ll.unlink(prev, nxt, member, length, was_free[:nf])
        for j in range(num_hit):
            table[off + nb0 + j] = hits[j]
        nb0 += num_hit
        held[g] += num_hit
        state[r, bk.NUM_BLOCKS] = nb0
        state[r, bk.COMPUTED] = num_computed
        if state[r, bk.NUM_CACHED] == 0:
            state[r, bk.NUM_CACHED] = num_hit
    num_new_blocks = _cdiv(need_slot, B) - nb0
    if num_new_blocks > 0:
        # pool.take_new_blocks: the policy's select_victims (LRU pops the queue's head)
        if kind == POLICY_LRU:
            ll.pop_head(prev, nxt, member, length, ctl[POOL_BLOCKS], 0, num_new_blocks, victims,
                        0)
        elif kind == POLICY_STATIC_QUOTA:
            sq._select(prev, nxt, member, length, ctl[POOL_BLOCKS], q_owner, q_occupancy,
                       ctl[QUOTA], num_new_blocks, g, victims)
        elif kind == POLICY_S3FIFO:
            # (all of them are free: the fit check above)
            ctl[S3_GHOST_SLACK] = s3k.select_victims(
                num_new_blocks, victims, (prev, nxt, member, length), ctl[POOL_BLOCKS], s3_freq,
                s3_in_use, s3_key, s3_cnt, s3_params, (s3_gkeys, s3_gtab, s3_gpos), True)
        elif kind == POLICY_HOOKS:
            hk.call_hook(hooks[hk.SELECT_VICTIMS], ps, None, victims, num_new_blocks, g, -1, -1,
                         now)
        else:
            _ps_select(ps, num_new_blocks, now, g, victims)
        k = _claim(victims[:num_new_blocks], ref_cnt, block_hash, map_keys, map_vals, map_size,
                   hash_next, owner, occupancy, evictions, g, evicted)
        ctl[NUM_EVICTED] += k
        ctl[LAST_EVICTED_N] = k
        for j in range(num_new_blocks):
            table[off + nb0 + j] = victims[j]
        nb0 += num_new_blocks
        held[g] += num_new_blocks
        state[r, bk.NUM_BLOCKS] = nb0
    num_tokens = state[r, bk.PROMPT] + state[r, bk.OUTPUT_DONE]
    num_full = min(need_slot, num_tokens) // B
    lo = state[r, bk.NUM_CACHED]
    if num_full > lo:
        h0 = hash_off[r] - ctl[HASH_BASE]
        _cache(table[off + lo:off + num_full], hashes[h0 + lo:h0 + num_full], block_hash,
               map_keys, map_vals, map_size, hash_next)
        # pool.creations.append, then on_materialize (a no-op for LRU and StaticQuota)
        cn = ctl[NUM_CRE]
        cre_t[cn] = now
        cre_g[cn] = g
        cre_c[cn] = c
        cre_b[cn] = num_full - lo
        ctl[NUM_CRE] = cn + 1
        if kind == POLICY_PREFIXSHIELD:
            # blocks from the one holding the prompt's end on fill during decode
            num_decode = max(num_full - max(lo, state[r, bk.PROMPT] // B), 0)
            state[r, bk.ADMISSION] = _ps_materialize(
                ps, table[off + lo:off + num_full], g, c,
                _ps_prefix(ps, prefix_id[r], hashes, h0), now, state[r, bk.ADMISSION],
                num_decode, log_t, log_g, log_d, log_cls, log_meta, ctl[MAX_SAMPLES])
            if ctl[LEDGER]:
                # what _materialize charged: every block, or the prompt blocks alone
                n = num_full - lo
                free = 0 if psk.state(ps).ctl[psk.C_CHARGE_DECODE] else min(num_decode, n)
                if n > free:
                    ledger_post(series[9:], ctl[REPLICA_ID], now, g, c, n - free)
        elif kind == POLICY_S3FIFO:
            s3k.on_materialize(table[off + lo:off + num_full], hashes[h0 + lo:h0 + num_full],
                               (prev, nxt, member, length), ctl[POOL_BLOCKS], s3_freq, s3_in_use,
                               s3_key, s3_cnt, s3_params, (s3_gkeys, s3_gtab, s3_gpos))
            ctl[S3_GHOST_SLACK] = 0
        elif kind == POLICY_HOOKS:
            hk.call_hook(hooks[hk.ON_MATERIALIZE], ps, table[off + lo:off + num_full],
                         hashes[h0 + lo:h0 + num_full], num_full - lo, g, c, prefix_id[r], now)
        materialized[r] += num_full - lo
        state[r, bk.NUM_CACHED] = num_full
    return True


@njit(cache=True, _nrt=False)
def run_loop(ctl, fctl, req, win, rec, batch, sch, scr, pool, pol, series):
    """Run the engine's event loop from the state in ``ctl`` / ``fctl`` until it returns.

    The arrays come in tuples by what they hold, each in this order (all updated in place; ids
    index the trace's rows, or the window's for a streamed run):

    * ``ctl``, ``fctl``: loop state and configuration (the slot constants of this module).
    * ``req``: per request ``(arrival_s, group_id, contract_id, prefix_id, state,
      materialized, table_off, hash_off)``: seconds; ids; the batch matrix of
      `batch` (one row per request); full blocks it computed and
      cached over its life; its offsets in the flat tables and hashes (request r's hashes are
      ``hash_off[r]:hash_off[r+1]``).
    * ``win``: the window's ``(table, hashes)``: flat block tables and block hashes.
    * ``rec``: the records ``(first_token_s, finish_s, cached_tokens, num_preemptions,
      num_new_blocks, admitted_s, arrival_cached, block_s, held_since)``: first admission
      (s), tokens cached at arrival, KV block-seconds, and the time of the last change of the
      request's table (scratch).
    * ``batch``: ``(run_ids, num_new, finished, waiting)``: running order (request ids),
      tokens scheduled per position this step, scratch for finished positions
      (``min(max_num_seqs, n) + 1`` each), the ring buffer of waiting ids (``n + 1``) of
      vLLM's default scheduling.
    * ``sch``: the scheduler's state (`prefixshield.scheduling.kernels.fused_state`); its kind
      [`KIND_NONE`][prefixshield.scheduling.kernels.KIND_NONE] is vLLM's default
      (FCFS without limits), which the ring serves; any other kind keeps the waiting
      requests, the victims, the limits and the counters in it.
    * ``scr``: per-block scratch ``(hits, victims, evicted, was_free, freed, cached, order)``.
    * ``pool``: the block pool's ``(ref_cnt, block_hash, hash_next, owner, occupancy,
      evictions, map_keys, map_vals, map_size)``.
    * ``pol``: the policy's ``(prev, nxt, member, length, ps, log_t, log_g, log_d, log_cls,
      log_meta, q_owner, q_occupancy, s3_freq, s3_in_use, s3_key, s3_cnt, s3_params,
      s3_gkeys, s3_gtab, s3_gpos)``: the LRU queue's or the lists of StaticQuota and S3-FIFO;
      PrefixShield's packed state and its debt log's columns and (size, stride, charges);
      StaticQuota's owner per block and blocks per group; S3-FIFO's arrays. What
      ``ctl[POLICY]`` does not drive is unread (empty arrays of the same dtypes: one compiled
      loop serves every policy).
    * ``series``: ``(occ_t, occ, cre_t, cre_g, cre_c, cre_b, held, held_t, held_rows,
      *ledger)``: the occupancy series (``ctl[NUM_OCC]`` rows used), the creation log's columns
      (``ctl[NUM_CRE]``), block-table entries of running requests per group now and their
      series (``ctl[NUM_HELD]``), and a fleet ledger's log and deliveries (`ledger_post`;
      posted to under ``ctl[LEDGER]`` only).

    Returns:
        `DONE`, `CHECK`, `GROW`, `NEED_WINDOW`, `NEVER_ADMITTED` or (a routed replica only)
        `PAUSED`.
    """
    (arrival_s, group_id, contract_id, prefix_id, state, materialized, table_off,
     hash_off) = req
    table, hashes = win
    (first_token_s, finish_s, cached_tokens, num_preemptions, num_new_blocks, admitted_s,
     arrival_cached, block_s, held_since) = rec
    run_ids, num_new, finished, waiting, feed = batch
    sctl, sw, out_before = sch[0], sch[1], sch[16]
    by_sched = sctl[sk.KIND] != sk.KIND_NONE
    order_fixed = sctl[sk.ORDER_FIXED] != 0
    hits = scr[0]
    map_keys, map_vals = pool[6], pool[7]
    log_t, log_meta = pol[5], pol[9]
    occ_t, occ, cre_t, held, held_t, held_rows = (series[0], series[1], series[2], series[6],
                                                  series[7], series[8])
    occupancy = pool[4]
    n = ctl[N]
    B = ctl[BLOCK_SIZE]
    max_seqs = ctl[MAX_SEQS]
    max_tokens = ctl[MAX_TOKENS]
    wcap = waiting.shape[0]
    while True:
        es = ctl[ESTATE]
        now = fctl[NOW]
        if es == E_DONE:
            return DONE
        if es == E_TOP:
            if (ctl[NUM_OCC] + 1 > occ_t.shape[0] or ctl[NUM_HELD] + 2 > held_t.shape[0]
                    or ctl[NUM_CRE] + run_ids.shape[0] > cre_t.shape[0]
                    or (log_t.shape[0] < ctl[MAX_SAMPLES]
                        and log_meta[0] + run_ids.shape[0] > log_t.shape[0])
                    or (ctl[LEDGER] and series[14][L_COUNT] + run_ids.shape[0]
                        > series[9].shape[0])):
                # a step caches blocks of each scheduled request at most once: at most
                # run_ids.shape[0] creation rows and debt-log samples
                return GROW
            nrun = ctl[NUM_RUNNING]
            if nrun == 0 and ctl[WAIT_COUNT] == 0:
                if ctl[NEXT_ARRIVAL] >= n and ctl[CLOSED]:
                    ctl[ESTATE] = E_DONE
                    return DONE
                ctl[ESTATE] = E_IDLE
                ctl[WAKE_SCHED] = 0
                continue
            # ---- one scheduler iteration (Engine._step / _step_batched)
            ctl[NUM_EVENTS] += 1
            budget = max_tokens
            preempted = False
            i = 0
            while i < nrun and budget > 0:
                r = run_ids[i]
                comp = state[r, bk.COMPUTED]
                ntok = state[r, bk.PROMPT] + state[r, bk.OUTPUT_DONE]
                k = min(ntok - comp, budget)
                end = comp + k
                if (_cdiv(end, B) <= state[r, bk.NUM_BLOCKS]
                        and min(end, ntok) // B <= state[r, bk.NUM_CACHED]):
                    # allocate_slots would take no block and cache none (and cannot fail):
                    # most decode steps; skip the call (batch.plan_running's flag rule)
                    num_new[i] = k
                    budget -= k
                    i += 1
                    continue
                self_preempted = False
                while not _allocate(r, k, 0, 0, ctl, now, req, win, rec, scr, pool, pol, series):
                    preempted = True
                    # preempt the scheduler's victim (vLLM's: the newest running request) by
                    # recompute: it leaves the running order and waits again
                    j = (sk.victim(sch, run_ids, nrun, group_id, arrival_s) if by_sched
                         else nrun - 1)
                    victim = run_ids[j]
                    if j < i:
                        # scheduled earlier in this step: its tokens go back to the budget
                        # (vLLM's priority path; FCFS never gets here)
                        budget += num_new[j]
                        i -= 1
                    for p in range(j, nrun - 1):
                        run_ids[p] = run_ids[p + 1]
                        num_new[p] = num_new[p + 1]
                    nrun -= 1
                    _free_request(victim, ctl, now, req, win, rec, scr, pool, pol, held)
                    num_preemptions[victim] += 1
                    if by_sched:
                        sk.requeue(sch, victim, group_id[victim], arrival_s)
                    else:
                        h = (ctl[WAIT_HEAD] - 1) % wcap
                        waiting[h] = victim
                        ctl[WAIT_HEAD] = h
                    ctl[WAIT_COUNT] += 1
                    if victim == r:
                        self_preempted = True
                        break
                if self_preempted:
                    break
                num_new[i] = k
                budget -= k
                i += 1
            m = i
            admitted = 0
            first_admissions = 0
            head_blocked = False
            held_back = False
            if not preempted:
                if by_sched and sctl[sk.HAS_LIMITS]:
                    sk.count_running(sch, run_ids, nrun, group_id)
                while ctl[WAIT_COUNT] > 0 and budget > 0 and nrun < max_seqs:
                    if by_sched:
                        r = sk.peek(sch, True, arrival_s, group_id, state, held)
                        if r < 0:
                            held_back = True  # every waiting request is held back by a limit
                            break
                    else:
                        r = waiting[ctl[WAIT_HEAD]]
                    num_tokens = state[r, bk.PROMPT] + state[r, bk.OUTPUT_DONE]
                    h0 = hash_off[r] - ctl[HASH_BASE]
                    nh = _find_hits(map_keys, map_vals,
                                    hashes[h0:hash_off[r + 1] - ctl[HASH_BASE]],
                                    (num_tokens - 1) // B, hits)
                    k = min(num_tokens - nh * B, budget)
                    reserve = num_tokens if ctl[RESERVE_FULL] else 0
                    if not _allocate(r, k, nh, reserve, ctl, now, req, win, rec, scr, pool,
                                     pol, series):
                        head_blocked = True
                        break
                    if by_sched:
                        sk.remove(sch, r, group_id[r])
                    else:
                        ctl[WAIT_HEAD] = (ctl[WAIT_HEAD] + 1) % wcap
                    ctl[WAIT_COUNT] -= 1
                    run_ids[nrun] = r
                    num_new[nrun] = k
                    nrun += 1
                    first = cached_tokens[r] < 0
                    if first:
                        cached_tokens[r] = nh * B
                        admitted_s[r] = now
                        first_admissions += 1
                    if by_sched:
                        sk.on_admit(sch, group_id[r], first, state[r, bk.PROMPT])
                    budget -= k
                    admitted += 1
            ctl[NUM_RUNNING] = nrun
            # Engine._record_held after the scheduling: the tables grew (or a preemption freed
            # one) at this step's start
            _append_if_changed(ctl, NUM_HELD, held, held_t, held_rows, now)
            num_scheduled = m + admitted
            if num_scheduled == 0:
                if preempted:
                    continue  # the last running request preempted itself; iterate again
                if ctl[NEXT_ARRIVAL] >= n and ctl[CLOSED]:
                    ctl[ERR_REQUEST] = (sk.peek(sch, False, arrival_s, group_id, state, held)
                                        if by_sched else waiting[ctl[WAIT_HEAD]])
                    return NEVER_ADMITTED
                ctl[ESTATE] = E_IDLE
                ctl[WAKE_SCHED] = 0
                continue
            prefill, decode, context = bk.step_load(state, run_ids, 0, num_scheduled, num_new)
            # CostModel.step_time, same operation order
            dt = (fctl[COST_A] + fctl[COST_B] * prefill + fctl[COST_C] * decode
                  + fctl[COST_D] * context + fctl[COST_E] * first_admissions)
            ctl[NUM_SCHEDULED] = num_scheduled
            ctl[STEP_PREEMPTED] = preempted
            ctl[STEP_ADMITTED] = admitted
            ctl[STEP_HEAD_BLOCKED] = head_blocked
            ctl[STEP_HELD_BACK] = held_back
            sw[sk.STEP_DT] = dt
            _schedule_engine_event(ctl, fctl, now + dt)
            ctl[ESTATE] = E_STEP
            continue
        if es == E_AFTER_STEP:
            ctl[ESTATE] = E_TOP
            if ctl[QUIET] and ctl[COALESCE]:
                # Engine._coalesced_decode_batched
                nseq = ctl[NUM_RUNNING]
                k, pos_sum = bk.quiet_decode_steps(state, run_ids, nseq, B)
                if k > 0:
                    ctx0 = pos_sum + nseq
                    ctl[J_K] = k
                    fctl[J_PER_STEP] = fctl[COST_A] + fctl[COST_C] * nseq + fctl[COST_D] * ctx0
                    fctl[J_SLOPE] = fctl[COST_D] * nseq
                    bounded = ctl[NEXT_ARRIVAL] < n
                    if not bounded and not ctl[CLOSED]:
                        # a replica whose next row the router has not sent: the jump takes
                        # its event id now and its length when that row's time is known
                        ctl[J_WAIT] = 1
                        ctl[DEFERRED_JUMPS] += 1
                        sw[sk.JUMP_T0] = now
                        ctl[EE] = ctl[EID]
                        ctl[EID] += 1
                        ctl[ESTATE] = E_JUMP
                        continue
                    row = _row(ctl, ctl[NEXT_ARRIVAL])
                    wait = arrival_s[row] - now if bounded else 0.0
                    k, seconds = jump_plan(ctl, fctl, wait, bounded, order_fixed)
                    if k > 0:
                        ctl[NUM_EVENTS] += 1
                        ctl[JUMP_K] = k
                        sw[sk.JUMP_T0] = now
                        _schedule_engine_event(ctl, fctl, now + seconds)
                        ctl[ESTATE] = E_JUMP
            continue
        # ---- the engine waits: process the earlier of the two pending events
        engine_pending = (es == E_STEP or (es == E_JUMP and ctl[J_WAIT] == 0)
                          or (es == E_IDLE and ctl[WAKE_SCHED] != 0))
        arrival_pending = ctl[NEXT_ARRIVAL] < n and ctl[A_SLOT] == 0
        if not (engine_pending or arrival_pending):
            # a routed replica waiting for the router (a single engine always has an event)
            if jump_settles(ctl, fctl, sw, fctl[ARRIVE_T], order_fixed):
                continue  # no arrival at or after ARRIVE_T changes the jump
            return PAUSED
        take_arrival = arrival_pending and (not engine_pending or fctl[TA] < fctl[TE]
                                            or (fctl[TA] == fctl[TE] and ctl[EA] < ctl[EE]))
        if (fctl[TA] if take_arrival else fctl[TE]) >= fctl[LIMIT]:
            return PAUSED
        if ctl[ONE_EVENT]:
            if ctl[EVENT_TAKEN]:
                ctl[EVENT_TAKEN] = 0
                return PAUSED
            ctl[EVENT_TAKEN] = 1
        if take_arrival:
            # the arrival process resumes: append, wake the engine, schedule the next one
            now = fctl[TA]
            fctl[NOW] = now
            while True:
                a = _row(ctl, ctl[NEXT_ARRIVAL])
                if a >= ctl[WINDOW_END]:
                    # nothing of a is done yet: called again, the loop's top takes this same
                    # branch (the arrival is still the earlier event) and resumes here
                    return NEED_WINDOW
                # the prefix cached at arrival (Engine._arrivals)
                h0 = hash_off[a] - ctl[HASH_BASE]
                arrival_cached[a] = _find_hits(map_keys, map_vals,
                                               hashes[h0:hash_off[a + 1] - ctl[HASH_BASE]],
                                               (state[a, bk.PROMPT] - 1) // B, hits) * B
                if by_sched:
                    sk.arrive(sch, a, group_id[a], arrival_s)
                else:
                    waiting[(ctl[WAIT_HEAD] + ctl[WAIT_COUNT]) % wcap] = a
                ctl[WAIT_COUNT] += 1
                ctl[NEXT_ARRIVAL] += 1
                if ctl[ESTATE] == E_IDLE and ctl[WAKE_SCHED] == 0:
                    ctl[WAKE_SCHED] = 1
                    _schedule_engine_event(ctl, fctl, now)
                if ctl[NEXT_ARRIVAL] >= n:
                    if ctl[CLOSED]:
                        ctl[EID] += 1  # the process ends (SimPy schedules its Process event)
                    else:
                        _await_row(ctl, fctl, now)
                    break
                nxt = _after(ctl, feed, a)
                ctl[CURSOR] = nxt
                delay = arrival_s[nxt] - now
                if delay > 0:
                    fctl[TA] = now + delay
                    ctl[EA] = ctl[EID]
                    ctl[EID] += 1
                    break
            continue
        now = fctl[TE]
        fctl[NOW] = now
        if es == E_IDLE:
            ctl[ESTATE] = E_TOP
            continue
        if es == E_JUMP:
            if ctl[JUMP_K] == 0:  # a waiting jump the router's row cut to nothing
                ctl[ESTATE] = E_TOP
                continue
            ctl[NUM_STEPS] += ctl[JUMP_K]
            # no block opens or fills in a jump: the blocks held throughout are held's
            sk.on_hold(sch, held, now - sw[sk.JUMP_T0])
            bk.advance_decode(state, run_ids, ctl[NUM_RUNNING], ctl[JUMP_K])
            if sctl[sk.COUNTS_OUTPUTS]:
                for p in range(ctl[NUM_RUNNING]):
                    sk.on_output(sch, group_id[run_ids[p]], ctl[JUMP_K])
            ctl[ESTATE] = E_TOP
            continue
        # es == E_STEP: the end of a step
        ctl[NUM_STEPS] += 1
        nrun = ctl[NUM_RUNNING]
        # the blocks held through the step, before it frees (Scheduler.on_hold)
        sk.on_hold(sch, held, sw[sk.STEP_DT])
        counts_outputs = sctl[sk.COUNTS_OUTPUTS] != 0
        if counts_outputs:
            for p in range(ctl[NUM_SCHEDULED]):
                out_before[p] = state[run_ids[p], bk.OUTPUT_DONE]
        num_finished, decoding = bk.advance_scheduled(state, run_ids, nrun, ctl[NUM_SCHEDULED],
                                                      num_new, now, first_token_s, finish_s,
                                                      finished)
        if counts_outputs:  # Scheduler.on_output of the tokens the step emitted
            for p in range(ctl[NUM_SCHEDULED]):
                r = run_ids[p]
                sk.on_output(sch, group_id[r], state[r, bk.OUTPUT_DONE] - out_before[p])
        for j in range(num_finished):  # freed in schedule order
            r = run_ids[finished[j]]
            num_new_blocks[r] = materialized[r]
            _free_request(r, ctl, now, req, win, rec, scr, pool, pol, held)
        if num_finished:
            nrun = bk.remove_positions(run_ids, nrun, finished, num_finished)
            ctl[NUM_RUNNING] = nrun
        # Engine._record_occupancy, and its blocks held by running requests per group
        _append_if_changed(ctl, NUM_OCC, occupancy, occ_t, occ, now)
        _append_if_changed(ctl, NUM_HELD, held, held_t, held_rows, now)
        if ctl[STEP_PREEMPTED] or ctl[STEP_ADMITTED] or num_finished:
            ctl[QUIET] = 0
        else:
            # a request held back by a limit stays held, and one that did not fit still does
            # not -- unless the scheduler's order moves with decoding (VTC's counters)
            stuck = (ctl[WAIT_COUNT] == 0 or (ctl[STEP_HEAD_BLOCKED] != 0 and order_fixed)
                     or ctl[STEP_HELD_BACK] != 0 or nrun >= max_seqs)
            ctl[QUIET] = stuck and decoding
        ctl[ESTATE] = E_AFTER_STEP
        if ctl[STOP_AFTER_STEP]:
            return CHECK


@njit(cache=True)
def start(ctl, fctl, arrival_s, group_id, waiting, sch):
    """Replay the two ``Initialize`` events at t = 0: the arrival process appends every request
    due by then (to the ring ``waiting``, or the scheduler's queue in ``sch``) and schedules
    the next; then the engine process starts at its loop's top."""
    n = ctl[N]
    fctl[NOW] = 0.0
    ctl[EID] = 2  # the two Initialize events
    ctl[ESTATE] = E_TOP
    a = 0
    while a < n:
        delay = arrival_s[a] - 0.0
        if delay > 0:
            fctl[TA] = 0.0 + delay
            ctl[EA] = ctl[EID]
            ctl[EID] += 1
            break
        if sch[0][sk.KIND] != sk.KIND_NONE:
            sk.arrive(sch, a, group_id[a], arrival_s)
        else:
            waiting[ctl[WAIT_COUNT]] = a
        ctl[WAIT_COUNT] += 1
        a += 1
    ctl[NEXT_ARRIVAL] = a
    if a >= n and not ctl[CLOSED]:
        _await_row(ctl, fctl, 0.0)  # a fleet replica, nothing delivered yet


@njit(cache=True)
def check_tables(state, run_ids, num_running, table, table_off, hashes, hash_off, ref_cnt,
                 block_hash, counts, hash_base, table_base):
    """Whether the batch agrees with the pool (``check_invariants``): every block's ref_cnt is
    the number of running requests whose table holds it, and every cached table entry carries
    the request's hash at that position. ``hash_base`` / ``table_base``: the window's
    offsets (``ctl[HASH_BASE]``, ``ctl[TABLE_BASE]``).

    Returns:
        -1 if so; else the first request id whose row or table is wrong, or -2 when only the
        reference counts disagree.
    """
    counts[:] = 0
    for i in range(num_running):
        r = run_ids[i]
        nb = state[r, bk.NUM_BLOCKS]
        nc = state[r, bk.NUM_CACHED]
        if nc > nb or nb > table_off[r + 1] - table_off[r]:
            return r
        for j in range(nb):
            b = table[table_off[r] - table_base + j]
            counts[b] += 1
            if j < nc and block_hash[b] != hashes[hash_off[r] - hash_base + j]:
                return r
    for b in range(ref_cnt.shape[0]):
        if counts[b] != ref_cnt[b]:
            return -2
    return -1


@njit(cache=True, inline="always")
def _segment_base(seed, segment_id):
    return splitmix64(np.uint64(seed) ^ splitmix64(np.uint64(segment_id)))


@njit(cache=True, inline="always")
def _mod_small(x, vocab, inv):
    """``x % vocab`` (uint64) for ``2 <= vocab < 2**32``, exactly, without a 64-bit division.

    The float64 quotient estimate ``x * (1 / vocab)`` is within ``2**12 / vocab + 2`` of the
    true one, so the first remainder is off by a few ``vocab`` (well inside int64); the second
    estimate on that small remainder is off by at most one, which the two selects fix."""
    q = np.uint64(np.float64(x) * inv)
    r = np.int64(x - q * np.uint64(vocab))
    r -= np.int64(np.float64(r) * inv) * vocab
    r = r + vocab if r < 0 else r
    r = r - vocab if r >= vocab else r
    return np.uint64(r)


@njit(cache=True)
def _fill_segment(buf, pos, seed, segment_id, length, vocab, inv):
    """Token ids ``0 .. length-1`` of ``segment_id`` under ``seed`` into ``buf[pos:]`` (those of
    `prefixshield.traces.tokens._fill_segment_tokens`, as uint64)."""
    base = _segment_base(seed, segment_id)
    if vocab >= 1 << 32 or vocab < 2:
        for t in range(length):
            buf[pos + t] = splitmix64(base + np.uint64(t)) % np.uint64(vocab)
    else:
        for t in range(length):
            buf[pos + t] = _mod_small(splitmix64(base + np.uint64(t)), vocab, inv)


@njit(cache=True)
def _fill_request(buf, i, num_tokens, seed, vocab, inv, seg_ids, seg_lens, seg_offsets,
                  output_segment_id, output_tokens, output_salt_seed, row_base):
    """The first ``num_tokens`` token ids of request ``i`` (prompt segments, then output);
    ``row_base + i`` is its row in the whole trace (the segment of its unique output)."""
    pos = 0
    for s in range(seg_offsets[i], seg_offsets[i + 1]):
        if pos >= num_tokens:
            return
        n = min(seg_lens[s], num_tokens - pos)
        _fill_segment(buf, pos, seed, seg_ids[s], n, vocab, inv)
        pos += n
    if pos >= num_tokens:
        return
    n = min(output_tokens[i], num_tokens - pos)
    if output_segment_id[i] >= 0:
        _fill_segment(buf, pos, seed, output_segment_id[i], n, vocab, inv)
    else:
        _fill_segment(buf, pos, output_salt_seed, np.int64(row_base + i), n, vocab, inv)


@njit(cache=True, inline="always")
def _chain_start(group, hash_seed):
    return splitmix64(np.uint64(hash_seed) ^ splitmix64(np.uint64(group) + np.uint64(0x5A17)))


@njit(cache=True, inline="always")
def _chain_tail(buf, h, tag, lo, hi, block_size, hashes, out):
    """Continue one request's chain over its blocks ``lo .. hi-1`` (tokens in ``buf``)."""
    for b in range(lo, hi):
        for t in range(b * block_size, (b + 1) * block_size):
            h = splitmix64(h ^ buf[t])
        hashes[out + b] = tag | (h & LOW_MASK)


@njit(cache=True)
def build_hashes(seed, vocab_size, output_salt_seed, hash_seed, rows, block_size, hash_off,
                 hashes, lo, hi, base, row_base=0):
    """Block hashes of requests ``lo .. hi-1``, ``hashes[hash_off[i] - base:hash_off[i+1] -
    base]`` for request i (one per full block of prompt then output; ``lo, hi, base = 0, n,
    0``: the whole trace into a buffer of all its hashes): those of
    `chain_block_hashes` over the token ids of
    `prompt_token_ids` (the output: segment
    ``output_segment_id[i]``, or segment ``row_base + i`` of ``output_salt_seed`` when
    negative). ``row_base``: the trace row of index 0 of the per-request arrays (a streamed
    run holds a window of rows, `prefixshield.simulator.stream`).

    ``rows`` is the requests' content, per request ``(seg_ids, seg_lens, seg_offsets,
    output_segment_id, output_tokens, groups)``: request i's prompt segments are ``seg_ids`` /
    ``seg_lens`` at ``seg_offsets[i]:seg_offsets[i+1]``, then ``output_tokens[i]`` output
    tokens; ``groups[i]`` its group id (the chain's start and tag). The same tuple as
    `prefixshield.simulator.batch.build_sequences` takes.

    Both are recomputed here (tested equal): the hash chain is a serial dependency (each
    token's mix waits for the previous one), so four requests' chains advance in lock step to
    keep the multiplier busy, over token ids generated per request into small buffers, with
    the ``% vocab_size`` done by `_mod_small` (a 64-bit division costs more than the
    rest of a token's work).
    """
    seg_ids, seg_lens, seg_offsets, output_segment_id, output_tokens, groups = rows
    n = hi
    B = block_size
    inv = 1.0 / vocab_size
    most = 0
    for i in range(lo, n):
        most = max(most, hash_off[i + 1] - hash_off[i])
    b0 = np.empty(most * B, dtype=np.uint64)
    b1 = np.empty(most * B, dtype=np.uint64)
    b2 = np.empty(most * B, dtype=np.uint64)
    b3 = np.empty(most * B, dtype=np.uint64)
    for i0 in range(lo, n, 4):
        # lanes past the end repeat the last request with no blocks
        i1, i2, i3 = min(i0 + 1, n - 1), min(i0 + 2, n - 1), min(i0 + 3, n - 1)
        n0 = hash_off[i0 + 1] - hash_off[i0]
        n1 = hash_off[i1 + 1] - hash_off[i1] if i0 + 1 < n else 0
        n2 = hash_off[i2 + 1] - hash_off[i2] if i0 + 2 < n else 0
        n3 = hash_off[i3 + 1] - hash_off[i3] if i0 + 3 < n else 0
        _fill_request(b0, i0, n0 * B, seed, vocab_size, inv, seg_ids, seg_lens, seg_offsets,
                      output_segment_id, output_tokens, output_salt_seed, row_base)
        _fill_request(b1, i1, n1 * B, seed, vocab_size, inv, seg_ids, seg_lens, seg_offsets,
                      output_segment_id, output_tokens, output_salt_seed, row_base)
        _fill_request(b2, i2, n2 * B, seed, vocab_size, inv, seg_ids, seg_lens, seg_offsets,
                      output_segment_id, output_tokens, output_salt_seed, row_base)
        _fill_request(b3, i3, n3 * B, seed, vocab_size, inv, seg_ids, seg_lens, seg_offsets,
                      output_segment_id, output_tokens, output_salt_seed, row_base)
        h0, h1 = _chain_start(groups[i0], hash_seed), _chain_start(groups[i1], hash_seed)
        h2, h3 = _chain_start(groups[i2], hash_seed), _chain_start(groups[i3], hash_seed)
        t0 = np.uint64(groups[i0] + 1) << GROUP_SHIFT
        t1 = np.uint64(groups[i1] + 1) << GROUP_SHIFT
        t2 = np.uint64(groups[i2] + 1) << GROUP_SHIFT
        t3 = np.uint64(groups[i3] + 1) << GROUP_SHIFT
        o0, o1 = hash_off[i0] - base, hash_off[i1] - base
        o2, o3 = hash_off[i2] - base, hash_off[i3] - base
        common = min(min(n0, n1), min(n2, n3))
        for b in range(common):
            for t in range(b * B, (b + 1) * B):
                h0 = splitmix64(h0 ^ b0[t])
                h1 = splitmix64(h1 ^ b1[t])
                h2 = splitmix64(h2 ^ b2[t])
                h3 = splitmix64(h3 ^ b3[t])
            hashes[o0 + b] = t0 | (h0 & LOW_MASK)
            hashes[o1 + b] = t1 | (h1 & LOW_MASK)
            hashes[o2 + b] = t2 | (h2 & LOW_MASK)
            hashes[o3 + b] = t3 | (h3 & LOW_MASK)
        _chain_tail(b0, h0, t0, common, n0, B, hashes, o0)
        _chain_tail(b1, h1, t1, common, n1, B, hashes, o1)
        _chain_tail(b2, h2, t2, common, n2, B, hashes, o2)
        _chain_tail(b3, h3, t3, common, n3, B, hashes, o3)
