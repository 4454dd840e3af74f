"""The running batch as struct-of-arrays, and the numba kernels of the engine's batched step.

The scheduler's per-step work over *every* running request (token counts, the step's cost
inputs, block-boundary tests, completions, the quiet-run length of a coalesced decode jump) is
done here in one kernel call each, over an ``int64`` matrix ``state[request_id, field]`` and the
running order ``run_ids[0:num_running]`` (request ids, admission order). Only the requests whose
step touches the block pool (opens a block, fills one, finishes, is admitted or preempted) go
back to Python, where `KVCacheManager` does exactly what
it does on the step-by-step path (``Engine(..., batched=False)``, the oracle these kernels are
tested equal to).

Units: tokens, except ``NUM_BLOCKS`` / ``NUM_CACHED`` (blocks) and times (seconds, float64).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from prefixshield.simulator.hashing import chain_block_hashes
# the kernel behind traces.tokens.prompt_token_ids: the one definition of a segment's token ids
from prefixshield.traces.tokens import _fill_segment_tokens

# Columns of ``state`` (one row per request of the trace).
COMPUTED = 0
"""Tokens whose KV is computed or reused (``Sequence.num_computed_tokens``)."""
OUTPUT_DONE = 1
"""Output tokens generated so far (``Sequence.num_output_done``)."""
PROMPT = 2
"""Prompt tokens (``Sequence.num_prompt_tokens``)."""
OUTPUT_TOTAL = 3
"""Output tokens the request decodes in all (the trace's ``output_tokens``)."""
NUM_BLOCKS = 4
"""Entries of the request's block table (``Sequence.num_blocks``)."""
NUM_CACHED = 5
"""Leading blocks of the table that carry the request's hashes (``Sequence.num_cached_blocks``)."""
ADMISSION = 6
"""PrefixShield's class of the request's blocks once admitted, -1 before (the fused loop keeps
it here; the policy keeps it per request id on the step-by-step path)."""
NUM_FIELDS = 7


@njit(cache=True)
def plan_running(state, run_ids, num_running, budget, block_size, num_new, needs_pool):
    """Tokens of each running request for this step, and which of them touch the block pool.

    vLLM's running loop: requests in admission order, each asking for the rest of its known
    tokens (decode: 1; prefill: the rest of the prompt) cut to what is left of the step's token
    budget, until the budget is spent. Writes ``num_new[i]`` for the ``m`` requests considered.

    A request is *flagged* when its ``allocate_slots`` is not a no-op: the step's tokens need a
    block the table lacks (a block boundary is crossed) or complete a full block not yet
    cached. For every other request ``allocate_slots`` would ask for zero free blocks, take
    none and cache none, so the Python side skips it. Row ``j < num_flagged`` of
    ``needs_pool`` is ``(position in run_ids, computed tokens, output tokens done)`` of the
    j-th flagged request, in order: what Python copies into its ``Sequence`` before calling
    the cache manager.

    Flagged rows get the block counters that a successful ``allocate_slots`` leaves
    (``NUM_BLOCKS`` = blocks the step's tokens need, ``NUM_CACHED`` = full blocks), ahead of
    the call: the Python side either makes that call succeed or preempts the request, and a
    preempted request's row is rewritten when it is admitted again.

    Returns:
        ``(m, num_flagged, budget_left, prefill_tokens, decode_seqs, context_tokens)``:
        requests considered, flagged ones among them, the token budget left after the ``m``
        requests, and their `step_load`.
    """
    m, num_flagged, budget = plan_running_from(state, run_ids, 0, num_running, budget,
                                               block_size, num_new, needs_pool)
    prefill, decode, context = step_load(state, run_ids, 0, m, num_new)
    return m, num_flagged, budget, prefill, decode, context


@njit(cache=True)
def plan_running_from(state, run_ids, start, num_running, budget, block_size, num_new,
                      needs_pool):
    """`plan_running` over positions ``start .. num_running-1`` with ``budget`` tokens
    left (a scheduler that preempted a request other than the newest plans the rest again).

    Returns:
        ``(m, num_flagged, budget_left)``: one past the last position considered (``start``
        if none), flagged requests among them (rows of ``needs_pool`` from 0), budget left.
    """
    num_flagged = 0
    m = start
    for i in range(start, num_running):
        if budget <= 0:
            break
        r = run_ids[i]
        comp = state[r, COMPUTED]
        ntok = state[r, PROMPT] + state[r, OUTPUT_DONE]
        k = min(ntok - comp, budget)
        num_new[i] = k
        budget -= k
        end = comp + k
        required = (end + block_size - 1) // block_size
        full = min(end, ntok) // block_size
        if required > state[r, NUM_BLOCKS] or full > state[r, NUM_CACHED]:
            needs_pool[num_flagged, 0] = i
            needs_pool[num_flagged, 1] = comp
            needs_pool[num_flagged, 2] = state[r, OUTPUT_DONE]
            num_flagged += 1
            state[r, NUM_BLOCKS] = max(state[r, NUM_BLOCKS], required)
            state[r, NUM_CACHED] = max(state[r, NUM_CACHED], full)
        m = i + 1
    return m, num_flagged, budget


@njit(cache=True)
def step_load(state, run_ids, lo, hi, num_new):
    """Cost-model inputs of a step over the scheduled requests ``run_ids[lo:hi]``.

    A request decoding its next output token (1 token, output started, all but that token
    computed) counts as a decode sequence; any other scheduled tokens are prefill tokens
    (prompt chunks, recomputation after preemption). Context = every scheduled request's
    computed tokens plus the step's own.

    Returns:
        ``(prefill_tokens, decode_seqs, context_tokens)``.
    """
    prefill = 0
    decode = 0
    context = 0
    for i in range(lo, hi):
        r = run_ids[i]
        k = num_new[i]
        comp = state[r, COMPUTED]
        out = state[r, OUTPUT_DONE]
        if k == 1 and out > 0 and comp == state[r, PROMPT] + out - 1:
            decode += 1
        else:
            prefill += k
        context += comp + k
    return prefill, decode, context


@njit(cache=True)
def advance_scheduled(state, run_ids, num_running, num_scheduled, num_new, now, first_token_s,
                      finish_s, finished):
    """End of a step at ``now`` seconds: the scheduled tokens (of ``run_ids[0:num_scheduled]``)
    count as computed, and a request whose known tokens are all computed emits one output
    token (the first sets ``first_token_s``, the last ``finish_s``; both indexed by request
    id).

    Writes the positions (in ``run_ids``, ascending) of the requests that finished into
    ``finished``.

    Returns:
        ``(num_finished, all_decoding)``: how many finished, and whether every one of the
        ``num_running`` requests is now decoding (see `all_decoding`; computed before
        the finished ones leave, so meaningful only when none did).
    """
    num_finished = 0
    for i in range(num_scheduled):
        r = run_ids[i]
        state[r, COMPUTED] += num_new[i]
        if state[r, COMPUTED] == state[r, PROMPT] + state[r, OUTPUT_DONE]:
            state[r, OUTPUT_DONE] += 1
            if state[r, OUTPUT_DONE] == 1:
                first_token_s[r] = now
            if state[r, OUTPUT_DONE] >= state[r, OUTPUT_TOTAL]:
                finish_s[r] = now
                finished[num_finished] = i
                num_finished += 1
    return num_finished, all_decoding(state, run_ids, num_running)


@njit(cache=True)
def remove_positions(run_ids, num_running, positions, num_positions):
    """Drop ``positions[0:num_positions]`` (ascending) from ``run_ids[0:num_running]`` keeping
    the order of the rest; returns the new number of running requests."""
    out = 0
    j = 0
    for i in range(num_running):
        if j < num_positions and positions[j] == i:
            j += 1
            continue
        run_ids[out] = run_ids[i]
        out += 1
    return out


@njit(cache=True)
def differs(a, b):
    """Whether two equally long 1-D arrays differ anywhere (cheaper than ``np.array_equal``
    for the few-element occupancy vector checked after every step)."""
    for i in range(a.shape[0]):
        if a[i] != b[i]:
            return True
    return False


@njit(cache=True)
def all_decoding(state, run_ids, num_running):
    """Whether every running request is decoding (output started, all but its newest token
    computed): the precondition of a coalesced decode jump. False with nothing running."""
    if num_running == 0:
        return False
    for i in range(num_running):
        r = run_ids[i]
        out = state[r, OUTPUT_DONE]
        if out <= 0 or state[r, COMPUTED] != state[r, PROMPT] + out - 1:
            return False
    return True


@njit(cache=True)
def quiet_decode_steps(state, run_ids, num_running, block_size):
    """Length of the run of quiet decode steps ahead, and the running requests' summed
    positions (computed tokens).

    A decode step of a request at token position ``p`` with ``p % B`` in ``[1, B-2]`` neither
    opens nor fills a block; the run also stops one step before any request's last token. The
    same rule as the step-by-step path's ``Engine._coalesced_decode``.

    Returns:
        ``(k, position_sum)``; ``k <= 0`` means no jump.
    """
    k = np.iinfo(np.int64).max
    pos_sum = 0
    for i in range(num_running):
        r = run_ids[i]
        pos = state[r, COMPUTED]
        pos_sum += pos
        q = pos % block_size
        quiet = block_size - 1 - q if 1 <= q <= block_size - 2 else 0
        left = state[r, OUTPUT_TOTAL] - state[r, OUTPUT_DONE] - 1
        k = min(k, quiet, left)
    return k, pos_sum


@njit(cache=True)
def advance_decode(state, run_ids, num_running, k):
    """``k`` decode steps of every running request: ``k`` more tokens computed and emitted."""
    for i in range(num_running):
        r = run_ids[i]
        state[r, COMPUTED] += k
        state[r, OUTPUT_DONE] += k


@njit(cache=True)
def coalesced_time(per_step, d_nseq, k, wait, bounded):
    """Steps ``j`` to take in a quiet decode run of up to ``k`` steps, and their total seconds.

    Step ``s`` (1-based) of the run lasts ``per_step + d_nseq * (s - 1)``; the sum over the first
    ``j`` steps is evaluated as ``j * per_step + d_nseq * j * (j - 1) / 2`` in this operation order,
    float64, exactly as the step-by-step path's numpy expression does. With ``bounded``, the run
    stops at the first step boundary at or after ``wait`` seconds (the next arrival), as
    ``searchsorted(cum, wait, side="left") + 1`` does there.
    """
    j = 1
    while True:
        s = float(j)
        cum = s * per_step + d_nseq * s * (s - 1.0) / 2.0
        if j == k or (bounded and cum >= wait):
            return j, cum
        j += 1


@njit(cache=True)
def build_sequences(seed, vocab_size, output_salt_seed, hash_seed, rows, block_size, lo, hi,
                    out):
    """Token ids and block hashes of requests ``lo .. hi-1`` in one call, into flat arrays.

    ``rows`` is the requests' content, ``(seg_ids, seg_lens, seg_offsets, output_segment_id,
    output_tokens, groups)``, as `prefixshield.simulator.fused.build_hashes` takes it.
    Request i's tokens are its prompt segments
    (``seg_ids`` / ``seg_lens`` at ``seg_offsets[i]:seg_offsets[i+1]``), then its output:
    segment ``output_segment_id[i]`` of ``output_tokens[i]`` tokens under ``seed``, or, when
    that id is negative, segment ``i`` under ``output_salt_seed`` -- the same ids
    `prefixshield.traces.tokens.prompt_token_ids` gives the step-by-step path; ``groups[i]``
    starts its hash chain. ``out`` is ``(tokens, token_offsets, hashes, hash_offsets)``: the
    tokens land in ``tokens[token_offsets[i-lo]:...]``; the hashes of every full block in
    ``hashes[hash_offsets[i-lo]:...]``.
    """
    seg_ids, seg_lens, seg_offsets, output_segment_id, output_tokens, groups = rows
    tokens, token_offsets, hashes, hash_offsets = out
    tpos = 0
    hpos = 0
    for i in range(lo, hi):
        j = i - lo
        token_offsets[j] = tpos
        hash_offsets[j] = hpos
        start = tpos
        for s in range(seg_offsets[i], seg_offsets[i + 1]):
            _fill_segment_tokens(tokens, tpos, seed, seg_ids[s], seg_lens[s], vocab_size)
            tpos += seg_lens[s]
        if output_segment_id[i] >= 0:
            _fill_segment_tokens(tokens, tpos, seed, output_segment_id[i], output_tokens[i],
                                 vocab_size)
        else:
            _fill_segment_tokens(tokens, tpos, output_salt_seed, np.int64(i), output_tokens[i],
                                 vocab_size)
        tpos += output_tokens[i]
        h = chain_block_hashes(tokens[start:tpos], tpos - start, block_size, groups[i], hash_seed)
        hashes[hpos:hpos + h.shape[0]] = h
        hpos += h.shape[0]
    token_offsets[hi - lo] = tpos
    hash_offsets[hi - lo] = hpos
