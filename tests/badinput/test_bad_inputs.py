"""Bad inputs end in one clear ``Error:`` line, never a traceback or a meaningless exit 0.

Each case is (name, command-line arguments, words the error must contain). Files the cases need
(profiles, traces) are written into a temporary folder; ``{tmp}`` in an argument is replaced
by it. A case passes when the command exits non-zero, prints no traceback, and its output names
what was wrong.
"""

import json
import os

import pytest
from click.testing import CliRunner

from prefixshield.cli import main
from prefixshield.parquetfiles import read_frame
from prefixshield.traces.io import read_trace, write_trace

GOOD_PROFILE = """name = "p"
[cost]
a_s = {a}
b_s_per_prefill_token = {b}
c_s_per_decode_seq = {c}
d_s_per_context_token = {d}
[provenance]
status = "test"
hardware = "x"
model = "x"
vllm_version = "x"
attention_backend = "x"
date = "x"
method = "x"
"""

SMALL = ["--set", "duration_s=8"]
HUGE = "99999999999999999999"
GRID_AXES = [("alpha", 1, lambda i: f"{i / 100:g}"), ("duration_s", 1, str),
             ("prefix_tokens", 100, str), ("vocab_size", 1000, str),
             ("max_num_seqs", 1, str)]
"""Five axes of 100 values each: a 10^10-point grid (the first three: 10^6)."""
SPEC = 'name = "x"\nworkload = "one_touch"\npolicies = ["lru"]\n'

CASES = [
    # --- the tracebacks an audit found
    ("seed too large", ["run", "one_touch", "--seed", "99999999999999999999999"], "--seed"),
    ("negative seed", ["run", "one_touch", "--seed", "-1"], "--seed"),
    ("duration inf", ["run", "one_touch", "--set", "duration_s=inf"], "finite"),
    ("attacker_rate inf", ["run", "one_touch", "--set", "attacker_rate=inf"], "finite"),
    ("pressure_start inf", ["run", "one_touch", "--set", "pressure_start_s=inf"], "finite"),
    ("vocab 1e20", ["run", "one_touch", "--set", "vocab_size=1e20"], "integer"),
    ("vocab huge", ["run", "one_touch", "--set", "vocab_size=100000000000"], "vocab_size"),
    ("ghost inf", ["run", "one_touch", "-p", "s3fifo:ghost_size_ratio=inf"], "finite"),
    ("history inf", ["run", "one_touch", "-p", "prefixshield:history_factor=inf"], "finite"),
    ("history 1e9", ["run", "one_touch", "-p", "prefixshield:history_factor=1e9"],
     "history_factor must be in"),
    ("ghost 1e12", ["run", "one_touch", "-p", "s3fifo:ghost_size_ratio=1e12"],
     "ghost_size_ratio must be in"),
    ("profile all zero", ["run", "one_touch", "--profile", "{tmp}/zero.toml"], "no time"),
    ("profile a inf", ["run", "one_touch", "--profile", "{tmp}/inf.toml"], "finite number"),
    ("profile a 1e300", ["run", "one_touch", "--profile", "{tmp}/huge.toml"], "[0, 10]"),
    ("profile negative", ["run", "one_touch", "--profile", "{tmp}/neg.toml"], "a_s"),
    ("profile not toml", ["run", "one_touch", "--profile", "{tmp}/broken.toml"], "not valid TOML"),
    ("profile missing", ["run", "one_touch", "--profile", "{tmp}/nope.toml"], "nope.toml"),
    ("profile unknown name", ["run", "one_touch", "--profile", "h100-nothing"], "unknown profile"),
    ("empty trace", ["run", "{tmp}/empty.parquet"], "no requests"),
    ("blocks too many", ["run", "one_touch", "--blocks", "1000000000"], "GiB"),
    ("blocks 1", ["run", "one_touch", "--blocks", "1"], "--blocks"),
    ("block size 0", ["run", "one_touch", "--block-size", "0"], "--block-size"),
    ("inspect block size 0", ["trace", "inspect", "{tmp}/good.parquet", "--block-size", "0"],
     "--block-size"),
    ("out is a file path", ["run", "one_touch", *SMALL, "--out", "{tmp}/afile/sub"],
     "not a writable folder"),
    ("out not a run folder", ["run", "one_touch", *SMALL, "--out", "{tmp}/busy"],
     "not empty and not the results"),
    # --- trace files
    ("trace negative seed", ["run", "{tmp}/negseed.parquet"], "seed must be in"),
    ("trace negative prefix", ["run", "{tmp}/negprefix.parquet"], "prefix_id must be >= 0"),
    ("trace duplicate ids", ["run", "{tmp}/dupid.parquet"], "duplicate"),
    ("trace decreasing arrivals", ["run", "{tmp}/decreasing.parquet"], "decreases"),
    # --- streamed runs (--stream)
    ("stream decreasing arrivals",
     ["run", "{tmp}/decreasing.parquet", "--stream", "--out", "{tmp}/s1"], "decreases"),
    ("stream without out", ["run", "one_touch", *SMALL, "--stream"], "--out"),
    ("stream replicas", ["run", "one_touch", *SMALL, "--stream", "--replicas", "2", "--out",
                         "{tmp}/s3"], "--replicas"),
    ("stream aimed one_touch", ["run", "one_touch", *SMALL, "--set", "aim=session", "--stream",
                                "--out", "{tmp}/s4"], "cannot be streamed"),
    ("stream sharegpt", ["run", "sharegpt", *SMALL, "--stream", "--out", "{tmp}/s5"],
     "cannot be streamed"),
    ("stream empty trace", ["run", "{tmp}/empty.parquet", "--stream", "--out", "{tmp}/s7"],
     "no requests"),
    ("stream nothing measured", ["run", "{tmp}/unmeasured.parquet", "--stream", "--out",
                                 "{tmp}/s8"], "no request of the trace is measured"),
    ("stream out holds the trace", ["run", "{tmp}/good.parquet", "--stream", "--out", "{tmp}"],
     "holds the input"),
    ("out holds the trace", ["run", "{tmp}/good.parquet", "--out", "{tmp}"], "holds the input"),
    ("trace zero output", ["run", "{tmp}/zeroout.parquet"], "output_tokens must be >= 1"),
    ("trace bad role", ["run", "{tmp}/badrole.parquet"], "role must be one of"),
    ("trace not parquet", ["run", "{tmp}/junk.parquet"], "junk.parquet"),
    ("trace missing", ["run", "{tmp}/missing.parquet"], "missing.parquet"),
    ("trace nothing measured", ["run", "{tmp}/unmeasured.parquet"], "no request"),
    # --- CLI options and policy specs
    ("unknown workload", ["run", "no_such"], "unknown workload"),
    ("unknown policy", ["run", "one_touch", "-p", "nope"], "unknown policy"),
    ("unknown policy param", ["run", "one_touch", "-p", "lru:x=1"], "has no parameter"),
    ("policy param type", ["run", "one_touch", "-p", "prefixshield:debt_gate=maybe"],
     "true or false"),
    ("policy spec syntax", ["run", "one_touch", "-p", "prefixshield:debt_gate"], "key=value"),
    ("rho_scale zero", ["run", "one_touch", "-p", "prefixshield:rho_scale=0"], "rho_scale"),
    ("set unknown", ["run", "one_touch", "--set", "colour=3"], "unknown parameter"),
    ("set syntax", ["run", "one_touch", "--set", "duration_s"], "key=value"),
    ("set negative duration", ["run", "one_touch", "--set", "duration_s=-3"], "duration_s"),
    ("victim over the base load", ["run", "one_touch", *SMALL, "--set", "victim_rate=9"],
     "exceeds the base rate"),
    ("base load with nobody for it", ["run", "one_touch", *SMALL, "--set",
                                      "background_groups=0"], "no background group sends"),
    ("population unknown", ["run", "low_and_slow", "--set", "population=three"],
     "population must be one of"),
    ("set nan", ["run", "one_touch", "--set", "duration_s=nan"], "finite"),
    ("output range reversed", ["run", "one_touch", "--set", "output_tokens=64,16"],
     "output_tokens"),
    ("set on a trace file", ["run", "{tmp}/good.parquet", "--set", "duration_s=3"],
     "generated workloads"),
    ("alpha zero", ["run", "one_touch", "--alpha", "0"], "alpha"),
    ("compat", ["run", "one_touch", "--compat", "0.9"], "--compat"),
    ("compare seeds 0", ["compare", "one_touch", "--seeds", "0"], "--seeds"),
    ("sweep grid type", ["sweep", "one_touch", "--grid", "blocks=many", "--out", "{tmp}/s1"],
     "expected an integer"),
    ("sweep grid field", ["sweep", "one_touch", "--grid", "nope=1", "--out", "{tmp}/s2"],
     "unknown parameter"),
    ("sweep bad policy", ["sweep", "one_touch", "-p", "lru,bogus", "--out", "{tmp}/s3"],
     "unknown policy"),
    ("sweep other spec", ["sweep", "one_touch", "--seeds", "2", "--out", "{tmp}/store"],
     "another spec"),
    ("report not a store", ["report", "{tmp}/busy"], "not a results store"),
    ("regress not a store", ["regress", "{tmp}/busy"], "not a results store"),
    ("regress tol", ["regress", "{tmp}/store", "--tol", "hit_ratio=x"], "expected a number"),
    ("regress tol metric", ["regress", "{tmp}/store", "--tol", "colour=1"], "not a compared"),
    ("spec file toml", ["sweep", "--spec", "{tmp}/broken.toml", "--out", "{tmp}/s4"],
     "not valid TOML"),
    ("reproduce seeds", ["reproduce", "--seeds", "0", "--out", "{tmp}/r"], "--seeds"),
    ("import missing file", ["trace", "import", "mooncake", "{tmp}/nothing.jsonl",
                             "{tmp}/o.parquet"], "no such file"),
    ("import bad json", ["trace", "import", "mooncake", "{tmp}/bad.jsonl", "{tmp}/o.parquet"],
     "line 2"),
    # --- validate / validate-matrix: refused before vLLM starts
    ("validate no profile", ["validate", "one_touch", "--out", "{tmp}/v"], "--calibrate"),
    ("validate both", ["validate", "one_touch", "--calibrate", "--profile", "cpu-tiny-qwen2",
                       "--out", "{tmp}/v"], "drop --profile"),
    ("validate bad set", ["validate", "one_touch", "--profile", "cpu-tiny-qwen2", "--set",
                          "colour=red", "--out", "{tmp}/v"], "colour"),
    ("validate bad profile", ["validate", "one_touch", "--profile", "{tmp}/neg.toml", "--out",
                              "{tmp}/v"], "a_s"),
    ("matrix workload", ["validate-matrix", "-w", "borrowing", "--profile", "cpu-tiny-qwen2",
                         "--out", "{tmp}/m"], "unknown matrix workload"),
    ("matrix bad set", ["validate-matrix", "--profile", "cpu-tiny-qwen2", "--set", "x=1",
                        "--out", "{tmp}/m"], "unknown parameter"),
    # --- issue 26's audit: integers past C's ranges and sizes past memory, refused up front
    ("batched tokens huge", ["run", "one_touch", "--max-num-batched-tokens", HUGE],
     "--max-num-batched-tokens"),
    ("max seqs huge", ["run", "one_touch", "--max-num-seqs", HUGE], "--max-num-seqs"),
    ("compare seeds huge", ["compare", "one_touch", "--seeds", HUGE], "--seeds"),
    ("compare seeds 1e8", ["compare", "one_touch", "--seeds", "100000000"], "--seeds"),
    ("policy int huge", ["run", "one_touch", "-p", f"prefixshield:max_debt_samples={HUGE}"],
     "max_debt_samples: must be in"),
    ("set int huge", ["run", "one_touch", "--set", f"prefix_tokens={HUGE}"],
     "prefix_tokens: must be in"),
    ("inspect block size huge", ["trace", "inspect", "{tmp}/good.parquet", "--block-size", HUGE],
     "--block-size"),
    ("duration 1e12", ["run", "one_touch", "--set", "duration_s=1e12"], "shorten duration_s"),
    ("hot prefixes 1e9", ["run", "one_touch", "--set", "num_hot_prefixes=1000000000"],
     "victim prefixes"),
    ("alpha 1e300", ["run", "one_touch", "--alpha", "1e300"], "--alpha"),
    ("import groups 1e20", ["trace", "import", "mooncake", "{tmp}/bad.jsonl", "{tmp}/o.parquet",
                            "--groups", "1e20"], "--groups"),
    ("sweep seeds 1e8", ["sweep", "one_touch", "--seeds", "100000000", "--out", "{tmp}/s5"],
     "--seeds"),
    ("sweep workers huge", ["sweep", "one_touch", "--workers", HUGE, "--out", "{tmp}/s5"],
     "--workers"),
    ("grid 1e10 points", ["sweep", "one_touch", *[a for k, lo, f in GRID_AXES for a in (
        "--grid", f"{k}=" + ",".join(f(lo + i) for i in range(100)))], "--out", "{tmp}/s6"],
     "the grid has 10,000,000,000 points"),
    ("grid 1e6 points", ["sweep", "one_touch", *[a for k, lo, f in GRID_AXES[:3] for a in (
        "--grid", f"{k}=" + ",".join(f(lo + i) for i in range(100)))], "--out", "{tmp}/s6"],
     "the grid has 1,000,000 points"),
    ("overhead 2^40 blocks", ["sweep", "--spec", "{tmp}/overhead.toml", "--out", "{tmp}/s7"],
     "overhead experiments take integer blocks in"),
    ("attack trials 1e9", ["attack-search", "--trials", "1000000000", "--out", "{tmp}/a1"],
     "--trials"),
    ("corrupt gzip", ["trace", "import", "mooncake", "{tmp}/corrupt.jsonl.gz", "{tmp}/o.parquet"],
     "cannot read"),
    ("nested json lines", ["trace", "import", "mooncake", "{tmp}/deep.jsonl", "{tmp}/o.parquet"],
     "nested too deeply"),
    ("nested json array", ["trace", "import", "sharegpt", "{tmp}/deep.json", "{tmp}/o.parquet"],
     "nested too deeply"),
    ("store.json null", ["report", "{tmp}/st_null"], "expected a JSON object"),
    ("store.json list", ["report", "{tmp}/st_list"], "expected a JSON object"),
    ("store.json number", ["report", "{tmp}/st_num"], "expected a JSON object"),
    ("regress store.json list", ["regress", "{tmp}/st_list"], "expected a JSON object"),
    ("cell seed vs file name", ["report", "{tmp}/st_seed"], "its file name says"),
    ("spec grid = 5", ["sweep", "--spec", "{tmp}/grid5.toml", "--out", "{tmp}/s8"],
     "grid must map each field"),
    # --- the audit's silent wrong results, now refused
    ("regress out is baseline", ["regress", "{tmp}/store", "--out", "{tmp}/store/../store"],
     "is the baseline"),
    ("set seed", ["run", "one_touch", "--set", "seed=5"], "use --seed"),
    ("set num_blocks", ["run", "one_touch", "--set", "num_blocks=1024"], "use --blocks"),
    ("set blocks", ["run", "one_touch", "--set", "blocks=1024"], "use --blocks"),
    ("set block_size", ["run", "one_touch", "--set", "block_size=32"], "use --block-size"),
    ("set alpha", ["run", "one_touch", "--set", "alpha=0.9"], "use --alpha"),
    ("compare set seed", ["compare", "one_touch", "--set", "seed=5"], "use --seed"),
    ("arrivals near 1e300", ["run", "{tmp}/far.parquet"], "arrival_s must be a finite number"),
    ("experiment named ..", ["sweep", "one_touch", "--name", "..", "--out", "{tmp}/s9"],
     "experiment name '..'"),
    ("experiment named $x$", ["sweep", "one_touch", "--name", "$x$", "--out", "{tmp}/s9"],
     "experiment name '$x$'"),
    ("import out is src", ["trace", "import", "mooncake", "{tmp}/bad.jsonl", "{tmp}/bad.jsonl"],
     "is the input SRC"),
    ("spec seeds twice", ["sweep", "--spec", "{tmp}/seeds00.toml", "--out", "{tmp}/s10"],
     "a seed is listed twice"),
    ("spec records no", ["sweep", "--spec", "{tmp}/recno.toml", "--out", "{tmp}/s11"],
     "records must be true or false"),
    ("run out symlink", ["run", "{tmp}/good.parquet", "--out", "{tmp}/link"], "symbolic link"),
    ("sweep out symlink", ["sweep", "one_touch", "--out", "{tmp}/link"], "symbolic link"),
    ("report no readable cell", ["report", "{tmp}/st_empty"], "no cell of its 1 is written"),
    ("attack-search all trials failed", [
        "attack-search", "-p", "static_quota", "--trials", "1", "--batch", "1", "--seeds", "1",
        "--eval-seeds", "1", "--no-warm-start", "--set", "prefix_tokens=6144", "--set",
        "duration_s=2", "--executor", "inprocess", "--out", "{tmp}/a2"],
     "every trial failed against static_quota"),
    # --- schedulers and per-tenant limits
    ("unknown scheduler", ["run", "one_touch", "--scheduler", "lottery"], "--scheduler"),
    ("limit zero", ["run", "one_touch", "--tenant-limit", "max_running=0"], "between 1"),
    ("limit negative", ["compare", "one_touch", "--tenant-limit", "victim:max_blocks=-4"],
     "between 1"),
    ("limit unknown key", ["run", "one_touch", "--tenant-limit", "max_rps=3"], "unknown limit"),
    ("limit not a number", ["run", "one_touch", "--tenant-limit", "max_running=lots"],
     "integer"),
    ("limit twice", ["run", "one_touch", "--tenant-limit", "max_running=2",
                     "--tenant-limit", "max_running=3"], "twice"),
    ("vtc weight inf", ["run", "one_touch", "--scheduler", "vtc", "--vtc-weights", "1,inf"],
     "finite"),
    ("vtc weight nan", ["run", "one_touch", "--scheduler", "vtc", "--vtc-weights", "nan,2"],
     "finite"),
    ("vtc weights both 0", ["run", "one_touch", "--scheduler", "vtc", "--vtc-weights", "0,0"],
     "both be 0"),
    ("vtc weights one number", ["run", "one_touch", "--scheduler", "vtc", "--vtc-weights", "2"],
     "IN,OUT"),
    ("vtc weights without vtc", ["run", "one_touch", "--vtc-weights", "1,2"], "--scheduler vtc"),
    ("kvtc kv weight inf", ["run", "one_touch", "--scheduler", "kvtc", "--vtc-weights",
                            "1,2,inf"], "kvtc_kv_weight must be a finite number"),
    ("kvtc kv weight nan", ["run", "one_touch", "--scheduler", "kvtc", "--vtc-weights",
                            "1,2,nan"], "kvtc_kv_weight must be a finite number"),
    ("kvtc kv weight negative", ["compare", "one_touch", "--scheduler", "kvtc",
                                 "--vtc-weights", "1,2,-0.5"], ">= 0"),
    ("kvtc token weight negative", ["run", "one_touch", "--scheduler", "kvtc",
                                    "--vtc-weights", "-1,2,1"], "vtc_input_weight"),
    ("kvtc weights charge nothing", ["run", "one_touch", "--scheduler", "kvtc",
                                     "--vtc-weights", "0,0,0"], "kvtc weights charge nothing"),
    ("kvtc weights four numbers", ["run", "one_touch", "--scheduler", "kvtc",
                                   "--vtc-weights", "1,2,3,4"], "IN,OUT or IN,OUT,KV"),
    ("kv weight with vtc", ["run", "one_touch", "--scheduler", "vtc", "--vtc-weights",
                            "1,2,3"], "IN,OUT (two numbers)"),
    ("priority for no group", ["run", "one_touch", "--scheduler", "priority",
                               "--priority", "ghost=1"], "'ghost', which the trace does not"),
    ("priority not a number", ["run", "one_touch", "--scheduler", "priority",
                               "--priority", "victim=high"], "integer"),
    ("priority without priority", ["run", "one_touch", "--priority", "victim=1"],
     "--scheduler priority"),
    ("limit for no group", ["compare", "one_touch", "--tenant-limit", "ghost:max_running=2"],
     "'ghost', which the trace does not"),
    ("max_blocks below a request", ["run", "one_touch", "--tenant-limit",
                                    "victim:max_blocks=3"], "wait for ever"),
    ("sweep unknown scheduler", ["sweep", "one_touch", "--grid", "scheduler=fcfs,lottery",
                                 "--out", "{tmp}/sched"], "scheduler"),
    ("sweep limit zero", ["sweep", "one_touch", "--set", "tenant_max_running=0",
                          "--out", "{tmp}/sched0"], "tenant_max_running"),
    # --- options a run silently ignored, and aim fields the aim does not read
    ("run workers, inprocess", ["run", "one_touch", "--replicas", "2", "--workers", "4"],
     "--workers: needs --executor process or ray"),
    ("compare workers, inprocess", ["compare", "one_touch", "--replicas", "2", "--executor",
                                    "inprocess", "--workers", "4"],
     "--workers: needs --executor process or ray"),
    ("prefix aim, prefix under a block", ["run", "one_touch", "--set", "aim=prefix", "--set",
                                          "prefix_tokens=8"],
     "8-token prefix is shorter than one 16-token block"),
    ("aim_replicas, aim=none", ["run", "one_touch", "--set", "aim_replicas=4"],
     "aim_replicas is read by aim=session only (aim is 'none')"),
    ("run set tenant limit", ["run", "one_touch", "--set", "tenant_max_running=2"],
     "use --tenant-limit [GROUP:]KEY=N"),
    # --- issue 31: pool sizing and trace files in compare, refused before any simulation
    ("blocks auto, generated workload", ["run", "one_touch", "--blocks", "auto"],
     "--blocks auto sizes the pool from a trace file; 'one_touch' is a generated workload"),
    ("compare blocks auto, generated", ["compare", "one_touch", "--blocks", "auto:0.5"],
     "--blocks auto sizes the pool from a trace file"),
    ("blocks auto:0", ["run", "{tmp}/good.parquet", "--blocks", "auto:0"],
     "auto:FRACTION must be in (0, 1], got 0"),
    ("blocks auto:1.5", ["compare", "{tmp}/good.parquet", "--blocks", "auto:1.5"],
     "auto:FRACTION must be in (0, 1], got 1.5"),
    ("blocks auto:half", ["run", "{tmp}/good.parquet", "--blocks", "auto:half"],
     "FRACTION must be a number, got 'half'"),
    ("blocks automatic", ["run", "{tmp}/good.parquet", "--blocks", "automatic"],
     "expected an integer >= 2 or auto[:FRACTION]"),
    ("static_quota share below a request", ["run", "{tmp}/good.parquet", "-p",
                                            "lru,static_quota", "--blocks", "120"],
     "under static_quota, request"),
    ("compare static_quota share", ["compare", "{tmp}/good.parquet", "-p", "static_quota",
                                    "--blocks", "120", "--seeds", "2"],
     "it could never be admitted; the smallest pool that serves it is"),
    ("pool below a request, any policy", ["run", "{tmp}/good.parquet", "-p", "lru",
                                          "--blocks", "50"], "under lru, request"),
    ("blocks auto with --stream", ["run", "{tmp}/good.parquet", "--blocks", "auto",
                                   "--stream", "--out", "{tmp}/s31"],
     "--stream never holds: give --blocks N"),
    ("compare trace file --set", ["compare", "{tmp}/good.parquet", "--set", "duration_s=3"],
     "generated workloads"),
    ("compare scale a generated workload", ["compare", "one_touch", "--scale-to-engine", "0.5",
                                            "--seeds", "2"], "scaling to the engine is for "
                                                             "trace files"),
    # --- errors once found only after store.json (and cells) were written: now before it
    ("spec policy param 0", ["sweep", "--spec", "{tmp}/pol0.toml", "--out", "{tmp}/n1"],
     "rho_scale must be a finite number > 0"),
    ("spec grid policy param 0", ["sweep", "--spec", "{tmp}/gridpol0.toml", "--out",
                                  "{tmp}/n2"], "point prefixshield.rho_scale=0.0: policy"),
    ("spec generator refuses", ["sweep", "--spec", "{tmp}/hot0.toml", "--out", "{tmp}/n3"],
     "point num_hot_prefixes=0: num_hot_prefixes must be >= 1"),
    ("spec max_blocks below a request", ["sweep", "--spec", "{tmp}/maxblk.toml", "--out",
                                         "{tmp}/n4"], "point tenant_max_blocks=1"),
    ("sweep policy param 0", ["sweep", "one_touch", "-p", "lru,prefixshield:rho_scale=0",
                              *SMALL, "--out", "{tmp}/n5"], "rho_scale"),
    ("sweep grid blocks 1", ["sweep", "one_touch", "--grid", "blocks=1,512", "--out",
                             "{tmp}/n6"], "--grid blocks: must be an integer >= 2"),
    ("sweep grid block_size 0", ["sweep", "one_touch", "--grid", "block_size=0",
                                 "--out", "{tmp}/n7"], "--grid block_size: must be"),
    ("sweep grid max_num_seqs 0", ["sweep", "one_touch", "--grid", "max_num_seqs=0,4",
                                   "--out", "{tmp}/n8"], "--grid max_num_seqs: must be"),
    ("spec batched tokens 0", ["sweep", "--spec", "{tmp}/mnbt0.toml", "--out", "{tmp}/n9"],
     "max_num_batched_tokens: must be an integer >= 1"),
    ("spec blocks past memory", ["sweep", "--spec", "{tmp}/bigpool.toml", "--out",
                                 "{tmp}/n10"], "use fewer --blocks"),
    ("attack-search policy param 0", [
        "attack-search", "-p", "prefixshield:rho_scale=0", "--trials", "1", "--batch", "1",
        "--seeds", "1", "--eval-seeds", "1", "--no-warm-start", *SMALL, "--executor",
        "inprocess", "--out", "{tmp}/n11"], "rho_scale must be a finite number > 0"),
    ("attack-search batched tokens 0", [
        "attack-search", "-p", "lru", "--trials", "1", "--set", "max_num_batched_tokens=0",
        "--out", "{tmp}/n12"], "--set max_num_batched_tokens: must be an integer >= 1"),
    # --- the fleet ledger as sweep fields
    ("sweep ledger unknown", ["sweep", "one_touch", "--set", "replicas=2", "--grid",
                              "ledger=replica,shared", "--out", "{tmp}/n13"],
     "--grid ledger: must be one of replica, fleet"),
    ("sweep ledger staleness -1", ["sweep", "one_touch", "--set", "replicas=2", "--set",
                                   "ledger=fleet", "--grid", "ledger_staleness_s=0,-1",
                                   "--out", "{tmp}/n14"], "ledger_staleness_s: must be"),
    ("sweep staleness, replica ledger", ["sweep", "one_touch", "--set", "replicas=2", "--set",
                                         "ledger_staleness_s=1", "--out", "{tmp}/n15"],
     "a ledger staleness needs the fleet ledger"),
    ("sweep ledger without replicas", ["sweep", "one_touch", "--set", "ledger=fleet",
                                       "--out", "{tmp}/n16"], "need replicas"),
    # --- attack-search's --set against its own options; a router_key no router reads
    ("attack-search set router", ["attack-search", "--replicas", "4", "--set",
                                  "router=kv_aware", "--out", "{tmp}/n17"],
     "router is set by --router, not --set (use --router NAME)"),
    ("attack-search set replicas", ["attack-search", "--replicas", "4", "--set", "replicas=2",
                                    "--out", "{tmp}/n18"], "use --replicas"),
    ("attack-search set blocks", ["attack-search", "--blocks", "2048", "--set", "blocks=1024",
                                  "--out", "{tmp}/n19"], "use --blocks"),
    ("attack-search set router_key", ["attack-search", "--replicas", "4", "--set",
                                      "router_key=group", "--out", "{tmp}/n20"],
     "use --router-key"),
    ("attack-search set tenant limit", ["attack-search", "--set", "tenant_max_blocks=64",
                                        "--out", "{tmp}/n21"], "use --tenant-limit KEY=N"),
    ("attack-search router-key, round_robin", ["attack-search", "--replicas", "4",
                                               "--router-key", "group", "--out", "{tmp}/n22"],
     "--router-key is read by --router session, not round_robin"),
    ("sweep router_key, round_robin", ["sweep", "one_touch", "--set", "replicas=2", "--set",
                                       "router_key=group", "--out", "{tmp}/n23"],
     "router_key is read by router session, not round_robin"),
    ("sweep router_key, grid router", ["sweep", "one_touch", "--set", "replicas=2", "--set",
                                       "router_key=group", "--grid",
                                       "router=session,kv_aware", "--out", "{tmp}/n24"],
     "point router=kv_aware: router_key is read by router session, not kv_aware"),
    ("sweep aim_replicas, aim=prefix", ["sweep", "one_touch", "--set", "aim=prefix", "--set",
                                        "aim_replicas=4", "--out", "{tmp}/n25"],
     "aim_replicas is read by aim=session only"),
]
NO_STORE = {c[0] for c in CASES[CASES.index(next(c for c in CASES
                                                 if c[0] == "spec policy param 0")):]}
"""Cases whose --out must hold no store.json afterwards (the corrected command can use it)."""


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    (d / "zero.toml").write_text(GOOD_PROFILE.format(a=0, b=0, c=0, d=0))
    (d / "inf.toml").write_text(GOOD_PROFILE.format(a="inf", b=0, c=0, d=0))
    (d / "huge.toml").write_text(GOOD_PROFILE.format(a="1e300", b=0, c=0, d=0))
    (d / "neg.toml").write_text(GOOD_PROFILE.format(a=-1, b=0, c=0, d=0))
    (d / "broken.toml").write_text("name = [\n")
    (d / "afile").write_text("x")
    (d / "busy").mkdir()
    (d / "busy" / "mine.txt").write_text("x")
    (d / "junk.parquet").write_text("not parquet")
    (d / "bad.jsonl").write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, '
                                 '"hash_ids": [1]}\n{"timestamp": 1, \n')
    r = CliRunner().invoke(main, ["trace", "generate", "one_touch", str(d / "good.parquet"),
                                  "--set", "duration_s=8"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    good = read_trace(d / "good.parquet")

    def variant(name, edit):
        import dataclasses

        df = good.requests.copy()
        t = dataclasses.replace(good, requests=df)
        res = edit(t)
        t = t if res is None else res
        _write_unchecked(t, d / f"{name}.parquet")

    variant("empty", lambda t: _replace(t, requests=t.requests.iloc[0:0]))
    variant("negseed", lambda t: _replace(t, seed=-5))
    variant("negprefix", lambda t: t.requests.__setitem__("prefix_id", -1))
    variant("dupid", lambda t: t.requests.__setitem__("request_id", 7))
    variant("decreasing", lambda t: t.requests.__setitem__(
        "arrival_s", t.requests["arrival_s"].to_numpy()[::-1].copy()))
    variant("zeroout", lambda t: t.requests.__setitem__("output_tokens", 0))
    variant("badrole", lambda t: t.requests.__setitem__("role", "villain"))
    variant("unmeasured", lambda t: t.requests.__setitem__("measured", False))
    r = CliRunner().invoke(main, ["sweep", "one_touch", "--seeds", "1", "-p", "lru",
                                  "--set", "duration_s=4", "--executor", "inprocess",
                                  "--no-report", "--out", str(d / "store")],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    _issue26_files(d, good)
    return d


def _issue26_files(d, good):
    """The files of issue 26's cases: damaged stores, spec files, traces, importer inputs."""
    import gzip
    import shutil

    variant_far = good.requests.copy()
    variant_far["arrival_s"] = variant_far["arrival_s"] + 1e300
    _write_unchecked(_replace(good, requests=variant_far), d / "far.parquet")
    (d / "overhead.toml").write_text('name = "o"\nworkload = "-"\nkind = "overhead"\n'
                                     'policies = ["lru"]\nseeds = [0]\n'
                                     "[grid]\nblocks = [1099511627776]\ngroups = [8]\n")
    (d / "grid5.toml").write_text(SPEC + "grid = 5\n")
    small = SPEC.replace('["lru"]', '["lru", "prefixshield"]') + "seeds = 1\n"
    for name, extra in (("pol0", "[base]\nduration_s = 8\n"),
                        ("gridpol0", "[base]\nduration_s = 8\n"
                                     "[grid]\n\"prefixshield.rho_scale\" = [1.0, 0.0]\n"),
                        ("hot0", "[grid]\nnum_hot_prefixes = [4, 0]\n"),
                        ("maxblk", "[grid]\ntenant_max_blocks = [4096, 1]\n"),
                        ("mnbt0", "[base]\nmax_num_batched_tokens = 0\n"),
                        ("bigpool", "[grid]\nblocks = [512, 2000000000]\n")):
        text = small + extra
        if name == "pol0":
            text = text.replace('"prefixshield"]', '"prefixshield:rho_scale=0"]')
        (d / f"{name}.toml").write_text(text)
    (d / "seeds00.toml").write_text(SPEC + "seeds = [0, 0]\n")
    (d / "recno.toml").write_text(SPEC + 'records = "no"\n')
    blob = gzip.compress(b'{"timestamp": 0, "input_length": 10, "output_length": 1, '
                         b'"hash_ids": [1]}\n' * 200)
    (d / "corrupt.jsonl.gz").write_bytes(blob[:30] + b"\xff" * 40 + blob[70:])
    (d / "deep.jsonl").write_text("[" * 100_000 + "\n")
    (d / "deep.json").write_text("[" + "[" * 100_000)
    for name, text in (("st_null", "null"), ("st_list", "[1, 2]"), ("st_num", "7")):
        (d / name).mkdir()
        (d / name / "store.json").write_text(text)
    shutil.copytree(d / "store", d / "st_seed")
    cell = next((d / "st_seed" / "cells").rglob("seed=0.parquet"))
    frame = read_frame(cell)
    frame["seed"] = 5  # a cell of seed 5 saved under seed 0's name
    frame.to_parquet(cell, index=False)
    shutil.copytree(d / "store", d / "st_empty")
    shutil.rmtree(d / "st_empty" / "cells")
    (d / "linked").mkdir()
    (d / "link").symlink_to(d / "linked")


def _replace(t, **kw):
    import dataclasses

    return dataclasses.replace(t, **kw)


def _write_unchecked(trace, path):
    """Write a trace without validating it (to make files that must be rejected on reading)."""
    from prefixshield.traces import io

    orig = type(trace).validate
    try:
        type(trace).validate = lambda self, source="": self
        io.write_trace(trace, path)
    finally:
        type(trace).validate = orig


@pytest.mark.parametrize("name, args, words", CASES, ids=[c[0] for c in CASES])
def test_bad_input_gets_one_clear_error(tmp, name, args, words):
    argv = [a.replace("{tmp}", str(tmp)) for a in args]
    r = CliRunner().invoke(main, argv)
    assert r.exit_code != 0, f"{name}: exit 0\n{r.output}"
    assert r.exception is None or isinstance(r.exception, SystemExit), \
        f"{name}: traceback {r.exception!r}\n{r.output}"
    assert "Traceback" not in r.output
    text = " ".join(r.output.split())
    assert words in text, f"{name}: {words!r} not in\n{r.output}"
    assert ".tmp" not in text, f"{name}: a temp name reached the message"
    if name in NO_STORE:  # refused before any file: the corrected command may use --out
        out = argv[argv.index("--out") + 1]
        assert not os.path.exists(os.path.join(out, "store.json")), f"{name}: store written"


def test_the_table_is_large():
    assert len(CASES) >= 110


def test_group_names_do_not_become_spreadsheet_formulas(tmp, tmp_path):
    import dataclasses

    good = read_trace(tmp / "good.parquet")
    df = good.requests.copy()
    df["group"] = df["group"].replace({"victim": "=cmd|'/c calc'!A0"})
    meta = json.loads(json.dumps(good.meta))
    meta["tenants"]["groups"] = ["=cmd|'/c calc'!A0" if g == "victim" else g
                                 for g in meta["tenants"]["groups"]]
    write_trace(dataclasses.replace(good, requests=df, meta=meta), tmp_path / "evil.parquet")
    out = tmp_path / "out"
    r = CliRunner().invoke(main, ["run", str(tmp_path / "evil.parquet"), "-p", "lru", "--out",
                                  str(out)], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    for name in ("groups.csv", "evictions.csv"):
        text = (out / "lru" / name).read_text()
        assert "'=cmd" in text and "\n=cmd" not in text and ",=cmd" not in text


def test_outputs_are_ordinary_files(tmp, tmp_path):
    out = tmp_path / "o"
    r = CliRunner().invoke(main, ["run", str(tmp / "good.parquet"), "-p", "lru", "--out",
                                  str(out)], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    modes = {p.name: p.stat().st_mode & 0o777 for p in out.rglob("*") if p.is_file()}
    assert len(set(modes.values())) == 1, modes
    assert all(m & 0o044 for m in modes.values()), modes
