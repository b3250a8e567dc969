"""The client-side call that starts and wakes rollback workflows, shared by the intake and
``rollbackctl`` (connections come from ``worker.config.TemporalConfig``).

``observe``/``reopen`` use signal-with-start: signalling an owner whose workflow has finished
starts its next run (the next turn, a reopen, a new recommendation) under the same ID.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from temporalio.client import Client, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy

from workflows.activity_api import OwnerRef
from workflows.fingerprint import Recommendation
from workflows.rollback import (
    ObserveSignal,
    ReopenSignal,
    RollbackInput,
    RollbackResult,
    RollbackWorkflow,
)
from workflows.wake import Trigger


async def observe(
    client: Client,
    task_queue: str,
    owner: OwnerRef,
    recommendation: Recommendation,
    *,
    pod: str | None = None,
    pod_created_at: datetime | None = None,
    trigger: Trigger = Trigger.OBSERVE,
    rpc_timeout: timedelta | None = None,
) -> WorkflowHandle[RollbackWorkflow, RollbackResult]:
    """Signal-with-start ``observe`` (or ``reopen``) on the owner's workflow."""
    start = RollbackInput(
        owner=owner,
        recommendation=recommendation,
        trigger=trigger,
        observed_pod_created_at=pod_created_at,
    )
    signal_arg: ReopenSignal | ObserveSignal
    if trigger is Trigger.REOPEN:
        signal, signal_arg = "reopen", ReopenSignal()
    else:
        signal = "observe"
        signal_arg = ObserveSignal(
            recommendation=recommendation, pod=pod, pod_created_at=pod_created_at
        )
    return await client.start_workflow(
        RollbackWorkflow.run,
        start,
        id=owner.workflow_id,
        task_queue=task_queue,
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        start_signal=signal,
        start_signal_args=[signal_arg],
        static_summary=f"Rollback monitoring of {owner}",
        rpc_timeout=rpc_timeout,
    )
