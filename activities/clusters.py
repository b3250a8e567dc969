"""A worker acts on its own cluster only: the activity interceptor that refuses the rest.

Every activity input of a rollback names the cluster its owner lives in (``OwnerInput.cluster``,
``Notification.cluster``). A fleet's clusters share one Temporal; each cluster's workers poll a
task queue of its own (``workflows.contract.task_queue_for``), so a run reaches another cluster's
worker only through a mistake: a task queue set by hand to another cluster's, a copied values
file. ``ClusterGuard``, installed by ``worker.runner.build_worker``, refuses such an activity
before it touches the API server: a non-retryable ``ForeignClusterError`` (the attempt ends
``aborted``, ``foreignCluster``), an ERROR log line, the ``rollback_foreign_runs_refused``
metric and, where the worker knows its Pod, a Warning Event on it (``RollbackForeignRunRefused``):
the refusing worker writes nothing about another cluster's workload into its own cluster.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from kubernetes.client import CoreV1Api
from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
)

from activities.writes import emit_once, event_body
from workflows.activity_api import PermanentError
from workflows.contract import EventReason

log = logging.getLogger(__name__)
COMPONENT = "rightsizing-rollback-worker"


class ClusterGuard(Interceptor):
    """Refuses every activity whose input names another cluster than ``cluster`` (or none).
    ``core`` and ``pod`` (namespace, name): where the refusal's Event goes, when known."""

    def __init__(
        self, cluster: str, core: CoreV1Api | None = None, pod: tuple[str, str] | None = None
    ) -> None:
        self.cluster, self.core, self.pod = cluster, core, pod

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Guarded(next, self)

    def refusal(self, arg: Any) -> str | None:
        """Why the activity called with ``arg`` must not run here; None: it is ours."""
        named = getattr(arg, "cluster", None)
        if named == self.cluster:
            return None
        if named is None:
            return f"its input names no cluster; this worker acts for {self.cluster} only"
        if named == "":
            return (
                f"it was started before clusters had names (0.1); this worker acts for"
                f" {self.cluster} only: drain 0.1 attempts on a 0.1 worker"
                " (docs/operating/upgrade.md)"
            )
        return f"it belongs to cluster {named}; this worker acts for {self.cluster} only"

    async def refuse(self, why: str) -> ApplicationError:
        info = activity.info()
        message = f"refused {info.activity_type} of {info.workflow_id}: {why}"
        log.error("%s (task queue %s)", message, info.task_queue)
        activity.metric_meter().create_counter(
            "rollback_foreign_runs_refused", "activities refused: their run is another cluster's"
        ).add(1)
        if self.core is not None and self.pod is not None:
            await asyncio.to_thread(
                self._event, f"{info.workflow_id}/{info.workflow_run_id}", message
            )
        return ApplicationError(message, type=PermanentError.FOREIGN_CLUSTER, non_retryable=True)

    def _event(self, identity: str, message: str) -> None:
        assert self.core is not None and self.pod is not None
        namespace, name = self.pod
        involved = {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": name}
        body = event_body(
            involved, identity, EventReason.FOREIGN_RUN_REFUSED, message, "Warning", COMPONENT
        )
        try:
            emit_once(self.core, involved, body)
        except Exception as exc:  # the refusal stands; only its Event is lost
            log.warning("the refusal's Event on pod %s/%s failed: %s", namespace, name, exc)


class _Guarded(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, guard: ClusterGuard) -> None:
        super().__init__(next)
        self.guard = guard

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        why = self.guard.refusal(input.args[0] if input.args else None)
        if why is not None:
            raise await self.guard.refuse(why)
        return await super().execute_activity(input)
