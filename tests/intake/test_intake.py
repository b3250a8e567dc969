"""The intake against the API emulator and the real Temporal dev server, with the real worker."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from kubernetes.client import CoreV1Api, CustomObjectsApi
from temporalio.client import Client
from temporalio.converter import decode_search_attributes
from temporalio.testing import WorkflowEnvironment

from activities.clusters import ClusterGuard
from sim.apiserver import Fault, KubeEmulator
from tests import CLUSTER
from tests.activity.builders import NS, controlled_by, owner, pod, policy
from tests.workflow.helpers import terminate_running
from worker.intake import Intake, causes
from worker.kube import activities_for, api_client
from worker.leader import LeaderElector
from worker.runner import build_worker
from worker.temporal import run_summary
from workflows.activity_api import OwnerRef, rollback_id
from workflows.contract import ROLLBACK_STATE_ANNOTATION, Actuation, EventReason, Mode, WorkloadKind
from workflows.fingerprint import Recommendation
from workflows.rollback import RollbackResult, RollbackWorkflow
from workflows.state import OwnerState
from workflows.wake import Trigger

KEY = "static.rightsizing.kubex.ai/desired-resource-requests"
HASHED = "static.rightsizing.kubex.ai/h77aa01-desired-resource-requests"
REC = Recommendation(requests_key=KEY, requests={"app": {"memory": "512Mi"}})
WEB = {"app": "web"}
REF = OwnerRef(namespace=NS, kind=WorkloadKind.DEPLOYMENT, name="web")


@dataclass
class Env:
    api: KubeEmulator
    intake: Intake
    client: Client
    queue: str

    async def result(self) -> RollbackResult:
        # The workflow ID is the same in every test: the latest run is this test's only once
        # every signal the intake counted has been accepted by Temporal (it counts on queueing).
        await eventually(lambda: not self.intake.sightings.undelivered)
        return await self.client.get_workflow_handle_for(
            RollbackWorkflow.run, rollback_id(CLUSTER, REF)
        ).result()

    async def runs(self) -> int:
        query = f'WorkflowId = "{rollback_id(CLUSTER, REF)}" AND TaskQueue = "{self.queue}"'
        return len([wf async for wf in self.client.list_workflows(query)])

    def events(self) -> list[str]:
        items, _ = self.api.store.list_objects(self.api.store.rtype("Event"), NS)
        items.sort(key=lambda e: int(e["metadata"]["resourceVersion"]))
        return [e["reason"] for e in items]


def deployment(api: KubeEmulator, replicas: int = 2) -> dict:  # type: ignore[type-arg]
    dep = api.store.create(owner("Deployment", replicas=replicas))
    rs = api.store.create(
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {"name": "web-1", "namespace": NS, "ownerReferences": [controlled_by(dep)]},
            "spec": {"selector": {"matchLabels": WEB}},
        }
    )
    return controlled_by(rs)


def add_pods(api: KubeEmulator, rs_ref: dict, names: list[str], rec: Recommendation = REC) -> None:  # type: ignore[type-arg]
    for name in names:
        api.store.create(pod(name, WEB, memory="512Mi", rec=rec, owner_ref=rs_ref))


async def eventually(check: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError("condition never held")
        await asyncio.sleep(0.05)


@pytest.fixture
async def env(temporal_env: WorkflowEnvironment) -> AsyncIterator[Env]:
    with KubeEmulator() as api:
        kube = api_client(url=api.url)
        queue = f"intake-{uuid.uuid4().hex[:6]}"
        intake = Intake(
            CoreV1Api(kube),
            CustomObjectsApi(kube),
            temporal_env.client,
            CLUSTER,
            queue,
            asyncio.get_running_loop(),
        )
        async with build_worker(
            temporal_env.client,
            queue,
            activities_for(kube, Actuation.ANNOTATIONS),
            ClusterGuard(CLUSTER),
        ):
            yield Env(api, intake, temporal_env.client, queue)
            await asyncio.to_thread(intake.stop)
            await terminate_running(temporal_env.client, queue)


async def started(env: Env) -> None:
    await asyncio.to_thread(env.intake.start)


async def handled_so_far(env: Env) -> None:
    """Every pod event before now has been handled: the informer handles events one at a time
    in watch order, so once it has moved on to a marker pod created now, the rest are done (a
    negative check waits for this, not for a while)."""
    marker = env.api.store.create(pod(f"marker-{uuid.uuid4().hex[:6]}", {"marker": "1"}))
    version = int(marker["metadata"]["resourceVersion"])
    pods = next(i for i in env.intake.informers.running if i.name == "pods")
    await eventually(lambda: int(pods.resource_version or 0) >= version)


async def test_adoption_starts_exactly_one_workflow_and_duplicates_none(env: Env) -> None:
    env.api.store.create(policy(monitoringPeriod="2s"))
    await started(env)
    add_pods(env.api, deployment(env.api), ["web-a", "web-b"])
    # One signal per (owner, fingerprint): the second pod of the rollout adds nothing.
    await eventually(lambda: env.intake.stats["signals"] + env.intake.stats["deduplicated"] == 2)
    assert env.intake.stats["signals"] == 1
    assert (await env.result()).mode is Mode.MONITORING_SUCCEEDED
    assert await env.runs() == 1
    # The run starts showing the attempt it opens (turn 1, in monitoring, under the policy): its
    # only upsert is its verdict's.
    history = await env.client.get_workflow_handle(rollback_id(CLUSTER, REF)).fetch_history()
    first = history.events[0].workflow_execution_started_event_attributes
    shown = decode_search_attributes(first.search_attributes)
    assert (shown["RollbackMode"], shown["RollbackTurn"], shown["RollbackPolicy"]) == (
        ["monitoring"],
        [1],
        ["RollbackPolicy/shop/p"],
    )
    upserts = [
        e
        for e in history.events
        if e.HasField("upsert_workflow_search_attributes_event_attributes")
    ]
    assert len(upserts) == 1
    # Its summary in the UI says which attempt it opened and why.
    summary = json.loads(history.events[0].user_metadata.summary.data)
    assert summary in {
        f"{REF} in {CLUSTER}: turn 1 of {REC.fingerprint}, pod {pod} adopted it"
        for pod in ("web-a", "web-b")
    }, summary
    # Updates that change nothing about adoption signal nothing.
    pods = env.api.store.rtype("Pod")
    env.api.store.patch(
        pods,
        NS,
        "web-a",
        {"metadata": {"labels": {"touched": "1"}}},
        "application/merge-patch+json",
    )
    env.api.store.patch(
        pods, NS, "web-b", {"status": {"phase": "Running"}}, "application/merge-patch+json"
    )
    await handled_so_far(env)
    assert env.intake.stats["signals"] == 1 and await env.runs() == 1


async def test_no_policy_retains(env: Env, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="worker.intake.sightings")
    await started(env)
    add_pods(env.api, deployment(env.api), ["web-a", "web-b"])
    await eventually(lambda: env.intake.stats["retained"] == 2)
    assert env.intake.stats["signals"] == 0 and await env.runs() == 0
    # The troubleshooting page's log line, once for the recommendation, not once per pod.
    told = [r.getMessage() for r in caplog.records if "retained, not monitored" in r.getMessage()]
    assert len(told) == 1 and told[0].startswith(f"{NS}/Deployment/web: pod web-")
    annotations = (
        env.api.store.get(env.api.store.rtype("Deployment"), NS, "web")["metadata"].get(
            "annotations"
        )
        or {}
    )
    assert ROLLBACK_STATE_ANNOTATION not in annotations


@pytest.mark.parametrize("reopen", [True, False], ids=["reopen-on", "reopen-off"])
async def test_replacement_pod_reopens_only_when_enabled(env: Env, reopen: bool) -> None:
    env.api.store.create(policy(monitoringPeriod="2s", enableMonitoringReopen=reopen))
    await started(env)
    rs = deployment(env.api, replicas=1)
    add_pods(env.api, rs, ["web-a"])
    await eventually(lambda: env.intake.stats["signals"] == 1)
    assert (await env.result()).mode is Mode.MONITORING_SUCCEEDED
    await asyncio.sleep(1.1)  # creationTimestamp has a one-second resolution
    add_pods(env.api, rs, ["web-replacement"])
    if reopen:
        await eventually(lambda: env.intake.stats["signals"] == 2)
    else:  # the intake applies the workflow's wake rule: nothing to signal, no empty run
        await eventually(lambda: env.intake.stats["already_settled"] == 1)
        assert env.intake.stats["signals"] == 1
    await eventually(lambda: len(env.events()) >= (4 if reopen else 2))
    assert (await env.result()).mode is Mode.MONITORING_SUCCEEDED
    assert await env.runs() == (2 if reopen else 1)
    expected = [EventReason.MONITORING_STARTED, EventReason.MONITORING_SUCCEEDED] * (
        2 if reopen else 1
    )
    assert env.events() == expected


async def test_key_change_restarts_monitoring(env: Env) -> None:
    env.api.store.create(policy(monitoringPeriod="2s"))
    await started(env)
    add_pods(env.api, deployment(env.api, replicas=1), ["web-a"])
    await eventually(lambda: env.intake.stats["signals"] == 1)
    await env.result()
    moved = Recommendation(requests_key=HASHED, requests=REC.requests)
    env.api.store.patch(
        env.api.store.rtype("Pod"),
        NS,
        "web-a",
        {"metadata": {"annotations": {KEY: None, HASHED: json.dumps(REC.requests)}}},
        "application/merge-patch+json",
    )
    await eventually(lambda: env.intake.stats["signals"] == 2)
    await eventually(lambda: len(env.events()) == 4)
    result = await env.result()
    assert (result.mode, result.fingerprint) == (Mode.MONITORING_SUCCEEDED, moved.fingerprint)


def settled_state(mode: Mode, since: timedelta = timedelta(minutes=-1)) -> str:
    """A stored state whose last transition was ``-since`` ago (the pods are newer when > 0)."""
    return OwnerState(
        mode=mode,
        active_recommendation_fingerprint=REC.fingerprint,
        turn=1,
        last_transition_time=datetime.now(UTC) - since,
    ).to_json()


@pytest.mark.parametrize(
    ("stored", "since", "signals"),
    [
        pytest.param(Mode.MONITORING_SUCCEEDED, timedelta(minutes=-1), 0, id="succeeded"),
        pytest.param(Mode.BACKED_OFF, timedelta(minutes=-1), 1, id="backed-off"),
        pytest.param(Mode.MONITORING_SUCCEEDED, timedelta(minutes=5), 1, id="succeeded-newer"),
        # The wake rule the workflow applies too: a cancel sticks even for newer pods.
        pytest.param(Mode.CANCELLED, timedelta(minutes=5), 0, id="cancelled-newer"),
        pytest.param(Mode.FAILED_PERMANENT, timedelta(minutes=5), 0, id="failed-newer"),
    ],
)
async def test_restart_does_not_wake_settled_owners(
    env: Env, stored: Mode, since: timedelta, signals: int
) -> None:
    env.api.store.create(policy(monitoringPeriod="2s"))
    rs = deployment(env.api, replicas=3)
    env.api.store.patch(
        env.api.store.rtype("Deployment"),
        NS,
        "web",
        {"metadata": {"annotations": {ROLLBACK_STATE_ANNOTATION: settled_state(stored, since)}}},
        "application/merge-patch+json",
    )
    add_pods(env.api, rs, ["web-a", "web-b", "web-c"])  # all there before the intake starts
    await started(env)
    await eventually(lambda: env.intake.stats["adoptions"] == 3)
    await handled_so_far(env)  # the relist's batch has been flushed before the marker's event
    assert env.intake.stats["signals"] == signals  # batched: one per owner, not one per pod
    if stored is Mode.BACKED_OFF:
        result = await env.result()
        assert result.turn == 2  # backedOff + the same fingerprint adopted again: the next turn
    if stored is Mode.MONITORING_SUCCEEDED and signals:
        result = await env.result()  # newer pods reopen the succeeded turn
        assert (result.mode, result.turn) == (Mode.MONITORING_SUCCEEDED, 1)


async def test_watch_resumes_after_the_connection_drops(env: Env) -> None:
    env.api.store.create(policy(monitoringPeriod="2s"))
    await started(env)
    rs = deployment(env.api, replicas=1)
    pods_informer = env.intake.informers.running[-1]
    await eventually(lambda: env.api.store.watching("Pod") == 1)
    env.api.store.drop_watches()
    await eventually(lambda: pods_informer.watches >= 2 and env.api.store.watching("Pod") == 1)
    add_pods(env.api, rs, ["web-after-drop"])
    await eventually(lambda: env.intake.stats["signals"] == 1)
    assert pods_informer.relists == 1  # resumed from its resourceVersion, no relist


async def test_malformed_annotation_leaves_an_event(env: Env) -> None:
    env.api.store.create(policy())
    await started(env)
    rs = deployment(env.api)
    bad = pod("web-bad", WEB, annotations={KEY: "{oops"}, owner_ref=rs)
    env.api.store.create(bad)
    await eventually(lambda: env.intake.stats["malformed"] == 1)
    await eventually(lambda: EventReason.RECOMMENDATION_MALFORMED in env.events())
    assert env.intake.stats["signals"] == 0


async def test_a_policy_being_validated_holds_no_other_namespaces_adoption(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tenant's policy is validated off the intake's lock, which every adoption takes: while
    its validation is held open (here, for as long as the test likes), another namespace's pod is
    adopted and its attempt runs to its verdict. A hostile query is also refused within its
    bounds before it is parsed (tests/unit/test_promql.py); this is what is left to any cost."""
    env.api.store.create(policy(monitoringPeriod="2s"))
    await started(env)
    entered, release = threading.Event(), threading.Event()
    real = causes.policy_change

    def held_open(event: str, obj: dict, before: tuple[object, ...] | None) -> causes.PolicyChange:  # type: ignore[type-arg]
        if obj["metadata"]["name"] == "hostile":
            entered.set()
            release.wait(60)
        return real(event, obj, before)

    monkeypatch.setattr(causes, "policy_change", held_open)
    hostile = policy(name="hostile", healthChecks={"queries": [{
        "name": "deep", "healthyWhen": "<", "threshold": 1,
        "promql": "(" * 800 + 'x{namespace="$namespace"}' + ")" * 800,
    }]})  # fmt: skip
    hostile["metadata"]["namespace"] = "tenant-x"
    env.api.store.create(hostile)
    assert await asyncio.to_thread(entered.wait, 15)
    try:
        add_pods(env.api, deployment(env.api), ["web-a", "web-b"])
        await eventually(lambda: env.intake.stats["signals"] == 1)  # this test's run started
        assert (await env.result()).mode is Mode.MONITORING_SUCCEEDED
        assert not release.is_set()  # decided while the hostile policy was still in validation
    finally:
        release.set()
    await eventually(lambda: env.intake.stats["invalid_policies"] == 1)


def test_leader_election_with_two_candidates() -> None:
    with KubeEmulator() as api:
        custom = CustomObjectsApi(api_client(url=api.url))
        log: list[str] = []

        def candidate(name: str) -> LeaderElector:
            return LeaderElector(
                custom,
                "default",
                "intake",
                name,
                on_started=lambda: log.append(f"{name}+"),
                on_stopped=lambda: log.append(f"{name}-"),
                lease_duration=1.5,
                renew_deadline=1.0,
                retry_period=0.2,
            )

        a, b = candidate("a").start(), candidate("b").start()
        deadline = time.monotonic() + 5
        while not (a.leading.is_set() or b.leading.is_set()) and time.monotonic() < deadline:
            time.sleep(0.05)
        first, other = (a, b) if a.leading.is_set() else (b, a)
        # The other candidate tries again twice while the first holds the Lease, and loses.
        tried = other.attempts
        deadline = time.monotonic() + 5
        while other.attempts < tried + 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert other.attempts >= tried + 2
        leaders = [e for e in (a, b) if e.leading.is_set()]
        assert leaders == [first]
        first.stop(release=False)  # a crash: the Lease is left to expire
        deadline = time.monotonic() + 6
        while not other.leading.is_set() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert other.leading.is_set()
        other.stop()
        lease = api.store.get(api.store.rtype("Lease"), "default", "intake")
        assert lease["spec"]["holderIdentity"] == ""  # released on a clean stop
        assert lease["spec"]["leaseTransitions"] == 1
        assert log[0].endswith("+") and sum(1 for e in log if e.endswith("+")) == 2


def test_leader_election_survives_a_failing_api_server() -> None:
    """Timeouts and errors on the Lease: the candidate keeps campaigning and then leads."""
    with KubeEmulator() as api:
        api.inject(Fault(status=None, delay=1.0, path="/leases", times=2))  # two timeouts
        api.inject(Fault(status=500, method="POST", path="/leases"))
        custom = CustomObjectsApi(api_client(url=api.url, read_timeout=0.3))
        started = threading.Event()
        elector = LeaderElector(
            custom, "default", "intake", "a", started.set, lambda: None, retry_period=0.1
        ).start()
        try:
            assert started.wait(10)
            assert elector._thread is not None and elector._thread.is_alive()
            assert [f.hits for f in api.faults] == [2, 1]
        finally:
            elector.stop()


async def test_owners_come_from_the_watch_cache_not_gets(env: Env) -> None:
    env.api.store.create(policy(monitoringPeriod="2s"))
    await started(env)
    rs = deployment(env.api, replicas=3)
    workloads = env.intake.owners
    await eventually(lambda: (NS, "web-1") in workloads.parents["ReplicaSet"].cache)
    await eventually(lambda: (NS, "web") in workloads.owners[WorkloadKind.DEPLOYMENT].cache)
    env.api.clear_journal()
    add_pods(env.api, rs, ["web-a", "web-b", "web-c"])
    await eventually(lambda: env.intake.stats["signals"] + env.intake.stats["deduplicated"] == 3)
    assert (await env.result()).mode is Mode.MONITORING_SUCCEEDED
    # The ReplicaSet and the Deployment were known from their watches: no GET of either by the
    # intake (the worker's activities read the Deployment, never the ReplicaSet).
    assert env.api.requests("get", "/replicasets/") == []
    assert env.intake.stats["signals"] == 1
    # The caches keep a projection, not the objects: a pod is its name and uid; an owner its
    # name, uid (for the Events on it), labels and the engine's annotations.
    cached = workloads.owners[WorkloadKind.DEPLOYMENT].cache[(NS, "web")]
    assert set(cached["metadata"]) <= {"name", "namespace", "uid", "labels", "annotations"}
    assert "spec" not in cached
    pods = next(i for i in env.intake.informers.running if i.name == "pods")
    assert pods.cache[(NS, "web-a")] == {
        "metadata": {
            "name": "web-a",
            "namespace": NS,
            "uid": pods.cache[(NS, "web-a")]["metadata"]["uid"],
        }
    }


async def test_a_kind_the_cluster_does_not_serve_is_absent_not_failing(env: Env) -> None:
    # KubeAI is not installed: its LIST answers 404, every time.
    env.api.inject(Fault(status=404, method="GET", path="/apis/kubeai.org/", times=None))
    env.api.store.create(policy(monitoringPeriod="2s"))
    await started(env)
    models = env.intake.owners.owners[WorkloadKind.MODEL]
    assert models.absent and models.synced.is_set()
    assert env.intake.informers.problems(stuck_after=0) == []  # ready: nothing is failing
    add_pods(env.api, deployment(env.api, replicas=1), ["web-a"])  # other kinds work as ever
    await eventually(lambda: env.intake.stats["signals"] == 1)
    assert (await env.result()).mode is Mode.MONITORING_SUCCEEDED


async def test_a_turn_backed_off_on_pods_that_never_left_the_recommendation_goes_on(
    env: Env,
) -> None:
    """The rollback is published on the owner, but nothing recreates the pods before the turn
    ends ``backedOff`` and its re-apply clears it: the pods never left the recommendation, so
    no pod adopts it again. The next turn still starts: the intake looks at the owner's pods
    that run it when the state turns ``backedOff`` (soak run 5 at 1,000 workloads, its
    ``wrongEnd 4``)."""
    env.api.store.create(policy(monitoringPeriod="2s", rollbackTarget="manifest"))
    await started(env)
    rs = deployment(env.api, replicas=2)
    for name in ["web-a", "web-b"]:  # on the recommendation, never Ready: each turn fails
        env.api.store.create(pod(name, WEB, memory="512Mi", rec=REC, owner_ref=rs, ready=False))
    dep = env.api.store.rtype("Deployment")

    def stored() -> OwnerState | None:
        raw = (env.api.store.get(dep, NS, "web")["metadata"].get("annotations") or {}).get(
            ROLLBACK_STATE_ANNOTATION
        )
        return OwnerState.model_validate_json(raw) if raw else None

    def ended() -> bool:
        state = stored()
        return state is not None and state.mode is Mode.FAILED_PERMANENT

    try:
        await eventually(ended, timeout=30)
    except TimeoutError:
        pytest.fail(f"the owner stayed at {stored()!r}")
    state = stored()
    assert state is not None and state.turn == 2  # maxAttempts 2: both turns ran
    assert env.intake.stats["signals"] == 2  # the adoption, then the backed-off turn's pods
    assert await env.runs() == 2


def test_each_run_says_in_its_summary_which_attempt_it_opens_and_why() -> None:
    def said(trigger: Trigger, turn: int | None, pod: str | None) -> str:
        return run_summary(CLUSTER, REF, REC, trigger, turn, pod)

    attempt = f"{REF} in {CLUSTER}: turn"
    assert (
        said(Trigger.OBSERVE, 1, "web-a")
        == f"{attempt} 1 of {REC.fingerprint}, pod web-a adopted it"
    )
    assert said(Trigger.OBSERVE, 2, "web-a") == (
        f"{attempt} 2 of {REC.fingerprint}, the next turn after backing off; pod web-a adopted it"
    )
    assert said(Trigger.REOPEN, 1, None) == f"{attempt} 1 of {REC.fingerprint}, reopened"
    assert said(Trigger.OBSERVE, None, None) == (
        f"{REF} in {CLUSTER}: an attempt of {REC.fingerprint}, its pods adopted it"
    )


async def test_a_pod_that_failed_before_its_owners_window_opened_is_suspected_when_it_opens(
    env: Env,
) -> None:
    """A pod is OOM-killed (and crash-loops) before the intake's owner cache shows the window
    open: its own event is no suspicion then, and its next one is a restart backoff away. The
    owner's window opening tells the run (CI at 143311f: an early verdict 10 s late)."""
    env.api.store.create(policy(monitoringPeriod="1h", earlyVerdict={"confirmationPeriod": "3s"}))
    await started(env)
    rs = deployment(env.api, replicas=1)
    killed = {"terminated": {"reason": "OOMKilled", "finishedAt": "2026-12-06T12:00:00Z"}}
    env.api.store.create(pod("web-a", WEB, ready=False, last_state=killed, owner_ref=rs))
    await handled_so_far(env)
    assert env.intake.stats["suspects"] == 0  # no window yet: no run to tell
    opened = OwnerState(
        mode=Mode.MONITORING,
        active_recommendation_fingerprint=REC.fingerprint,
        turn=1,
        last_transition_time=datetime(2026, 12, 6, 12, 0, 1, tzinfo=UTC),
    )
    env.api.store.patch(
        env.api.store.rtype("Deployment"), NS, "web",
        {"metadata": {"annotations": {ROLLBACK_STATE_ANNOTATION: opened.to_json()}}},
        "application/merge-patch+json",
    )  # fmt: skip
    await eventually(lambda: env.intake.stats["suspects"] == 1)
