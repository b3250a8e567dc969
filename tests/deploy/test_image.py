"""The container image's inputs: what the Dockerfile copies exists, and the wheel it installs
carries the console script and the shipped scenarios (no Docker engine is needed for that)."""

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
    for source in re.findall(r"^COPY (?!--from)(.+) \S+$", text, re.M):
        for item in source.split():
            assert (ROOT / item).exists(), item
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
    assert "worker/scenarios/oom-rollback.yaml" in names
    assert "worker/simcluster/apiserver.py" in names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "rollbackctl = worker.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
