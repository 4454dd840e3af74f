"""The live mode's forced output ids are the simulator's own output tokens, row for row.

The live engine is told to generate :func:`prefixshield.live.forcing.output_token_ids`;
multi-turn agreement with vLLM rests on those being exactly the ids the simulator hashes into
its decode blocks."""

from __future__ import annotations

import numpy as np
import pytest

from prefixshield.policies import make_policy
from prefixshield.simulator.config import EngineConfig
from prefixshield.simulator.costmodel import CostModel
from prefixshield.simulator.engine import Engine
from prefixshield.live.forcing import output_token_ids
from prefixshield.workloads import generate

COST = CostModel(a_s=1e-3, b_s_per_prefill_token=5e-6, c_s_per_decode_seq=2e-4,
                 d_s_per_context_token=1e-8)


@pytest.mark.parametrize("workload,params", [
    ("sharegpt", dict(max_conversation_tokens=1024, system_prompt_tokens=64, warmup_s=0,
                      duration_s=20, base_rate=3.0)),
    ("one_touch", dict(prefix_tokens=256, hot_fraction=0.5, duration_s=4, base_rate=4.0)),
])
def test_forced_ids_equal_the_simulated_output_tokens(workload, params):
    trace = generate(workload, num_blocks=64, block_size=32, seed=3, **params)
    df = trace.requests
    assert (df["output_segment_id"] >= 0).any() == (workload == "sharegpt")
    engine = Engine(trace, make_policy("lru", 64), COST, EngineConfig(num_blocks=64,
                                                                        block_size=32),
                    batched=False)  # the oracle path; the batched one is held to it elsewhere
    for i, row in enumerate(df.itertuples(index=False)):
        seq = engine._make_sequence(i)
        want = output_token_ids(trace.seed, i, int(row.output_segment_id),
                                int(row.output_tokens), trace.vocab_size)
        got = np.asarray(seq.token_ids[seq.num_prompt_tokens:])
        np.testing.assert_array_equal(got, want, err_msg=f"row {i}")


def test_a_later_turn_quotes_the_earlier_turns_forced_output():
    """In ``sharegpt`` turn k+1's prompt contains turn k's output segment, so the ids the live
    model is forced to generate for turn k reappear in turn k+1's prompt."""
    from prefixshield.traces.tokens import prompt_token_ids

    trace = generate("sharegpt", num_blocks=64, block_size=32, seed=3,
                     max_conversation_tokens=1024, system_prompt_tokens=64, warmup_s=0,
                     duration_s=20, base_rate=3.0)
    df = trace.requests
    quoted = 0
    for i, row in enumerate(df.itertuples(index=False)):
        seg = int(row.output_segment_id)
        later = [j for j in range(i + 1, len(df)) if seg in list(df["segment_ids"].iloc[j])]
        if not later:
            continue
        j = later[0]
        out = output_token_ids(trace.seed, i, seg, int(row.output_tokens), trace.vocab_size)
        prompt = prompt_token_ids(trace.seed, df["segment_ids"].iloc[j],
                                  df["segment_lengths"].iloc[j], trace.vocab_size)
        k = list(df["segment_ids"].iloc[j]).index(seg)
        start = int(np.sum(df["segment_lengths"].iloc[j][:k]))
        np.testing.assert_array_equal(prompt[start:start + len(out)], out)
        quoted += 1
    assert quoted > 0
