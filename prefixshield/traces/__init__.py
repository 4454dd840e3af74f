"""Traces: the request schema, importers of public traces, Parquet I/O.

- [`schema`][prefixshield.traces.schema]: ``Trace``, ``TRACE_COLUMNS``, ``TraceError``.
- ``Contract``, ``DEFAULT_CONTRACTS``: from `prefixshield.tenancy`, named here too.
- [`segments`][prefixshield.traces.schema.Trace.segments]: segment-id namespaces per (group, kind).
- `tokens`: deterministic token ids of segments (numba; imported on demand).
- `rows`: ``RequestRows``, the row accumulator of generators and importers.
- `conversations`: the ShareGPT turn table and multi-turn conversation rows.
- `importers`: ``import_mooncake``, ``import_sharegpt``, ``import_azure``.
- [`io`][prefixshield.traces.io]: ``write_trace``, ``read_trace``.

Synthetic workload generators live in `prefixshield.workloads`.
"""

from __future__ import annotations

import importlib
from typing import Any

from prefixshield.tenancy import DEFAULT_CONTRACTS, Contract
from prefixshield.traces.schema import TRACE_COLUMNS, Trace, TraceError

# Importers and Parquet I/O load on first use (PEP 562): every layer imports this package (for
# ``Trace``), and ``.io`` pulls in pyarrow.parquet with its file systems and ssl, ~0.01 CPU-s
# of every `prefixshield run` that reads and writes no file.
_LAZY = {"import_azure": "importers", "import_mooncake": "importers",
         "import_sharegpt": "importers", "read_trace": "io", "write_trace": "io"}


def __getattr__(name: str) -> Any:
    """``import_azure``, ``import_mooncake``, ``import_sharegpt`` (from `importers`),
    ``read_trace``, ``write_trace`` (from `io`), and those two modules themselves, imported
    when first asked for (they were attributes of the package before they became lazy)."""
    if name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    elif name in _LAZY.values():
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value

__all__ = [
    "Contract", "DEFAULT_CONTRACTS", "TRACE_COLUMNS", "Trace", "TraceError", "import_azure",
    "import_mooncake", "import_sharegpt", "read_trace", "write_trace",
]
