"""Make the trace tests' ``_trace_helpers`` importable here (pytest runs in importlib mode)."""

import sys
from pathlib import Path

_TRACES = str(Path(__file__).resolve().parents[1] / "traces")
if _TRACES not in sys.path:
    sys.path.insert(0, _TRACES)
