"""KiB per cached workflow, by workflow runner, each measured in a fresh process
(``python -m bench.memory``)."""

from __future__ import annotations

import json
import subprocess
import sys

from bench.harness import (
    Lines,
    say,
    scratch_server,
)


def workflow_memory(n: int, lines: Lines) -> None:
    """RSS per cached workflow by workflow runner, each in a fresh process (``bench.memory``)."""
    with scratch_server() as server:
        for runner in ("sandboxed", "passthrough", "unsandboxed"):
            out = subprocess.run(
                [sys.executable, "-m", "bench.memory", runner, str(n), server.address],
                capture_output=True,
                text=True,
                check=True,
            )
            got = json.loads(out.stdout.strip().splitlines()[-1])
            say(
                lines,
                f"  {runner:>11}: {got['kib_per_workflow']:.0f} KiB per cached workflow"
                f" ({n} windows waiting on their timer: RSS {got['before']:.0f} ->"
                f" {got['after']:.0f} MiB)",
            )
