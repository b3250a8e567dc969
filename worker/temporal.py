"""The client-side calls that start, wake and steer rollback workflows, shared by the intake
(adoptions, the control annotation) and ``rollbackctl`` (connections come from
``worker.config.TemporalConfig``).

``observe``/``reopen`` use signal-with-start: signalling an owner whose workflow has finished
starts its next run (the next turn, a reopen, a new recommendation) under the same ID.
``cancel``/``reopen`` first read the workflow's state and raise ``ControlRefusedError`` when the
signal would change nothing, so callers can say so instead of reporting a success.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowQueryFailedError,
    WorkflowQueryRejectedError,
)
from temporalio.common import (
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.service import RPCError, RPCStatusCode

from workflows.activity_api import OwnerRef, parse_rollback_id, rollback_id
from workflows.contract import Mode, SearchAttribute
from workflows.fingerprint import Recommendation
from workflows.machine import RollbackState
from workflows.pause import Pause
from workflows.rollback import (
    SA_CLUSTER,
    SA_FINGERPRINT,
    SA_MODE,
    SA_NAMESPACE,
    SA_POLICY,
    SA_TURN,
    SA_WORKLOAD,
    WORKFLOW_NAME,
    CancelSignal,
    ObserveSignal,
    ReopenSignal,
    ResumeSignal,
    RollbackInput,
    RollbackResult,
    RollbackWorkflow,
)
from workflows.state import PolicyRef
from workflows.wake import Trigger


async def observe(
    client: Client,
    cluster: str,
    task_queue: str,
    owner: OwnerRef,
    recommendation: Recommendation,
    *,
    pod: str | None = None,
    pod_created_at: datetime | None = None,
    trigger: Trigger = Trigger.OBSERVE,
    rpc_timeout: timedelta | None = None,
    turn: int | None = None,
    policy: PolicyRef | None = None,
) -> WorkflowHandle[RollbackWorkflow, RollbackResult]:
    """Signal-with-start ``observe`` (or ``reopen``) on the owner's workflow in ``cluster``. A
    run it starts carries its search attributes from its start: the cluster, the owner, the
    recommendation, and (from the caller that knows them: the intake) the ``turn`` and
    ``policy`` of the attempt it opens, in ``monitoring``; the run upserts only what its first
    state shows otherwise (a start is free, an upsert is a billable action)."""
    start = RollbackInput(
        cluster=cluster,
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
    shown: list[SearchAttributePair[Any]] = [
        SearchAttributePair(SA_CLUSTER, cluster),
        SearchAttributePair(SA_NAMESPACE, owner.namespace),
        SearchAttributePair(SA_WORKLOAD, owner.workload),
        SearchAttributePair(SA_FINGERPRINT, recommendation.fingerprint),
    ]
    if turn is not None and policy is not None:
        shown += [
            SearchAttributePair(SA_MODE, Mode.MONITORING.value),
            SearchAttributePair(SA_TURN, turn),
            SearchAttributePair(SA_POLICY, str(policy)),
        ]
    return await client.start_workflow(
        RollbackWorkflow.run,
        start,
        id=rollback_id(cluster, owner),
        task_queue=task_queue,
        search_attributes=TypedSearchAttributes(shown),
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        start_signal=signal,
        start_signal_args=[signal_arg],
        static_summary=run_summary(cluster, owner, recommendation, trigger, turn, pod),
        rpc_timeout=rpc_timeout,
    )


def run_summary(
    cluster: str,
    owner: OwnerRef,
    recommendation: Recommendation,
    trigger: Trigger,
    turn: int | None,
    pod: str | None,
) -> str:
    """A run's summary in the Temporal UI (set with its start): which attempt it opens and
    why, so that the runs under one workflow ID tell themselves apart; how it ended is in its
    details and its ``RollbackMode`` (docs/concepts/workflow.md, "Reading it in the Temporal
    UI")."""
    opens = f"turn {turn}" if turn is not None else "an attempt"
    why = f"pod {pod} adopted it" if pod else "its pods adopted it"
    if trigger is Trigger.REOPEN:
        why = "reopened"
    elif turn is not None and turn > 1:
        why = f"the next turn after backing off; {why}"
    return f"{owner} in {cluster}: {opens} of {recommendation.fingerprint}, {why}"


class ControlRefusedError(Exception):
    """The workflow would do nothing with this control; the message says why."""


class FencedError(Exception):
    """The caller may no longer act (``fence``): the control's signal was not sent."""


class StartUndecidedError(Exception):
    """The owner's newest run is running but has not yet decided its start (its ``status``
    query answers None): the control is neither refused nor sent; the caller tries again."""


async def newest_run(
    client: Client, cluster: str, owner: OwnerRef
) -> tuple[WorkflowExecutionStatus | None, RollbackState | None]:
    """Status and state (the ``status`` query: a worker must be up) of the owner's newest run;
    raises ``RPCError`` (NOT_FOUND: no run at all)."""
    handle = client.get_workflow_handle_for(RollbackWorkflow.run, rollback_id(cluster, owner))
    info = await handle.describe()
    return info.status, await handle.query(RollbackWorkflow.status)


async def held(client: Client, cluster: str, owner: OwnerRef) -> Pause | None:
    """The pause the owner's running attempt waits on (the ``held`` query), None when it
    waits on none, or its run has ended or predates pauses."""
    handle = client.get_workflow_handle_for(RollbackWorkflow.run, rollback_id(cluster, owner))
    try:
        return await handle.query(RollbackWorkflow.held)
    except (RPCError, WorkflowQueryRejectedError, WorkflowQueryFailedError):
        return None


async def state_of(
    client: Client, cluster: str, owner: OwnerRef
) -> tuple[bool, RollbackState | None]:
    """(running, state) of the owner's newest run; ``ControlRefusedError`` when it has none."""
    try:
        status, state = await newest_run(client, cluster, owner)
    except RPCError as exc:
        if exc.status is RPCStatusCode.NOT_FOUND:
            raise ControlRefusedError(
                f"no rollback attempt recorded for {owner} in cluster {cluster}"
            ) from None
        raise
    return status is WorkflowExecutionStatus.RUNNING, state


async def cancel(
    client: Client,
    cluster: str,
    owner: OwnerRef,
    reason: str,
    rpc_timeout: timedelta | None = None,
    fence: Callable[[], bool] = lambda: True,
) -> None:
    """Signal ``cancel`` to the running attempt (no query: it needs no worker to be up);
    ``fence`` is checked again between the read and the signal."""
    handle = client.get_workflow_handle_for(RollbackWorkflow.run, rollback_id(cluster, owner))
    try:
        info = await handle.describe(rpc_timeout=rpc_timeout)
    except RPCError as exc:
        if exc.status is RPCStatusCode.NOT_FOUND:
            raise ControlRefusedError(
                f"no rollback attempt recorded for {owner} in cluster {cluster}"
            ) from None
        raise
    if info.status is not WorkflowExecutionStatus.RUNNING:
        status = info.status.name.lower() if info.status else "unknown"
        raise ControlRefusedError(
            f"no attempt is running for {owner} ({status}): nothing to cancel"
        )
    if not fence():
        raise FencedError(f"cancel of {owner} not sent")
    await handle.signal(
        RollbackWorkflow.cancel, CancelSignal(reason=reason), rpc_timeout=rpc_timeout
    )


async def resume(
    client: Client, cluster: str, owner: OwnerRef, rpc_timeout: timedelta | None = None
) -> None:
    """Signal ``resume`` to the owner's running attempt (a pause annotation went: a held step
    looks again); an owner without a running attempt is left alone."""
    handle = client.get_workflow_handle_for(RollbackWorkflow.run, rollback_id(cluster, owner))
    try:
        await handle.signal(RollbackWorkflow.resume, ResumeSignal(), rpc_timeout=rpc_timeout)
    except RPCError as exc:
        if exc.status is not RPCStatusCode.NOT_FOUND:
            raise


def quote(value: str) -> str:
    """``value`` as a string literal of a visibility query."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


async def held_runs(client: Client, cluster: str) -> list[OwnerRef]:
    """The owners in ``cluster`` whose running attempt a pause holds (its ``RollbackHeld``
    search attribute is set), by one visibility query."""
    query = (
        f"WorkflowType = {quote(WORKFLOW_NAME)} AND ExecutionStatus = 'Running'"
        f" AND {SearchAttribute.CLUSTER} = {quote(cluster)} AND {SearchAttribute.HELD} IS NOT NULL"
    )
    return [
        parsed[1]
        async for wf in client.list_workflows(query)
        if (parsed := parse_rollback_id(wf.id)) is not None
    ]


async def reopen(
    client: Client,
    cluster: str,
    task_queue: str,
    owner: OwnerRef,
    rpc_timeout: timedelta | None = None,
    fence: Callable[[], bool] = lambda: True,
) -> RollbackState:
    """Reopen monitoring of the owner's current recommendation (from its last run) when the
    workflow would act on it; returns the state before the signal. ``rpc_timeout`` bounds the
    signal (the state is read first, with the SDK's own timeout)."""
    running, state = await state_of(client, cluster, owner)
    if state is None and running:  # say, a sighting's run reading the owner: not "no state"
        raise StartUndecidedError(f"{owner}: its newest run is deciding its start; try again")
    if state is None:
        raise ControlRefusedError(f"{owner} has no recorded state to reopen")
    refusal = state.reopen_refusal(running=running)
    if refusal is not None:
        raise ControlRefusedError(f"{owner} cannot be reopened ({state.mode}): {refusal}")
    if not fence():
        raise FencedError(f"reopen of {owner} not sent")
    await observe(
        client,
        cluster,
        task_queue,
        owner,
        state.recommendation,
        trigger=Trigger.REOPEN,
        rpc_timeout=rpc_timeout,
    )
    return state
