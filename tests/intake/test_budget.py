"""The Temporal budget: the intake's sends paced (``worker.intake.budget``), and a Temporal that
answers ResourceExhausted, on the real dev server, through the real client over HTTP."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from collections.abc import AsyncIterator
from datetime import datetime

import pytest
from kubernetes.client import CoreV1Api, CustomObjectsApi
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.testing import WorkflowEnvironment

from sim.apiserver import KubeEmulator
from sim.devserver import search_attribute_args, temporal_binary
from tests import CLUSTER
from tests.activity.builders import NS, controlled_by, owner, pod, policy
from tests.intake.test_intake import REC, eventually
from tests.workflow.helpers import terminate_running
from worker.config import TemporalConfig
from worker.intake import Intake
from worker.intake.budget import ATTEMPT_ACTIONS, Budget
from worker.kube import api_client
from workflows.activity_api import OwnerRef, rollback_id
from workflows.contract import WorkloadKind
from workflows.policy_status import WAITING, PolicyStatus


async def test_the_pacer_spaces_sends_by_their_cost_and_never_bursts() -> None:
    now = [100.0]

    async def sleep(seconds: float) -> None:
        now[0] += seconds

    budget = Budget(10.0, clock=lambda: now[0], sleep=sleep)
    # Five sightings in a row: each goes five actions (half a second at 10 a second) after the last.
    went = []
    for _ in range(5):
        await budget.spend(ATTEMPT_ACTIONS)
        went.append(now[0])
    assert went == [100.0, 100.5, 101.0, 101.5, 102.0]
    # A send that must not wait (a cancel) goes now and pushes the next sighting later.
    budget.charge(1)
    assert await budget.spend(ATTEMPT_ACTIONS) == pytest.approx(0.6)
    # Idle time earns no burst: after a long pause the next send goes now, the one after paced.
    now[0] = 1000.0
    assert await budget.spend(ATTEMPT_ACTIONS) == 0.0
    assert await budget.spend(ATTEMPT_ACTIONS) == 0.5
    assert await Budget(None).spend(ATTEMPT_ACTIONS) == 0.0  # no budget: nothing waits
    with pytest.raises(ValueError, match="positive rate"):
        Budget(0)


async def test_concurrent_sends_take_turns_in_real_time() -> None:
    """Many sends asking at once on the real loop and clock: each goes its cost after the one
    before it went, however late the one before woke."""
    budget = Budget(100.0)  # 5 actions: 50 ms apart
    went: list[float] = []

    async def send() -> None:
        await budget.spend(ATTEMPT_ACTIONS)
        went.append(time.monotonic())

    await asyncio.gather(*(send() for _ in range(8)))
    gaps = [b - a for a, b in itertools.pairwise(went)]
    assert min(gaps) >= 0.05 - 0.002, gaps  # the clock's resolution, no more


def adopters(api: KubeEmulator, count: int) -> list[OwnerRef]:
    """``count`` StatefulSets, each with a pod that adopted ``REC``."""
    refs = []
    for i in range(count):
        name = f"web-{i:02d}"
        sts = api.store.create(owner("StatefulSet", name=name, replicas=1))
        api.store.create(
            pod(f"{name}-0", {"app": name}, memory="512Mi", rec=REC, owner_ref=controlled_by(sts))
        )
        refs.append(OwnerRef(namespace=NS, kind=WorkloadKind.STATEFUL_SET, name=name))
    return refs


def intake(api: KubeEmulator, client: Client, queue: str, budget: float | None) -> Intake:
    kube = api_client(url=api.url)
    loop = asyncio.get_running_loop()
    return Intake(
        CoreV1Api(kube), CustomObjectsApi(kube), client, CLUSTER, queue, loop, budget=budget
    )


async def start_times(client: Client, refs: list[OwnerRef]) -> list[datetime]:
    times = []
    for ref in refs:
        handle = client.get_workflow_handle(rollback_id(CLUSTER, ref))
        first = (await handle.fetch_history()).events[0]
        times.append(first.event_time.ToDatetime())
    return sorted(times)


@pytest.fixture
async def api() -> AsyncIterator[KubeEmulator]:
    with KubeEmulator() as emulator:
        emulator.store.create(policy(monitoringPeriod="1h"))
        yield emulator


async def test_a_budget_paces_the_starts_a_wave_asks_for(
    api: KubeEmulator, temporal_env: WorkflowEnvironment
) -> None:
    """10 actions a second: a start (charged an attempt's 5) every half second, never a burst,
    and the policy's status says how many wait meanwhile."""
    queue = f"budget-{uuid.uuid4().hex[:6]}"
    paced = intake(api, temporal_env.client, queue, budget=10.0)
    refs = adopters(api, 8)
    seen_waiting: list[str] = []

    def waiting_said() -> bool:
        stored = api.store.get(api.store.rtype("RollbackPolicy"), NS, "p") or {}
        condition = PolicyStatus.read(stored.get("status")).condition(WAITING)
        if condition is not None and condition.status == "True":
            seen_waiting.append(condition.message)
        return condition is not None and condition.status == "False" and bool(seen_waiting)

    try:
        await asyncio.to_thread(paced.start)
        await eventually(lambda: paced.stats["delivered"] == len(refs), timeout=30)
        times = await start_times(temporal_env.client, refs)
        await eventually(waiting_said, timeout=15)  # the status catches up once all went out
    finally:
        await asyncio.to_thread(paced.stop)
        await terminate_running(temporal_env.client, queue)
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(times)]
    # Half a second apart as the intake sent them; the server's clock may see two of them
    # closer by the jitter of two RPCs, never the burst an unpaced wave is (all within ~0.1 s).
    assert (times[-1] - times[0]).total_seconds() >= 0.5 * (len(refs) - 1) - 0.2, gaps
    assert min(gaps) >= 0.3, gaps
    assert (
        "adoption(s) wait for their turn under the engine's Temporal budget (10 actions/s)"
        in (seen_waiting[0])
    ), seen_waiting


async def test_resource_exhausted_is_retried_and_no_adoption_is_lost(
    api: KubeEmulator, caplog: pytest.LogCaptureFixture
) -> None:
    """A Temporal that allows 10 requests a second in the namespace (its frontend's rate limit,
    as Temporal Cloud answers more than a namespace's actions per second): the intake's client
    tries each call once, ResourceExhausted comes back, the intake retries with backoff, and
    every run starts."""
    limited = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(),
        dev_server_extra_args=[
            *search_attribute_args(),
            "--dynamic-config-value", "frontend.namespaceRPS=10",
            "--dynamic-config-value", "frontend.namespaceBurstRatio=1",
            "--log-level", "error",
        ],
    )  # fmt: skip
    try:
        queue = f"exhausted-{uuid.uuid4().hex[:6]}"
        address = limited.client.service_client.config.target_host
        # The intake's own client: it tries each call once (``TemporalConfig.connect``).
        once = await TemporalConfig.at(address, queue, CLUSTER).connect(retries=False)
        eager = intake(api, once, queue, budget=None)
        refs = adopters(api, 30)
        with caplog.at_level(logging.WARNING, logger="worker.intake.sightings"):
            try:
                await asyncio.to_thread(eager.start)
                await eventually(lambda: eager.stats["delivered"] == len(refs), timeout=60)
            finally:
                await asyncio.to_thread(eager.stop)
        assert eager.stats["signal_retries"] > 0
        assert "namespace rate limit exceeded" in caplog.text, caplog.text
        for ref in refs:  # every adoption's run started, none lost to the throttling
            handle = limited.client.get_workflow_handle(rollback_id(CLUSTER, ref))
            assert (await handle.describe()).status is WorkflowExecutionStatus.RUNNING, ref
    finally:
        await limited.shutdown()
