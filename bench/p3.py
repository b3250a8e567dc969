"""P3: N workloads monitored at once by one worker process through the real intake and
activities: every final mode right; worker peak RSS, CPU per workload, samples taken, time from
the last workload created to all done. Then, on the same server, the floor: the same N attempts
as floor workflows (each the activities and timers of its rollback run, read from a history,
over the same window; no-op activities) on a worker process of their own (``bench.floor_worker``),
started at once: time from the last started to all done, and the ratio of the two."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from kubernetes.client import CoreV1Api, CustomObjectsApi
from temporalio.client import Client

from bench import CLUSTER, actions
from bench.harness import (
    OOM,
    READY,
    Lines,
    make_workload,
    met,
    oom,
    p50_p99,
    proc_stats,
    say,
)
from bench.soak import Child
from bench.throughput import work_of
from bench.workloads import FloorWorkflow
from sim.apiserver import KubeEmulator, free_port
from sim.devserver import DevServer
from sim.scenario import WorkerProcess
from worker.config import TemporalConfig
from worker.flags import MAX_CACHED_WORKFLOWS
from worker.intake import Intake
from worker.kube import api_client
from workflows.rollback import WORKFLOW_NAME

WINDOW_SECONDS = 20


async def concurrent(workloads: int, lines: Lines, window: int = WINDOW_SECONDS) -> None:
    with tempfile.TemporaryDirectory() as tmp, KubeEmulator() as api:
        server = DevServer(
            Path(tmp) / "t", free_port(), headless=True, log_path=Path(tmp) / "temporal.log"
        )
        with server:
            queue = "bench-p3"
            worker = WorkerProcess(
                server.address,
                queue,
                api.url,
                "annotations",
                Path(tmp) / "worker.log",
                cluster=CLUSTER,
            )
            worker.start()
            client = await TemporalConfig.at(server.address).connect()
            api.store.create(
                {
                    "apiVersion": "rightsizing.kubex.ai/v1alpha1",
                    "kind": "ClusterRollbackPolicy",
                    "metadata": {"name": "all"},
                    "spec": {
                        "monitoringPeriod": f"{window}s",
                        "rollbackTarget": "manifest",
                        "adoptionThresholdPercent": 100,
                        "backoff": {"timePeriod": "1s", "multiplyByTurn": 1, "maxAttempts": 1},
                    },
                }
            )
            intake = Intake(
                CoreV1Api(api_client(url=api.url)),
                CustomObjectsApi(api_client(url=api.url)),
                client,
                CLUSTER,
                queue,
                asyncio.get_running_loop(),
            )
            await asyncio.to_thread(intake.start)
            adopted_at: dict[str, float] = {}
            for w in range(workloads):
                name, ns = f"w{w}", f"ns{w % 20}"
                make_workload(api, ns, name, 2, OOM if oom(w) else READY)
                adopted_at.setdefault(f"rollback/{CLUSTER}/{ns}/Deployment/{name}", time.time())
                await asyncio.sleep(0)  # the intake signals through this loop: let it
            # Only the rollbacks: NotifyWorkflow children complete too (about two per OOM).
            took, done = await _all_done(client, WORKFLOW_NAME, workloads)
            if done < workloads:
                say(lines, f"  NOT MET: only {done}/{workloads} attempts ended within"
                           f" {took:.0f}s; the figures below are of an unfinished run")  # fmt: skip
            assert worker.process is not None
            rss, cpu = proc_stats(worker.process.pid)
            starts = []
            async for wf in client.list_workflows("WorkflowType = 'RollbackWorkflow'"):
                if wf.id in adopted_at:
                    starts.append(max(0.0, wf.start_time.timestamp() - adopted_at[wf.id]))
            modes = [
                json.loads(
                    (
                        api.store.get(
                            api.store.rtype("Deployment"), wid.split("/")[2], wid.split("/")[4]
                        )["metadata"].get("annotations")
                        or {}
                    ).get("rightsizing.kubex.ai/rollback-state", "{}")
                ).get("mode")
                for wid in adopted_at
            ]
            right = sum(
                m == ("failedPermanent" if oom(w) else "monitoringSucceeded")
                for w, m in enumerate(modes)
            )
            await asyncio.to_thread(intake.stop)
            worker.stop()
            work = {
                failing: work_of(
                    actions.shape((await client.get_workflow_handle(wid).fetch_history()).events)
                )
                for failing, wid in (
                    (oom(w), wid) for w, wid in enumerate(adopted_at) if w in (0, 9)
                )
            }
            floor_took, floor_rss = await _floor(
                client, server.address, tmp, workloads, work, window
            )
            pod_lists = len(api.requests("list", r"/namespaces/[^/]+/pods$"))
            cached = os.environ.get("ROLLBACK_MAX_CACHED_WORKFLOWS", str(MAX_CACHED_WORKFLOWS))
            p50, p99 = p50_p99(starts)
            say(
                lines,
                f"  {workloads} workloads monitored at once ({window}s windows): {right}/{workloads}"
                " reached the right final mode (one in ten OOMs: failedPermanent after its"
                f" rollback; the rest monitoringSucceeded), all done {took:.0f}s after the last"
                f" workload was created (target <= 250 s{met(took <= 250)})",
            )
            say(
                lines,
                f"    worker process (max cached workflows {cached}): peak RSS {rss:.0f} MiB"
                f" (target <= 300 MiB{met(rss <= 300)}), CPU"
                f" {cpu:.1f}s = {cpu / workloads * 1000:.1f} ms per workload; cohort samples taken:"
                f" {pod_lists / workloads:.2f} per workload (one window each; the OOM ones roll"
                " back and end)",
            )
            say(
                lines,
                f"    pod adopted -> workflow started: p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms",
            )
            ratio = took / floor_took
            say(
                lines,
                f"    floor (the same {workloads} attempts as floor workflows, {work[False][0]}"
                f" activities + {work[False][1]} timers each, {work[True][0]} + {work[True][1]} for"
                f" the OOM ones, {window} s windows): all done {floor_took:.0f}s after the last started,"
                f" worker peak RSS {floor_rss:.0f} MiB; the engine {ratio:.2f}x the floor (target"
                f" <= 1.0x{met(ratio <= 1.0)})",
            )


async def _floor(
    client: Client,
    address: str,
    tmp: str,
    workloads: int,
    work: dict[bool, tuple[int, int]],
    window: int,
) -> tuple[float, float]:
    """The floor's run: seconds from the last started to all done, and its worker's peak RSS."""
    queue = "bench-p3-floor"
    floor = Child("floor", [sys.executable, "-m", "bench.floor_worker", address, queue],
                  Path(tmp) / "floor.log")  # fmt: skip
    floor.start()
    starting = asyncio.Semaphore(100)

    async def start(w: int) -> None:
        async with starting:
            await client.start_workflow(
                FloorWorkflow.run,
                (*work[oom(w)], window),
                id=f"floor-{w}",
                task_queue=queue,
            )

    await asyncio.gather(*(start(w) for w in range(workloads)))
    took, done = await _all_done(client, "FloorWorkflow", workloads, floor.sample_rss)
    floor.stop()
    if done < workloads:
        raise RuntimeError(f"the floor finished {done}/{workloads} in {took:.0f}s: {floor.log}")
    return took, floor.peak_rss_mib


async def _all_done(
    client: Client, workflow_type: str, count: int, meanwhile: Callable[[], None] = lambda: None
) -> tuple[float, int]:
    """Seconds until ``count`` runs of ``workflow_type`` have completed (looked at every 2 s,
    one count each time; at most ``max(600, count / 2)``), and how many had."""
    began = time.monotonic()
    finished = f"WorkflowType = '{workflow_type}' AND ExecutionStatus = 'Completed'"
    while (done := (await client.count_workflows(finished)).count) < count:
        meanwhile()
        if time.monotonic() - began > max(600, count * 0.5):
            break
        await asyncio.sleep(2)
    return time.monotonic() - began, done
