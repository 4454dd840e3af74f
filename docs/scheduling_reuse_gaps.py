"""The reuse gaps behind VTC's effect on LRU in one_touch (docs/scheduling.md): for every
victim request, the attacker blocks created between it and the previous admission of the same
victim prefix, under FCFS and VTC, seeds 0-2, LRU at 512 blocks.

    python docs/scheduling_reuse_gaps.py
"""
import numpy as np
from prefixshield.experiments.single import RunSpec, build_trace
from prefixshield.simulator.config import EngineConfig
from prefixshield.simulator.costmodel import load_profile
from prefixshield.simulator.engine import Engine
from prefixshield.policies import make_policy
from prefixshield.scheduling import SchedulerConfig
prof = load_profile("l4-qwen2.5-1.5b")
for seed in (0,1,2):
  trace,_ = build_trace(RunSpec(workload="one_touch", policies=("lru",), engine=EngineConfig(), profile=prof, seed=seed))
  for sc in ("fcfs","vtc"):
    r = Engine(trace, make_policy("lru",512), prof.cost, EngineConfig(scheduler=SchedulerConfig(sc))).run().records
    r = r.assign(adm=r.arrival_s + r.queue_s).sort_values(["adm","request_id"]).reset_index(drop=True)
    last = {}; gaps = []; hits = []
    for i, row in r.iterrows():
        if row.role == "victim":
            if row.prefix_id in last:
                between = r.iloc[last[row.prefix_id]+1:i]
                gaps.append(int(between.loc[between.role=="attacker","new_blocks"].sum()))
                if row.measured: hits.append(row.hit_fraction > 0)
            last[row.prefix_id] = i
    g = np.array(gaps)
    print(seed, sc, "attacker blocks created between same-prefix victim admissions: median", int(np.median(g)), "p10", int(np.percentile(g,10)), "share < 400:", round((g<400).mean(),3), "victim hit share", round(np.mean(hits),3))
