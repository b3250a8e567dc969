"""The RBAC rules in deploy/ cover every API call the code makes, and no more than needed.

The activities (both actuation modes, every owner kind) and the intake (informers, owner
resolution, signals, Events, leader election) run against the emulator; every request in its
journal is then checked against the rules the manifests grant that component. A new API call
without its verb in the manifests fails here.
"""

from __future__ import annotations

import asyncio
import copy
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes.client import ApiClient, CoreV1Api, CustomObjectsApi
from temporalio.testing import WorkflowEnvironment

from activities.kubernetes import KubernetesActivities
from sim.apiserver import KubeEmulator, Request, _resource_parts
from tests import CLUSTER
from tests.activity.builders import NS, RestartingKubelet, node, owner, pod, policy
from tests.activity.test_kubernetes_activities import ALL_KINDS, REC, _pods_for
from tests.conftest import ROOT
from tests.deploy.kustomize import render
from tests.intake.test_intake import eventually
from tests.workflow.helpers import terminate_running
from worker.intake import Intake
from worker.kube import api_client
from worker.leader import LeaderElector
from workflows.activity_api import (
    LoadOwnerInput,
    OwnerRef,
    ReapplyInput,
    RecordTransitionInput,
    ResolvePolicyInput,
    RollBackInput,
    SampleCohortInput,
    rollback_id,
)
from workflows.breaker import StormBreaker
from workflows.contract import (
    CONTROL_ANNOTATION,
    ROLLBACK_STATE_ANNOTATION,
    Actuation,
    EventReason,
    Mode,
    RollbackTarget,
    WorkloadKind,
)
from workflows.state import OwnerState, ResourceSnapshot

Rule = dict[str, Any]


def rules(overlay: str, *names: str) -> list[Rule]:
    found = [
        rule
        for obj in render(ROOT / "deploy" / "overlays" / overlay)
        if obj["kind"] in ("ClusterRole", "Role") and obj["metadata"]["name"] in names
        for rule in obj["rules"]
    ]
    assert found, names
    return found


ENGINE = "rightsizing-rollback"  # the engine's namespace, as deploy/ installs it


def denied(journal: list[Request], granted: list[Rule]) -> set[str]:
    missing = set()
    for request in journal:
        parts = _resource_parts(request.path)
        assert parts is not None, request.path
        plural, _, name, sub, group = parts
        resource = f"{plural}/{sub}" if sub else plural
        if not any(
            group in r["apiGroups"] and resource in r["resources"] and request.verb in r["verbs"]
            and name in r.get("resourceNames", [name])
            for r in granted
        ):  # fmt: skip
            missing.add(f"{request.verb} {group or 'core'}/{resource}")
    return missing


def kube(api: KubeEmulator) -> ApiClient:
    return api_client(url=api.url)


def crash_loop(api: KubeEmulator, name: str) -> None:
    """One pod of the cohort in CrashLoopBackOff: an in-place restore recreates it."""
    pod = api.store.get(api.store.rtype("Pod"), NS, name)
    status = pod["status"]
    status["conditions"] = [{"type": "Ready", "status": "False"}]
    status["containerStatuses"][0] |= {
        "ready": False,
        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
    }
    api.store.patch(api.store.rtype("Pod"), NS, name, {"status": status},
                    "application/merge-patch+json", "status")  # fmt: skip


def exercise_activities(actuation: Actuation) -> list[Request]:
    """Every activity, for every owner kind, each in a fresh cluster; the combined journal."""
    journal: list[Request] = []
    snapshot = ResourceSnapshot.of({"app": {"memory": "768Mi"}}, {})
    started = datetime(2026, 1, 1, tzinfo=UTC)
    for kind in ALL_KINDS:
        with KubeEmulator() as api:
            client = kube(api)
            acts = KubernetesActivities(
                CoreV1Api(client), CustomObjectsApi(client), actuation, "rbac"
            )
            api.store.create(node())
            api.store.create(policy())
            _pods_for(kind, api, 2)
            RestartingKubelet(api.store)  # in place: a paced batch waits on its pods (a watch)
            for pod in [copy.deepcopy(p) for p in api.store.items("Pod", NS)]:
                pod["spec"]["containers"][0]["resizePolicy"] = [
                    {"resourceName": "memory", "restartPolicy": "RestartContainer"}
                ]
                api.store.replace(api.store.rtype("Pod"), NS, pod["metadata"]["name"], pod)
            crash_loop(api, sorted(p["metadata"]["name"] for p in api.store.items("Pod", NS))[-1])
            ref = OwnerRef(namespace=NS, kind=WorkloadKind(kind), name="web")
            acts.load_owner(LoadOwnerInput(cluster=CLUSTER, owner=ref))
            acts.resolve_policy(ResolvePolicyInput(cluster=CLUSTER, owner=ref))
            first = acts.sample_cohort(
                SampleCohortInput(
                    cluster=CLUSTER, owner=ref, recommendation=REC, window_started_at=started
                )
            )
            acts.sample_cohort(
                SampleCohortInput(
                    cluster=CLUSTER,
                    owner=ref,
                    recommendation=REC,
                    window_started_at=started,
                    cohort=first.cohort,
                    final=True,  # the verdict's: the pauses of the namespace too
                )
            )
            state = OwnerState(
                mode=Mode.MONITORING,
                active_recommendation_fingerprint=REC.fingerprint,
                turn=1,
                last_transition_time=started,
            )
            acts.record_transition(
                RecordTransitionInput(
                    cluster=CLUSTER,
                    owner=ref,
                    state=state,
                    event_reason=EventReason.MONITORING_STARTED,
                    event_id="1",
                    clear_rollback_recommendation=True,
                )
            )
            acts.roll_back(
                RollBackInput(
                    cluster=CLUSTER,
                    owner=ref,
                    target=RollbackTarget.LAST_SUCCESSFUL,
                    resources=snapshot,
                )
            )
            acts.roll_back(
                RollBackInput(cluster=CLUSTER, owner=ref, target=RollbackTarget.MANIFEST)
            )
            acts.reapply_recommendation(
                ReapplyInput(cluster=CLUSTER, owner=ref, recommendation=REC)
            )
            journal += api.journal
    return journal


@pytest.mark.parametrize("actuation", list(Actuation))
def test_worker_rules_cover_the_activities(actuation: Actuation) -> None:
    journal = exercise_activities(actuation)
    in_place = actuation is Actuation.IN_PLACE
    overlay = "in-place" if in_place else "annotations"
    names = ["rightsizing-rollback-worker"] + (
        ["rightsizing-rollback-worker-in-place"] if in_place else []
    )
    assert any(r.path.endswith("/resize") for r in journal) is in_place
    assert any(r.method == "DELETE" for r in journal) is in_place  # a restore's recreation
    assert denied(journal, rules(overlay, *names)) == set()
    if in_place:  # the annotations mode's rules would not cover in-place resizes
        annotations_only = denied(journal, rules("annotations", names[0]))
        assert {"patch core/pods/resize", "delete core/pods"} <= annotations_only


async def test_intake_rules_cover_the_intake(temporal_env: WorkflowEnvironment) -> None:
    queue = f"rbac-{uuid.uuid4().hex[:6]}"
    loop = asyncio.get_running_loop()
    journal: list[Request] = []
    for kind in ALL_KINDS:  # up from a pod to every kind of owner, then a signal
        with KubeEmulator() as api:
            client = kube(api)
            intake = Intake(
                CoreV1Api(client),
                CustomObjectsApi(client),
                temporal_env.client,
                CLUSTER,
                queue,
                loop,
            )
            api.store.create(policy(scope={"workloadTypes": ALL_KINDS}))
            intake._on_policy(
                "ADDED", api.store.list_objects(api.store.rtype("RollbackPolicy"), NS)[0][0], True
            )
            _pods_for(kind, api, 1)
            await asyncio.to_thread(
                intake._on_pod, "ADDED", api.store.get(api.store.rtype("Pod"), NS, "web-0"), False
            )
            assert intake.stats["signals"] == 1, kind
            journal += api.journal
    # No worker polls ``queue``: the runs the pods started above are ended, so that each control
    # below is answered at once (refused: nothing runs; a taken one needs a worker to answer).
    for kind in ALL_KINDS:
        ref = OwnerRef(namespace=NS, kind=WorkloadKind(kind), name="web")
        await temporal_env.client.get_workflow_handle(rollback_id(CLUSTER, ref)).terminate()
    with KubeEmulator() as api:  # informers, a malformed pod, the breaker, leader election
        client = kube(api)
        intake = Intake(
            CoreV1Api(client), CustomObjectsApi(client), temporal_env.client, CLUSTER, queue, loop,
            engine_namespace=ENGINE, storm_breaker=StormBreaker.parse("50%/1m/1"),
        )  # fmt: skip
        api.store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ENGINE}})
        rolled_back = OwnerState(
            mode=Mode.ROLLING_BACK, active_recommendation_fingerprint=REC.fingerprint, turn=1,
            last_transition_time=datetime.now(UTC),
        ).to_json()  # fmt: skip
        trips = owner("Deployment", name="trips")  # a verdict that rolled back: it trips
        trips["metadata"]["annotations"] = {ROLLBACK_STATE_ANNOTATION: rolled_back}
        api.store.create(trips)
        api.store.create(pod("bad", {"app": "web"}, annotations={REC.requests_key or "": "{oops"}))
        api.store.create(policy())
        for kind in ALL_KINDS:  # a control annotation on each kind: carried out, then removed
            api.store.create(owner(kind))
            where = api.store.rtype(kind)
            api.store.patch(
                where, NS, "web", {"metadata": {"annotations": {CONTROL_ANNOTATION: "cancel"}}},
                "application/merge-patch+json",
            )  # fmt: skip
        await asyncio.to_thread(intake.start)
        await eventually(lambda: intake.stats["controls"] == len(ALL_KINDS))
        await eventually(lambda: not intake.delivery.pending)
        await eventually(lambda: intake.status.writes == 1)  # the policy status
        await eventually(lambda: intake.breaker.tripped)
        await asyncio.to_thread(intake.stop)
        assert intake.stats["malformed"] == 1
        elector = LeaderElector(
            CustomObjectsApi(client),
            "rightsizing-rollback",
            "intake",
            "me",
            lambda: None,
            lambda: None,
            retry_period=0.1,
        )
        elector.start()
        await asyncio.to_thread(elector.leading.wait, 5)
        await eventually(  # a renewal: its request is in the journal
            lambda: any(r.verb == "update" and "/leases/" in r.path for r in api.journal)
        )
        await asyncio.to_thread(elector.stop)
        journal += api.journal
    await terminate_running(temporal_env.client, queue)
    granted = rules(
        "annotations", "rightsizing-rollback-intake", "rightsizing-rollback-intake-lease"
    )
    assert denied(journal, granted) == set()
    verbs = {(r.verb, r.path.rsplit("/", 1)[-1]) for r in journal}
    assert {
        ("watch", "pods"),
        ("create", "leases"),
        ("update", "intake"),
        ("create", "events"),
        ("patch", "status"),
        ("patch", "web"),
        ("patch", ENGINE),
    } <= verbs
