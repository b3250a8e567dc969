"""The benchmark's quick mode as a smoke check: it runs end to end and prints every figure.
Figures only: nothing here fails on a time."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT


def test_quick_bench_prints_every_section() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench", "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    for heading in (
        "## Cost",
        "## Memory",
        "## Burst",
        "## Policy status",
        "## P4",
        "## P2",
        "## P1",
        "## SQLite",
        "## P3",
    ):
        assert heading in out.stdout
    # An attempt costs the same whatever its window (asserted inside the benchmark too).
    assert "the same for every window: yes; pod LISTs 1" in out.stdout
    assert "signals per owner: 1.00 (max 1)" in out.stdout  # two pods per owner, one signal
    assert "same answers" in out.stdout  # the index and the linear scan agreed
    assert "(1 GET of the owner, 1 LIST of pods)" in out.stdout  # never a GET per pod
    assert "20/20 reached the right final mode" in out.stdout
    assert "floor (the same 20 attempts as floor workflows" in out.stdout  # P3's floor ran
    assert "at most 1 write(s) of one policy in any 2 s" in out.stdout  # the writer's period
