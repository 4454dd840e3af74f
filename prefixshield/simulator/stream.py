"""Streamed runs: a trace fed to the fused loop a window of rows at a time, its outputs written
out as they become final, so that memory does not grow with the trace's length.

An unstreamed run ([`Engine.run`][prefixshield.simulator.engine.Engine.run]) holds the
whole trace, every per-request array of the engine (``_state``, ``first_token_s``, ...,
``block_s``, the flat segments), the records frame and time series that grow with the run.
`StreamedRun` runs the same fused loop (`run_loop`,
whose code is unchanged) over a `Window` of consecutive rows: the oldest request still
waiting or running, every row after it, and up to `StreamedRun.window_rows` further
arrivals. The window's arrays are indexed from 0 (row ``base`` of the trace is index 0), so
the kernel sees a short trace; when an arrival reaches the window's end
(`NEED_WINDOW`) the window slides:

* the rows before the new oldest live request are finished: their record fields are final,
  and they go to the sink (`RunFiles`, ``records.parquet``);
* the rows kept are copied to the front of new arrays (their block tables and hashes with
  them) and the next rows of the source are appended, their hashes built
  (`build_hashes` with ``row_base``: a request without
  an output segment draws its output tokens from its row in the whole trace);
* every row id the loop holds (``NEXT_ARRIVAL``, the running order, the waiting ring) is
  rebased by the same shift. The loop reads a request's arrays only between its arrival and
  its end, so the run is the one an unstreamed run makes, bit for bit (tested for the four
  fused policies, with preemptions and with ``check_invariants``).

The window holds one row past ``ctl[WINDOW_END]`` while the source has more (the arrival
process reads the next arrival's time before it is due), and ``ctl[N]`` is the trace's length
once the source is exhausted, else any number past the window.

The time series are spilled at each slide and each buffer enlargement: occupancy and held
blocks (keeping their last row, which the loop compares against) and the creation log, to
``occupancy.parquet``, ``held.parquet`` (the long form of
[`occupancy_frame`][prefixshield.simulator.metrics.occupancy_frame]) and ``creations.parquet``.
PrefixShield's debt log stays in memory: it is bounded already (``max_debt_samples``).

What stays in memory is the pool, the policy's state, the window (live requests and the next
arrivals: a backlog that grows holds more rows, as it holds more requests) and one chunk of
each series. `summarize_files` then computes `summarize`'s
figures from the files, one column of the judged population at a time (exact
means and quantiles need the column whole: 8 bytes per request, after the run), and the
attacker's creation figures a row group at a time.

Streaming takes the fused loop only (a scheduler with a compiled form, one of the four fused
policies, the linear cost model; the scheduler's lists are rebased with the window,
`prefixshield.scheduling.kernels.rebase`): anything else raises
[`EngineError`][prefixshield.simulator.engine.EngineError].

Units: seconds, tokens, blocks, as the engine's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Mapping

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from prefixshield.parquetfiles import read_frame
from prefixshield.policies.base import Policy
from prefixshield.scheduling import kernels as sk
from prefixshield.scheduling.config import capped_outputs
from prefixshield.scheduling.registry import make_scheduler
from prefixshield.simulator import batch as bk
from prefixshield.simulator import fused as fz
from prefixshield.simulator.config import EngineConfig
from prefixshield.simulator.costmodel import CostModel
from prefixshield.simulator.creation import group_creation_chunks
from prefixshield.simulator.engine import (OUTPUT_SEED_SALT, Engine, EngineError, RunResult,
                                           _index_of, check_block_limits, check_fits,
                                           init_request_arrays)
from prefixshield.simulator.metrics import summary_of
from prefixshield.simulator.records import build_records
from prefixshield.tenancy import DEFAULT_CONTRACTS, Contract
from prefixshield.traces.schema import Trace, offsets_of
from prefixshield.traces.stream import TraceStream

STREAM_WINDOW_ROWS = 1 << 16
"""New arrivals a window takes at each slide; any number gives the same run. Smaller windows
hold less (a window's rows, their records frame and Arrow table exist at once) and cost a
slide's Python more often."""

_ROW_COLUMNS = ("request_id", "arrival_s", "group_id", "contract_id", "role", "prefix_id",
                "measured", "output_tokens", "output_segment_id", "prompt_tokens")


class Window:
    """Per-request arrays of consecutive trace rows ``base .. base + len - 1``, under the
    engine's names (what `Engine._fused_call` and `build_records` read).

    The loop's state (``_state``, ``first_token_s`` .. ``block_s``, ``materialized``,
    ``held_since``) starts as an unstreamed engine's does; ``trace.requests`` holds the three
    columns the records copy from the trace (``request_id``, ``role``, ``measured``).
    """

    def __init__(self, cols: dict[str, np.ndarray], seg_ids: np.ndarray, seg_lens: np.ndarray,
                 seg_offsets: np.ndarray, base: int, groups: list[str],
                 contracts: list[str]) -> None:
        self.base = base
        self.groups, self.contracts = groups, contracts
        self.cols = cols
        for name, col in cols.items():
            setattr(self, name, col)
        self._seg_ids_flat, self._seg_lens_flat, self._seg_offsets = seg_ids, seg_lens, seg_offsets
        n = len(cols["arrival_s"])
        self.trace = SimpleNamespace(requests=pd.DataFrame(
            {"request_id": cols["request_id"], "role": cols["role"],
             "measured": cols["measured"]}, copy=False))
        self._state = np.zeros((n, bk.NUM_FIELDS), dtype=np.int64)
        self._state[:, bk.PROMPT] = self.prompt_tokens
        self._state[:, bk.OUTPUT_TOTAL] = self.output_tokens
        self._state[:, bk.ADMISSION] = -1
        init_request_arrays(self, n)
        self.materialized = np.zeros(n, dtype=np.int64)
        self.held_since = np.zeros(n, dtype=np.float64)

    STATE = ("_state", "first_token_s", "finish_s", "cached_tokens", "num_preemptions",
             "num_new_blocks", "admitted_s", "arrival_cached_tokens", "block_s", "materialized",
             "held_since")
    """The loop's per-request state, carried from window to window."""

    def __len__(self) -> int:
        return len(self.arrival_s)

    @classmethod
    def of_chunks(cls, chunks: list["Window"], base: int) -> "Window":
        """The rows of ``chunks`` one after another (fresh state), the first being row
        ``base``."""
        cols = {k: np.concatenate([c.cols[k] for c in chunks]) for k in chunks[0].cols}
        ids = np.concatenate([c._seg_ids_flat for c in chunks])
        lens = np.concatenate([c._seg_lens_flat for c in chunks])
        counts = np.concatenate([np.diff(c._seg_offsets) for c in chunks])
        return cls(cols, ids, lens, offsets_of(counts), base, chunks[0].groups,
                   chunks[0].contracts)

    def rows(self, lo: int, hi: int) -> "Window":
        """Rows ``lo .. hi-1`` (fresh state)."""
        s0, s1 = int(self._seg_offsets[lo]), int(self._seg_offsets[hi])
        return Window({k: v[lo:hi] for k, v in self.cols.items()}, self._seg_ids_flat[s0:s1],
                      self._seg_lens_flat[s0:s1], self._seg_offsets[lo:hi + 1] - s0,
                      self.base + lo, self.groups, self.contracts)

    def carry_state(self, old: "Window", shift: int) -> None:
        """Take the loop's state of ``old``'s rows from ``shift`` on (the first rows here)."""
        k = len(old) - shift
        for name in self.STATE:
            getattr(self, name)[:k] = getattr(old, name)[shift:]


def window_of(trace: Trace, groups: list[str], contracts: list[str], base: int,
              limits=None) -> Window:
    """A chunk's rows as a `Window` (group and contract ids into the whole trace's
    names), the first being trace row ``base``; ``limits``: the scheduler's per-group limits,
    whose output caps apply (`capped_outputs`, as the engine's)."""
    df = trace.requests
    seg = trace.segments()
    summed = np.zeros(seg.lengths.shape[0] + 1, dtype=np.int64)
    np.cumsum(seg.lengths, out=summed[1:])
    cols = {
        "request_id": df["request_id"].to_numpy(np.int64),
        "arrival_s": df["arrival_s"].to_numpy(np.float64),
        "group_id": _index_of(df["group"], groups),
        "contract_id": _index_of(df["contract"], contracts),
        "role": df["role"].astype(str).to_numpy(dtype=object),
        "prefix_id": df["prefix_id"].to_numpy(np.int64),
        "measured": df["measured"].to_numpy(bool),
        "output_tokens": df["output_tokens"].to_numpy(np.int64),
        "output_segment_id": df["output_segment_id"].to_numpy(np.int64),
        "prompt_tokens": summed[seg.offsets[1:]] - summed[seg.offsets[:-1]],
    }
    if limits is not None:
        cols["output_tokens"] = capped_outputs(limits, cols["group_id"], cols["output_tokens"])
    return Window(cols, seg.ids, seg.lengths, seg.offsets, base, groups, contracts)


class _Feed:
    """The stream's rows as `Window` pieces, taken a number of rows at a time; each
    piece checked to fit the pool (`check_fits`, naming the row)."""

    def __init__(self, stream: TraceStream, config: EngineConfig) -> None:
        self.stream, self.config = stream, config
        # the scheduler's per-tenant limits, as the engine's (a gateway's output caps, the
        # block limit every request must fit under)
        self.limits = make_scheduler(config.scheduler, stream.groups, np.zeros(0),
                                     np.zeros(0, dtype=np.int64)).limits
        self.it = stream.rows()
        self.buf: list[Window] = []
        self.buffered = 0
        self.done = False
        self.first: Trace | None = None   # the first chunk with rows (it builds the engine)

    def _read(self) -> None:
        try:
            base, chunk = next(self.it)
        except StopIteration:
            self.done = True
            return
        s = self.stream
        w = window_of(chunk, s.groups, s.contracts, base, self.limits)
        if self.first is None:
            self.first = chunk
        err = check_fits(self.config, w.prompt_tokens, w.output_tokens, w.request_id, base)
        if err is not None:
            raise err
        err = check_block_limits(self.limits, w.group_id, w.prompt_tokens + w.output_tokens,
                                 self.config.block_size, w.request_id, s.groups, base)
        if err is not None:
            raise err
        self.buf.append(w)
        self.buffered += len(w)

    def take(self, k: int) -> list[Window]:
        """The next ``k`` rows (fewer at the source's end) as pieces."""
        while self.buffered < k and not self.done:
            self._read()
        out, need = [], k
        while need > 0 and self.buf:
            w = self.buf[0]
            if len(w) <= need:
                out.append(self.buf.pop(0))
                need -= len(w)
            else:
                out.append(w.rows(0, need))
                self.buf[0] = w.rows(need, len(w))
                need = 0
        self.buffered -= k - need
        return out

    def exhausted(self) -> bool:
        """Whether every row has been taken."""
        while not self.buffered and not self.done:
            self._read()
        return self.done and not self.buffered


def _records_frame(window: Window, lo: int, hi: int) -> pd.DataFrame:
    """The records of the window's rows ``lo .. hi-1`` (final: those requests finished)."""
    part = SimpleNamespace(
        groups=window.groups, contracts=window.contracts,
        request_id=window.request_id[lo:hi].astype(np.int64, copy=False),
        role=window.trace.requests["role"].iloc[lo:hi].astype(str).to_numpy(),
        measured=window.measured[lo:hi].astype(bool, copy=False),
        **{k: getattr(window, k)[lo:hi] for k in (
            "arrival_s", "group_id", "contract_id", "prefix_id", "prompt_tokens",
            "cached_tokens", "num_new_blocks", "output_tokens", "first_token_s", "finish_s",
            "num_preemptions", "admitted_s", "arrival_cached_tokens", "block_s")})
    return build_records(part)


def _series_frame(t: np.ndarray, rows: np.ndarray, groups: list[str]) -> pd.DataFrame:
    """The long form of a series (`occupancy_frame`)."""
    return pd.DataFrame({"t_s": np.repeat(t, len(groups)),
                         "g": np.tile(np.asarray(groups, dtype=object), len(t)),
                         "blocks": rows.reshape(-1)}).rename(columns={"g": "group"})


class _ParquetOut:
    """One Parquet file written a frame at a time under a temporary name in its folder,
    renamed to its own at `close` (nothing half-written stands under the final name)."""

    def __init__(self, path: Path, empty: pd.DataFrame) -> None:
        self.path, self.empty = path, empty
        self.tmp = path.with_name(f".{path.name}.partial")
        self.writer: pq.ParquetWriter | None = None

    def write(self, df: pd.DataFrame) -> None:
        """Append ``df``'s rows (as ``df.to_parquet(index=False)`` writes them)."""
        if not len(df):
            return
        if self.writer is None:
            table = pa.Table.from_pandas(df, preserve_index=False)
            self.writer = pq.ParquetWriter(self.tmp, table.schema)
        else:
            table = pa.Table.from_pandas(df, schema=self.writer.schema, preserve_index=False)
        self.writer.write_table(table)

    def close(self) -> None:
        """Finish the file and give it its name (an empty file: the columns, no rows)."""
        if self.writer is None:
            self.empty.to_parquet(self.tmp, index=False)
        else:
            self.writer.close()
        os.replace(self.tmp, self.path)

    def abort(self) -> None:
        """Drop the partial file."""
        if self.writer is not None:
            self.writer.close()
        self.tmp.unlink(missing_ok=True)


class RunFiles:
    """Where a streamed run's growing outputs go, in ``folder``: ``records.parquet``,
    ``occupancy.parquet``, ``held.parquet`` (the files an unstreamed run writes, same
    columns) and ``creations.parquet`` (``t_s``, ``group``, ``contract`` ids, ``blocks``)."""

    NAMES = ("records", "occupancy", "held", "creations")

    def __init__(self, folder: str | os.PathLike, groups: list[str]) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.groups = groups
        none = np.empty(0)
        empty_records = _records_frame(_empty_window(groups), 0, 0)
        empty_series = _series_frame(none, np.empty((0, len(groups)), dtype=np.int64), groups)
        empty_cre = pd.DataFrame({"t_s": none, **{k: np.empty(0, dtype=np.int64) for k in (
            "group", "contract", "blocks")}})
        self.out = {
            "records": _ParquetOut(self.folder / "records.parquet", empty_records),
            "occupancy": _ParquetOut(self.folder / "occupancy.parquet", empty_series),
            "held": _ParquetOut(self.folder / "held.parquet", empty_series),
            "creations": _ParquetOut(self.folder / "creations.parquet", empty_cre)}

    def path(self, name: str) -> Path:
        """The final path of output ``name`` (one of `NAMES`)."""
        return self.out[name].path

    def records(self, df: pd.DataFrame) -> None:
        """Append finished requests' records."""
        self.out["records"].write(df)

    def series(self, name: str, t: np.ndarray, rows: np.ndarray) -> None:
        """Append rows (times, blocks per group) of series ``occupancy`` or ``held``."""
        self.out[name].write(_series_frame(t, rows, self.groups))

    def creations(self, t: np.ndarray, group: np.ndarray, contract: np.ndarray,
                  blocks: np.ndarray) -> None:
        """Append creation-log rows."""
        self.out["creations"].write(pd.DataFrame({"t_s": t, "group": group,
                                                  "contract": contract, "blocks": blocks}))

    def close(self) -> None:
        """Finish every file."""
        for out in self.out.values():
            out.close()

    def abort(self) -> None:
        """Drop every partial file."""
        for out in self.out.values():
            out.abort()


def _empty_window(groups: list[str]) -> Window:
    z = np.empty(0, dtype=np.int64)
    cols = {k: z for k in _ROW_COLUMNS}
    cols.update(arrival_s=np.empty(0), role=np.empty(0, dtype=object),
                measured=np.empty(0, dtype=bool))
    return Window(cols, z, z, np.zeros(1, dtype=np.int64), 0, groups, [])


@dataclass
class StreamedResult:
    """What a streamed run leaves in memory: its files and run-level figures.

    Attributes:
        files: the output paths by name (`RunFiles.NAMES`).
        groups, contracts: names by id; ``contract_rho`` / ``contract_beta``: refill
            (blocks/s) and burst (blocks) per contract.
        evictions: cached blocks reclaimed, ``[requesting group, owner group]``.
        num_steps, num_events: as `RunResult`'s; ``num_windows``: windows taken.
        policy_stats: the policy's counters at the end (PrefixShield's debt samples included).
        trace_meta: the trace's ``meta``; ``requests``: rows run.
    """

    files: dict[str, Path]
    groups: list[str]
    contracts: list[str]
    contract_rho: np.ndarray
    contract_beta: np.ndarray
    evictions: np.ndarray
    num_steps: int
    num_events: int
    num_windows: int
    policy_stats: dict
    trace_meta: dict
    requests: int = 0
    summary: dict = field(default_factory=dict)

    def load(self) -> RunResult:
        """The whole run as a `RunResult`, read back from the files (small runs:
        tests and comparisons; a long run's records do not fit in memory by design)."""
        rec = read_frame(self.files["records"])

        def series(name: str) -> tuple[np.ndarray, np.ndarray]:
            df = read_frame(self.files[name])
            g = len(self.groups)
            return (df["t_s"].to_numpy()[::g].copy() if g else np.empty(0),
                    df["blocks"].to_numpy().reshape(-1, g))

        occ_t, occ = series("occupancy")
        held_t, held = series("held")
        cre = read_frame(self.files["creations"])
        return RunResult(records=rec, groups=self.groups, occupancy_t=occ_t, occupancy=occ,
                         evictions=self.evictions, num_steps=self.num_steps,
                         num_events=self.num_events, policy_stats=self.policy_stats,
                         creations={k: cre[k].to_numpy() for k in cre.columns},
                         contracts=self.contracts, contract_rho=self.contract_rho,
                         contract_beta=self.contract_beta, trace_meta=self.trace_meta,
                         held_t=held_t, held=held)


class StreamedRun:
    """One engine replaying a `TraceStream` in windows (see the module docstring).

    Args:
        stream: the trace, in chunks.
        policy: a fresh policy sized ``config.num_blocks``: LRU, PrefixShield, StaticQuota or
            S3-FIFO (the fused loop's).
        cost: the linear [`CostModel`][prefixshield.simulator.costmodel.CostModel].
        config: the engine's settings (any scheduler the fused loop compiles).
        contracts: contract name -> entitlement.
        folder: where `RunFiles` writes.
        window_rows: new arrivals per window (`STREAM_WINDOW_ROWS`; tests force a few).
        coalesce_decode: as [`Engine`][prefixshield.simulator.engine.Engine]'s.

    Raises:
        EngineError: the run cannot stream (not the fused loop), or the trace cannot run.
    """

    def __init__(self, stream: TraceStream, policy: Policy, cost: CostModel,
                 config: EngineConfig, folder: str | os.PathLike,
                 contracts: Mapping[str, Contract] = DEFAULT_CONTRACTS,
                 window_rows: int = STREAM_WINDOW_ROWS, coalesce_decode: bool = True) -> None:
        if window_rows < 1:
            raise ValueError(f"window_rows must be >= 1, got {window_rows}")
        self.stream, self.config, self.folder = stream, config, Path(folder)
        self.window_rows = int(window_rows)
        self.feed = _Feed(stream, config)
        # the first row builds the engine (pool, policy bound to the whole trace's tenants,
        # the checks of the configuration); every row's arrays are the windows'
        if self.feed.exhausted():
            raise EngineError("a streamed run needs a trace with at least one request")
        one = Trace(self.feed.first.requests.iloc[:1].reset_index(drop=True), stream.seed,
                    stream.vocab_size, stream.tenants_meta())
        self.engine = Engine(one, policy, cost, config, contracts=contracts,
                             coalesce_decode=coalesce_decode)
        if not self.engine.fused_applies():
            raise EngineError(
                "a streamed run takes the fused loop: policy one of "
                f"{', '.join(Engine.FUSED_POLICIES)} (exactly the registered class), the "
                "linear cost model and a scheduler with a compiled form ("
                f"{', '.join(sk.FUSED_KINDS)}, exactly the registered class); got "
                f"policy {type(policy).__name__}, scheduler {config.scheduler.name}")
        cap = config.max_num_seqs + 1
        eng = self.engine
        eng._run_ids = np.zeros(cap, dtype=np.int64)
        eng._num_new = np.zeros(cap, dtype=np.int64)
        eng._finished = np.zeros(cap, dtype=np.int64)

    # ------------------------------------------------------------------ windows
    def _next_window(self, old: Window | None, shift: int) -> Window:
        """``old``'s rows from ``shift`` on, then the next rows of the source (at least one
        past the loop's window end while the source has more; the first window reaches past
        the arrivals at t = 0, which the loop's start appends at once)."""
        kept = [] if old is None else [old.rows(shift, len(old))]
        new = self.feed.take(self.window_rows + (1 if old is None else 0))
        if old is None:
            while new and new[-1].arrival_s[-1] <= 0.0 and not self.feed.exhausted():
                new += self.feed.take(self.window_rows)
        win = Window.of_chunks(kept + new, 0 if old is None else old.base + shift)
        if old is not None:
            win.carry_state(old, shift)
        return win

    def _hashes(self, win: Window, old: Window | None, shift: int, old_hashes: np.ndarray,
                old_table: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The window's ``hash_off``, ``table_off``, hashes and tables: those of the kept rows
        carried over from ``old``, the new rows' hashes built."""
        B = self.config.block_size
        total = win.prompt_tokens + win.output_tokens
        hash_off = offsets_of(total // B)
        table_off = offsets_of(-(-total // B) + 1)
        hashes = np.empty(int(hash_off[-1]), dtype=np.uint64)
        table = np.zeros(int(table_off[-1]), dtype=np.int32)
        built = 0
        if old is not None:
            built = len(old) - shift
            h0, t0 = int(self._hash_off[shift]), int(self._table_off[shift])
            hashes[:hash_off[built]] = old_hashes[h0:]
            table[:table_off[built]] = old_table[t0:]
        s = self.stream
        rows = (win._seg_ids_flat, win._seg_lens_flat, win._seg_offsets, win.output_segment_id,
                win.output_tokens, win.group_id)
        fz.build_hashes(np.int64(s.seed), np.int64(s.vocab_size),
                        np.int64(s.seed ^ OUTPUT_SEED_SALT), np.int64(self.config.hash_seed),
                        rows, np.int64(B), hash_off, hashes, np.int64(built),
                        np.int64(len(win)), np.int64(0), np.int64(win.base))
        self._hash_off, self._table_off = hash_off, table_off
        return hash_off, table_off, hashes, table

    def _bounds(self, ctl: np.ndarray, win: Window) -> None:
        """``ctl[N]`` and ``ctl[WINDOW_END]`` for the window (see the module docstring)."""
        n = len(win)
        last = self.feed.exhausted()
        ctl[fz.WINDOW_END] = n if last else n - 1
        ctl[fz.N] = n if last else n + 1
        ctl[fz.HASH_BASE] = ctl[fz.TABLE_BASE] = 0

    # ------------------------------------------------------------------ series
    def _spill(self, ctl: np.ndarray, series: tuple, files: RunFiles, final: bool) -> None:
        """Write out the series' rows (all but each series' last row, which the loop compares
        against, unless ``final``) and the creation log's."""
        occ_t, occ, cre_t, cre, held_t, held_rows = series
        for name, slot, t, rows in (("occupancy", fz.NUM_OCC, occ_t, occ),
                                    ("held", fz.NUM_HELD, held_t, held_rows)):
            k = int(ctl[slot])
            keep = 0 if final else 1
            if k - keep > 0:
                files.series(name, t[:k - keep], rows[:k - keep])
                if keep:
                    t[0], rows[0] = t[k - 1], rows[k - 1]
                ctl[slot] = keep
        k = int(ctl[fz.NUM_CRE])
        if k:
            files.creations(cre_t[:k].copy(), cre[0][:k].copy(), cre[1][:k].copy(),
                            cre[2][:k].copy())
            ctl[fz.NUM_CRE] = 0

    # ------------------------------------------------------------------ the run
    def run(self) -> StreamedResult:
        """Run the whole stream, writing the files (renamed into place at the end; on an
        error none is left). Returns the run-level figures; `summarize_files` gives its
        summary."""
        files = RunFiles(self.folder, self.stream.groups)
        try:
            result = self._run(files)
        except BaseException:
            files.abort()
            raise
        files.close()
        return result

    def _run(self, files: RunFiles) -> StreamedResult:
        eng = self.engine
        pool = eng.pool
        win = self._next_window(None, 0)
        ctl, fctl, pol = eng._fused_setup(len(win))
        log = pol[-1]
        self._bounds(ctl, win)
        hash_off, table_off, hashes, table = self._hashes(win, None, 0, None, None)
        waiting, sch = eng._fused_queue(len(win))
        scratch = eng._fused_scratch()
        G = pool.num_groups
        # the series' buffers: spilled whenever the loop asks for room, so a fixed size
        cap = 4 * min(self.window_rows, 1 << 16) + 4 * eng._run_ids.shape[0] + 1024
        occ_t, held_t = np.empty(cap), np.empty(cap)
        occ, held_rows = np.empty((cap, G), dtype=np.int64), np.empty((cap, G), dtype=np.int64)
        occ_t[0], occ[0] = eng._occ_t[0], eng._occ[0]
        held_t[0], held_rows[0] = eng._held_t[0], eng._held[0]
        ctl[fz.NUM_OCC] = ctl[fz.NUM_HELD] = 1
        cre_t = np.empty(cap)
        cre = [np.empty(cap, dtype=np.int64) for _ in range(3)]
        series = (occ_t, occ, cre_t, cre, held_t, held_rows)
        fz.start(ctl, fctl, win.arrival_s, win.group_id, waiting, sch)
        win.arrival_cached_tokens[:int(ctl[fz.NEXT_ARRIVAL])] = 0
        windows = 1
        while True:
            code = eng._fused_call(ctl, fctl, win, win.materialized, win.held_since, table,
                                   table_off, hashes, hash_off, (waiting, sch), scratch, pol,
                                   series)
            if code == fz.DONE:
                break
            if code == fz.CHECK:
                eng._fused_check(ctl, win._state, table, table_off, hashes, hash_off)
            elif code == fz.NEED_WINDOW:
                self._spill(ctl, series, files, False)
                shift = eng._oldest_live(ctl, (waiting, sch))
                files.records(_records_frame(win, 0, shift))
                old = win
                win = self._next_window(old, shift)
                hash_off, table_off, hashes, table = self._hashes(win, old, shift, hashes,
                                                                  table)
                waiting = _rebase(ctl, eng._run_ids, waiting, shift, len(win))
                sch = sk.rebase(sch, shift, len(win))
                self._bounds(ctl, win)
                windows += 1
            elif code == fz.GROW:
                self._spill(ctl, series, files, False)
                if log is not None:
                    log.reserve(max(log.t.shape[0], eng._run_ids.shape[0]))
            else:  # fz.NEVER_ADMITTED
                r = int(ctl[fz.ERR_REQUEST])
                raise eng.never_admitted_error(
                    int(win.request_id[r]), int(win.group_id[r]),
                    int(win.prompt_tokens[r] + win._state[r, bk.OUTPUT_DONE]))
        self._spill(ctl, series, files, True)
        files.records(_records_frame(win, 0, len(win)))
        pool.num_evicted_total += int(ctl[fz.NUM_EVICTED])
        table_of = eng._contract_table
        return StreamedResult(
            files={k: files.path(k) for k in RunFiles.NAMES}, groups=eng.groups,
            contracts=eng.contracts,
            contract_rho=np.array([c.rho_blocks_per_s for c in table_of]),
            contract_beta=np.array([c.beta_blocks for c in table_of]),
            evictions=pool.evictions.copy(), num_steps=int(ctl[fz.NUM_STEPS]),
            num_events=int(ctl[fz.NUM_EVENTS]), num_windows=windows,
            policy_stats=pool.policy.stats(), trace_meta=self.stream.meta,
            requests=win.base + len(win))


def _rebase(ctl: np.ndarray, run_ids: np.ndarray, waiting: np.ndarray, shift: int,
            rows: int) -> np.ndarray:
    """Row ids the loop holds, less ``shift`` (the window's first ``shift`` rows left it):
    the next arrival, the running order, the error slot, and the waiting ring, returned new
    (room for ``rows + 1``, its head at 0; the order is what matters)."""
    ctl[fz.NEXT_ARRIVAL] -= shift
    run_ids[:int(ctl[fz.NUM_RUNNING])] -= shift
    count, head = int(ctl[fz.WAIT_COUNT]), int(ctl[fz.WAIT_HEAD])
    ring = waiting[(head + np.arange(count)) % waiting.shape[0]] - shift
    new = np.empty(rows + 1, dtype=np.int64)
    new[:count] = ring
    ctl[fz.WAIT_HEAD] = 0
    return new


# ---------------------------------------------------------------------- the summary
def _population_kind(pf: pq.ParquetFile) -> tuple[bool, int]:
    """Whether the judged population is the measured victims, and its size."""
    victims = measured = 0
    for rg in range(pf.num_row_groups):
        t = pf.read_row_group(rg, columns=["measured", "role"]).to_pandas()
        m = t["measured"].to_numpy(bool)
        measured += int(m.sum())
        victims += int((m & (t["role"].to_numpy(dtype=object) == "victim")).sum())
    return victims > 0, victims if victims else measured


def _masks(pf: pq.ParquetFile, keep) -> list[np.ndarray]:
    """Per row group, the rows ``keep(frame of measured, role, group)`` selects (bool: a byte
    a request, read once for every column the summary reads)."""
    return [keep(pf.read_row_group(rg, columns=["measured", "role", "group"]).to_pandas())
            for rg in range(pf.num_row_groups)]


def _column(pf: pq.ParquetFile, name: str, masks: list[np.ndarray]) -> pd.Series:
    """Column ``name`` of the rows ``masks`` select, read a row group at a time (a Series
    with a fresh index, as the in-memory filters give)."""
    parts = [pf.read_row_group(rg, columns=[name]).column(0).to_numpy()[m]
             for rg, m in enumerate(masks)]
    return pd.Series(np.concatenate(parts) if parts else np.empty(0), name=name)


def summarize_files(result: StreamedResult) -> dict:
    """[`summarize`][prefixshield.simulator.metrics.summarize] of a streamed run, from its files:
    the same dict, bit for bit. Each figure reads one column (of the judged population, or of
    the attacker's requests) a row group at a time; the attacker's creation pressure and debt
    read the creation log a row group at a time."""
    pf = pq.ParquetFile(result.files["records"])
    victims, count = _population_kind(pf)

    def in_pop(t: pd.DataFrame) -> np.ndarray:
        m = t["measured"].to_numpy(bool)
        return m & (t["role"].to_numpy(dtype=object) == "victim") if victims else m

    meta = result.trace_meta
    att = meta.get("attacker_group")
    if att not in result.groups:
        att = None
        for rg in range(pf.num_row_groups):
            t = pf.read_row_group(rg, columns=["role", "group"]).to_pandas()
            hit = t.loc[t["role"] == "attacker", "group"]
            if len(hit):
                att = str(hit.iloc[0])
                break
    preemptions = sum(int(pf.read_row_group(rg, columns=["preemptions"]).column(0)
                          .to_numpy().sum()) for rg in range(pf.num_row_groups))
    kv, pressure = None, {"pressure_ratio": float("nan"), "mean_debt_blocks": float("nan")}
    if att is not None:
        window = meta.get("pressure_window_s") or _measured_window(pf, meta)
        cre = pq.ParquetFile(result.files["creations"])
        chunks = ({k: v.to_numpy() for k, v in zip(cre.schema_arrow.names,
                                                    cre.read_row_group(rg).columns)}
                  for rg in range(cre.num_row_groups))
        made = group_creation_chunks(chunks, result.groups.index(att), result.contract_rho,
                                     result.contract_beta, tuple(window))
        pressure = {k: made[k] for k in ("pressure_ratio", "mean_debt_blocks")}
        kv = (_column(pf, "block_s", _masks(pf, lambda t: (t["group"] == att).to_numpy())),
              _column(pf, "block_s", _masks(pf, lambda t: np.ones(len(t), dtype=bool))))
    pop = _masks(pf, in_pop)
    return summary_of(lambda name: _column(pf, name, pop), count, victims, preemptions,
                      kv, pressure, int(result.evictions.sum()), result.num_steps,
                      result.num_events)


def _measured_window(pf: pq.ParquetFile, meta: dict) -> tuple[float, float]:
    """[`measured_window`][prefixshield.simulator.metrics.measured_window] from the records file."""
    if "measure_start_s" in meta and "measure_end_s" in meta:
        return float(meta["measure_start_s"]), float(meta["measure_end_s"])
    lo, hi, any_ = np.inf, -np.inf, False
    for rg in range(pf.num_row_groups):
        t = pf.read_row_group(rg, columns=["measured", "arrival_s"]).to_pandas()
        a = t.loc[t["measured"], "arrival_s"]
        if len(a):
            any_ = True
            lo, hi = min(lo, float(a.min())), max(hi, float(a.max()))
    return (lo, hi) if any_ else (0.0, 0.0)


def run_streamed(stream: TraceStream, policy: Policy, cost: CostModel, config: EngineConfig,
                 folder: str | os.PathLike,
                 contracts: Mapping[str, Contract] = DEFAULT_CONTRACTS,
                 window_rows: int = STREAM_WINDOW_ROWS) -> StreamedResult:
    """A streamed run into ``folder`` and its summary (``result.summary``)."""
    result = StreamedRun(stream, policy, cost, config, folder, contracts=contracts,
                         window_rows=window_rows).run()
    result.summary = summarize_files(result)
    return result
