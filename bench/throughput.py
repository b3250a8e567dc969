"""P1: rollback workflows completed per second vs a floor workflow doing the same activities
and timers, batches alternated and repeated, the work of sampled runs asserted equal from their
histories; the ratio of the medians is the engine's overhead. Also Worker Versioning's cost
(pinned and versioned vs unversioned) and SQLite (WAL + synchronous=off vs the default journal)."""

from __future__ import annotations

import asyncio
import random
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.common import WorkerDeploymentVersion
from temporalio.worker import Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from activities.clusters import ClusterGuard
from bench import CLUSTER, actions
from bench.harness import (
    REC,
    RESULT_WAITERS,
    Lines,
    met,
    say,
)
from bench.workloads import WINDOW, FloorWorkflow, InstantCluster
from sim.apiserver import free_port
from sim.devserver import DevServer
from worker.config import TemporalConfig
from worker.runner import activity_methods, build_worker
from worker.versioning import adopt_if_first
from workflows.activity_api import OwnerRef, rollback_id
from workflows.contract import WorkloadKind
from workflows.rollback import RollbackInput, RollbackWorkflow


async def _rate(
    client: Client, queue: str, count: int, start: Callable[[int], Any]
) -> tuple[float, list[Any]]:
    """Workflows completed per second for ``count`` concurrent starts, and their handles."""
    began = time.monotonic()
    handles = await asyncio.gather(*(start(i) for i in range(count)))
    # Waiting on a result is a long poll, and the server caps those per namespace: wait on a few
    # hundred at a time (a finished workflow's result returns at once).
    waiting = asyncio.Semaphore(RESULT_WAITERS)

    async def finished(handle: Any) -> None:
        async with waiting:
            await handle.result()

    await asyncio.gather(*(finished(h) for h in handles))
    return count / (time.monotonic() - began), handles


async def _shapes(handles: list[Any], sample: int = 10) -> list[dict[str, int]]:
    """The history shape of ``sample`` runs picked at random from a batch."""
    picked = random.sample(handles, min(sample, len(handles)))
    return [actions.shape((await h.fetch_history()).events) for h in picked]


def work_of(shape: dict[str, int]) -> tuple[int, int]:
    """The effects of a run: its activities, local or not (the floor runs each as a regular
    one), and its timers."""
    return shape["activities"] + shape["local"], shape["timers"]


async def throughput(
    address: str, sizes: list[int], repeats: int, lines: Lines, label: str = ""
) -> dict[int, float]:
    """Rollback vs floor batches of each size, alternated (floor first, then rollback first, ...)
    and repeated; the work of sampled runs of every batch is read from their histories and must
    be equal; the ratio is of the median rates."""
    client = await TemporalConfig.at(address).connect()
    queue = f"bench-{uuid.uuid4().hex[:6]}"
    ratios: dict[int, float] = {}
    async with Worker(
        client,
        task_queue=queue,
        workflows=[RollbackWorkflow, FloorWorkflow],
        activities=activity_methods(InstantCluster()),
        max_cached_workflows=10_000,
        # As the shipped worker runs workflow code (worker.runner), with the floor's module
        # passed through alike: neither is re-imported per run.
        workflow_runner=SandboxedWorkflowRunner(
            restrictions=SandboxRestrictions.default.with_passthrough_modules("workflows", "bench")
        ),
    ):
        work = work_of(await _finished_shape(client, queue, "shape"))
        for n in sizes:
            run = uuid.uuid4().hex[:6]
            rates: dict[str, list[float]] = {"rollback": [], "floor": []}
            events: dict[str, list[int]] = {"rollback": [], "floor": []}
            # CPU of this process (the worker and the client), per run: where the time goes.
            cpu: dict[str, list[float]] = {"rollback": [], "floor": []}
            for r in range(repeats):
                for kind in ("floor", "rollback") if r % 2 == 0 else ("rollback", "floor"):

                    def start(i: int, kind: str = kind, r: int = r, run: str = run) -> Any:
                        if kind == "floor":
                            return client.start_workflow(
                                FloorWorkflow.run,
                                (*work, WINDOW.total_seconds()),
                                id=f"floor-{run}-{r}-{i}",
                                task_queue=queue,
                            )
                        return _start_rollback(client, queue, f"w{run}-{r}-{i}")

                    cpu_before = time.process_time()
                    rate, handles = await _rate(client, queue, n, start)
                    cpu[kind].append((time.process_time() - cpu_before) / n * 1000)
                    shapes = await _shapes(handles)
                    assert all(work_of(s) == work for s in shapes), (kind, work, shapes)
                    rates[kind].append(rate)
                    events[kind] += [s["events"] for s in shapes]
            ratios[n] = statistics.median(rates["rollback"]) / statistics.median(rates["floor"])
            say(
                lines,
                f"  {label}{n:>5} workflows x {repeats} batches each: rollback"
                f" {statistics.median(rates['rollback']):6.1f}/s, floor"
                f" {statistics.median(rates['floor']):6.1f}/s (medians), ratio {ratios[n]:.2f}x"
                f" (target >= 1.2x{met(ratios[n] >= 1.2)});"
                f" every sampled run {work[0]} activities + {work[1]} timers, history events"
                f" rollback {min(events['rollback'])}-{max(events['rollback'])}, floor"
                f" {min(events['floor'])}-{max(events['floor'])}; worker and client CPU per run"
                f" rollback {statistics.median(cpu['rollback']):.1f} ms, floor"
                f" {statistics.median(cpu['floor']):.1f} ms (medians)",
            )
    return ratios


async def _finished_shape(client: Client, queue: str, name: str) -> dict[str, int]:
    """The history shape of one rollback run, once it has finished."""
    handle = await _start_rollback(client, queue, name)
    await handle.result()
    return actions.shape((await handle.fetch_history()).events)


async def _start_rollback(client: Client, queue: str, name: str) -> Any:
    owner = OwnerRef(namespace="bench", kind=WorkloadKind.DEPLOYMENT, name=name)
    return await client.start_workflow(
        RollbackWorkflow.run,
        RollbackInput(cluster=CLUSTER, owner=owner, recommendation=REC),
        id=rollback_id(CLUSTER, owner),
        task_queue=queue,
    )


async def versioning_cost(address: str, n: int, repeats: int, lines: Lines) -> float:
    """Rollback workflows per second on a pinned, versioned worker vs an unversioned one (same
    server, same activities), batches alternated; the ratio of the medians."""
    client = await TemporalConfig.at(address).connect()
    plain, versioned = f"bench-plain-{uuid.uuid4().hex[:6]}", f"bench-v-{uuid.uuid4().hex[:6]}"
    version = WorkerDeploymentVersion(f"bench-{uuid.uuid4().hex[:6]}", "v1")
    async with (
        build_worker(client, plain, InstantCluster(), ClusterGuard(CLUSTER), 10_000),
        build_worker(client, versioned, InstantCluster(), ClusterGuard(CLUSTER), 10_000, version),
    ):
        assert await adopt_if_first(client, version)
        shapes = {q: await _finished_shape(client, q, f"shape-{q}") for q in (plain, versioned)}
        assert shapes[plain] == shapes[versioned], shapes  # the same work on both
        work = work_of(shapes[plain])
        say(lines, f"  one run on either worker = {work[0]} activities + {work[1]} timers")
        rates: dict[str, list[float]] = {plain: [], versioned: []}
        for r in range(repeats):
            for queue in (plain, versioned) if r % 2 == 0 else (versioned, plain):

                def start(i: int, queue: str = queue, r: int = r) -> Any:
                    return _start_rollback(client, queue, f"{queue}-{r}-{i}")

                rate, handles = await _rate(client, queue, n, start)
                shapes_now = await _shapes(handles)
                assert all(work_of(s) == work for s in shapes_now), (queue, work, shapes_now)
                rates[queue].append(rate)
    ratio = statistics.median(rates[versioned]) / statistics.median(rates[plain])
    say(
        lines,
        f"  {n} workflows x {repeats} batches each, alternated: unversioned"
        f" {statistics.median(rates[plain]):.1f}/s, versioned (pinned)"
        f" {statistics.median(rates[versioned]):.1f}/s (medians), ratio {ratio:.2f}x",
    )
    return ratio


async def sqlite_wal(sizes: list[int], lines: Lines) -> None:
    for pragmas in (True, False):
        with tempfile.TemporaryDirectory() as tmp:
            server = DevServer(Path(tmp), free_port(), headless=True, log_path=Path(tmp) / "log")
            if not pragmas:
                server.command = [
                    c
                    for c in server.command
                    if c not in ("--sqlite-pragma", "journal_mode=wal", "synchronous=off")
                ]
            with server:
                await throughput(
                    server.address,
                    sizes,
                    1,
                    lines,
                    "WAL+sync=off " if pragmas else "default journal ",
                )
