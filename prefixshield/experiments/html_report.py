"""One self-contained HTML page per output folder: a ``run --out`` folder or a results store.

The page carries its tables as HTML and its figures inline (``data:`` URIs of the PNGs), so it
opens in a browser from the file system, mailed or archived, with no server and no other file.
Nothing is computed here that the folder does not hold: a run's page reads ``config.json``,
``summary.csv``, each policy's ``groups.csv`` and ``evictions.csv`` and ``comparison.png``; a
store's page is built from the report's sections
(`build_sections`) and the per-tenant rows of its cells.
"""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path
from typing import Iterable

import pandas as pd

from prefixshield.atomic import write_text
from prefixshield.experiments.tenant_view import (TENANT_NOTE, by_tenant, display_frame,
                                                  tenant_frame)

REPORT_FILE = "report.html"
"""The page's name inside the folder it reports."""

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1400px; color: #222; }
h1 { font-size: 1.6em; } h2 { margin-top: 1.8em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th { background: #f0f0f0; } td.text, th.text { text-align: left; }
tr.first td { border-top: 2px solid #888; }
p.note { color: #555; font-size: 0.85em; max-width: 1100px; }
figure { margin: 1em 0; } figure img { max-width: 100%; border: 1px solid #ddd; }
figcaption { color: #555; font-size: 0.85em; }
code { background: #f4f4f4; padding: 0 0.2em; }
"""


def _e(text) -> str:
    return html.escape(str(text), quote=True)


def html_table(df: pd.DataFrame, table_id: str | None = None,
               first_rows: Iterable[int] = (), text_columns: int = 1) -> str:
    """``df`` as an HTML table, every cell escaped; the first ``text_columns`` columns are
    left-aligned names, the rest right-aligned values; rows in ``first_rows`` start a block
    (a thicker rule above: a new tenant)."""
    first = set(first_rows)
    head = "".join(f'<th class="text">{_e(c)}</th>' if j < text_columns else f"<th>{_e(c)}</th>"
                   for j, c in enumerate(df.columns))
    body = []
    for i, row in enumerate(df.itertuples(index=False)):
        cls = ' class="first"' if i in first and i else ""
        body.append(f"<tr{cls}>" + "".join(
            f'<td class="text">{_e(v)}</td>' if j < text_columns else f"<td>{_e(v)}</td>"
            for j, v in enumerate(row)) + "</tr>")
    tid = f' id="{_e(table_id)}"' if table_id else ""
    return (f"<table{tid}><thead><tr>{head}</tr></thead><tbody>" + "".join(body)
            + "</tbody></table>")


def _leading_names(df: pd.DataFrame) -> int:
    """How many leading columns of a display table hold names rather than numbers (left-aligned):
    those where some cell does not start like a number (``12``, ``-0.3``, ``+9.5 [...]``,
    ``45%``, ``-``)."""
    n = 0
    for c in df.columns:
        vals = [str(v) for v in df[c]]
        if vals and all(v[:1] in "0123456789+-." for v in vals if v):
            break
        n += 1
    return max(n, 1)


def embedded_figure(path: Path, caption: str) -> str:
    """A ``<figure>`` with ``path`` (PNG or SVG) inline as a ``data:`` URI; empty if the file is
    missing."""
    if not path.is_file():
        return ""
    mime = "image/svg+xml" if path.suffix.lower() == ".svg" else "image/png"
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return (f'<figure><img alt="{_e(caption)}" src="data:{mime};base64,{data}">'
            f"<figcaption>{_e(caption)}</figcaption></figure>")


def page(title: str, body: list[str]) -> str:
    """A complete HTML document: ``title`` and the ``body`` fragments, styles inline."""
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{_e(title)}</title><style>{_STYLE}</style></head><body>"
            f"<h1>{_e(title)}</h1>" + "\n".join(body) + "</body></html>\n")


def tenant_block(df: pd.DataFrame, note: str = TENANT_NOTE) -> list[str]:
    """The per-tenant table of a `tenant_frame`
    (every tenant, tenant by tenant, every policy) and its note."""
    if df.empty:
        return ["<p>No per-tenant rows.</p>"]
    ordered, _ = by_tenant(df)
    groups = ordered["group"].tolist()
    starts = [i for i in range(len(groups)) if i == 0 or groups[i] != groups[i - 1]]
    return [html_table(display_frame(ordered), "tenants", starts, text_columns=2),
            f'<p class="note">{_e(note)}</p>']


# ------------------------------------------------------------------------------ run folders
def is_run_dir(folder: Path) -> bool:
    """Whether ``folder`` is a ``prefixshield run --out`` folder."""
    return (folder / "summary.csv").is_file() and (folder / "config.json").is_file()


def _summary_display(summary: pd.DataFrame) -> pd.DataFrame:
    from prefixshield.experiments.analysis import fmt_num as num, fmt_pct as pct

    rows = []
    for _, r in summary.iterrows():
        if r.get("status", "ok") != "ok":
            rows.append({"policy": r["policy"], "requests": "failed",
                         "hit ratio": str(r.get("error", ""))})
            continue
        rows.append({"policy": r["policy"], "requests": num(r["requests"], ".0f"),
                     "hit ratio": pct(r["hit_ratio"]),
                     "at arrival": pct(r.get("arrival_hit_ratio", float("nan"))),
                     "token hit ratio": pct(r["token_hit_ratio"]),
                     "P50 TTFT (s)": num(r["p50_ttft_s"]), "P95 TTFT (s)": num(r["p95_ttft_s"]),
                     "P95 queue (s)": num(r.get("p95_queue_s", float("nan"))),
                     "preemptions": num(r["preemptions"], ".0f"),
                     "evictions": num(r["evictions"], ".0f")})
    return pd.DataFrame(rows).fillna("")


def run_report(folder: str | Path) -> Path:
    """Write ``folder/report.html`` for a ``run --out`` folder: the setup, the aggregate table
    of every policy, the per-tenant table, the figure and each policy's eviction matrix.

    Raises:
        ValueError: ``folder`` is not a run folder (one line naming what is missing).
    """
    from prefixshield.experiments.single import label_dir

    folder = Path(folder)
    if not is_run_dir(folder):
        raise ValueError(f"{folder}: not a run's --out folder (no summary.csv and config.json)")
    try:
        config = json.loads((folder / "config.json").read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{folder / 'config.json'}: not valid JSON: {e}") from None
    summary = pd.read_csv(folder / "summary.csv", keep_default_na=True)
    labels = [str(p) for p in summary["policy"]]
    ok = [p for p, s in zip(labels, summary.get("status", ["ok"] * len(labels))) if s == "ok"]
    tables = {p: pd.read_csv(folder / label_dir(p) / "groups.csv",
                             dtype={"group": str}, keep_default_na=False,
                             na_values=["", "nan", "NaN"])
              for p in ok if (folder / label_dir(p) / "groups.csv").is_file()}
    e = config.get("engine", {})
    prof = config.get("profile", {})
    title = f"prefixshield run: {Path(str(config.get('workload', folder.name))).name}"
    setup = (f"Workload <code>{_e(config.get('workload'))}</code>, seed {_e(config.get('seed'))};"
             f" {_e(e.get('num_blocks'))} blocks x {_e(e.get('block_size'))} tokens, vLLM compat "
             f"{_e(e.get('vllm_compat'))}; profile {_e(prof.get('name'))} "
             f"({_e(prof.get('provenance', {}).get('status', '?'))}); prefixshield "
             f"{_e(config.get('prefixshield_version'))}. Policies: {_e(', '.join(labels))}.")
    pop = summary["population"].dropna().iloc[0] if "population" in summary and \
        summary["population"].notna().any() else "all"
    body = [f"<p>{setup}</p>", "<h2>Every policy</h2>",
            f"<p>Judged population: {'measured victim' if pop == 'victim' else 'all measured'}"
            " requests.</p>",
            html_table(_summary_display(summary), "summary"),
            "<h2>Per tenant</h2>", *tenant_block(tenant_frame(tables)),
            "<h2>Figures</h2>",
            embedded_figure(folder / "comparison.png",
                            "Hit ratio and P95 TTFT per policy, one group's blocks over time, "
                            "and each tenant's hit ratio and P95 TTFT under each policy.")
            or "<p>No figure in this folder (run with --plot).</p>"]
    ev = [(p, folder / label_dir(p) / "evictions.csv") for p in ok]
    ev = [(p, f) for p, f in ev if f.is_file()]
    if ev:
        body.append("<h2>Who evicted whose blocks</h2><p class=\"note\">Rows: the requesting "
                    "tenant; columns: the owner of the evicted cached block.</p>")
        for p, f in ev:
            m = pd.read_csv(f, dtype={"requester": str})
            m = m.rename(columns={"requester": "requester \\ owner"})
            body += [f"<h3>{_e(p)}</h3>", html_table(m)]
    body += _fleet_blocks(folder, ok)
    out = folder / REPORT_FILE
    write_text(out, page(title, body))
    return out


def _fleet_blocks(folder: Path, labels: list[str]) -> list[str]:
    """A fleet run's replica and fleet-wide tenant tables per policy (``fleet/*.csv``), numbers
    to 3 decimals; empty for a single engine."""
    from prefixshield.experiments.single import label_dir

    out = []
    for p in labels:
        d = folder / label_dir(p) / "fleet"
        if not (d / "replicas.csv").is_file():
            continue
        if not out:
            out.append("<h2>The fleet</h2><p class=\"note\">Per replica, and per tenant across "
                       "the replicas, with the hit ratio an infinite cache behind the same router "
                       "would give (bound).</p>")
        for name, text_cols in (("replicas", 1), ("tenants", 2)):
            f = d / f"{name}.csv"
            if f.is_file():
                df = pd.read_csv(f, dtype={"group": str})
                df = df.apply(lambda c: c.map(lambda v: f"{v:.3f}" if isinstance(v, float)
                                              else v))
                out += [f"<h3>{_e(p)}: {name}</h3>", html_table(df, text_columns=text_cols)]
    return out


# ------------------------------------------------------------------------------ stores
def store_tenant_frame(cells: pd.DataFrame, exp) -> pd.DataFrame:
    """Per-tenant rows of one experiment's first point (mean over its seeds), from the cells'
    ``groups_json``."""
    from prefixshield.experiments import analysis as A
    from prefixshield.experiments.tenant_view import mean_over_seeds

    point = exp.points()[0]
    at = A.ok_cells(cells[(cells["experiment"] == exp.name) & (cells["point"] == point.id)])
    rows = []
    for _, r in at.iterrows():
        t = pd.DataFrame(A.detail(r, "groups_json"))
        if len(t):
            rows.append(tenant_frame({r["policy"]: t}).assign(seed=int(r["seed"])))
    if not rows:
        return pd.DataFrame()
    return mean_over_seeds(pd.concat(rows, ignore_index=True))


def store_report(store, sections, cells: pd.DataFrame) -> Path:
    """Write ``report.html`` into a results store: its setup, every section's tables, notes
    and figures (inline), and per experiment the per-tenant table at its first point."""
    meta = store.meta
    prov = meta.get("provenance", {})
    root = Path(store.root)
    n_ok = int((cells["status"] == "ok").sum()) if len(cells) else 0
    body = []
    if meta.get("command"):
        body.append(f"<p>Command: <code>{_e(meta['command'])}</code></p>")
    body.append(f"<p>Cells: {n_ok} ok of {store.num_cells()}. prefixshield "
                f"{_e(prov.get('prefixshield_version'))} (git "
                f"{_e(prov.get('git_commit') or 'unknown')}). Hit ratio: the mean over the judged "
                "requests of cached / prompt tokens; differences are paired over seeds with 95% "
                "bootstrap CIs; pp = percentage points.</p>")
    body.append("<ul>" + "".join(f'<li><a href="#sec-{i}">{_e(s.title)}</a></li>'
                                 for i, s in enumerate(sections)) + "</ul>")
    for i, sec in enumerate(sections):
        body.append(f'<h2 id="sec-{i}">{_e(sec.title)}</h2>')
        for t in sec.tables:
            if len(sec.tables) > 1 or t.title != sec.title:
                body.append(f"<h3>{_e(t.title)}</h3>")
            body.append(html_table(t.display, text_columns=_leading_names(t.display)))
            body += [f'<p class="note">{_e(n)}</p>' for n in t.notes]
        body += [f'<p class="note">{_e(n)}</p>' for n in sec.notes]
        for rel, caption in sec.figures:
            body.append(embedded_figure(root / rel, caption))
    if meta.get("kind") != "reproduce":
        for exp in store.experiments:
            df = store_tenant_frame(cells, exp)
            if len(df):
                point = exp.points()[0]
                label = f" ({point.label()})" if point.values else ""
                body.append(f"<h2>Per tenant: {_e(exp.name)}{_e(label)}</h2>")
                body += tenant_block(df, TENANT_NOTE + " Mean over the seeds.")
    out = root / REPORT_FILE
    write_text(out, page(f"prefixshield {meta.get('kind', 'results')}", body))
    return out
