"""The verdict's health checks on the real Temporal server (the cluster and Prometheus side is
``FakeCluster``: our own activity boundary): adopted but unhealthy rolls back with the check's
failure reason; Prometheus unable to answer meets the policy's onPrometheusError."""

from __future__ import annotations

import asyncio

import pytest
from temporalio.client import Client
from temporalio.exceptions import ApplicationError

from cli import ops
from tests import CLUSTER
from tests.workflow.fake_cluster import FakeCluster
from tests.workflow.helpers import check_replay, new_owner, rec, settings, wait_for
from tests.workflow.test_rollback_workflow import client, cluster, task_queue  # noqa: F401
from worker.temporal import observe
from workflows.activity_api import (
    CHECK_HEALTH,
    PROMETHEUS_NOT_CONFIGURED,
    CheckResult,
    HealthResult,
    PolicySettings,
    rollback_id,
)
from workflows.contract import EventReason, FailureReason, Mode, RollbackTarget
from workflows.policy import HealthChecks
from workflows.rollback import CancelSignal, RollbackWorkflow

FITS = rec("768Mi")  # adopted and healthy as the fake cluster judges it
THROTTLED = HealthResult(
    checks=[
        CheckResult(name="cpuThrottling", reason=FailureReason.CPU_THROTTLED, value=48.0,
                    bound="<= 25%", passed=False, message="app: CPU throttled 48.0% > 25%"),
        CheckResult(name="memoryHeadroom", reason=FailureReason.MEMORY_HEADROOM_LOW, value=61.0,
                    bound="<= 90%", passed=True, message="memory used 61.0%, within <= 90%"),
    ],
    queries=2,
)  # fmt: skip
UNREACHABLE = ApplicationError(
    "Prometheus at http://prometheus:9090 unreachable",
    type=PROMETHEUS_NOT_CONFIGURED,  # not retried: the test needs no retry budget spent
    non_retryable=True,
)


def policy(on_error: str = "hold") -> PolicySettings:
    checks = HealthChecks.model_validate(
        {"cpuThrottling": {"maxPercent": 25}, "memoryHeadroom": {"maxPercent": 90},
         "onPrometheusError": on_error}
    )  # fmt: skip
    return settings(target=RollbackTarget.MANIFEST, max_attempts=1).model_copy(
        update={"health_checks": checks}
    )


async def test_an_adopted_cut_that_throttles_is_rolled_back_as_cpu_throttled(
    client: Client,  # noqa: F811
    cluster: FakeCluster,  # noqa: F811
    task_queue: str,  # noqa: F811
) -> None:
    ref, owner = new_owner(cluster, policy())
    owner.apply(FITS)
    owner.health = [THROTTLED]
    handle = await observe(client, CLUSTER, task_queue, ref, FITS)
    result = await handle.result()
    assert (result.mode, result.failure_reason) == (
        Mode.FAILED_PERMANENT,
        FailureReason.CPU_THROTTLED,
    )
    rolled = [m for r, m, _ in owner.events.values() if r == EventReason.ROLLING_BACK_STARTED]
    assert len(rolled) == 1 and "5/5 pods adopted and healthy" in rolled[0]
    assert "health check cpuThrottling failed: app: CPU throttled 48.0% > 25%" in rolled[0]
    assert cluster.calls[CHECK_HEALTH] == 1  # one ask at the window's end, not per sample
    state = await handle.query(RollbackWorkflow.status)
    assert state is not None and state.last_health == THROTTLED
    shown = ops.describe_text(CLUSTER, ref, "Completed", state).splitlines()
    assert (
        "Health:       cpuThrottling FAILED: app: CPU throttled 48.0% > 25% (bound <= 25%)"
    ) in shown
    await check_replay(client, rollback_id(CLUSTER, ref), "health-cpu-throttled")


async def test_a_verdict_that_fails_adoption_asks_prometheus_nothing(
    client: Client,  # noqa: F811
    cluster: FakeCluster,  # noqa: F811
    task_queue: str,  # noqa: F811
) -> None:
    ref, owner = new_owner(cluster, policy())
    owner.apply(rec("256Mi"))  # OOMs in the fake cluster
    result = await (await observe(client, CLUSTER, task_queue, ref, rec("256Mi"))).result()
    assert result.failure_reason is FailureReason.OOM_KILLED
    assert CHECK_HEALTH not in cluster.calls


@pytest.mark.parametrize(
    ("on_error", "mode", "reason", "said"),
    [
        ("pass", Mode.MONITORING_SUCCEEDED, None, "onPrometheusError: pass"),
        ("fail", Mode.FAILED_PERMANENT, FailureReason.HEALTH_CHECK_FAILED, "health checks failed"),
    ],
)
async def test_prometheus_unable_to_answer_meets_the_policys_choice(
    client: Client,  # noqa: F811
    cluster: FakeCluster,  # noqa: F811
    task_queue: str,  # noqa: F811
    on_error: str,
    mode: Mode,
    reason: FailureReason | None,
    said: str,
) -> None:
    ref, owner = new_owner(cluster, policy(on_error))
    owner.apply(FITS)
    owner.health = [UNREACHABLE]
    result = await (await observe(client, CLUSTER, task_queue, ref, FITS)).result()
    assert (result.mode, result.failure_reason) == (mode, reason)
    verdict = [m for r, m, _ in owner.events.values() if r != EventReason.MONITORING_STARTED]
    assert any(said in m and "unreachable" in m for m in verdict), verdict


async def test_a_held_verdict_says_so_and_waits_for_prometheus(
    client: Client,  # noqa: F811
    cluster: FakeCluster,  # noqa: F811
    task_queue: str,  # noqa: F811
) -> None:
    ref, owner = new_owner(cluster, policy("hold"))
    owner.apply(FITS)
    owner.health = [UNREACHABLE]
    handle = await observe(client, CLUSTER, task_queue, ref, FITS)

    def held() -> bool:
        return EventReason.HEALTH_UNAVAILABLE in owner.event_reasons()

    deadline = asyncio.get_running_loop().time() + 20
    while not held():
        assert asyncio.get_running_loop().time() < deadline, owner.event_reasons()
        await asyncio.sleep(0.05)
    (message,) = [m for r, m, _ in owner.events.values() if r == EventReason.HEALTH_UNAVAILABLE]
    assert "the verdict waits (onPrometheusError: hold)" in message and "unreachable" in message
    state = await wait_for(handle, lambda s: s.mode is Mode.MONITORING)  # no verdict taken
    assert state.last_health is None
    await handle.signal(RollbackWorkflow.cancel, CancelSignal(reason="test over"))
    assert (await handle.result()).mode is Mode.CANCELLED
