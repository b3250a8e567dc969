"""Benchmarks: ``python -m bench [--quick]``. Figures, never pass/fail; see bench/RESULTS.md."""

CLUSTER = "bench"  # the cluster the benchmarks' engines serve (a fleet's are named apart)
