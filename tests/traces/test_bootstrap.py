"""The session bootstrap of a trace file (``compare TRACE.parquet``'s replicates)."""

from pathlib import Path

import numpy as np
import pytest

from prefixshield.traces.bootstrap import session_bootstrap, sessions_of
from prefixshield.traces.importers import import_mooncake
from prefixshield.traces.schema import Trace, build_requests

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def trace():
    return import_mooncake(FIXTURES / "mooncake_synthetic_head60.jsonl", num_groups=2,
                           assign="session")


def _shared_prompt_trace():
    """Six sessions of two requests each: every prompt starts with segment 1 (a system prompt
    all share), then its session's own segment 100+s, then the request's own 200+i."""
    rows = []
    for s in range(6):
        for k in range(2):
            i = 2 * s + k
            rows.append((float(i), f"g{s % 2}", s, [1, 100 + s, 200 + i], [32, 16, 8]))
    rows.sort(key=lambda r: r[0])
    cols = {"request_id": list(range(len(rows))), "arrival_s": [r[0] for r in rows],
            "group": [r[1] for r in rows], "contract": ["standard"] * len(rows),
            "role": ["benign"] * len(rows), "prefix_id": [r[2] for r in rows],
            "measured": [True] * len(rows), "output_tokens": [4] * len(rows),
            "segment_ids": [r[3] for r in rows], "segment_lengths": [r[4] for r in rows],
            "output_segment_id": [-1] * len(rows)}
    return Trace(build_requests(cols)).validate("test")


def _segments_by_session(t):
    seg = t.segments()
    sess = sessions_of(t)
    out: dict[int, set] = {}
    for i in range(len(t)):
        out.setdefault(int(sess[i]), set()).update(
            seg.ids[seg.offsets[i]:seg.offsets[i + 1]].tolist())
    return out


def test_a_replicate_is_the_same_for_the_same_seed_and_differs_across_seeds(trace):
    a, b, c = (session_bootstrap(trace, s) for s in (3, 3, 4))
    assert a.requests.equals(b.requests)
    assert not a.requests[["arrival_s", "prefix_id"]].equals(c.requests[["arrival_s",
                                                                           "prefix_id"]])


def test_a_replicate_holds_whole_sessions_at_their_own_times(trace):
    rep = session_bootstrap(trace, 1)
    sess = sessions_of(trace)
    rng = np.random.default_rng(1)
    n = int(sess.max()) + 1
    counts = np.bincount(rng.integers(0, n, size=n), minlength=n)
    assert len(rep) == int(counts[sess].sum())
    assert rep.requests["request_id"].tolist() == list(range(len(rep)))
    assert np.all(np.diff(rep.requests["arrival_s"].to_numpy()) >= 0)
    # every original arrival time appears once per copy of its session
    want = np.sort(np.repeat(trace.requests["arrival_s"].to_numpy(), counts[sess]))
    assert np.array_equal(np.sort(rep.requests["arrival_s"].to_numpy()), want)
    assert rep.meta["bootstrap"]["sessions"] == n
    assert rep.meta["bootstrap"]["sessions_drawn"] == int(np.count_nonzero(counts))


def test_a_copy_keeps_shared_segments_and_renames_its_private_ones():
    t = _shared_prompt_trace()
    for seed in range(20):  # a seed that draws some session twice
        rep = session_bootstrap(t, seed)
        if rep.meta["bootstrap"]["sessions_drawn"] < len(rep) // 2:
            break
    counts = rep.requests.groupby(["group", "prefix_id"]).size()
    sessions = _segments_by_session(rep)
    assert all(1 in ids for ids in sessions.values()), "the shared system prompt is kept"
    private = [ids - {1} for ids in sessions.values()]
    for a in range(len(private)):  # no two sessions share anything but the system prompt
        for b in range(a + 1, len(private)):
            assert not (private[a] & private[b])
    assert len(sessions) == len(rep) // 2 and (counts == 2).all()
    assert rep.meta["bootstrap"]["sessions_drawn"] < len(sessions), "some session is copied"
    assert rep.requests["segment_lengths"].map(list).tolist() == [[32, 16, 8]] * len(rep)
