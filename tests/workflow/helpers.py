"""Shared pieces of the workflow tests: policies with short real durations, owners, histories."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from datetime import timedelta
from pathlib import Path

from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import Replayer

from activities.clusters import ClusterGuard
from tests import CLUSTER
from tests.workflow.fake_cluster import FakeCluster, FakeOwner
from worker.runner import build_worker
from workflows.activity_api import OwnerRef, PolicySettings
from workflows.contract import RollbackTarget, WorkloadKind
from workflows.fingerprint import Recommendation
from workflows.machine import RollbackState
from workflows.policy import Backoff
from workflows.rollback import RollbackWorkflow
from workflows.state import PolicyRef

HISTORIES = Path(__file__).parent / "histories"
KEY = "static.rightsizing.kubex.ai/desired-resource-requests"
HASHED_KEY = "static.rightsizing.kubex.ai/h5e2a91-desired-resource-requests"


def rec(memory: str, key: str = KEY) -> Recommendation:
    return Recommendation(requests_key=key, requests={"app": {"memory": memory}})


def settings(
    *,
    target: RollbackTarget = RollbackTarget.LAST_SUCCESSFUL,
    window: float = 2.0,
    backoff: float = 1.0,
    multiply: int = 1,
    max_attempts: int = 2,
    threshold: int = 80,
    reopen: bool = True,
    observe_only: bool = False,
) -> PolicySettings:
    return PolicySettings(
        ref=PolicyRef(kind="RollbackPolicy", namespace="shop", name="short"),
        monitoring_period=timedelta(seconds=window),
        rollback_target=target,
        adoption_threshold_percent=threshold,
        backoff=Backoff(
            time_period=timedelta(seconds=backoff),
            multiply_by_turn=multiply,
            max_attempts=max_attempts,
        ),
        enable_monitoring_reopen=reopen,
        observe_only=observe_only,
    )


def new_owner(
    cluster: FakeCluster, policy: PolicySettings | None, **kwargs: object
) -> tuple[OwnerRef, FakeOwner]:
    ref = OwnerRef(
        namespace="shop", kind=WorkloadKind.DEPLOYMENT, name=f"api-{uuid.uuid4().hex[:8]}"
    )
    owner = FakeOwner(policy=policy, **kwargs)  # type: ignore[arg-type]
    cluster.owners[str(ref)] = owner
    return ref, owner


@asynccontextmanager
async def running_worker(
    client: Client, task_queue: str, cluster: FakeCluster
) -> AsyncIterator[None]:
    worker = build_worker(client, task_queue, cluster, ClusterGuard(CLUSTER))
    async with worker:
        yield


async def wait_for(
    handle: WorkflowHandle,
    predicate: Callable[[RollbackState], bool],
    timeout: float = 20.0,  # type: ignore[type-arg]
) -> RollbackState:
    """Poll the ``status`` query until ``predicate`` holds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        state = await handle.query(RollbackWorkflow.status)
        if state is not None and predicate(state):
            return state
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"status never matched; last: {state}")
        await asyncio.sleep(0.1)


async def histories(client: Client, workflow_id: str) -> list[WorkflowHistory]:
    """Every run's history of ``workflow_id``, oldest first.

    Visibility (``list_workflows``) lags a little behind, so the runs it lists are completed with
    the latest run and every run linked to a known one by continue-as-new.
    """
    latest = await client.get_workflow_handle(workflow_id).describe()
    pending = {wf.run_id async for wf in client.list_workflows(f'WorkflowId = "{workflow_id}"')}
    pending.add(latest.run_id)
    found: dict[str, WorkflowHistory] = {}
    while pending:
        run_id = pending.pop()
        history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
        found[run_id] = history
        started = history.events[0].workflow_execution_started_event_attributes
        last = history.events[-1]
        linked = [started.continued_execution_run_id]
        if last.HasField("workflow_execution_continued_as_new_event_attributes"):
            linked.append(
                last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
            )
        pending.update(r for r in linked if r and r not in found)
    return sorted(found.values(), key=lambda h: h.events[0].event_time.ToDatetime())


async def check_replay(client: Client, workflow_id: str, record_as: str) -> int:
    """Replay every run of the workflow; save the histories when recording is asked for."""
    found = await histories(client, workflow_id)
    await replay_and_record(found, record_as, RollbackWorkflow)
    return len(found)


async def replay_and_record(found: list[WorkflowHistory], record_as: str, workflow: type) -> None:
    """Replay ``found`` (the runs of one story, oldest first) on today's ``workflow``; with
    ``ROLLBACK_RECORD_HISTORIES`` set, save them as ``<record_as>.<n>.json``."""
    replayer = Replayer(workflows=[workflow], data_converter=pydantic_data_converter)
    for history in found:
        await replayer.replay_workflow(history)
    if os.environ.get("ROLLBACK_RECORD_HISTORIES"):
        HISTORIES.mkdir(exist_ok=True)
        for index, history in enumerate(found):
            (HISTORIES / f"{record_as}.{index}.json").write_text(history.to_json())


async def terminate_running(client: Client, task_queue: str) -> None:
    """End what a test left running on its task queue, so workflow IDs can be reused."""
    query = f'TaskQueue = "{task_queue}" AND ExecutionStatus = "Running"'
    async for wf in client.list_workflows(query):
        try:
            await client.get_workflow_handle(wf.id, run_id=wf.run_id).terminate("test teardown")
        except RPCError as exc:  # it ended since visibility listed it running
            if exc.status is not RPCStatusCode.NOT_FOUND:
                raise


async def end_if_running(client: Client, workflow_id: str) -> None:
    """Terminate another test's run of a shared workflow ID (same owner, other task queue)."""
    handle = client.get_workflow_handle(workflow_id)
    with suppress(RPCError):
        if (await handle.describe()).status is WorkflowExecutionStatus.RUNNING:
            await handle.terminate("test isolation")
