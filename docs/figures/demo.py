"""The demo figure of docs/getting-started.md: the ``comparison.png`` that ``make demo``'s run
writes, copied here from a fresh run.

It runs ``prefixshield run one_touch --policy all --out DIR`` (the command of ``make demo``,
built-in defaults, seed 0) in a subprocess into a temporary folder and copies the
``comparison.png`` the run drew (`prefixshield.figures.policy_comparison`) to
``OUT_DIR/demo-comparison.png``. Nothing is drawn here: the figure is the tool's own. The run is
deterministic, so a rerun on the same code writes the same bytes; after a change to the
simulator, rerun this (``make figures``) and the page shows what the code now does.

Usage: ``python docs/figures/demo.py [OUT_DIR]`` (default: this folder).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
NAME = "demo-comparison.png"
"""The file `main` writes."""
COMMAND = ("run", "one_touch", "--policy", "all")
"""The demo's arguments to ``prefixshield`` (``--out`` is added), as the Makefile's demo target."""
MAX_BYTES = 150_000
"""A figure of the site stays under this size (it is read over slow links too)."""


def main(out_dir: Path = HERE) -> Path:
    """Run the demo and copy its comparison figure into ``out_dir`` (created if missing).

    Returns the file written. Raises ``subprocess.CalledProcessError`` if the run fails and
    ``ValueError`` if its figure is over `MAX_BYTES` (nothing is copied then)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="prefixshield-demo-") as tmp:
        run_dir = Path(tmp) / "demo-out"
        subprocess.run([sys.executable, "-m", "prefixshield.cli", *COMMAND, "--out",
                        str(run_dir)], check=True)
        png = run_dir / "comparison.png"
        size = png.stat().st_size
        if size > MAX_BYTES:
            raise ValueError(f"{png.name} is {size:,} bytes, over the site's {MAX_BYTES:,}")
        target = out_dir / NAME
        shutil.copyfile(png, target)
    return target


if __name__ == "__main__":
    print(main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE))
