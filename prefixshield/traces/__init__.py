"""Traces: the request schema, importers of public traces, Parquet I/O.

- :mod:`.schema`: ``Trace``, ``TRACE_COLUMNS``, ``TraceError``.
- :mod:`.contracts`: ``Contract``, ``DEFAULT_CONTRACTS``.
- :mod:`.segments`: segment-id namespaces per (group, kind).
- :mod:`.tokens`: deterministic token ids of segments (numba; imported on demand).
- :mod:`.rows`: ``RequestRows``, the row accumulator of generators and importers.
- :mod:`.conversations`: the ShareGPT turn table and multi-turn conversation rows.
- :mod:`.importers`: ``import_mooncake``, ``import_sharegpt``, ``import_azure``.
- :mod:`.io`: ``write_trace``, ``read_trace``.

Synthetic workload generators live in :mod:`prefixshield.workloads`.
"""

from prefixshield.traces.contracts import DEFAULT_CONTRACTS, Contract
from prefixshield.traces.importers import import_azure, import_mooncake, import_sharegpt
from prefixshield.traces.io import read_trace, write_trace
from prefixshield.traces.schema import TRACE_COLUMNS, Trace, TraceError

__all__ = [
    "Contract", "DEFAULT_CONTRACTS", "TRACE_COLUMNS", "Trace", "TraceError", "import_azure",
    "import_mooncake", "import_sharegpt", "read_trace", "write_trace",
]
