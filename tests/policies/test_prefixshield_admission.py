"""PrefixShield's admission is a property of the request, its logical prefix an input.

Exact examples on the policy (numba and reference alike) and in the engine (step by step and
fused): the class a request's first call decides holds for its later chunks and decode blocks;
``admission="call"`` is the other reading; ``charge_decode`` and ``prefix_source`` do what they
say; a finished request's id is a new request.
"""

from __future__ import annotations

import numpy as np
import pytest

from helpers import make_trace
from prefixshield.policies import make_policy
from prefixshield.policies.prefixshield import NORMAL, PROBATIONARY
from prefixshield.policies.reference.prefixshield import ReferencePrefixShield
from prefixshield.simulator.config import EngineConfig
from prefixshield.simulator.costmodel import load_profile
from prefixshield.simulator.engine import Engine
from prefixshield.tenancy import Contract

FUNDED = Contract("funded", 1.0, 100.0)
POOR = Contract("poor", 1.0, 2.0)


def make(reference, contracts=(FUNDED,), **flags):
    p = ReferencePrefixShield(32, **flags) if reference else make_policy("prefixshield", 32,
                                                                         **flags)
    p.bind_tenants(["A", "B"], list(contracts))
    return p


def call(p, n, t, request_id=-1, prefix_id=0, root=None, num_decode=0, contract=0, group=0):
    """Take ``n`` blocks and materialize them as one call of a request; returns the blocks."""
    blocks = p.select_victims(n, t, group)
    p.on_materialize(blocks, np.arange(n, dtype=np.uint64), group, contract, prefix_id, t,
                     request_id=request_id, root=root, num_decode=num_decode)
    return blocks


def classes(p, blocks):
    return [p.block_class(int(b)) if hasattr(p, "meta") else int(p.klass[b]) for b in blocks]


def total_charged(p) -> int:
    return sum(map(sum, p.charged)) if hasattr(p, "meta") else int(np.sum(p.charged))


@pytest.mark.parametrize("reference", [False, True])
def test_later_chunks_of_a_first_admission_stay_probationary(reference):
    p = make(reference)
    first = call(p, 3, 0.0, request_id=7)
    later = call(p, 2, 0.1, request_id=7)         # a later prefill chunk
    decode = call(p, 1, 0.2, request_id=7, num_decode=1)
    assert classes(p, first) == [PROBATIONARY] * 3
    assert classes(p, later) == [PROBATIONARY] * 2
    assert classes(p, decode) == [PROBATIONARY]
    # every block was charged once, when it was created
    assert total_charged(p) == 6


@pytest.mark.parametrize("reference", [False, True])
def test_per_call_reading_makes_a_requests_later_chunks_normal(reference):
    p = make(reference, admission="call")
    call(p, 3, 0.0, request_id=7)
    later = call(p, 2, 0.1, request_id=7)
    assert classes(p, later) == [NORMAL] * 2


@pytest.mark.parametrize("reference", [False, True])
def test_class_is_decided_once_even_when_a_later_chunk_puts_the_group_in_debt(reference):
    p = make(reference, contracts=(POOR,))
    call(p, 1, 0.0, request_id=1)                  # first admission of prefix 0: PROBATIONARY
    p.on_request_finished(1)
    funded = call(p, 1, 0.0, request_id=2)         # funded (balance 0 after): NORMAL
    in_debt = call(p, 3, 0.0, request_id=2)        # the same request, now 3 blocks in debt
    assert classes(p, funded) == [NORMAL]
    assert classes(p, in_debt) == [NORMAL] * 3
    assert p.debt(0, 0.0) == 3.0
    p.on_request_finished(2)
    fresh = call(p, 1, 0.0, request_id=2)          # a finished id names a new request
    assert classes(p, fresh) == [PROBATIONARY]     # in debt at its admission


@pytest.mark.parametrize("reference", [False, True])
def test_decode_blocks_charged_or_not(reference):
    for charge_decode, want in ((True, 5), (False, 3)):
        p = make(reference, charge_decode=charge_decode)
        call(p, 5, 0.0, request_id=0, num_decode=2)
        assert total_charged(p) == want
        if not reference:
            assert int(p.uncharged[0]) == 5 - want
            p.check_invariants()   # I1 counts the uncharged decode blocks


@pytest.mark.parametrize("reference", [False, True])
@pytest.mark.parametrize("source, second_class", [("root", NORMAL), ("declared", PROBATIONARY),
                                                  ("tenant", NORMAL)])
def test_prefix_source(reference, source, second_class):
    """Two requests with the same first block (root) but different declared ids, then one with
    another root: the same prefix for "root" and "tenant", different ones for "declared"."""
    p = make(reference, prefix_source=source)
    call(p, 2, 0.0, request_id=0, prefix_id=10, root=2**63 + 5)
    second = call(p, 2, 0.0, request_id=1, prefix_id=11, root=2**63 + 5)
    other = call(p, 2, 0.0, request_id=2, prefix_id=10, root=99)
    assert classes(p, second) == [second_class] * 2
    assert classes(p, other) == [NORMAL if source in ("declared", "tenant") else PROBATIONARY] * 2


def test_unknown_readings_are_refused():
    with pytest.raises(ValueError, match="admission"):
        make_policy("prefixshield", 8, admission="step")
    with pytest.raises(ValueError, match="prefix_source"):
        make_policy("prefixshield", 8, prefix_source="conversation")


PATHS = [dict(batched=False), dict(fused=False), dict()]
"""The engine's three paths: step by step, batched per step, the fused loop."""


def _chunked_run(path: dict, **flags):
    """One 64-token prompt (4 blocks) prefilled in two 32-token chunks, decoding 40 tokens (2
    more full blocks), then a second request with the same first block but its own declared
    prefix_id."""
    trace = make_trace([
        dict(arrival_s=0.0, prefix_id=1, output_tokens=40, segment_ids=[1],
             segment_lengths=[64]),
        dict(arrival_s=30.0, prefix_id=2, output_tokens=1, segment_ids=[1, 2],
             segment_lengths=[16, 40]),
    ])
    return Engine(trace, make_policy("prefixshield", 64, **flags),
                  load_profile("l4-qwen2.5-1.5b").cost,
                  EngineConfig(num_blocks=64, max_num_batched_tokens=32, check_invariants=True),
                  **path).run()


@pytest.mark.parametrize("path", PATHS)
def test_engine_keeps_a_requests_class_across_chunks_and_decode(path):
    by_request = _chunked_run(path).policy_stats["cached_blocks"]["g0"]
    # request 0: 4 prompt + 2 decode blocks, all of its first admission: PROBATIONARY; request 1
    # (same root: the same logical prefix) hits block 0 (promoted to REUSE) and adds 2 blocks,
    # funded: NORMAL
    assert by_request == {"probationary": 5, "normal": 2, "reuse": 1}
    per_call = _chunked_run(path, admission="call").policy_stats["cached_blocks"]["g0"]
    # per call: request 0's second chunk and its decode blocks find the prefix admitted
    assert per_call == {"probationary": 1, "normal": 6, "reuse": 1}
    declared = _chunked_run(path, prefix_source="declared").policy_stats["cached_blocks"]["g0"]
    # request 1's declared id is new: a first admission, and its hit is not its prefix's
    assert declared == {"probationary": 8, "normal": 0, "reuse": 0}
