"""The results store: a Parquet dataset with one partition (file) per cell, and its spec.

Layout under the store's folder::

    store.json                                  the spec, resolved config and provenance
    cells/<experiment>/<point>/<policy>/seed=<s>.parquet          one summary row per cell
    cells/<experiment>/<point>/<policy>/seed=<s>.records.parquet  per-request records (asked)

A cell is written atomically (temp file, then rename), records before the summary: the summary
file's presence is the cell's completion mark. So a killed run leaves whole cells or none, a
rerun skips finished cells, and no cell can exist twice (its path is its identity). Stray temp
files of a killed writer (``cells/**/.*.tmp``, ``figures/.*.tmp``, ``tables/.*.tmp``) are removed
by the next writer.

One writer at a time: a process that writes a store (``sweep``, ``reproduce``, ``regress
--out``, ``attack-search``, ``report``) holds an OS lock (``fcntl.flock``) on its
``.lock`` file until it exits; the kernel drops it when the process dies, however it dies. A
second writer of another spec is refused at once; one of the same spec waits for the first
and then resumes (finding its cells done).
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import subprocess
import time
from pathlib import Path

import pandas as pd

from prefixshield import __version__
from prefixshield.atomic import write_text, write_with
from prefixshield.edges import check_cells
from prefixshield.experiments.spec import Experiment, SpecError, experiment_from_dict, spec_digest
from prefixshield.parquetfiles import read_frame

STORE_FILE = "store.json"
CELLS = "cells"
LOCK_FILE = ".lock"
_HELD: dict[str, int] = {}
"""Stores this process holds the lock of: real path -> the open descriptor (kept open until the
process exits; the kernel releases the lock then, or when the process is killed)."""
FORMAT = 1
ADAPTIVE_KINDS = ("attack-search",)
"""Store kinds whose spec grows while they run (a search chooses its next points from the
results so far): `ResultsStore.append_experiments` adds experiments to them. Their
``spec_digest`` stays the digest of the experiments they were created with (the fixed part), so
a rerun of the same command reopens them; the appended experiments follow in
``meta["experiments"]``, in the order they were added."""


def policy_dir(label: str) -> str:
    """A folder name for a policy label (``prefixshield:debt_gate=false`` ->
    ``prefixshield-debt_gate-false``)."""
    from prefixshield.experiments.single import label_dir

    return label_dir(label)


def git_commit() -> str | None:
    """The git commit of the installed source tree, or None outside a checkout."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                           capture_output=True, text=True, timeout=5)
    return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def provenance() -> dict:
    """Versions of what computed the results (written once beside them)."""
    import numba
    import numpy

    return {"prefixshield_version": __version__, "git_commit": git_commit(),
            "python": platform.python_version(), "numpy": numpy.__version__,
            "numba": numba.__version__, "pandas": pd.__version__,
            "machine": platform.machine(), "system": platform.system()}


def profile_records(experiments: list[Experiment]) -> dict:
    """Every profile the experiments use, with its coefficients and provenance."""
    import dataclasses

    from prefixshield.simulator.costmodel import load_profile

    names = {"l4-qwen2.5-1.5b"}
    for exp in experiments:
        if exp.kind != "simulate":
            continue
        for point in exp.points():
            names.add(point.settings.get("profile", "l4-qwen2.5-1.5b"))
    out = {}
    for name in sorted(names):
        p = load_profile(name)
        out[name] = {"source": p.source, "cost": dataclasses.asdict(p.cost),
                     "provenance": p.provenance}
    return out


class ResultsStore:
    """A results folder. Open with `create` (new or the same spec: resume) or
    [`open`][prefixshield.experiments.store.ResultsStore.open] (existing, read-only use)."""

    def __init__(self, root: str | Path, meta: dict) -> None:
        self.root = Path(root)
        self.meta = meta
        self.experiments = [experiment_from_dict(d, where=str(self.root / STORE_FILE))
                            for d in meta["experiments"]]

    # ---------------------------------------------------------------- opening
    @classmethod
    def create(cls, root: str | Path, experiments: list[Experiment], kind: str,
               extra: dict | None = None) -> "ResultsStore":
        """Open ``root`` for writing ``experiments``: a new folder, an empty one, or a store of
        the same spec (then finished cells are kept and skipped). Anything else is refused
        before any work, naming what differs."""
        root = Path(root)
        if root.is_symlink():  # replacing what a link points at is not what --out asks
            raise SpecError(f"{root}: is a symbolic link; give the folder itself")
        if root.exists() and not root.is_dir():
            raise SpecError(f"{root}: exists and is not a folder")
        check_cells(sum(len(e.points()) * len(e.policies) * len(e.seeds) for e in experiments),
                    str(root))
        meta_path = root / STORE_FILE
        digest = spec_digest(experiments)
        if root.exists() and not meta_path.exists() and any(
                p.name != LOCK_FILE for p in root.iterdir()):
            raise SpecError(f"{root}: not empty and not a results store; choose another --out")
        _lock(root, digest)
        if meta_path.exists():
            old = cls.open(root)
            if old.meta.get("spec_digest") != digest:
                raise SpecError(
                    f"{root}: holds results of another spec ({_diff(old.experiments, experiments)}"
                    "); choose another --out or remove it")
            old._clean_temp()
            return old
        meta = {"format": FORMAT, "kind": kind, "spec_digest": digest,
                "experiments": [e.to_dict() for e in experiments],
                "profiles": profile_records(experiments), "provenance": provenance(),
                **(extra or {})}
        store = cls(root, meta)  # parses the spec back: a spec that cannot be read is not written
        if not os.access(root, os.W_OK):
            raise SpecError(f"{root}: not writable")
        write_text(meta_path, json.dumps(meta, indent=2, sort_keys=True) + "\n")
        return store

    @classmethod
    def open(cls, root: str | Path) -> "ResultsStore":
        """An existing store (errors name the folder and what is missing)."""
        root = Path(root)
        path = root / STORE_FILE
        if not path.exists():
            raise SpecError(f"{root}: not a results store (no {STORE_FILE}); make one with "
                            "`prefixshield sweep` or `prefixshield reproduce`")
        try:
            meta = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
            raise SpecError(f"{path}: not valid JSON: {e}") from None
        if not isinstance(meta, dict):
            raise SpecError(f"{path}: expected a JSON object (a results store's spec), got "
                            f"{type(meta).__name__}")
        if not isinstance(meta.get("experiments"), list):
            raise SpecError(f"{path}: 'experiments' must be a list of experiments")
        if meta.get("format") != FORMAT:
            raise SpecError(f"{path}: store format {meta.get('format')!r}, this version reads "
                            f"{FORMAT}")
        return cls(root, meta)

    def lock(self) -> None:
        """Take this store's writer lock (see the module docstring) before writing into it
        (``report``); refused while a writer of another spec holds it."""
        _lock(self.root, self.meta.get("spec_digest"))
        self._clean_temp()

    def _clean_temp(self) -> None:
        """Remove the temporaries a killed writer left: cell, table and figure temp files and
        the staging folders of atomic folder writes (``.X.<rand>.new``). Only under the lock:
        a live writer's temporaries are never touched."""
        import shutil

        for sub in (CELLS, "figures", "tables"):
            folder = self.root / sub
            if folder.exists():
                for tmp in folder.rglob(".*.tmp"):
                    tmp.unlink(missing_ok=True)
        for tmp in self.root.glob(".*.tmp"):
            tmp.unlink(missing_ok=True)
        for stage in self.root.glob(".*.new"):
            shutil.rmtree(stage, ignore_errors=True)
        old = self.root / f".{CELLS}.old"  # regress --accept killed between its two renames
        if old.exists():
            if (self.root / CELLS).exists():
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(old, self.root / CELLS)

    def experiment(self, name: str) -> Experiment:
        """The experiment ``name`` of this store."""
        for e in self.experiments:
            if e.name == name:
                return e
        raise KeyError(f"{self.root}: no experiment {name!r}")

    def append_experiments(self, experiments: list[Experiment]) -> None:
        """Add ``experiments`` (new names) to a store of an adaptive kind (see
        `ADAPTIVE_KINDS`), rewriting ``store.json`` atomically before any of their cells
        is written, so every cell on disk belongs to a listed experiment."""
        if self.meta.get("kind") not in ADAPTIVE_KINDS:
            raise SpecError(f"{self.root}: a {self.meta.get('kind')!r} store has a fixed spec; "
                            f"only {', '.join(ADAPTIVE_KINDS)} stores take new experiments")
        names = {e.name for e in self.experiments}
        for e in experiments:
            if e.name in names:
                raise SpecError(f"{self.root}: experiment {e.name!r} is already in the store")
            names.add(e.name)
        self.experiments.extend(experiments)
        self.meta["experiments"] = [*self.meta["experiments"], *(e.to_dict() for e in experiments)]
        write_text(self.root / STORE_FILE, json.dumps(self.meta, indent=2, sort_keys=True) + "\n")

    # ---------------------------------------------------------------- cells
    def cell_path(self, experiment: str, point: str, label: str, seed: int,
                  suffix: str = "parquet") -> Path:
        """The file of one cell (``suffix`` ``records.parquet`` for its records)."""
        return (self.root / CELLS / experiment / point / policy_dir(label)
                / f"seed={seed}.{suffix}")

    def done(self, experiments: list[Experiment] | None = None) -> set[tuple]:
        """Identities ``(experiment, point, policy label, seed)`` of the finished cells (of
        ``experiments``, default: all of the store's)."""
        out = set()
        for exp in self.experiments if experiments is None else experiments:
            for point in exp.points():
                for label in exp.policies:
                    for seed in exp.seeds:
                        if self.cell_path(exp.name, point.id, label, seed).exists():
                            out.add((exp.name, point.id, label, seed))
        return out

    def num_cells(self) -> int:
        """Cells the spec defines."""
        return sum(len(e.points()) * len(e.policies) * len(e.seeds) for e in self.experiments)

    def write_cell(self, row: dict, records: pd.DataFrame | None = None) -> Path:
        """Write one cell (``row`` holds the identity columns); records first, then the row."""
        path = self.cell_path(row["experiment"], row["point"], row["policy"], int(row["seed"]))
        if records is not None:
            rpath = self.cell_path(row["experiment"], row["point"], row["policy"],
                                   int(row["seed"]), "records.parquet")
            write_with(rpath, lambda tmp: records.to_parquet(tmp, index=False))
        frame = pd.DataFrame([row])
        write_with(path, lambda tmp: frame.to_parquet(tmp, index=False))
        return path

    def load(self, experiment: str | None = None) -> pd.DataFrame:
        """Every finished cell (of ``experiment``, or all) as one frame, in spec order."""
        frames = []
        for exp in self.experiments:
            if experiment is not None and exp.name != experiment:
                continue
            for point in exp.points():
                for label in exp.policies:
                    for seed in exp.seeds:
                        p = self.cell_path(exp.name, point.id, label, seed)
                        if p.exists():
                            frames.append(self._read_cell(p, exp.name, point.id, label, seed))
        if not frames:
            return pd.DataFrame(columns=["experiment", "point", "policy", "seed", "status"])
        return pd.concat(frames, ignore_index=True)

    def _read_cell(self, p: Path, experiment: str, point: str, label: str,
                   seed: int) -> pd.DataFrame:
        """One cell's row, checked against its path: a file moved or copied under another
        name (another seed, point or policy) would be counted as a cell it is not."""
        try:
            df = read_frame(p)
        except Exception as e:  # pyarrow raises its own types for a damaged file
            raise SpecError(f"{p}: not a readable cell: {e}") from None
        want = {"experiment": experiment, "point": point, "policy": label, "seed": seed}
        if len(df) != 1 or any(k not in df for k in want):
            raise SpecError(f"{p}: not a cell (expected one row with "
                            f"{', '.join(want)} columns)")
        row = df.iloc[0]
        for k, v in want.items():
            got = int(row[k]) if k == "seed" else row[k]
            if got != v:
                raise SpecError(f"{p}: the cell says {k} {got!r} but its file name says {v!r}; "
                                "the store was edited by hand")
        return df

    def load_records(self, experiment: str, point: str, label: str, seed: int) -> pd.DataFrame:
        """Per-request records of one cell (stored only when the experiment asked for them)."""
        p = self.cell_path(experiment, point, label, seed, "records.parquet")
        if not p.exists():
            raise FileNotFoundError(f"{p}: no records stored for this cell (run with --records)")
        return read_frame(p)


def _lock(root: Path, digest: str | None) -> None:
    """Hold ``root``'s writer lock for the rest of this process (creating ``root``).

    Another process holding it: refused at once when the store it writes has another spec than
    ``digest`` (or when that cannot be told yet), else wait for it to finish."""
    key = os.path.realpath(root)
    if key in _HELD:
        return
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd = os.open(root / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as e:
        raise SpecError(f"{root}: cannot create the store: {e.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        theirs = _digest_on_disk(root)
        for _ in range(100):  # the other writer took the lock and is writing store.json
            if theirs is not None:
                break
            time.sleep(0.05)
            theirs = _digest_on_disk(root)
        if theirs is None or theirs != digest:
            os.close(fd)
            raise SpecError(f"{root}: another process is writing this store"
                            + ("" if theirs is None else " with another spec")
                            + "; wait for it or choose another --out") from None
        fcntl.flock(fd, fcntl.LOCK_EX)  # the same spec: wait, then resume its cells
    _HELD[key] = fd


def _digest_on_disk(root: Path) -> str | None:
    try:
        meta = json.loads((root / STORE_FILE).read_text())
    except (OSError, ValueError, RecursionError):
        return None
    return meta.get("spec_digest") if isinstance(meta, dict) else None


def _diff(old: list[Experiment], new: list[Experiment]) -> str:
    a = {e.name: e.to_dict() for e in old}
    b = {e.name: e.to_dict() for e in new}
    if set(a) != set(b):
        return f"experiments {sorted(a)} vs {sorted(b)}"
    for name in a:
        for k in a[name]:
            if a[name][k] != b[name].get(k):
                return f"experiment {name}: {k} {a[name][k]!r} vs {b[name].get(k)!r}"
    return "same experiments, other order"
