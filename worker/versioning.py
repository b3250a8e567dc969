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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from temporalio.api.deployment.v1 import WorkerDeploymentVersion as DeploymentVersion
from temporalio.api.deployment.v1 import WorkerDeploymentVersionInfo
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
VersionTaskQueue = WorkerDeploymentVersionInfo.VersionTaskQueueInfo
NOT_POLLING = "missing active task queues"  # the server's refusal, see not_ready


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
        DescribeWorkerDeploymentRequest(namespace=client.namespace, deployment_name=deployment),
        retry=True,
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
    """Make ``version`` current; True once new attempts start on it (``_route``)."""
    request = SetWorkerDeploymentCurrentVersionRequest(
        namespace=client.namespace,
        deployment_name=version.deployment_name,
        build_id=version.build_id,
        identity=IDENTITY,
    )

    def routes(info: TaskQueueVersioningInfo) -> bool:
        return info.current_deployment_version.build_id == version.build_id

    service = client.workflow_service
    return await _route(
        client, version, lambda: service.set_worker_deployment_current_version(request, retry=True),
        routes, within,
    )  # fmt: skip


async def ramp(
    client: Client,
    version: WorkerDeploymentVersion,
    percentage: float,
    within: float = ROUTING_WAIT,
) -> bool:
    """Send ``percentage`` of new attempts to ``version``; 0 stops ramping. True once every
    task queue routes so."""
    request = SetWorkerDeploymentRampingVersionRequest(
        namespace=client.namespace,
        deployment_name=version.deployment_name,
        build_id=version.build_id if percentage > 0 else "",
        percentage=percentage,
        identity=IDENTITY,
    )

    def routes(info: TaskQueueVersioningInfo) -> bool:
        if percentage <= 0:
            return not info.ramping_deployment_version.build_id
        ramping = info.ramping_deployment_version.build_id == version.build_id
        return ramping and abs(info.ramping_version_percentage - percentage) < 1e-6

    service = client.workflow_service
    return await _route(
        client, version, lambda: service.set_worker_deployment_ramping_version(request, retry=True),
        routes, within,
    )  # fmt: skip


def not_ready(exc: RPCError) -> bool:
    """The server refused a routing change because the version's workers have not all polled
    yet: the deployment or the build is unknown to it (no poll reached it), or the version does
    not poll every task queue the current version serves (``missing active task queues``: an
    activity poller registers apart from, and may come seconds after, the workflow poller).
    Temporal's own tests retry these; so does ``_route``, within its wait."""
    if exc.status == RPCStatusCode.NOT_FOUND:
        return True
    return exc.status == RPCStatusCode.FAILED_PRECONDITION and NOT_POLLING in exc.message


async def _route(
    client: Client,
    version: WorkerDeploymentVersion,
    request: Callable[[], Awaitable[object]],
    routes: Routes,
    within: float,
) -> bool:
    """Ask for a routing change, retrying while the version is ``not_ready`` (a rollout's new
    pods may still be starting as the operator promotes it), then wait for it to propagate.
    Past ``within`` seconds: the refusal is raised, or False when the change was taken but has
    not reached every task queue."""
    loop = asyncio.get_running_loop()
    deadline, said = loop.time() + within, ""
    while True:
        try:
            await request()
            break
        except RPCError as exc:
            if not not_ready(exc) or loop.time() > deadline:
                raise
            if exc.message != said:  # once per reason, not per retry
                said = exc.message
                log.info("%s: not ready to route to yet (%s); waiting", version.build_id, said)
            await asyncio.sleep(PROPAGATION_POLL)
    return await _propagated(client, version, routes, deadline)


async def _propagated(
    client: Client, version: WorkerDeploymentVersion, routes: Routes, deadline: float
) -> bool:
    """Wait until the routing change reached the version's task queues: until then a new
    attempt may still start on the previous routing. Done when the deployment reports its
    update complete (a server that does not report it, UNSPECIFIED, is taken at its word), or
    when every task queue of the version (its workflow and activity queues) routes as asked:
    the deployment's own report can stay IN_PROGRESS for ever once a propagation step failed
    on a loaded server (temporalio/temporal#11842), while its task queues, which are what start
    new attempts, already route so. False if neither by ``deadline`` (the loop's clock).
    Polled: the API has only Describe calls for it."""
    queues: list[VersionTaskQueue] | None = None  # the version's, read once it is needed
    while True:
        state = (await describe(client, version.deployment_name)).worker_deployment_info
        if (
            state.routing_config_update_state
            != RoutingConfigUpdateState.ROUTING_CONFIG_UPDATE_STATE_IN_PROGRESS
        ):
            return True
        queues = queues or await _task_queues(client, version)
        routing = [info for _, info in await _routing_of(client, queues)]
        if routing and all(routes(info) for info in routing):
            return True
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(PROPAGATION_POLL)


async def adopt_if_first(
    client: Client, version: WorkerDeploymentVersion, within: float = 60
) -> bool:
    """Make ``version`` current when its deployment has no current version yet. The version
    exists only once this worker has polled, hence the retries. True when it became current.
    One budget, ``within``, for the lookups and the change (``set_current`` waits only what is
    left of it)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        try:
            routing = (
                await describe(client, version.deployment_name)
            ).worker_deployment_info.routing_config
            if routing.current_deployment_version.build_id:
                return False  # a later version: promoted on purpose (rollbackctl versions)
            await set_current(client, version, max(0.0, deadline - loop.time()))
            log.info(
                "%s: first version of %s, now current", version.build_id, version.deployment_name
            )
            return True
        except RPCError as exc:
            if exc.status not in (RPCStatusCode.NOT_FOUND, RPCStatusCode.FAILED_PRECONDITION):
                raise
            if loop.time() > deadline:
                log.warning("%s: could not make it current: %s", version.build_id, exc.message)
                return False
            await asyncio.sleep(0.5)


async def task_queue_routing(
    client: Client, version: WorkerDeploymentVersion
) -> list[tuple[str, TaskQueueVersioningInfo]]:
    """Each task queue the version's workers poll (workflow and activity), and how it routes
    new tasks now."""
    return await _routing_of(client, await _task_queues(client, version))


async def _task_queues(client: Client, version: WorkerDeploymentVersion) -> list[VersionTaskQueue]:
    described = await client.workflow_service.describe_worker_deployment_version(
        DescribeWorkerDeploymentVersionRequest(
            namespace=client.namespace,
            deployment_version=DeploymentVersion(
                deployment_name=version.deployment_name, build_id=version.build_id
            ),
        ),
        retry=True,
    )
    return list(described.worker_deployment_version_info.task_queue_infos)


async def _routing_of(
    client: Client, queues: list[VersionTaskQueue]
) -> list[tuple[str, TaskQueueVersioningInfo]]:
    """How each of ``queues`` routes new tasks now, read at its root partition (which hands
    its routing down to the others)."""
    routing = []
    for queue in queues:
        found = await client.workflow_service.describe_task_queue(
            DescribeTaskQueueRequest(
                namespace=client.namespace,
                task_queue=TaskQueue(name=queue.name),
                task_queue_type=queue.type,
            ),
            retry=True,
        )
        routing.append((queue.name, found.versioning_info))
    return routing
