"""The results store: a Parquet dataset with one partition (file) per cell, and its spec.

Layout under the store's folder::

    store.json                                  the spec, resolved config and provenance
    cells/<experiment>/<point>/<policy>/seed=<s>.parquet          one summary row per cell
    cells/<experiment>/<point>/<policy>/seed=<s>.records.parquet  per-request records (asked)

A cell is written atomically (temp file, then rename), records before the summary: the summary
file's presence is the cell's completion mark. So a killed run leaves whole cells or none, a
rerun skips finished cells, and no cell can exist twice (its path is its identity). Stray temp
files of a killed writer are removed when the store is opened.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from pathlib import Path

import pandas as pd

from prefixshield import __version__
from prefixshield.atomic import write_text, write_with
from prefixshield.experiments.spec import Experiment, SpecError, experiment_from_dict, spec_digest

STORE_FILE = "store.json"
CELLS = "cells"
FORMAT = 1
ADAPTIVE_KINDS = ("attack-search",)
"""Store kinds whose spec grows while they run (a search chooses its next points from the
results so far): :meth:`ResultsStore.append_experiments` adds experiments to them. Their
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
    """A results folder. Open with :meth:`create` (new or the same spec: resume) or
    :meth:`open` (existing, read-only use)."""

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
        if root.exists() and not root.is_dir():
            raise SpecError(f"{root}: exists and is not a folder")
        meta_path = root / STORE_FILE
        digest = spec_digest(experiments)
        if meta_path.exists():
            old = cls.open(root)
            if old.meta.get("spec_digest") != digest:
                raise SpecError(
                    f"{root}: holds results of another spec ({_diff(old.experiments, experiments)}"
                    "); choose another --out or remove it")
            old._clean_temp()
            return old
        if root.exists() and any(root.iterdir()):
            raise SpecError(f"{root}: not empty and not a results store; choose another --out")
        meta = {"format": FORMAT, "kind": kind, "spec_digest": digest,
                "experiments": [e.to_dict() for e in experiments],
                "profiles": profile_records(experiments), "provenance": provenance(),
                **(extra or {})}
        store = cls(root, meta)  # parses the spec back: a spec that cannot be read is not written
        root.mkdir(parents=True, exist_ok=True)
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
        except json.JSONDecodeError as e:
            raise SpecError(f"{path}: not valid JSON: {e}") from None
        if meta.get("format") != FORMAT:
            raise SpecError(f"{path}: store format {meta.get('format')!r}, this version reads "
                            f"{FORMAT}")
        return cls(root, meta)

    def _clean_temp(self) -> None:
        cells = self.root / CELLS
        if cells.exists():
            for tmp in cells.rglob(".*.tmp"):
                tmp.unlink(missing_ok=True)

    def experiment(self, name: str) -> Experiment:
        """The experiment ``name`` of this store."""
        for e in self.experiments:
            if e.name == name:
                return e
        raise KeyError(f"{self.root}: no experiment {name!r}")

    def append_experiments(self, experiments: list[Experiment]) -> None:
        """Add ``experiments`` (new names) to a store of an adaptive kind (see
        :data:`ADAPTIVE_KINDS`), rewriting ``store.json`` atomically before any of their cells
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
                            frames.append(pd.read_parquet(p))
        if not frames:
            return pd.DataFrame(columns=["experiment", "point", "policy", "seed", "status"])
        return pd.concat(frames, ignore_index=True)

    def load_records(self, experiment: str, point: str, label: str, seed: int) -> pd.DataFrame:
        """Per-request records of one cell (stored only when the experiment asked for them)."""
        p = self.cell_path(experiment, point, label, seed, "records.parquet")
        if not p.exists():
            raise FileNotFoundError(f"{p}: no records stored for this cell (run with --records)")
        return pd.read_parquet(p)


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
