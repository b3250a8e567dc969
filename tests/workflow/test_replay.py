"""Replay the recorded histories of ``histories/`` against today's workflows: the 1.0 format.

They are real histories of the tests that record them (``check_replay``, ``replay_and_record``):
success, OOM over two turns with its notifications, threshold not met with a manifest rollback,
lastSuccessful unavailable, cancel and reopen, supersede by a key change, continue-as-new,
worker restarts, an observe-only policy, a retry after failedPermanent, a run that wakes
nothing, a held rollback, a local activity that falls back to a regular one, a task lost after
it recorded its transition (then notified; or decided again), a verdict held for Prometheus
(decided once it answers; or at maxHold), a cancel taken while a rollback is held, a backoff's
end held by a pause (then lifted, or cancelled), and the
``NotifyWorkflow`` children that could not deliver (``notify.*``). A change to the workflows that
would break a running workflow after a deploy fails here.

1.0 has no ``workflow.patched`` branch: the histories of 0.1 and of the changes before 1.0 are
gone with their branches, since the upgrade from 0.1 is a drain (docs/operating/upgrade.md).
From 1.0 on, a change to workflow code is replay-safe, or guarded by a patch (and its histories
kept), or shipped through Worker Versioning; the upgrade page says which.

To re-record after an intentional change that no running attempt can meet:
``ROLLBACK_RECORD_HISTORIES=1 pytest tests/workflow``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from tests.workflow.helpers import HISTORIES
from workflows.notify import NotifyWorkflow
from workflows.rollback import RollbackWorkflow

RECORDED = sorted(HISTORIES.glob("*.json"))
STORIES = {
    "success", "notified-oom-two-turns", "below-threshold-manifest", "last-successful-unavailable",
    "cancel-reopen", "supersede-key-change", "continue-as-new", "worker-restart-monitoring",
    "worker-restart-backingOff", "observe-only", "retry-after-failed-permanent",
    "wakes-nothing-after-failed", "paused-rollback", "local-fallback", "notify.send-failed",
    "notify.routing-failed", "resume-during-held-read", "health-cpu-throttled",
    "lost-task-after-record", "lost-verdict-decided-again", "health-held-then-decided",
    "health-hold-bounded", "cancel-while-rollback-held", "paused-backoff-end-lifted",
    "paused-backoff-end-cancelled", "control-updates", "success-carried-policy",
    "early-verdict", "autoscaler-pinned", "release-fresh-window", "cancelled-record-hold",
    "cancelled-reopen-hold",
}  # fmt: skip
# The changes since the last release (1.0.0) guarded by ``workflow.patched``: the stories
# recorded on each one's new branch. Until 1.0.0 is tagged none is: a change before it is
# re-recorded instead (CHANGELOG.md lists each patch with the version whose attempts it keeps).
PATCHED: dict[str, set[str]] = {}


def _story(path: Path) -> str:
    return path.name.rsplit(".", 2)[0]


def test_every_story_is_recorded_and_no_other() -> None:
    assert {_story(p) for p in RECORDED} == STORIES


@pytest.mark.parametrize("path", RECORDED, ids=[p.stem for p in RECORDED])
def test_each_history_is_of_the_1_0_format(path: Path) -> None:
    """Named for its cluster, no patch marker (nor its TemporalChangeVersion upsert) but those
    of the changes since 1.0, and the reads and records of a rollback run as local
    activities."""
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    patches = {
        json.loads(payload.data)["id"]
        for event in history.events
        if event.marker_recorded_event_attributes.marker_name == "core_patch"
        for payload in event.marker_recorded_event_attributes.details["patch-data"].payloads
    }
    assert patches == PATCHED.get(_story(path), set()), path.name
    text = path.read_text()
    assert ("TemporalChangeVersion" in text) == bool(patches), path.name
    if _story(path).startswith("notify."):
        return
    assert '"RollbackCluster"' in text, path.name
    if _story(path) in {"success", "success-carried-policy", "cancel-reopen"}:
        assert "core_local_activity" in text and "ACTIVITY_TASK_SCHEDULED" not in text, path.name


@pytest.mark.parametrize("path", RECORDED, ids=[p.stem for p in RECORDED])
async def test_replay(path: Path) -> None:
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    workflow = NotifyWorkflow if _story(path).startswith("notify.") else RollbackWorkflow
    replayer = Replayer(workflows=[workflow], data_converter=pydantic_data_converter)
    await replayer.replay_workflow(history)
