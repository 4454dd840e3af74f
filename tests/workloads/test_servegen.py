"""``servegen``: tenants are real production clients (ServeGen's per-client fits)."""

import numpy as np
import pytest

from prefixshield.workloads import generate, make_params
from prefixshield.workloads.servegen import servegen_clients


def test_the_shipped_data_holds_eight_clients_of_one_day():
    clients = servegen_clients()
    assert len(clients) == 8
    volumes = [c["requests_that_day"] for c in clients]
    assert volumes == sorted(volumes, reverse=True)
    for c in clients:
        assert len(c["windows"]) == 144 and len(c["lengths"]) == 4
        for lw in c["lengths"]:
            for key in ("input_tokens", "output_tokens"):
                q = lw[key]
                assert len(q) == 101 and q == sorted(q)
        assert {w["dist"] for w in c["windows"]} <= {"Gamma", "Weibull", None}


def test_same_seed_same_trace_other_seed_other_trace():
    a, b = generate("servegen", seed=3, base_rate=2.0), generate("servegen", seed=3, base_rate=2.0)
    assert a.equals(b)
    assert not a.equals(generate("servegen", seed=4, base_rate=2.0))


def test_tenants_keep_the_clients_relative_rates_and_lengths():
    tr = generate("servegen", base_rate=4.0, duration_s=1200.0, num_tenants=3)
    shares = tr.meta["rate_shares"]
    counts = tr.requests["group"].value_counts(normalize=True)
    for group, share in shares.items():
        assert counts.get(group, 0.0) == pytest.approx(share, abs=0.05)
    # heterogeneous: the first client dominates, as in the data
    assert max(shares, key=shares.get) == "client61"
    assert shares["client61"] > 2 * min(shares.values())
    from prefixshield.workloads.servegen import _lengths_at

    p = make_params("servegen", base_rate=4.0, duration_s=1200.0, num_tenants=3)
    lengths = tr.prompt_lengths()
    for client in p.tenants:
        mine = lengths[(tr.requests["group"] == f"client{client['client']}").to_numpy()]
        published = _lengths_at(client, p.start)["input_tokens"]
        if len(mine) > 50:  # the draws' median lies within the published inter-quartile range
            assert published[25] <= np.median(mine) <= published[75]


def test_every_request_fits_the_pool_and_shares_its_tenant_system_prompt():
    tr = generate("servegen", base_rate=3.0, num_blocks=128, block_size=16,
                  system_prompt_tokens=256)
    need = tr.prompt_lengths() + tr.requests["output_tokens"].to_numpy()
    assert need.max() <= 127 * 16
    lengths = tr.prompt_lengths()
    for group, sub in tr.requests.groupby("group"):
        longer = sub[lengths[sub.index] > 256]
        first = {int(ids[0]) for ids in longer["segment_ids"]}
        assert len(first) <= 1, group  # one system prompt per tenant
    assert tr.requests["output_tokens"].min() >= 1


def test_the_default_start_is_the_busiest_hour_and_bad_values_are_refused():
    p = make_params("servegen")
    rates = np.sum([[w["rate"] for w in c["windows"]] for c in p.tenants], axis=0)
    hourly = np.convolve(rates, np.ones(6), mode="valid")
    assert p.start == 600 * int(np.argmax(hourly))
    with pytest.raises(ValueError, match="num_tenants"):
        make_params("servegen", num_tenants=9)
    with pytest.raises(ValueError, match="start_s"):
        make_params("servegen", start_s=90000.0)
