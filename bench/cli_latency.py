"""CLI: how fast ``rollbackctl --help`` (and ``completion``) answers, against the bare
interpreter starting, each the median of several runs in fresh processes (target: under 0.3 s
on this machine). The parser is built from ``cli.main`` and ``worker.flags`` alone; what a
command needs (the SDKs, the client) is imported only when it runs."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.harness import Lines, say

TARGET = 0.3  # seconds
ROLLBACKCTL = str(Path(sys.executable).with_name("rollbackctl"))


def _median(command: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(command, capture_output=True, check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def cli_latency(runs: int, lines: Lines) -> None:
    bare = _median([sys.executable, "-c", "pass"], runs)
    say(lines, f"Median of {runs} runs each, fresh processes; the bare interpreter: {bare:.3f} s.")
    say(lines, "| command | wall time (s) | x bare interpreter | target |")
    say(lines, "|---|---|---|---|")
    for args in (["--help"], ["describe", "--help"], ["run", "--help"], ["completion", "bash"]):
        took = _median([ROLLBACKCTL, *args], runs)
        verdict = "met" if took < TARGET else "NOT MET"
        say(lines, f"| `rollbackctl {' '.join(args)}` | {took:.3f} | {took / bare:.1f}x |"
                   f" < {TARGET} s: {verdict} |")  # fmt: skip
