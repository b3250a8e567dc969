"""Kubernetes activities through the real ``kubernetes`` client over HTTP, on the emulator."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes.client import ApiClient, CoreV1Api, CustomObjectsApi
from kubernetes.client.exceptions import ApiException
from temporalio.exceptions import ApplicationError
from urllib3.exceptions import ReadTimeoutError

from activities.cohort import health
from activities.errors import classify
from activities.kubernetes import KubernetesActivities
from activities.kubetime import kube_time
from sim.apiserver import Fault, KubeEmulator
from tests import CLUSTER
from tests.activity.builders import NS, RestartingKubelet, node, owner, pod, policy
from worker.kube import api_client
from workflows.activity_api import (
    LoadOwnerInput,
    OwnerRef,
    PermanentError,
    PolicySettings,
    ReapplyInput,
    RecordTransitionInput,
    ResolvePolicyInput,
    RollBackInput,
    SampleCohortInput,
)
from workflows.contract import (
    PAUSE_REASON_ANNOTATION,
    PAUSE_UNTIL_ANNOTATION,
    ROLLBACK_LIMITS_ANNOTATION,
    ROLLBACK_REQUESTS_ANNOTATION,
    ROLLBACK_STATE_ANNOTATION,
    Actuation,
    EventReason,
    FailureReason,
    Mode,
    Obj,
    RollbackTarget,
    WorkloadKind,
)
from workflows.fingerprint import Recommendation
from workflows.pause import PauseScope
from workflows.policy import RollbackPolicy
from workflows.selection import Protection
from workflows.state import OwnerState, ResourceSnapshot

KEY = "static.rightsizing.kubex.ai/desired-resource-requests"
REC = Recommendation(requests_key=KEY, requests={"app": {"memory": "512Mi"}})
SINCE = datetime(2026, 1, 1, tzinfo=UTC)
WEB = {"app": "web"}


def ref(kind: str = "Deployment", name: str = "web") -> OwnerRef:
    return OwnerRef(namespace=NS, kind=WorkloadKind(kind), name=name)


def sample(acts: KubernetesActivities, kind: str = "Deployment", cohort=None):  # type: ignore[no-untyped-def]
    return acts.sample_cohort(
        SampleCohortInput(
            cluster=CLUSTER,
            owner=ref(kind),
            recommendation=REC,
            window_started_at=SINCE,
            cohort=cohort,
        )
    )


def owner_obj(api: KubeEmulator, kind: str = "Deployment") -> dict:  # type: ignore[type-arg]
    rtype = api.store.rtype(kind)
    return api.store.get(rtype, NS, "web")


# --- owner resolution and sampling -------------------------------------------------------------


def _pods_for(kind: str, api: KubeEmulator, count: int) -> None:
    """Pods as each kind's controller would create them (labels, owner references)."""
    created = api.store.create(owner(kind, replicas=count))
    uid = created["metadata"]["uid"]
    labels, parent = dict(WEB), {"kind": kind, "name": "web", "uid": uid, "controller": True}
    if kind in ("Deployment", "Rollout"):
        rs = api.store.create(
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "metadata": {"name": "web-abc", "namespace": NS, "ownerReferences": [parent]},
                "spec": {"selector": {"matchLabels": WEB}},
            }
        )
        parent = {
            "kind": "ReplicaSet",
            "name": "web-abc",
            "uid": rs["metadata"]["uid"],
            "controller": True,
        }
    elif kind in ("CronJob", "AnalysisRun"):
        job_name = "web-29000000" if kind == "CronJob" else f"{uid}.test.1"
        job_labels = {"analysisrun.argoproj.io/uid": uid} if kind == "AnalysisRun" else {}
        job = api.store.create(
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {
                    "name": job_name,
                    "namespace": NS,
                    "labels": job_labels,
                    "ownerReferences": [parent],
                },
                "spec": {},
            }
        )
        parent = {
            "kind": "Job",
            "name": job_name,
            "uid": job["metadata"]["uid"],
            "controller": True,
        }
        labels = {"job-name": job_name}
    elif kind == "Model":
        labels = {"model": "web"}
    for i in range(count):
        api.store.create(pod(f"web-{i}", labels, memory="512Mi", rec=REC, owner_ref=parent))
    # A stranger in the namespace that no selector should pick up.
    api.store.create(
        pod("other-0", {"app": "other", "job-name": "other-1"}, memory="512Mi", rec=REC)
    )


ALL_KINDS = [k.value for k in WorkloadKind]


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_cohort_and_baseline_for_every_kind(
    api: KubeEmulator, acts: KubernetesActivities, kind: str
) -> None:
    _pods_for(kind, api, 3)
    api.clear_journal()
    first = sample(acts, kind)
    assert (first.pods, first.adopted, first.adopted_healthy) == (3, 3, 3), first
    assert first.desired == (None if kind == "AnalysisRun" else 3)
    assert first.cohort is not None
    pod_lists = api.requests("list", r"/api/v1/namespaces/shop/pods$")
    assert len(pod_lists) == 1 and not api.requests("get", r"/pods/")
    # Later samples reuse the cohort query: exactly one LIST, no GET of the owner.
    api.clear_journal()
    again = sample(acts, kind, cohort=first.cohort)
    assert again.adopted_healthy == 3 and again.desired is None
    assert [r.verb for r in api.journal] == ["list"]


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_pod_to_owner_for_every_kind(
    api: KubeEmulator, acts: KubernetesActivities, kind: str
) -> None:
    _pods_for(kind, api, 1)
    found = acts.lookup.owner_of(api.store.get(api.store.rtype("Pod"), NS, "web-0"))
    assert found == ref(kind)
    api.clear_journal()
    acts.lookup.owner_of(api.store.get(api.store.rtype("Pod"), NS, "web-0"))
    assert api.journal == []  # intermediate owners are cached
    assert acts.lookup.owner_of(api.store.get(api.store.rtype("Pod"), NS, "other-0")) is None


def test_one_list_per_sample_whatever_the_cohort_size(
    api: KubeEmulator, acts: KubernetesActivities
) -> None:
    _pods_for("Deployment", api, 40)
    api.clear_journal()
    result = sample(acts)
    assert result.pods == 40
    assert [r.verb for r in api.journal] == ["get", "list"]


NOW = datetime.now(UTC)
RECENT = (NOW - timedelta(seconds=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
OLD = "2025-01-01T00:00:00Z"


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        pytest.param(
            {"last_state": {"terminated": {"reason": "OOMKilled", "finishedAt": RECENT}}},
            FailureReason.OOM_KILLED,
            id="oom-in-window",
        ),
        pytest.param(
            {"container_state": {"terminated": {"reason": "OOMKilled"}}, "ready": False},
            FailureReason.OOM_KILLED,
            id="oom-now",
        ),
        pytest.param(
            {"last_state": {"terminated": {"reason": "OOMKilled", "finishedAt": OLD}}},
            None,
            id="oom-before-window-is-history",
        ),
        pytest.param(
            {"last_state": {"terminated": {"reason": "Error", "finishedAt": RECENT}}},
            None,
            id="recovered-restart-is-transient",
        ),
        pytest.param(
            {"container_state": {"waiting": {"reason": "CrashLoopBackOff"}}, "ready": False},
            FailureReason.CRASH_LOOP_BACK_OFF,
            id="crashloop",
        ),
        pytest.param(
            {
                "phase": "Pending",
                "ready": False,
                "conditions": [
                    {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
                ],
            },
            FailureReason.UNSCHEDULABLE,
            id="unschedulable",
        ),
        pytest.param({"ready": False}, FailureReason.NOT_READY, id="not-ready"),
        pytest.param({"phase": "Failed", "ready": False}, FailureReason.FAILED, id="job-failed"),
        pytest.param({"phase": "Succeeded", "ready": False}, None, id="job-succeeded-is-healthy"),
    ],
)
def test_health_reasons(
    api: KubeEmulator, acts: KubernetesActivities, kwargs: dict, reason: FailureReason | None
) -> None:  # type: ignore[type-arg]
    api.store.create(owner("Deployment", replicas=1))
    api.store.create(pod("web-0", WEB, memory="512Mi", rec=REC, **kwargs))
    result = acts.sample_cohort(
        SampleCohortInput(
            cluster=CLUSTER,
            owner=ref(),
            recommendation=REC,
            window_started_at=NOW - timedelta(minutes=1),
        )
    )
    if reason is None:
        assert result.adopted_healthy == 1 and result.unhealthy == {}
    else:
        assert result.adopted_healthy == 0 and result.unhealthy == {reason: 1}


def test_a_pod_counts_only_once_ready_for_the_minimum(api: KubeEmulator, client: ApiClient) -> None:
    """Kubex's minReadyDuration: a pod that turned Ready 1 s before the sample is NotReady, and
    the verdict's message says how many were Ready, too recently; a pod Ready for longer, or
    one that does not say since when, counts."""
    acts = KubernetesActivities(
        CoreV1Api(client), CustomObjectsApi(client), min_ready=timedelta(seconds=10)
    )
    api.store.create(owner("Deployment", replicas=3))

    def ready_since(seconds: float | None) -> list[dict[str, str]]:
        ago = datetime.now(UTC) - timedelta(seconds=seconds or 0)
        at = {} if seconds is None else {"lastTransitionTime": kube_time(ago)}
        return [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Ready", "status": "True", **at},
        ]

    api.store.create(pod("web-0", WEB, memory="512Mi", rec=REC, conditions=ready_since(1)))
    api.store.create(pod("web-1", WEB, memory="512Mi", rec=REC, conditions=ready_since(60)))
    api.store.create(pod("web-2", WEB, memory="512Mi", rec=REC, conditions=ready_since(None)))
    window = SampleCohortInput(
        cluster=CLUSTER, owner=ref(), recommendation=REC, window_started_at=NOW
    )
    result = acts.sample_cohort(window)
    assert (result.adopted, result.adopted_healthy) == (3, 2)
    assert result.unhealthy == {FailureReason.NOT_READY: 1}
    assert result.message == "1/3 pods NotReady (1 Ready for less than 10s)"
    anyway = KubernetesActivities(CoreV1Api(client), CustomObjectsApi(client))  # 0: Ready is enough
    assert anyway.sample_cohort(window).adopted_healthy == 3


@pytest.mark.parametrize(
    ("conditions", "reason"),
    [
        (
            [{"type": "PodResizePending", "status": "True", "reason": "Infeasible"}],
            FailureReason.RESIZE_INFEASIBLE,
        ),
        (
            [{"type": "PodResizePending", "status": "True", "reason": "Deferred"}],
            FailureReason.RESIZE_DEFERRED,
        ),
        (
            [{"type": "PodResizeInProgress", "status": "True", "reason": "Error"}],
            FailureReason.RESIZE_ERROR,
        ),
    ],
)
def test_resize_reasons_explain_non_adoption(
    api: KubeEmulator,
    acts: KubernetesActivities,
    conditions: list,
    reason: FailureReason,  # type: ignore[type-arg]
) -> None:
    api.store.create(owner("Deployment", replicas=1))
    ready = [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}]
    # The pod carries the recommendation but still runs on its old 1Gi: the resize is stuck.
    api.store.create(pod("web-0", WEB, memory="1Gi", rec=REC, conditions=ready + conditions))
    result = sample(acts)
    assert (result.adopted, result.unhealthy) == (0, {reason: 1})


def test_adoption_uses_reported_resources_over_spec(
    api: KubeEmulator, acts: KubernetesActivities
) -> None:
    api.store.create(owner("Deployment", replicas=3))
    api.store.create(pod("web-0", WEB, memory="512Mi", rec=REC))  # spec only
    api.store.create(pod("web-1", WEB, memory="512Mi", rec=REC, reported="1Gi"))  # kubelet lags
    api.store.create(
        pod("web-2", WEB, memory="1Gi", rec=REC, reported="536870912")
    )  # 512Mi in bytes
    api.store.create(pod("web-3", WEB, memory="512Mi"))  # resized, but no recommendation on it
    result = sample(acts)
    assert (result.pods, result.adopted) == (4, 2)


def test_message_names_reasons_and_containers(
    api: KubeEmulator, acts: KubernetesActivities
) -> None:
    api.store.create(owner("Deployment", replicas=5))
    oom = {"container_state": {"terminated": {"reason": "OOMKilled"}}, "ready": False}
    for i in range(2):
        api.store.create(pod(f"web-{i}", WEB, memory="512Mi", rec=REC, **oom))
    for i in range(2, 5):
        api.store.create(pod(f"web-{i}", WEB, memory="512Mi", rec=REC))
    assert sample(acts).message == "2/5 pods OOMKilled (app)"


def test_one_pod_whose_recommendation_cannot_be_read_is_left_out_and_the_rest_judged(
    api: KubeEmulator, acts: KubernetesActivities
) -> None:
    """Another tool's value under the same key on one pod: that pod is left out of the cohort
    (a Warning Event on the owner names it and the key, once), the others are judged as ever;
    the workload stays protected (before, the whole attempt ended aborted, unmonitored)."""
    api.store.create(owner("Deployment", replicas=3))
    api.store.create(pod("web-0", WEB, annotations={KEY: "{not json"}))
    for i in (1, 2):
        api.store.create(pod(f"web-{i}", WEB, memory="512Mi", rec=REC))
    result = sample(acts)
    assert result.error is None and (result.pods, result.adopted) == (2, 2)
    assert list(result.left_out) == ["web-0"] and KEY in result.left_out["web-0"]
    assert "1 pod(s) left out, their recommendation unreadable (web-0:" in result.message
    sample(acts)  # told once per pod and cause
    (told,) = [e for e in api.store.items("Event", NS)
               if e["reason"] == EventReason.RECOMMENDATION_MALFORMED]  # fmt: skip
    assert told["type"] == "Warning" and told["involvedObject"]["name"] == "web"
    assert "pod web-0 left out of the cohort" in told["message"] and KEY in told["message"]


# --- owner state and events ---------------------------------------------------------------------


def state(mode: Mode = Mode.MONITORING) -> OwnerState:
    return OwnerState(
        mode=mode,
        active_recommendation_fingerprint=REC.fingerprint,
        turn=1,
        last_transition_time=SINCE,
    )


def record(
    acts: KubernetesActivities, st: OwnerState | None, event_id: str = "run.1", clear: bool = False
):  # type: ignore[no-untyped-def]
    return acts.record_transition(
        RecordTransitionInput(
            cluster=CLUSTER,
            owner=ref(),
            state=st,
            event_reason=EventReason.MONITORING_STARTED,
            event_message="started",
            event_id=event_id,
            clear_rollback_recommendation=clear,
        )
    )


def test_record_transition_is_idempotent(api: KubeEmulator, acts: KubernetesActivities) -> None:
    api.store.create(owner("Deployment"))
    first = record(acts, state())
    assert first.state_written and first.event_emitted
    annotations = owner_obj(api)["metadata"]["annotations"]
    assert OwnerState.model_validate_json(annotations[ROLLBACK_STATE_ANNOTATION]) == state()
    version = owner_obj(api)["metadata"]["resourceVersion"]
    api.clear_journal()
    again = record(acts, state())  # a retried activity: the same state, read, not written
    assert not again.event_emitted and not again.state_written
    assert api.requests("patch", "/deployments/web") == []
    assert len(api.requests("get", "/deployments/web")) == 1
    assert owner_obj(api)["metadata"]["resourceVersion"] == version  # nothing changed
    events, _ = api.store.list_objects(api.store.rtype("Event"), NS)
    assert len(events) == 1
    assert events[0]["reason"] == EventReason.MONITORING_STARTED
    assert events[0]["involvedObject"]["kind"] == "Deployment"


def test_a_record_run_again_writes_nothing_over_a_newer_state_of_its_run(
    api: KubeEmulator, acts: KubernetesActivities
) -> None:
    """A local activity runs again when the workflow task that ran it is lost (a worker killed,
    or too slow to complete it), after the task's later records were written: its older state
    is not written over them (the soak saw failedPermanent taken back to backingOff at 1,000
    workloads, the cut re-applied meanwhile). Another run's state, or an older one of its
    run, is written over as ever."""
    api.store.create(owner("Deployment"))
    ours = {"run_id": "run-a"}
    newer = state(Mode.FAILED_PERMANENT).model_copy(update={**ours, "transitions": 5})
    assert record(acts, newer).state_written
    older = state(Mode.BACKING_OFF).model_copy(update={**ours, "transitions": 4})
    assert not record(acts, older, event_id="run-a.4").state_written
    stored = owner_obj(api)["metadata"]["annotations"][ROLLBACK_STATE_ANNOTATION]
    assert OwnerState.model_validate_json(stored).mode is Mode.FAILED_PERMANENT
    another = older.model_copy(update={"run_id": "run-b", "transitions": 1})
    assert record(acts, another, event_id="run-b.1").state_written
    later = newer.model_copy(update={"run_id": "run-b", "transitions": 2})
    assert record(acts, later, event_id="run-b.2").state_written


def test_a_held_step_tells_of_itself_in_one_event_whose_count_rises(
    api: KubeEmulator, acts: KubernetesActivities
) -> None:
    """A series (a verdict held for Prometheus, looking again): one Event, brought to each
    look's count; a retried look sets the same count again."""
    api.store.create(owner("Deployment"))

    def look(count: int) -> None:
        acts.record_transition(
            RecordTransitionInput(
                cluster=CLUSTER,
                owner=ref(),
                state=state(),
                event_reason=EventReason.HEALTH_UNAVAILABLE,
                event_message=f"not judged, look {count}",
                event_type="Warning",
                event_id="run.1.health",
                event_count=count,
            )
        )

    for count in (1, 2, 3, 3):  # the last: a retried activity
        look(count)
    events, _ = api.store.list_objects(api.store.rtype("Event"), NS)
    (event,) = events
    assert (event["count"], event["message"], event["type"]) == (3, "not judged, look 3", "Warning")
    assert event["lastTimestamp"] >= event["firstTimestamp"]


def test_record_transition_retries_conflicts(api: KubeEmulator, acts: KubernetesActivities) -> None:
    api.store.create(owner("Deployment"))
    api.inject(Fault(status=409, method="PATCH", path="/deployments/web", times=2))
    assert record(acts, state()).state_written
    assert len(api.requests("patch")) == 3


def test_record_transition_retries_failed_writes(
    api: KubeEmulator, acts: KubernetesActivities
) -> None:
    """A 500 on the patch and one on the Event: retried here, not by a whole activity retry."""
    api.store.create(owner("Deployment"))
    api.inject(Fault(status=500, method="PATCH", path="/deployments/web"))
    api.inject(Fault(status=503, method="POST", path="/events"))
    result = record(acts, state())
    assert result.state_written and result.event_emitted
    assert [r.status for r in api.requests("patch")] == [500, 200]
    assert [r.status for r in api.requests("create", "/events")] == [503, 201]


def test_a_write_that_timed_out_but_landed_is_not_applied_twice(api: KubeEmulator) -> None:
    """The server answers after the client gave up: the retry finds the write done (or loses
    the race on the resourceVersion precondition), and the Event exists once."""
    api.store.create(owner("Deployment"))
    api.inject(Fault(status=None, delay=0.8, method="PATCH", path="/deployments/web"))
    api.inject(Fault(status=None, delay=0.8, method="POST", path="/events"))
    with api_client(url=api.url, read_timeout=0.3) as slow:
        acts = KubernetesActivities(CoreV1Api(slow), CustomObjectsApi(slow))
        record(acts, state())
    time.sleep(1.0)  # let the delayed requests land
    annotations = owner_obj(api)["metadata"]["annotations"]
    assert OwnerState.model_validate_json(annotations[ROLLBACK_STATE_ANNOTATION]) == state()
    assert [r.status for r in api.requests("patch")].count(200) == 1  # one write landed
    events, _ = api.store.list_objects(api.store.rtype("Event"), NS)
    assert len(events) == 1


def test_a_diffed_write_detects_a_concurrent_writer(
    api: KubeEmulator, acts: KubernetesActivities
) -> None:
    """A write between our read and our patch makes the patch 409 on its resourceVersion (the
    rollback's publication diffs against a read; a state record does not read)."""
    api.store.create(owner("Deployment"))
    rtype = api.store.rtype("Deployment")
    original = acts.lookup.get

    def racing_read(o: OwnerRef):  # type: ignore[no-untyped-def]
        obj = original(o)
        if not api.requests("patch"):
            api.store.patch(
                rtype,
                NS,
                "web",
                {"metadata": {"labels": {"touched": "yes"}}},
                "application/merge-patch+json",
            )
        return obj

    acts.lookup.get = racing_read  # type: ignore[method-assign]
    _, written = acts.writer.patch_annotations(ref(), {ROLLBACK_REQUESTS_ANNOTATION: "{}"})
    assert written
    stored = owner_obj(api)
    assert stored["metadata"]["labels"]["touched"] == "yes"
    assert stored["metadata"]["annotations"][ROLLBACK_REQUESTS_ANNOTATION] == "{}"
    assert [r.status for r in api.requests("patch", "/deployments/web$")][:1] == [409]


def test_clearing_state_and_rollback_annotations(
    api: KubeEmulator, acts: KubernetesActivities
) -> None:
    obj = owner("Deployment")
    obj["metadata"]["annotations"] = {
        ROLLBACK_REQUESTS_ANNOTATION: "{}",
        ROLLBACK_LIMITS_ANNOTATION: "{}",
        ROLLBACK_STATE_ANNOTATION: state().to_json(),
        "keep": "me",
    }
    api.store.create(obj)
    record(acts, None, clear=True)
    assert owner_obj(api)["metadata"]["annotations"] == {"keep": "me"}


def test_owner_gone_everywhere(acts: KubernetesActivities) -> None:
    gone = ref()
    assert not acts.load_owner(LoadOwnerInput(cluster=CLUSTER, owner=gone)).exists
    assert not acts.resolve_policy(ResolvePolicyInput(cluster=CLUSTER, owner=gone)).exists
    assert not sample(acts).exists
    assert not record(acts, state()).exists
    assert not acts.roll_back(
        RollBackInput(cluster=CLUSTER, owner=gone, target=RollbackTarget.MANIFEST)
    ).exists


def test_server_errors_raise_for_temporal_to_retry(
    api: KubeEmulator, acts: KubernetesActivities
) -> None:
    """Errors the client's own retries did not absorb (see tests/activity/test_kube_client.py)."""
    api.store.create(owner("Deployment"))
    api.inject(Fault(status=500, method="GET", path="/deployments/web", times=None))
    with pytest.raises(ApiException) as info:
        sample(acts)
    assert info.value.status == 500
    api.faults.clear()
    api.inject(Fault(status=503, method="GET", path="/pods", times=None))
    with pytest.raises(ApiException):
        sample(acts)
    api.faults.clear()
    assert sample(acts).exists  # and the next try goes through


def test_load_owner_reads_state_and_resolves_policy(
    api: KubeEmulator, acts: KubernetesActivities
) -> None:
    obj = owner("Deployment", labels={"tier": "api"})
    obj["metadata"]["annotations"] = {ROLLBACK_STATE_ANNOTATION: state(Mode.BACKED_OFF).to_json()}
    api.store.create(obj)
    api.store.create(policy("ClusterRollbackPolicy", "everywhere", weight=500))
    api.store.create(
        policy("RollbackPolicy", "local", scope={"labelSelector": {"matchLabels": {"tier": "api"}}})
    )
    api.store.create(
        policy("RollbackPolicy", "broken", monitoringPeriod="soon")
    )  # invalid: ignored
    loaded = acts.load_owner(LoadOwnerInput(cluster=CLUSTER, owner=ref()))
    assert loaded.state is not None and loaded.state.mode is Mode.BACKED_OFF
    assert loaded.policy is not None and loaded.policy.ref.name == "local"
    assert loaded.policy.monitoring_period == timedelta(seconds=2)


def test_no_policy_resolves_in_a_protected_namespace(
    api: KubeEmulator, client: ApiClient, acts: KubernetesActivities
) -> None:
    """The worker resolves again at each attempt: a run the intake should never have started
    (or one started before the namespace was protected) finds no policy there."""
    obj = owner("Deployment")
    obj["metadata"]["namespace"] = "kube-system"
    api.store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kube-system"}})
    api.store.create(obj)
    api.store.create(policy("ClusterRollbackPolicy", "everywhere"))
    protected = OwnerRef(namespace="kube-system", kind=WorkloadKind.DEPLOYMENT, name="web")
    assert acts.load_owner(LoadOwnerInput(cluster=CLUSTER, owner=protected)).policy is None
    unprotected = KubernetesActivities(
        CoreV1Api(client), CustomObjectsApi(client), protection=Protection(())
    )
    loaded = unprotected.load_owner(LoadOwnerInput(cluster=CLUSTER, owner=protected))
    assert loaded.policy is not None and loaded.policy.ref.name == "everywhere"


def test_a_policy_carried_by_the_attempts_starter_is_not_resolved_again(
    api: KubeEmulator, client: ApiClient, acts: KubernetesActivities
) -> None:
    """The intake resolved the policy from its watch and carried it into the attempt: the first
    read takes it, with no LIST of the policies; in a protected namespace it is not taken (the
    resolution there, the worker's own, finds none)."""
    api.store.create(owner("Deployment"))
    doc = policy("RollbackPolicy", "carried", monitoringPeriod="7s")
    carried = PolicySettings.of(RollbackPolicy.model_validate(doc))
    api.clear_journal()
    loaded = acts.load_owner(LoadOwnerInput(cluster=CLUSTER, owner=ref(), policy=carried))
    assert loaded.policy == carried
    assert [r.verb for r in api.journal] == ["get"]  # the owner; no policy LIST
    obj = owner("Deployment")
    obj["metadata"]["namespace"] = "kube-system"
    api.store.create(obj)
    protected = OwnerRef(namespace="kube-system", kind=WorkloadKind.DEPLOYMENT, name="web")
    given = LoadOwnerInput(cluster=CLUSTER, owner=protected, policy=carried)
    assert acts.load_owner(given).policy is None


def test_unreadable_state_is_reported_not_raised(
    api: KubeEmulator, acts: KubernetesActivities
) -> None:
    obj = owner("Deployment")
    obj["metadata"]["annotations"] = {ROLLBACK_STATE_ANNOTATION: "{broken"}
    api.store.create(obj)
    loaded = acts.load_owner(LoadOwnerInput(cluster=CLUSTER, owner=ref()))
    assert loaded.state is None and loaded.state_error is not None and loaded.policy is None


# --- actuation ----------------------------------------------------------------------------------

LAST_GOOD = ResourceSnapshot.of({"app": {"memory": "768Mi"}}, {"app": {"memory": "768Mi"}})


@pytest.mark.parametrize(
    ("target", "resources", "expected"),
    [
        (RollbackTarget.LAST_SUCCESSFUL, LAST_GOOD, {"app": {"memory": "768Mi"}}),
        (RollbackTarget.MANIFEST, None, {"app": {"cpu": "500m", "memory": "1Gi"}}),
    ],
)
def test_rollback_publishes_annotations(
    api: KubeEmulator,
    acts: KubernetesActivities,
    target: RollbackTarget,
    resources: ResourceSnapshot | None,
    expected: dict,
) -> None:  # type: ignore[type-arg]
    api.store.create(owner("Deployment"))
    api.store.create(pod("web-0", WEB, memory="512Mi", rec=REC))
    result = acts.roll_back(
        RollBackInput(cluster=CLUSTER, owner=ref(), target=target, resources=resources)
    )
    annotations = owner_obj(api)["metadata"]["annotations"]
    assert json.loads(annotations[ROLLBACK_REQUESTS_ANNOTATION]) == expected
    assert result.pods_resized == 0 and api.requests("patch", "/resize") == []
    api.clear_journal()
    acts.roll_back(RollBackInput(cluster=CLUSTER, owner=ref(), target=target, resources=resources))
    assert api.requests("patch") == []  # already published: nothing written twice


class Recreating:
    """What a workload's controller and the scheduler do with a pod deleted to be recreated: a
    replacement of the same name (a StatefulSet's) on ``node``, admitted with ``memory``."""

    def __init__(self, store: Any, memory: str, node: str) -> None:
        self.store, self.memory, self.node = store, memory, node
        store.listeners.append(self._seen)

    def _seen(self, kind: str, rtype: Any, obj: Obj) -> None:
        if rtype.kind == "Pod" and kind == "DELETED":
            name = obj["metadata"]["name"]
            threading.Thread(
                target=self.store.create, args=(pod(name, WEB, self.memory, node=self.node),)
            ).start()


def test_an_in_place_restore_recreates_the_pods_that_cannot_take_it_in_place(
    api: KubeEmulator, in_place: KubernetesActivities
) -> None:
    """A restore resizes in place what can take it. A crash-looping pod (its restart backoff
    would hold the restored resources for minutes) and a pod down whose node lacks the room are
    deleted instead, for their controller to recreate them with the restored resources, and an
    Event says so; a Ready pod whose node lacks the room keeps serving, filtered."""
    api.store.create(node("roomy", memory="8Gi"))
    api.store.create(node("full", memory="1200Mi"))
    api.store.create(owner("Deployment", replicas=4))
    looping = {"waiting": {"reason": "CrashLoopBackOff"}}
    killed = {"terminated": {"reason": "OOMKilled", "exitCode": 137}}
    api.store.create(pod("web-0", WEB, memory="512Mi", rec=REC, node="roomy"))
    api.store.create(pod("web-1", WEB, memory="512Mi", rec=REC, node="full"))
    api.store.create(pod("web-2", WEB, memory="512Mi", rec=REC, node="roomy", ready=False,
                         container_state=looping))  # fmt: skip
    api.store.create(pod("web-3", WEB, memory="512Mi", rec=REC, node="full", ready=False,
                         last_state=killed))  # fmt: skip
    Recreating(api.store, "768Mi", "roomy")
    rollback = RollBackInput(
        cluster=CLUSTER, owner=ref(), target=RollbackTarget.LAST_SUCCESSFUL, resources=LAST_GOOD
    )
    result = in_place.roll_back(rollback)
    assert result.pods_resized == 1 and result.pods_filtered == ["web-1"]
    assert (
        "; 2 recreated to take it (web-2: CrashLoopBackOff, web-3: its node lacks the room)"
        in result.message
    )
    assert sorted(r.path.rsplit("/", 1)[-1] for r in api.requests("delete")) == ["web-2", "web-3"]
    assert [r.path.split("/")[-2] for r in api.requests("patch", "/resize$")] == ["web-0"]
    (event,) = [e for e in api.store.items("Event", NS) if e["reason"] == "RollbackPodsRecreated"]
    assert event["message"] == (
        "rollback of lastSuccessful recreates web-2 (CrashLoopBackOff), web-3 (its node lacks"
        " the room): they cannot take it in place; their replacements are admitted with it"
    )
    pods: dict[str, Obj] = {}
    for _ in range(100):  # the replacements, created by the controller's thread
        pods = {p["metadata"]["name"]: p for p in api.store.items("Pod", NS)}
        if len(pods) == 4:
            break
        time.sleep(0.05)
    memory = {n: p["spec"]["containers"][0]["resources"]["requests"]["memory"]
              for n, p in pods.items()}  # fmt: skip
    assert memory == {"web-0": "768Mi", "web-1": "512Mi", "web-2": "768Mi", "web-3": "768Mi"}
    # A retry deletes nothing again (the replacements are at the target), and resizes web-1 in
    # the room web-3 left on its node.
    api.clear_journal()
    again = in_place.roll_back(rollback)
    assert again.pods_resized == 1 and again.pods_filtered == [] and api.requests("delete") == []
    assert [r.path.split("/")[-2] for r in api.requests("patch", "/resize$")] == ["web-1"]


@pytest.mark.parametrize("pending", ["Deferred", "Infeasible"])
def test_an_in_place_restore_recreates_a_pod_whose_resize_the_kubelet_left_pending(
    api: KubeEmulator, in_place: KubernetesActivities, pending: str
) -> None:
    """A restore already asked of a pod (a retried rollback) that its kubelet left pending, the
    pod down meanwhile: resized again it would stay pending; recreated, the scheduler places it
    where the restored size fits."""
    api.store.create(node("roomy", memory="8Gi"))
    api.store.create(owner("Deployment", replicas=1))
    condition = {"type": "PodResizePending", "status": "True", "reason": pending}
    api.store.create(pod("web-0", WEB, memory="512Mi", rec=REC, node="roomy", ready=False,
                         conditions=[{"type": "Ready", "status": "False"}, condition]))  # fmt: skip
    Recreating(api.store, "768Mi", "roomy")
    result = in_place.roll_back(
        RollBackInput(
            cluster=CLUSTER, owner=ref(), target=RollbackTarget.LAST_SUCCESSFUL, resources=LAST_GOOD
        )
    )
    assert result.pods_resized == 0
    assert f"; 1 recreated to take it (web-0: resize {pending})" in result.message
    assert [r.path.rsplit("/", 1)[-1] for r in api.requests("delete")] == ["web-0"]
    assert api.requests("patch", "/resize$") == []


def test_an_in_place_re_apply_filters_a_pod_whose_node_lacks_the_room(
    api: KubeEmulator, in_place: KubernetesActivities
) -> None:
    """A re-apply (a cut, not a restore) never deletes: a pod whose node cannot take it grown
    is filtered and reported."""
    api.store.create(node("roomy", memory="8Gi"))
    api.store.create(node("full", memory="600Mi"))
    api.store.create(owner("Deployment"))
    grown = Recommendation(requests_key=KEY, requests={"app": {"memory": "768Mi"}})
    api.store.create(pod("web-0", WEB, memory="512Mi", node="roomy"))
    api.store.create(pod("web-1", WEB, memory="512Mi", node="full"))
    api.store.create(pod("web-2", WEB, memory="512Mi", node="roomy", phase="Pending", ready=False))
    api.store.create(pod("web-3", WEB, memory="768Mi", node="roomy"))  # already there
    result = in_place.reapply_recommendation(
        ReapplyInput(cluster=CLUSTER, owner=ref(), recommendation=grown)
    )
    assert result.pods_resized == 1 and result.pods_filtered == ["web-1"]
    assert "1 filtered for lack of node capacity (web-1)" in result.message
    resized = api.requests("patch", "/resize$")
    assert [r.path.split("/")[-2] for r in resized] == ["web-0"]
    assert all(r.content_type == "application/strategic-merge-patch+json" for r in resized)
    pods = {p["metadata"]["name"]: p for p in api.store.list_objects(api.store.rtype("Pod"), NS)[0]}
    assert pods["web-0"]["spec"]["containers"][0]["resources"]["requests"]["memory"] == "768Mi"
    assert pods["web-1"]["spec"]["containers"][0]["resources"]["requests"]["memory"] == "512Mi"
    assert api.requests("delete") == []  # filtered, never deleted


@pytest.mark.parametrize(
    ("admission", "message"),
    [
        pytest.param(
            {"kind": "ResourceQuota", "spec": {"hard": {"requests.memory": "1Gi"}}},
            'pods "web-0" is forbidden: exceeded quota: compute, requested:'
            " requests.memory=256Mi, used: requests.memory=1Gi, limited: requests.memory=1Gi",
            id="quota",
        ),
        pytest.param(
            {"kind": "LimitRange",
             "spec": {"limits": [{"type": "Container", "max": {"memory": "640Mi"}}]}},
            'pods "web-0" is forbidden: maximum memory usage per Container is 640Mi, but limit'
            " is 768Mi",
            id="limit-range",
        ),
    ],
)  # fmt: skip
def test_an_in_place_rollback_refused_for_the_namespace_s_resources_ends_with_their_reason(
    api: KubeEmulator, in_place: KubernetesActivities, admission: dict[str, Any], message: str
) -> None:
    """The restore's resize beyond a ResourceQuota or a LimitRange: the API server's 403, with
    the admission plugin's message, ends the attempt ``resourcesRefused`` at once (retrying gets
    the same answer), not ``apiRejected`` and never a retry loop."""
    api.store.create(node("roomy", memory="8Gi"))
    api.store.create(owner("Deployment"))
    for name in ("web-0", "web-1"):
        api.store.create(pod(name, WEB, memory="512Mi", rec=REC, node="roomy"))
    api.store.create(
        {"apiVersion": "v1", "metadata": {"name": "compute", "namespace": NS}, **admission}
    )
    with pytest.raises(ApplicationError) as info:
        in_place.roll_back(
            RollBackInput(
                cluster=CLUSTER,
                owner=ref(),
                target=RollbackTarget.LAST_SUCCESSFUL,
                resources=LAST_GOOD,
            )
        )
    assert info.value.non_retryable and info.value.type == PermanentError.RESOURCES_REFUSED
    assert PermanentError(info.value.type).reason is FailureReason.RESOURCES_REFUSED
    assert info.value.message == f"403 Forbidden: {message}"
    assert len(api.requests("patch", "/resize$")) == 1  # refused once, not tried again
    memory = [p["spec"]["containers"][0]["resources"]["requests"]["memory"]
              for p in api.store.items("Pod", NS)]  # fmt: skip
    assert memory == ["512Mi", "512Mi"]


def test_a_pause_holds_the_rollback_and_writes_nothing(
    api: KubeEmulator, in_place: KubernetesActivities
) -> None:
    """Kubex's pause on the namespace: the rollback neither publishes nor resizes, says why in
    one Warning Event (not one per look), and goes ahead once the pause is removed."""
    api.store.create(node("roomy", memory="8Gi"))
    pause = {PAUSE_UNTIL_ANNOTATION: "infinite", PAUSE_REASON_ANNOTATION: "incident 4711"}
    api.store.create(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS, "annotations": pause}}
    )
    api.store.create(owner("Deployment", replicas=1))
    api.store.create(pod("web-0", WEB, memory="512Mi", rec=REC, node="roomy"))
    rollback = RollBackInput(
        cluster=CLUSTER, owner=ref(), target=RollbackTarget.LAST_SUCCESSFUL, resources=LAST_GOOD
    )
    for _ in range(2):
        held = in_place.roll_back(rollback)
        assert held.paused is not None and held.paused.scope is PauseScope.NAMESPACE
        assert held.paused.reason == "incident 4711" and held.applied is None
    assert api.requests("patch") == []  # neither the owner nor a pod
    (event,) = [e for e in api.store.items("Event", NS) if e["reason"] == EventReason.PAUSED]
    assert event["type"] == "Warning"
    assert event["message"] == (
        "rollback held: paused by namespace shop until the annotation is removed: incident 4711"
    )
    unpause = {"metadata": {"annotations": {PAUSE_UNTIL_ANNOTATION: None}}}
    api.store.patch(api.store.rtype("Namespace"), None, NS, unpause, "application/merge-patch+json")
    done = in_place.roll_back(rollback)
    assert done.paused is None and done.pods_resized == 1


@pytest.mark.parametrize("write", ["publish", "clear"])
def test_a_pause_taken_while_an_acting_write_retries_holds_the_retry(
    api: KubeEmulator, acts: KubernetesActivities, monkeypatch: pytest.MonkeyPatch, write: str
) -> None:
    """An acting write passes the gate, its patch meets a 500, and a pause lands before the
    retry (1,000-workload soak: a cleared rollback landed a second after a pause): the retry
    reads the gate again and is held; nothing is written."""
    api.store.create(owner("Deployment", replicas=1))
    api.store.create(pod("web-0", WEB, memory="512Mi", rec=REC))
    if write == "clear":
        acts.roll_back(RollBackInput(cluster=CLUSTER, owner=ref(), target=RollbackTarget.MANIFEST))
    api.inject(Fault(status=500, method="PATCH", path="/deployments/web"))
    patch, rtype = acts.writer.custom.patch_namespaced_custom_object, api.store.rtype("Deployment")

    def failed_then_paused(*args: object, **kwargs: object) -> object:
        try:
            return patch(*args, **kwargs)
        except ApiException:  # an operator pauses the owner while the write waits to retry
            paused = {"metadata": {"annotations": {PAUSE_UNTIL_ANNOTATION: "infinite"}}}
            api.store.patch(rtype, NS, "web", paused, "application/merge-patch+json")
            raise

    monkeypatch.setattr(acts.writer.custom, "patch_namespaced_custom_object", failed_then_paused)
    before = owner_obj(api)["metadata"].get("annotations") or {}
    if write == "clear":
        result = record(acts, state(), clear=True)
    else:
        rollback = RollBackInput(cluster=CLUSTER, owner=ref(), target=RollbackTarget.MANIFEST)
        result = acts.roll_back(rollback)
    assert result.paused is not None and result.paused.scope is PauseScope.OWNER
    after = owner_obj(api)["metadata"]["annotations"]
    assert after == before | {PAUSE_UNTIL_ANNOTATION: "infinite"}  # nothing else written
    assert [r.status for r in api.requests("patch", "/deployments/web")][-1] == 500


def test_the_verdict_s_sample_finds_a_pod_s_pause(
    api: KubeEmulator, acts: KubernetesActivities
) -> None:
    api.store.create(owner("Deployment", replicas=2))
    api.store.create(pod("web-0", WEB, memory="512Mi", rec=REC))
    api.store.create(
        pod("web-1", WEB, memory="512Mi", rec=REC, annotations={PAUSE_UNTIL_ANNOTATION: "later"})
    )
    window = SampleCohortInput(
        cluster=CLUSTER, owner=ref(), recommendation=REC, window_started_at=SINCE
    )
    assert acts.sample_cohort(window).paused is None  # only the verdict looks
    found = acts.sample_cohort(window.model_copy(update={"final": True})).paused
    assert found is not None and (found.scope, found.name) == (PauseScope.POD, "web-1")
    assert found.problem == "'later' is neither infinite nor an RFC 3339 time"


def restarting_cohort(
    api: KubeEmulator,
    replicas: int,
    max_unavailable: int | str,
    memory: str,
    rec: Recommendation | None = REC,
) -> None:
    """A Deployment of ``replicas`` pods on one roomy node, whose containers restart to apply a
    memory resize (``RestartContainer``), paced by ``max_unavailable``."""
    api.store.create(node("roomy", memory="16Gi"))
    deployment = owner("Deployment", replicas=replicas)
    deployment["spec"]["strategy"] = {"rollingUpdate": {"maxUnavailable": max_unavailable}}
    api.store.create(deployment)
    for i in range(replicas):
        p = pod(f"web-{i}", WEB, memory=memory, rec=rec, node="roomy")
        p["spec"]["containers"][0]["resizePolicy"] = [
            {"resourceName": "memory", "restartPolicy": "RestartContainer"}
        ]
        api.store.create(p)


@pytest.mark.parametrize(
    ("max_unavailable", "batches"),
    [pytest.param(1, 6, id="one-at-a-time"), pytest.param("50%", 2, id="half")],
)
def test_an_in_place_rollback_that_restarts_keeps_the_workload_available(
    api: KubeEmulator, in_place: KubernetesActivities, max_unavailable: int | str, batches: int
) -> None:
    """Six Ready pods whose memory resize restarts their container: never more of them down
    at once than the Deployment's maxUnavailable, each batch Ready again before the next."""
    kubelet = RestartingKubelet(api.store)
    restarting_cohort(api, 6, max_unavailable, "512Mi")
    result = in_place.roll_back(
        RollBackInput(
            cluster=CLUSTER, owner=ref(), target=RollbackTarget.LAST_SUCCESSFUL, resources=LAST_GOOD
        )
    )
    most = 1 if max_unavailable == 1 else 3
    assert kubelet.most_not_ready == most
    assert result.pods_resized == 6
    assert f"paced in {batches} batch(es), at most {most} pod(s) not Ready at once" in (
        result.message
    )
    assert "containers restart to apply (RestartContainer): web-0/app" in result.message
    memory = {
        p["spec"]["containers"][0]["resources"]["requests"]["memory"]
        for p in api.store.items("Pod", NS)
    }
    assert memory == {"768Mi"}
    api.clear_journal()  # a retry (a worker that died after the last batch) resizes nothing
    in_place.roll_back(
        RollBackInput(
            cluster=CLUSTER, owner=ref(), target=RollbackTarget.LAST_SUCCESSFUL, resources=LAST_GOOD
        )
    )
    assert api.requests("patch", "/resize$") == []


def test_a_retried_in_place_rollback_whose_first_answer_was_lost_takes_one_pod_down(
    api: KubeEmulator,
) -> None:
    """The first resize's answer is lost (the client times out; the write lands later): the
    activity fails, and its retry, which cannot see that write yet, resizes the same first pod
    again rather than another, so one pod is down at a time and each restarts once."""
    kubelet = RestartingKubelet(api.store)
    restarting_cohort(api, 3, 1, "512Mi")
    lost = api.inject(Fault(status=None, method="PATCH", path="/resize$", delay=1.0))
    rollback = RollBackInput(
        cluster=CLUSTER, owner=ref(), target=RollbackTarget.LAST_SUCCESSFUL, resources=LAST_GOOD
    )
    with api_client(url=api.url, read_timeout=0.3) as client:
        acts = KubernetesActivities(
            CoreV1Api(client), CustomObjectsApi(client), Actuation.IN_PLACE, "test"
        )
        with pytest.raises(ReadTimeoutError) as timed_out:
            acts.roll_back(rollback)
        assert classify(timed_out.value) is timed_out.value  # transient: Temporal retries it
        assert lost.hits == 1
        result = acts.roll_back(rollback)  # the retry, before the lost write lands
    assert result.pods_resized == 3 and kubelet.most_not_ready == 1
    first = [r.path for r in api.requests("patch", "/resize$")][:2]
    assert first == [f"/api/v1/namespaces/{NS}/pods/web-0/resize"] * 2
    restarts = {
        p["metadata"]["name"]: p["status"]["containerStatuses"][0]["restartCount"]
        for p in api.store.items("Pod", NS)
    }
    assert restarts == {"web-0": 1, "web-1": 1, "web-2": 1}


def test_an_in_place_re_apply_stops_when_a_pod_crashes_on_it(
    api: KubeEmulator, in_place: KubernetesActivities
) -> None:
    """A re-apply whose first pod is OOMKilled on the recommendation takes no more pods down
    (the crash is the window's evidence), and does not wait for a Ready that will not come."""
    kubelet = RestartingKubelet(api.store, oom_below="600Mi")
    restarting_cohort(api, 3, 1, "768Mi", rec=None)
    result = in_place.reapply_recommendation(
        ReapplyInput(cluster=CLUSTER, owner=ref(), recommendation=REC)
    )
    assert result.pods_resized == 1 and kubelet.most_not_ready == 1
    assert result.message.endswith(
        "; crashed on the new resources: web-0; stopped there, 2 pod(s) left as they were"
    )
    assert len(api.requests("patch", "/resize$")) == 1


def test_reapply(
    api: KubeEmulator, acts: KubernetesActivities, in_place: KubernetesActivities
) -> None:
    api.store.create(owner("Deployment", replicas=1))
    api.store.create(pod("web-0", WEB, memory="768Mi", rec=REC))
    annotations_mode = acts.reapply_recommendation(
        ReapplyInput(cluster=CLUSTER, owner=ref(), recommendation=REC)
    )
    assert "applier re-applies" in annotations_mode.message and api.requests("patch") == []
    in_place.reapply_recommendation(ReapplyInput(cluster=CLUSTER, owner=ref(), recommendation=REC))
    resized = api.store.get(api.store.rtype("Pod"), NS, "web-0")
    assert resized["spec"]["containers"][0]["resources"]["requests"]["memory"] == "512Mi"


def test_when_an_oom_kill_counts() -> None:
    """In the window's first second (the kubelet's ``finishedAt`` has whole seconds: a kill 0.3 s
    into a window that began at .6 reads as before it), or before the window for a container
    not ready since (backing off, or started again and not up yet: the backoff grows to 5
    minutes, so no kill need fall in a shorter window); a crash loop from another exit stays
    ``crashLoopBackOff``, a kill recovered from before the window is history, and so is one
    before ``since`` when nothing is carried over (the cohort now, after a verdict)."""
    since = datetime(2026, 1, 1, 12, 0, 0, 600_000, tzinfo=UTC)
    running, crashing = {"running": {}}, {"waiting": {"reason": "CrashLoopBackOff"}}

    def pod(state: dict, reason: str, second: int, ready: bool = False) -> dict:  # type: ignore[type-arg]
        finished = f"2026-01-01T{'12:00:00' if second == 0 else '11:59:59'}Z"
        last = {"terminated": {"reason": reason, "finishedAt": finished}}
        container = {"name": "app", "state": state, "lastState": last, "ready": ready}
        return {"status": {"phase": "Running", "containerStatuses": [container]}}

    oom, crash_loop = (
        (FailureReason.OOM_KILLED, ("app",)),
        (FailureReason.CRASH_LOOP_BACK_OFF, ("app",)),
    )
    assert health(pod(running, "OOMKilled", 0), since) == oom
    assert health(pod(crashing, "OOMKilled", -1), since) == oom
    assert health(pod(crashing, "Error", 0), since) == crash_loop
    assert health(pod(running, "OOMKilled", -1), since) == oom  # started again, not up yet
    recovered = pod(running, "OOMKilled", -1, ready=True)
    assert health(recovered, since)[0] is not FailureReason.OOM_KILLED
    # The cohort now, after a rollback: a kill before it is not one now; backing off from it
    # is what the pod does now (its restored size waits out the backoff of the cut's kill).
    assert health(pod(crashing, "OOMKilled", -1), since, carried=False) == crash_loop
    assert health(pod(running, "OOMKilled", 0), since, carried=False) == oom
