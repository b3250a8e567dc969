"""bench/RESULTS.md: the machine line, and merging a run's sections into the file (each
section stamped with the command that measured it, the others kept)."""

from __future__ import annotations

import os
import platform
from pathlib import Path

from bench.harness import Lines

RESULTS = Path(__file__).parent / "RESULTS.md"


def machine() -> str:
    cpus = os.cpu_count()
    mem = next(
        (
            int(line.split()[1]) // 1024 // 1024
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemTotal")
        ),
        0,
    )
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    return f"{cpus} cores ({model}), {mem} GiB, {platform.system()} {platform.release()}, Python {platform.python_version()}"


def _sections(text: str) -> tuple[list[str], dict[str, list[str]]]:
    """(the lines before the first ``## ``, each ``## `` section's lines by heading)."""
    head: list[str] = []
    sections: dict[str, list[str]] = {}
    current = head
    for line in text.splitlines():
        if line.startswith("## "):
            current = sections.setdefault(line, [])
        else:
            current.append(line)
    return head, sections


def merge_results(old: str, lines: Lines, stamp: str) -> str:
    """RESULTS.md with the sections of this run replaced (each stamped with its command and
    date) and the others kept as they were, so one section can be re-measured on its own.
    Sections are written in the order the benchmark runs them, the hot-path list last."""
    _, kept = _sections(old)
    _, fresh = _sections("\n".join(lines))
    for heading, body in fresh.items():
        content = [line for line in body if line.strip() and not line.startswith("Command: ")]
        kept[heading] = [stamp, *content]
    out = ["# Benchmark results", "", f"Machine: {machine()}.", ""]
    for heading in sorted(kept, key=_position):
        out += [heading, *[line for line in kept[heading] if line.strip()], ""]
    return "\n".join(out).rstrip() + "\n"


# The order of the sections in RESULTS.md.
HEADINGS = (
    "## Cost",
    "## Memory",
    "## Burst",
    "## Policy status",
    "## P4",
    "## P2",
    "## P1",
    "## Worker",
    "## SQL",
)
HEADINGS_AFTER = ("## P3", "## Hot-path")


def _position(heading: str) -> int:
    known = HEADINGS + HEADINGS_AFTER
    return next((i for i, h in enumerate(known) if heading.startswith(h)), len(known) - 1)
