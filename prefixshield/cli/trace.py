"""``prefixshield trace generate | import | inspect``: request traces as Parquet files."""

from __future__ import annotations

import click
from rich.table import Table

from prefixshield.cli.common import (POSITIVE, SEED, _user_errors, _workload_names, count, finite,
                                     _workload_options, console)
from prefixshield.cli.tenant_summary import tenant_plan_lines


@click.group()
def trace() -> None:
    """Generate, import and inspect request traces (Parquet)."""


@trace.command("generate")
@click.argument("workload")
@click.argument("out", type=click.Path(dir_okay=False))
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option("--profile", default="l4-qwen2.5-1.5b", show_default=True)
@click.option("--blocks", "num_blocks", type=count(2), default=512,
              show_default=True)
@click.option("--block-size", type=POSITIVE, default=16, show_default=True)
@_workload_options
@click.option("--stream", is_flag=True,
              help="Generate and write the trace a window of time at a time (memory does not "
                   "grow with its length; no cap on its requests): one_touch (aim=none) and "
                   "low_and_slow. The same rows as without --stream; meta measured_requests "
                   "is left unset (not known before the last window).")
@_user_errors
def trace_generate(workload, out, seed, alpha, profile, num_blocks, block_size, overrides,
                   stream):
    """Generate WORKLOAD and write it to OUT (.parquet)."""
    from prefixshield.experiments.overrides import parse_overrides
    from prefixshield.experiments.single import RunSpec, build_trace
    from prefixshield.simulator.config import EngineConfig
    from prefixshield.simulator.costmodel import load_profile
    from prefixshield.traces.io import write_trace
    from prefixshield.workloads import WORKLOADS

    if workload not in WORKLOADS:
        raise click.BadParameter(f"unknown workload {workload!r}; known: {_workload_names()}",
                                 param_hint="WORKLOAD")
    typed = parse_overrides(WORKLOADS[workload].params_type, overrides)
    spec = RunSpec(workload=workload, policies=("lru",),
                   engine=EngineConfig(num_blocks=num_blocks, block_size=block_size),
                   profile=load_profile(profile), alpha=alpha, seed=seed, overrides=typed)
    if stream:
        from prefixshield.experiments.streamed import build_stream
        from prefixshield.traces.io import write_trace_stream

        _path, rows = write_trace_stream(build_stream(spec)[0], out)
        console.print(f"wrote {rows} requests to {out} (streamed)")
        return
    tr, _info = build_trace(spec)
    write_trace(tr, out)
    console.print(f"wrote {len(tr)} requests to {out}")


@trace.command("import")
@click.argument("fmt", type=click.Choice(["mooncake", "sharegpt", "azure"]))
@click.argument("src", type=click.Path(dir_okay=False))
@click.argument("out", type=click.Path(dir_okay=False))
@click.option("--seed", type=SEED, default=0, show_default=True, help="Token seed.")
@click.option("--groups", "num_groups", type=count(1, 10_000), default=1, show_default=True,
              help="Spread requests over this many groups (see --assign).")
@click.option("--assign", type=click.Choice(["round_robin", "session", "prefix", "zipf",
                                            "servegen", "map", "trace"]),
              default=None,
              help="Tenant model [default: trace where the trace has a tenant column, else "
                   "round_robin]: round_robin (records in file order); session (keep a "
                   "conversation, or a Mooncake root, in one group; a root is a request's first "
                   "block after the prefix every request shares; with fewer roots than groups, "
                   "roots are split by session: the block after the root's own shared prefix); "
                   "prefix (Mooncake: root or session hash id mod groups); zipf (units to groups "
                   "with shares 1/(g+1)^skew: heterogeneous tenants); servegen (shares of real "
                   "production clients, <= 8 groups); map (--tenant-map CSV with a record "
                   "column); trace (the trace's own tenant column, as it is).")
@click.option("--tenant-skew", type=finite(0, 1e3, min_open=True), default=1.0,
              show_default=True, help="--assign zipf: the exponent of the group shares.")
@click.option("--tenant-map", type=click.Path(dir_okay=False), default=None,
              help="CSV with columns group and optional record, contract, priority. With "
                   "record (0-based record index in file order; every record once): the map "
                   "model (--assign map). Without: one row per group giving the tenants of "
                   "any other --assign their contract tier and scheduler priority.")
@click.option("--allow-fewer-groups", is_flag=True,
              help="Accept a tenant model that leaves some of the --groups without requests "
                   "(otherwise an error).")
@click.option("--time-scale", type=finite(0, 1e6, min_open=True), default=1.0,
              show_default=True,
              help="mooncake, azure: multiply arrival times (2 = half the request rate).")
@click.option("--rate", type=finite(0, 1e6, min_open=True), default=None,
              help="mooncake, azure: rescale arrival times (one factor, after --time-scale) to "
                   "this mean rate in requests/s.")
@click.option("--limit", type=POSITIVE, default=None, help="Import only the first N records.")
@click.option("--warmup-s", type=finite(0), default=0.0, show_default=True,
              help="Requests arriving before this many seconds are not measured.")
@click.option("--system-prompt-tokens", type=count(0, 1 << 20), default=0,
              show_default=True,
              help="azure, sharegpt: a shared system prompt of this many tokens per group at the "
                   "head of every prompt (Azure's prompts are otherwise all unique).")
@click.option("--max-prompt-tokens", type=POSITIVE, default=None,
              help="Longest prompt kept (tokens); longer requests are handled by --over. Use "
                   "it to fit a trace to a pool: (blocks - 1) x block size minus the output.")
@click.option("--over", type=click.Choice(["drop", "clip"]), default="drop", show_default=True,
              help="With --max-prompt-tokens: drop longer requests, or keep their first tokens.")
@_user_errors
def trace_import(fmt, src, out, seed, time_scale, rate, limit, warmup_s, system_prompt_tokens,
                 max_prompt_tokens, over, **tenancy):
    """Convert an external trace SRC (Mooncake JSONL, ShareGPT JSON, Azure CSV; plain or
    gzip-compressed, with or without a UTF-8 byte-order mark) to OUT."""
    # tenancy: --groups, --assign, --tenant-skew, --tenant-map, --allow-fewer-groups, passed on
    # to the importer whole under their keyword names (num_groups: see below)
    import os

    from prefixshield.traces import importers
    from prefixshield.traces.io import write_trace

    if os.path.exists(out) and os.path.samefile(src, out):
        raise click.BadParameter(f"{out} is the input SRC: importing would overwrite the source; "
                                 "give another OUT", param_hint="OUT")

    num_groups = tenancy.pop("num_groups")
    common = dict(seed=seed, warmup_s=warmup_s, limit=limit, **tenancy,
                  num_groups=None if tenancy["assign"] == "map" and num_groups == 1
                  else num_groups)
    if fmt == "mooncake":
        if system_prompt_tokens:
            raise click.BadParameter("mooncake traces carry their own prefixes (hash_ids)",
                                     param_hint="--system-prompt-tokens")
        shape = importers.MooncakeImport(time_scale=time_scale)
        tr = importers.import_mooncake(src, shape=shape, **common)
    else:
        if fmt == "azure":
            shape = importers.AzureImport(system_prompt_tokens=system_prompt_tokens,
                                          time_scale=time_scale)
            tr = importers.import_azure(src, shape=shape, **common)
        else:
            if time_scale != 1.0 or rate is not None:
                raise click.BadParameter("sharegpt has no timestamps to scale (arrivals are "
                                         "drawn)", param_hint="--time-scale/--rate")
            shape = importers.ShareGPTImport(system_prompt_tokens=system_prompt_tokens)
            tr = importers.import_sharegpt(src, shape=shape, **common)
    note = ""
    if rate is not None:
        from prefixshield.traces.transform import scale_to_rate

        tr, factor = scale_to_rate(tr, rate)
        note += f" (arrivals x {factor:.3g} for {rate:g} req/s)"
    if max_prompt_tokens is not None:
        from prefixshield.traces.transform import limit_request_tokens

        tr = limit_request_tokens(tr, max_prompt_tokens, over)
        n = tr.meta["limit"]["requests_affected"]
        note += (f" ({n} prompts over {max_prompt_tokens} tokens "
                 f"{'dropped' if over == 'drop' else 'clipped'})")
    write_trace(tr, out)
    console.print(f"imported {len(tr)} requests from {src} to {out}{note}")
    _print_requests_per_group(tr)
    for line in tenant_plan_lines(tr.meta):
        console.print(line)


def _print_requests_per_group(tr) -> None:
    """One line: the requests each group of the import received (asked groups left empty
    included), and the blocks every request shares when a Mooncake root skipped them."""
    asked = list(tr.meta.get("requests_per_group", {})) or tr.group_names()
    have = tr.requests["group"].astype(str).value_counts()
    parts = [f"{g} {int(have.get(g, 0)):,}" for g in asked]
    assign = tr.meta.get("assign") or "-"
    shared = tr.meta.get("shared_prefix_blocks", 0)
    skip = (f"; roots after the {shared} block{'s' if shared > 1 else ''} every request shares"
            if shared and assign in ("session", "prefix", "zipf", "servegen") else "")
    console.print(f"requests per group (--assign {assign}{skip}): " + ", ".join(parts))


@trace.command("inspect")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--block-size", type=POSITIVE, default=16, show_default=True)
@_user_errors
def trace_inspect(path, block_size):
    """Print what a trace holds: requests, groups, roles, prompt lengths, rates."""
    from prefixshield.traces.io import read_trace

    tr = read_trace(path)
    df = tr.requests
    lens = tr.prompt_lengths()
    dur = float(df["arrival_s"].max() - df["arrival_s"].min()) if len(df) else 0.0
    console.print(f"[bold]{path}[/]: {len(df)} requests over {dur:.1f} s, seed {tr.seed}, "
                  f"vocab {tr.vocab_size}; meta: {tr.meta.get('workload') or tr.meta.get('importer') or '-'}")
    table = Table()
    for col in ("group", "contract", "role", "requests", "measured", "rate (req/s)",
                "mean prompt (tokens)", f"mean prompt (blocks of {block_size})",
                "mean output (tokens)", "distinct prefix_ids"):
        table.add_column(col, justify="left" if col in ("group", "contract", "role") else "right")
    df = df.assign(_len=lens)
    for (g, c, r), sub in df.groupby(["group", "contract", "role"], sort=False):
        span = float(sub["arrival_s"].max() - sub["arrival_s"].min())
        rate = (len(sub) - 1) / span if span > 0 else float("nan")
        table.add_row(str(g), str(c), str(r), str(len(sub)), str(int(sub["measured"].sum())),
                      f"{rate:.2f}", f"{sub['_len'].mean():.0f}",
                      f"{(sub['_len'] // block_size).mean():.1f}",
                      f"{sub['output_tokens'].mean():.0f}", str(sub["prefix_id"].nunique()))
    console.print(table)


