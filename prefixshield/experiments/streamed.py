"""``prefixshield run --stream``: a run whose memory does not grow with its trace.

The trace comes as a `TraceStream` (a trace file read in row
batches, or a workload generated in windows of time,
`stream_attack`) and each policy's run is a
`StreamedRun` writing into the staged output folder as it
goes ([`staged`][prefixshield.experiments.single.staged]: nothing half-written under ``--out``).

The folder holds what an unstreamed run writes where the files can be written a chunk at a time
-- ``config.json``, ``summary.csv`` (the same figures, bit for bit), per policy
``records.parquet``, ``occupancy.parquet``, ``held.parquet``, ``evictions.csv``,
``policy_stats.json`` -- plus ``creations.parquet`` (the creation log, which the summary reads).
Not written: ``trace.parquet`` (the trace file itself, or the generator's parameters in
``config.json``, which give the same rows), ``groups.csv`` (per-group percentiles of every
group) and the comparison figure.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

from prefixshield.atomic import write_text
from prefixshield.experiments.overrides import parse_policy_spec
from prefixshield.experiments.single import (RunSpec, _jsonable, config_record, is_trace_file,
                                             label_dir, put_run_tables, resolve_params, staged,
                                             summary_table)
from prefixshield.policies import make_policy
from prefixshield.simulator.engine import EngineError
from prefixshield.simulator.stream import StreamedResult, run_streamed
from prefixshield.traces.stream import TraceStream


def build_stream(spec: RunSpec) -> tuple[TraceStream, dict]:
    """The trace of ``spec`` as a stream, and how it was obtained (for ``config.json``).

    Raises:
        ValueError: what cannot stream (one line: a fleet, a rescaled file, a scheduler other
            than FCFS without limits, a workload generated whole).
    """
    if spec.fleet is not None:
        raise ValueError("--stream runs one engine; a fleet (--replicas) is not streamed")
    if spec.scale_to_load is not None:
        raise ValueError("--stream: --scale-to-engine rescales a whole trace in memory; "
                         "rescale the file first")
    if is_trace_file(spec.workload):
        from prefixshield.traces.io import stream_trace

        stream, info = stream_trace(spec.workload), {"trace_file": str(spec.workload),
                                                     "streamed": True}
    else:
        from prefixshield.workloads.attack import stream_attack

        params, info = resolve_params(spec)
        stream, info = stream_attack(spec.workload, params), {**info, "streamed": True}
    # as build_trace refuses it, before anything is written (one chunk read)
    if next(stream.rows(), None) is None:
        raise ValueError(f"{spec.workload}: the trace has no requests; nothing to simulate")
    return stream, info


def _any_measured(records: Path) -> bool:
    """Whether a streamed run's records file holds a measured request (one column, a row
    group at a time)."""
    import pyarrow.parquet as pq

    batches = pq.ParquetFile(records).iter_batches(columns=["measured"])
    return any(b.column(0).to_numpy(zero_copy_only=False).any() for b in batches)


def run_streamed_outputs(out_dir: str | Path, spec: RunSpec, stream: TraceStream, info: dict,
                         on_done: Callable[[str, StreamedResult], None] | None = None,
                         failures: dict[str, str] | None = None) -> dict[str, StreamedResult]:
    """Run every policy of ``spec`` on ``stream`` into ``out_dir`` (staged, swapped in at the
    end); returns the results by policy label (their ``summary`` set). A policy that cannot
    serve the trace is recorded in ``failures`` (its folder removed) and the others run."""
    failures = {} if failures is None else failures
    results: dict[str, StreamedResult] = {}
    with staged(out_dir) as stage:
        write_text(stage / "config.json", json.dumps(config_record(spec, info), indent=2,
                                                     default=_jsonable) + "\n")
        for label in spec.policies:
            name, kwargs = parse_policy_spec(label)
            folder = stage / label_dir(label)
            policy = make_policy(name, spec.engine.num_blocks,
                                 vllm_compat=spec.engine.vllm_compat, **kwargs)
            try:
                result = run_streamed(stream, policy, spec.profile.cost, spec.engine, folder,
                                      contracts=spec.contract_table)
            except EngineError as e:
                shutil.rmtree(folder, ignore_errors=True)
                failures[label] = str(e)
                continue
            if not results and not _any_measured(result.files["records"]):
                # build_trace's refusal, known once the whole stream has gone by; the staged
                # folder is dropped and --out left as it was
                raise ValueError(f"{spec.workload}: no request of the trace is measured (all "
                                 "warm-up); no hit ratio or TTFT could be judged")
            put_run_tables(lambda n, text: write_text(stage / n, text), label_dir(label),
                           result)
            results[label] = result
            if on_done is not None:
                on_done(label, result)
        write_text(stage / "summary.csv", summary_table(
            {p: r.summary for p, r in results.items()}, failures).to_csv(index=False))
    return results
