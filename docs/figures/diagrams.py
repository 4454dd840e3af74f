"""The site's two diagrams, drawn with matplotlib into SVG files (the site is read offline too,
so no diagram is left to a script from a CDN, as Material's Mermaid integration would be).

* ``engine-loop.svg`` (docs/simulator.md): one engine's loop as `Engine._engine` and
  `Engine._step` run it (prefixshield/simulator/engine.py; the fused loop of
  prefixshield/simulator/fused.py makes the same decisions in one kernel).
* ``prefixshield-lifecycle.svg`` (docs/policies.md): a block's life under PrefixShield, the
  states and events of prefixshield/policies/prefixshield.py and its kernels.

Usage: ``python docs/figures/diagrams.py [OUT_DIR]`` (default: this folder), or
``make figures``. The files are deterministic: the same matplotlib writes the same bytes, so a
regeneration that changes nothing leaves git clean.
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

HERE = Path(__file__).resolve().parent
FILES = ("engine-loop.svg", "prefixshield-lifecycle.svg")
"""What `main` writes, in that order."""

# Colours (Material's indigo header beside muted fills): one per kind of box.
INK = "#263238"
EDGE = "#3f51b5"
FILL = {"source": "#e8eaf6", "step": "#fff8e1", "free": "#e8f5e9", "cached": "#e3f2fd",
        "note": "#fafafa", "alert": "#fce4ec"}
TITLE_PT = 10.5
BODY_PT = 9.0


def _canvas(width_in: float, height_in: float):
    """A figure whose data units are inches (origin bottom left), axes hidden."""
    fig = plt.figure(figsize=(width_in, height_in))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, width_in)
    ax.set_ylim(0, height_in)
    ax.axis("off")
    return fig, ax


def _box(ax, x, y, w, h, title, body="", kind="step", title_pt=TITLE_PT, dashed=False):
    """A rounded box with lower-left corner (x, y), a bold title on top and body lines below
    it; returns the box's (x, y, w, h) for the arrows."""
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0,rounding_size=0.08",
                                fc=FILL[kind], ec=EDGE, lw=1.2, ls="--" if dashed else "-"))
    ax.text(x + 0.12, y + h - 0.1, title, ha="left", va="top", fontsize=title_pt,
            fontweight="bold", color=INK)
    if body:
        ax.text(x + 0.12, y + h - 0.1 - title_pt / 72 * 1.55, body, ha="left", va="top",
                fontsize=BODY_PT, color=INK, linespacing=1.3)
    return x, y, w, h


def _arrow(ax, start, end, label="", rad=0.0, dashed=False, label_at=0.5, label_dx=0.0,
           label_dy=0.0, ha="center", color=EDGE):
    """An arrow from ``start`` to ``end`` (inches), curved by ``rad``, with an optional label
    at ``label_at`` of the straight line between them, shifted by (label_dx, label_dy)."""
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=14, lw=1.4,
                                 color=color, ls="--" if dashed else "-",
                                 connectionstyle=f"arc3,rad={rad}", shrinkA=2, shrinkB=2))
    if label:
        lx = start[0] + (end[0] - start[0]) * label_at + label_dx
        ly = start[1] + (end[1] - start[1]) * label_at + label_dy
        ax.text(lx, ly, label, ha=ha, va="center", fontsize=BODY_PT, color=color,
                style="italic", bbox=dict(fc="white", ec="none", pad=1.0, alpha=0.9))


def _path(ax, points, label="", label_xy=None, ha="left", dashed=False):
    """A polyline arrow through ``points`` (inches), the head at the last one."""
    xs, ys = zip(*points)
    ax.plot(xs[:-1], ys[:-1], color=EDGE, lw=1.4, ls="--" if dashed else "-",
            solid_capstyle="butt")
    _arrow(ax, points[-2], points[-1], dashed=dashed)
    if label:
        ax.text(*label_xy, label, ha=ha, va="center", fontsize=BODY_PT, color=EDGE,
                style="italic", bbox=dict(fc="white", ec="none", pad=1.0, alpha=0.9))


def _h(lines: int) -> float:
    """The height (inches) of a `_box` with a title and ``lines`` body lines."""
    return 0.22 + TITLE_PT / 72 * 1.55 + lines * BODY_PT / 72 * 1.3 + (0.04 if lines else 0.0)


def engine_loop(path: Path) -> None:
    """The engine's loop: arrivals, the waiting queue, one scheduler iteration, the step's
    timeout, completions, decode coalescing (`Engine._engine`, `Engine._step`)."""
    gap = 0.5
    h_top, h_in, h_step, h_quiet = _h(3), _h(7), _h(3), _h(2)
    h_cont = 0.4 + h_in + 0.36
    height = 0.5 + h_top + gap + h_cont + gap + h_step + gap + h_quiet + 0.15
    fig, ax = _canvas(9.0, height)
    ax.text(0.2, height - 0.15, "One engine's loop (simulator/engine.py: Engine._engine, "
            "Engine._step)", ha="left", va="top", fontsize=12, fontweight="bold", color=INK)

    y = height - 0.5 - h_top
    arr = _box(ax, 0.2, y, 3.3, h_top, "Arrival process",
               "trace rows join the queue at their arrival_s;\n"
               "the prefix cached at arrival is recorded;\n"
               "an engine idle for want of work wakes", kind="source")
    wq = _box(ax, 4.6, y, 3.7, h_top, "Waiting queue (FCFS, the default)",
              "in arrival order; a preempted request goes\n"
              "back to its head (recompute: its blocks\n"
              "stay cached)", kind="source")
    _arrow(ax, (arr[0] + arr[2], y + 0.62 * h_top), (wq[0], y + 0.62 * h_top))

    # the scheduler iteration: running requests first, then admissions
    y -= gap + h_cont
    cont_top = y + h_cont
    ax.add_patch(FancyBboxPatch((0.2, y), 8.1, h_cont, boxstyle="round,pad=0,rounding_size=0.1",
                                fc="white", ec=EDGE, lw=1.6))
    ax.text(0.32, cont_top - 0.1, "One scheduler iteration", ha="left", va="top",
            fontsize=TITLE_PT + 0.5, fontweight="bold", color=INK)
    ax.text(8.15, y + 0.17, "one token budget (max_num_batched_tokens) for (1), then (2); at "
            "most max_num_seqs requests run", ha="right", va="center", fontsize=BODY_PT,
            color=INK)
    yi = y + 0.36
    run = _box(ax, 0.35, yi, 3.85, h_in, "(1) Running requests first",
               "in admission order, each gets\n"
               "min(tokens left, budget) new tokens;\n"
               "allocate_slots fails (no free block):\n"
               "preempt the newest running request\n"
               "(freed, back to the queue's head) and\n"
               "retry; if the victim was this request,\n"
               "the pass ends")
    adm = _box(ax, 4.35, yi, 3.8, h_in, "(2) Admissions from the queue's head",
               "only in a step without a preemption:\n"
               "the head's cached prefix is its hits,\n"
               "min(tokens - hits, budget) new tokens;\n"
               "allocate_slots (--compat current: the\n"
               "whole prompt must fit); the head does\n"
               "not fit: admissions stop for this step\n"
               "(head-of-line blocking)")
    _arrow(ax, (6.45, wq[1]), (6.45, adm[1] + adm[3]), "the head", label_dx=0.42,
           label_at=0.35)
    _path(ax, [(3.3, run[1] + run[3]), (3.3, cont_top + gap / 2), (4.1, cont_top + gap / 2),
               (4.1, wq[1] + 0.3 * h_top), (wq[0], wq[1] + 0.3 * h_top)],
          "preempted", (3.4, cont_top + gap / 2), dashed=True)
    _path(ax, [(0.9, cont_top), (0.9, arr[1])], dashed=True)
    ax.text(1.0, cont_top + gap / 2, "nothing to run: wait for an arrival\n(none left: the run "
            "ends)", ha="left", va="center", fontsize=BODY_PT - 0.5, color=EDGE, style="italic")

    # the timed step and what follows it
    y -= gap + h_step
    step = _box(ax, 0.2, y, 4.1, h_step, "(3) The step's timeout (cost model)",
                "the engine waits dt = a + b·prefill tokens\n"
                "+ c·decode seqs + d·context tokens\n"
                "+ e·new requests (the run's profile)")
    done = _box(ax, 4.6, y, 3.7, h_step, "(4) Completions",
                "tokens advance; a request at its output\n"
                "length finishes and frees its blocks, tail\n"
                "first (full ones stay cached, free)", kind="free")
    mid = y + 0.5 * h_step
    _arrow(ax, (2.25, y + h_step + gap), (2.25, y + h_step), "scheduled tokens",
           label_dx=0.8)
    _arrow(ax, (step[0] + step[2], mid), (done[0], mid))

    y -= gap + h_quiet
    quiet = _box(ax, 0.2, y, 8.1, h_quiet, "(5) Decode coalescing (after a quiet step)",
                 "nothing admitted, preempted or finished, the queue stuck, every running request "
                 "decoding: jump the\nk decode steps in which no block opens or fills and "
                 "nothing finishes, stopping at the next arrival", kind="note")
    _arrow(ax, (6.45, done[1]), (6.45, quiet[1] + quiet[3]), "quiet", label_dx=0.35)
    _path(ax, [(done[0] + done[2], mid), (8.7, mid), (8.7, yi + h_in / 2),
               (8.3, yi + h_in / 2)], "next\niteration", (8.45, (mid + yi + h_in / 2) / 2))
    _path(ax, [(quiet[0] + quiet[2], y + h_quiet / 2), (8.7, y + h_quiet / 2), (8.7, mid)])
    _save(fig, path)


def prefixshield_lifecycle(path: Path) -> None:
    """A block's life under PrefixShield: the four states a block is in (truly free, filling,
    cached in use, free candidate), the events that move it, and beside them what the policy
    decides at three of those events (charge and class, the debt gate, reclamation)."""
    h_state, h_n1, h_n2, h_n3 = _h(2), _h(8), _h(6), _h(7)
    height = 0.5 + h_n1 + 0.25 + h_n2 + 0.25 + h_n3 + 0.15
    fig, ax = _canvas(9.0, height)
    ax.text(0.2, height - 0.15, "A block's life under PrefixShield (policies/prefixshield.py)",
            ha="left", va="top", fontsize=12, fontweight="bold", color=INK)
    w, gx = 2.2, 1.5  # state boxes' width; the gap between the two columns
    xl, xr = 0.2, 0.2 + w + gx
    yt = height - 0.9 - h_state
    yb = yt - 2.35 - h_state
    free = _box(ax, xl, yt, w, h_state, "Truly free",
                "no hash, ref count 0; taken\nbefore any cached block", kind="free")
    fill = _box(ax, xr, yt, w, h_state, "In use, filling",
                "in a request's block table,\nnot full: no hash yet")
    cand = _box(ax, xl, yb, w, h_state, "Free candidate",
                "cached, ref count 0: owner\nand class kept", kind="cached")
    used = _box(ax, xr, yb, w, h_state, "Cached, in use",
                "full, hashed, ref count > 0:\nowner g, class", kind="cached")

    def pair(a, b, y_hi, y_lo, top, bottom):
        """Two opposite arrows between side-by-side boxes a (left) and b (right)."""
        _arrow(ax, (a[0] + a[2], y_hi), (b[0], y_hi), top, label_dy=0.17)
        _arrow(ax, (b[0], y_lo), (a[0] + a[2], y_lo), bottom, label_dy=-0.17)

    pair(free, fill, yt + 0.68 * h_state, yt + 0.32 * h_state, "taken for a request",
         "released unfilled")
    pair(cand, used, yb + 0.68 * h_state, yb + 0.32 * h_state, "hit: acquired",
         "released")
    _arrow(ax, (xr + 0.6 * w, yt), (xr + 0.6 * w, yb + h_state), "fills: materialized",
           label_dx=-0.05, ha="right", label_at=0.35)
    _arrow(ax, (xl + w, yb + h_state), (xr, yt), "reclaimed: its hash\ndropped (an "
           "eviction)", label_at=0.62, label_dx=-0.62)
    # a hit on a block other requests hold: it stays in use; the gate may change its class
    ax.add_patch(FancyArrowPatch((xr + 0.75 * w, yb), (xr + 0.35 * w, yb),
                                 connectionstyle="arc3,rad=-1.4", arrowstyle="-|>",
                                 mutation_scale=14, lw=1.4, color=EDGE))
    ax.text(xr + 0.55 * w, yb - 0.75, "hit", ha="center", va="center", fontsize=BODY_PT,
            color=EDGE, style="italic")
    ax.text(xl, yb - 0.55, "Blocks start truly free. Lookup is per group (the tenant salts\n"
            "the first block's hash), so only the owner's requests hit a block.",
            ha="left", va="top", fontsize=BODY_PT, color=INK, linespacing=1.3)

    # what the policy decides at materialization, hits and reclamation
    nx, nw = 6.3, 2.55
    y = height - 0.5 - h_n1
    _box(ax, nx, y, nw, h_n1, "Fills: charge and class",
         "charged to the creator's bucket\n"
         "(g, c): B ← min(β_c, B + ρ_c·\n"
         "(t − t0)) − n (only time refills;\n"
         "eviction never repays); owner g\n"
         "for the block's cached life; class\n"
         "PROBATIONARY if the charge left\n"
         "B < −ε or it is g's first admission\n"
         "of the prefix, else NORMAL", kind="note")
    y -= 0.25 + h_n2
    _box(ax, nx, y, nw, h_n2, "Hits: the debt gate",
         "a hit of the same (owner,\n"
         "contract, prefix) promotes the\n"
         "block to REUSE only while the\n"
         "owner's debt D_g ≤ ε, else it is\n"
         "a gated promotion; D_g = Σ_c\n"
         "max(0, −balance refilled to t)", kind="note")
    y -= 0.25 + h_n3
    _box(ax, nx, y, nw, h_n3, "Reclaimed: debtors first",
         "only with no truly free block left:\n"
         "the group whose normalized debt\n"
         "P_g = Σ_c debt_c / w_c (w_c =\n"
         "ρ_c / ρ_min) is largest and > ε\n"
         "gives its first candidate (class\n"
         "order, then oldest); P_g −= 1/W_g;\n"
         "no one in debt: that order over all", kind="alert")
    _save(fig, path)


def _save(fig, path: Path) -> None:
    """Write ``fig`` as SVG with stable bytes (no date, a fixed id salt)."""
    with matplotlib.rc_context({"svg.hashsalt": "prefixshield-docs", "svg.fonttype": "path"}):
        fig.savefig(path, format="svg", metadata={"Date": None})
    plt.close(fig)


def main(out_dir: Path = HERE) -> list[Path]:
    """Draw both diagrams into ``out_dir`` (created if missing); returns the files written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / name for name in FILES]
    engine_loop(paths[0])
    prefixshield_lifecycle(paths[1])
    return paths


if __name__ == "__main__":
    for p in main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE):
        print(p)
