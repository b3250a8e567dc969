"""Long-running processes: the worker, the intake (leader-elected), and both in one process.

Each serves until its ``stop`` event is set (SIGTERM/SIGINT in the CLI), then shuts down
gracefully: the intake releases its Lease, the worker finishes running activities.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import Coroutine
from datetime import timedelta
from typing import Any

from kubernetes.client import ApiClient, CoreV1Api, CustomObjectsApi
from temporalio.client import Client
from temporalio.common import MetricMeter
from temporalio.runtime import Runtime
from temporalio.service import RPCError

from activities.clusters import ClusterGuard
from worker import telemetry
from worker.config import (
    INTAKE_AGENT,
    WORKER_AGENT,
    IntakeConfig,
    WorkerConfig,
    package_version,
)
from worker.health import Health
from worker.intake import Intake
from worker.kube import activities_for
from worker.leader import LeaderElector
from worker.runner import build_worker
from worker.versioning import adopt_if_first
from workflows.contract import INTAKE_LEASE, Mode, SearchAttribute
from workflows.rollback import WORKFLOW_NAME

log = logging.getLogger(__name__)
STUCK_AFTER = 120.0  # seconds an informer may fail without a break before the intake is not live
TEMPORAL_CHECK_EVERY = 10.0


def stop_on_signals() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


class IntakeService:
    """An ``Intake`` that runs only while its ``LeaderElector`` holds the Lease: a fresh one per
    leadership term, fenced by the Lease (``LeaderElector.holds``), so a deposed leader's
    threads, whatever they were doing, write and signal nothing more."""

    def __init__(
        self,
        temporal: Client,
        api: ApiClient,
        config: IntakeConfig,
        lease_duration: float = 15.0,
        meter: MetricMeter = MetricMeter.noop,
    ) -> None:
        loop = asyncio.get_running_loop()
        self.elector = LeaderElector(
            CustomObjectsApi(api),
            config.lease_namespace,
            INTAKE_LEASE,
            config.identity,
            on_started=self._started,
            on_stopped=self._stopped,
            lease_duration=lease_duration,
            renew_deadline=lease_duration * 2 / 3,
            retry_period=max(0.5, lease_duration / 7.5),
        )

        def term() -> Intake:
            return Intake(
                CoreV1Api(api),
                CustomObjectsApi(api),
                temporal,
                config.cluster,
                config.temporal.task_queue,
                loop,
                meter,
                fence=self.elector.time_left,
                protection=config.kube.protection,
                prometheus=config.prometheus_url is not None,
                budget=config.temporal_budget,
                engine_namespace=config.kube.engine_namespace,
                storm_breaker=config.storm_breaker,
            )

        self._term = term
        self.intake = term()
        self._leading = meter.create_gauge("rollback_intake_leader", "1 while this intake leads")
        self._leading.set(0)

    def live(self) -> str | None:
        if not self.elector.alive():
            return "leader election stopped"
        if self.elector.leading.is_set():
            return "; ".join(self.intake.informers.problems(STUCK_AFTER)) or None
        return None

    def ready(self) -> str | None:
        if not self.elector.leading.is_set():
            return None  # a standby is ready to take over
        if not self.intake.started.is_set():
            return "starting: syncing policies and pods"
        return "; ".join(self.intake.informers.problems(0)) or None

    def _started(self) -> None:
        self._leading.set(1)
        if not self.intake.informers.fresh:  # this term's own: nothing of the last one carries on
            self.intake = self._term()
        intake = self.intake
        # Start in its own thread: syncing policies must not delay the Lease renewals.
        threading.Thread(target=intake.start, name="intake-start", daemon=True).start()

    def _stopped(self) -> None:
        self._leading.set(0)
        self.intake.stop()

    def start(self) -> IntakeService:
        self.elector.start()
        return self

    def stop(self) -> None:
        self.elector.stop()


async def report_workloads(
    temporal: Client, cluster: str, meter: MetricMeter, every: float = 30.0
) -> None:
    """``rollback_workloads{mode}``: this cluster's running workflows by the mode of their
    current run (the fleet shares the Temporal namespace; each intake counts its own)."""
    gauge = meter.create_gauge("rollback_workloads", "running rollback workflows by mode")
    while True:
        for mode in (m for m in Mode if not m.terminal):
            query = (
                f'WorkflowType = "{WORKFLOW_NAME}" AND {SearchAttribute.CLUSTER} = "{cluster}"'
                f' AND {SearchAttribute.MODE} = "{mode.value}" AND ExecutionStatus = "Running"'
            )
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
    ready: asyncio.Event | None = None,
) -> None:
    """Run the worker, the intake, or both (``rollbackctl run``) until ``stop`` is set;
    ``ready`` is set once the worker polls and the intake (when leading) has synced."""
    chosen = worker or intake
    assert chosen is not None, "nothing to serve"
    telemetry.name_cluster(chosen.cluster)
    runtime = chosen.kube.runtime(chosen.cluster)
    build_info = telemetry.meter(runtime).create_gauge("rollback_build_info", "1, by version")
    for component, config in (("worker", worker), ("intake", intake)):
        if config is not None:
            build_info.set(1, {"version": package_version(), "component": component})
    identity = intake.identity if intake is not None else None
    # The intake's client retries nothing by itself (``worker.intake``: no signal outlives its
    # leader's term); the worker's, beside it, keeps the SDK's retries.
    temporal = await _until_stopped(
        chosen.temporal.connect_patiently(runtime, identity=identity, retries=worker is not None),
        stop,
    )
    if temporal is None:
        return  # stopped while waiting for Temporal
    health = Health()
    if chosen.kube.health_address:
        health.serve(chosen.kube.health_address)
    service: IntakeService | None = None
    background: list[asyncio.Task[Any]] = []
    if intake is not None:
        background.append(
            asyncio.create_task(
                report_workloads(temporal, intake.cluster, telemetry.meter(runtime))
            )
        )
        service = await _start_intake(intake, temporal, runtime, worker is not None, health)
    try:
        if worker is not None:
            await _work(worker, temporal, runtime, health, background, (stop, service, ready))
        else:
            await _serving(stop, service, ready)
    finally:
        for task in background:
            task.cancel()
        if service is not None:
            await asyncio.to_thread(service.stop)
        health.stop()


async def _start_intake(
    intake: IntakeConfig,
    temporal: Client,
    runtime: Runtime | None,
    beside_worker: bool,
    health: Health,
) -> IntakeService:
    """The intake, started, its health reported; beside a worker (whose client retries) on a
    Temporal client of its own that retries nothing."""
    agent = f"{INTAKE_AGENT}/{intake.identity}"
    signaller = temporal
    if beside_worker:
        signaller = await intake.temporal.connect(runtime, intake.identity, retries=False)
    service = IntakeService(
        signaller, intake.kube.client(runtime, agent), intake, meter=telemetry.meter(runtime)
    ).start()
    health.live("intake", service.live)
    health.ready("intake", service.ready)
    return service


async def _work(
    worker: WorkerConfig,
    temporal: Client,
    runtime: Runtime | None,
    health: Health,
    background: list[asyncio.Task[Any]],
    serving: tuple[asyncio.Event, IntakeService | None, asyncio.Event | None],
) -> None:
    """Run the worker until ``serving``'s stop is set (``_serving``)."""
    kube = worker.kube.client(runtime, WORKER_AGENT)
    activities = activities_for(
        kube,
        worker.actuation,
        worker.notifications,
        worker.kube.protection,
        worker.min_ready,
        worker.prometheus_url,
        worker.kube.engine_namespace,
    )
    queue = worker.temporal.task_queue
    guard = ClusterGuard(worker.cluster, CoreV1Api(kube), worker.pod)
    running = build_worker(
        temporal, queue, activities, guard, worker.max_cached_workflows, worker.deployment
    )
    health.live("worker", lambda: None if running.is_running else "worker not running")
    if worker.kube.health_address:  # nobody asks otherwise: no periodic health RPC
        temporal_ok = TemporalHealth(temporal)
        background.append(asyncio.create_task(temporal_ok.watch()))
        health.ready("temporal", temporal_ok.problem)
    async with running:
        log.info("worker of cluster %s polling task queue %s", worker.cluster, queue)
        if worker.deployment is not None:
            background.append(asyncio.create_task(adopt_if_first(temporal, worker.deployment)))
        await _serving(*serving)


async def _serving(
    stop: asyncio.Event, service: IntakeService | None, ready: asyncio.Event | None
) -> None:
    """Until ``stop``; sets ``ready`` once the intake, if any, has started."""
    if ready is not None:
        if service is not None:
            started = service.intake.started
            while not stop.is_set() and not await asyncio.to_thread(started.wait, 0.5):
                pass
        ready.set()
    await stop.wait()


async def _until_stopped(work: Coroutine[Any, Any, Client], stop: asyncio.Event) -> Client | None:
    """``work``'s result, or None when ``stop`` is set first (SIGTERM while Temporal is away)."""
    task, stopping = asyncio.create_task(work), asyncio.create_task(stop.wait())
    await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if not task.done():
        task.cancel()
        return None
    return task.result()


class TemporalHealth:
    """The last answer of Temporal's health check, refreshed in the background."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.last_error: str | None = None

    async def watch(self) -> None:
        while True:
            try:
                ok = await self.client.service_client.check_health(
                    timeout=timedelta(seconds=TEMPORAL_CHECK_EVERY / 2)
                )
                self.last_error = None if ok else "Temporal reports not serving"
            except Exception as exc:  # unreachable, timed out, refused
                self.last_error = f"Temporal unreachable: {exc}"
            await asyncio.sleep(TEMPORAL_CHECK_EVERY)

    def problem(self) -> str | None:
        return self.last_error


def run(worker: WorkerConfig | None = None, intake: IntakeConfig | None = None) -> None:
    """Serve until SIGTERM or SIGINT: the entry point of ``rollbackctl worker|intake``."""

    async def main() -> None:
        await serve(stop_on_signals(), worker, intake)

    asyncio.run(main())
