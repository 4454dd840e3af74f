"""The vLLM plugin vs native vLLM per BlockPool call and KVCacheManager operation.

A thin wrapper: the benchmark lives in :mod:`prefixshield.bench`; this runs
``prefixshield bench --section plugin`` (extra arguments, e.g.
``--quick`` or ``--json FILE``, are passed on). ``make bench`` runs every section.
"""

import sys

from prefixshield.cli import main

if __name__ == "__main__":
    main(["bench", "--section", "plugin", *sys.argv[1:]])
