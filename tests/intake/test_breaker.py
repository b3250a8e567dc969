"""The storm breaker in the intake (``worker.intake.breaker``), against the API emulator over
HTTP and the real Temporal dev server: the verdicts the owners' state annotations show trip it;
it is written on the engine's namespace, told on each policy and to the receivers; a reset
counts afresh."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes.client import CoreV1Api, CustomObjectsApi
from temporalio import workflow
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from sim.apiserver import Fault, KubeEmulator
from tests import CLUSTER
from tests.activity.builders import NS, owner, policy
from tests.intake.test_intake import eventually
from tests.workflow.helpers import terminate_running
from worker import temporal
from worker.intake import Intake, causes
from worker.kube import api_client
from workflows.activity_api import OwnerRef, rollback_id
from workflows.breaker import StormBreaker
from workflows.contract import (
    DEFAULT_ENGINE_NAMESPACE,
    PAUSE_UNTIL_ANNOTATION,
    ROLLBACK_STATE_ANNOTATION,
    STORM_BREAKER_ANNOTATION,
    STORM_BREAKER_REASON_ANNOTATION,
    EventReason,
    Mode,
    WorkloadKind,
)
from workflows.pause import INFINITE, breaker_reset
from workflows.rollback import SA_CLUSTER, SA_HELD, WORKFLOW_NAME, ResumeSignal
from workflows.state import OwnerState

MERGE = "application/merge-patch+json"


def annotations(api: KubeEmulator) -> dict[str, str]:
    ns = api.store.get(api.store.rtype("Namespace"), None, DEFAULT_ENGINE_NAMESPACE) or {}
    return ns.get("metadata", {}).get("annotations") or {}


def verdict(api: KubeEmulator, name: str, mode: Mode, turn: int = 1) -> None:
    """What the worker records on the owner at a verdict (its state annotation)."""
    state = OwnerState(
        mode=mode, active_recommendation_fingerprint="f1", turn=turn,
        last_transition_time=datetime.now(UTC),
    )  # fmt: skip
    body = {"metadata": {"annotations": {ROLLBACK_STATE_ANNOTATION: state.to_json()}}}
    api.store.patch(api.store.rtype("Deployment"), NS, name, body, MERGE)


@pytest.fixture
async def world(temporal_env: WorkflowEnvironment) -> AsyncIterator[tuple[KubeEmulator, Intake]]:
    with KubeEmulator() as api:
        namespace = {"apiVersion": "v1", "kind": "Namespace"}
        api.store.create({**namespace, "metadata": {"name": DEFAULT_ENGINE_NAMESPACE}})
        api.store.create(policy(name="p1"))
        api.store.create(policy(kind="ClusterRollbackPolicy", name="c1"))
        for name in ("a", "b", "c", "d"):
            api.store.create(owner("Deployment", name=name, replicas=1))
        kube = api_client(url=api.url)
        queue = f"breaker-{uuid.uuid4().hex[:6]}"
        intake = Intake(
            CoreV1Api(kube), CustomObjectsApi(kube), temporal_env.client, CLUSTER, queue,
            asyncio.get_running_loop(), storm_breaker=StormBreaker.parse("50%/1m/3"),
        )  # fmt: skip
        await asyncio.to_thread(intake.start)
        yield api, intake
        await asyncio.to_thread(intake.stop)
        await terminate_running(temporal_env.client, queue)


async def test_the_breaker_trips_on_the_verdicts_tells_every_policy_and_resets(
    world: tuple[KubeEmulator, Intake], temporal_env: WorkflowEnvironment
) -> None:
    api, intake = world
    verdict(api, "a", Mode.ROLLING_BACK)
    verdict(api, "b", Mode.MONITORING_SUCCEEDED)
    verdict(api, "a", Mode.BACKING_OFF)  # not a verdict
    await eventually(lambda: intake.breaker.verdicts is not None and intake.breaker.verdicts._seen)
    assert STORM_BREAKER_ANNOTATION not in annotations(api)  # 2 verdicts: fewer than 3
    verdict(api, "c", Mode.ROLLING_BACK)  # 2 of 3 rolled back: more than half
    await eventually(lambda: STORM_BREAKER_ANNOTATION in annotations(api))
    assert annotations(api)[STORM_BREAKER_REASON_ANNOTATION] == (
        "2 of 3 verdicts rolled back within 1m (67% > 50%)"
    )

    # Each policy is told, by uid (kubectl describe finds it), once the Events are written.
    await eventually(lambda: len(told_events(api)) == 2)
    told = told_events(api)
    assert sorted(e["involvedObject"]["name"] for e in told) == ["c1", "p1"]
    assert all(e["involvedObject"]["uid"] for e in told)
    assert "re-applies stop cluster-wide until it is reset" in told[0]["message"]
    # The receivers are told through the worker's NotifyWorkflow, critical, naming the verdict.
    query = f'WorkflowType = "NotifyWorkflow" AND TaskQueue = "{intake.delivery.task_queue}"'

    async def notified() -> list[object]:
        return [w async for w in temporal_env.client.list_workflows(query)]

    deadline = asyncio.get_running_loop().time() + 15
    while not await notified():
        assert asyncio.get_running_loop().time() < deadline, "no notification started"
        await asyncio.sleep(0.2)
    # Reset by an operator: counted afresh from then, so one more rollback trips nothing.
    body = {"metadata": {"annotations": {STORM_BREAKER_ANNOTATION: None}}}
    api.store.patch(api.store.rtype("Namespace"), None, DEFAULT_ENGINE_NAMESPACE, body, MERGE)
    await eventually(lambda: not intake.breaker.tripped)
    verdict(api, "d", Mode.ROLLING_BACK)
    verdict(api, "a", Mode.ROLLING_BACK, turn=2)
    await eventually(lambda: len(intake.breaker.verdicts._seen) == 2)  # type: ignore[union-attr]
    assert STORM_BREAKER_ANNOTATION not in annotations(api)  # 2 verdicts since the reset
    verdict(api, "b", Mode.ROLLING_BACK, turn=2)
    await eventually(lambda: STORM_BREAKER_ANNOTATION in annotations(api))


def told_events(api: KubeEmulator) -> list[dict[str, Any]]:
    events = api.store.list_objects(api.store.rtype("Event"), None)[0]
    return [e for e in events if e["reason"] == EventReason.STORM_BREAKER_TRIPPED]


async def test_an_event_that_fails_as_it_trips_leaves_no_policy_untold(
    world: tuple[KubeEmulator, Intake],
) -> None:
    """The first Event the trip writes fails (a 500): every policy is told all the same, the
    failed one again a moment later. Before, that failure ended the telling, and the trip,
    written once, never came back to it: no policy was told (the soak saw it)."""
    api, _ = world
    failed = api.inject(Fault(status=500, method="POST", path="/events$", times=1))
    for name in ("a", "b", "c"):
        verdict(api, name, Mode.ROLLING_BACK)
    await eventually(lambda: STORM_BREAKER_ANNOTATION in annotations(api))
    await eventually(lambda: len(told_events(api)) == 2)
    assert failed.hits == 1
    assert sorted(e["involvedObject"]["name"] for e in told_events(api)) == ["c1", "p1"]


@workflow.defn(name=WORKFLOW_NAME)
class HeldRun:
    """A stand-in for a rollback run held at a gate, as the intake sees one: its ID, its
    cluster and ``RollbackHeld`` search attributes, and its ``resume`` signal, counted."""

    def __init__(self) -> None:
        self.resumes = 0

    @workflow.run
    async def run(self, cluster: str) -> None:
        workflow.upsert_search_attributes(
            [SA_CLUSTER.value_set(cluster), SA_HELD.value_set("backoff end: storm breaker")]
        )
        await workflow.wait_condition(lambda: self.resumes > 0)

    @workflow.signal
    def resume(self, _: ResumeSignal) -> None:
        self.resumes += 1


async def test_a_reset_resumes_a_run_it_held_whose_owner_a_pause_still_holds(
    world: tuple[KubeEmulator, Intake], temporal_env: WorkflowEnvironment
) -> None:
    """The breaker held a run whose owner is also paused, and the watch does not show it
    backing off (its state lags): the reset resumes it all the same, from Temporal's held
    runs, to look again (its pause, which may end by its time with no event, is its own to
    hold on). Left out, it would wait out its 10-minute look again."""
    api, intake = world
    body = {"metadata": {"annotations": {STORM_BREAKER_ANNOTATION: "2026-01-01T00:00:00Z"}}}
    api.store.patch(api.store.rtype("Namespace"), None, DEFAULT_ENGINE_NAMESPACE, body, MERGE)
    await eventually(lambda: intake.pauses.cluster_hold is not None)
    paused = {"metadata": {"annotations": {PAUSE_UNTIL_ANNOTATION: INFINITE}}}
    api.store.patch(api.store.rtype("Deployment"), NS, "a", paused, MERGE)
    verdict(api, "a", Mode.ROLLING_BACK)  # what the watch shows: not backing off
    a = OwnerRef(namespace=NS, kind=WorkloadKind.DEPLOYMENT, name="a")
    await eventually(lambda: intake.pauses.held(a))
    client, queue = temporal_env.client, intake.delivery.task_queue
    async with Worker(client, task_queue=queue, workflows=[HeldRun],
                      workflow_runner=UnsandboxedWorkflowRunner()):  # fmt: skip
        handle = await client.start_workflow(
            HeldRun.run, CLUSTER, id=rollback_id(CLUSTER, a), task_queue=queue
        )
        deadline = asyncio.get_running_loop().time() + 15
        while a not in await temporal.held_runs(client, CLUSTER):  # Temporal shows it held
            assert asyncio.get_running_loop().time() < deadline, "never shown held"
            await asyncio.sleep(0.2)
        reset = {"metadata": {"annotations": breaker_reset(datetime.now(UTC))}}
        api.store.patch(api.store.rtype("Namespace"), None, DEFAULT_ENGINE_NAMESPACE, reset, MERGE)
        await asyncio.wait_for(handle.result(), 15)  # resumed


async def test_a_reset_resumes_each_held_run_once(
    world: tuple[KubeEmulator, Intake], temporal_env: WorkflowEnvironment
) -> None:
    """At a reset, a run the watch shows backing off and Temporal shows held is resumed once
    (from the watch), not again from the held runs' listing; one Temporal alone shows held is
    resumed from the listing."""
    api, intake = world
    body = {"metadata": {"annotations": {STORM_BREAKER_ANNOTATION: "2026-01-01T00:00:00Z"}}}
    api.store.patch(api.store.rtype("Namespace"), None, DEFAULT_ENGINE_NAMESPACE, body, MERGE)
    await eventually(lambda: intake.pauses.cluster_hold is not None)
    verdict(api, "a", Mode.BACKING_OFF)  # the watch shows a backing off; b shows nothing
    a, b = (OwnerRef(namespace=NS, kind=WorkloadKind.DEPLOYMENT, name=n) for n in ("a", "b"))
    await eventually(lambda: causes.bringing_back(intake.owners.get(a) or {}))
    client, queue = temporal_env.client, intake.delivery.task_queue
    async with Worker(client, task_queue=queue, workflows=[HeldRun],
                      workflow_runner=UnsandboxedWorkflowRunner()):  # fmt: skip
        handles = [
            await client.start_workflow(
                HeldRun.run, CLUSTER, id=rollback_id(CLUSTER, o), task_queue=queue
            )
            for o in (a, b)
        ]
        deadline = asyncio.get_running_loop().time() + 15
        while {a, b} - set(await temporal.held_runs(client, CLUSTER)):  # both shown held
            assert asyncio.get_running_loop().time() < deadline, "never shown held"
            await asyncio.sleep(0.2)
        sent = intake.stats["resumes"]
        reset = {"metadata": {"annotations": breaker_reset(datetime.now(UTC))}}
        api.store.patch(api.store.rtype("Namespace"), None, DEFAULT_ENGINE_NAMESPACE, reset, MERGE)
        await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 15)
        # b's resume came from the listing: once nothing is pending, every resume was sent.
        await eventually(lambda: not intake.delivery.pending)
        assert intake.stats["resumes"] - sent == 2
