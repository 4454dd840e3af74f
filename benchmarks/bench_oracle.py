"""Key-stream replay of our LRU, S3-FIFO and PrefixShield vs libCacheSim's C path.

A thin wrapper: the benchmark lives in :mod:`prefixshield.bench`; this runs
``prefixshield bench --section keystream`` (extra arguments, e.g.
``--quick`` or ``--json FILE``, are passed on). ``make bench`` runs every section.
"""

import sys

from prefixshield.cli import main

if __name__ == "__main__":
    main(["bench", "--section", "keystream", *sys.argv[1:]])
