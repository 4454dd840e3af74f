"""Forced output content: the live engine emits exactly the token ids the simulator generates.

A later turn of a multi-turn trace quotes the earlier turn's output (its prompt holds the
earlier row's ``output_segment_id``), so decode-block reuse is only comparable between the two
worlds when the live model *generates* those same ids. The simulator's output tokens of row
``i`` are segment ``output_segment_id[i]`` under the trace seed, or, when that id is negative,
segment ``i`` under ``seed ^ OUTPUT_SEED_SALT`` (`output_token_ids` builds both, and
``tests/live/test_forcing.py`` holds it to the engine's own sequences).

`ForcedOutputLogitsProcessor` is a vLLM v1 logits processor (installed with
``LLM(logits_processors=[ForcedOutputLogitsProcessor])``): a request whose
``SamplingParams.extra_args`` carries ``prefixshield_forced_output`` (a list of token ids) gets,
at output position ``p``, every logit set to ``-inf`` except ``forced[p]`` (set to 0), so greedy
sampling picks it. It runs after vLLM's built-in processors (vLLM orders custom ones last) and
before penalties, which the live replay does not use.
"""

from __future__ import annotations

import numpy as np

from prefixshield.traces.tokens import prompt_token_ids

EXTRA_FORCED_OUTPUT = "prefixshield_forced_output"
"""``SamplingParams.extra_args`` key of the token ids a request must generate, in order."""


def output_token_ids(trace_seed: int, row: int, output_segment_id: int, output_tokens: int,
                     vocab_size: int) -> np.ndarray:
    """The ``output_tokens`` ids (int64) the simulator has row ``row`` generate.

    Args:
        trace_seed: the trace's token seed.
        row: the request's row index in the trace (its simulator request id).
        output_segment_id: the row's ``output_segment_id`` (-1: ids unique to the row).
        output_tokens: how many tokens it generates.
        vocab_size: the trace's vocabulary bound.
    """
    from prefixshield.simulator.engine import OUTPUT_SEED_SALT

    if output_segment_id >= 0:
        return prompt_token_ids(trace_seed, [output_segment_id], [output_tokens], vocab_size)
    return prompt_token_ids(trace_seed ^ OUTPUT_SEED_SALT, [row], [output_tokens], vocab_size)


def make_processor_class():
    """The `ForcedOutputLogitsProcessor` class (built on first use: it subclasses vLLM's
    ``LogitsProcessor``, so importing this module does not import vLLM)."""
    global ForcedOutputLogitsProcessor
    if ForcedOutputLogitsProcessor is not None:
        return ForcedOutputLogitsProcessor
    import torch
    from vllm.v1.sample.logits_processor import LogitsProcessor
    from vllm.v1.sample.logits_processor.builtin import process_dict_updates

    class _ForcedOutputLogitsProcessor(LogitsProcessor):
        """Forces each opted-in request's next token to its ``prefixshield_forced_output``
        entry at the current output position (see the module docstring)."""

        @classmethod
        def validate_params(cls, sampling_params) -> None:
            forced = (sampling_params.extra_args or {}).get(EXTRA_FORCED_OUTPUT)
            if forced is None:
                return
            if not isinstance(forced, (list, tuple)) or not all(
                    isinstance(t, int) and t >= 0 for t in forced):
                raise ValueError(f"extra_args[{EXTRA_FORCED_OUTPUT!r}] must be a list of "
                                 "non-negative token ids")
            if sampling_params.max_tokens is not None and sampling_params.max_tokens > len(forced):
                raise ValueError(f"max_tokens {sampling_params.max_tokens} exceeds the "
                                 f"{len(forced)} forced output tokens")

        def __init__(self, vllm_config, device, is_pin_memory: bool) -> None:
            # batch index -> (forced ids, the request's live output-token list)
            self.entries: dict[int, tuple[list[int], list[int]]] = {}
            self.device = device

        def is_argmax_invariant(self) -> bool:
            return False  # it decides the greedy token

        def update_state(self, batch_update) -> None:
            def new_state(params, _prompt_ids, output_ids):
                forced = (params.extra_args or {}).get(EXTRA_FORCED_OUTPUT) if params else None
                return None if forced is None else (list(forced), output_ids)

            process_dict_updates(self.entries, batch_update, new_state)

        def apply(self, logits: "torch.Tensor") -> "torch.Tensor":
            if not self.entries:
                return logits
            rows, toks = [], []
            for index, (forced, output_ids) in self.entries.items():
                # The output list is vLLM's running one: its length is the position of the token
                # sampled now (a partial-prefill row samples position 0, which vLLM discards).
                pos = len(output_ids)
                if pos < len(forced):
                    rows.append(index)
                    toks.append(forced[pos])
            if rows:
                r = torch.tensor(rows, dtype=torch.long, device=logits.device)
                t = torch.tensor(toks, dtype=torch.long, device=logits.device)
                logits[r] = float("-inf")
                logits[r, t] = 0.0
            return logits

    _ForcedOutputLogitsProcessor.__name__ = "ForcedOutputLogitsProcessor"
    _ForcedOutputLogitsProcessor.__qualname__ = "ForcedOutputLogitsProcessor"
    ForcedOutputLogitsProcessor = _ForcedOutputLogitsProcessor
    return ForcedOutputLogitsProcessor


ForcedOutputLogitsProcessor = None
"""The processor class once `make_processor_class` has built it (None before)."""
