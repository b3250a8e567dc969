"""Fleet: N simulated clusters with M workloads each on one Temporal, against one cluster alone.

Each cluster is what production runs: its own API server (the emulator), its worker (a process,
``--cluster cN``) and its intake (in this process), all sharing one dev server; every cluster has
the same workload names (``ns<k>/Deployment/w<i>``), one in ten OOMing. The single-cluster run
comes first, on the same server, with the same M: the baseline. Printed: attempts per second per
cluster and in total, against the baseline; every final mode checked in every cluster; what an
attempt costs the server (history events and billable actions, from a sample of histories), and
from it what a 50-cluster fleet costs at a stated change rate.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from kubernetes.client import CoreV1Api, CustomObjectsApi
from temporalio.client import Client

from bench import actions
from bench.harness import OOM, READY, Lines, make_workload, oom, say
from sim.apiserver import KubeEmulator, free_port
from sim.devserver import DevServer
from sim.scenario import WorkerProcess
from worker.config import TemporalConfig
from worker.intake import Intake
from worker.kube import api_client
from workflows.activity_api import OwnerRef, rollback_id
from workflows.contract import ROLLBACK_STATE_ANNOTATION, WorkloadKind, task_queue_for
from workflows.rollback import WORKFLOW_NAME

WINDOW = "5s"  # short: the rate is bound by the engine and the server, not by the window
NAMESPACES = 10
# The change rate the 50-cluster estimate assumes (written next to the figure).
FLEET_CLUSTERS = 50
WORKLOADS_PER_CLUSTER = 2_000
RESIZES_PER_WORKLOAD_PER_DAY = 1
OOM_SHARE = 0.1


@dataclass
class Outcome:
    cluster: str
    workloads: int
    seconds: float  # from the first workload created to the last attempt done
    right: int  # workloads in the right final mode

    @property
    def rate(self) -> float:
        return self.workloads / self.seconds if self.seconds else 0.0


def _refs(workloads: int) -> list[OwnerRef]:
    return [
        OwnerRef(namespace=f"ns{w % NAMESPACES}", kind=WorkloadKind.DEPLOYMENT, name=f"w{w}")
        for w in range(workloads)
    ]


async def _cluster(
    client: Client, address: str, name: str, workloads: int, workdir: Path
) -> Outcome:
    """One cluster's run: its emulator, worker process and intake; M workloads adopt; until
    every attempt of this cluster has ended (the rollback workflows only, by its cluster)."""
    with KubeEmulator() as api:
        queue = task_queue_for(name)
        worker = WorkerProcess(
            address, queue, api.url, "annotations", workdir / f"worker-{name}.log", cluster=name
        )
        worker.start()
        api.store.create(
            {
                "apiVersion": "rightsizing.kubex.ai/v1alpha1",
                "kind": "ClusterRollbackPolicy",
                "metadata": {"name": "all"},
                "spec": {
                    "monitoringPeriod": WINDOW,
                    "rollbackTarget": "manifest",
                    "adoptionThresholdPercent": 100,
                    "backoff": {"timePeriod": "1s", "multiplyByTurn": 1, "maxAttempts": 1},
                },
            }
        )
        kube = api_client(url=api.url)
        intake = Intake(
            CoreV1Api(kube), CustomObjectsApi(kube), client, name, queue, asyncio.get_running_loop()
        )
        await asyncio.to_thread(intake.start)
        try:
            began = time.monotonic()
            for w, ref in enumerate(_refs(workloads)):
                make_workload(api, ref.namespace, ref.name, 2, OOM if oom(w) else READY)
                await asyncio.sleep(0)  # the intake signals through this loop: let it
            done: set[str] = set()
            mine = (
                f"WorkflowType = '{WORKFLOW_NAME}' AND RollbackCluster = '{name}'"
                " AND ExecutionStatus = 'Completed'"
            )
            while len(done) < workloads and time.monotonic() - began < max(600, workloads):
                done |= {wf.id async for wf in client.list_workflows(mine)}
                await asyncio.sleep(1)
            took = time.monotonic() - began
            right = 0
            for w, ref in enumerate(_refs(workloads)):
                owner = api.store.get(api.store.rtype("Deployment"), ref.namespace, ref.name)
                raw = (owner["metadata"].get("annotations") or {}).get(ROLLBACK_STATE_ANNOTATION)
                mode = json.loads(raw)["mode"] if raw else None
                right += mode == ("failedPermanent" if oom(w) else "monitoringSucceeded")
            return Outcome(name, workloads, took, right)
        finally:
            await asyncio.to_thread(intake.stop)
            worker.stop()


async def _cost(client: Client, cluster: str, workloads: int) -> tuple[dict[str, float], float]:
    """Events and billable actions of a successful attempt and of an OOM one (medians over a
    sample of this run's histories), and the OOM share's weighted actions per attempt."""
    shapes: dict[bool, list[dict[str, int]]] = {True: [], False: []}
    for w, ref in enumerate(_refs(min(workloads, 40))):
        history = await client.get_workflow_handle(rollback_id(cluster, ref)).fetch_history()
        shapes[oom(w)].append(actions.shape(history.events))
    ok = {k: statistics.median(s[k] for s in shapes[False]) for k in ("events", "actions")}
    bad = {k: statistics.median(s[k] for s in shapes[True]) for k in ("events", "actions")}
    weighted = (1 - OOM_SHARE) * ok["actions"] + OOM_SHARE * bad["actions"]
    figures = {
        "ok_events": ok["events"],
        "ok_actions": ok["actions"],
        "oom_events": bad["events"],
        "oom_actions": bad["actions"],
    }
    return figures, weighted


async def fleet(clusters: int, workloads: int, lines: Lines) -> None:
    load = os.getloadavg()[0]
    say(lines, f"  (load average at the start: {load:.2f}; run alone on the machine: the"
               " engines and the server share its cores)")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        server = DevServer(
            workdir / "t", free_port(), headless=True, log_path=workdir / "temporal.log"
        )
        with server:
            client = await TemporalConfig.at(server.address).connect()
            alone = await _cluster(client, server.address, "alone", workloads, workdir)
            names = [f"c{i}" for i in range(clusters)]
            outcomes = await asyncio.gather(
                *(_cluster(client, server.address, n, workloads, workdir) for n in names)
            )
            figures, weighted = await _cost(client, names[0], workloads)
    say(lines, f"  one cluster alone: {workloads} workloads, {alone.rate:.1f} attempts/s"
               f" ({alone.seconds:.0f}s; {alone.right}/{workloads} right final modes)")  # fmt: skip
    for o in outcomes:
        say(lines, f"    {o.cluster}: {o.rate:.1f} attempts/s ({o.rate / alone.rate:.2f}x alone),"
                   f" {o.right}/{o.workloads} right final modes")  # fmt: skip
    total = sum(o.rate for o in outcomes)
    wrong = sum(o.workloads - o.right for o in outcomes) + (alone.workloads - alone.right)
    say(lines, f"  {clusters} clusters on one Temporal, the same workload names in each:"
               f" {total:.1f} attempts/s in total ({total / alone.rate:.2f}x one cluster alone),"
               f" {wrong} workloads in a wrong final mode")  # fmt: skip
    say(lines, f"  an attempt costs the server {figures['ok_events']:.0f} history events and"
               f" {figures['ok_actions']:.0f} billable actions when it succeeds,"
               f" {figures['oom_events']:.0f} and {figures['oom_actions']:.0f} when it OOMs and"
               " rolls back (medians of this run's histories)")  # fmt: skip
    per_day = FLEET_CLUSTERS * WORKLOADS_PER_CLUSTER * RESIZES_PER_WORKLOAD_PER_DAY
    per_second = per_day / 86_400
    say(lines, f"  a {FLEET_CLUSTERS}-cluster fleet, assuming {WORKLOADS_PER_CLUSTER} workloads"
               f" per cluster each resized {RESIZES_PER_WORKLOAD_PER_DAY}x a day and"
               f" {OOM_SHARE:.0%} of attempts rolled back: {per_day:,} attempts a day,"
               f" {per_second:.2f} attempts/s on average ({per_second / total:.3f} of what this"
               f" 2-core dev server sustained here), {per_day / 24 * weighted:,.0f} billable"
               f" actions an hour ({weighted:.1f} per attempt)")  # fmt: skip
