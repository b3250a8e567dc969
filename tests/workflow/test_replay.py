"""Replay the recorded histories of ``histories/`` against today's ``RollbackWorkflow``.

These are real histories from the scenarios of ``test_rollback_workflow.py`` (success, OOM over
two turns to failedPermanent, threshold not met with a manifest rollback, lastSuccessful
unavailable, cancel and reopen, supersede by a key change, continue-as-new, worker restarts, an
observe-only policy).
A change to the workflow that would break a running workflow after a deploy fails here.

``sampled-every-interval.*``: recorded before the ``final-sample-only`` patch, when a window was
sampled every interval; they replay through the patch's old branch, so runs started before an
upgrade finish on the new worker. ``notify-ids-by-key.*``: recorded before the
``readable-notify-ids`` patch, likewise. ``regular-activities.*``: recorded before the
``lean-attempts`` patch, with every activity a regular one. ``no-cluster.*``: recorded before
clusters had names (0.1: IDs ``rollback/<namespace>/<Kind>/<name>``); an upgrade drains them on a
0.1 worker (docs/operating/upgrade.md) and a 1.0 worker refuses to act for them, but they still
replay, so the code keeps reading their inputs.

To re-record after an intentional, versioned change:
``ROLLBACK_RECORD_HISTORIES=1 pytest tests/workflow/test_rollback_workflow.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from tests.workflow.helpers import HISTORIES
from workflows.rollback import RollbackWorkflow

RECORDED = sorted(HISTORIES.glob("*.json"))


SCENARIOS = {"success", "oom-two-turns", "cancel-reopen", "supersede-key-change", "continue-as-new"}
CURRENT_ONLY = {
    "observe-only",
    "notified-oom-two-turns",
    "notify-ids-by-key",  # before the readable-notify-ids patch: children named notify/<key>
    "retry-after-failed-permanent",
    "wakes-nothing-after-failed",  # the notify-transitions-only patch: no second notification
}  # paths added since the final-sample-only patch


def test_histories_are_recorded() -> None:
    names = [p.name.split(".") for p in RECORDED]
    assert {n[0] for n in names} >= (SCENARIOS - {"oom-two-turns"}) | CURRENT_ONLY
    assert {n[1] for n in names if n[0] == "no-cluster"} >= SCENARIOS | CURRENT_ONLY - {
        "notify-ids-by-key"
    }
    assert {n[1] for n in names if n[0] == "sampled-every-interval"} >= SCENARIOS
    assert {n[1] for n in names if n[0] == "regular-activities"} >= SCENARIOS - {"oom-two-turns"}


def test_current_histories_name_their_cluster() -> None:
    """What the tests record now runs in a named cluster: its search attributes and its
    notifications' IDs carry it."""
    current = [p for p in RECORDED if p.name.split(".")[0] == "notified-oom-two-turns"]
    assert current
    for path in current:
        text = path.read_text()
        assert "RollbackCluster" in text and '"notify/test/shop/Deployment/' in text


def test_current_histories_run_local_activities() -> None:
    """What the tests record now takes the lean path: reads and records as local activities."""
    current = [p for p in RECORDED if p.name.split(".")[0] in {"success", "cancel-reopen"}]
    assert current
    for path in current:
        text = path.read_text()
        assert "core_local_activity" in text, path.name
        assert "ACTIVITY_TASK_SCHEDULED" not in text, path.name


@pytest.mark.parametrize("path", RECORDED, ids=[p.stem for p in RECORDED])
async def test_replay(path: Path) -> None:
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    replayer = Replayer(workflows=[RollbackWorkflow], data_converter=pydantic_data_converter)
    await replayer.replay_workflow(history)
