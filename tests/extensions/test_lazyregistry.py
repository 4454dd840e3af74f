"""LazyRegistry's entry-point group, with importlib.metadata's entry points stood in for: read
once and only when a name the package does not list is asked for or the names are listed; a
module loaded on first look-up; the package's own names win."""

from __future__ import annotations

from importlib import metadata

import pytest

from prefixshield import lazyregistry
from prefixshield.lazyregistry import LazyRegistry

GROUP = "prefixshield.things"


@pytest.fixture
def scans(monkeypatch):
    calls = []

    def entry_points(group):
        calls.append(group)
        return [metadata.EntryPoint("json_dumps", "json:dumps", group),
                metadata.EntryPoint("own", "json:loads", group)]

    monkeypatch.setattr(lazyregistry.metadata, "entry_points", entry_points)
    return calls


def test_own_names_are_looked_up_without_reading_the_group(scans):
    things = LazyRegistry("thing", {"own": "collections"}, group=GROUP)
    things.register("own", "mine")
    assert "own" in things and things["own"] == "mine"
    assert scans == []


def test_an_entry_point_is_listed_then_loaded_and_registered_on_first_look_up(scans):
    import json

    things = LazyRegistry("thing", {"own": "collections"}, group=GROUP)
    with pytest.warns(UserWarning, match="'own' of entry point 'json:loads'.*already taken"):
        assert list(things) == ["own", "json_dumps"]
    assert "json_dumps" in things and "nope" not in things and len(things) == 2
    assert things["json_dumps"] is json.dumps and things["json_dumps"] is json.dumps
    assert scans == [GROUP]  # read once
    with pytest.raises(KeyError):
        things["nope"]


def test_a_registry_without_a_group_reads_no_entry_points(scans):
    things = LazyRegistry("thing", {})
    assert "json_dumps" not in things and list(things) == []
    assert scans == []
