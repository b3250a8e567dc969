"""``rollbackctl get|describe|cancel|reopen`` against the real Temporal dev server."""

from __future__ import annotations

import asyncio
import json
import queue as queue_module
import signal
import subprocess
import sys
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
import yaml
from temporalio.testing import WorkflowEnvironment

from activities.clusters import ClusterGuard
from cli.main import main
from sim.apiserver import KubeEmulator, free_port
from tests import CLUSTER
from tests.conftest import policy_doc
from tests.workflow.fake_cluster import FakeCluster
from tests.workflow.helpers import new_owner, rec, running_worker, settings, wait_for
from worker.runner import build_worker
from worker.temporal import observe
from workflows.activity_api import OwnerRef, rollback_id
from workflows.contract import ROLLBACK_STATE_ANNOTATION, FailureReason, Mode, WorkloadKind
from workflows.rollback import RollbackInput, RollbackWorkflow
from workflows.state import HistoryEntry, OwnerState


async def cli(
    capsys: pytest.CaptureFixture[str], env: WorkflowEnvironment, queue: str, *argv: str
) -> tuple[int, str]:
    address = env.client.service_client.config.target_host
    code = await asyncio.to_thread(main, [*argv, "--address", address, "--task-queue", queue])
    return code, capsys.readouterr().out


async def test_get_describe_cancel_reopen(
    temporal_env: WorkflowEnvironment, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster, queue = FakeCluster(), f"cli-{uuid.uuid4().hex[:6]}"
    ref, owner = new_owner(cluster, settings(window=60))
    recommendation = rec("768Mi")
    owner.apply(recommendation)
    async with running_worker(temporal_env.client, queue, cluster):
        handle = await observe(temporal_env.client, CLUSTER, queue, ref, recommendation)
        await wait_for(handle, lambda s: s.baseline is not None)

        code, out = await cli(capsys, temporal_env, queue, "get", "-n", "shop", "-o", "json")
        rows = {r["workload"]: r for r in json.loads(out)}
        assert (
            code == 0
            and rows[ref.workload]["mode"] == "monitoring"
            and rows[ref.workload]["turn"] == 1
        )
        assert rows[ref.workload]["policy"] == "RollbackPolicy/shop/short"

        code, out = await cli(capsys, temporal_env, queue, "describe", str(ref))
        assert code == 0
        assert (
            "Mode:         monitoring (turn 1)" in out and "Baseline:     5 pods, 4 required" in out
        )
        # No cluster given: the live cohort is not read, and describe says how to ask for it.
        assert "Cohort now:   not read (no cluster given" in out

        code, out = await cli(capsys, temporal_env, queue, "get", "-A", "-o", "wide")
        assert (
            code == 0 and "WORKFLOW ID" in out.splitlines()[0] and rollback_id(CLUSTER, ref) in out
        )
        code, out = await cli(capsys, temporal_env, queue, "get", "-o", "yaml")
        # Other tests' workflows share this dev server: find ours among them.
        mine = [r for r in yaml.safe_load(out) if r["workload"] == ref.workload]
        assert code == 0 and [r["mode"] for r in mine] == ["monitoring"]
        code, out = await cli(capsys, temporal_env, queue, "get", "-n", "shop", "-o", "name")
        kind = ref.kind.value.lower()
        assert code == 0 and f"{kind}.apps/{ref.name}" in out.splitlines(), out

        code, out = await cli(
            capsys, temporal_env, queue, "cancel", str(ref), "--reason", "maintenance"
        )
        assert code == 0
        assert (await handle.result()).mode is Mode.CANCELLED

        code, out = await cli(capsys, temporal_env, queue, "get", "--mode", "cancelled")
        assert code == 0 and ref.workload in out and "cancelled" in out

        code, _ = await cli(capsys, temporal_env, queue, "cancel", str(ref))
        assert code == 1  # not running: said on stderr

        code, out = await cli(capsys, temporal_env, queue, "reopen", str(ref))
        # Read back, not just sent: the new run's window is open when reopen answers.
        assert (
            code == 0 and f"{rollback_id(CLUSTER, ref)}: reopened, turn 1; the window ends" in out
        )
        reopened = temporal_env.client.get_workflow_handle_for(
            RollbackWorkflow.run, rollback_id(CLUSTER, ref)
        )
        state = await wait_for(
            reopened, lambda s: s.mode is Mode.MONITORING and s.baseline is not None
        )
        assert state.turn == 1 and owner.state is not None and owner.state.mode is Mode.MONITORING
        await reopened.signal(RollbackWorkflow.cancel, {"reason": "done"})
        await reopened.result()


async def test_describe_unknown_workload(
    temporal_env: WorkflowEnvironment, capsys: pytest.CaptureFixture[str]
) -> None:
    async def error(*argv: str) -> str:
        address = temporal_env.client.service_client.config.target_host
        code = await asyncio.to_thread(main, [*argv, "--address", address, "--task-queue", "q"])
        assert code == 1
        return capsys.readouterr().err.strip()

    hint = "(`rollbackctl get` lists the workloads that have one)"
    unasked = "; the cluster was not asked whether it has it (no cluster given)"
    # kubectl's ways of writing a kind: any case, plural, short name.
    assert await error("describe", "nowhere/deploy/none") == (
        f"error: no rollback attempt recorded for nowhere/Deployment/none in any cluster {hint}"
        + unasked
    )
    assert await error("describe", "nowhere/statefulsets/none", "--cluster", CLUSTER) == (
        f"error: no rollback attempt recorded for nowhere/StatefulSet/none in cluster {CLUSTER}"
        f" {hint}{unasked}"
    )
    # With a cluster to ask, a misspelt name and a workload never resized read apart (in a
    # namespace of their own: the session's Temporal holds other tests' runs of shop's).
    with KubeEmulator() as api:
        for name in ("api", "web"):
            meta = {"name": name, "namespace": "orders"}
            api.store.create({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta})
        misspelt = await error("describe", "orders/deploy/apii", "--kube-url", api.url)
        assert misspelt.endswith(
            "; no Deployment apii in namespace orders of the cluster:"
            " did you mean orders/Deployment/api?"
        ), misspelt
        never = await error("describe", "orders/deploy/web", "--kube-url", api.url)
        assert "; orders/Deployment/web exists in the cluster: no recommendation reached" in never
    assert await error("describe", "nowhere/pods/none") == (
        "error: unknown kind 'pods': one of Deployment, StatefulSet, CronJob, Rollout, Job,"
        " AnalysisRun, DaemonSet, Model, StrimziPodSet (any case, or plural), or a short name:"
        " deploy, sts, ds, cj, ro"
    )
    assert "expected [CLUSTER/]NAMESPACE/KIND/NAME" in await error("describe", "not-a-ref")


async def test_reopen_of_a_failed_workload_retries_it(
    temporal_env: WorkflowEnvironment, capsys: pytest.CaptureFixture[str]
) -> None:
    """The runbook's answer to failedPermanent: ``reopen`` retries from turn 1, read back (it
    once printed "reopen signalled" and exited 0 while nothing happened, then refused)."""
    cluster, queue = FakeCluster(), f"cli-{uuid.uuid4().hex[:6]}"
    ref, owner = new_owner(cluster, settings(window=1))
    oom = rec("256Mi")  # below the fake app's working set: OOMKilled
    owner.apply(oom)
    async with running_worker(temporal_env.client, queue, cluster):
        result = await (await observe(temporal_env.client, CLUSTER, queue, ref, oom)).result()
        assert result.mode is Mode.FAILED_PERMANENT  # lastSuccessful target, none recorded
        address = temporal_env.client.service_client.config.target_host
        argv = ["reopen", str(ref), "--address", address, "--task-queue", queue]
        code = await asyncio.to_thread(main, argv)
        out, err = capsys.readouterr()
        assert code == 0 and f"{rollback_id(CLUSTER, ref)}: reopened, turn 1" in out, err
        again = await temporal_env.client.get_workflow_handle_for(
            RollbackWorkflow.run, rollback_id(CLUSTER, ref)
        ).result()
    assert (again.mode, again.turn) == (Mode.FAILED_PERMANENT, 1)  # still nothing to restore
    query = f'WorkflowId = "{rollback_id(CLUSTER, ref)}" AND TaskQueue = "{queue}"'

    for _ in range(100):  # visibility lags the runs a little
        runs = [wf async for wf in temporal_env.client.list_workflows(query)]
        if len(runs) == 2:
            break
        await asyncio.sleep(0.1)
    assert len(runs) == 2
    # history: both runs, newest first, each where it ended and why.
    code, out = await cli(capsys, temporal_env, queue, "history", str(ref), "--cluster", CLUSTER)
    heading, columns, *lines = out.splitlines()
    assert code == 0 and heading == (
        f"{ref}: 2 line(s), newest first; from Temporal, every run of {rollback_id(CLUSTER, ref)}"
    )
    assert columns.split() == ["STARTED", "RECOMMENDATION", "TURN", "ENDED", "REASON", "RUN"]
    cells = [line.split() for line in lines]
    assert [c[1:] for c in cells] == [
        [oom.fingerprint, "1", "failedPermanent", "rollbackRecommendationUnavailable", "Completed"]
    ] * 2
    assert cells[0][0] >= cells[1][0]  # newest first


async def test_the_same_workload_in_two_clusters(
    temporal_env: WorkflowEnvironment, capsys: pytest.CaptureFixture[str]
) -> None:
    """A fleet on one Temporal: ``get`` names each run's cluster and filters by it; a workload
    named without its cluster is found when one cluster has it, and refused, naming both, when
    two do; ``[CLUSTER/]`` and ``--cluster`` reach the right cluster's run."""
    fake, queues = FakeCluster(), {c: f"cli-{c}-{uuid.uuid4().hex[:4]}" for c in ("us", "eu")}
    ref, owner = new_owner(fake, settings(window=60))
    recommendation = rec("768Mi")
    owner.apply(recommendation)
    workers = [
        build_worker(temporal_env.client, q, fake, ClusterGuard(c)) for c, q in queues.items()
    ]
    async with workers[0], workers[1]:
        handles = {
            c: await observe(temporal_env.client, c, q, ref, recommendation)
            for c, q in queues.items()
        }
        for handle in handles.values():
            await wait_for(handle, lambda s: s.baseline is not None)
        code, out = await cli(capsys, temporal_env, "q", "get", "-o", "json")
        clusters = sorted(r["cluster"] for r in json.loads(out) if r["workload"] == ref.workload)
        assert code == 0 and clusters == ["eu", "us"]
        code, out = await cli(capsys, temporal_env, "q", "get", "--cluster", "eu")
        assert (
            code == 0
            and ref.workload in out
            and all(line.startswith("eu ") for line in out.splitlines()[1:])
        ), out

        address = temporal_env.client.service_client.config.target_host
        code = await asyncio.to_thread(main, ["describe", str(ref), "--address", address])
        err = capsys.readouterr().err
        assert code == 1 and f"{ref} has attempts in clusters eu, us: name one" in err, err
        code, out = await cli(capsys, temporal_env, "q", "describe", f"us/{ref}")
        assert code == 0 and "Cluster:      us" in out and rollback_id("us", ref) in out
        code, out = await cli(capsys, temporal_env, "q", "cancel", str(ref), "--cluster", "eu")
        assert code == 0 and f"{rollback_id('eu', ref)}: cancel taken in monitoring" in out
        assert (await handles["eu"].result()).mode is Mode.CANCELLED
        assert (await handles["us"].describe()).status.name == "RUNNING"  # untouched
        await handles["us"].signal(RollbackWorkflow.cancel, {"reason": "done"})
        await handles["us"].result()


async def test_upgrade_check_waits_for_attempts_started_by_0_1(
    temporal_env: WorkflowEnvironment, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run named for no cluster (0.1's IDs) keeps ``upgrade-check`` at 1, listing it, until it
    ends: the drain the upgrade page prescribes, told by the tool, not guessed."""
    ref = OwnerRef(
        namespace="shop", kind=WorkloadKind.DEPLOYMENT, name=f"old-{uuid.uuid4().hex[:6]}"
    )
    old = await temporal_env.client.start_workflow(
        RollbackWorkflow.run,
        RollbackInput(owner=ref, recommendation=rec("768Mi")),  # 0.1: no cluster
        id=rollback_id("", ref),
        task_queue=f"rightsizing-rollback-0-1-{uuid.uuid4().hex[:4]}",  # its 0.1 worker is away
    )
    address = temporal_env.client.service_client.config.target_host
    code = await asyncio.to_thread(main, ["upgrade-check", "--address", address])
    out = capsys.readouterr().out
    assert code == 1 and f"rollback/shop/Deployment/{ref.name}" in out, out
    await old.terminate("drained")
    for _ in range(50):  # visibility lags the end a little
        code = await asyncio.to_thread(main, ["upgrade-check", "--address", address])
        out = capsys.readouterr().out
        if code == 0:
            break
        await asyncio.sleep(0.1)
    assert code == 0 and "No 0.1 attempt is running" in out, out


async def test_describe_of_a_run_that_ended_before_a_worker_ran_it(
    temporal_env: WorkflowEnvironment, capsys: pytest.CaptureFixture[str]
) -> None:
    """No worker polls its task queue, and the run is terminated: Temporal refuses its query
    ("closed before WorkflowTaskStarted"); describe says what happened instead."""
    queue = f"cli-{uuid.uuid4().hex[:6]}"
    ref = OwnerRef(namespace="orders", kind=WorkloadKind.DEPLOYMENT, name=f"never-{queue}")
    handle = await observe(temporal_env.client, CLUSTER, queue, ref, rec("768Mi"))
    await handle.terminate("no worker came")
    code, out = await cli(capsys, temporal_env, queue, "describe", str(ref), "--cluster", CLUSTER)
    assert code == 0 and out.strip() == (
        f"{rollback_id(CLUSTER, ref)}: Terminated before a worker ran it: no state recorded"
    ), out


async def test_history_without_temporal_reads_the_state_annotation(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Temporal away: the owner's state annotation still tells the newest turns, and says so."""
    at = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)

    def entry(seconds: int, mode: Mode, turn: int, reason: FailureReason | None = None) -> object:
        return HistoryEntry(time=at + timedelta(seconds=seconds), mode=mode, turn=turn,
                            fingerprint="f1", failure_reason=reason)  # fmt: skip

    state = OwnerState(
        mode=Mode.FAILED_PERMANENT, active_recommendation_fingerprint="f1", turn=2,
        failure_reason=FailureReason.OOM_KILLED, last_transition_time=at + timedelta(seconds=9),
        history=[
            entry(0, Mode.MONITORING, 1),
            entry(2, Mode.ROLLING_BACK, 1, FailureReason.OOM_KILLED),
            entry(3, Mode.BACKING_OFF, 1, FailureReason.OOM_KILLED),
            entry(4, Mode.BACKED_OFF, 1),
            entry(6, Mode.MONITORING, 2),
            entry(9, Mode.FAILED_PERMANENT, 2, FailureReason.OOM_KILLED),
        ],
    )  # fmt: skip
    with KubeEmulator() as api:
        meta = {"name": "api", "namespace": "orders",
                "annotations": {ROLLBACK_STATE_ANNOTATION: state.to_json()}}  # fmt: skip
        api.store.create({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta})
        argv = ["history", "orders/deploy/api", "--address", f"127.0.0.1:{free_port()}",
                "--kube-url", api.url]  # fmt: skip
        code = await asyncio.to_thread(main, argv)
    out = capsys.readouterr().out
    heading, _, *lines = out.splitlines()
    assert code == 0 and "from the owner's state annotation" in heading and "unreachable" in heading
    assert [line.split()[1:] for line in lines] == [
        ["f1", "2", "failedPermanent", "oomKilled"],
        ["f1", "1", "backedOff", "-"],
    ]


async def test_get_w_prints_each_transition_as_the_clusters_watch_shows_it(
    temporal_env: WorkflowEnvironment,
) -> None:
    """``get -w``: the table, then a line for each transition the owner's state annotation
    shows, the moment the watch tells it; an owner's other changes (its status) print nothing;
    Ctrl-C ends it with 0."""
    at = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)

    def state(mode: Mode, seconds: int) -> str:
        written = at + timedelta(seconds=seconds)
        return OwnerState(mode=mode, active_recommendation_fingerprint="f1", turn=1,
                          last_transition_time=written).to_json()  # fmt: skip

    with KubeEmulator() as api:
        deployments = api.store.rtype("Deployment")
        meta = {"name": "watched", "namespace": "watching"}
        api.store.create({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta})

        def annotate(**annotations: str) -> None:
            body = {"metadata": {"annotations": annotations}}
            api.store.patch(
                deployments, "watching", "watched", body, "application/merge-patch+json"
            )

        address = temporal_env.client.service_client.config.target_host
        watcher = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "get", "-w", "-n", "watching", "--address", address,
             "--kube-url", api.url, "--cluster", CLUSTER],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        lines: queue_module.Queue[str] = queue_module.Queue()
        assert watcher.stdout is not None
        threading.Thread(target=lambda: [lines.put(x) for x in watcher.stdout], daemon=True).start()
        assert lines.get(timeout=30).strip() == "No rollback workflows found."
        await asyncio.to_thread(eventually_watching, api)
        annotate(**{ROLLBACK_STATE_ANNOTATION: state(Mode.MONITORING, 0)})
        assert lines.get(timeout=30).split()[:3] == ["CLUSTER", "NAMESPACE", "WORKLOAD"]
        first = lines.get(timeout=30).split()
        assert first[:5] == [CLUSTER, "watching", "Deployment/watched", "monitoring", "1"], first
        annotate(unrelated="1")  # not a transition: nothing printed for it ...
        annotate(**{ROLLBACK_STATE_ANNOTATION: state(Mode.CANCELLED, 5)})
        second = lines.get(timeout=30).split()  # ... the next line is the next transition's
        assert second[3] == "cancelled" and "Completed" in second, second
        watcher.send_signal(signal.SIGINT)
        assert watcher.wait(timeout=30) == 0


def eventually_watching(api: KubeEmulator, kind: str = "Deployment") -> None:
    """The watcher's watch of ``kind`` is open (its informer listed): a change now is told."""
    deadline = time.monotonic() + 30
    while api.store.watching(kind) < 1:
        assert time.monotonic() < deadline, f"get -w never watched {kind}"
        time.sleep(0.05)


def test_get_policies_w_prints_a_policy_as_its_watch_tells_it() -> None:
    """``get policies -w``: the policies, then each one that changed when the watch says so."""
    with KubeEmulator() as api:
        api.store.create(policy_doc(name="first"))
        watcher = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "get", "policies", "-w", "-n", "team",
             "--kube-url", api.url],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        lines: queue_module.Queue[str] = queue_module.Queue()
        assert watcher.stdout is not None
        threading.Thread(target=lambda: [lines.put(x) for x in watcher.stdout], daemon=True).start()
        assert lines.get(timeout=30).split()[:2] == ["KIND", "NAMESPACE"]
        assert "first" in lines.get(timeout=30)
        eventually_watching(api, "RollbackPolicy")
        api.store.create(policy_doc(name="second"))
        assert "second" in lines.get(timeout=30).split()
        watcher.send_signal(signal.SIGINT)
        assert watcher.wait(timeout=30) == 0


async def test_get_l_selects_the_workloads_by_their_labels(
    temporal_env: WorkflowEnvironment, capsys: pytest.CaptureFixture[str]
) -> None:
    """``get -l``: Temporal's rows of the workloads whose labels the selector selects, as the
    API server selects them (runs started with no worker: their search attributes suffice)."""
    queue = f"cli-{uuid.uuid4().hex[:6]}"
    with KubeEmulator() as api:
        refs = []
        for name, team in (("api", "a"), ("web", "b")):
            meta = {"name": name, "namespace": "selecting", "labels": {"team": team}}
            api.store.create({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta})
            ref = OwnerRef(namespace="selecting", kind=WorkloadKind.DEPLOYMENT, name=name)
            refs.append(await observe(temporal_env.client, CLUSTER, queue, ref, rec("768Mi")))
        try:
            argv = ["get", "-n", "selecting", "-l", "team in (a)", "-o", "name", "--kube-url",
                    api.url, "--cluster", CLUSTER]  # fmt: skip
            for _ in range(100):  # visibility lags the starts a little
                code, out = await cli(capsys, temporal_env, queue, *argv)
                if out.strip():
                    break
                await asyncio.sleep(0.1)
            assert code == 0 and out.split() == ["deployment.apps/api"], out
            bad = await cli(capsys, temporal_env, queue, *argv[:4], "team in (", *argv[5:])
            assert bad[0] == 1
        finally:
            for handle in refs:
                await handle.terminate("test over")
