"""Long-running processes: the worker, the intake (leader-elected), and both in one process.

Each serves until its ``stop`` event is set (SIGTERM/SIGINT in the CLI), then shuts down
gracefully: the intake releases its Lease, the worker finishes running activities.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import threading
from datetime import timedelta

from kubernetes.client import ApiClient, CoreV1Api, CustomObjectsApi
from temporalio.client import Client
from temporalio.common import MetricMeter
from temporalio.service import RPCError

from activities.kubernetes import KubernetesActivities
from worker.intake import Intake
from worker.leader import LeaderElector
from worker.runner import MAX_CACHED_WORKFLOWS, build_worker
from workflows.contract import Mode, SearchAttribute

log = logging.getLogger(__name__)
LEASE_NAME = "rightsizing-rollback-intake"


def stop_on_signals() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


def default_identity() -> str:
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


class IntakeService:
    """An ``Intake`` that runs only while its ``LeaderElector`` holds the Lease."""

    def __init__(
        self,
        temporal: Client,
        task_queue: str,
        api: ApiClient,
        lease_namespace: str,
        identity: str,
        sample_interval: timedelta,
        lease_duration: float = 15.0,
    ) -> None:
        loop = asyncio.get_running_loop()
        self.intake = Intake(
            CoreV1Api(api), CustomObjectsApi(api), temporal, task_queue, loop, sample_interval
        )
        self.elector = LeaderElector(
            CustomObjectsApi(api),
            lease_namespace,
            LEASE_NAME,
            identity,
            on_started=self._started,
            on_stopped=self.intake.stop,
            lease_duration=lease_duration,
            renew_deadline=lease_duration * 2 / 3,
            retry_period=max(0.5, lease_duration / 7.5),
        )

    def _started(self) -> None:
        # Start in its own thread: syncing policies must not delay the Lease renewals.
        threading.Thread(target=self.intake.start, name="intake-start", daemon=True).start()

    def start(self) -> IntakeService:
        self.elector.start()
        return self

    def stop(self) -> None:
        self.elector.stop()


async def report_workloads(temporal: Client, meter: MetricMeter, every: float = 30.0) -> None:
    """``rollback_workloads{mode}``: running workflows by the mode of their current run."""
    gauge = meter.create_gauge("rollback_workloads", "running rollback workflows by mode")
    while True:
        for mode in (m for m in Mode if not m.terminal):
            query = f'{SearchAttribute.MODE} = "{mode.value}" AND ExecutionStatus = "Running"'
            try:
                count = (await temporal.count_workflows(query)).count
            except RPCError as exc:
                log.warning("counting workflows in %s failed: %s", mode, exc)
                continue
            gauge.set(count, {"mode": mode.value})
        await asyncio.sleep(every)


async def serve(
    temporal: Client,
    task_queue: str,
    stop: asyncio.Event,
    activities: KubernetesActivities | None = None,
    intake_api: ApiClient | None = None,
    lease_namespace: str = "default",
    identity: str | None = None,
    sample_interval: timedelta = timedelta(seconds=30),
    metric_meter: MetricMeter | None = None,
    max_cached_workflows: int = MAX_CACHED_WORKFLOWS,
) -> None:
    """Run the worker (given activities), the intake (given an API client), or both."""
    service, reporter = None, None
    if intake_api is not None and metric_meter is not None:
        reporter = asyncio.create_task(report_workloads(temporal, metric_meter))
    if intake_api is not None:
        service = IntakeService(
            temporal,
            task_queue,
            intake_api,
            lease_namespace,
            identity or default_identity(),
            sample_interval,
        ).start()
    try:
        if activities is not None:
            async with build_worker(temporal, task_queue, activities, max_cached_workflows):
                log.info("worker polling task queue %s", task_queue)
                await stop.wait()
        else:
            await stop.wait()
    finally:
        if reporter is not None:
            reporter.cancel()
        if service is not None:
            await asyncio.to_thread(service.stop)
