"""What an import's tenant model did, in the lines ``trace import`` prints under its counts."""

from __future__ import annotations


def tenant_plan_lines(meta: dict) -> list[str]:
    """Lines saying what the tenant model dealt (see
    `deal_tenants`): roots split into sessions, sessions
    drawn across roots, the trace's own tenant column used or ignored, contracts and priorities
    a tenant map gave. Empty for a plain deal of records or roots."""
    plan = meta.get("tenant_plan") or {}
    assign = meta.get("assign")
    groups = list(meta.get("requests_per_group") or meta.get("groups") or [])
    lines = []
    if plan.get("unit") == "session":
        roots, sessions = plan["roots"], plan["sessions"]
        head = (f"tenants: {roots} root{'s' if roots != 1 else ''} < {len(groups)} groups, so "
                f"roots are split into their {sessions:,} sessions (a session: the block after "
                "its root's own shared prefix)")
        if "split" in plan:
            parts = []
            for r in plan["split"]:
                names = ", ".join(groups[g] for g in r["groups"] if g < len(groups))
                pre = r.get("prefix_blocks")
                parts.append(f"root {r['root']} ({r['requests']:,} requests, {r['sessions']:,} "
                             f"sessions" + (f", {pre}-block prefix" if pre else "")
                             + f") -> {names}")
            lines.append(head + "; groups per root by requests, a root's sessions dealt over "
                         "its groups: " + "; ".join(parts))
        else:
            lines.append(head + f"; {assign} draws each session to a group (a group may hold "
                         "sessions of several roots)")
    elif plan.get("unit") == "root" and assign in ("session", "prefix", "zipf", "servegen"):
        lines.append(f"tenants: {plan['roots']:,} roots dealt whole ({plan['sessions']:,} "
                     "sessions inside them)")
    cut = meta.get("limit")
    if lines and isinstance(cut, dict) and cut.get("mode") == "drop" and cut["requests_affected"]:
        # the tenant model deals the records as read; --max-prompt-tokens drops after it
        lines[-1] += (f"; counted before the {cut['requests_affected']:,} prompts over "
                      f"{cut['max_prompt_tokens']:,} tokens were dropped, so the trace may "
                      "hold fewer")
    if meta.get("tenant_column") == "ignored":
        lines.append(f"tenants: the trace's own tenant column is ignored (--assign {assign} "
                     "re-deals the records; --assign trace keeps it)")
    elif assign == "trace":
        lines.append(f"tenants: the trace's own tenant column, as it is ({len(groups)} "
                     "tenants)")
    prio = meta.get("priorities") or {}
    contracts = meta.get("tenant_map_contracts") or {}
    if prio:
        lines.append("priorities (run --scheduler priority uses them): "
                     + ", ".join(f"{g}={p}" for g, p in prio.items()))
    if contracts:
        lines.append("contracts from the tenant map: "
                     + ", ".join(f"{g}={c}" for g, c in contracts.items()))
    return lines


MAX_TENANT_ROWS = 16
"""Tenants a terminal table shows (the busiest); the files hold them all."""


def print_tenant_table(console, df, title: str, where: str = "groups.csv") -> None:
    """The per-tenant table (`prefixshield.experiments.tenant_view`) of every policy,
    tenant by tenant, the busiest `MAX_TENANT_ROWS` tenants; ``where`` names the file
    that holds them all."""
    from rich.table import Table

    from prefixshield.experiments.tenant_view import TENANT_NOTE, by_tenant, display_frame

    if df.empty:
        return
    ordered, left = by_tenant(df, MAX_TENANT_ROWS)
    disp = display_frame(ordered)
    table = Table(title=title)
    for col in disp.columns:
        left_col = col in ("tenant", "policy")
        table.add_column(col, justify="left" if left_col else "right", no_wrap=left_col)
    groups = ordered["group"].tolist()
    for i, row in enumerate(disp.itertuples(index=False)):
        last = i + 1 == len(groups) or groups[i + 1] != groups[i]
        table.add_row(*map(str, row), end_section=last)
    console.print(table)
    console.print(TENANT_NOTE)
    if left:
        console.print(f"{left} tenants with fewer requests not shown: every tenant is in "
                      f"{where}")
