"""The client-side calls that start, wake and steer rollback workflows, shared by the intake
(adoptions, the control annotation) and ``rollbackctl`` (connections come from
``worker.config.TemporalConfig``).

``observe`` uses signal-with-start: signalling an owner whose workflow has finished starts its
next run (the next turn, a reopen, a new recommendation) under the same ID. ``cancel`` and
``reopen`` are Updates to a running attempt (``RollbackWorkflow.request_cancel``/``_reopen``):
the workflow is the one judge, and a refusal comes back as ``ControlRefusedError`` with its
reason, so callers can say so instead of reporting a success. The ``cancel`` and ``reopen``
signals stay the product's contract (anyone may send them with ``temporal workflow signal``),
judged by the same function in the workflow, without an answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowQueryFailedError,
    WorkflowQueryRejectedError,
    WorkflowUpdateFailedError,
)
from temporalio.common import (
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from workflows.activity_api import OwnerRef, PolicySettings, parse_rollback_id, rollback_id
from workflows.contract import Mode, SearchAttribute
from workflows.fingerprint import Recommendation
from workflows.machine import RollbackState
from workflows.pause import Pause
from workflows.rollback import (
    CONTROL_REFUSED,
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
    SuspectSignal,
)
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
    adopted_at: datetime | None = None,
    trigger: Trigger = Trigger.OBSERVE,
    rpc_timeout: timedelta | None = None,
    turn: int | None = None,
    policy: PolicySettings | None = None,
) -> WorkflowHandle[RollbackWorkflow, RollbackResult]:
    """Signal-with-start ``observe`` (or ``reopen``) on the owner's workflow in ``cluster``. A
    run it starts carries from its start its search attributes (the cluster, the owner, the
    recommendation and, from the caller that knows them, the intake: the ``turn`` and
    ``policy`` of the attempt it opens, in ``monitoring``; a start is free, an upsert is a
    billable action) and the ``policy``, which its first read takes as resolved."""
    start = RollbackInput(
        cluster=cluster, owner=owner, recommendation=recommendation, trigger=trigger,
        observed_pod_created_at=pod_created_at, adopted_at=adopted_at, policy=policy,
    )  # fmt: skip
    signal_arg: ReopenSignal | ObserveSignal
    if trigger is Trigger.REOPEN:
        signal, signal_arg = "reopen", ReopenSignal()
    else:
        signal = "observe"
        signal_arg = ObserveSignal(
            recommendation=recommendation, pod=pod, pod_created_at=pod_created_at,
            adopted_at=adopted_at,
        )  # fmt: skip
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
            SearchAttributePair(SA_POLICY, str(policy.ref)),
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


async def newest_run(
    client: Client, cluster: str, owner: OwnerRef
) -> tuple[WorkflowExecutionStatus | None, RollbackState | None]:
    """Status and state (the ``status`` query: a worker must be up) of the owner's newest run,
    None for a run that ended before a worker ran it; raises ``RPCError`` (NOT_FOUND: no run at
    all)."""
    handle = client.get_workflow_handle_for(RollbackWorkflow.run, rollback_id(cluster, owner))
    info = await handle.describe()
    try:
        return info.status, await handle.query(RollbackWorkflow.status)
    except RPCError as exc:
        # Temporal's answer to a query of a run closed before its first workflow task (one
        # terminated or timed out waiting for a worker): it has no state to tell.
        if info.status is WorkflowExecutionStatus.RUNNING or (
            exc.status is not RPCStatusCode.FAILED_PRECONDITION
        ):
            raise
        return info.status, None


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


# What the SDK answers an Update the run's code has no handler for: a run pinned to a build
# from before the control Updates (Worker Versioning keeps it there until it ends).
NO_HANDLER = "expected but not found"


async def _update(
    handle: WorkflowHandle[RollbackWorkflow, RollbackResult],
    update: Any,
    arg: CancelSignal | ReopenSignal,
    rpc_timeout: timedelta | None,
    update_id: str | None,
) -> RollbackState:
    """A control Update to the running run: its answer, or ``ControlRefusedError`` with the
    workflow's reason. ``RPCError`` NOT_FOUND: no run is running to take it. A run whose build
    predates the Updates gets the control's signal instead (judged there by the same rule,
    unanswered): the state it was in is then read with the ``status`` query."""
    try:
        state: RollbackState = await handle.execute_update(
            update, arg, id=update_id, rpc_timeout=rpc_timeout
        )
    except WorkflowUpdateFailedError as exc:
        cause = exc.cause
        if isinstance(cause, ApplicationError) and cause.type == CONTROL_REFUSED:
            raise ControlRefusedError(cause.message) from None
        if not (isinstance(cause, ApplicationError) and NO_HANDLER in cause.message):
            raise
        signal = "cancel" if isinstance(arg, CancelSignal) else "reopen"
        for _ in range(40):  # a run deciding its start has no state yet: a moment
            before = await handle.query(RollbackWorkflow.status, rpc_timeout=rpc_timeout)
            if before is not None:
                await handle.signal(signal, arg, rpc_timeout=rpc_timeout)
                return before
            await asyncio.sleep(0.25)
        raise TimeoutError(f"{signal} not sent: the run is still deciding its start") from None
    return state


async def cancel(
    client: Client,
    cluster: str,
    owner: OwnerRef,
    reason: str,
    rpc_timeout: timedelta | None = None,
    fence: Callable[[], bool] = lambda: True,
    update_id: str | None = None,
) -> RollbackState:
    """``cancel`` as an Update to the owner's running attempt: the workflow judges it and
    answers with the state it was taken in, or ``ControlRefusedError`` with its reason (an
    ``update_id`` makes a retry the same request: answered once). With no run running, refused
    here with what the newest run says. ``fence`` is checked right before the Update."""
    handle = client.get_workflow_handle_for(RollbackWorkflow.run, rollback_id(cluster, owner))
    if not fence():
        raise FencedError(f"cancel of {owner} not sent")
    try:
        return await _update(
            handle,
            RollbackWorkflow.request_cancel,
            CancelSignal(reason=reason),
            rpc_timeout,
            update_id,
        )
    except RPCError as exc:
        if exc.status is not RPCStatusCode.NOT_FOUND:
            raise
    try:
        info = await handle.describe(rpc_timeout=rpc_timeout)
    except RPCError as exc:
        if exc.status is RPCStatusCode.NOT_FOUND:
            raise ControlRefusedError(
                f"no rollback attempt recorded for {owner} in cluster {cluster}"
            ) from None
        raise
    status = info.status.name.lower() if info.status else "unknown"
    raise ControlRefusedError(f"no attempt is running for {owner} ({status}): nothing to cancel")


async def resume(
    client: Client, cluster: str, owner: OwnerRef, rpc_timeout: timedelta | None = None
) -> None:
    """Signal ``resume`` to the owner's running attempt (a pause annotation went: a held step
    looks again)."""
    await _signal_running(client, cluster, owner, "resume", ResumeSignal(), rpc_timeout)


async def suspect(
    client: Client, cluster: str, owner: OwnerRef, pod: str, rpc_timeout: timedelta | None = None
) -> None:
    """Signal ``suspect`` to the owner's running attempt: ``pod`` fails for certain now, and
    under an early verdict the run samples (``machine.Suspected``)."""
    await _signal_running(client, cluster, owner, "suspect", SuspectSignal(pod=pod), rpc_timeout)


async def _signal_running(
    client: Client,
    cluster: str,
    owner: OwnerRef,
    signal: str,
    arg: Any,
    rpc_timeout: timedelta | None,
) -> None:
    """``signal`` to the owner's running attempt; an owner without one is left alone."""
    handle = client.get_workflow_handle_for(RollbackWorkflow.run, rollback_id(cluster, owner))
    try:
        await handle.signal(signal, arg, rpc_timeout=rpc_timeout)
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


# How often a reopen goes back to the Update when a new run appeared under its fallback.
REOPEN_TRIES = 3


async def reopen(
    client: Client,
    cluster: str,
    task_queue: str,
    owner: OwnerRef,
    rpc_timeout: timedelta | None = None,
    fence: Callable[[], bool] = lambda: True,
    update_id: str | None = None,
) -> RollbackState:
    """Reopen monitoring of the owner's current recommendation; returns the state it was taken
    in. A running attempt gets it as an Update: the workflow judges it (once it has decided its
    start) and answers. An ended one is judged by the wake rule, as its next run will judge it,
    and a reopen it takes starts that run (signal-with-start). ``ControlRefusedError`` says why
    nothing would change."""
    handle = client.get_workflow_handle_for(RollbackWorkflow.run, rollback_id(cluster, owner))
    if not fence():
        raise FencedError(f"reopen of {owner} not sent")
    for _ in range(REOPEN_TRIES):
        try:
            return await _update(
                handle, RollbackWorkflow.request_reopen, ReopenSignal(), rpc_timeout, update_id
            )
        except RPCError as exc:
            if exc.status is not RPCStatusCode.NOT_FOUND:
                raise
        running, state = await state_of(client, cluster, owner)
        if not running:
            break
        # A run started between the Update and the status query (the intake's start, or a
        # continue-as-new): it is the one to judge the reopen, so it gets the Update.
    else:
        raise TimeoutError(f"reopen of {owner} not sent: its runs kept changing under it")
    if state is None:
        raise ControlRefusedError(f"{owner} has no recorded state to reopen")
    refusal = state.reopen_refusal(running=False)
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
