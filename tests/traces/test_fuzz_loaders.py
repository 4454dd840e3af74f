"""Fuzzing every importer and loader: whatever the bytes, the result is a valid trace (or
profile) or one of the documented errors naming the file — never another exception."""

import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefixshield.simulator.costmodel import ProfileError, load_profile
from prefixshield.traces import importers
from prefixshield.traces.io import read_trace
from prefixshield.traces.schema import TraceError

FUZZ = settings(max_examples=60, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-10, 10 ** 6),
                         st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8))
mooncake_records = st.fixed_dictionaries({}, optional={
    "timestamp": json_scalars, "input_length": json_scalars, "output_length": json_scalars,
    "hash_ids": st.one_of(json_scalars, st.lists(st.integers(-3, 2 ** 41), max_size=6))})


def _write(data: bytes, suffix: str) -> Path:
    f = tempfile.NamedTemporaryFile(delete=False, suffix=suffix)
    f.write(data)
    f.close()
    return Path(f.name)


def _accepts_or_names_the_file(fn, path: Path, errors=(TraceError, ValueError)):
    try:
        trace = fn(path)
    except errors as e:
        assert str(path) in str(e) or "must be" in str(e), e
        return None
    finally:
        path.unlink(missing_ok=True)
    return trace


@FUZZ
@given(st.lists(st.one_of(mooncake_records, json_scalars), max_size=6), st.booleans())
def test_mooncake_importer(records, bom):
    text = "\n".join(json.dumps(r) for r in records).encode()
    trace = _accepts_or_names_the_file(importers.import_mooncake,
                                       _write((b"\xef\xbb\xbf" if bom else b"") + text, ".jsonl"))
    if trace is not None:
        trace.validate()


@FUZZ
@given(st.binary(max_size=300))
def test_mooncake_importer_on_raw_bytes(data):
    _accepts_or_names_the_file(importers.import_mooncake, _write(data, ".jsonl"))


@FUZZ
@given(st.lists(st.tuples(st.text(max_size=30), st.text(max_size=6), st.text(max_size=6)),
                max_size=6), st.booleans())
def test_azure_importer(rows, header):
    lines = (["TIMESTAMP,ContextTokens,GeneratedTokens"] if header else []) + [
        ",".join(r) for r in rows]
    trace = _accepts_or_names_the_file(importers.import_azure,
                                       _write("\n".join(lines).encode(), ".csv"))
    if trace is not None:
        trace.validate()


@FUZZ
@given(st.recursive(json_scalars, lambda c: st.one_of(st.lists(c, max_size=4),
                                                      st.dictionaries(st.text(max_size=14), c,
                                                                      max_size=4)),
                    max_leaves=12))
def test_sharegpt_importer(doc):
    trace = _accepts_or_names_the_file(importers.import_sharegpt,
                                       _write(json.dumps(doc).encode(), ".json"))
    if trace is not None:
        trace.validate()


@FUZZ
@given(st.binary(max_size=400))
def test_trace_loader_on_raw_bytes(data):
    _accepts_or_names_the_file(read_trace, _write(data, ".parquet"))


@FUZZ
@given(st.dictionaries(st.sampled_from(["a_s", "b_s_per_prefill_token", "c_s_per_decode_seq",
                                        "d_s_per_context_token", "e_s_per_new_request", "x"]),
                       st.one_of(st.floats(allow_nan=False), st.integers(-5, 10 ** 9),
                                 st.text(max_size=4)), max_size=6))
def test_profile_loader(cost):
    body = "\n".join(f"{k} = {json.dumps(v)}" for k, v in cost.items())
    text = (f'name = "f"\n[cost]\n{body}\n[provenance]\nstatus = "s"\nhardware = "h"\n'
            'model = "m"\nvllm_version = "v"\nattention_backend = "a"\ndate = "d"\n'
            'method = "m"\n')
    path = _write(text.encode(), ".toml")
    try:
        p = load_profile(str(path))
    except ProfileError as e:
        assert str(path) in str(e)
        return
    finally:
        path.unlink(missing_ok=True)
    c = p.cost
    assert c.step_time(0, 1, 1, 0) > 0
