"""Engine throughput (batched vs step-by-step) and our block pool vs vLLM's KVCacheManager.

A thin wrapper: the benchmark lives in :mod:`prefixshield.bench`; this runs
``prefixshield bench --section engine --section pool`` (extra arguments, e.g.
``--quick`` or ``--json FILE``, are passed on). ``make bench`` runs every section.
"""

import sys

from prefixshield.cli import main

if __name__ == "__main__":
    main(["bench", "--section", "engine", "--section", "pool", *sys.argv[1:]])
