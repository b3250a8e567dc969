"""The workflow with the real Kubernetes activities: Temporal dev server + the API emulator."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from kubernetes.client import ApiClient
from temporalio.testing import WorkflowEnvironment

from activities.clusters import ClusterGuard
from cli.main import main as cli_main
from sim.apiserver import Fault, KubeEmulator
from sim.disruption import DisruptionController
from tests import CLUSTER
from tests.activity.builders import NS, owner, pod, policy
from tests.activity.test_budgets import budget
from tests.activity.test_kubernetes_activities import REC as ASKED
from tests.activity.test_kubernetes_activities import restarting_cohort
from tests.workflow.helpers import end_if_running, histories, replay_and_record
from worker.kube import RETRIES, activities_for, api_client
from worker.runner import build_worker
from worker.temporal import observe
from workflows.activity_api import OwnerRef, rollback_id
from workflows.contract import (
    AUTOMATION_ANNOTATION,
    DEFAULT_ENGINE_NAMESPACE,
    PAUSE_UNTIL_ANNOTATION,
    ROLLBACK_REQUESTS_ANNOTATION,
    ROLLBACK_STATE_ANNOTATION,
    Actuation,
    EventReason,
    FailureReason,
    Mode,
    WorkloadKind,
)
from workflows.fingerprint import Recommendation
from workflows.pause import Pause
from workflows.rollback import (
    LOCAL_RETRY,
    CancelSignal,
    ResumeSignal,
    RollbackInput,
    RollbackResult,
    RollbackWorkflow,
)
from workflows.state import OwnerState, ResourceSnapshot
from workflows.wake import Trigger

REC = Recommendation(
    requests_key="static.rightsizing.kubex.ai/desired-resource-requests",
    requests={"app": {"memory": "512Mi"}},
)
WEB = {"app": "web"}
MERGE = "application/merge-patch+json"


@pytest.fixture
def api() -> Iterator[KubeEmulator]:
    with KubeEmulator() as emulator:
        yield emulator


def client_for(api: KubeEmulator) -> ApiClient:
    return api_client(url=api.url)


def events(api: KubeEmulator) -> list[str]:
    items, _ = api.store.list_objects(api.store.rtype("Event"), NS)
    items.sort(key=lambda e: int(e["metadata"]["resourceVersion"]))
    return [e["reason"] for e in items]


async def test_success_writes_state_and_events(
    temporal_env: WorkflowEnvironment, api: KubeEmulator, capsys: pytest.CaptureFixture[str]
) -> None:
    api.store.create(owner("Deployment", replicas=3))
    api.store.create(policy())
    for i in range(3):
        api.store.create(pod(f"web-{i}", WEB, memory="512Mi", rec=REC))
    queue = f"k8s-{uuid.uuid4().hex[:6]}"
    ref = OwnerRef(namespace=NS, kind=WorkloadKind.DEPLOYMENT, name="web")
    acts = activities_for(client_for(api), Actuation.ANNOTATIONS)
    async with build_worker(temporal_env.client, queue, acts, ClusterGuard(CLUSTER)):
        await end_if_running(temporal_env.client, rollback_id(CLUSTER, ref))
        result = await (await observe(temporal_env.client, CLUSTER, queue, ref, REC)).result()
        # describe reads the live cohort itself (the status query needs a worker to replay).
        address = temporal_env.client.service_client.config.target_host
        argv = ["describe", f"{CLUSTER}/{ref}", "--address", address, "--kube-url", api.url]
        argv += ["-o", "json"]
        code = await asyncio.to_thread(cli_main, argv)
    described = json.loads(capsys.readouterr().out)
    assert code == 0 and described["state"]["mode"] == "monitoringSucceeded"
    assert described["cohort"]["adoptedHealthy"] == 3 and described["cohort"]["pods"] == 3
    assert result.mode is Mode.MONITORING_SUCCEEDED
    deployment = api.store.get(api.store.rtype("Deployment"), NS, "web")
    state = OwnerState.model_validate_json(
        deployment["metadata"]["annotations"][ROLLBACK_STATE_ANNOTATION]
    )
    assert (
        state.mode is Mode.MONITORING_SUCCEEDED
        and state.policy is not None
        and state.policy.name == "p"
    )
    assert state.last_successful_state == ResourceSnapshot.of(REC.requests, {})
    assert events(api) == [EventReason.MONITORING_STARTED, EventReason.MONITORING_SUCCEEDED]
    # One LIST of pods for the whole window (the baseline came with the owner), one for describe.
    lists = api.requests("list", "/namespaces/shop/pods$")
    gets = api.requests("get", "/deployments/web$")
    assert len(lists) == 2  # the final sample, and describe's live read
    assert len(gets) <= 5  # load_owner, the final sample, two state writes, describe


async def test_oom_rolls_back_in_place_and_backs_off(
    temporal_env: WorkflowEnvironment, api: KubeEmulator
) -> None:
    good = ResourceSnapshot.of({"app": {"memory": "1Gi"}}, {})
    obj = owner("Deployment", replicas=2)
    obj["metadata"]["annotations"] = {
        ROLLBACK_STATE_ANNOTATION: OwnerState(
            mode=Mode.MONITORING_SUCCEEDED,
            active_recommendation_fingerprint="0" * 16,
            turn=1,
            last_successful_state=good,
            last_transition_time="2026-01-01T00:00:00Z",  # type: ignore[arg-type]
        ).to_json()
    }
    api.store.create(obj)
    api.store.create(policy(backoff={"timePeriod": "1s", "multiplyByTurn": 1, "maxAttempts": 2}))
    oom = {"container_state": {"terminated": {"reason": "OOMKilled"}}, "ready": False}
    for i in range(2):
        api.store.create(pod(f"web-{i}", WEB, memory="512Mi", rec=REC, **oom))
    queue = f"k8s-{uuid.uuid4().hex[:6]}"
    ref = OwnerRef(namespace=NS, kind=WorkloadKind.DEPLOYMENT, name="web")
    acts = activities_for(client_for(api), Actuation.IN_PLACE)
    async with build_worker(temporal_env.client, queue, acts, ClusterGuard(CLUSTER)):
        await end_if_running(temporal_env.client, rollback_id(CLUSTER, ref))
        result = await (await observe(temporal_env.client, CLUSTER, queue, ref, REC)).result()
    assert (result.mode, result.failure_reason) == (Mode.BACKED_OFF, FailureReason.OOM_KILLED)
    assert events(api) == [
        EventReason.MONITORING_STARTED,
        EventReason.ROLLING_BACK_STARTED,
        EventReason.BACKOFF_TURN_COMPLETED,
    ]
    # Rolled back to 1Gi through pods/resize, then re-applied 512Mi for the next turn.
    resizes = api.requests("patch", "/pods/web-0/resize$")
    assert len(resizes) == 2
    annotations = api.store.get(api.store.rtype("Deployment"), NS, "web")["metadata"]["annotations"]
    assert ROLLBACK_REQUESTS_ANNOTATION not in annotations  # cleared when the turn completed
    published = [r for r in api.requests("patch", "/deployments/web$")]
    assert published, "the rollback recommendation was published on the owner"
    message = next(
        e["message"]
        for e in api.store.list_objects(api.store.rtype("Event"), NS)[0]
        if e["reason"] == EventReason.ROLLING_BACK_STARTED
    )
    assert "2/2 pods OOMKilled (app)" in message and "restoring lastSuccessful" in message
    assert json.loads(annotations[ROLLBACK_STATE_ANNOTATION])["mode"] == "backedOff"


async def run_attempt(
    temporal_env: WorkflowEnvironment, api: KubeEmulator, ref: OwnerRef, **options: object
) -> RollbackResult:
    """One attempt through signal-with-start, with RollbackInput ``options`` (retry budget)."""
    result, _ = await run_attempt_with_history(temporal_env, api, ref, **options)
    return result


async def run_attempt_with_history(
    temporal_env: WorkflowEnvironment,
    api: KubeEmulator,
    ref: OwnerRef,
    record_as: str | None = None,
    **options: object,
) -> tuple[RollbackResult, list[Any]]:
    queue = f"k8s-{uuid.uuid4().hex[:6]}"
    acts = activities_for(client_for(api), Actuation.ANNOTATIONS)
    async with build_worker(temporal_env.client, queue, acts, ClusterGuard(CLUSTER)):
        await end_if_running(temporal_env.client, rollback_id(CLUSTER, ref))
        handle = await temporal_env.client.start_workflow(
            RollbackWorkflow.run,
            RollbackInput(cluster=CLUSTER, owner=ref, recommendation=REC, **options),  # type: ignore[arg-type]
            id=rollback_id(CLUSTER, ref),
            task_queue=queue,
        )
        result = await handle.result()
        history = await handle.fetch_history()
        if record_as:
            await replay_and_record([history], record_as, RollbackWorkflow)
        return result, list(history.events)


def scheduled(history: list[Any]) -> list[str]:
    """The regular activities a run scheduled, by type."""
    return [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history
        if e.HasField("activity_task_scheduled_event_attributes")
    ]


async def test_a_local_read_that_keeps_failing_falls_back_to_a_regular_activity(
    temporal_env: WorkflowEnvironment, api: KubeEmulator
) -> None:
    """The window's sample is a local activity: 503 on every pod LIST of its local tries (each
    try is the client's own retries too), then the same call is scheduled as a regular activity
    (durable, visible in the UI) and the attempt goes on to succeed."""
    api.store.create(owner("Deployment", replicas=2))
    api.store.create(policy(monitoringPeriod="2s"))
    for i in range(2):
        api.store.create(pod(f"web-{i}", WEB, memory="512Mi", rec=REC))
    lists = (RETRIES.status + 1) * LOCAL_RETRY.maximum_attempts
    fault = api.inject(Fault(status=503, method="GET", path="/namespaces/shop/pods$", times=lists))
    ref = OwnerRef(namespace=NS, kind=WorkloadKind.DEPLOYMENT, name="web")
    result, history = await run_attempt_with_history(temporal_env, api, ref, "local-fallback")
    assert result.mode is Mode.MONITORING_SUCCEEDED
    assert fault.hits == lists
    assert scheduled(history) == ["sample_cohort"]  # the reads and records before it: local


def stored_state(api: KubeEmulator, kind: str) -> OwnerState:
    obj = api.store.get(api.store.rtype(kind), NS, "web")
    return OwnerState.model_validate_json(obj["metadata"]["annotations"][ROLLBACK_STATE_ANNOTATION])


async def test_owner_without_selector_ends_aborted_within_its_window(
    temporal_env: WorkflowEnvironment, api: KubeEmulator
) -> None:
    """A StrimziPodSet without spec.selector used to stay in monitoring, retrying forever."""
    obj = owner("StrimziPodSet")
    del obj["spec"]["selector"]
    api.store.create(obj)
    api.store.create(policy(monitoringPeriod="5s", scope={"workloadTypes": ["StrimziPodSet"]}))
    ref = OwnerRef(namespace=NS, kind=WorkloadKind.STRIMZI_POD_SET, name="web")
    started = time.monotonic()
    result = await run_attempt(temporal_env, api, ref)
    assert time.monotonic() - started < 5 + 10  # the window plus a bound, not forever
    assert (result.mode, result.failure_reason) == (Mode.ABORTED, FailureReason.INVALID_OWNER)
    assert "spec.selector" in (result.message or "")
    assert stored_state(api, "StrimziPodSet").mode is Mode.ABORTED
    assert events(api) == [EventReason.MONITORING_STARTED, EventReason.ATTEMPT_ABORTED]


async def test_a_webhook_rejecting_every_write_ends_the_attempt(
    temporal_env: WorkflowEnvironment, api: KubeEmulator
) -> None:
    """403 on every owner write: the attempt cannot even record itself, and still ends, at
    once: the record is a local activity, and a permanent error is not tried again as a regular
    one."""
    api.store.create(owner("Deployment", replicas=1))
    api.store.create(policy(monitoringPeriod="2s"))
    api.inject(Fault(status=403, method="PATCH", path="/deployments/web", times=None))
    ref = OwnerRef(namespace=NS, kind=WorkloadKind.DEPLOYMENT, name="web")
    result, history = await run_attempt_with_history(temporal_env, api, ref)
    assert (result.mode, result.failure_reason) == (Mode.ABORTED, FailureReason.API_REJECTED)
    assert "403" in (result.message or "")
    assert scheduled(history) == []


async def test_transient_errors_past_the_retry_budget_end_the_attempt(
    temporal_env: WorkflowEnvironment, api: KubeEmulator
) -> None:
    """The API server answering 503 to every pod LIST: retried with backoff until the budget
    is spent, then the attempt ends aborted (retryBudgetExhausted) with a Warning Event."""
    api.store.create(owner("Deployment", replicas=1))
    api.store.create(policy(monitoringPeriod="2s"))
    api.inject(Fault(status=503, method="GET", path="/namespaces/shop/pods$", times=None))
    ref = OwnerRef(namespace=NS, kind=WorkloadKind.DEPLOYMENT, name="web")
    result = await run_attempt(temporal_env, api, ref, retry_budget=timedelta(seconds=4))
    assert result.mode is Mode.ABORTED
    assert result.failure_reason is FailureReason.RETRY_BUDGET_EXHAUSTED
    assert "sample_cohort" in (result.message or "")
    assert events(api)[-1] == EventReason.ATTEMPT_ABORTED
    assert stored_state(api, "Deployment").failure_reason is FailureReason.RETRY_BUDGET_EXHAUSTED


def backing_off_owner(api: KubeEmulator) -> None:
    """An owner that settled on turn 1 whose pods OOM on the cut: its attempt rolls back and
    backs off 2 s, a turn of 2 left (annotations mode publishes the rollback on it)."""
    good = ResourceSnapshot.of({"app": {"memory": "1Gi"}}, {})
    obj = owner("Deployment", replicas=2)
    obj["metadata"]["annotations"] = {
        ROLLBACK_STATE_ANNOTATION: OwnerState(
            mode=Mode.MONITORING_SUCCEEDED,
            active_recommendation_fingerprint="0" * 16,
            turn=1,
            last_successful_state=good,
            last_transition_time="2026-01-01T00:00:00Z",  # type: ignore[arg-type]
        ).to_json()
    }
    api.store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    api.store.create(obj)
    api.store.create(policy(backoff={"timePeriod": "2s", "multiplyByTurn": 1, "maxAttempts": 2}))
    oom = {"container_state": {"terminated": {"reason": "OOMKilled"}}, "ready": False}
    for i in range(2):
        api.store.create(pod(f"web-{i}", WEB, memory="512Mi", rec=REC, **oom))


def web_annotations(api: KubeEmulator) -> dict[str, str]:
    found: dict[str, str] = api.store.get(api.store.rtype("Deployment"), NS, "web")["metadata"][
        "annotations"
    ]
    return found


def clears(api: KubeEmulator) -> list[str]:
    """The workers' PATCHes of the owner that publish or clear its rollback."""
    return [r.path for r in api.requests("patch", "/deployments/web$")
            if ROLLBACK_REQUESTS_ANNOTATION in r.annotations]  # fmt: skip


async def until(check: Any) -> None:
    deadline = time.monotonic() + 30
    while not check():
        assert time.monotonic() < deadline, "never happened"
        await asyncio.sleep(0.05)


def held_saying(api: KubeEmulator, what: str) -> bool:
    """Whether the engine said, in a Warning Event, that ``what`` was held (the event that
    proves the hold)."""
    return any(
        e["reason"] == EventReason.PAUSED and what in e["message"]
        for e in api.store.items("Event", NS)
    )


@pytest.mark.parametrize("then", ["lifted", "cancelled"])
async def test_a_pause_holds_the_backoff_end_and_a_cancel_is_taken_while_held(
    temporal_env: WorkflowEnvironment, api: KubeEmulator, then: str
) -> None:
    """Annotations mode: a namespace paused while the attempt backs off holds the backoff's
    end, whose clearing of the rollback recommendation would let the applier re-apply the cut:
    nothing is cleared while it holds (the journal shows it). Lifted, the turn ends as usual; a
    cancel while it holds is taken at once and clears nothing (the workload stays rolled
    back)."""
    backing_off_owner(api)
    queue = f"k8s-{uuid.uuid4().hex[:6]}"
    ref = OwnerRef(namespace=NS, kind=WorkloadKind.DEPLOYMENT, name="web")
    namespaces = api.store.rtype("Namespace")
    acts = activities_for(client_for(api), Actuation.ANNOTATIONS)
    async with build_worker(temporal_env.client, queue, acts, ClusterGuard(CLUSTER)):
        await end_if_running(temporal_env.client, rollback_id(CLUSTER, ref))
        handle = await observe(temporal_env.client, CLUSTER, queue, ref, REC)
        await until(lambda: '"backingOff"' in web_annotations(api)[ROLLBACK_STATE_ANNOTATION])
        assert ROLLBACK_REQUESTS_ANNOTATION in web_annotations(api)  # the rollback is published
        pause = {"metadata": {"annotations": {PAUSE_UNTIL_ANNOTATION: "infinite"}}}
        api.store.patch(namespaces, None, NS, pause, MERGE)
        api.clear_journal()
        await until(lambda: held_saying(api, "backoff end held"))
        assert clears(api) == [] and ROLLBACK_REQUESTS_ANNOTATION in web_annotations(api)
        assert '"backingOff"' in web_annotations(api)[ROLLBACK_STATE_ANNOTATION]
        if then == "lifted":
            lift = {"metadata": {"annotations": {PAUSE_UNTIL_ANNOTATION: None}}}
            api.store.patch(namespaces, None, NS, lift, MERGE)
            await handle.signal(RollbackWorkflow.resume, ResumeSignal())  # as the intake does
            result = await handle.result()
            assert result.mode is Mode.BACKED_OFF
            assert clears(api) and ROLLBACK_REQUESTS_ANNOTATION not in web_annotations(api)
        else:
            await handle.signal(RollbackWorkflow.cancel, CancelSignal(reason="incident"))
            result = await handle.result()
            assert result.mode is Mode.CANCELLED
            assert clears(api) == [] and ROLLBACK_REQUESTS_ANNOTATION in web_annotations(api)
        found = await histories(temporal_env.client, rollback_id(CLUSTER, ref))
    await replay_and_record(found[-1:], f"paused-backoff-end-{then}", RollbackWorkflow)  # its run


async def test_a_cancel_ends_a_record_the_kill_switch_holds(
    temporal_env: WorkflowEnvironment, api: KubeEmulator
) -> None:
    """Automation switched off between a backoff end's gate and its record's own read holds the
    record (it would clear the rollback, and the cut come back). A cancel ends that hold: the
    record is given up, nothing cleared, and the cancel taken on what the owner shows
    (backingOff): the attempt ends cancelled, its rollback still published. Before, the cancel
    waited for automation to come back, and the record cleared the rollback first."""
    backing_off_owner(api)
    api.store.create({"apiVersion": "v1", "kind": "Namespace",
                      "metadata": {"name": DEFAULT_ENGINE_NAMESPACE}})  # fmt: skip
    queue = f"k8s-{uuid.uuid4().hex[:6]}"
    ref = OwnerRef(namespace=NS, kind=WorkloadKind.DEPLOYMENT, name="web")
    acts = activities_for(client_for(api), Actuation.ANNOTATIONS)
    read = acts.lookup.cluster_hold

    def switched_off_once_read() -> Pause | None:
        found = read()  # the backoff end's gate: automation on
        off = {"metadata": {"annotations": {AUTOMATION_ANNOTATION: "disabled"}}}
        api.store.patch(api.store.rtype("Namespace"), None, DEFAULT_ENGINE_NAMESPACE, off, MERGE)
        return found

    acts.lookup.cluster_hold = switched_off_once_read  # type: ignore[method-assign]
    async with build_worker(temporal_env.client, queue, acts, ClusterGuard(CLUSTER)):
        await end_if_running(temporal_env.client, rollback_id(CLUSTER, ref))
        handle = await observe(temporal_env.client, CLUSTER, queue, ref, REC)
        await until(lambda: held_saying(api, "backedOff record held: automation disabled"))
        assert '"backingOff"' in web_annotations(api)[ROLLBACK_STATE_ANNOTATION]
        api.clear_journal()
        await handle.signal(RollbackWorkflow.cancel, CancelSignal(reason="incident"))
        result = await asyncio.wait_for(handle.result(), 30)
        assert result.mode is Mode.CANCELLED and result.turn == 1
        assert clears(api) == [] and ROLLBACK_REQUESTS_ANNOTATION in web_annotations(api)
        assert '"cancelled"' in web_annotations(api)[ROLLBACK_STATE_ANNOTATION]
        assert events(api)[-1] == EventReason.MONITORING_CANCELLED
        found = await histories(temporal_env.client, rollback_id(CLUSTER, ref))
    await replay_and_record(found[-1:], "cancelled-record-hold", RollbackWorkflow)


async def test_a_cancel_ends_a_reopen_the_kill_switch_holds_before_it_wrote(
    temporal_env: WorkflowEnvironment, api: KubeEmulator
) -> None:
    """A reopen after failedPermanent would write its first state over it, and the applier
    re-apply the cut on that alone: with automation off, that first record is held. A cancel
    ends the hold with nothing written: the attempt ends cancelled, the owner keeps
    failedPermanent (a ``cancelled`` written over it would bring the cut back as surely)."""
    backing_off_owner(api)
    failed = OwnerState(
        mode=Mode.FAILED_PERMANENT, active_recommendation_fingerprint=REC.fingerprint, turn=2,
        last_transition_time="2026-01-01T00:00:00Z",  # type: ignore[arg-type]
    )  # fmt: skip
    annotations = {"metadata": {"annotations": {ROLLBACK_STATE_ANNOTATION: failed.to_json()}}}
    api.store.patch(api.store.rtype("Deployment"), NS, "web", annotations, MERGE)
    off = {"name": DEFAULT_ENGINE_NAMESPACE, "annotations": {AUTOMATION_ANNOTATION: "disabled"}}
    api.store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": off})
    queue = f"k8s-{uuid.uuid4().hex[:6]}"
    ref = OwnerRef(namespace=NS, kind=WorkloadKind.DEPLOYMENT, name="web")
    acts = activities_for(client_for(api), Actuation.ANNOTATIONS)
    async with build_worker(temporal_env.client, queue, acts, ClusterGuard(CLUSTER)):
        await end_if_running(temporal_env.client, rollback_id(CLUSTER, ref))
        handle = await observe(
            temporal_env.client, CLUSTER, queue, ref, REC, trigger=Trigger.REOPEN
        )
        await until(lambda: held_saying(api, "record held: automation disabled"))
        await handle.signal(RollbackWorkflow.cancel, CancelSignal(reason="incident"))
        result = await asyncio.wait_for(handle.result(), 30)
        assert result.mode is Mode.CANCELLED
        assert api.requests("patch", "/deployments/web$") == []
        assert '"failedPermanent"' in web_annotations(api)[ROLLBACK_STATE_ANNOTATION]
        found = await histories(temporal_env.client, rollback_id(CLUSTER, ref))
    await replay_and_record(found[-1:], "cancelled-reopen-hold", RollbackWorkflow)


async def test_a_cancel_stops_an_in_place_rollback_between_pods(
    temporal_env: WorkflowEnvironment, api: KubeEmulator
) -> None:
    """In place, a rollback held between pods (here by a PodDisruptionBudget that allows
    nothing, which holds it up to 30 minutes, then retries) is stopped by a cancel: the
    activity hears it at its next heartbeat, no pod is resized, the attempt ends cancelled
    (before, the cancel waited for the whole rollback)."""
    restarting_cohort(api, 3, 1, "256Mi")  # Ready, and not on the 512Mi asked: not adopted
    good = ResourceSnapshot.of({"app": {"memory": "1Gi"}}, {})
    settled = OwnerState(
        mode=Mode.MONITORING_SUCCEEDED, active_recommendation_fingerprint="0" * 16, turn=1,
        last_successful_state=good, last_transition_time="2026-01-01T00:00:00Z",  # type: ignore[arg-type]
    )  # fmt: skip
    annotations = {"metadata": {"annotations": {ROLLBACK_STATE_ANNOTATION: settled.to_json()}}}
    api.store.patch(
        api.store.rtype("Deployment"), NS, "web", annotations, "application/merge-patch+json"
    )
    api.store.create(policy())
    DisruptionController(api.store)
    budget(api, 3)  # every pod must stay healthy: the restore's restarts wait
    ref = OwnerRef(namespace=NS, kind=WorkloadKind.DEPLOYMENT, name="web")
    queue = f"k8s-{uuid.uuid4().hex[:6]}"
    acts = activities_for(client_for(api), Actuation.IN_PLACE)
    async with build_worker(temporal_env.client, queue, acts, ClusterGuard(CLUSTER)):
        await end_if_running(temporal_env.client, rollback_id(CLUSTER, ref))
        handle = await observe(temporal_env.client, CLUSTER, queue, ref, ASKED)
        deadline = time.monotonic() + 60
        while EventReason.PACED not in events(api):  # the event that proves the hold
            assert time.monotonic() < deadline, events(api)
            await asyncio.sleep(0.05)
        await handle.signal(RollbackWorkflow.cancel, CancelSignal(reason="incident"))
        result = await asyncio.wait_for(handle.result(), 60)
    assert result.mode is Mode.CANCELLED
    assert api.requests("patch", "/resize$") == []
    assert events(api)[-1] == EventReason.MONITORING_CANCELLED
