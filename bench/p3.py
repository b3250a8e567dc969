"""P3: N workloads monitored at once by one worker process through the real intake and
activities: every final mode right; worker peak RSS, CPU per workload, samples taken, time from
the last workload created to all done."""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from kubernetes.client import CoreV1Api, CustomObjectsApi

from bench import CLUSTER
from bench.harness import (
    OOM,
    READY,
    Lines,
    make_workload,
    met,
    oom,
    proc_stats,
    say,
)
from sim.apiserver import KubeEmulator
from sim.devserver import DevServer
from sim.scenario import WorkerProcess, free_port
from worker.config import TemporalConfig
from worker.intake import Intake
from worker.kube import api_client
from worker.runner import MAX_CACHED_WORKFLOWS
from workflows.rollback import WORKFLOW_NAME


async def concurrent(workloads: int, lines: Lines) -> None:
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
                        "monitoringPeriod": "20s",
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
            began = time.monotonic()
            done: dict[str, Any] = {}
            # Only the rollbacks: NotifyWorkflow children complete too (about two per OOM).
            finished = f"WorkflowType = '{WORKFLOW_NAME}' AND ExecutionStatus = 'Completed'"
            while len(done) < workloads and time.monotonic() - began < max(600, workloads * 0.5):
                async for wf in client.list_workflows(finished):
                    done[wf.id] = wf
                await asyncio.sleep(2)
            took = time.monotonic() - began
            if len(done) < workloads:
                say(lines, f"  NOT MET: only {len(done)}/{workloads} attempts ended within"
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
            pod_lists = len(api.requests("list", r"/namespaces/[^/]+/pods$"))
            cached = os.environ.get("ROLLBACK_MAX_CACHED_WORKFLOWS", str(MAX_CACHED_WORKFLOWS))
            starts.sort()
            p50 = statistics.median(starts) if starts else float("nan")
            p99 = starts[min(len(starts) - 1, int(len(starts) * 0.99))] if starts else float("nan")
            say(
                lines,
                f"  {workloads} workloads monitored at once (20s windows): {right}/{workloads}"
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
