"""Command line: ``prefixshield run | compare | profiles`` (`run`), ``trace ...``
(`trace`), ``calibrate | make-model | validate | validate-matrix`` (`live`),
``sweep | reproduce | report | regress`` (`experiments`), ``attack-search``
(`attack`) and ``bench`` (`bench`), all on the group `main`.

The CLI parses options, calls the library and prints; it holds no simulation logic. Every user
error (unknown name, bad value, unreadable file) ends with one ``Error:`` line and exit code 1 or 2,
never a traceback. What the commands share (console, error handling, option parsing) is in
`common`, which imports none of them.
"""

from __future__ import annotations

# First: common sets the environment OpenBLAS reads before anything loads numpy.
from prefixshield.cli.common import _Program

import click  # noqa: E402

from prefixshield import __version__  # noqa: E402
from prefixshield.cli import attack, bench, experiments, live, run, trace  # noqa: E402


@click.group(cls=_Program,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="prefixshield")
def main() -> None:
    """prefixshield: what a KV prefix-cache replacement policy does to each tenant.

    A trace-driven simulator of vLLM's Automatic Prefix Caching block pool. Start with
    `prefixshield run one_touch --policy all`.
    """


for _command in (run.run, run.compare, run.profiles, trace.trace, live.calibrate,
                 live.make_model, live.validate, live.validate_matrix, experiments.sweep,
                 experiments.reproduce, experiments.report, experiments.regress,
                 attack.attack_search, bench.bench):
    main.add_command(_command)

if __name__ == "__main__":
    main()
