"""``python -m bench [--quick] [--write]``: the figures of bench/RESULTS.md, measured side by side.

P1  rollback workflows completed per second vs a floor workflow doing the same number of timers
    and no-op activities, on the same dev server (the ratio is the engine's overhead).
P2  Kubernetes API requests per owner per sample, and writes per transition, counted at the
    emulator, vs a naive baseline that GETs every pod.
P3  N workloads monitored at once by one worker process through the real intake and activities:
    all reach the expected mode; worker peak RSS and CPU seconds per workload; p50/p99 from a pod
    adopting a recommendation to its workflow starting.
P4  policy resolution for W workloads x P policies: the intake's index vs a linear scan.
SQ  the dev server's SQLite with and without the WAL pragmas (P1's rollback workload on each).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from kubernetes.client import CoreV1Api, CustomObjectsApi
from temporalio.client import Client
from temporalio.common import WorkerDeploymentVersion
from temporalio.worker import Worker

from activities.kubernetes import Actuation, KubernetesActivities
from bench.workloads import FloorWorkflow, InstantCluster
from sim.apiserver import KubeEmulator
from sim.devserver import DevServer
from sim.scenario import SCENARIOS, Scenario, WorkerProcess, free_port, run_scenario
from worker.config import TemporalConfig
from worker.intake import Intake
from worker.kube import api_client
from worker.runner import activity_methods, build_worker
from worker.versioning import adopt_if_first
from workflows.activity_api import OwnerRef, SampleCohortInput
from workflows.contract import WorkloadKind
from workflows.fingerprint import Recommendation
from workflows.policy import ClusterRollbackPolicy, RollbackPolicy
from workflows.rollback import RollbackInput, RollbackWorkflow
from workflows.selection import PolicyIndex, WorkloadRef, resolve

RESULTS = Path(__file__).parent / "RESULTS.md"
# Measured while building it (same machine); each is a change the numbers asked for.
HOT_PATH = [
    "- Cohort query carried by the workflow: before, every sample read the owner then listed its pods;"
    " after, only the first sample of a window does (P2 above: 'before the carried cohort query' vs"
    " 'ours').",
    "- SQLite pragmas on the embedded dev server (WAL, synchronous=off): see the SQLite section,"
    " 1.65x to 1.9x the completed rollback workflows per second of the default journal in the"
    " runs on this machine.",
    "- Informer stop through the socket's shutdown instead of close: intake stop went from up to 5s per"
    " informer (blocked reads) to milliseconds, which is what made leadership hand-over prompt.",
    "- Worker workflow cache sized for the concurrency (max_cached_workflows 10,000 instead of the"
    " SDK's 1,000): P3 at 2,000 workloads, worker CPU 81.1 ms per workload instead of 93.1 (-13%),"
    " peak RSS 570 MiB instead of 472 (`python -m bench --only p3 --p3 2000`, with and without"
    " ROLLBACK_MAX_CACHED_WORKFLOWS=1000).",
]
KEY = "static.rightsizing.kubex.ai/desired-resource-requests"
REC = Recommendation(requests_key=KEY, requests={"app": {"memory": "512Mi"}})
Lines = list[str]
RESULT_WAITERS = 200


def say(lines: Lines, text: str = "") -> None:
    print(text, flush=True)
    lines.append(text)


# --- P1 and SQLite -------------------------------------------------------------------------------


async def _rate(client: Client, queue: str, count: int, start: Callable[[int], Any]) -> float:
    """Workflows completed per second for ``count`` concurrent starts."""
    began = time.monotonic()
    handles = await asyncio.gather(*(start(i) for i in range(count)))
    # Waiting on a result is a long poll, and the server caps those per namespace: wait on a few
    # hundred at a time (a finished workflow's result returns at once).
    waiting = asyncio.Semaphore(RESULT_WAITERS)

    async def finished(handle: Any) -> None:
        async with waiting:
            await handle.result()

    await asyncio.gather(*(finished(h) for h in handles))
    return count / (time.monotonic() - began)


async def _shape(client: Client, queue: str) -> tuple[int, int]:
    """Activities and timers of one successful rollback run, read off its history."""
    owner = OwnerRef(namespace="bench", kind=WorkloadKind.DEPLOYMENT, name="shape")
    handle = await client.start_workflow(
        RollbackWorkflow.run,
        RollbackInput(owner=owner, recommendation=REC),
        id=f"shape-{uuid.uuid4().hex}",
        task_queue=queue,
    )
    await handle.result()
    events = (await handle.fetch_history()).events
    activities = sum(e.HasField("activity_task_scheduled_event_attributes") for e in events)
    timers = sum(e.HasField("timer_started_event_attributes") for e in events)
    return activities, timers


async def throughput(
    address: str, sizes: list[int], lines: Lines, label: str = ""
) -> dict[int, float]:
    client = await TemporalConfig.at(address).connect()
    queue = f"bench-{uuid.uuid4().hex[:6]}"
    ratios: dict[int, float] = {}
    async with Worker(
        client,
        task_queue=queue,
        workflows=[RollbackWorkflow, FloorWorkflow],
        activities=activity_methods(InstantCluster()),
        max_cached_workflows=10_000,
    ):
        shape = await _shape(client, queue)
        say(
            lines,
            f"  one successful rollback run = {shape[0]} activities + {shape[1]} timers (the floor does the same)",
        )
        if not label:
            say(
                lines,
                "  (at each size the floor batch runs first; a ratio above 1 means the rollback"
                " batch finished sooner on the same server, not that it does less work)",
            )
        for n in sizes:
            run = uuid.uuid4().hex[:6]

            def rollback(i: int, run: str = run) -> Any:
                owner = OwnerRef(
                    namespace="bench", kind=WorkloadKind.DEPLOYMENT, name=f"w{run}-{i}"
                )
                return client.start_workflow(
                    RollbackWorkflow.run,
                    RollbackInput(owner=owner, recommendation=REC),
                    id=f"{owner.workflow_id}",
                    task_queue=queue,
                )

            def floor(i: int, run: str = run) -> Any:
                return client.start_workflow(
                    FloorWorkflow.run, shape, id=f"floor-{run}-{i}", task_queue=queue
                )

            floor_rate = await _rate(client, queue, n, floor)
            rollback_rate = await _rate(client, queue, n, rollback)
            ratios[n] = rollback_rate / floor_rate
            say(
                lines,
                f"  {label}{n:>5} workflows: rollback {rollback_rate:7.1f}/s, floor {floor_rate:7.1f}/s,"
                f" ratio {ratios[n]:.2f}x",
            )
    return ratios


async def versioning_cost(address: str, n: int, repeats: int, lines: Lines) -> float:
    """Rollback workflows per second on a pinned, versioned worker vs an unversioned one (same
    server, same activities), batches alternated; the ratio of the medians."""
    client = await TemporalConfig.at(address).connect()
    plain, versioned = f"bench-plain-{uuid.uuid4().hex[:6]}", f"bench-v-{uuid.uuid4().hex[:6]}"
    version = WorkerDeploymentVersion(f"bench-{uuid.uuid4().hex[:6]}", "v1")
    async with (
        build_worker(client, plain, InstantCluster(), 10_000),
        build_worker(client, versioned, InstantCluster(), 10_000, version),
    ):
        assert await adopt_if_first(client, version)
        shapes = {q: await _shape(client, q) for q in (plain, versioned)}
        assert shapes[plain] == shapes[versioned], shapes  # the same work on both
        say(
            lines,
            f"  one run on either worker = {shapes[plain][0]} activities + {shapes[plain][1]} timers",
        )
        rates: dict[str, list[float]] = {plain: [], versioned: []}
        for r in range(repeats):
            for queue in (plain, versioned) if r % 2 == 0 else (versioned, plain):

                def start(i: int, queue: str = queue, r: int = r) -> Any:
                    owner = OwnerRef(
                        namespace="bench", kind=WorkloadKind.DEPLOYMENT, name=f"{queue}-{r}-{i}"
                    )
                    return client.start_workflow(
                        RollbackWorkflow.run,
                        RollbackInput(owner=owner, recommendation=REC),
                        id=owner.workflow_id,
                        task_queue=queue,
                    )

                rates[queue].append(await _rate(client, queue, n, start))
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
                    server.address, sizes, lines, "WAL+sync=off " if pragmas else "default journal "
                )


# --- P2 --------------------------------------------------------------------------------------------


def api_cost(owners: int, pods: int, samples: int, lines: Lines) -> None:
    with KubeEmulator() as api:
        acts = KubernetesActivities(
            CoreV1Api(api_client(url=api.url)),
            CustomObjectsApi(api_client(url=api.url)),
            Actuation.ANNOTATIONS,
        )
        refs = []
        for o in range(owners):
            name = f"w{o}"
            api.store.create(
                {
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "metadata": {"name": name, "namespace": "bench"},
                    "spec": {
                        "replicas": pods,
                        "selector": {"matchLabels": {"app": name}},
                        "template": {"spec": {"containers": [{"name": "app"}]}},
                    },
                }
            )
            for p in range(pods):
                api.store.create(
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "metadata": {
                            "name": f"{name}-{p}",
                            "namespace": "bench",
                            "labels": {"app": name},
                            "annotations": {KEY: json.dumps(REC.requests)},
                        },
                        "spec": {
                            "containers": [
                                {"name": "app", "resources": {"requests": {"memory": "512Mi"}}}
                            ]
                        },
                        "status": {
                            "phase": "Running",
                            "conditions": [{"type": "Ready", "status": "True"}],
                        },
                    }
                )
            refs.append(OwnerRef(namespace="bench", kind=WorkloadKind.DEPLOYMENT, name=name))
        start = datetime.now(UTC)
        api.clear_journal()
        began = time.monotonic()
        for ref in refs:
            cohort = None
            for _ in range(samples):
                result = acts.sample_cohort(
                    SampleCohortInput(
                        owner=ref, recommendation=REC, window_started_at=start, cohort=cohort
                    )
                )
                cohort = result.cohort
                assert result.adopted_healthy == pods
        ours_time = time.monotonic() - began
        ours = len(api.journal)
        lists = len(api.requests("list"))
        api.clear_journal()
        began = time.monotonic()
        for ref in refs:  # before: the owner read at every sample (no carried cohort query)
            for _ in range(samples):
                acts.sample_cohort(
                    SampleCohortInput(owner=ref, recommendation=REC, window_started_at=start)
                )
        before_time = time.monotonic() - began
        before = len(api.journal)
        api.clear_journal()
        began = time.monotonic()
        core = CoreV1Api(api_client(url=api.url))
        for ref in refs:  # the naive way: read the owner, then GET every pod by name
            for _ in range(samples):
                CustomObjectsApi(core.api_client).get_namespaced_custom_object(
                    "apps", "v1", "bench", "deployments", ref.name
                )
                for p in range(pods):
                    core.read_namespaced_pod(f"{ref.name}-{p}", "bench", _preload_content=False)
        naive_time = time.monotonic() - began
        naive = len(api.journal)
        n = owners * samples
        say(lines, f"  {owners} owners x {pods} pods x {samples} samples:")
        say(
            lines,
            f"    ours:  {ours / n:.2f} requests per owner per sample ({lists / n:.2f} LIST; the first"
            f" sample of a window adds 1 GET of the owner), {ours_time / n * 1000:.2f} ms per sample",
        )
        say(
            lines,
            f"    before the carried cohort query: {before / n:.2f} requests per owner per sample,"
            f" {before_time / n * 1000:.2f} ms per sample",
        )
        say(
            lines,
            f"    naive: {naive / n:.2f} requests per owner per sample (1 GET owner + {pods} GET pod),"
            f" {naive_time / n * 1000:.2f} ms per sample",
        )
        say(
            lines,
            f"    ratio: {naive / ours:.1f}x fewer requests, {naive_time / ours_time:.1f}x less time",
        )


def writes_per_transition(lines: Lines) -> None:
    """From a whole simulated story (oom-rollback): writes at the API server per transition."""
    scenario = Scenario.load(SCENARIOS / "oom-rollback.yaml")
    report = asyncio.run(run_scenario(scenario, on_line=lambda _: None))
    journal = report.requests
    owner_writes = [
        r for r in journal if r.verb in ("patch", "update") and "/deployments/" in r.path
    ]
    events = [r for r in journal if r.verb == "create" and r.path.endswith("/events")]
    transitions = len(report.transitions)
    say(
        lines,
        f"  oom-rollback story: {transitions} transitions, {len(owner_writes)} owner writes,"
        f" {len(events)} Events: {len(owner_writes) / transitions:.2f} owner writes per transition"
        f" (state, plus the rollback annotations when they change), and no write without a transition",
    )


# --- P3 --------------------------------------------------------------------------------------------


def _proc_stats(pid: int) -> tuple[float, float]:
    """(peak RSS MiB, CPU seconds) of a process, from /proc."""
    hwm = 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            hwm = int(line.split()[1]) / 1024
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return hwm, (int(fields[11]) + int(fields[12])) / ticks


def oom(workload: int) -> bool:
    """One P3 workload in ten has OOMKilled pods: it rolls back and fails permanently."""
    return workload % 10 == 9


async def concurrent(workloads: int, lines: Lines) -> None:
    with tempfile.TemporaryDirectory() as tmp, KubeEmulator() as api:
        server = DevServer(
            Path(tmp) / "t", free_port(), headless=True, log_path=Path(tmp) / "temporal.log"
        )
        with server:
            queue = "bench-p3"
            worker = WorkerProcess(
                server.address, queue, api.url, "annotations", Path(tmp) / "worker.log"
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
                queue,
                asyncio.get_running_loop(),
                timedelta(seconds=5),
            )
            await asyncio.to_thread(intake.start)
            adopted_at: dict[str, float] = {}
            ready_status = {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "True"}],
            }
            oom_status = {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "False"}],
                "containerStatuses": [
                    {"name": "app", "state": {"terminated": {"reason": "OOMKilled"}}}
                ],
            }
            for w in range(workloads):
                name, ns = f"w{w}", f"ns{w % 20}"
                dep = api.store.create(
                    {
                        "apiVersion": "apps/v1",
                        "kind": "Deployment",
                        "metadata": {"name": name, "namespace": ns},
                        "spec": {
                            "replicas": 2,
                            "selector": {"matchLabels": {"app": name}},
                            "template": {"spec": {"containers": [{"name": "app"}]}},
                        },
                    }
                )
                ref = {
                    "kind": "Deployment",
                    "name": name,
                    "uid": dep["metadata"]["uid"],
                    "controller": True,
                }
                rs = api.store.create(
                    {
                        "apiVersion": "apps/v1",
                        "kind": "ReplicaSet",
                        "metadata": {
                            "name": f"{name}-rs",
                            "namespace": ns,
                            "ownerReferences": [ref],
                        },
                    }
                )
                rs_ref = {
                    "kind": "ReplicaSet",
                    "name": f"{name}-rs",
                    "uid": rs["metadata"]["uid"],
                    "controller": True,
                }
                for p in range(2):
                    api.store.create(
                        {
                            "apiVersion": "v1",
                            "kind": "Pod",
                            "metadata": {
                                "name": f"{name}-{p}",
                                "namespace": ns,
                                "labels": {"app": name},
                                "annotations": {KEY: json.dumps(REC.requests)},
                                "ownerReferences": [rs_ref],
                            },
                            "spec": {
                                "containers": [
                                    {"name": "app", "resources": {"requests": {"memory": "512Mi"}}}
                                ]
                            },
                            "status": oom_status if oom(w) else ready_status,
                        }
                    )
                adopted_at.setdefault(f"rollback/{ns}/Deployment/{name}", time.time())
                await asyncio.sleep(0)  # the intake signals through this loop: let it
            began = time.monotonic()
            done: dict[str, Any] = {}
            while len(done) < workloads and time.monotonic() - began < max(600, workloads * 0.5):
                async for wf in client.list_workflows('ExecutionStatus = "Completed"'):
                    done[wf.id] = wf
                await asyncio.sleep(2)
            took = time.monotonic() - began
            assert worker.process is not None
            rss, cpu = _proc_stats(worker.process.pid)
            starts = []
            async for wf in client.list_workflows("WorkflowType = 'RollbackWorkflow'"):
                if wf.id in adopted_at:
                    starts.append(max(0.0, wf.start_time.timestamp() - adopted_at[wf.id]))
            modes = [
                json.loads(
                    (
                        api.store.get(
                            api.store.rtype("Deployment"), wid.split("/")[1], wid.split("/")[3]
                        )["metadata"]["annotations"]
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
            starts.sort()
            p50 = statistics.median(starts) if starts else float("nan")
            p99 = starts[min(len(starts) - 1, int(len(starts) * 0.99))] if starts else float("nan")
            say(
                lines,
                f"  {workloads} workloads monitored at once (20s windows, 5s samples): {right}/{workloads}"
                " reached the right final mode (one in ten OOMs: failedPermanent after its"
                f" rollback; the rest monitoringSucceeded), all done {took:.0f}s after the last"
                " workload was created",
            )
            say(
                lines,
                f"    worker process: peak RSS {rss:.0f} MiB, CPU {cpu:.1f}s = {cpu / workloads * 1000:.1f} ms"
                " per workload",
            )
            say(
                lines,
                f"    pod adopted -> workflow started: p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms",
            )


# --- P4 --------------------------------------------------------------------------------------------


def policy_resolution(workloads: int, policies: int, lines: Lines) -> None:
    rng = random.Random(7)
    namespaces = [f"team-{i}" for i in range(100)] + [f"prod-{i}" for i in range(50)]
    docs: list[RollbackPolicy | ClusterRollbackPolicy] = []
    spec = {
        "monitoringPeriod": "5m",
        "rollbackTarget": "manifest",
        "adoptionThresholdPercent": 80,
        "backoff": {"timePeriod": "1m", "multiplyByTurn": 2, "maxAttempts": 3},
    }
    for i in range(policies):
        selector = {"matchLabels": {"tier": rng.choice(["api", "worker", "db"])}}
        if i % 10 == 0:
            docs.append(
                ClusterRollbackPolicy.model_validate(
                    {
                        "kind": "ClusterRollbackPolicy",
                        "metadata": {"name": f"c{i}"},
                        "spec": {
                            **spec,
                            "weight": rng.randint(0, 100),
                            "scope": {
                                "labelSelector": selector,
                                "namespaceSelector": {
                                    "operator": "In",
                                    "values": [f"prod-{rng.randint(0, 49)}*"],
                                },
                            },
                        },
                    }
                )
            )
        else:
            docs.append(
                RollbackPolicy.model_validate(
                    {
                        "kind": "RollbackPolicy",
                        "metadata": {"name": f"p{i}", "namespace": rng.choice(namespaces)},
                        "spec": {
                            **spec,
                            "weight": rng.randint(0, 100),
                            "scope": {"labelSelector": selector},
                        },
                    }
                )
            )
    refs = [
        WorkloadRef(
            WorkloadKind.DEPLOYMENT,
            rng.choice(namespaces),
            f"w{i}",
            {"tier": rng.choice(["api", "worker", "db"])},
        )
        for i in range(workloads)
    ]
    began = time.monotonic()
    index = PolicyIndex()
    for doc in docs:
        index.upsert(doc)
    indexed = [index.resolve(w).policy for w in refs]
    index_time = time.monotonic() - began
    began = time.monotonic()
    linear = [resolve(docs, w).policy for w in refs]
    linear_time = time.monotonic() - began
    assert indexed == linear, "the index and the linear scan disagree"
    say(
        lines,
        f"  {workloads} workloads x {policies} policies: index {index_time:.2f}s"
        f" ({index_time / workloads * 1e6:.0f} us/workload, build included), linear"
        f" {linear_time:.2f}s ({linear_time / workloads * 1e6:.0f} us/workload): {linear_time / index_time:.0f}x,"
        " same answers",
    )


# --- main ------------------------------------------------------------------------------------------


def machine() -> str:
    cpus = os.cpu_count()
    mem = next(
        (
            int(line.split()[1]) // 1024 // 1024
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemTotal")
        ),
        0,
    )
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    return f"{cpus} cores ({model}), {mem} GiB, {platform.system()} {platform.release()}, Python {platform.python_version()}"


SECTIONS = ("p4", "p2", "p1", "versioning", "sqlite", "p3")


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke check for CI")
    parser.add_argument("--write", action="store_true", help="write bench/RESULTS.md")
    parser.add_argument("--p1", default="100,1000,5000", help="P1 sizes (default 100,1000,5000)")
    parser.add_argument("--p3", type=int, default=5_000, help="P3 workloads (default 5000)")
    parser.add_argument(
        "--only", default=",".join(SECTIONS), help=f"sections to run (default {','.join(SECTIONS)})"
    )
    args = parser.parse_args()
    quick = args.quick
    sizes = [20, 50] if quick else [int(n) for n in args.p1.split(",")]
    p3 = 20 if quick else args.p3
    only = set(args.only.lower().split(","))
    lines: Lines = []
    command = " ".join(["python -m bench", *sys.argv[1:]])
    say(lines, "# Benchmark results")
    say(lines)
    say(lines, f"Machine: {machine()}. Command: `{command}`. Date: {datetime.now(UTC):%Y-%m-%d}.")
    say(lines)
    if "p4" in only:
        say(lines, "## P4 policy resolution, index vs linear scan")
        policy_resolution(1_000 if quick else 10_000, 100 if quick else 1_000, lines)
        say(lines)
    if "p2" in only:
        say(lines, "## P2 Kubernetes API cost per sample and per transition")
        api_cost(5 if quick else 50, 10, 3 if quick else 10, lines)
        writes_per_transition(lines)
        say(lines)
    if "p1" in only:
        say(lines, "## P1 throughput vs the floor workflow (same dev server, same worker)")
        with (
            tempfile.TemporaryDirectory() as tmp,
            DevServer(Path(tmp), free_port(), headless=True, log_path=Path(tmp) / "log") as server,
        ):
            asyncio.run(throughput(server.address, sizes, lines))
        say(lines)
    if "versioning" in only:
        say(lines, "## Worker Versioning: a pinned, versioned worker vs an unversioned one")
        with (
            tempfile.TemporaryDirectory() as tmp,
            DevServer(Path(tmp), free_port(), headless=True, log_path=Path(tmp) / "log") as server,
        ):
            asyncio.run(versioning_cost(server.address, 20 if quick else 500, 3, lines))
        say(lines)
    if "sqlite" in only:
        say(lines, "## SQLite: WAL + synchronous=off (the embedded default) vs the default journal")
        asyncio.run(sqlite_wal([50] if quick else [500], lines))
        say(lines)
    if "p3" in only:
        say(lines, "## P3 concurrent workloads on one worker process")
        asyncio.run(concurrent(p3, lines))
        say(lines)
    say(lines, "## Hot-path changes these figures led to, with before/after")
    for line in HOT_PATH:
        say(lines, line)
    if args.write:
        RESULTS.write_text("\n".join(lines) + "\n")
        print(f"\nwrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
