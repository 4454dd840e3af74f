"""Tenant models that say what they did: prefix roots skip the prefix every request shares,
every import reports its requests per group, and a model that leaves a group empty is refused
unless the user accepts it."""

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from prefixshield.cli import main
from prefixshield.traces import importers
from prefixshield.traces.tenants import (check_group_count, divergence_roots,
                                         shared_prefix_blocks)

FIXTURES = Path(__file__).resolve().parent / "fixtures"
CONVERSATION = FIXTURES / "mooncake_conversation_head400.jsonl"
"""First 400 records of Mooncake's conversation trace: every one starts with hash id 0."""
SYNTHETIC = FIXTURES / "mooncake_synthetic_head1000.jsonl"
AZURE = FIXTURES / "azure_conv_head40.csv"


def hash_lists(path: Path) -> list[list[int]]:
    return [json.loads(line)["hash_ids"] for line in path.read_text().splitlines()]


def test_shared_prefix_is_the_longest_prefix_every_request_has():
    assert shared_prefix_blocks([[7, 1, 2], [7, 1, 3], [7, 1]]) == 2
    assert shared_prefix_blocks([[7, 1], [8, 1]]) == 0
    assert shared_prefix_blocks([[5, 6], [5, 6]]) == 2
    roots, shared = divergence_roots([[7, 1, 2], [7, 1, 3], [7, 1]])
    # the third request lies inside the shared prefix: its root is its last block
    assert shared == 2 and roots.tolist() == [2, 3, 1]


def test_conversation_trace_roots_skip_the_shared_system_prompt():
    lists = hash_lists(CONVERSATION)
    assert {h[0] for h in lists} == {0}  # the shared 512-token block
    tr = importers.import_mooncake(CONVERSATION, num_groups=4, assign="session")
    assert tr.meta["shared_prefix_blocks"] == 1
    counts = tr.requests["group"].value_counts().to_dict()
    assert sorted(counts) == ["group0", "group1", "group2", "group3"]
    assert tr.meta["requests_per_group"] == {g: counts[g] for g in sorted(counts)}
    assert sum(counts.values()) == len(lists)
    # prefix_id is the root (the second hash id here), and one root lives in one group
    rows = tr.requests
    assert set(rows["prefix_id"]) == {h[1] for h in lists}
    assert (rows.groupby("prefix_id")["group"].nunique() == 1).all()


@pytest.mark.parametrize("assign", ["session", "prefix", "zipf"])
def test_every_prefix_root_model_spreads_the_conversation_trace(assign):
    tr = importers.import_mooncake(CONVERSATION, num_groups=4, assign=assign, seed=3)
    assert tr.requests["group"].nunique() == 4
    again = importers.import_mooncake(CONVERSATION, num_groups=4, assign=assign, seed=3)
    assert tr.requests["group"].tolist() == again.requests["group"].tolist()


def test_a_trace_without_a_shared_prefix_keeps_its_first_hash_id_as_root():
    lists = hash_lists(SYNTHETIC)
    tr = importers.import_mooncake(SYNTHETIC, num_groups=4, assign="session")
    assert tr.meta["shared_prefix_blocks"] == 0
    assert set(tr.requests["prefix_id"]) == {h[0] for h in lists}


def test_fewer_groups_than_asked_is_an_error_naming_the_option():
    with pytest.raises(ValueError) as e:
        importers.import_mooncake(CONVERSATION, limit=5, num_groups=8, assign="session")
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("--assign session --groups 8: the trace has only 5 sessions (5 "
                          "roots), fewer than the groups")
    assert "--allow-fewer-groups" in msg
    with pytest.raises(ValueError, match="--assign round_robin --groups 50: only 40 of 50"):
        importers.import_azure(AZURE, num_groups=50)


def test_fewer_groups_accepted_are_reported_with_their_zeros():
    tr = importers.import_mooncake(CONVERSATION, limit=5, num_groups=8, assign="session",
                                   allow_fewer_groups=True)
    counts = tr.meta["requests_per_group"]
    assert list(counts) == [f"group{i}" for i in range(8)]
    assert list(counts.values()) == [1, 1, 1, 1, 1, 0, 0, 0]
    assert tr.group_names() == [f"group{i}" for i in range(5)]


def test_check_group_count_passes_a_full_assignment():
    check_group_count("session", {"a": 3, "b": 1}, 4, allow_fewer=False)
    with pytest.raises(ValueError, match="empty: b"):
        check_group_count("zipf", {"a": 4, "b": 0}, 4, allow_fewer=False)


def test_import_prints_the_requests_of_every_group(tmp_path):
    out = tmp_path / "c.parquet"
    r = CliRunner().invoke(main, ["trace", "import", "mooncake", str(CONVERSATION), str(out),
                                  "--groups", "4", "--assign", "session"])
    assert r.exit_code == 0, r.output
    tr = importers.import_mooncake(CONVERSATION, num_groups=4, assign="session")
    counts = tr.meta["requests_per_group"]
    line = next(x for x in r.output.splitlines() if x.startswith("requests per group"))
    assert line == ("requests per group (--assign session; roots after the 1 block every "
                    "request shares): " + ", ".join(f"{g} {n:,}" for g, n in counts.items()))
    refused = CliRunner().invoke(main, ["trace", "import", "mooncake", str(CONVERSATION),
                                        str(tmp_path / "d.parquet"), "--limit", "3",
                                        "--groups", "4", "--assign", "session"])
    assert refused.exit_code == 1
    assert refused.output.count("\n") == 1 and "--allow-fewer-groups" in refused.output
    assert not (tmp_path / "d.parquet").exists()


def test_sharegpt_counts_turns_per_group():
    tr = importers.import_sharegpt(FIXTURES / "sharegpt_first6.json", num_groups=3)
    counts = tr.meta["requests_per_group"]
    assert counts == tr.requests["group"].value_counts().reindex(list(counts)).to_dict()
    assert np.sum(list(counts.values())) == len(tr)
