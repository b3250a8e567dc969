"""Worker Versioning on the real dev server: attempts stay on the build they started on.

A v1 worker and a v2 worker whose workflow code is deliberately incompatible (v2 starts every
run with a timer v1 never wrote) poll the same task queue as two versions of one Worker
Deployment. Attempts started while v1 is current (one in its window, one in its backoff) finish
on v1 with the right outcome after v2 is made current; new attempts run v2; no history has a
failed workflow task (no non-determinism); v1 then drains and can be scaled to zero.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import AsyncIterator

import pytest
from temporalio.client import Client, WorkflowHistory
from temporalio.common import WorkerDeploymentVersion
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from activities.clusters import ClusterGuard
from cli.main import main as rollbackctl
from sim.apiserver import KubeEmulator
from sim.devserver import search_attribute_args, temporal_binary
from tests import CLUSTER
from tests.activity.builders import NS, owner, pod, policy
from tests.workflow.fake_cluster import FakeCluster
from tests.workflow.helpers import new_owner, rec, settings
from tests.workflow.incompatible import V2_MARKER, RollbackWorkflowV2
from tests.workflow.test_rollback_workflow import succeeded_before
from worker import process, versioning
from worker.config import KubeConfig, TemporalConfig, WorkerConfig
from worker.runner import build_worker
from worker.temporal import observe
from workflows.activity_api import OwnerRef, rollback_id
from workflows.contract import Mode, WorkloadKind
from workflows.rollback import RollbackWorkflow

OOM, FITS = rec("256Mi"), rec("768Mi")
DEPLOYMENT = f"rollback-{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="module")
async def server() -> AsyncIterator[WorkflowEnvironment]:
    """A dev server of its own, checking drainage every second instead of every few minutes,
    with one partition per task queue: a task queue's routing read at its root partition (what
    ``set-current`` checks when the deployment's own report lags) is then every partition's,
    so an attempt started right after it cannot be dispatched by a partition still routing to
    the previous version."""
    env = await WorkflowEnvironment.start_local(
        data_converter=pydantic_data_converter,
        dev_server_existing_path=temporal_binary(),
        dev_server_extra_args=[
            *search_attribute_args(),
            "--dynamic-config-value",
            "matching.numTaskqueueReadPartitions=1",
            "--dynamic-config-value",
            "matching.numTaskqueueWritePartitions=1",
            "--dynamic-config-value",
            'matching.wv.VersionDrainageStatusVisibilityGracePeriod="2s"',
            "--dynamic-config-value",
            'matching.wv.VersionDrainageStatusRefreshInterval="1s"',
        ],
    )
    yield env
    await env.shutdown()


def how_it_ran(history: WorkflowHistory) -> str:
    """A run's start and the build of each workflow task, for a failure message: which run it
    continued, how, and on which version each task completed."""
    started = history.events[0].workflow_execution_started_event_attributes
    fields = ("continued_execution_run_id", "initiator", "inherited_pinned_version",
              "inherited_auto_upgrade_info", "versioning_override")  # fmt: skip
    start = {f: str(getattr(started, f)).replace("\n", " ") for f in fields}
    tasks = [
        (e.event_id, e.event_time.ToJsonString(),
         e.workflow_task_completed_event_attributes.deployment_version.build_id)
        for e in history.events if e.HasField("workflow_task_completed_event_attributes")
    ]  # fmt: skip
    run = started.original_execution_run_id
    return f"run {run}: started {start}; tasks (event, time, build) {tasks}"


def builds(history: WorkflowHistory) -> set[str]:
    """The build IDs that completed this run's workflow tasks."""
    return {
        e.workflow_task_completed_event_attributes.deployment_version.build_id
        for e in history.events
        if e.HasField("workflow_task_completed_event_attributes")
    }


def failed_tasks(history: WorkflowHistory) -> int:
    return sum(e.HasField("workflow_task_failed_event_attributes") for e in history.events)


def has_v2_marker(history: WorkflowHistory) -> bool:
    """The run's first command is v2's timer (v1 starts by scheduling load_owner)."""
    timers = [e for e in history.events if e.HasField("timer_started_event_attributes")]
    return bool(timers) and V2_MARKER.encode() in timers[0].user_metadata.summary.data


async def eventually(check, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, "condition never held"
        await asyncio.sleep(0.3)


async def cli(client: Client, address: str, *args: str) -> int:
    return await asyncio.to_thread(
        rollbackctl, ["versions", "--address", address, "--deployment-name", DEPLOYMENT, *args]
    )


async def test_attempts_finish_on_the_version_they_started_on(
    server: WorkflowEnvironment, capsys: pytest.CaptureFixture[str]
) -> None:
    client, queue = server.client, f"versions-{uuid.uuid4().hex[:6]}"
    address = client.service_client.config.target_host
    cluster = FakeCluster()
    v1 = WorkerDeploymentVersion(DEPLOYMENT, "v1")
    v2 = WorkerDeploymentVersion(DEPLOYMENT, "v2")
    async with build_worker(client, queue, cluster, ClusterGuard(CLUSTER), deployment=v1):
        # The first version of a deployment becomes current by itself.
        assert await versioning.adopt_if_first(client, v1)
        window_ref, window_owner = new_owner(cluster, settings(window=8.0))
        window_owner.apply(FITS)
        in_window = await observe(client, CLUSTER, queue, window_ref, FITS)
        backoff_ref, backoff_owner = new_owner(
            cluster,
            settings(window=1.0, backoff=6.0, max_attempts=1),
            state_json=succeeded_before(),
        )
        backoff_owner.apply(OOM)
        in_backoff = await observe(client, CLUSTER, queue, backoff_ref, OOM)
        moving_ref, moving_owner = new_owner(cluster, settings(window=8.0))
        moving_owner.apply(FITS)
        superseded = await observe(client, CLUSTER, queue, moving_ref, FITS)

        async def backing_off() -> bool:
            state = await in_backoff.query(RollbackWorkflow.status)
            return state is not None and state.mode is Mode.BACKING_OFF

        await eventually(backing_off)
        # The operator promotes v2 as its workers roll out: the server refuses while no v2
        # worker has polled every task queue v1 serves, and the command waits for them.
        promoting = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "cli.main", "versions", "--address", address,
            "--deployment-name", DEPLOYMENT, "set-current", "v2",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert promoting.stderr is not None
        refusal = b"v2: not ready to route to yet (build ID 'v2' not found"
        said = [await asyncio.wait_for(promoting.stderr.readline(), 60)]
        while said[-1] and refusal not in said[-1]:  # the first refusal, logged once
            said.append(await asyncio.wait_for(promoting.stderr.readline(), 60))
        assert refusal in said[-1], said
        async with build_worker(
            client,
            queue,
            cluster,
            ClusterGuard(CLUSTER),
            deployment=v2,
            workflows=[RollbackWorkflowV2],
        ):
            # v2 polls; a later version is not made current by itself, but by the operator.
            assert not await versioning.adopt_if_first(client, v2)
            out, err = await asyncio.wait_for(promoting.communicate(), 150)
            assert promoting.returncode == 0, err
            assert out.decode().startswith(f"{DEPLOYMENT}: v2 is current"), out
            routing = await versioning.task_queue_routing(client, v2)
            assert {name for name, _ in routing} == {queue}, routing  # workflows and activities
            assert all(info.current_deployment_version.build_id == "v2" for _, info in routing)
            new_ref, new_owner_ = new_owner(cluster, settings(window=1.0))
            new_owner_.apply(FITS)
            fresh = await observe(client, CLUSTER, queue, new_ref, FITS)
            # A new recommendation supersedes a v1 attempt: continue-as-new onto v2 (a new
            # attempt), while the superseded run's history stays all v1.
            moved = rec("700Mi")
            moving_owner.apply(moved)
            first_run = (await superseded.describe()).run_id
            await observe(client, CLUSTER, queue, moving_ref, moved)

            window_result = await in_window.result()
            backoff_result = await in_backoff.result()
            fresh_result = await fresh.result()
            assert window_result.mode is Mode.MONITORING_SUCCEEDED
            assert backoff_result.mode is Mode.FAILED_PERMANENT  # maxAttempts 1: backoff ends it
            assert fresh_result.mode is Mode.MONITORING_SUCCEEDED

            old = [await in_window.fetch_history(), await in_backoff.fetch_history()]
            new = await fresh.fetch_history()
            assert all(builds(h) == {"v1"} and not has_v2_marker(h) for h in old)
            assert builds(new) == {"v2"} and has_v2_marker(new)
            moving = client.get_workflow_handle_for(
                RollbackWorkflow.run, rollback_id(CLUSTER, moving_ref)
            )
            assert (await moving.result()).mode is Mode.MONITORING_SUCCEEDED
            before = await client.get_workflow_handle(
                rollback_id(CLUSTER, moving_ref), run_id=first_run
            ).fetch_history()
            after = await moving.fetch_history()
            assert builds(before) == {"v1"}, how_it_ran(before)
            assert builds(after) == {"v2"} and has_v2_marker(after), how_it_ran(after)
            old.append(before)
            assert sum(failed_tasks(h) for h in [*old, new, after]) == 0  # no non-determinism

            async def v1_drained() -> bool:
                rows = {r.build_id: r for r in await versioning.versions(client, DEPLOYMENT)}
                return rows["v1"].removable and rows["v2"].status == "current"

            await eventually(v1_drained, timeout=60)
            capsys.readouterr()
            assert await cli(client, address, "list") == 0
            listed = capsys.readouterr().out
            assert "v1" in listed and "drained" in listed and "current" in listed


async def test_a_versioned_worker_process_serves_from_its_first_start(
    server: WorkflowEnvironment,
) -> None:
    """``serve`` with versioning on: the first version of a fresh deployment makes itself current,
    so attempts run (pinned to it) without a manual step."""
    client, queue = server.client, f"served-{uuid.uuid4().hex[:6]}"
    version = WorkerDeploymentVersion(f"fresh-{uuid.uuid4().hex[:6]}", "0.1.0")
    with KubeEmulator() as api:
        api.store.create(owner("Deployment", replicas=1))
        api.store.create(policy(monitoringPeriod="1s"))
        api.store.create(pod("web-0", {"app": "web"}, memory="768Mi", rec=FITS))
        config = WorkerConfig(
            TemporalConfig.at(client.service_client.config.target_host, queue, CLUSTER),
            KubeConfig(url=api.url),
            deployment=version,
        )
        stop = asyncio.Event()
        serving = asyncio.create_task(process.serve(stop, worker=config))
        try:
            ref = OwnerRef(namespace=NS, kind=WorkloadKind.DEPLOYMENT, name="web")
            handle = await observe(client, CLUSTER, queue, ref, FITS)
            assert (await handle.result()).mode is Mode.MONITORING_SUCCEEDED
            assert builds(await handle.fetch_history()) == {"0.1.0"}
        finally:
            stop.set()
            await asyncio.wait_for(serving, 60)


async def test_a_build_that_never_polls_is_refused_at_the_end_of_the_wait(
    server: WorkflowEnvironment, capsys: pytest.CaptureFixture[str]
) -> None:
    """``set-current`` waits for the version's workers only ``--wait`` seconds, then exits 1
    with the server's reason and what to check."""
    address = server.client.service_client.config.target_host
    capsys.readouterr()
    code = await asyncio.to_thread(
        rollbackctl,
        ["versions", "--address", address, "--deployment-name", f"never-{uuid.uuid4().hex[:6]}",
         "set-current", "v9", "--wait", "1"],
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1
    assert "no Worker Deployment found" in err and "still so after 1s" in err, err
