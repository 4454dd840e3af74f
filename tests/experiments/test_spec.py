"""Experiment specs: field typing at the edge, grids, TOML files, and the CLI's list parsing."""

import pytest
from click.testing import CliRunner

from prefixshield.cli import main
from prefixshield.cli.common import _policy_names
from prefixshield.experiments.cells import resolve_contracts, resolve_policy, run_spec
from prefixshield.experiments.overrides import parse_overrides
from prefixshield.experiments.spec import (Experiment, SpecError, experiment_from_dict,
                                           load_spec_file, parse_grid_option, parse_set_option)
from prefixshield.workloads import WORKLOADS


def test_grid_types_every_kind_of_field():
    assert parse_grid_option("one_touch", "blocks=512,1024") == ("blocks", (512, 1024))
    assert parse_grid_option("one_touch", "alpha=0.4,0.8") == ("alpha", (0.4, 0.8))
    assert parse_grid_option("one_touch", "compat=0.10,current") == ("compat", ("0.10", "current"))
    assert parse_grid_option("one_touch", "attack=true,false") == ("attack", (True, False))
    assert parse_grid_option("one_touch", "prefixshield.rho_scale=0.5,1,2") == (
        "prefixshield.rho_scale", (0.5, 1.0, 2.0))
    assert parse_grid_option("one_touch", "contract.best_effort.rho=8,16") == (
        "contract.best_effort.rho", (8.0, 16.0))
    # a tuple-valued field takes ';' between values, and one number means (n, n)
    assert parse_grid_option("one_touch", "output_tokens=1,1;16,64") == (
        "output_tokens", ((1, 1), (16, 64)))
    assert parse_grid_option("one_touch", "output_tokens=8;16") == (
        "output_tokens", ((8, 8), (16, 16)))


@pytest.mark.parametrize("item, words", [
    ("blocks=512,abc", "expected an integer"),
    ("nosuchfield=1,2", "unknown parameter"),
    ("lru.nosuch=1", "has no parameter"),
    ("nopolicy.x=1", "no policy 'nopolicy'"),
    ("contract.best_effort.rate=1", "contract.NAME.rho"),
    ("contract.best_effort.rho=0", "> 0"),
    ("alpha=inf", "finite"),
    ("profile=no-such-profile", "no-such-profile"),
    ("blocks=512,512", "listed twice"),
    ("seed=1,2", "the experiment's seeds"),
    ("blocks=", "expected KEY=V1,V2"),
])
def test_bad_grid_items_name_what_is_wrong(item, words):
    with pytest.raises(SpecError, match=words):
        parse_grid_option("one_touch", item)


def test_points_are_the_full_factorial_in_order():
    exp = Experiment(name="g", workload="one_touch", policies=("lru",), seeds=(0,),
                     base={"duration_s": 10.0},
                     grid=(parse_grid_option("one_touch", "blocks=512,1024"),
                           parse_grid_option("one_touch", "alpha=0.4,0.6,0.8")))
    pts = exp.points()
    assert [p.id for p in pts] == [f"p{i:03d}" for i in range(6)]
    assert pts[1].values == {"blocks": 512, "alpha": 0.6}
    assert pts[5].settings == {"duration_s": 10.0, "blocks": 1024, "alpha": 0.8}


def test_experiment_rejects_inconsistent_specs():
    with pytest.raises(SpecError, match="both fixed and swept"):
        Experiment(name="x", workload="one_touch", policies=("lru",), base={"blocks": 512},
                   grid=(("blocks", (512, 1024)),))
    with pytest.raises(SpecError, match="baseline"):
        Experiment(name="x", workload="one_touch", policies=("lru",), baseline="s3fifo")
    with pytest.raises(SpecError, match="name"):
        Experiment(name="a/b", workload="one_touch", policies=("lru",))


def test_policy_fields_and_contracts_resolve_into_the_run():
    settings = {"prefixshield.rho_scale": 2.0, "contract.best_effort.rho": 8.0, "blocks": 1024,
                "compat": "0.10", "duration_s": 10.0}
    assert resolve_policy("prefixshield", settings) == "prefixshield:rho_scale=2.0"
    assert resolve_policy("prefixshield:debt_gate=false", settings) == \
        "prefixshield:debt_gate=false,rho_scale=2.0"
    assert resolve_policy("lru", settings) == "lru"
    table = resolve_contracts(settings)
    assert table["best_effort"].rho_blocks_per_s == 8.0
    assert table["standard"].rho_blocks_per_s == 40.0
    spec = run_spec("one_touch", settings, 3, ("lru",))
    assert spec.engine.num_blocks == 1024 and spec.engine.vllm_compat == "0.10"
    assert spec.seed == 3 and spec.overrides == {"duration_s": 10.0}
    assert spec.contract_table["best_effort"].rho_blocks_per_s == 8.0


def test_a_contract_field_changes_the_attack_sizing_and_the_policy_refill():
    """contract.best_effort.rho halves the attacker's refill: at the same pressure ratio
    (low_and_slow's 1.25) its request rate halves in the trace."""
    from prefixshield.experiments.single import build_trace

    base = {"duration_s": 10.0, "base_rate": 0.6}
    t1, _ = build_trace(run_spec("low_and_slow", base, 0, ("lru",)))
    t2, _ = build_trace(run_spec("low_and_slow", {**base, "contract.best_effort.rho": 8.0}, 0,
                                 ("lru",)))
    assert t2.meta["attacker_rate"] == pytest.approx(t1.meta["attacker_rate"] / 2)


def test_toml_spec_file(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('''
[[experiment]]
name = "capacity"
workload = "one_touch"
policies = ["lru", "prefixshield:segmentation=false"]
seeds = 3
[experiment.base]
compat = "0.10"
duration_s = 10
[experiment.grid]
blocks = [512, 1024]
"prefixshield.rho_scale" = [0.5, 1]

[[experiment]]
name = "outputs"
workload = "low_and_slow"
policies = ["lru"]
seeds = [4, 5]
[experiment.grid]
output_tokens = [[1, 1], [16, 64]]
''')
    a, b = load_spec_file(path)
    assert a.seeds == (0, 1, 2) and a.base == {"compat": "0.10", "duration_s": 10.0}
    assert a.grid == (("blocks", (512, 1024)), ("prefixshield.rho_scale", (0.5, 1.0)))
    assert b.seeds == (4, 5) and b.grid == (("output_tokens", ((1, 1), (16, 64))),)
    # the canonical JSON form round-trips
    assert experiment_from_dict(a.to_dict()) == a


@pytest.mark.parametrize("text, words", [
    ('name = "x"\nworkload = "one_touch"\n', "missing key 'policies'"),
    ('name = "x"\nworkload = "one_touch"\npolicies = ["nope"]\n', "unknown policy"),
    ('name = "x"\nworkload = "one_touch"\npolicies = ["lru"]\ncolour = 1\n', "unknown key"),
    ('name = "x"\nworkload = "one_touch"\npolicies = ["lru"]\n[grid]\nblocks = ["a"]\n',
     "expected an integer"),
    ('name = "x"\nworkload = "one_touch"\npolicies = ["lru"]\nseeds = 0\n', "seeds must be >= 1"),
    ("name = [", "not valid TOML"),
])
def test_bad_spec_files_name_the_file_and_the_problem(tmp_path, text, words):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(SpecError, match=words) as e:
        load_spec_file(path)
    assert str(path) in str(e.value)


def test_policy_lists_mix_names_and_constructor_arguments():
    assert _policy_names(("lru,prefixshield:segmentation=false",)) == (
        "lru", "prefixshield:segmentation=false")
    assert _policy_names(("lru,prefixshield:segmentation=false,debt_gate=false,s3fifo",)) == (
        "lru", "prefixshield:segmentation=false,debt_gate=false", "s3fifo")
    assert _policy_names(("prefixshield:debt_gate=false", "lru")) == (
        "prefixshield:debt_gate=false", "lru")
    assert _policy_names(("all",)) == ("lru", "prefixshield", "s3fifo", "static_quota")


def test_one_value_for_a_pair_means_both():
    ptype = WORKLOADS["one_touch"].params_type
    assert parse_overrides(ptype, ["output_tokens=8"]) == {"output_tokens": (8, 8)}
    assert parse_overrides(ptype, ["output_tokens=8,16"]) == {"output_tokens": (8, 16)}
    assert parse_set_option("one_touch", "output_tokens=8") == ("output_tokens", (8, 8))


def test_a_bad_spec_is_refused_at_the_edge_and_writes_nothing(tmp_path):
    with pytest.raises(SpecError, match="unknown policy 'bogus'"):
        Experiment(name="x", workload="one_touch", policies=("lru", "bogus"))
    with pytest.raises(SpecError, match="give both contract.gold.rho and contract.gold.beta"):
        Experiment(name="x", workload="one_touch", policies=("lru",),
                   grid=(parse_grid_option("one_touch", "contract.gold.rho=3"),))
    ok = Experiment(name="x", workload="one_touch", policies=("lru",),
                    grid=(parse_grid_option("one_touch", "contract.gold.rho=3"),
                          parse_grid_option("one_touch", "contract.gold.beta=10")))
    assert resolve_contracts(ok.points()[0].settings)["gold"].beta_blocks == 10.0
    out = tmp_path / "never"
    r = CliRunner().invoke(main, ["sweep", "one_touch", "-p", "lru,bogus", "--out", str(out)])
    assert r.exit_code != 0 and "unknown policy 'bogus'" in r.output
    assert not out.exists()
