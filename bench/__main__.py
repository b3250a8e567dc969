"""``python -m bench [--quick] [--write] [--only SECTIONS]``: the figures of bench/RESULTS.md.

cost    one successful attempt per window length (20s, 5m, 1h at once on one dev server, the real
        workflow and activities against the emulator): history events, activities, timers and
        Kubernetes requests by verb, which must be the same for every window.
memory  KiB per cached workflow, by workflow runner, each measured in a fresh process.
burst   pods adopting at once through the intake (its own process, no worker): adoption ->
        workflow started p50/p99, signals per owner, intake requests, CPU and RSS.
status  policy status writes while workloads adopt at once under a few policies (real worker and
        intake): writes per transition, the most writes of one policy in any 2 s.
P1      rollback workflows completed per second vs a floor workflow doing the same activities
        and timers, batches alternated and repeated, the work of sampled runs asserted equal
        from their histories; the ratio of the medians is the engine's overhead.
P2      Kubernetes API requests per cohort sample, and writes per transition, counted at the
        emulator, vs a naive baseline that GETs every pod.
P3      N workloads monitored at once by one worker process through the real intake and
        activities: every final mode right; worker peak RSS, CPU per workload, samples taken,
        time from the last workload created to all done.
P4      policy resolution for W workloads x P policies: the intake's index vs a linear scan.
SQ      the dev server's SQLite with and without the WAL pragmas (P1's workloads on each).

``--write`` replaces, in RESULTS.md, the sections this run measured (each stamped with its
command) and keeps the others."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes.client import CoreV1Api, CustomObjectsApi
from temporalio.client import Client
from temporalio.common import WorkerDeploymentVersion
from temporalio.worker import Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from activities.kubernetes import Actuation, KubernetesActivities
from bench import actions
from bench.memory import memory_mib
from bench.regular import RegularActivitiesWorkflow
from bench.soak import report as soak_report
from bench.soak import soak
from bench.workloads import FloorWorkflow, InstantCluster
from sim.apiserver import KubeEmulator
from sim.devserver import DevServer
from sim.scenario import SCENARIOS, Scenario, WorkerProcess, free_port, run_scenario
from worker.config import TemporalConfig
from worker.intake import MAX_CONCURRENT_SIGNALS, Intake
from worker.kube import activities_for, api_client
from worker.runner import MAX_CACHED_WORKFLOWS, activity_methods, build_worker
from worker.temporal import observe
from worker.versioning import adopt_if_first
from workflows.activity_api import OwnerRef, SampleCohortInput
from workflows.contract import Mode, Obj, WorkloadKind
from workflows.fingerprint import Recommendation
from workflows.notify import NotifyWorkflow
from workflows.policy import ClusterRollbackPolicy, RollbackPolicy
from workflows.policy_status import Workload, status_of, tally
from workflows.rollback import WORKFLOW_NAME, RollbackInput, RollbackWorkflow
from workflows.selection import PolicyIndex, WorkloadRef, resolve
from workflows.state import OwnerState, PolicyRef

RESULTS = Path(__file__).parent / "RESULTS.md"
KEY = "static.rightsizing.kubex.ai/desired-resource-requests"
REC = Recommendation(requests_key=KEY, requests={"app": {"memory": "512Mi"}})
Lines = list[str]
RESULT_WAITERS = 200


def met(reached: bool) -> str:
    """What a figure's target line adds: nothing when reached, NOT MET when missed."""
    return "" if reached else ": NOT MET"


def say(lines: Lines, text: str = "") -> None:
    print(text, flush=True)
    lines.append(text)


# --- P1 and SQLite -------------------------------------------------------------------------------


@contextmanager
def scratch_server() -> Iterator[DevServer]:
    """A throwaway dev server: SQLite in a temporary directory, a free port, no UI."""
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "log"
        with DevServer(Path(tmp), free_port(), headless=True, log_path=log) as server:
            yield server


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


def _work(shape: dict[str, int]) -> tuple[int, int]:
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
        work = _work(await _finished_shape(client, queue, "shape"))
        for n in sizes:
            run = uuid.uuid4().hex[:6]
            rates: dict[str, list[float]] = {"rollback": [], "floor": []}
            events: dict[str, list[int]] = {"rollback": [], "floor": []}
            for r in range(repeats):
                for kind in ("floor", "rollback") if r % 2 == 0 else ("rollback", "floor"):

                    def start(i: int, kind: str = kind, r: int = r, run: str = run) -> Any:
                        if kind == "floor":
                            return client.start_workflow(
                                FloorWorkflow.run, work, id=f"floor-{run}-{r}-{i}", task_queue=queue
                            )
                        return _start_rollback(client, queue, f"w{run}-{r}-{i}")

                    rate, handles = await _rate(client, queue, n, start)
                    shapes = await _shapes(handles)
                    assert all(_work(s) == work for s in shapes), (kind, work, shapes)
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
                f" {min(events['floor'])}-{max(events['floor'])}",
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
        RollbackInput(owner=owner, recommendation=REC),
        id=owner.workflow_id,
        task_queue=queue,
    )


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
        shapes = {q: await _finished_shape(client, q, f"shape-{q}") for q in (plain, versioned)}
        assert shapes[plain] == shapes[versioned], shapes  # the same work on both
        work = _work(shapes[plain])
        say(lines, f"  one run on either worker = {work[0]} activities + {work[1]} timers")
        rates: dict[str, list[float]] = {plain: [], versioned: []}
        for r in range(repeats):
            for queue in (plain, versioned) if r % 2 == 0 else (versioned, plain):

                def start(i: int, queue: str = queue, r: int = r) -> Any:
                    return _start_rollback(client, queue, f"{queue}-{r}-{i}")

                rate, handles = await _rate(client, queue, n, start)
                shapes_now = await _shapes(handles)
                assert all(_work(s) == work for s in shapes_now), (queue, work, shapes_now)
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
        carried_time = time.monotonic() - began
        carried = len(api.journal)
        api.clear_journal()
        began = time.monotonic()
        for ref in refs:  # a window's sample: the owner read, then its pods listed
            for _ in range(samples):
                acts.sample_cohort(
                    SampleCohortInput(owner=ref, recommendation=REC, window_started_at=start)
                )
        ours_time = time.monotonic() - began
        ours = len(api.journal)
        lists = len(api.requests("list"))
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
            f"    a window's sample: {ours / n:.2f} requests ({(ours - lists) / n:.0f} GET of the"
            f" owner, {lists / n:.0f} LIST of pods), {ours_time / n * 1000:.2f} ms",
        )
        say(
            lines,
            f"    {samples} samples with the cohort query carried after the first (a reopened"
            f" window): {carried / n:.2f} requests a sample, {carried_time / n * 1000:.2f} ms",
        )
        say(
            lines,
            f"    naive: {naive / n:.2f} requests per sample (1 GET owner + {pods} GET pod),"
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


# --- cost per attempt -----------------------------------------------------------------------------

READY = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
OOM = {
    "phase": "Running",
    "conditions": [{"type": "Ready", "status": "False"}],
    "containerStatuses": [{"name": "app", "state": {"terminated": {"reason": "OOMKilled"}}}],
}


def _workload(
    api: KubeEmulator, ns: str, name: str, pods: int, status: Obj | None, adopted: bool = True
) -> list[Obj]:
    """A Deployment, its ReplicaSet and ``pods`` pods carrying REC (on their resources when
    ``adopted``); returns the pods."""
    dep = api.store.create(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "namespace": ns},
            "spec": {
                "replicas": pods,
                "selector": {"matchLabels": {"app": name}},
                "template": {"spec": {"containers": [{"name": "app"}]}},
            },
        }
    )
    rs = api.store.create(
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {
                "name": f"{name}-rs",
                "namespace": ns,
                "ownerReferences": [
                    {
                        "kind": "Deployment",
                        "name": name,
                        "uid": dep["metadata"]["uid"],
                        "controller": True,
                    }
                ],
            },
        }
    )
    rs_ref = {
        "kind": "ReplicaSet",
        "name": f"{name}-rs",
        "uid": rs["metadata"]["uid"],
        "controller": True,
    }
    memory = "512Mi" if adopted else "1Gi"
    return [
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
                    "containers": [{"name": "app", "resources": {"requests": {"memory": memory}}}]
                },
                "status": status or READY,
            }
        )
        for p in range(pods)
    ]


def _policy(name: str, window: str, namespace: str | None = None, max_attempts: int = 1) -> Obj:
    meta: Obj = {"name": name} | ({"namespace": namespace} if namespace else {})
    return {
        "apiVersion": "rightsizing.kubex.ai/v1alpha1",
        "kind": "RollbackPolicy" if namespace else "ClusterRollbackPolicy",
        "metadata": meta,
        "spec": {
            "monitoringPeriod": window,
            "rollbackTarget": "manifest",
            "adoptionThresholdPercent": 100,
            "backoff": {"timePeriod": "1s", "multiplyByTurn": 1, "maxAttempts": max_attempts},
        },
    }


async def attempt_cost(windows: list[str], lines: Lines) -> None:
    """One successful attempt per window length, all at once on one dev server: the real workflow
    and the real activities against the emulator, which counts every request by verb."""
    with KubeEmulator() as api, scratch_server() as server:
        client = await TemporalConfig.at(server.address).connect()
        queue = f"bench-cost-{uuid.uuid4().hex[:6]}"
        refs = []
        for i, window in enumerate(windows):
            ns = f"cost{i}"
            api.store.create(_policy("p", window, ns))
            _workload(api, ns, "web", 3, READY)
            refs.append(OwnerRef(namespace=ns, kind=WorkloadKind.DEPLOYMENT, name="web"))
        acts = activities_for(api_client(url=api.url), Actuation.ANNOTATIONS)
        async with build_worker(client, queue, acts):
            handles = [await observe(client, queue, ref, REC) for ref in refs]
            results = await asyncio.gather(*(h.result() for h in handles))
        assert all(r.mode is Mode.MONITORING_SUCCEEDED for r in results), results
        rows = []
        for window, ref, handle in zip(windows, refs, handles, strict=True):
            shape = actions.shape((await handle.fetch_history()).events)
            mine = api.requests(None, f"/namespaces/{ref.namespace}/")
            verbs = Counter(
                f"{r.verb} {r.path.split('/namespaces/', 1)[1].split('/')[1]}" for r in mine
            )
            rows.append((window, shape, verbs))
        cluster_lists = len(api.requests("list", "/clusterrollbackpolicies$"))
    for window, shape, verbs in rows:
        requests = ", ".join(f"{n} {what}" for what, n in sorted(verbs.items()))
        say(
            lines,
            f"  {window:>4} window: {shape['events']} history events, {shape['activities']} activities,"
            f" {shape['local']} local activities, {shape['timers']} timer, {shape['signals']} signal,"
            f" {shape['actions']} billable actions; Kubernetes: {sum(verbs.values())}"
            f" requests ({requests}) + {cluster_lists // len(rows)} LIST of cluster policies",
        )
    first = rows[0]
    same = all(r[1] == first[1] and r[2] == first[2] for r in rows)
    pod_lists = first[2].get("list pods", 0)
    say(
        lines,
        f"  the same for every window: {'yes' if same else 'NO'}; pod LISTs {pod_lists}"
        f" (target <= 2{met(pod_lists <= 2)}), history events {first[1]['events']}"
        f" (target <= 40{met(first[1]['events'] <= 40)})",
    )
    assert same, rows


PATHS = {"local activities": RollbackWorkflow, "regular activities": RegularActivitiesWorkflow}


async def attempt_paths(lines: Lines) -> None:
    """The same attempts on both paths side by side, one dev server: a successful one, and an OOM
    one failing permanently after two turns (two runs: the second starts when the pods are seen
    again after the backoff, as the intake does). Billable actions by ``bench.actions.RULES``."""
    with KubeEmulator() as api, scratch_server() as server:
        client = await TemporalConfig.at(server.address).connect()
        acts = activities_for(api_client(url=api.url), Actuation.ANNOTATIONS)
        costs: dict[tuple[str, str], dict[str, int]] = {}
        for i, (path, workflow_class) in enumerate(PATHS.items()):
            queue = f"bench-paths-{i}-{uuid.uuid4().hex[:6]}"
            async with build_worker(
                client, queue, acts, workflows=[workflow_class, NotifyWorkflow]
            ):
                for fate, status, turns in (("success", READY, 1), ("oom", OOM, 2)):
                    ns = f"{fate}-{i}"
                    api.store.create(_policy("p", "1s", ns, max_attempts=turns))
                    _workload(api, ns, "web", 3, status)
                    ref = OwnerRef(namespace=ns, kind=WorkloadKind.DEPLOYMENT, name="web")
                    shapes = []
                    for _ in range(turns):
                        handle = await observe(client, queue, ref, REC)
                        await handle.result()
                        shapes.append(actions.shape((await handle.fetch_history()).events))
                    costs[path, fate] = actions.total(shapes)
                    end = (await handle.result()).mode
                    want = Mode.MONITORING_SUCCEEDED if fate == "success" else Mode.FAILED_PERMANENT
                    assert end is want, (path, fate, end)
    for (path, fate), c in costs.items():
        say(
            lines,
            f"  {fate:>7}, {path}: {c['events']} history events, {c['activities']} activities,"
            f" {c['local']} local activities, {c['timers']} timers, {c['signals']} signals,"
            f" {c['actions']} billable actions",
        )
    for fate in ("success", "oom"):
        before, after = costs["regular activities", fate], costs["local activities", fate]
        assert before["activities"] == after["activities"] + after["local"], (fate, costs)
        say(
            lines,
            f"  {fate}: events {before['events']} -> {after['events']}, billable actions"
            f" {before['actions']} -> {after['actions']} (same effects: {before['activities']}"
            " activities on the old path)",
        )
    ok = costs["local activities", "success"]
    say(
        lines,
        f"  a successful attempt: {ok['events']} history events (target <= 20"
        f"{met(ok['events'] <= 20)}), {ok['actions']} billable actions (target <= 4"
        f"{met(ok['actions'] <= 4)})",
    )
    say(lines, "  billable actions counted per history event (Temporal Cloud's rules):")
    for event, n, how in actions.RULES:
        say(lines, f"    {event}: {n} ({how})")


# --- P3 --------------------------------------------------------------------------------------------


def _proc_stats(pid: int) -> tuple[float, float]:
    """(peak RSS MiB, CPU seconds) of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return memory_mib(pid, "VmHWM"), (int(fields[11]) + int(fields[12])) / ticks


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
            )
            await asyncio.to_thread(intake.start)
            adopted_at: dict[str, float] = {}
            for w in range(workloads):
                name, ns = f"w{w}", f"ns{w % 20}"
                _workload(api, ns, name, 2, OOM if oom(w) else READY)
                adopted_at.setdefault(f"rollback/{ns}/Deployment/{name}", time.time())
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


# --- policy status --------------------------------------------------------------------------------


async def status_writes(workloads: int, policies: int, lines: Lines) -> None:
    """Policy status writes during a burst: every workload adopts at once under ``policies``
    namespaced policies (one in ten OOMs: rollback, then failedPermanent), the real worker and
    intake; status writes counted at the emulator against the transitions they summarise."""
    with scratch_server() as server, tempfile.TemporaryDirectory() as tmp, KubeEmulator() as api:
        writes: list[tuple[float, str]] = []

        def on_write(kind: str, rtype: Any, obj: Obj) -> None:
            if rtype.kind == "RollbackPolicy" and kind == "MODIFIED":
                writes.append((time.monotonic(), obj["metadata"]["namespace"]))

        api.store.listeners.append(on_write)
        for p in range(policies):
            api.store.create(_policy("policy", "2s", f"ns{p}"))
        queue = "bench-status"
        worker = WorkerProcess(server.address, queue, api.url, "annotations", Path(tmp) / "w.log")
        worker.start()
        client = await TemporalConfig.at(server.address).connect()
        kube = api_client(url=api.url)
        intake = Intake(
            CoreV1Api(kube), CustomObjectsApi(kube), client, queue, asyncio.get_running_loop()
        )
        await asyncio.to_thread(intake.start)
        await asyncio.sleep(3)  # the first statuses (nothing matched yet) are written
        writes.clear()
        began = time.monotonic()
        for w in range(workloads):
            _workload(api, f"ns{w % policies}", f"w{w}", 2, OOM if oom(w) else READY)
        names = [(f"ns{w % policies}", f"w{w}") for w in range(workloads)]

        def states() -> list[Obj]:
            found = []
            for ns, name in names:
                meta = api.store.get(api.store.rtype("Deployment"), ns, name)["metadata"]
                raw = (meta.get("annotations") or {}).get("rightsizing.kubex.ai/rollback-state")
                found.append(json.loads(raw) if raw else {})
            return found

        while time.monotonic() - began < 300:
            if all(Mode(s["mode"]).terminal for s in states() if s) and all(states()):
                break
            await asyncio.sleep(1)
        await asyncio.sleep(2 * intake.status.period + 1)  # the last status is written
        final = states()
        transitions = sum(len(s.get("history", [])) for s in final)
        statuses = [
            api.store.get(api.store.rtype("RollbackPolicy"), f"ns{p}", "policy")["status"]
            for p in range(policies)
        ]
        failed = sum(s.get("failedWorkloads", 0) for s in statuses)
        active = sum(s.get("activeTrackedWorkloads", 0) for s in statuses)
        passes = intake.status.passes
        await asyncio.to_thread(intake.stop)
        worker.stop()
        busiest = max(
            (sum(1 for t2, n2 in writes if n2 == n and t <= t2 < t + 2.0) for t, n in writes),
            default=0,
        )
        expected_failed = sum(oom(w) for w in range(workloads))
        assert (failed, active) == (expected_failed, 0), (failed, active, expected_failed)
        say(
            lines,
            f"  {workloads} workloads adopting at once under {policies} policies: {transitions}"
            f" transitions, {len(writes)} status writes = {len(writes) / transitions:.3f} per"
            f" transition ({transitions / max(len(writes), 1):.1f}x fewer than a write per"
            f" transition); at most {busiest} write(s) of one policy in any 2 s;"
            f" {passes} recomputations in all",
        )
        say(
            lines,
            f"    final statuses right: failedWorkloads sum {failed} = the {expected_failed} OOM"
            " workloads, activeTrackedWorkloads 0",
        )


def status_pass(owners: int, policies: int, lines: Lines) -> None:
    """One status recomputation (``workflows.policy_status``) over a large cluster: its cost is
    what the intake's leader spends at most once per period while anything changes."""
    index = PolicyIndex()
    for p in range(policies):
        index.upsert(RollbackPolicy.model_validate(_policy(f"p{p}", "5m", f"ns{p % 20}")))
    index.upsert(ClusterRollbackPolicy.model_validate(_policy("all", "5m")))
    now = datetime.now(UTC)
    workloads = [
        Workload(
            WorkloadRef(WorkloadKind.DEPLOYMENT, f"ns{w % 20}", f"w{w}", {"app": f"w{w}"}),
            OwnerState(
                mode=Mode.FAILED_PERMANENT if oom(w) else Mode.MONITORING,
                active_recommendation_fingerprint="f",
                turn=1,
                policy=PolicyRef(kind="ClusterRollbackPolicy", name="all"),
                last_transition_time=now,
            ),
        )
        for w in range(owners)
    ]
    began = time.perf_counter()
    counts = tally(index, workloads)
    for policy in index.candidates("ns0"):
        status_of(policy, counts.get(str(PolicyRef.of(policy))), None, now)
    took = time.perf_counter() - began
    say(
        lines,
        f"  one recomputation over {owners} owners x {policies + 1} policies (20 namespaces):"
        f" {took * 1000:.0f} ms ({took / owners * 1e6:.1f} us per owner)",
    )


# --- memory ---------------------------------------------------------------------------------------


def workflow_memory(n: int, lines: Lines) -> None:
    """RSS per cached workflow by workflow runner, each in a fresh process (``bench.memory``)."""
    with scratch_server() as server:
        for runner in ("sandboxed", "passthrough", "unsandboxed"):
            out = subprocess.run(
                [sys.executable, "-m", "bench.memory", runner, str(n), server.address],
                capture_output=True,
                text=True,
                check=True,
            )
            got = json.loads(out.stdout.strip().splitlines()[-1])
            say(
                lines,
                f"  {runner:>11}: {got['kib_per_workflow']:.0f} KiB per cached workflow"
                f" ({n} windows waiting on their timer: RSS {got['before']:.0f} ->"
                f" {got['after']:.0f} MiB)",
            )


# --- burst ----------------------------------------------------------------------------------------


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status)
    except (OSError, urllib.error.URLError):
        return 0


async def burst(owners: int, per_owner: int, lines: Lines) -> None:
    """``owners * per_owner`` pods adopting their recommendation at once. The intake runs as its
    own process (``rollbackctl intake``) against the emulator; no worker, so what is measured is
    the intake alone: adoption -> workflow started, its CPU and memory, its requests, and the
    signals each owner's workflow received (counted in the histories)."""
    with tempfile.TemporaryDirectory() as tmp, KubeEmulator() as api:
        api.store.create(_policy("all", "20s"))
        pods = {
            f"w{w}": _workload(api, f"ns{w % 20}", f"w{w}", per_owner, READY, adopted=False)
            for w in range(owners)
        }
        with DevServer(
            Path(tmp) / "t", free_port(), headless=True, log_path=Path(tmp) / "log"
        ) as server:
            queue, health = "bench-burst", free_port()
            log = (Path(tmp) / "intake.log").open("wb")
            intake = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "cli",
                    "intake",
                    "--kube-url",
                    api.url,
                    "--address",
                    server.address,
                    "--task-queue",
                    queue,
                    "--lease-namespace",
                    "default",
                    "--health-address",
                    f"127.0.0.1:{health}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            try:
                while _get(f"http://127.0.0.1:{health}/readyz") != 200:
                    assert intake.poll() is None, (Path(tmp) / "intake.log").read_text()[-2000:]
                    await asyncio.sleep(0.2)
                synced_rss = memory_mib(intake.pid)
                _, cpu_before = _proc_stats(intake.pid)
                api.clear_journal()
                adopted_at: dict[str, float] = {}
                began = time.monotonic()
                for name, owned in pods.items():
                    for pod in owned:
                        meta = pod["metadata"]
                        api.store.patch(
                            api.store.rtype("Pod"),
                            meta["namespace"],
                            meta["name"],
                            {
                                "spec": {
                                    "containers": [
                                        {
                                            "name": "app",
                                            "resources": {"requests": {"memory": "512Mi"}},
                                        }
                                    ]
                                }
                            },
                            "application/strategic-merge-patch+json",
                        )
                        adopted_at.setdefault(
                            f"rollback/{meta['namespace']}/Deployment/{name}", time.time()
                        )
                adopting = time.monotonic() - began
                client = await TemporalConfig.at(server.address).connect()
                count_query = f'TaskQueue = "{queue}"'
                while (await client.count_workflows(count_query)).count < owners:
                    assert time.monotonic() - began < 600, "not every owner was signalled"
                    await asyncio.sleep(0.5)
                all_started = time.monotonic() - began
                await asyncio.sleep(3)  # anything still queued would be signalled by now
                rss, cpu = _proc_stats(intake.pid)
            finally:
                intake.terminate()
                intake.wait(10)
            starts, handles = [], []
            async for wf in client.list_workflows(count_query):
                starts.append(max(0.0, wf.start_time.timestamp() - adopted_at[wf.id]))
                handles.append(client.get_workflow_handle(wf.id, run_id=wf.run_id))
            limit = asyncio.Semaphore(50)

            async def signals(handle: Any) -> int:
                async with limit:
                    return actions.shape((await handle.fetch_history()).events)["signals"]

            received = await asyncio.gather(*(signals(h) for h in handles))
            requests = Counter(r.verb for r in api.journal)
            floor_rate = await _bare_signal_with_starts(client, owners)
    starts.sort()
    p50, p99 = statistics.median(starts), starts[min(len(starts) - 1, int(len(starts) * 0.99))]
    say(
        lines,
        f"  {owners * per_owner} pods of {owners} Deployments adopting at once (the adoption"
        f" patches took {adopting:.1f}s to make): every owner's workflow started {all_started:.1f}s"
        f" after the first; adoption -> workflow started p50 {p50 * 1000:.0f} ms, p99"
        f" {p99 * 1000:.0f} ms (target p99 <= 5 s{met(p99 <= 5)})",
    )
    say(
        lines,
        f"    the floor, on the same server: a bare client signal-with-starting {owners} workflows,"
        f" {MAX_CONCURRENT_SIGNALS} at a time, as the intake does: {floor_rate:.0f}/s, so"
        f" {owners / floor_rate:.1f}s for all (the intake: {owners / all_started:.0f}/s,"
        f" {owners / all_started / floor_rate:.2f}x the floor; target >= 0.9x"
        f"{met(owners / all_started >= 0.9 * floor_rate)})",
    )
    say(
        lines,
        f"    signals per owner: {sum(received) / len(received):.2f} (max {max(received)}); intake"
        f" requests during the burst: {dict(sorted(requests.items()))}",
    )
    say(
        lines,
        f"    intake process: CPU {cpu - cpu_before:.1f}s for the burst"
        f" ({(cpu - cpu_before) / (owners * per_owner) * 1000:.2f} ms per pod); RSS {synced_rss:.0f} MiB"
        f" once synced with {owners} owners, {owners} ReplicaSets and {owners * per_owner} pods cached,"
        f" peak {rss:.0f} MiB",
    )


async def _bare_signal_with_starts(client: Client, count: int) -> float:
    """Signal-with-starts per second from a bare client, as many at once as the intake sends."""
    limit = asyncio.Semaphore(MAX_CONCURRENT_SIGNALS)
    run = uuid.uuid4().hex[:6]

    async def one(i: int) -> None:
        owner = OwnerRef(namespace="floor", kind=WorkloadKind.DEPLOYMENT, name=f"f{run}-{i}")
        async with limit:
            await observe(client, f"bench-floor-{run}", owner, REC)

    began = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(count)))
    return count / (time.monotonic() - began)


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


SECTIONS = ("cost", "memory", "burst", "status", "p4", "p2", "p1", "versioning", "sqlite", "p3")


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke check for CI")
    parser.add_argument("--write", action="store_true", help="write bench/RESULTS.md")
    parser.add_argument("--p1", default="100,1000", help="P1 sizes (default 100,1000)")
    parser.add_argument(
        "--windows", default="20s,5m,1h", help="cost: window lengths (default 20s,5m,1h)"
    )
    parser.add_argument("--p3", type=int, default=5_000, help="P3 workloads (default 5000)")
    parser.add_argument(
        "--soak", type=int, default=1_000, help="soak workloads (default 1000; --only soak)"
    )
    parser.add_argument(
        "--only",
        default=",".join(SECTIONS),
        help=f"sections to run (default {','.join(SECTIONS)}; also: soak, the chaos soak)",
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
    if "cost" in only:
        say(lines, "## Cost of one successful attempt by window length")
        asyncio.run(attempt_cost(["2s", "6s"] if quick else args.windows.split(","), lines))
        asyncio.run(attempt_paths(lines))
        say(lines)
    if "memory" in only:
        say(lines, "## Memory: what one cached workflow costs the worker, by workflow runner")
        workflow_memory(100 if quick else 2_000, lines)
        say(lines)
    if "burst" in only:
        say(lines, "## Burst: pods adopting at once, through the intake")
        asyncio.run(burst(50 if quick else 5_000, 2, lines))
        say(lines)
    if "status" in only:
        say(lines, "## Policy status: writes during a burst")
        asyncio.run(status_writes(40 if quick else 200, 4 if quick else 10, lines))
        status_pass(1_000 if quick else 5_000, 100, lines)
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
        with scratch_server() as server:
            asyncio.run(throughput(server.address, sizes, 2 if quick else 3, lines))
        say(lines)
    if "versioning" in only:
        say(lines, "## Worker Versioning: a pinned, versioned worker vs an unversioned one")
        with scratch_server() as server:
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
    if "soak" in only:
        say(lines, "## Soak: many workloads, many faults at once, an oracle")
        result = asyncio.run(soak(20 if quick else args.soak))
        for line in soak_report(result):
            say(lines, line)
        say(lines)
    if args.write:
        stamp = f"Command: `{command}` on this machine, {datetime.now(UTC):%Y-%m-%d}."
        RESULTS.write_text(
            merge_results(RESULTS.read_text() if RESULTS.exists() else "", lines, stamp)
        )
        print(f"\nwrote {RESULTS}")
    return 0


def _sections(text: str) -> tuple[list[str], dict[str, list[str]]]:
    """(the lines before the first ``## ``, each ``## `` section's lines by heading)."""
    head: list[str] = []
    sections: dict[str, list[str]] = {}
    current = head
    for line in text.splitlines():
        if line.startswith("## "):
            current = sections.setdefault(line, [])
        else:
            current.append(line)
    return head, sections


def merge_results(old: str, lines: Lines, stamp: str) -> str:
    """RESULTS.md with the sections of this run replaced (each stamped with its command and
    date) and the others kept as they were, so one section can be re-measured on its own.
    Sections are written in the order the benchmark runs them, the hot-path list last."""
    _, kept = _sections(old)
    _, fresh = _sections("\n".join(lines))
    for heading, body in fresh.items():
        content = [line for line in body if line.strip() and not line.startswith("Command: ")]
        kept[heading] = [stamp, *content]
    out = ["# Benchmark results", "", f"Machine: {machine()}.", ""]
    for heading in sorted(kept, key=_position):
        out += [heading, *[line for line in kept[heading] if line.strip()], ""]
    return "\n".join(out).rstrip() + "\n"


# The order of the sections in RESULTS.md.
HEADINGS = (
    "## Cost",
    "## Memory",
    "## Burst",
    "## Policy status",
    "## P4",
    "## P2",
    "## P1",
    "## Worker",
    "## SQL",
)
HEADINGS_AFTER = ("## P3", "## Hot-path")


def _position(heading: str) -> int:
    known = HEADINGS + HEADINGS_AFTER
    return next((i for i, h in enumerate(known) if heading.startswith(h)), len(known) - 1)


if __name__ == "__main__":
    sys.exit(main())
