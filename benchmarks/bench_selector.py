"""Victim-selection latency and policy-state bytes per block.

A thin wrapper: the benchmark lives in :mod:`prefixshield.bench`; this runs
``prefixshield bench --section selector --section state`` (extra arguments, e.g.
``--quick`` or ``--json FILE``, are passed on). ``make bench`` runs every section.
"""

import sys

from prefixshield.cli import main

if __name__ == "__main__":
    main(["bench", "--section", "selector", "--section", "state", *sys.argv[1:]])
