"""RunOptions: a run's options checked once, at the command line's edge."""

import dataclasses

import pytest
from click.testing import CliRunner

from prefixshield.cli import main
from prefixshield.experiments import options as opt
from prefixshield.experiments.options import RunOptions
from prefixshield.simulator.config import EngineConfig


@pytest.mark.parametrize("kw, says", [
    (dict(workload=""), "workload must be"),
    (dict(policies=()), "no policy given"),
    (dict(engine="512"), "engine must be an EngineConfig"),
    (dict(alpha=0), "alpha must be > 0"),
    (dict(seeds=()), "seeds must be"),
    (dict(seeds=(1, -2)), "seeds must be"),
    (dict(seeds=(True,)), "seeds must be"),
    (dict(c_prefill_basis="nope"), "c_prefill_basis must be one of reference, capacity"),
    (dict(contracts="nope"), "contracts must be one of reference, fit"),
    (dict(scale_to_load=0.0), "scale_to_load must be > 0"),
    (dict(executor=("ray", 2, None)), "no fleet given"),
])
def test_bad_options_are_refused_with_what_is_wrong(kw, says):
    base = dict(workload="one_touch", policies=("lru",))
    with pytest.raises(ValueError, match=says):
        RunOptions(**{**base, **kw})


def test_defaults_are_the_one_written_place():
    o = RunOptions("one_touch", ("lru",))
    assert o.profile.name == opt.DEFAULT_PROFILE
    assert o.alpha == opt.DEFAULT_ALPHA and o.seed == 0
    assert o.engine == EngineConfig()
    assert opt.default_of(EngineConfig, "num_blocks") == EngineConfig().num_blocks
    spec = o.spec(seed=3)
    assert (spec.workload, spec.policies, spec.seed, spec.alpha) == ("one_touch", ("lru",), 3,
                                                                     opt.DEFAULT_ALPHA)
    assert spec.engine is o.engine
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.alpha = 1.0


def test_a_command_builds_its_options_once(monkeypatch, tmp_path):
    built = []
    real = RunOptions.__post_init__

    def counting(self):
        built.append(self)
        real(self)

    monkeypatch.setattr(RunOptions, "__post_init__", counting)
    r = CliRunner().invoke(main, ["run", "one_touch", "--policy", "lru", "--blocks", "512",
                                  "--set", "duration_s=5", "--out", str(tmp_path / "o")],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert len(built) == 1
    assert built[0].engine.num_blocks == 512 and built[0].policies == ("lru",)
