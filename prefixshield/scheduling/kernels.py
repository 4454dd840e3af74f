"""The schedulers' compiled form: their waiting queues, preemption victims, per-tenant limits and
counters as numba functions over one tuple of arrays, which the fused engine loop
(`prefixshield.simulator.fused.run_loop`) calls where the per-step paths call a
[`Scheduler`][prefixshield.scheduling.base.Scheduler]'s methods.

Decision for decision the same as the Python classes (tested bit-identical against the
step-by-step path in ``tests/scheduling/test_schedulers.py``):

* **One structure for every queue.** The waiting requests of group ``g`` are a doubly linked list
  over request ids (``q_next``, ``q_prev``; ``head[g]``, ``tail[g]``, ``count[g]``), kept in the
  group's order. ``fcfs`` and ``vtc``/``kvtc`` keep vLLM's deque per group: an arrival at the tail,
  a preempted request at the head; ``fcfs``'s global order (one deque over all groups) is the
  sequence key ``q_key``: arrivals count up from 0, requeues count down from -1, so the deque's
  order is the key's. ``priority`` keeps each group sorted by ``(arrival_s, request id)`` (its
  priority is its group's), inserting from the tail for an arrival and from the head for a
  requeue.
* **The next request** (``peek``) is the least key among the groups' first *eligible* requests
  (the first in the group's order the limits admit): ``q_key`` for ``fcfs``, ``(priority,
  arrival_s, id)`` for ``priority``, ``(counter, arrival_s of the group's head, id)`` for VTC,
  which looks at each group's head only (a held-back head holds its group back, as
  `VTCScheduler.peek` does).
* **Limits** (``max_running``, ``max_blocks``; 0: none): the engine's running requests per group
  (``run_count``, counted at the admission phase's start, as `Engine._eligible` counts them) and
  the block-table entries they hold (the engine's ``held``).
* **Counters** (VTC, KVTC): ``in_tok``, ``out_tok`` (int64) and ``lift``, ``kv_s`` (float64) are
  the scheduler object's own arrays, updated in place, so its ``stats()`` reads them after the
  run; the counter is evaluated in `VTCScheduler.counter`'s operation order.

Units: tokens; blocks; seconds.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# Scheduler kinds (sctl[KIND]).
KIND_NONE = -1
"""vLLM's default, FCFS without limits: the engine loop's own ring buffer, not these lists."""
KIND_FCFS = 0
KIND_PRIORITY = 1
KIND_VTC = 2
KIND_KVTC = 3

# sctl slots (int64).
KIND = 0
HAS_LIMITS = 1
"""Whether any group has ``max_running`` or ``max_blocks`` (else every request is eligible)."""
SEQ_UP = 2
"""The next arrival's ``q_key`` (fcfs)."""
SEQ_DOWN = 3
"""The last requeue's ``q_key`` (fcfs; counts down from 0)."""
LAST_GROUP = 4
"""VTC's ``_last_admitted_group`` (-1: none yet)."""
ORDER_FIXED = 5
"""`Scheduler.order_fixed`."""
COUNTS_OUTPUTS = 6
COUNTS_BLOCK_S = 7
BLOCK_SIZE = 8
COL_PROMPT = 9
COL_OUTPUT = 10
"""Columns of the engine's batch matrix holding a request's prompt tokens and output tokens so
far (its known tokens, which ``max_blocks`` counts)."""
NUM_SCTL = 11

# sw slots (float64).
W_IN = 0
W_OUT = 1
W_KV = 2
STEP_DT = 3
"""The current step's duration (s): what `Scheduler.on_hold` is told after it."""
JUMP_T0 = 4
"""When the current decode jump started (s)."""
NUM_SW = 5

NO_REQUEST = -1


@njit(cache=True, inline="always")
def _cdiv(a, b):
    return -(-a // b)


@njit(cache=True)
def counter(sch, g):
    """VTC's ``c_g`` (`VTCScheduler.counter`, KVTC's with its block-seconds term)."""
    sctl, sw = sch[0], sch[1]
    in_tok, out_tok, lift, kv_s = sch[12], sch[13], sch[14], sch[15]
    c = sw[W_IN] * np.float64(in_tok[g]) + sw[W_OUT] * np.float64(out_tok[g]) + lift[g]
    if sctl[KIND] == KIND_KVTC:
        c = c + sw[W_KV] * kv_s[g]
    return c


@njit(cache=True, inline="always")
def _link_after(sch, r, g, p):
    """Link ``r`` into group ``g``'s list after ``p`` (-1: at the head)."""
    q_next, q_prev, head, tail, count = sch[2], sch[3], sch[5], sch[6], sch[7]
    nx = head[g] if p < 0 else q_next[p]
    q_prev[r] = p
    q_next[r] = nx
    if p < 0:
        head[g] = r
    else:
        q_next[p] = r
    if nx < 0:
        tail[g] = r
    else:
        q_prev[nx] = r
    count[g] += 1


@njit(cache=True, inline="always")
def _before(arrival_s, a, b):
    """Whether request ``a`` comes before ``b`` in a priority group's order."""
    return arrival_s[a] < arrival_s[b] or (arrival_s[a] == arrival_s[b] and a < b)


@njit(cache=True)
def arrive(sch, r, g, arrival_s):
    """`Scheduler.arrive` of request ``r`` of group ``g`` (VTC's counter lift first)."""
    sctl, q_prev, q_key, head, tail, count = sch[0], sch[3], sch[4], sch[5], sch[6], sch[7]
    kind = sctl[KIND]
    if kind == KIND_PRIORITY:
        p = tail[g]
        while p >= 0 and _before(arrival_s, r, p):
            p = q_prev[p]
        _link_after(sch, r, g, p)
        return
    if kind >= KIND_VTC and count[g] == 0:
        found = False
        level = 0.0
        for h in range(count.shape[0]):
            if count[h] > 0:
                c = counter(sch, h)
                if not found or c < level:
                    level, found = c, True
        if not found and sctl[LAST_GROUP] >= 0:
            level, found = counter(sch, sctl[LAST_GROUP]), True
        if found:
            c = counter(sch, g)
            if level > c:
                sch[14][g] += level - c
    q_key[r] = sctl[SEQ_UP]
    sctl[SEQ_UP] += 1
    _link_after(sch, r, g, tail[g])


@njit(cache=True)
def requeue(sch, r, g, arrival_s):
    """`Scheduler.requeue`: preempted ``r`` waits again (at its group's head; in order for
    priority)."""
    sctl, q_next, q_key, head = sch[0], sch[2], sch[4], sch[5]
    if sctl[KIND] == KIND_PRIORITY:
        p = -1
        x = head[g]
        while x >= 0 and _before(arrival_s, x, r):
            p = x
            x = q_next[x]
        _link_after(sch, r, g, p)
        return
    sctl[SEQ_DOWN] -= 1
    q_key[r] = sctl[SEQ_DOWN]
    _link_after(sch, r, g, -1)


@njit(cache=True)
def remove(sch, r, g):
    """`Scheduler.pop`: ``r`` leaves group ``g``'s list (it was admitted)."""
    q_next, q_prev, head, tail, count = sch[2], sch[3], sch[5], sch[6], sch[7]
    p, nx = q_prev[r], q_next[r]
    if p < 0:
        head[g] = nx
    else:
        q_next[p] = nx
    if nx < 0:
        tail[g] = p
    else:
        q_prev[nx] = p
    count[g] -= 1


@njit(cache=True, inline="always")
def _eligible(sch, r, g, state, held):
    """`Engine._eligible`'s test of waiting ``r``: its group runs fewer than ``max_running``
    requests, and the blocks its running requests hold plus those of ``r``'s known tokens fit
    ``max_blocks``."""
    sctl, max_running, max_blocks, run_count = sch[0], sch[9], sch[10], sch[11]
    if max_running[g] > 0 and run_count[g] >= max_running[g]:
        return False
    if max_blocks[g] == 0:
        return True
    tokens = state[r, sctl[COL_PROMPT]] + state[r, sctl[COL_OUTPUT]]
    return held[g] + _cdiv(tokens, sctl[BLOCK_SIZE]) <= max_blocks[g]


@njit(cache=True)
def count_running(sch, run_ids, num_running, group_id):
    """The running requests per group, as the admission phase's eligibility test starts."""
    run_count = sch[11]
    run_count[:] = 0
    for i in range(num_running):
        run_count[group_id[run_ids[i]]] += 1


@njit(cache=True)
def peek(sch, use_limits, arrival_s, group_id, state, held):
    """`Scheduler.peek`: the waiting request to try next (-1: every waiting request is held
    back), under the limits when ``use_limits`` and the scheduler has any (``state``: the
    engine's batch matrix, ``held``: blocks held per group by running requests)."""
    sctl, q_next, q_key, head, count, prio = sch[0], sch[2], sch[4], sch[5], sch[7], sch[8]
    kind = sctl[KIND]
    limits = use_limits and sctl[HAS_LIMITS] != 0
    best = NO_REQUEST
    best_c = 0.0
    for g in range(count.shape[0]):
        if count[g] == 0:
            continue
        s = head[g]
        if limits:
            if kind >= KIND_VTC:
                if not _eligible(sch, s, g, state, held):
                    continue
            else:
                while s >= 0 and not _eligible(sch, s, g, state, held):
                    s = q_next[s]
                if s < 0:
                    continue
        if kind == KIND_FCFS:
            if best < 0 or q_key[s] < q_key[best]:
                best = s
        elif kind == KIND_PRIORITY:
            if best < 0:
                best = s
            else:
                pb, ps = prio[group_id[best]], prio[g]
                if ps < pb or (ps == pb and _before(arrival_s, s, best)):
                    best = s
        else:
            c = counter(sch, g)
            if best < 0 or c < best_c or (c == best_c and _before(arrival_s, s, best)):
                best, best_c = s, c
    return best


@njit(cache=True)
def victim(sch, run_ids, num_running, group_id, arrival_s):
    """`Scheduler.victim`: the position in ``run_ids[:num_running]`` (admission order) of the
    request to preempt."""
    kind = sch[0][KIND]
    if kind == KIND_PRIORITY:
        prio = sch[8]
        best = 0
        for i in range(1, num_running):  # strict: the first maximum, as max() keeps
            r, b = run_ids[i], run_ids[best]
            pr, pb = prio[group_id[r]], prio[group_id[b]]
            if pr > pb or (pr == pb and arrival_s[r] > arrival_s[b]):
                best = i
        return best
    if kind >= KIND_VTC:
        best = num_running - 1
        best_c = counter(sch, group_id[run_ids[best]])
        for i in range(num_running - 2, -1, -1):  # newest first: ties keep the newest
            c = counter(sch, group_id[run_ids[i]])
            if c > best_c:
                best, best_c = i, c
        return best
    return num_running - 1


@njit(cache=True)
def on_admit(sch, g, first, prompt_tokens):
    """`Scheduler.on_admit` (and the limits' running count)."""
    sctl = sch[0]
    sch[11][g] += 1
    if sctl[KIND] >= KIND_VTC:
        sctl[LAST_GROUP] = g
        if first:
            sch[12][g] += prompt_tokens


@njit(cache=True, inline="always")
def on_output(sch, g, num_tokens):
    """`Scheduler.on_output`: ``num_tokens`` output tokens of a request of group ``g`` were
    emitted (VTC's and KVTC's output count; called only when ``sctl[COUNTS_OUTPUTS]``)."""
    sch[13][g] += num_tokens


@njit(cache=True)
def on_hold(sch, held, seconds):
    """`Scheduler.on_hold` (KVTC's block-seconds)."""
    if sch[0][COUNTS_BLOCK_S] and seconds > 0:
        kv_s = sch[15]
        for g in range(kv_s.shape[0]):
            kv_s[g] += held[g] * seconds


@njit(cache=True)
def oldest_waiting(sch):
    """The least request id waiting (-1: none)."""
    q_next, head = sch[2], sch[5]
    best = -1
    for g in range(head.shape[0]):
        x = head[g]
        while x >= 0:
            if best < 0 or x < best:
                best = x
            x = q_next[x]
    return best


FUSED_KINDS = {"fcfs": KIND_FCFS, "priority": KIND_PRIORITY, "vtc": KIND_VTC,
               "kvtc": KIND_KVTC}
"""The registered schedulers these kernels reproduce (exactly their classes: a subclass may
change a method)."""


def fused_kind(scheduler) -> int | None:
    """The kind the fused loop runs ``scheduler`` as, None when it cannot (not exactly one of
    the `FUSED_KINDS` classes)."""
    from prefixshield.scheduling.registry import SCHEDULERS

    name = getattr(type(scheduler), "name", None)
    if name not in FUSED_KINDS or SCHEDULERS[name] is not type(scheduler):
        return None
    return FUSED_KINDS[name]


def fused_state(scheduler, num_requests: int, run_capacity: int, block_size: int,
                columns: tuple[int, int], default: bool) -> tuple:
    """``scheduler``'s state as the fused loop takes it: ``(sctl, sw, q_next, q_prev, q_key,
    head, tail, count, prio, max_running, max_blocks, run_count, in_tok, out_tok, lift,
    kv_s, out_before)``, per request (``num_requests``), per group, and per running position
    (``run_capacity``: scratch for the output tokens a step emits). ``columns``: the batch matrix's
    prompt and output-so-far columns. ``default``: vLLM's default
    scheduling (`KIND_NONE`: the loop's own FCFS ring). VTC's and KVTC's counters are the
    scheduler's own arrays (updated in place); `write_back` returns the rest."""
    G = len(scheduler.groups)
    sctl = np.zeros(NUM_SCTL, dtype=np.int64)
    sw = np.zeros(NUM_SW, dtype=np.float64)
    kind = KIND_NONE if default else fused_kind(scheduler)
    if kind is None:
        raise ValueError(f"scheduler {type(scheduler).__name__} has no fused form")
    sctl[KIND] = kind
    sctl[ORDER_FIXED] = scheduler.order_fixed
    sctl[COUNTS_OUTPUTS] = scheduler.counts_outputs
    sctl[COUNTS_BLOCK_S] = scheduler.counts_block_seconds
    sctl[BLOCK_SIZE] = block_size
    sctl[COL_PROMPT], sctl[COL_OUTPUT] = columns
    sctl[LAST_GROUP] = getattr(scheduler, "_last_admitted_group", -1)
    max_running = np.array([lim.max_running or 0 for lim in scheduler.limits], dtype=np.int64)
    max_blocks = np.array([lim.max_blocks or 0 for lim in scheduler.limits], dtype=np.int64)
    sctl[HAS_LIMITS] = bool(max_running.any() or max_blocks.any())
    n = num_requests if kind != KIND_NONE else 0
    q = [np.full(n, -1, dtype=np.int64) for _ in range(3)]
    head, tail = np.full(G, -1, dtype=np.int64), np.full(G, -1, dtype=np.int64)
    zeros_i = np.zeros(G, dtype=np.int64)
    in_tok = getattr(scheduler, "input_tokens", zeros_i.copy())
    out_tok = getattr(scheduler, "output_tokens", zeros_i.copy())
    lift = getattr(scheduler, "lift", np.zeros(G, dtype=np.float64))
    kv_s = getattr(scheduler, "block_s", np.zeros(G, dtype=np.float64))
    if kind >= KIND_VTC:
        cfg = scheduler.config
        sw[W_IN], sw[W_OUT] = cfg.vtc_input_weight, cfg.vtc_output_weight
        if kind == KIND_KVTC:
            sw[W_KV] = scheduler._weight()
    return (sctl, sw, *q, head, tail, zeros_i.copy(), np.array(scheduler.priority, np.int64),
            max_running, max_blocks, zeros_i.copy(), in_tok, out_tok, lift, kv_s,
            np.zeros(run_capacity if scheduler.counts_outputs else 0, dtype=np.int64))


def rebase(sch: tuple, shift: int, rows: int) -> tuple:
    """``sch`` for a streamed run's next window (`prefixshield.simulator.stream`), whose row
    0 is the old row ``shift`` and which holds ``rows`` rows: the per-request lists moved to
    new arrays of ``rows`` entries, every request id in them and the groups' heads and tails
    less ``shift`` (rows before ``shift`` are in no list: they finished). Order keys are kept
    (FCFS's counters; priority's order is by arrival and id, which the same shift keeps)."""
    if sch[0][KIND] == KIND_NONE:
        return sch
    old_next, old_prev, old_key = sch[2], sch[3], sch[4]
    kept = slice(shift, min(old_next.shape[0], shift + rows))
    lists = []
    for old in (old_next, old_prev):
        new = np.full(rows, -1, dtype=np.int64)
        part = old[kept]
        new[:part.shape[0]] = np.where(part >= 0, part - shift, -1)
        lists.append(new)
    key = np.full(rows, -1, dtype=np.int64)
    key[:kept.stop - kept.start] = old_key[kept]
    head, tail = sch[5], sch[6]
    head[:] = np.where(head >= 0, head - shift, -1)
    tail[:] = np.where(tail >= 0, tail - shift, -1)
    return (sch[0], sch[1], *lists, key, *sch[5:])


def write_back(scheduler, sch: tuple) -> None:
    """What the scheduler object keeps outside its arrays, from the fused state after a run."""
    if sch[0][KIND] >= KIND_VTC:
        scheduler._last_admitted_group = int(sch[0][LAST_GROUP])
        scheduler._num_waiting = int(sch[7].sum())
