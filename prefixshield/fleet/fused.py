"""Lockstep mode compiled: every replica's fused loop and the router in one numba kernel.

`prefixshield.fleet.lockstep.run_lockstep` drives each replica's SimPy environment from
Python (83-94 us a request at 10^6 requests and 16 replicas). Here each replica is a fused
loop (`prefixshield.simulator.fused.run_loop`) whose arrivals are the rows the router sends
it (``ctl[ROUTED]``), and `fleet_loop` does, for every row in arrival order, what the Python
loop does:

1. advance every replica through its events before the arrival could be (a replica stops,
   `fused.PAUSED`, at its next event at or after the limit, or when it waits for the router;
   the limit is `RoutedArrivals.horizon`'s, and a waiting decode jump that no arrival can
   shorten is settled, as `RoutedArrivals.jump_settles` does);
2. ask the router, reading every replica as it is at that instant: `least_loaded`,
   `kv_aware` and `prefix_affinity` are compiled here (the same reads, the same arithmetic,
   the same ties); a router that reads no state routes every row up front
   (`Router.assign_all`) and the loop follows that assignment;
3. deliver the row (`deliver`: the arrival's and the waiting jump's times are set, their
   event ids having been taken when a single engine would have scheduled them,
   `prefixshield.fleet.slots`);

then closes the replicas and runs each to its end. So a replica given the rows R runs exactly
as a single engine over the sub-trace R, and the router reads exactly what the Python loop's
router reads: the same assignment and the same records, bit for bit (``tests/fleet``).

Each replica's arrays (its eleven `run_loop` tuples) are passed by address
(`prefixshield.fleet.addresses`): one compiled loop for every fleet size. The per-request
arrays are the fleet's (each row is written only by the replica it was routed to); the
window of block hashes and tables is shared too, slid when the next row to route passes it.

A fleet ledger (`prefixshield.fleet.ledger.FleetLedger`, PrefixShield's charges delivered to
the other replicas ``staleness_s`` later) is compiled too: a replica posts each charge from
inside its allocation (`fused.ledger_post`) into one heap ordered by (due time, charge
number), and the replicas are advanced one event at a time (``ctl[ONE_EVENT]``) in the
fleet's one time order, every delivery due by then applied first (`_advance_merged`), as the
Python loop's shared SimPy clock orders them.

What stays on the Python path (`run_lockstep`, ``run_fleet(..., fused=False)``): a router
that is not exactly one of the three registered classes (a third-party router keeps the
`ReplicaView` interface), ``prefix_affinity`` over more than 64 replicas, a ledger that is
not exactly a `FleetLedger`, and replicas the fused loop cannot drive
(`Engine.fused_capable`); `applies` decides.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from prefixshield.fleet.addresses import address_row, views_like
from prefixshield.fleet.ledger import FleetLedger
from prefixshield.scheduling import kernels as sk
from prefixshield.simulator import batch as bk
from prefixshield.simulator import fused as fz
from prefixshield.simulator.blockpool import _find_hits
from prefixshield.simulator.engine import Engine, FusedRun

# Router kinds (fl[F_ROUTER]).
R_FIXED = 0
"""Follow ``assignment`` (filled up front by a router that reads no state)."""
R_LEAST_LOADED = 1
R_KV_AWARE = 2
R_PREFIX_AFFINITY = 3

COMPILED_ROUTERS = {"least_loaded": R_LEAST_LOADED, "kv_aware": R_KV_AWARE,
                    "prefix_affinity": R_PREFIX_AFFINITY}
"""The registered routers compiled here (exactly their classes)."""

MAX_AFFINITY_REPLICAS = 64
"""``prefix_affinity``'s trees are one table of replica bit masks (uint64)."""

TREE_SLOTS = 1 << 16
"""``prefix_affinity``'s first table (slots; doubled whenever a prompt might fill it past
half)."""

GROW_TREES = 6
"""`fleet_loop`'s code: ``prefix_affinity``'s table may not hold the next prompt: enlarge it
(`grow_trees`) and call again."""

# fl slots (int64).
F_NEXT_ROW = 0
"""The next trace row to route."""
F_CLOSED = 1
"""Every row was routed and every replica closed: the replicas run to their ends."""
F_REPLICA = 2
"""The replica whose loop returned the code `fleet_loop` returned."""
F_ROUTER = 3
F_LAST = 4
"""The router's last choice (``_last``: ties go to the first tied replica after it)."""
F_WINDOW_END = 5
"""The first row whose hashes and table are not in the shared window."""
F_BLOCK_SIZE = 6
F_IMBALANCE = 7
F_TREE_COUNT = 8
"""Distinct content hashes in ``prefix_affinity``'s table."""
F_LEDGER = 9
"""The replicas share a fleet ledger: they are advanced in one time order (`_advance_merged`)."""
NUM_FL = 10

# ffl slots (float64).
FF_MATCH_RATIO = 0
NUM_FFL = 1


@njit(cache=True, inline="always")
def _next_event(ctl, fctl):
    """Time of the replica's earliest pending event (inf: none, it waits for the router;
    -inf: it is runnable now, having returned mid-advance for its caller, e.g. `fused.GROW`)."""
    es = ctl[fz.ESTATE]
    if es == fz.E_TOP or es == fz.E_AFTER_STEP:
        return -np.inf
    at = np.inf
    if (es == fz.E_STEP or (es == fz.E_JUMP and ctl[fz.J_WAIT] == 0)
            or (es == fz.E_IDLE and ctl[fz.WAKE_SCHED] != 0)):
        at = fctl[fz.TE]
    if ctl[fz.NEXT_ARRIVAL] < ctl[fz.N] and ctl[fz.A_SLOT] == 0 and fctl[fz.TA] < at:
        at = fctl[fz.TA]
    return at


@njit(cache=True, inline="always")
def _horizon(ctl, fctl, t):
    """`RoutedArrivals.horizon`: events before this time come before an arrival at ``t``
    routed here (``t`` as the waiting arrival process computes it)."""
    if ctl[fz.A_SLOT]:
        at = fctl[fz.SLOT_AT]
        return min(t, at + (t - at))
    return t


@njit(cache=True)
def deliver(ctl, fctl, sch, feed, arrival_s, row):
    """`RoutedArrivals.deliver`: row ``row`` (arriving at or after every row delivered before)
    is routed to this replica: it is linked after the last, a jump waiting for the router takes
    its length, and an arrival process waiting for its next row its time."""
    if ctl[fz.LAST_FED] >= 0:
        feed[ctl[fz.LAST_FED]] = row
    if ctl[fz.NEXT_ARRIVAL] == ctl[fz.N]:
        ctl[fz.CURSOR] = row
    ctl[fz.LAST_FED] = row
    ctl[fz.N] += 1
    t = arrival_s[row]
    sw = sch[1]
    if ctl[fz.J_WAIT]:
        fz.resolve_jump(ctl, fctl, sw, t - sw[sk.JUMP_T0], True, sch[0][sk.ORDER_FIXED] != 0)
    if ctl[fz.A_SLOT]:
        at = fctl[fz.SLOT_AT]
        fctl[fz.TA] = at + max(t - at, 0.0)
        ctl[fz.A_SLOT] = 0


@njit(cache=True)
def close(ctl, fctl, sch):
    """`LockstepReplica.close`: no more rows; a waiting jump ends where no arrival bounds
    it, and an idle engine wakes (to see it is done)."""
    ctl[fz.CLOSED] = 1
    if ctl[fz.J_WAIT]:
        fz.resolve_jump(ctl, fctl, sch[1], 0.0, False, sch[0][sk.ORDER_FIXED] != 0)
    if ctl[fz.ESTATE] == fz.E_IDLE and ctl[fz.WAKE_SCHED] == 0:
        ctl[fz.WAKE_SCHED] = 1
        fz._schedule_engine_event(ctl, fctl, fctl[fz.NOW])


# ---------------------------------------------------------------- what routers read
@njit(cache=True, inline="always")
def _num_requests(ctl):
    """`LockstepReplica.num_requests`: waiting + delivered and not arrived + running."""
    return (ctl[fz.WAIT_COUNT] + (ctl[fz.N] - ctl[fz.NEXT_ARRIVAL]) + ctl[fz.NUM_RUNNING])


@njit(cache=True)
def _pending_prefill(args, lo, r):
    """`LockstepReplica.pending_prefill_tokens` of replica ``r`` (``lo``: per replica, the
    arrival index and row of its first arrived row maybe not admitted, advanced here past
    the admitted ones)."""
    ctl, req, rec, batch = args[0], args[2], args[4], args[5]
    state, cached_tokens, arrival_cached = req[4], rec[2], rec[6]
    run_ids, feed = batch[0], batch[4]
    total = 0
    k, row = lo[r, 0], lo[r, 1]
    arrived = ctl[fz.NEXT_ARRIVAL]
    # arrived rows never admitted: prompt less what was cached at arrival
    while k < arrived and cached_tokens[row] >= 0:
        k += 1
        row = feed[row] if k < ctl[fz.N] else -1
    lo[r, 0], lo[r, 1] = k, row
    while k < arrived:
        if cached_tokens[row] < 0:
            total += state[row, bk.PROMPT] - arrival_cached[row]
        k += 1
        row = feed[row] if k < ctl[fz.N] else -1
    # delivered, not arrived: the whole prompt
    if arrived < ctl[fz.N]:
        row = ctl[fz.CURSOR]
        for j in range(arrived, ctl[fz.N]):
            total += state[row, bk.PROMPT]
            if j + 1 < ctl[fz.N]:
                row = feed[row]
    for p in range(ctl[fz.NUM_RUNNING]):
        s = run_ids[p]
        left = state[s, bk.PROMPT] - state[s, bk.COMPUTED]
        if left > 0:
            total += left
    return total


@njit(cache=True, inline="always")
def _held_blocks(args):
    """`LockstepReplica.held_blocks`: block-table entries of its running requests."""
    held = args[10][6]
    total = 0
    for g in range(held.shape[0]):
        total += held[g]
    return total


@njit(cache=True, inline="always")
def _least_int(values, n, start):
    """`prefixshield.fleet.routers.base.least` of ints."""
    best = start % n
    for j in range(1, n):
        i = (start + j) % n
        if values[i] < values[best]:
            best = i
    return best


@njit(cache=True, inline="always")
def _least_pair(first, second, n, start):
    """`least` of the pairs ``(first[i], second[i])`` (compared as tuples)."""
    best = start % n
    for j in range(1, n):
        i = (start + j) % n
        if first[i] < first[best] or (first[i] == first[best] and second[i] < second[best]):
            best = i
    return best


@njit(cache=True, inline="always")
def _slot(keys, masks, h):
    """``h``'s slot in the open-addressing table (its own, or the empty one it would take)."""
    cap_mask = keys.shape[0] - 1
    s = np.int64((h * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(32)) & cap_mask
    while masks[s] != 0 and keys[s] != h:
        s = (s + 1) & cap_mask
    return s


@njit(cache=True)
def grow_trees(keys, masks, new_keys, new_masks):
    """Copy ``prefix_affinity``'s table into a larger one (sizes powers of two)."""
    for s in range(keys.shape[0]):
        if masks[s] != 0:
            t = _slot(new_keys, new_masks, keys[s])
            new_keys[t] = keys[s]
            new_masks[t] = masks[s]


@njit(cache=True)
def _route(fl, ffl, proto, table, rt, i, lo):
    """The replica the router sends row ``i`` to (as the router's ``route`` decides it)."""
    assignment, hashes, hash_off, content, prompt_tokens, keys, masks, sizes, loads, costs = rt[:10]
    R = table.shape[0]
    kind = fl[F_ROUTER]
    if kind == R_FIXED:
        return assignment[i]
    start = fl[F_LAST] + 1
    B = fl[F_BLOCK_SIZE]
    m = (prompt_tokens[i] - 1) // B
    for r in range(R):
        args = views_like(proto, table[r])
        loads[r] = _num_requests(args[0])
        if kind == R_KV_AWARE:
            pool, scr = args[8], args[7]
            h0 = hash_off[i]
            cached = _find_hits(pool[6], pool[7], hashes[h0:h0 + m], m, scr[0])
            new = prompt_tokens[i] - cached * B
            costs[r] = (_pending_prefill(args, lo, r) + new) / B + _held_blocks(args)
    if kind == R_LEAST_LOADED:
        return _least_int(loads, R, start)
    if kind == R_KV_AWARE:
        return _least_pair(costs, loads, R, start)
    # prefix_affinity: the load check, then the longest match, else the smallest tree
    h0 = hash_off[i]
    lmax, lmin = loads[0], loads[0]
    for r in range(1, R):
        lmax, lmin = max(lmax, loads[r]), min(lmin, loads[r])
    if lmax - lmin > fl[F_IMBALANCE] or m == 0:
        choice = _least_int(loads, R, start)
    else:
        for r in range(R):
            costs[r] = 0.0
        alive = np.uint64(0)
        for r in range(R):
            alive |= np.uint64(1) << np.uint64(r)
        # matches[r]: leading prompt blocks in replica r's tree (costs holds them, negated)
        for b in range(m):
            s = _slot(keys, masks, content[h0 + b])
            have = masks[s] & alive if keys[s] == content[h0 + b] else np.uint64(0)
            alive = have
            if alive == 0:
                break
            for r in range(R):
                if (alive >> np.uint64(r)) & np.uint64(1):
                    costs[r] -= 1.0
        best = 0
        for r in range(R):
            best = max(best, np.int64(-costs[r]))
        if best > 0 and best >= ffl[FF_MATCH_RATIO] * m:
            choice = _least_pair(costs, loads, R, start)
        else:
            choice = _least_pair(sizes, loads, R, start)
    bit = np.uint64(1) << np.uint64(choice)
    for b in range(m):
        h = content[h0 + b]
        s = _slot(keys, masks, h)
        if masks[s] == 0:
            keys[s] = h
            fl[F_TREE_COUNT] += 1
        if masks[s] & bit == 0:
            masks[s] |= bit
            sizes[choice] += 1
    return choice


@njit(cache=True)
def _deliver_charge(proto, table, led):
    """`FleetLedger.deliver_next`: the earliest due charge, applied to every replica's copy but
    its maker's at its delivery time."""
    at, k = fz.ledger_pop(led)
    origin = led[1][k]
    for r in range(table.shape[0]):
        if r != origin:
            ps = views_like(proto, table[r])[9][4]
            fz.ps_remote_charge(ps, led[4][k], led[2][k], led[3][k], at)


@njit(cache=True)
def _advance_merged(fl, proto, table, t, limits):
    """`prefixshield.fleet.lockstep._advance_merged`: every replica's events before an
    arrival at ``t`` could be (``t = inf``: to the end) and the fleet ledger's deliveries due
    no later than the last of them, in one time order (the earliest event first, replicas by
    index at one instant, a delivery due by then before it), one event at a time
    (``ctl[ONE_EVENT]``). Returns `fused.PAUSED`, or a replica's code (``fl[F_REPLICA]``)."""
    R = table.shape[0]
    for r in range(R):
        args = views_like(proto, table[r])
        ctl, fctl, sch = args[0], args[1], args[6]
        limits[r] = _horizon(ctl, fctl, t)
        fz.jump_settles(ctl, fctl, sch[1], t, sch[0][sk.ORDER_FIXED] != 0)
    led = views_like(proto, table[0])[10][9:]
    while True:
        best, at = -1, np.inf
        for r in range(R):
            args = views_like(proto, table[r])
            e = _next_event(args[0], args[1])
            if e < limits[r] and e < at:
                best, at = r, e
        if best < 0:
            return fz.PAUSED
        if fz.ledger_next_due(led) <= at:
            _deliver_charge(proto, table, led)
            continue
        args = views_like(proto, table[best])
        ctl, fctl = args[0], args[1]
        fctl[fz.LIMIT] = limits[best]
        fctl[fz.ARRIVE_T] = t
        ctl[fz.ONE_EVENT] = 1
        code = fz.run_loop(*args)
        if code != fz.PAUSED and code != fz.DONE:  # a replica done has no event left
            fl[F_REPLICA] = best
            return code


@njit(cache=True, _nrt=False)
def fleet_loop(fl, ffl, proto, table, arrival_s, rt, lo):
    """Route and run every row (see the module docstring) from the state in ``fl`` / ``ffl``
    and the replicas' arrays (``table``: one `address_row` per replica, of tuples of
    ``proto``'s structure). Resumable: returns `fused.DONE`, or a replica's code
    (``fl[F_REPLICA]``: `fused.CHECK`, `fused.GROW`, `fused.NEVER_ADMITTED`),
    `fused.NEED_WINDOW` (the next row to route is past ``fl[F_WINDOW_END]``) or
    `GROW_TREES`; after the caller handles it, a call goes on where it stopped. ``rt``: the
    router's arrays ``(assignment, hashes, hash_off, content, prompt_tokens, keys, masks,
    sizes, loads, costs)`` and the replicas' limits (scratch); ``lo``: per replica, where its
    pending prefill's scan starts."""
    R = table.shape[0]
    n = arrival_s.shape[0]
    assignment, content, keys = rt[0], rt[3], rt[5]
    while fl[F_CLOSED] == 0:
        i = fl[F_NEXT_ROW]
        if i >= n:
            for r in range(R):
                args = views_like(proto, table[r])
                close(args[0], args[1], args[6])
            fl[F_CLOSED] = 1
            break
        if i >= fl[F_WINDOW_END]:
            return fz.NEED_WINDOW
        if fl[F_ROUTER] == R_PREFIX_AFFINITY:
            m = (rt[4][i] - 1) // fl[F_BLOCK_SIZE]
            if 2 * (fl[F_TREE_COUNT] + m) > keys.shape[0]:
                return GROW_TREES
        t = arrival_s[i]
        if fl[F_LEDGER]:
            code = _advance_merged(fl, proto, table, t, rt[10])
            if code != fz.PAUSED:
                return code
        else:
            for r in range(R):
                args = views_like(proto, table[r])
                ctl, fctl = args[0], args[1]
                limit = _horizon(ctl, fctl, t)
                if ctl[fz.J_WAIT] == 0 and _next_event(ctl, fctl) >= limit:
                    continue  # nothing of it comes before the arrival: it is as it would be
                fctl[fz.LIMIT] = limit
                fctl[fz.ARRIVE_T] = t
                code = fz.run_loop(*args)
                if code != fz.PAUSED:
                    fl[F_REPLICA] = r
                    return code
        choice = _route(fl, ffl, proto, table, rt, i, lo)
        fl[F_LAST] = choice
        args = views_like(proto, table[choice])
        deliver(args[0], args[1], args[6], args[5][4], arrival_s, i)
        if lo[choice, 0] == args[0][fz.N] - 1:
            lo[choice, 1] = i  # the pending prefill's scan starts at this replica's row
        assignment[i] = choice
        fl[F_NEXT_ROW] = i + 1
    if fl[F_LEDGER]:
        code = _advance_merged(fl, proto, table, np.inf, rt[10])
        if code != fz.PAUSED:
            return code
        led = views_like(proto, table[0])[10][9:]
        while fz.ledger_next_due(led) < np.inf:  # FleetLedger.flush
            _deliver_charge(proto, table, led)
    for r in range(R):
        args = views_like(proto, table[r])
        args[0][fz.ONE_EVENT] = 0
        args[1][fz.LIMIT] = np.inf
        code = fz.run_loop(*args)
        if code != fz.DONE:
            fl[F_REPLICA] = r
            return code
    return fz.DONE


# ---------------------------------------------------------------- the Python side
def applies(replicas: list[Engine], router, ledger) -> bool:
    """Whether `run_compiled` can run this lockstep fleet: every replica one the fused loop
    drives (`Engine.fused_capable`), a router that reads no state or is exactly one of
    `COMPILED_ROUTERS` (``prefix_affinity`` over at most `MAX_AFFINITY_REPLICAS`
    replicas), and no ledger or a `FleetLedger` (exactly; its charges and deliveries are
    compiled here)."""
    return python_loop_reason(replicas, router, ledger) is None


def python_loop_reason(replicas: list[Engine], router, ledger) -> str | None:
    """None where `applies`, else why the fleet takes the Python loop (one phrase)."""
    from prefixshield.fleet.routers.base import ROUTERS

    if ledger is not None and type(ledger) is not FleetLedger:
        return f"its ledger is a {type(ledger).__name__}, not a FleetLedger"
    if not all(rep.fused_capable() for rep in replicas):
        return "the fused loop does not drive its replicas (policy, scheduler or cost model)"
    if not router.reads_state:
        return None
    name = router.name
    if name not in COMPILED_ROUTERS or ROUTERS[name] is not type(router):
        return f"router {name} is not one of the compiled routers"
    if name == "prefix_affinity" and len(replicas) > MAX_AFFINITY_REPLICAS:
        return f"prefix_affinity over more than {MAX_AFFINITY_REPLICAS} replicas"
    return None


class _Replicas:
    """The replicas' fused runs and their argument tuples, by address (`address_row`)."""

    def __init__(self, replicas: list[Engine], ledger: FleetLedger | None) -> None:
        self.replicas = replicas
        first = replicas[0]
        n = len(first.arrival_s)
        self.ledger = ledger
        if ledger is not None:
            # as the engine's first creation buffer (FUSED_FIRST_ROWS: the tests' small one)
            self._ledger_arrays(first.FUSED_FIRST_ROWS or 4 * n + 1024)
            self.led[5][fz.L_REPLICAS] = len(replicas)
            self.led[6][fz.L_STALENESS] = ledger.staleness_s
        self.hash_off, self.table_off = first.fused_offsets()
        feed = np.full(n, -1, dtype=np.int64)  # each row's next row on its replica
        self.runs: list[FusedRun] = []
        for rep in replicas:
            rep.fused_feed = feed
            run = rep.fused_begin(n, self.runs[0] if self.runs else None,
                                  served=-(-n // len(replicas)))
            run.ctl[fz.ROUTED], run.ctl[fz.CLOSED], run.ctl[fz.N] = 1, 0, 0
            if ledger is not None:
                run.ctl[fz.LEDGER], run.ctl[fz.REPLICA_ID] = 1, len(self.runs)
            self.runs.append(run)
        self.hashes, self.table = first._fused_window(self.runs[0].ctl, self.hash_off,
                                                      self.table_off, 0, 0, None, None)
        self._share_window()
        for rep, run in zip(replicas, self.runs):
            fz.start(run.ctl, run.fctl, rep.arrival_s, rep.group_id, *run.queue)
        self.args = [self._args(r) for r in range(len(replicas))]
        self.addresses = np.stack([address_row(a) for a in self.args])

    def _ledger_arrays(self, cap: int, old: tuple | None = None) -> None:
        """The fleet ledger's arrays (`fused.ledger_post`) with room for ``cap`` charges,
        what ``old`` held copied over; every replica posts to them."""
        cols = (np.empty(cap, dtype=np.float64), *(np.empty(cap, dtype=np.int64)
                                                   for _ in range(4)))
        heap = (np.empty(cap, dtype=np.float64), np.empty(cap, dtype=np.int64))
        meta, fmeta = np.zeros(3, dtype=np.int64), np.zeros(1, dtype=np.float64)
        if old is not None:
            meta[:], fmeta[:] = old[5], old[6]
            k, h = int(meta[fz.L_COUNT]), int(meta[fz.L_HEAP])
            for new, was in zip(cols, old[:5]):
                new[:k] = was[:k]
            for new, was in zip(heap, old[7:]):
                new[:h] = was[:h]
        self.led = (*cols, meta, fmeta, *heap)
        for rep in self.replicas:
            rep.fused_ledger = self.led

    def grow_ledger(self) -> None:
        """Double the ledger's room if a step might not fit (`fused.GROW`)."""
        led = self.led
        most = max(rep._run_ids.shape[0] for rep in self.replicas)
        if led[5][fz.L_COUNT] + most > led[0].shape[0]:
            self._ledger_arrays(2 * led[0].shape[0] + most, led)
            for r in range(len(self.replicas)):
                self.refresh(r)

    def ledger_log(self) -> None:
        """The charges into the `FleetLedger`'s log (every delivery made: nothing due)."""
        led, ledger = self.led, self.ledger
        k = int(led[5][fz.L_COUNT])
        ledger.t_s = led[0][:k].tolist()
        ledger.replica, ledger.group, ledger.contract, ledger.blocks = (
            col[:k].tolist() for col in led[1:5])
        ledger._due = []

    def _args(self, r: int) -> tuple:
        rep, run = self.replicas[r], self.runs[r]
        return rep.fused_args(run.ctl, run.fctl, rep, run.materialized, run.held_since,
                              self.table, self.table_off, self.hashes, self.hash_off,
                              run.queue, run.scratch, run.pol, run.series)

    def _share_window(self) -> None:
        ctl0 = self.runs[0].ctl
        for run in self.runs[1:]:
            for slot in (fz.HASH_BASE, fz.TABLE_BASE, fz.WINDOW_END):
                run.ctl[slot] = ctl0[slot]

    def refresh(self, r: int) -> None:
        """Replica ``r``'s arguments after its arrays changed (a grown buffer, a new
        window); what the loop counted in the old ones' small arrays (the debt log's
        counters) is written back first, for the new ones to start from."""
        self.replicas[r].fused_after(self.args[r])
        self.args[r] = self._args(r)
        self.addresses[r] = address_row(self.args[r])

    def grow(self, r: int) -> None:
        """`fused.GROW` of replica ``r`` (its buffers, or the fleet ledger's)."""
        rep = self.replicas[r]
        rep.fused_after(self.args[r])
        rep.fused_grow(self.runs[r])
        self.refresh(r)
        if self.ledger is not None:
            self.grow_ledger()

    def slide(self, next_row: int) -> int:
        """The next window (`fused.NEED_WINDOW` before routing ``next_row``), from the oldest
        row any replica still reads; returns its end."""
        lo = min([next_row] + [rep._oldest_live(run.ctl, run.queue)
                               for rep, run in zip(self.replicas, self.runs)])
        self.hashes, self.table = self.replicas[0]._fused_window(
            self.runs[0].ctl, self.hash_off, self.table_off, lo, next_row, self.hashes,
            self.table)
        self._share_window()
        for r in range(len(self.replicas)):
            self.refresh(r)
        return int(self.runs[0].ctl[fz.WINDOW_END])

    def check(self, r: int) -> None:
        """`fused.CHECK` of replica ``r``: its invariants (AssertionError)."""
        rep = self.replicas[r]
        rep.fused_after(self.args[r])  # the policy's Python side, which its checks read
        rep._fused_check(self.runs[r].ctl, rep._state, self.table, self.table_off, self.hashes,
                         self.hash_off)

    def finish(self, assignment: np.ndarray) -> None:
        """What each replica keeps after the run (`Engine.fused_end`), its rows, its jumps
        that waited for the router."""
        for r, (rep, run) in enumerate(zip(self.replicas, self.runs)):
            rep.fused_after(self.args[r])
            rep.fused_end(run)
            rep.rows = np.flatnonzero(assignment == r).tolist()
            rep.routed.deferred_jumps = int(run.ctl[fz.DEFERRED_JUMPS])


def run_compiled(replicas: list, router, arrival_s: np.ndarray, hashes: np.ndarray,
                 hash_offsets: np.ndarray, info, ledger: FleetLedger | None = None
                 ) -> np.ndarray:
    """`prefixshield.fleet.lockstep.run_lockstep` in one compiled loop (where `applies`):
    route every row of the trace through ``router`` to ``replicas`` (`LockstepReplica`\\ s
    built over the whole trace, not started) and run them to the end; the same assignment,
    records, replica results and ledger log. ``hashes``, ``hash_offsets``, ``info``: the
    fleet's (`prefixshield.fleet.hashes.trace_hashes`); ``ledger``: the replicas' policies
    share it (linked to it), its log is filled in. Returns the replica of every row (int64);
    an engine error of any replica is raised (the first replica's first; under a ledger, the
    first in the fleet's time order)."""
    n = arrival_s.shape[0]
    R = len(replicas)
    reps = _Replicas(replicas, ledger)
    fl = np.zeros(NUM_FL, dtype=np.int64)
    ffl = np.zeros(NUM_FFL, dtype=np.float64)
    fl[F_WINDOW_END] = reps.runs[0].ctl[fz.WINDOW_END]
    fl[F_BLOCK_SIZE] = info.block_size
    fl[F_LAST] = getattr(router, "_last", -1)
    fl[F_LEDGER] = ledger is not None
    if router.reads_state:
        fl[F_ROUTER] = COMPILED_ROUTERS[router.name]
        assignment = np.zeros(n, dtype=np.int64)
    else:
        fl[F_ROUTER] = R_FIXED
        assignment = router.assign_all(n)
        if n and not (0 <= assignment.min() and assignment.max() < R):
            bad = int(assignment[(assignment < 0) | (assignment >= R)][0])
            raise RuntimeError(f"router {router.name} chose replica {bad} of {R}")
    affinity = fl[F_ROUTER] == R_PREFIX_AFFINITY
    if affinity:
        fl[F_IMBALANCE] = router.config.imbalance
        ffl[FF_MATCH_RATIO] = router.config.match_ratio
        content = info.flat_content_hashes()
        cap = TREE_SLOTS
    else:
        content, cap = np.zeros(0, dtype=np.uint64), 1
    keys, masks = np.zeros(cap, dtype=np.uint64), np.zeros(cap, dtype=np.uint64)
    sizes = np.zeros(R, dtype=np.int64)
    rt = (assignment, hashes, hash_offsets, content, info.prompt_tokens.astype(np.int64),
          keys, masks, sizes, np.zeros(R, dtype=np.int64), np.zeros(R, dtype=np.float64),
          np.zeros(R, dtype=np.float64))
    lo = np.zeros((R, 2), dtype=np.int64)
    lo[:, 1] = -1
    while True:
        code = fleet_loop(fl, ffl, reps.args[0], reps.addresses, arrival_s, rt, lo)
        if code == fz.DONE:
            break
        r = int(fl[F_REPLICA])
        if code == fz.CHECK:
            reps.check(r)
        elif code == fz.GROW:
            reps.grow(r)
        elif code == fz.NEED_WINDOW:
            fl[F_WINDOW_END] = reps.slide(int(fl[F_NEXT_ROW]))
        elif code == GROW_TREES:
            keys, masks = rt[5], rt[6]
            new_keys = np.zeros(2 * keys.shape[0], dtype=np.uint64)
            new_masks = np.zeros(2 * keys.shape[0], dtype=np.uint64)
            grow_trees(keys, masks, new_keys, new_masks)
            rt = rt[:5] + (new_keys, new_masks) + rt[7:]
        else:  # fz.NEVER_ADMITTED, after the close
            raise replicas[r].fused_error(reps.runs[r].ctl)
    reps.finish(assignment)
    if ledger is not None:
        reps.ledger_log()
    if hasattr(router, "_last"):
        router._last = int(fl[F_LAST])
    if affinity:
        keys, masks = rt[5], rt[6]
        for r in range(R):
            router._trees[r] = set(keys[(masks >> np.uint64(r)) & np.uint64(1) == 1].tolist())
    return assignment
