"""P5: Kubex's scale on one intake and one worker, inside a Temporal budget.

The anchor is Kubex's nightly run against 25,010 workloads on 1,000 simulated nodes (about 35,000
pods). Here: N owners of mixed kinds (Deployments through their ReplicaSets, StatefulSets owning
their pods), M pods spread over K nodes, on the emulator; the intake as its own process
(``rollbackctl intake --temporal-budget B``) and the worker as its own, against one dev server.

1. **Sync**: the intake's time to ready (its informers' LISTs, in pages) with every owner and
   pod there, its RSS then and its CPU.
2. **A wave**: every pod adopts its recommendation at once (one in ten owners' pods OOMKilled,
   which roll back and end ``failedPermanent``; the rest ``monitoringSucceeded``); the time from
   the last adoption to all done, every final mode checked, the worker's and the intake's peak
   RSS, and the billable actions per second Temporal saw, from every history's timestamps
   (``bench.actions``' rules): the budget must hold in every second.
3. **The floor** (``floor=True``): the same attempts as floor workflows on the same server
   (``bench.p3``'s), started at once: what this dev server sustains, for the ratio.

``python -m bench --only p5`` (not in the default run: about an hour alone on 2 cores).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from temporalio.client import Client

from bench import CLUSTER, actions
from bench.burst import _get
from bench.harness import OOM, READY, Lines, make_workload, met, policy_doc, proc_stats, say
from bench.memory import memory_mib
from bench.p3 import _all_done, _floor
from bench.throughput import work_of
from sim.apiserver import KubeEmulator, free_port
from sim.devserver import DevServer
from sim.scenario import WorkerProcess
from worker.config import TemporalConfig
from workflows.contract import ROLLBACK_STATE_ANNOTATION, Obj
from workflows.rollback import WORKFLOW_NAME

WINDOW = 20  # seconds
NAMESPACES = 250
RSS_TARGET = 512  # MiB, the intake's and the worker's each


def _kind(index: int) -> str:
    """Owner ``index``'s kind: a third StatefulSets, the rest Deployments."""
    return "StatefulSet" if index % 3 == 0 else "Deployment"


def _owner(api: KubeEmulator, index: int, pods: int, nodes: int) -> list[Obj]:
    """Owner ``index`` (a third StatefulSets, the rest Deployments) and its ``pods`` pods, not
    yet adopted, on nodes round-robin; one in ten OOMKilled."""
    return make_workload(
        api,
        f"ns{index % NAMESPACES}",
        f"w{index}",
        pods,
        OOM if index % 10 == 9 else READY,
        adopted=False,
        kind=_kind(index),
        node=lambda p: f"node-{(index + p) % nodes}",
    )


def _intake(api: KubeEmulator, address: str, queue: str, budget: int, tmp: str) -> tuple[Any, int]:
    health = free_port()
    log = (Path(tmp) / "intake.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "cli", "intake", "--cluster", CLUSTER, "--kube-url", api.url,
         "--address", address, "--task-queue", queue, "--lease-namespace", "default",
         "--health-address", f"127.0.0.1:{health}", "--temporal-budget", str(budget)],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    return process, health


async def _actions_per_second(client: Client) -> tuple[Counter[int], int]:
    """Billable actions by the second they happened in, over every run of the rollback and
    notification workflows (each history read once, 32 at a time), and the runs read."""
    per_second: Counter[int] = Counter()
    reading = asyncio.Semaphore(32)
    runs = [wf async for wf in client.list_workflows("")]

    async def one(wf: Any) -> None:
        async with reading:
            history = await client.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history()
        for event, counted in actions.billable(history.events):
            if counted:
                per_second[int(event.event_time.ToDatetime().timestamp())] += counted

    await asyncio.gather(*(one(wf) for wf in runs))
    return per_second, len(runs)


async def p5(
    owners: int, pods: int, nodes: int, budget: int, lines: Lines, floor: bool = True
) -> dict[bool, tuple[int, int]]:
    """The run above; returns the work of one successful and one OOM attempt (activities,
    timers), read from their histories, keyed by whether it OOMed."""
    assert pods >= owners, "at least a pod per owner"
    doubles = pods - owners  # owners with two pods; the rest one
    with tempfile.TemporaryDirectory() as tmp, KubeEmulator() as api:
        api.store.create(policy_doc("all", f"{WINDOW}s"))
        for n in range(nodes):
            api.store.create(
                {"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"node-{n}"},
                 "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110"}}}
            )  # fmt: skip
        began = time.monotonic()
        made = {i: _owner(api, i, 2 if i < doubles else 1, nodes) for i in range(owners)}
        say(lines, f"  P5: {owners} owners (a third StatefulSets, the rest Deployments with"
                   f" their ReplicaSets), {pods} pods on {nodes} nodes, in {NAMESPACES}"
                   f" namespaces; built in {time.monotonic() - began:.0f}s")  # fmt: skip
        with DevServer(Path(tmp) / "t", free_port(), headless=True,
                       log_path=Path(tmp) / "temporal.log") as server:  # fmt: skip
            queue = "bench-p5"
            intake, health = _intake(api, server.address, queue, budget, tmp)
            worker = WorkerProcess(server.address, queue, api.url, "annotations",
                                   Path(tmp) / "worker.log", cluster=CLUSTER)  # fmt: skip
            try:
                started = time.monotonic()
                while _get(f"http://127.0.0.1:{health}/readyz") != 200:
                    assert intake.poll() is None, (Path(tmp) / "intake.log").read_text()[-2000:]
                    await asyncio.sleep(0.2)
                synced = time.monotonic() - started
                synced_rss, synced_cpu = memory_mib(intake.pid), proc_stats(intake.pid)[1]
                say(lines, f"    intake synced in {synced:.0f}s (CPU {synced_cpu:.0f}s): RSS"
                           f" {synced_rss:.0f} MiB with every owner and pod cached (target <="
                           f" {RSS_TARGET} MiB{met(synced_rss <= RSS_TARGET)})")  # fmt: skip
                worker.start()
                assert worker.process is not None
                client = await TemporalConfig.at(server.address).connect()
                wave = time.monotonic()
                for owned in made.values():
                    for pod in owned:
                        meta = pod["metadata"]
                        api.store.patch(api.store.rtype("Pod"), meta["namespace"], meta["name"],
                                        {"spec": {"containers": [{"name": "app", "resources": {
                                            "requests": {"memory": "512Mi"}}}]}},
                                        "application/strategic-merge-patch+json")  # fmt: skip
                    await asyncio.sleep(0)
                adopting = time.monotonic() - wave
                took, done = await _all_done(client, WORKFLOW_NAME, owners)
                worker_rss, worker_cpu = proc_stats(worker.process.pid)
                intake_rss, intake_cpu = proc_stats(intake.pid)
            finally:
                intake.terminate()
                intake.wait(10)
                worker.stop()
            modes = Counter(
                json.loads((api.store.get(api.store.rtype(_kind(i)), f"ns{i % NAMESPACES}",
                            f"w{i}")["metadata"]
                            .get("annotations") or {}).get(ROLLBACK_STATE_ANNOTATION, "{}"))
                .get("mode") == ("failedPermanent" if i % 10 == 9 else "monitoringSucceeded")
                for i in range(owners)
            )  # fmt: skip
            say(lines, f"    a wave of {owners} adoptions ({pods} pods patched in"
                       f" {adopting:.0f}s): {done}/{owners} attempts ended, {modes[True]}/{owners}"
                       f" in the right final mode (one in ten OOMs: failedPermanent after its"
                       f" rollback), all done {took:.0f}s after the last adoption"
                       f"{met(modes[True] == owners)}")  # fmt: skip
            say(lines, f"    worker: peak RSS {worker_rss:.0f} MiB (target <= {RSS_TARGET}"
                       f" MiB{met(worker_rss <= RSS_TARGET)}), CPU {worker_cpu:.0f}s ="
                       f" {worker_cpu / owners * 1000:.1f} ms per attempt; intake: peak RSS"
                       f" {intake_rss:.0f} MiB (target <= {RSS_TARGET}"
                       f" MiB{met(intake_rss <= RSS_TARGET)}), CPU {intake_cpu:.0f}s")  # fmt: skip
            per_second, runs = await _actions_per_second(client)
            busiest = max(per_second.values(), default=0)
            seconds = max(per_second) - min(per_second) + 1 if per_second else 1
            over = sum(1 for n in per_second.values() if n > budget)
            say(lines, f"    billable actions Temporal saw ({runs} runs' histories): mean"
                       f" {sum(per_second.values()) / seconds:.0f}/s over {seconds}s, busiest"
                       f" second {busiest}; seconds above the budget of {budget}/s: {over}"
                       f" (target 0{met(over == 0)})")  # fmt: skip
            work = {
                failing: work_of(actions.shape((await client.get_workflow_handle(
                    f"rollback/{CLUSTER}/ns{i % NAMESPACES}/{_kind(i)}/w{i}").fetch_history()).events))
                for failing, i in ((False, 1), (True, 9))  # one in ten OOMs: w9
            }  # fmt: skip
            if floor:
                floor_took, floor_rss = await _floor(
                    client, server.address, tmp, owners, work, WINDOW
                )
                say(lines, f"    floor (the same {owners} attempts as floor workflows on this"
                           f" dev server, started at once, no budget): all done {floor_took:.0f}s"
                           f" after the last started, worker peak RSS {floor_rss:.0f} MiB; the"
                           f" engine {took / floor_took:.2f}x the floor")  # fmt: skip
    return work


async def p5_floor(owners: int, lines: Lines) -> None:
    """The floor alone at ``owners``, on a fresh dev server: the same attempts as floor
    workflows, their work read first from a small engine wave (P5's quick size, 60 owners).
    The engine's wave and its floor on one server take about two hours here; this is the floor's
    half, on a server not already holding the engine's histories."""
    work = await p5(60, 90, 10, 200, [], floor=False)
    say(lines, f"  the work of an attempt, read from a 60-owner engine wave: {work[False][0]}"
               f" activities + {work[False][1]} timers, {work[True][0]} + {work[True][1]} for"
               f" the OOM ones")  # fmt: skip
    with (
        tempfile.TemporaryDirectory() as tmp,
        DevServer(
            Path(tmp) / "t", free_port(), headless=True, log_path=Path(tmp) / "temporal.log"
        ) as server,
    ):
        client = await TemporalConfig.at(server.address).connect()
        took, rss = await _floor(client, server.address, tmp, owners, work, WINDOW)
        say(lines, f"    floor alone ({owners} attempts as floor workflows on a fresh dev"
                   f" server, started at once, no budget, {WINDOW} s windows): all done"
                   f" {took:.0f}s after the last started ({owners / took:.1f} attempts/s),"
                   f" worker peak RSS {rss:.0f} MiB")  # fmt: skip
