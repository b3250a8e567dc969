"""Shared fixtures: paths of the repository, and small builders for policy documents."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "deploy" / "examples"


def policy_doc(kind: str = "RollbackPolicy", name: str = "p", **spec: Any) -> dict[str, Any]:
    """A valid policy document; keyword arguments override (or, as ``None``, drop) spec fields."""
    doc: dict[str, Any] = {
        "apiVersion": "rightsizing.kubex.ai/v1alpha1",
        "kind": kind,
        "metadata": {"name": name, **({"namespace": "team"} if kind == "RollbackPolicy" else {})},
        "spec": {
            "monitoringPeriod": "5m",
            "rollbackTarget": "lastSuccessful",
            "adoptionThresholdPercent": 80,
            "backoff": {"timePeriod": "1m", "multiplyByTurn": 2, "maxAttempts": 3},
        },
    }
    for key, value in spec.items():
        if value is None:
            doc["spec"].pop(key, None)
        else:
            doc["spec"][key] = copy.deepcopy(value)
    return doc


@pytest.fixture
def examples() -> Path:
    return EXAMPLES
