"""Notifications: which transitions tell people, and the workflow that tells them, durably.

A transition that matters (``severity_of``: ``rollingBack``, ``failedPermanent`` including
``rollbackRecommendationUnavailable``, ``aborted``, ``cancelled``) makes the rollback run start
a ``NotifyWorkflow`` child, abandoned when the parent closes: the rollback only waits for the
child to start, never on a receiver. The child asks the worker which receivers want it
(``route_notification``: severity, namespace and label filters live in the worker's
configuration), then sends to each in its own activity (``send_notification``) with bounded
retries, so a receiver that fails is retried alone and one that succeeded is not sent to again.
The last attempt that fails reports instead of raising (a log line, a metric and a Warning Event
on the owner) and the child ends: nothing retries forever. What cannot report itself (a last
attempt that timed out, a routing that kept failing) is reported by the child through
``report_notification_failure``, so every failure is seen.

Each notification carries an idempotency key derived from the transition (the owner, mode, turn,
fingerprint, the run and how many transitions it had made; never the workflow's clock): a
retried send (a worker killed mid-send, a timeout after the receiver stored it) carries the same
key, and so does a replay. The child's workflow ID is derived from the same key, so a
transition is notified by one child only.
"""

from __future__ import annotations

import asyncio
import hashlib
from datetime import datetime, timedelta
from enum import StrEnum

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

from workflows.activity_api import OwnerRef
from workflows.contract import FailureReason, Mode
from workflows.state import CamelModel, PolicyRef

NOTIFY_WORKFLOW = "NotifyWorkflow"
ROUTE_NOTIFICATION = "route_notification"
SEND_NOTIFICATION = "send_notification"
REPORT_NOTIFICATION_FAILURE = "report_notification_failure"
ROUTING = "(routing)"  # the receiver named in the report of a routing that failed
SEND_ATTEMPTS = 6  # 1s, 2s, 4s, 8s, 16s between them: about half a minute, then reported
SEND_TIMEOUT = timedelta(seconds=15)  # one attempt, the receiver's own timeout included
IDEMPOTENCY_HEADER = "Idempotency-Key"


class Severity(StrEnum):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"

    @property
    def rank(self) -> int:
        return list(Severity).index(self)


_SEVERITIES = {
    Mode.ROLLING_BACK: Severity.WARNING,
    Mode.ABORTED: Severity.WARNING,
    Mode.FAILED_PERMANENT: Severity.CRITICAL,
    Mode.CANCELLED: Severity.INFO,
}


def severity_of(mode: Mode) -> Severity | None:
    """How much a transition into ``mode`` matters to a person (None: not notified)."""
    return _SEVERITIES.get(mode)


class Notification(CamelModel):
    """What a receiver is told about one transition."""

    key: str  # the idempotency key: the same for every send of this transition
    severity: Severity
    transition: Mode
    cluster: str = ""  # "" only in notifications of runs started before clusters had names
    owner: OwnerRef
    policy: PolicyRef | None = None
    turn: int
    fingerprint: str
    reason: FailureReason | None = None
    message: str
    time: datetime
    workflow_id: str
    run_id: str

    @classmethod
    def of(
        cls,
        *,
        cluster: str,
        owner: OwnerRef,
        mode: Mode,
        turn: int,
        fingerprint: str,
        reason: FailureReason | None,
        message: str,
        policy: PolicyRef | None,
        time: datetime,
        workflow_id: str,
        run_id: str,
        transitions: int,
    ) -> Notification | None:
        """The notification of the run's ``transitions``-th transition, into ``mode``. Its key
        (and so its child's ID, which a replay checks) comes from what the run's history fixes,
        not from ``time``: a workflow's clock after a local activity may read differently live
        and on replay (the SDK may group the activity's result into another workflow task)."""
        severity = severity_of(mode)
        if severity is None:
            return None
        where = f"{cluster}/" if cluster else ""
        identity = f"{where}{owner}/{mode}/{turn}/{fingerprint}/{run_id}/{transitions}"
        return cls(
            key=hashlib.sha256(identity.encode()).hexdigest()[:32],
            severity=severity,
            transition=mode,
            cluster=cluster,
            owner=owner,
            policy=policy,
            turn=turn,
            fingerprint=fingerprint,
            reason=reason,
            message=message,
            time=time,
            workflow_id=workflow_id,
            run_id=run_id,
        )

    def workflow_id_for_child(self) -> str:
        """``notify/eu-west/shop/Deployment/api/failedPermanent/turn-2/c8aafc0932a7``: the
        cluster, the owner and the transition, readable in the UI; the key's head keeps two
        transitions apart."""
        owner, where = self.owner, f"{self.cluster}/" if self.cluster else ""
        return (
            f"notify/{where}{owner.namespace}/{owner.kind}/{owner.name}/{self.transition}"
            f"/turn-{self.turn}/{self.key[:12]}"
        )


class RouteResult(CamelModel):
    receivers: list[str]


class SendInput(CamelModel):
    receiver: str
    notification: Notification
    attempts: int = SEND_ATTEMPTS  # the last attempt reports a failure instead of raising

    @property
    def cluster(self) -> str:
        return self.notification.cluster


class SendResult(CamelModel):
    receiver: str
    delivered: bool
    detail: str = ""


class ReportInput(CamelModel):
    """A notification that could not be delivered to ``receiver`` (or routed), and why."""

    receiver: str
    notification: Notification
    detail: str

    @property
    def cluster(self) -> str:
        return self.notification.cluster


@workflow.defn(name=NOTIFY_WORKFLOW)
class NotifyWorkflow:
    """One transition to every receiver that wants it; see the module docstring."""

    @workflow.run
    async def run(self, notification: Notification) -> list[SendResult]:
        try:
            routed = await workflow.execute_activity(
                ROUTE_NOTIFICATION,
                notification,
                result_type=RouteResult,
                start_to_close_timeout=timedelta(seconds=20),
                retry_policy=RetryPolicy(maximum_attempts=SEND_ATTEMPTS),
                summary="which receivers want this transition",
            )
        except ActivityError as err:
            detail = f"routing failed: {err.cause or err}"
            return [await self._report(ROUTING, notification, detail)]
        return list(await asyncio.gather(*(self._send(r, notification) for r in routed.receivers)))

    async def _report(self, receiver: str, notification: Notification, detail: str) -> SendResult:
        """Log, count and tell the owner (a Warning Event) what could not report itself."""
        workflow.logger.warning("notification to %s not delivered: %s", receiver, detail)
        try:
            await workflow.execute_activity(
                REPORT_NOTIFICATION_FAILURE,
                ReportInput(receiver=receiver, notification=notification, detail=detail),
                start_to_close_timeout=timedelta(seconds=20),
                retry_policy=RetryPolicy(maximum_attempts=SEND_ATTEMPTS),
                summary=f"report the failed notification to {receiver}",
            )
        except ActivityError as err:  # the cluster cannot be told either: the log line stays
            workflow.logger.error("reporting the failed notification failed: %s", err.cause)
        return SendResult(receiver=receiver, delivered=False, detail=detail)

    async def _send(self, receiver: str, notification: Notification) -> SendResult:
        try:
            result: SendResult = await workflow.execute_activity(
                SEND_NOTIFICATION,
                SendInput(receiver=receiver, notification=notification),
                result_type=SendResult,
                start_to_close_timeout=SEND_TIMEOUT,
                retry_policy=RetryPolicy(
                    maximum_attempts=SEND_ATTEMPTS,
                    initial_interval=timedelta(seconds=1),
                    maximum_interval=timedelta(seconds=16),
                ),
                summary=f"notify {receiver}",
            )
            return result
        except ActivityError as err:  # the last attempt timed out: it could not report itself
            return await self._report(receiver, notification, str(err.cause or err))
