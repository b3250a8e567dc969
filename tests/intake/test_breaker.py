"""The storm breaker in the intake (``worker.intake.breaker``), against the API emulator over
HTTP and the real Temporal dev server: the verdicts the owners' state annotations show trip it;
it is written on the engine's namespace, told on each policy and to the receivers; a reset
counts afresh."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from kubernetes.client import CoreV1Api, CustomObjectsApi
from temporalio.testing import WorkflowEnvironment

from sim.apiserver import KubeEmulator
from tests import CLUSTER
from tests.activity.builders import NS, owner, policy
from tests.intake.test_intake import eventually
from tests.workflow.helpers import terminate_running
from worker.intake import Intake
from worker.kube import api_client
from workflows.breaker import StormBreaker
from workflows.contract import (
    DEFAULT_ENGINE_NAMESPACE,
    ROLLBACK_STATE_ANNOTATION,
    STORM_BREAKER_ANNOTATION,
    STORM_BREAKER_REASON_ANNOTATION,
    EventReason,
    Mode,
)
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
    # Each policy is told, by uid (kubectl describe finds it).
    events = api.store.list_objects(api.store.rtype("Event"), None)[0]
    told = [e for e in events if e["reason"] == EventReason.STORM_BREAKER_TRIPPED]
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
