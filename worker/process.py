"""Long-running processes: the worker, the intake (leader-elected), and both in one process.

Each serves until its ``stop`` event is set (SIGTERM/SIGINT in the CLI), then shuts down
gracefully: the intake releases its Lease, the worker finishes running activities.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading

from kubernetes.client import ApiClient, CoreV1Api, CustomObjectsApi
from temporalio.client import Client
from temporalio.common import MetricMeter
from temporalio.service import RPCError

from worker import telemetry
from worker.config import IntakeConfig, WorkerConfig
from worker.intake import Intake
from worker.kube import activities_for
from worker.leader import LeaderElector
from worker.runner import build_worker
from workflows.contract import Mode, SearchAttribute

log = logging.getLogger(__name__)
LEASE_NAME = "rightsizing-rollback-intake"


def stop_on_signals() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


class IntakeService:
    """An ``Intake`` that runs only while its ``LeaderElector`` holds the Lease."""

    def __init__(
        self, temporal: Client, api: ApiClient, config: IntakeConfig, lease_duration: float = 15.0
    ) -> None:
        loop = asyncio.get_running_loop()
        self.intake = Intake(
            CoreV1Api(api),
            CustomObjectsApi(api),
            temporal,
            config.temporal.task_queue,
            loop,
            config.sample_interval,
        )
        self.elector = LeaderElector(
            CustomObjectsApi(api),
            config.lease_namespace,
            LEASE_NAME,
            config.identity,
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
    stop: asyncio.Event,
    worker: WorkerConfig | None = None,
    intake: IntakeConfig | None = None,
) -> None:
    """Run the worker, the intake, or both (``rollbackctl run``) until ``stop`` is set."""
    chosen = worker or intake
    assert chosen is not None, "nothing to serve"
    runtime = chosen.kube.runtime()
    temporal = await chosen.temporal.connect_patiently(runtime)
    service, reporter = None, None
    if intake is not None:
        reporter = asyncio.create_task(report_workloads(temporal, telemetry.meter(runtime)))
        service = IntakeService(temporal, intake.kube.client(runtime), intake).start()
    try:
        if worker is not None:
            activities = activities_for(worker.kube.client(runtime), worker.actuation)
            queue = worker.temporal.task_queue
            async with build_worker(temporal, queue, activities, worker.max_cached_workflows):
                log.info("worker polling task queue %s", queue)
                await stop.wait()
        else:
            await stop.wait()
    finally:
        if reporter is not None:
            reporter.cancel()
        if service is not None:
            await asyncio.to_thread(service.stop)


def run(worker: WorkerConfig | None = None, intake: IntakeConfig | None = None) -> None:
    """Serve until SIGTERM or SIGINT: the entry point of ``rollbackctl worker|intake``."""

    async def main() -> None:
        await serve(stop_on_signals(), worker, intake)

    asyncio.run(main())
