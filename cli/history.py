"""``rollbackctl history`` (``kubectl rollback history``): a workload's attempts, one line per
run of its workflow (a turn, a reopened window, a new recommendation: each is a run), newest
first, with where each ended and why.

From Temporal when it answers: the runs its visibility lists, each closed one's result for its
failure reason. Else from the owner's state annotation, as the cluster keeps it: its newest
transitions (``HISTORY_LIMIT``), one line per recommendation and turn. The heading says which.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from temporalio.client import Client, WorkflowExecutionStatus

from cli.ops import columns
from worker import temporal as control
from workflows.activity_api import OwnerRef, rollback_id
from workflows.contract import SearchAttribute
from workflows.rollback import RollbackWorkflow
from workflows.state import OwnerState


@dataclass(frozen=True)
class Line:
    started: datetime
    fingerprint: str
    turn: int | None
    ended: str  # the mode it ended in, or is in
    reason: str = ""  # its failure reason, if any
    status: str = ""  # the run's (Temporal), "" from the annotation

    def cells(self) -> tuple[str, ...]:
        turn = "" if self.turn is None else str(self.turn)
        started = self.started.strftime("%Y-%m-%dT%H:%M:%SZ")
        return (started, self.fingerprint, turn, self.ended, self.reason or "-", self.status)


async def from_temporal(client: Client, cluster: str, owner: OwnerRef) -> list[Line]:
    """Every run of the owner's workflow, newest first."""
    workflow_id = rollback_id(cluster, owner)
    lines = []
    async for wf in client.list_workflows(f"WorkflowId = {control.quote(workflow_id)}"):
        attrs = {pair.key.name: pair.value for pair in wf.typed_search_attributes}
        ended, reason = str(attrs.get(SearchAttribute.MODE, "")), ""
        if wf.status is WorkflowExecutionStatus.COMPLETED:
            handle = client.get_workflow_handle_for(
                RollbackWorkflow.run, workflow_id, run_id=wf.run_id
            )
            result = await handle.result()
            ended, reason = result.mode.value, result.failure_reason or ""
        status = wf.status.name.title().replace("_", "") if wf.status else "Unknown"
        turn = attrs.get(SearchAttribute.TURN)
        lines.append(
            Line(wf.start_time, str(attrs.get(SearchAttribute.FINGERPRINT, "")),
                 turn if isinstance(turn, int) else None, ended, str(reason), status)
        )  # fmt: skip
    return sorted(lines, key=lambda line: line.started, reverse=True)


def from_state(state: OwnerState) -> list[Line]:
    """The state annotation's transitions, one line per recommendation and turn (where the
    turn ended, or is now), newest first."""
    entries = [
        (e.time, e.fingerprint, e.turn, e.mode.value, e.failure_reason) for e in state.history
    ]
    now = (state.last_transition_time, state.active_recommendation_fingerprint, state.turn,
           state.mode.value, state.failure_reason)  # fmt: skip
    if not entries or entries[-1][1:4] != now[1:4]:
        entries.append(now)
    lines: list[Line] = []
    for at, fingerprint, turn, mode, reason in entries:
        last = lines[-1] if lines else None
        if last is not None and (last.fingerprint, last.turn) == (fingerprint, turn):
            lines[-1] = Line(last.started, fingerprint, turn, mode, reason or "")
        else:
            lines.append(Line(at, fingerprint, turn, mode, reason or ""))
    return lines[::-1]


def render(owner: OwnerRef, lines: list[Line], source: str) -> str:
    heading = ("STARTED", "RECOMMENDATION", "TURN", "ENDED", "REASON", "RUN")
    table = columns(heading, [line.cells() for line in lines])
    return f"{owner}: {len(lines)} line(s), newest first; from {source}\n{table}"
