"""Worker Versioning: the versions of the engine's Worker Deployment, and routing between them.

Used by the worker at start-up (``adopt_if_first``: the very first version of a deployment
becomes current by itself, so a fresh install works without a manual step; every later version
waits to be promoted) and by ``rollbackctl versions`` (list, set-current, ramp). Running attempts
per version come from the ``TemporalWorkerDeploymentVersion`` search attribute the server keeps.
docs/operating/upgrade.md, "Worker versioning", has the upgrade procedure.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from temporalio.api.deployment.v1 import WorkerDeploymentVersion as DeploymentVersion
from temporalio.api.enums.v1 import (
    RoutingConfigUpdateState,
    VersionDrainageStatus,
    WorkerDeploymentVersionStatus,
)
from temporalio.api.taskqueue.v1 import TaskQueue, TaskQueueVersioningInfo
from temporalio.api.workflowservice.v1 import (
    DescribeTaskQueueRequest,
    DescribeWorkerDeploymentRequest,
    DescribeWorkerDeploymentResponse,
    DescribeWorkerDeploymentVersionRequest,
    SetWorkerDeploymentCurrentVersionRequest,
    SetWorkerDeploymentRampingVersionRequest,
)
from temporalio.client import Client
from temporalio.common import WorkerDeploymentVersion
from temporalio.service import RPCError, RPCStatusCode

from worker.flags import ROUTING_WAIT
from workflows.rollback import WORKFLOW_NAME

log = logging.getLogger(__name__)
IDENTITY = "rightsizing-rollback"
PROPAGATION_POLL = 0.5
Routes = Callable[[TaskQueueVersioningInfo], bool]  # whether a task queue routes as asked


@dataclass(frozen=True)
class VersionRow:
    build_id: str
    status: str  # current, ramping, draining, drained, inactive
    ramp: float | None
    running: int  # attempts (RollbackWorkflow runs) still running on it

    @property
    def removable(self) -> bool:
        """Drained, or never current and with nothing running: its workers can go."""
        return self.status in ("drained", "inactive") and self.running == 0


def _status(value: WorkerDeploymentVersionStatus.ValueType) -> str:
    name = WorkerDeploymentVersionStatus.Name(value)
    return name.removeprefix("WORKER_DEPLOYMENT_VERSION_STATUS_").lower()


async def describe(client: Client, deployment: str) -> DescribeWorkerDeploymentResponse:
    return await client.workflow_service.describe_worker_deployment(
        DescribeWorkerDeploymentRequest(namespace=client.namespace, deployment_name=deployment)
    )


async def versions(client: Client, deployment: str) -> list[VersionRow]:
    info = (await describe(client, deployment)).worker_deployment_info
    routing = info.routing_config
    rows = []
    for summary in info.version_summaries:
        build = summary.deployment_version.build_id
        status = _status(summary.status)
        if summary.drainage_status == VersionDrainageStatus.VERSION_DRAINAGE_STATUS_DRAINED:
            status = "drained"
        query = (
            f'WorkflowType = "{WORKFLOW_NAME}" AND ExecutionStatus = "Running"'
            f' AND TemporalWorkerDeploymentVersion = "{deployment}:{build}"'
        )
        running = (await client.count_workflows(query)).count
        ramp = (
            routing.ramping_version_percentage
            if routing.ramping_deployment_version.build_id == build
            else None
        )
        rows.append(VersionRow(build, status, ramp, running))
    return sorted(rows, key=lambda r: r.build_id)


async def set_current(
    client: Client, version: WorkerDeploymentVersion, within: float = ROUTING_WAIT
) -> bool:
    """Make ``version`` current; True once new attempts start on it (``_propagated``)."""
    await client.workflow_service.set_worker_deployment_current_version(
        SetWorkerDeploymentCurrentVersionRequest(
            namespace=client.namespace,
            deployment_name=version.deployment_name,
            build_id=version.build_id,
            identity=IDENTITY,
        )
    )

    def routes(info: TaskQueueVersioningInfo) -> bool:
        return info.current_deployment_version.build_id == version.build_id

    return await _propagated(client, version, routes, within)


async def ramp(
    client: Client,
    version: WorkerDeploymentVersion,
    percentage: float,
    within: float = ROUTING_WAIT,
) -> bool:
    """Send ``percentage`` of new attempts to ``version``; 0 stops ramping. True once every
    task queue routes so."""
    await client.workflow_service.set_worker_deployment_ramping_version(
        SetWorkerDeploymentRampingVersionRequest(
            namespace=client.namespace,
            deployment_name=version.deployment_name,
            build_id=version.build_id if percentage > 0 else "",
            percentage=percentage,
            identity=IDENTITY,
        )
    )

    def routes(info: TaskQueueVersioningInfo) -> bool:
        if percentage <= 0:
            return not info.ramping_deployment_version.build_id
        ramping = info.ramping_deployment_version.build_id == version.build_id
        return ramping and abs(info.ramping_version_percentage - percentage) < 1e-6

    return await _propagated(client, version, routes, within)


async def _propagated(
    client: Client, version: WorkerDeploymentVersion, routes: Routes, within: float
) -> bool:
    """Wait until the routing change reached the version's task queues: until then a new
    attempt may still start on the previous routing. Done when the deployment reports its
    update complete (a server that does not report it, UNSPECIFIED, is taken at its word), or
    when every task queue of the version (its workflow and activity queues) routes as asked:
    the deployment's own report can stay IN_PROGRESS for ever once a propagation step failed
    on a loaded server (temporalio/temporal#11842), while its task queues, which are what start
    new attempts, already route so. False if neither within ``within`` seconds. Polled: the API
    has only Describe calls for it."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        state = (await describe(client, version.deployment_name)).worker_deployment_info
        if (
            state.routing_config_update_state
            != RoutingConfigUpdateState.ROUTING_CONFIG_UPDATE_STATE_IN_PROGRESS
        ):
            return True
        routing = await task_queue_routing(client, version)
        if routing and all(routes(info) for _, info in routing):
            return True
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(PROPAGATION_POLL)


async def adopt_if_first(
    client: Client, version: WorkerDeploymentVersion, within: float = 60
) -> bool:
    """Make ``version`` current when its deployment has no current version yet. The version
    exists only once this worker has polled, hence the retries. True when it became current."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        try:
            routing = (
                await describe(client, version.deployment_name)
            ).worker_deployment_info.routing_config
            if routing.current_deployment_version.build_id:
                return False  # a later version: promoted on purpose (rollbackctl versions)
            await set_current(client, version)
            log.info(
                "%s: first version of %s, now current", version.build_id, version.deployment_name
            )
            return True
        except RPCError as exc:
            if exc.status not in (RPCStatusCode.NOT_FOUND, RPCStatusCode.FAILED_PRECONDITION):
                raise
            if asyncio.get_running_loop().time() > deadline:
                log.warning("%s: could not make it current: %s", version.build_id, exc.message)
                return False
            await asyncio.sleep(0.5)


async def task_queue_routing(
    client: Client, version: WorkerDeploymentVersion
) -> list[tuple[str, TaskQueueVersioningInfo]]:
    """Each task queue the version's workers poll (workflow and activity), and how it routes
    new tasks now, read at its root partition (which hands its routing down to the others)."""
    described = await client.workflow_service.describe_worker_deployment_version(
        DescribeWorkerDeploymentVersionRequest(
            namespace=client.namespace,
            deployment_version=DeploymentVersion(
                deployment_name=version.deployment_name, build_id=version.build_id
            ),
        )
    )
    routing = []
    for queue in described.worker_deployment_version_info.task_queue_infos:
        found = await client.workflow_service.describe_task_queue(
            DescribeTaskQueueRequest(
                namespace=client.namespace,
                task_queue=TaskQueue(name=queue.name),
                task_queue_type=queue.type,
            )
        )
        routing.append((queue.name, found.versioning_info))
    return routing
