"""Benchmarks: ``python -m bench [--quick]``. Figures, never pass/fail; see bench/RESULTS.md."""
