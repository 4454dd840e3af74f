"""Creation metering for every policy: the design's bucket, integrated exactly, and what a run
reports as the attacker's measured pressure and mean debt."""

import numpy as np
import pytest

from helpers import make_trace
from prefixshield.policies import make_policy
from prefixshield.simulator.config import EngineConfig
from prefixshield.simulator.costmodel import CostModel
from prefixshield.simulator.creation import _bucket_debt_integral, group_creation
from prefixshield.simulator.engine import Engine
from prefixshield.simulator.metrics import group_table, summarize


def _debt_by_brute_force(t, n, rho, beta, w0, w1, steps=200_000):
    """Debt sampled on a fine grid: balance = min(beta, ...) refilled between charges."""
    grid = np.linspace(w0, w1, steps, endpoint=False) + (w1 - w0) / (2 * steps)
    out = np.empty_like(grid)
    b, t_prev, j = beta, 0.0, 0
    for i, x in enumerate(grid):
        while j < len(t) and t[j] <= x:
            b = min(beta, b + rho * (t[j] - t_prev)) - n[j]
            t_prev = t[j]
            j += 1
        out[i] = max(0.0, -(b + rho * (x - t_prev)))
    return out.mean()


@pytest.mark.parametrize("window", [(0.0, 20.0), (3.0, 7.5), (12.0, 30.0)])
def test_mean_debt_is_the_exact_integral_of_the_bucket(window):
    t = np.array([0.5, 1.0, 1.0, 4.0, 9.0])
    n = np.array([100.0, 60.0, 10.0, 80.0, 5.0])
    rho, beta = 16.0, 128.0
    integral, end = _bucket_debt_integral(t, n, rho, beta, *window)
    mean = integral / (window[1] - window[0])
    assert mean == pytest.approx(_debt_by_brute_force(t, n, rho, beta, *window), rel=1e-4)
    assert end >= 0


def test_group_creation_pressure_is_blocks_in_the_window_over_refill():
    log = {"t_s": np.array([1.0, 2.0, 3.0, 11.0]), "group": np.array([0, 1, 0, 0]),
           "contract": np.array([0, 0, 0, 0]), "blocks": np.array([40, 7, 40, 40])}
    rho, beta = np.array([16.0]), np.array([128.0])
    c = group_creation(log, 0, rho, beta, (0.0, 10.0))
    assert c["created_blocks"] == 80
    assert c["pressure_ratio"] == pytest.approx(80 / (10 * 16))
    assert c["mean_debt_blocks"] == 0.0          # 80 blocks never overdraw a 128-block bucket
    silent = group_creation(log, 2, rho, beta, (0.0, 10.0))
    assert silent["created_blocks"] == 0 and silent["pressure_ratio"] == 0.0


def test_every_policy_reports_the_attackers_measured_pressure_and_debt():
    cost = CostModel(a_s=0.01, b_s_per_prefill_token=0.0, c_s_per_decode_seq=0.0,
                     d_s_per_context_token=0.0)
    rows = [dict(arrival_s=float(i), group="attacker", contract="best_effort", role="attacker",
                 prefix_id=i, segment_ids=[100 + i], segment_lengths=[16 * 20]) for i in range(10)]
    rows.append(dict(arrival_s=0.0, group="victim", role="victim", segment_ids=[1],
                     segment_lengths=[32]))
    trace = make_trace(sorted(rows, key=lambda r: r["arrival_s"]))
    trace.meta = {"pressure_window_s": [0.0, 10.0], "attacker_group": "attacker"}
    for policy in ("lru", "s3fifo", "static_quota", "prefixshield"):
        r = Engine(trace, make_policy(policy, 512), cost, EngineConfig()).run()
        s = summarize(r)
        # 10 requests x 20 full blocks of prompt (one output token: no decode block)
        assert s["attacker_pressure_ratio"] == pytest.approx(200 / (10 * 16)), policy
        assert s["attacker_mean_debt_blocks"] == 0.0      # 20 blocks/s vs 16: burst covers it
        table = group_table(r).set_index("group")
        assert table.loc["attacker", "pressure_ratio"] > 0
