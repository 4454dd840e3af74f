"""FIFO eviction for prefixshield: ``fifo`` (a policy) and ``short_one_touch`` (a workload)."""
