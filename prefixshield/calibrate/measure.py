"""Measure engine step times on a real vLLM and record the cost-model features of each step.

Besides the steps, every measured request's ``add_request`` call is timed: an in-process engine
processes a request's input serially before the next step, which the cost model charges as
``e`` seconds per new request.

Every sample is the median of repeated ``LLMEngine.step()`` calls timed on the wall clock, with
the features the cost model uses: prefill tokens computed, sequences decoding one token, and KV context tokens attended.
Prefill samples put ``k`` requests of ``cached + new`` tokens into one step, where the first
``cached`` tokens were cached beforehand by a warm-up request (so only ``new`` are computed);
decode samples time ``decode_steps`` pure-decode steps of a batch of ``b`` requests with
``c``-token prompts and keep their median (one sample per point, like the prefill points).

The engine runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) with token-id prompts and
``skip_tokenizer_init=True``, so any model directory works, random weights included: step time
depends on a model's shapes, not its values. Greedy decoding with forced output lengths
(``min_tokens = max_tokens``, ``ignore_eos``) keeps every run the same length.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class CalibrationGrid:
    """What to measure. Token counts are multiples of the block size where they are prefixes.

    Attributes:
        prefill_new_tokens: tokens computed per request in prefill samples.
        prefill_cached_tokens: prefix-cache hit per request in prefill samples.
        prefill_batch: requests per prefill step.
        decode_batch: sequences per decode step.
        decode_context: prompt tokens of each decoding sequence.
        decode_steps: timed decode steps per (batch, context) point (their median is kept).
        repeats: repetitions of every prefill point (the median is kept).
    """

    prefill_new_tokens: tuple[int, ...] = (64, 256, 1024)
    prefill_cached_tokens: tuple[int, ...] = (0, 512, 1536)
    prefill_batch: tuple[int, ...] = (1, 4)
    decode_batch: tuple[int, ...] = (1, 4, 16)
    decode_context: tuple[int, ...] = (128, 1024)
    decode_steps: int = 6
    repeats: int = 3

    def describe(self) -> str:
        """The grid in one line (for a profile's provenance)."""
        return (f"prefill new {list(self.prefill_new_tokens)} x cached "
                f"{list(self.prefill_cached_tokens)} x batch {list(self.prefill_batch)}, decode "
                f"batch {list(self.decode_batch)} x context {list(self.decode_context)}")

    @classmethod
    def quick(cls) -> "CalibrationGrid":
        """A small grid (``calibrate --quick``; seconds on the tiny CPU model)."""
        return cls(prefill_new_tokens=(64, 256), prefill_cached_tokens=(0, 512),
                   prefill_batch=(1, 2), decode_batch=(1, 4), decode_context=(128, 512),
                   decode_steps=4, repeats=2)

    @classmethod
    def for_validation(cls) -> "CalibrationGrid":
        """The grid ``validate --calibrate`` measures right before its replay: small enough
        for the validation engine's pool (points that do not fit are skipped) and spanning the
        shapes a validation workload schedules."""
        return cls(prefill_new_tokens=(32, 128, 512), prefill_cached_tokens=(0, 256, 512),
                   prefill_batch=(1, 2), decode_batch=(1, 4, 8, 16),
                   decode_context=(64, 256, 512), decode_steps=16, repeats=3)


@dataclass
class StepSample:
    """One timed step: features and wall seconds."""

    kind: str
    prefill_tokens: int
    decode_seqs: int
    context_tokens: int
    seconds: float


@dataclass
class Measurement:
    """All samples plus the facts of the engine that produced them."""

    samples: list[StepSample]
    facts: dict = field(default_factory=dict)
    add_request_s: list[float] = field(default_factory=list)
    """Wall seconds of each ``add_request`` call of a measured request (input processing)."""

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Design matrix ``[1, prefill_tokens, decode_seqs, context_tokens]`` and step seconds."""
        x = np.array([[1.0, s.prefill_tokens, s.decode_seqs, s.context_tokens]
                      for s in self.samples])
        y = np.array([s.seconds for s in self.samples])
        return x, y


class _Driver:
    """An in-process vLLM engine (the live mode's, native block pool) plus timed steps."""

    def __init__(self, model_dir: str, block_size: int, num_blocks: int, max_num_seqs: int,
                 max_num_batched_tokens: int, dtype: str, live=None) -> None:
        from vllm import SamplingParams

        from prefixshield.live.engine import LiveEngine, LiveEngineConfig

        # Same engine set-up as `prefixshield validate` (threads, binding, CPU work-arounds), so
        # a profile measured here describes the engine the validation replays against.
        self.owned = live is None
        self.live = live if live is not None else LiveEngine(LiveEngineConfig(
            model_dir=model_dir, num_blocks=num_blocks, block_size=block_size,
            max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
            dtype=dtype))
        self._sampling = SamplingParams
        self.engine = self.live.engine
        self._ids = itertools.count()
        self._vocab = int(self.live.config.model_config().get("vocab_size", 1000))
        self._rng = np.random.default_rng(0)

    def fresh_tokens(self, n: int) -> list[int]:
        """``n`` random token ids: a new prompt shares no full block with earlier ones."""
        return self._rng.integers(0, self._vocab, size=n).tolist()

    def add(self, prompt: list[int], output_tokens: int) -> float:
        """Submit a request; returns the seconds ``add_request`` took (input processing)."""
        rid = f"cal{next(self._ids)}"
        params = self._sampling(max_tokens=output_tokens, min_tokens=output_tokens,
                                ignore_eos=True, temperature=0.0)
        t0 = time.perf_counter()
        self.engine.add_request(rid, {"prompt_token_ids": prompt}, params)
        return time.perf_counter() - t0

    def timed_step(self) -> float:
        t0 = time.perf_counter()
        self.engine.step()
        return time.perf_counter() - t0

    def drain(self) -> None:
        while self.engine.has_unfinished_requests():
            self.engine.step()


def _blocks(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size) + 1  # ceil, plus the block a next token may open


def measure_step_times(model_dir: str | None = None, block_size: int = 32,
                       num_blocks: int = 2048, grid: CalibrationGrid = CalibrationGrid(),
                       dtype: str = "float32", max_num_seqs: int = 64,
                       max_num_batched_tokens: int = 8192, progress=None,
                       live=None) -> Measurement:
    """Time prefill and decode steps of a real vLLM engine over ``grid``.

    Grid points the engine cannot hold at once (more KV blocks than ``num_blocks - 1``, more
    sequences than ``max_num_seqs``, a prefill batch over ``max_num_batched_tokens``) are
    skipped.

    Args:
        model_dir: a model directory (e.g. from ``write_tiny_model``); unused with ``live``.
        block_size: KV block size in tokens (CPU attention needs a multiple of 32).
        num_blocks: KV blocks for the engine.
        grid: the measurement grid.
        dtype: model dtype for vLLM ("auto", "float32", "bfloat16").
        progress: optional callable ``progress(done, total)``.
        live: measure on this [`LiveEngine`][prefixshield.live.engine.LiveEngine] (left open, its
            prefix cache holding the calibration's blocks until the next replay resets it)
            instead of starting one; its own engine settings then apply.
    """
    if live is not None:
        facts = live.facts()
        block_size, num_blocks = facts["block_size"], facts["num_gpu_blocks"]
        max_num_seqs = facts["max_num_seqs"]
        max_num_batched_tokens = facts["max_num_batched_tokens"]
    elif model_dir is None:
        raise ValueError("measure_step_times needs model_dir or live")
    usable = num_blocks - 1
    points = [(n, c, k) for n in grid.prefill_new_tokens for c in grid.prefill_cached_tokens
              for k in grid.prefill_batch if k * (n + c) <= max_num_batched_tokens
              and k <= max_num_seqs and k * _blocks(n + c, block_size) <= usable]
    decode_points = [(b, c) for b in grid.decode_batch for c in grid.decode_context
                     if b <= max_num_seqs
                     and b * _blocks(c + grid.decode_steps + 2, block_size) <= usable]
    driver = _Driver(model_dir, block_size, num_blocks, max_num_seqs, max_num_batched_tokens,
                     dtype, live=live)
    samples: list[StepSample] = []
    add_times: list[float] = []
    total = len(points) * grid.repeats + len(decode_points)
    done = 0
    # warm-up: the first steps of an engine are slower (allocator, caches)
    for _ in range(3):
        driver.add(driver.fresh_tokens(64), 2)
        driver.drain()
    for new, cached, k in points:
        times = []
        for rep in range(grid.repeats + 1):
            prompts = []
            for _j in range(k):
                prefix = driver.fresh_tokens(cached)
                if cached:
                    driver.add(prefix + driver.fresh_tokens(block_size), 1)  # caches the prefix
                    driver.drain()
                prompts.append(prefix + driver.fresh_tokens(new))
            added = [driver.add(p, 1) for p in prompts]
            seconds = driver.timed_step()
            driver.drain()
            if rep == 0:
                continue  # the first step of a new shape pays one-time costs: not a sample
            times.append(seconds)
            add_times.extend(added)
            done += 1
            if progress:
                progress(done, total)
        samples.append(StepSample("prefill", k * new, 0, k * (cached + new),
                                  float(np.median(times))))
    for b, c in decode_points:
        for _j in range(b):
            driver.add(driver.fresh_tokens(c), grid.decode_steps + 2)
        # the prefill of all b prompts, then one decode step to settle
        while _prefilling(driver):
            driver.engine.step()
        driver.engine.step()
        times = [driver.timed_step() for _ in range(grid.decode_steps)]
        # One sample per point, the median step (a stray slow step on a shared machine must not
        # pull the fit); context attended by each sequence: prompt + generated so far (+ this
        # token), at the middle of the timed steps.
        ctx = b * (c + 2) + b * (grid.decode_steps - 1) // 2
        samples.append(StepSample("decode", 0, b, ctx, float(np.median(times))))
        driver.drain()
        done += 1
        if progress:
            progress(done, total)
    facts = driver.live.facts()
    if driver.owned:
        driver.live.close()
    return Measurement(samples, facts, add_times)


def _prefilling(driver: _Driver) -> bool:
    sched = driver.live.scheduler
    return any(r.num_computed_tokens < r.num_prompt_tokens for r in sched.running) or \
        bool(len(sched.waiting))


