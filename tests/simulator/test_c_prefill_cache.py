"""C_prefill's disk cache: a hit returns the measured float bit for bit without probing; another
shape, version or simulator source is a miss; a missing, unwritable or corrupt cache is a silent
fall-back to measuring."""

import json

import pytest

import prefixshield
from prefixshield import usercache
from prefixshield.simulator import capacity
from prefixshield.simulator.config import EngineConfig
from prefixshield.simulator.costmodel import load_profile

COST = load_profile("l4-qwen2.5-1.5b").cost
SHAPE = ((200,) * 32, (4,) * 32)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh cache dir, an empty in-process cache, and a count of real probes."""
    monkeypatch.setenv(usercache.ENV_CACHE_DIR, str(tmp_path / "cache"))
    capacity._measure.cache_clear()
    probes = []
    real = capacity._probe

    def counting(*args):
        probes.append(args)
        return real(*args)

    monkeypatch.setattr(capacity, "_probe", counting)
    yield tmp_path / "cache", probes
    capacity._measure.cache_clear()


def measure(shape=SHAPE, config=None):
    capacity._measure.cache_clear()  # only the disk cache may answer
    return capacity.measure_c_prefill(COST, config or EngineConfig(), *shape)


def test_a_second_process_reads_the_measured_value_bit_for_bit(cache):
    root, probes = cache
    first = measure()
    assert len(probes) == 1
    files = list((root / "c_prefill").glob("*.json"))
    assert len(files) == 1
    entry = json.loads(files[0].read_text())
    assert entry["version"] == prefixshield.__version__ and entry["value"] == first
    again = measure()
    assert again == first and len(probes) == 1  # hit: no probe ran


def test_another_shape_or_engine_is_a_miss(cache):
    _, probes = cache
    measure()
    measure(((200,) * 32, (5,) * 32))
    measure(config=EngineConfig(num_blocks=1024))
    assert len(probes) == 3


def test_another_package_version_invalidates_the_entry(cache, monkeypatch):
    _, probes = cache
    value = measure()
    monkeypatch.setattr(prefixshield, "__version__", "999.0")
    assert measure() == value and len(probes) == 2  # measured again, same number
    assert measure() == value and len(probes) == 2  # and now cached for 999.0


def test_edited_simulator_sources_invalidate_the_entry(cache, monkeypatch):
    _, probes = cache
    measure()
    monkeypatch.setattr(capacity, "source_fingerprint", lambda: "edited")
    measure()
    assert len(probes) == 2


def test_an_unwritable_cache_dir_falls_back_to_measuring(tmp_path, monkeypatch, cache):
    _, probes = cache
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv(usercache.ENV_CACHE_DIR, str(blocker / "cache"))
    first = measure()
    assert measure() == first and len(probes) == 2  # nothing stored, nothing raised


def test_a_read_only_cache_dir_falls_back_to_measuring(tmp_path, monkeypatch, cache):
    """A read-only cache folder: the write fails with PermissionError (raised here as the
    kernel raises it for a non-root user; root may write into a 0500 folder, so the mode alone
    cannot make this test for CI, which runs as root)."""
    import prefixshield.atomic as atomic

    _, probes = cache
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)

    def refuse(path, text):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(atomic, "write_text", refuse)
    monkeypatch.setenv(usercache.ENV_CACHE_DIR, str(ro))
    try:
        first = measure()
        assert measure() == first
    finally:
        ro.chmod(0o700)
    assert len(probes) == 2 and not any(ro.iterdir())


def test_a_corrupt_or_foreign_entry_is_a_miss_and_is_replaced(cache):
    root, probes = cache
    value = measure()
    (path,) = (root / "c_prefill").glob("*.json")
    path.write_text("{not json")
    assert measure() == value and len(probes) == 2
    entry = json.loads(path.read_text())
    entry["key"]["prompt_tokens"] = [1] * 32  # same file name, another key: a collision
    path.write_text(json.dumps(entry))
    assert measure() == value and len(probes) == 3


def test_cache_dir_follows_the_override_then_xdg_then_home(monkeypatch, tmp_path):
    monkeypatch.setenv(usercache.ENV_CACHE_DIR, str(tmp_path / "x"))
    assert usercache.cache_dir() == tmp_path / "x"
    monkeypatch.delenv(usercache.ENV_CACHE_DIR)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert usercache.cache_dir() == tmp_path / "xdg" / "prefixshield"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert usercache.cache_dir() == tmp_path / "home" / ".cache" / "prefixshield"
