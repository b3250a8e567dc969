"""The NotifyWorkflow on the real Temporal server, when a notification cannot report itself: a
send whose last attempt fails from outside (it timed out, the worker died: the activity never
returned) and a routing that keeps failing are reported through ``report_notification_failure``
(the log line, the metric and the Warning Event of ``activities.notify``), and the child ends."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment

from activities.clusters import ClusterGuard
from tests import CLUSTER
from tests.workflow.helpers import replay_and_record
from worker.runner import build_worker
from workflows.activity_api import OwnerRef, rollback_id
from workflows.contract import Mode, WorkloadKind
from workflows.notify import (
    REPORT_NOTIFICATION_FAILURE,
    ROUTE_NOTIFICATION,
    ROUTING,
    SEND_NOTIFICATION,
    Notification,
    NotifyWorkflow,
    ReportInput,
    RouteResult,
    SendInput,
    SendResult,
)


class Failing:
    """Activities that fail for good (no retry: a stand-in for the last attempt)."""

    def __init__(self, routing_fails: bool) -> None:
        self.routing_fails = routing_fails
        self.reported: list[ReportInput] = []

    @activity.defn(name=ROUTE_NOTIFICATION)
    async def route(self, input: Notification) -> RouteResult:
        if self.routing_fails:
            raise ApplicationError("owner lookup forbidden", non_retryable=True)
        return RouteResult(receivers=["oncall", "chat"])

    @activity.defn(name=SEND_NOTIFICATION)
    async def send(self, input: SendInput) -> SendResult:
        if input.receiver == "oncall":
            raise ApplicationError("StartToClose timeout", non_retryable=True)
        return SendResult(receiver=input.receiver, delivered=True)

    @activity.defn(name=REPORT_NOTIFICATION_FAILURE)
    async def report(self, input: ReportInput) -> None:
        self.reported.append(input)


def notification() -> Notification:
    owner = OwnerRef(namespace="shop", kind=WorkloadKind.DEPLOYMENT, name="api")
    made = Notification.of(
        cluster=CLUSTER, owner=owner, mode=Mode.FAILED_PERMANENT, turn=2, fingerprint="f",
        reason=None, message="failed", policy=None, time=datetime.now(UTC),
        workflow_id=rollback_id(CLUSTER, owner), run_id="r", transitions=3,
    )  # fmt: skip
    assert made is not None
    return made


async def _run(env: WorkflowEnvironment, fake: Failing, record_as: str) -> list[SendResult]:
    """The child to its end; its history replayed (and recorded as ``record_as``)."""
    queue = f"notify-{uuid.uuid4().hex[:6]}"
    async with build_worker(
        env.client, queue, fake, ClusterGuard(CLUSTER), workflows=[NotifyWorkflow]
    ):
        handle = await env.client.start_workflow(
            NotifyWorkflow.run, notification(), id=f"notify-{queue}", task_queue=queue
        )
        results = await handle.result()
    await replay_and_record([await handle.fetch_history()], record_as, NotifyWorkflow)
    return results


async def test_a_send_that_could_not_report_itself_is_reported(
    temporal_env: WorkflowEnvironment,
) -> None:
    fake = Failing(routing_fails=False)
    results = {r.receiver: r for r in await _run(temporal_env, fake, "notify.send-failed")}
    assert results["chat"].delivered and not results["oncall"].delivered
    (report,) = fake.reported
    assert report.receiver == "oncall" and "StartToClose timeout" in report.detail


async def test_a_routing_that_keeps_failing_is_reported_not_raised(
    temporal_env: WorkflowEnvironment,
) -> None:
    fake = Failing(routing_fails=True)
    (result,) = await _run(temporal_env, fake, "notify.routing-failed")  # the child ends
    assert not result.delivered and result.receiver == ROUTING
    (report,) = fake.reported
    assert report.receiver == ROUTING and "owner lookup forbidden" in report.detail
