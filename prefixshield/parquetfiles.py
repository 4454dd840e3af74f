"""Parquet files read into pandas through arrow's own file handles, never a Python file object.

Given a local path, ``pandas.read_parquet`` opens the file with Python's ``open()`` and hands the
file object to pyarrow (``pandas.io.parquet._get_path_or_handle``), which wraps it in an
``arrow::py::PyReadableFile``. A dataset read finishes on arrow's worker threads, and the last
reference to that wrapper (or to a ``PyBuffer`` of bytes read through it) can be dropped by a
worker after ``read_table`` has returned; its destructor takes the GIL. Late enough -- the
machine loaded, the command done, the interpreter finalizing -- the worker is ended by
``pthread_exit`` inside that ``noexcept`` destructor and the process aborts (SIGABRT, "terminate called without an active exception"; see
`prefixshield.exitcode`). Given arrow's ``LocalFileSystem``, pandas passes the path on and
arrow opens the file natively: nothing a worker holds then needs the interpreter.
"""

from __future__ import annotations

import functools
import os
from typing import Sequence

import pandas as pd


@functools.cache
def _local_fs():
    from pyarrow.fs import LocalFileSystem

    return LocalFileSystem()


def read_frame(path: str | os.PathLike, columns: Sequence[str] | None = None) -> pd.DataFrame:
    """``pandas.read_parquet(path, columns=columns)``, the same frame, with the file opened by
    arrow (see the module doc). Raises what ``read_parquet`` raises: ``FileNotFoundError`` for a
    missing file, pyarrow's errors for a damaged one."""
    return pd.read_parquet(os.fspath(path), columns=None if columns is None else list(columns),
                           filesystem=_local_fs())
