"""Generated traces are pinned bit for bit: the vectorised generators (flat segment arrays,
no Python loop per request) give exactly the traces the per-row generators gave before them.

The attack workloads gained a traffic population (issue 32): their default is now the
``background`` population, a different trace. ``population=two_group`` draws the traces they
drew before, row for row; :data:`CASES` pins those with the population's new meta keys left out
(:func:`pinned`), so every earlier digest still holds. :data:`BACKGROUND_CASES` pins the new
defaults.

The digests were computed from main at 31ac9e9 (before the generators were vectorised) with
:func:`trace_digest`; a change to any generator's output (a row, a dtype, a segment, the meta)
changes its digest. Regenerate them only for a deliberate change of a workload, and say so.

Five searched_attack digests were regenerated for one: the attacker's KV block-seconds budget
(issue 23) scales some attacks' rates and adds to the meta; the per-row generator with that
budget (branch i23-attack) gives the same five digests as the vectorised one. Five one_touch
digests were regenerated for another: its meta records the new ``aim`` / ``aim_replicas``
parameters (attacks aimed through a fleet's router); the per-row generator with them (branch
i24-attacks) gives the same five digests. The same five again for ``aim_blocks`` (the
``prefix`` aim's lead): with that one key left out of the meta, each gives its previous
digest, so no row changed. Five searched_attack digests likewise for its ``aim``,
``aim_replicas`` and ``aim_blocks`` (attack-search over a fleet): without those three keys in
the meta, each gives its previous digest.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from prefixshield.workloads import generate

LIST_COLUMNS = ("segment_ids", "segment_lengths")


def trace_digest(trace) -> str:
    """First 16 hex digits of a SHA-256 over the trace's seed, vocab_size, meta (JSON, sorted
    keys), then every column in order: its name and dtype, and its cells (list columns: every
    cell's length, the set of cell dtypes, then the cells concatenated as int64)."""
    h = hashlib.sha256()
    h.update(json.dumps([trace.seed, trace.vocab_size, trace.meta], sort_keys=True,
                        default=str).encode())
    df = trace.requests
    for name in df.columns:
        col = df[name]
        h.update(f"{name}:{col.dtype}".encode())
        if name in LIST_COLUMNS:
            cells = [np.asarray(x) for x in col]
            h.update(np.array([len(x) for x in cells], np.int64).tobytes())
            h.update(str({str(x.dtype) for x in cells}).encode())
            h.update(np.concatenate(cells).astype(np.int64).tobytes() if cells else b"")
        elif str(col.dtype) == "string":
            h.update("\x00".join(col.astype(str)).encode())
        else:
            h.update(col.to_numpy().tobytes())
    return h.hexdigest()[:16]


CASES = [
    ('borrowing', {'seed': 0}, 'dbc36ecacd55624c'),
    ('borrowing', {'seed': 1}, '9c7e584f51f43cd9'),
    ('borrowing', {'seed': 7}, '31ffd261facd1965'),
    ('bursty_sharegpt', {'seed': 0}, '152f9f9a39ce3b45'),
    ('bursty_sharegpt', {'seed': 1}, 'b0a66932d5c0cc85'),
    ('bursty_sharegpt', {'seed': 7}, '806d78f781bc9650'),
    ('delayed_replay', {'seed': 0}, '9735ad4822812a89'),
    ('delayed_replay', {'seed': 1}, '894a410e4b6e6c03'),
    ('delayed_replay', {'seed': 7}, '26fc30902e63fdfd'),
    ('low_and_slow', {'seed': 0}, 'adf57c9bbf18e03c'),
    ('low_and_slow', {'seed': 1}, '5decdcc0b7816156'),
    ('low_and_slow', {'seed': 7}, 'edea8af71f0ddd32'),
    ('one_touch', {'seed': 0}, '5109e208aa14e093'),
    ('one_touch', {'seed': 1}, 'd2f02750bb5fdcd4'),
    ('one_touch', {'seed': 7}, '2991642e44654f2e'),
    ('searched_attack', {'seed': 0}, '1cb398ad4d15eeb3'),
    ('searched_attack', {'seed': 1}, 'bd43f5fa2cebe8fb'),
    ('searched_attack', {'seed': 7}, '8fe4d233d27f551a'),
    ('servegen', {'seed': 0}, '809959a0c6a94352'),
    ('servegen', {'seed': 1}, '93a57c072956b8dc'),
    ('servegen', {'seed': 7}, '6f7947997aa9bbf8'),
    ('sharegpt', {'seed': 0}, '988b512e51e18814'),
    ('sharegpt', {'seed': 1}, 'a5ff56598fb01252'),
    ('sharegpt', {'seed': 7}, 'c4911c3c4ca9ece9'),
    ('two_pass_replay', {'seed': 0}, '17865cc5f04b959c'),
    ('two_pass_replay', {'seed': 1}, '7d4bff6e77902d4d'),
    ('two_pass_replay', {'seed': 7}, 'c6ee83512f2c9eb7'),
    ('one_touch', {'seed': 3, 'attack': False}, '52644bed19fa4b0c'),
    ('low_and_slow', {'seed': 3, 'attack': False}, '64911c0862d276f8'),
    ('two_pass_replay', {'seed': 3, 'attack': False}, '96194bf8d0c093e1'),
    ('delayed_replay', {'seed': 3, 'attack': False}, '7aaf0665e6c78233'),
    ('searched_attack', {'seed': 3, 'attack': False}, '5372376e41bbaf29'),
    ('searched_attack', {'seed': 2,
                         'replay_fraction': 0.5, 'alt_contract_fraction': 0.5,
                         'attacker_alt_contract': 'standard'}, '4da39825c3b62cbf'),
    ('one_touch', {'seed': 5, 'duration_s': 400.0}, 'e8b93f85be047529'),
    ('sharegpt', {'seed': 4, 'duration_s': 300.0}, 'b205a033c3c6372e'),
    ('servegen', {'seed': 4, 'duration_s': 300.0}, '8526e25b223dab2c'),
]
"""(workload, overrides, digest from main at 31ac9e9): every workload at three seeds, the
no-attack controls, a searched attacker on two contracts with replays, and longer traces."""


POPULATION_WORKLOADS = ("one_touch", "low_and_slow", "two_pass_replay", "delayed_replay",
                        "searched_attack")
"""The workloads with a traffic population (:mod:`prefixshield.workloads.population`)."""
POPULATION_PARAMS = ("population", "background_groups", "victim_share", "victim_rate",
                     "background_prefix_tokens", "background_contract", "background_group",
                     "template_tokens")
PHASED_PARAMS = ("judge", "victim_phase_rate", "neutral_prefix_tokens", "pass_gap_s",
                 "measured_passes")
"""delayed_replay's fields of its phased experiment (``judge=pass``), also issue 32."""
POPULATION_META = ("population", "victim_rate_req_per_s", "victim_share", "background_groups",
                   "population_groups")


def pinned(name: str, overrides: dict):
    """The trace :data:`CASES` pins: an attack workload under ``population=two_group`` (the
    only population before issue 32) with the population's keys left out of its meta; every
    other workload as generated."""
    if name not in POPULATION_WORKLOADS:
        return generate(name, **overrides)
    t = generate(name, **{**overrides, "population": "two_group"})
    for k in POPULATION_META:
        t.meta.pop(k)
    for k in POPULATION_PARAMS + (PHASED_PARAMS if name == "delayed_replay" else ()):
        t.meta["params"].pop(k)
    return t


@pytest.mark.parametrize("name,overrides,expected", CASES)
def test_generated_trace_is_bit_identical_to_the_per_row_generator(name, overrides, expected):
    assert trace_digest(pinned(name, overrides)) == expected


BACKGROUND_CASES = [
    ('one_touch', {'seed': 0}, '362ce840b344fc31'),
    ('one_touch', {'seed': 7}, 'f6a3814938d41131'),
    ('low_and_slow', {'seed': 0}, 'c49017fd5c316546'),
    ('low_and_slow', {'seed': 3, 'attack': False}, '003700b29a6c3041'),
    ('two_pass_replay', {'seed': 0}, 'b2227e551cb162dd'),
    ('delayed_replay', {'seed': 0}, 'baee16325ffb6808'),
    ('one_touch', {'seed': 5, 'duration_s': 400.0}, '0d790f798e250d44'),
    ('low_and_slow', {'seed': 3, 'duration_s': 1500.0, 'base_rate': 2.0},
     '8e060505de547cf5'),
]
"""(workload, overrides, digest) of the default ``background`` population (issue 32): the
traces the attack workloads draw now, pinned when the population was added (a streamed,
windowed trace among them)."""


@pytest.mark.parametrize("name,overrides,expected", BACKGROUND_CASES)
def test_the_background_population_traces_are_pinned(name, overrides, expected):
    assert trace_digest(generate(name, **overrides)) == expected
