"""The verdict's health checks on the real Temporal server (the cluster and Prometheus side is
``FakeCluster``: our own activity boundary): adopted but unhealthy rolls back with the check's
failure reason; Prometheus unable to answer meets the policy's onPrometheusError; a hold ends
when Prometheus answers or at maxHold, in one Event whose count rises; a worker without a
Prometheus holds nothing; a reopened window's baseline is before the cut."""

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
from workflows.rollback import CancelSignal, ReopenSignal, RollbackWorkflow

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
# Prometheus failed for good (what its retries end in; not retried here: the test needs no
# retry budget spent).
UNREACHABLE = ApplicationError(
    "Prometheus at http://prometheus:9090 unreachable", type="PrometheusError", non_retryable=True
)
NOT_CONFIGURED = ApplicationError(  # what the worker's activity raises without a URL
    "the policy has health checks and this worker no Prometheus to ask",
    type=PROMETHEUS_NOT_CONFIGURED,
    non_retryable=True,
)
PASSING = HealthResult(
    checks=[CheckResult(name="cpuThrottling", reason=FailureReason.CPU_THROTTLED, value=3.0,
                        bound="<= 25%", passed=True, message="CPU throttled 3.0%, within <= 25%")],
    queries=1,
)  # fmt: skip


def policy(on_error: str = "hold", max_hold: str = "10m") -> PolicySettings:
    checks = HealthChecks.model_validate(
        {"cpuThrottling": {"maxPercent": 25}, "memoryHeadroom": {"maxPercent": 90},
         "onPrometheusError": on_error, "maxHold": max_hold}
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


async def test_a_held_verdict_is_decided_once_prometheus_answers(
    client: Client,  # noqa: F811
    cluster: FakeCluster,  # noqa: F811
    task_queue: str,  # noqa: F811
) -> None:
    ref, owner = new_owner(cluster, policy("hold"))
    owner.apply(FITS)
    owner.health = [UNREACHABLE, THROTTLED]  # down at the window's end, back a look later
    result = await (await observe(client, CLUSTER, task_queue, ref, FITS)).result()
    assert (result.mode, result.failure_reason) == (
        Mode.FAILED_PERMANENT,
        FailureReason.CPU_THROTTLED,
    )
    assert [kind for kind, _ in owner.journal if kind == "health"] == ["health", "health"]
    held = [m for r, m, _ in owner.events.values() if r == EventReason.HEALTH_UNAVAILABLE]
    assert len(held) == 1 and "asks again in 2s" in held[0], held  # the window's length
    await check_replay(client, rollback_id(CLUSTER, ref), "health-held-then-decided")


async def test_a_hold_ends_at_max_hold_on_adoption_alone_in_one_event_series(
    client: Client,  # noqa: F811
    cluster: FakeCluster,  # noqa: F811
    task_queue: str,  # noqa: F811
) -> None:
    ref, owner = new_owner(cluster, policy("hold", max_hold="3s"))
    owner.apply(FITS)
    owner.health = [UNREACHABLE]  # never answers
    handle = await observe(client, CLUSTER, task_queue, ref, FITS)
    result = await handle.result()
    assert result.mode is Mode.MONITORING_SUCCEEDED
    state = await handle.query(RollbackWorkflow.status)
    assert state is not None
    (line,) = [
        x
        for x in ops.describe_text(CLUSTER, ref, "Completed", state).splitlines()
        if x.startswith("Health:")
    ]
    assert line.startswith("Health:       not judged: ") and "unreachable" in line, line
    assert line.endswith("; held 3s (maxHold): decided on adoption alone"), line
    (succeeded,) = [m for r, m, _ in owner.events.values() if r == EventReason.MONITORING_SUCCEEDED]
    assert "held 3s (maxHold): decided on adoption alone" in succeeded, succeeded
    held = [i for i, (r, _, _) in owner.events.items() if r == EventReason.HEALTH_UNAVAILABLE]
    assert len(held) == 1, held  # one Event, its count the looks
    assert owner.event_counts[held[0]] >= 2
    assert "until" in owner.events[held[0]][1] and "maxHold 3s" in owner.events[held[0]][1]
    await check_replay(client, rollback_id(CLUSTER, ref), "health-hold-bounded")


@pytest.mark.parametrize(
    ("on_error", "mode"),
    [("hold", Mode.MONITORING_SUCCEEDED), ("fail", Mode.FAILED_PERMANENT)],
)
async def test_a_worker_without_prometheus_decides_at_once_by_the_stated_rule(
    client: Client,  # noqa: F811
    cluster: FakeCluster,  # noqa: F811
    task_queue: str,  # noqa: F811
    on_error: str,
    mode: Mode,
) -> None:
    ref, owner = new_owner(cluster, policy(on_error))
    owner.apply(FITS)
    owner.health = [NOT_CONFIGURED]
    result = await (await observe(client, CLUSTER, task_queue, ref, FITS)).result()
    assert result.mode is mode
    assert EventReason.HEALTH_UNAVAILABLE not in owner.event_reasons()  # nothing held
    said = [m for r, m, _ in owner.events.values() if r != EventReason.MONITORING_STARTED]
    rule = (
        "no hold without a Prometheus to ask: decided on adoption alone"
        if on_error == "hold"
        else "health checks failed"
    )
    assert any(rule in m and "no Prometheus to ask" in m for m in said), said


async def test_a_reopened_windows_baseline_is_before_the_cut(
    client: Client,  # noqa: F811
    cluster: FakeCluster,  # noqa: F811
    task_queue: str,  # noqa: F811
) -> None:
    ref, owner = new_owner(cluster, policy())
    owner.apply(FITS)
    owner.health = [PASSING]
    handle = await observe(client, CLUSTER, task_queue, ref, FITS)
    first = await wait_for(handle, lambda s: s.mode is Mode.MONITORING and s.baseline is not None)
    await handle.signal(RollbackWorkflow.reopen, ReopenSignal())
    assert (await handle.result()).mode is Mode.MONITORING_SUCCEEDED
    (asked,) = owner.health_asked
    assert first.window_started_at is not None
    assert asked.window_started_at > first.window_started_at  # the reopened window's
    assert asked.baseline_at == first.window_started_at  # before the cut, not under it


async def test_a_check_that_cannot_apply_passes_and_says_so(
    client: Client,  # noqa: F811
    cluster: FakeCluster,  # noqa: F811
    task_queue: str,  # noqa: F811
) -> None:
    ref, owner = new_owner(cluster, policy())
    owner.apply(FITS)
    why = "cpuThrottling: not applicable: no container has a CPU limit"
    owner.health = [
        HealthResult(checks=[CheckResult(name="cpuThrottling", reason=FailureReason.CPU_THROTTLED,
                                         passed=True, applicable=False, message=why)])
    ]  # fmt: skip
    handle = await observe(client, CLUSTER, task_queue, ref, FITS)
    assert (await handle.result()).mode is Mode.MONITORING_SUCCEEDED
    (succeeded,) = [m for r, m, _ in owner.events.values() if r == EventReason.MONITORING_SUCCEEDED]
    assert f"health checks passed: {why}" in succeeded
    state = await handle.query(RollbackWorkflow.status)
    assert state is not None
    assert f"Health:       {why}" in ops.describe_text(CLUSTER, ref, "Completed", state)
