"""The benchmark's quick mode as a smoke check: it runs end to end and prints every figure.
Figures only: nothing here fails on a time."""

from __future__ import annotations

import subprocess
import sys

from bench.__main__ import SECTIONS
from tests.conftest import ROOT

# The sections in three parts of about the same time (65 to 70 s each alone), run at once (the
# quick bench idles on its servers much of the time): what ``python -m bench --quick`` runs.
PARTS = ("cost,status,p4,cli,versioning", "memory,p2,sqlite", "fleet,p3,p1,burst")


def test_quick_bench_prints_every_section() -> None:
    assert sorted(",".join(PARTS).split(",")) == sorted(SECTIONS)
    runs = [
        subprocess.Popen(
            [sys.executable, "-m", "bench", "--quick", "--only", part],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for part in PARTS
    ]
    outputs = [run.communicate(timeout=600) for run in runs]
    for run, (_, err) in zip(runs, outputs, strict=True):
        assert run.returncode == 0, err[-3000:]
    stdout = "".join(out for out, _ in outputs)
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
        assert heading in stdout
    # An attempt costs the same whatever its window (asserted inside the benchmark too).
    assert "the same for every window: yes; pod LISTs 1" in stdout
    assert "signals per owner: 1.00 (max 1)" in stdout  # two pods per owner, one signal
    assert "same answers" in stdout  # the index and the linear scan agreed
    assert "(1 GET of the owner, 1 LIST of pods)" in stdout  # never a GET per pod
    assert "20/20 reached the right final mode" in stdout
    assert "floor (the same 20 attempts as floor workflows" in stdout  # P3's floor ran
    assert "at most 1 write(s) of one policy in any 2 s" in stdout  # the writer's period


def test_p5s_floor_flags_are_refused_without_p5() -> None:
    """``--no-floor`` and ``--floor-only`` are P5's: with another section (or both at once)
    they are refused, not dropped."""
    refused = (["--floor-only"], ["--only", "p3", "--no-floor"],
               ["--only", "p5", "--no-floor", "--floor-only"])  # fmt: skip
    for args in refused:
        run = subprocess.run([sys.executable, "-m", "bench", *args], cwd=ROOT,
                             capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
        assert run.returncode == 2 and "--floor-only" in run.stderr, (args, run.stderr)
        assert "Traceback" not in run.stderr and "## " not in run.stdout
