"""Per-tenant answers: the rows come from each policy's group table, tenant by tenant, and a
paired comparison averages each tenant over the seeds a policy served."""

import numpy as np
import pandas as pd
from click.testing import CliRunner

from prefixshield.cli import main
from prefixshield.experiments.tenant_view import (TENANT_COLUMNS, by_tenant, display_frame,
                                                  mean_over_seeds, tenant_frame)


def table(groups, hit):
    return pd.DataFrame({"group": groups, "role": "benign", "requests": [10] * len(groups),
                         "hit_ratio": hit, **{c: 1.0 for c in TENANT_COLUMNS
                                              if c not in ("requests", "hit_ratio")}})


def test_rows_go_tenant_by_tenant_in_numeric_order():
    df = tenant_frame({"lru": table(["group10", "group2", "group1"], [0.1, 0.2, 0.3]),
                       "prefixshield": table(["group10", "group2", "group1"], [0.4, 0.5, 0.6])})
    ordered, left = by_tenant(df)
    assert left == 0
    assert list(zip(ordered["group"], ordered["policy"])) == [
        ("group1", "lru"), ("group1", "prefixshield"), ("group2", "lru"),
        ("group2", "prefixshield"), ("group10", "lru"), ("group10", "prefixshield")]
    disp = display_frame(ordered)
    assert disp["hit ratio"].tolist() == ["30.00%", "60.00%", "20.00%", "50.00%", "10.00%",
                                          "40.00%"]


def test_names_without_one_numbered_stem_keep_their_order():
    df = tenant_frame({"lru": table(["victim", "attacker"], [0.5, 0.0])})
    assert by_tenant(df)[0]["group"].tolist() == ["victim", "attacker"]


def test_an_older_groups_csv_without_a_column_shows_a_dash():
    old = table(["a"], [0.5]).drop(columns=["token_hit_ratio"])
    df = tenant_frame({"lru": old})
    assert np.isnan(df["token_hit_ratio"].iloc[0])
    assert display_frame(df)["token hit ratio"].tolist() == ["-"]


def test_the_busiest_tenants_are_kept():
    t = table(["a", "b", "c"], [0.1, 0.2, 0.3]).assign(requests=[5, 50, 20])
    ordered, left = by_tenant(tenant_frame({"lru": t}), max_tenants=2)
    assert ordered["group"].tolist() == ["b", "c"] and left == 1


def test_mean_over_seeds_counts_the_seeds_served():
    rows = pd.concat([tenant_frame({"lru": table(["a"], [0.2])}).assign(seed=0),
                      tenant_frame({"lru": table(["a"], [0.4])}).assign(seed=1),
                      tenant_frame({"x": table(["a"], [0.9])}).assign(seed=1)])
    m = mean_over_seeds(rows).set_index("policy")
    assert m.loc["lru", "seeds"] == 2 and np.isclose(m.loc["lru", "hit_ratio"], 0.3)
    assert m.loc["x", "seeds"] == 1


def test_compare_prints_and_writes_every_tenant_of_every_policy(tmp_path):
    out = tmp_path / "cmp.csv"
    r = CliRunner().invoke(main, ["compare", "one_touch", "-p", "lru,prefixshield", "--seeds",
                                  "2", "--set", "duration_s=8", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "per tenant: mean over 2 seeds, every policy" in r.output
    rows = pd.read_csv(f"{out}.tenants.csv")
    # the default population: the victim, the attacker and six background tenants
    groups = ("victim", "attacker", *(f"tenant{i}" for i in range(1, 7)))
    assert set(zip(rows["seed"], rows["policy"], rows["group"])) == {
        (s, p, g) for s in (0, 1) for p in ("lru", "prefixshield") for g in groups}
    # the victim's row equals the run's aggregate (the judged population is the victim)
    runs = pd.read_csv(out)
    v = rows[rows["group"] == "victim"].set_index(["seed", "policy"])["hit_ratio"]
    agg = runs.set_index(["seed", "policy"])["hit_ratio"]
    assert np.allclose(v.sort_index(), agg.sort_index())
