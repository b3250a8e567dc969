"""The krew manifest of ``kubectl rollback`` (``deploy/krew/rollback.yaml``): its archive is the
one ``make krew`` builds (rebuilt here, its sha256 compared), its fields are the ones krew's
plugin-manifest rules ask for, and the archive installed as krew installs it (unpacked, its
``files`` placed, its ``bin`` linked onto the PATH) is found and run by the real kubectl."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import ROOT
from tests.deploy.kustomize import kubectl

KREW = ROOT / "deploy" / "krew"


def manifest() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((KREW / "rollback.yaml").read_text())
    return loaded


def archive_module() -> Any:
    spec = importlib.util.spec_from_file_location("krew_archive", KREW / "archive.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_manifest_carries_the_sha256_of_the_archive_make_krew_builds(tmp_path: Path) -> None:
    archive = archive_module()
    path, digest = archive.build(tmp_path / "a")
    again, _ = archive.build(tmp_path / "b")
    assert path.read_bytes() == again.read_bytes()  # reproducible, so the checksum means it
    (platform,) = manifest()["spec"]["platforms"]
    assert platform["sha256"] == digest, "rebuild: make krew, then copy its sha256 here"
    assert platform["uri"].endswith(f"/v{archive.version()}/{path.name}")


def test_the_manifest_is_what_krew_asks_of_a_plugin() -> None:
    """krew's rules (its plugin-manifest guide): the name is the file's and kubectl's
    command, a v-prefixed semantic version (the package's), each platform a selector, an https
    archive with its sha256, the bin among the files it installs."""
    doc = manifest()
    assert doc["apiVersion"] == "krew.googlecontainertools.github.com/v1alpha2"
    assert doc["kind"] == "Plugin" and doc["metadata"]["name"] == "rollback"
    spec = doc["spec"]
    assert spec["version"] == f"v{archive_module().version()}"
    assert re.fullmatch(r"v\d+\.\d+\.\d+", spec["version"])
    assert spec["homepage"].startswith("https://")
    assert 0 < len(spec["shortDescription"]) <= 50 and spec["description"].strip()
    for platform in spec["platforms"]:
        assert platform["selector"]["matchExpressions"] or platform["selector"]["matchLabels"]
        assert platform["uri"].startswith("https://") and platform["uri"].endswith(".tar.gz")
        assert re.fullmatch(r"[0-9a-f]{64}", platform["sha256"])
        placed = {Path(f["to"]) / Path(f["from"]).name for f in platform["files"]}
        assert Path(".") / platform["bin"] in placed


def test_installed_as_krew_does_kubectl_finds_and_runs_it(tmp_path: Path) -> None:
    path, _ = archive_module().build(tmp_path / "dist")
    spec = manifest()["spec"]
    (platform,) = spec["platforms"]
    # krew: unpack into a staging directory, move each file to its place in the store, link
    # the bin into ~/.krew/bin.
    staging, store, bin_dir = (tmp_path / d for d in ("staging", "store", "bin"))
    with tarfile.open(path) as tar:
        tar.extractall(staging, filter="data")
    for f in platform["files"]:
        target = store / f["to"] / Path(f["from"]).name
        target.parent.mkdir(parents=True, exist_ok=True)
        (staging / f["from"]).rename(target)
    bin_dir.mkdir()
    (bin_dir / "kubectl-rollback").symlink_to(store / platform["bin"])
    path_var = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    env = {**os.environ, "PATH": path_var, "KUBECTL_ROLLBACK_PYTHON": sys.executable}

    def run(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [kubectl(), *args], capture_output=True, text=True, timeout=60, check=False,
            env={**env, **extra},
        )  # fmt: skip

    listed = run("plugin", "list")
    assert str(bin_dir / "kubectl-rollback") in listed.stdout, listed.stdout + listed.stderr
    helped = run("rollback", "pause", "-h")
    assert helped.returncode == 0, helped.stderr
    assert "namespace/NAME | pod/NAME | KIND/NAME" in helped.stdout
    # A python without the package: said how to get it, not a traceback.
    bare = tmp_path / "python3"
    bare.write_text('#!/bin/sh\n[ "$1" = -c ] && exit 1\nexit 0\n')
    bare.chmod(0o755)
    refused = run("rollback", "get", KUBECTL_ROLLBACK_PYTHON=str(bare))
    assert refused.returncode == 1
    assert "-m pip install rightsizing-rollback==" in refused.stderr, refused.stderr
