"""Paced in-place work reads the disruption budgets and the pause before each batch, over the
real client: a PodDisruptionBudget that allows nothing holds the batch (a ``RollbackPaced``
Event names it, the wait is a watch) and, loosened, lets it go on one pod at a time; a budget
tighter than the workload's own ``maxUnavailable`` bounds every batch; a pause set mid-rollback
stops the next batch, and the rollback goes on from there once lifted, no pod resized twice;
``maxUnavailable`` 0 is said, not silently taken as 1. The budgets' status is the simulated
disruption controller's (``sim.disruption``), computed as the real one's."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from kubernetes.client import ApiClient, CoreV1Api

from activities.errors import TransientError
from activities.kubernetes import KubernetesActivities
from activities.resize import Budget, Pace, resize_paced
from sim.apiserver import KubeEmulator
from sim.disruption import DisruptionController
from tests import CLUSTER
from tests.activity.builders import NS, RestartingKubelet, pod
from tests.activity.test_kubernetes_activities import LAST_GOOD, REC, ref, restarting_cohort
from workflows.activity_api import ActuationResult, RollBackInput
from workflows.contract import PAUSE_UNTIL_ANNOTATION, EventReason, RollbackTarget

MERGE = "application/merge-patch+json"
ROLLBACK = RollBackInput(
    cluster=CLUSTER, owner=ref(), target=RollbackTarget.LAST_SUCCESSFUL, resources=LAST_GOOD
)


def budget(api: KubeEmulator, min_available: int | str) -> None:
    api.store.create(
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "web", "namespace": NS},
            "spec": {"minAvailable": min_available, "selector": {"matchLabels": {"app": "web"}}},
        }
    )


def resizes(api: KubeEmulator) -> list[str]:
    return [r.path.rsplit("/", 2)[-2] for r in api.requests("patch", "/resize$")]


def events(api: KubeEmulator, reason: EventReason) -> list[dict[str, Any]]:
    return [e for e in api.store.items("Event", NS) if e.get("reason") == reason]


def until(check: Any, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, "never happened"
        time.sleep(0.02)
    return found


def test_a_budget_that_allows_nothing_holds_the_batch_until_it_allows_one(
    api: KubeEmulator, in_place: KubernetesActivities
) -> None:
    kubelet = RestartingKubelet(api.store)
    restarting_cohort(api, 3, 1, "512Mi")
    DisruptionController(api.store)
    budget(api, 3)  # every pod must stay healthy: 0 disruptions allowed
    pdb = api.store.get(api.store.rtype("PodDisruptionBudget"), NS, "web")
    assert pdb["status"]["disruptionsAllowed"] == 0 and pdb["status"]["currentHealthy"] == 3
    done: list[ActuationResult] = []
    worker = threading.Thread(target=lambda: done.append(in_place.roll_back(ROLLBACK)))
    worker.start()
    (paced,) = until(lambda: events(api, EventReason.PACED))  # the event that proves the hold
    assert "PodDisruptionBudget web allows 0 (3 healthy, 3 desired)" in paced["message"]
    assert resizes(api) == [] and worker.is_alive()  # nothing taken down while it holds
    api.store.patch(
        api.store.rtype("PodDisruptionBudget"), NS, "web", {"spec": {"minAvailable": 2}}, MERGE
    )
    worker.join(timeout=30)
    (result,) = done
    assert result.pods_resized == 3 and kubelet.most_not_ready == 1
    assert sorted(resizes(api)) == ["web-0", "web-1", "web-2"]  # each once
    assert "held by PodDisruptionBudget web allows 0 (3 healthy, 3 desired)" in result.message
    assert len(events(api, EventReason.PACED)) == 1  # told once


def test_a_budget_tighter_than_the_workloads_pace_bounds_every_batch(
    api: KubeEmulator, in_place: KubernetesActivities
) -> None:
    kubelet = RestartingKubelet(api.store)
    restarting_cohort(api, 6, "50%", "512Mi")  # 3 at once by the Deployment's own pace
    DisruptionController(api.store)
    budget(api, 5)  # 1 at once by the budget
    result = in_place.roll_back(ROLLBACK)
    assert result.pods_resized == 6 and kubelet.most_not_ready == 1
    assert "paced in 6 batch(es), at most 1 pod(s) not Ready at once" in result.message


def test_a_pause_set_mid_rollback_stops_the_next_batch_and_the_rollback_goes_on_after(
    api: KubeEmulator, in_place: KubernetesActivities
) -> None:
    RestartingKubelet(api.store)
    restarting_cohort(api, 3, 1, "512Mi")
    deployments = api.store.rtype("Deployment")
    paused = {"metadata": {"annotations": {PAUSE_UNTIL_ANNOTATION: "infinite"}}}

    def pause_after_the_first_resize(kind: str, rtype: Any, obj: dict[str, Any]) -> None:
        if rtype.kind == "Pod" and resizes(api) == ["web-0"] and not paused_yet:
            paused_yet.append(True)
            api.store.patch(deployments, NS, "web", paused, MERGE)

    paused_yet: list[bool] = []
    api.store.listeners.append(pause_after_the_first_resize)
    held = in_place.roll_back(ROLLBACK)
    assert held.paused is not None and held.paused.scope == "owner"
    assert resizes(api) == ["web-0"] and held.pods_resized == 1
    assert "stopped before the next batch: paused by owner" in held.message
    api.store.patch(
        deployments, NS, "web", {"metadata": {"annotations": {PAUSE_UNTIL_ANNOTATION: None}}}, MERGE
    )
    went_on = in_place.roll_back(ROLLBACK)  # the workflow runs the step again once lifted
    assert went_on.paused is None and went_on.pods_resized == 2
    assert sorted(resizes(api)) == ["web-0", "web-1", "web-2"]  # none twice
    restarts = {
        p["metadata"]["name"]: p["status"]["containerStatuses"][0]["restartCount"]
        for p in api.store.items("Pod", NS)
    }
    assert restarts == {"web-0": 1, "web-1": 1, "web-2": 1}


@pytest.mark.parametrize("declared", [0, "0%"])
def test_max_unavailable_zero_is_said_not_silently_one(
    api: KubeEmulator, in_place: KubernetesActivities, declared: int | str
) -> None:
    kubelet = RestartingKubelet(api.store)
    restarting_cohort(api, 3, declared, "512Mi")
    result = in_place.roll_back(ROLLBACK)
    assert result.pods_resized == 3 and kubelet.most_not_ready == 1
    assert "maxUnavailable resolves to 0 (a rollout surges instead, which a resize cannot)" in (
        result.message
    )


def test_a_restore_beside_a_replica_that_never_ran_restores_every_pod(
    api: KubeEmulator, in_place: KubernetesActivities
) -> None:
    """Four replicas, one Pending from the start (no room), three Ready on the cut: the
    Pending one takes nothing down (it never ran), so the three are resized one at a time
    within maxUnavailable 1, and the Pending one is recreated at once (nothing runs in it: its
    replacement is admitted with the restore). Before, the Pending pod was counted down, the
    batch was 0, and the rollback waited for it to be Ready: no pod restored, an error about a
    resize that never happened, about 2.5 h of retries."""
    kubelet = RestartingKubelet(api.store)
    restarting_cohort(api, 3, 1, "512Mi")
    deployments = api.store.rtype("Deployment")
    api.store.patch(deployments, NS, "web", {"spec": {"replicas": 4}}, MERGE)
    unscheduled = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]
    never_ran = pod("web-3", {"app": "web"}, memory="512Mi", rec=REC, ready=False,
                    phase="Pending", conditions=unscheduled)  # fmt: skip
    del never_ran["spec"]["nodeName"]
    never_ran["status"].pop("containerStatuses", None)
    api.store.create(never_ran)
    result = in_place.roll_back(ROLLBACK)
    assert result.pods_resized == 3 and kubelet.most_not_ready == 1
    assert sorted(resizes(api)) == ["web-0", "web-1", "web-2"]
    assert [r.path.rsplit("/", 1)[-1] for r in api.requests("delete", "/pods/")] == ["web-3"]
    assert "1 recreated to take it (web-3: Pending: nothing runs in it)" in result.message


def test_a_batch_the_workloads_own_pace_holds_is_told_and_its_wait_says_so(
    api: KubeEmulator, client: ApiClient
) -> None:
    """Two of three pods down for a cause of their own (not Ready, not crash-looping: no
    restore recreates them), maxUnavailable 1: the Ready one waits, it is told why (the
    activity's RollbackPaced Event), and the wait's error names what it waited on, not a
    resize that never happened."""
    restarting_cohort(api, 1, 1, "512Mi")  # web-0: Ready, on the cut
    api.store.patch(api.store.rtype("Deployment"), NS, "web", {"spec": {"replicas": 3}}, MERGE)
    for name in ("web-1", "web-2"):  # restored already, and not Ready (failing their probe)
        api.store.create(pod(name, {"app": "web"}, memory="768Mi", rec=REC, ready=False,
                             node="roomy"))  # fmt: skip
    core = CoreV1Api(client)
    told: list[Budget] = []
    pace = Pace(1, batch_timeout=1.0, recreate=True, on_held=told.append)

    def cohort() -> tuple[list[Any], str]:
        listed = core.list_namespaced_pod(NS, label_selector="app=web", _preload_content=False)
        found = json.loads(listed.data)
        return found["items"], found["metadata"]["resourceVersion"]

    restore = LAST_GOOD.requests(), LAST_GOOD.limits()
    with pytest.raises(TransientError) as waited:  # the activity is retried
        resize_paced(core, NS, cohort, "app=web", *restore, pace)
    assert "none of the 2 pods not Ready before this batch Ready again" in str(waited.value)
    assert "1 pod(s) wait to be restored" in str(waited.value)
    (held,) = told
    assert "maxUnavailable 1 with 2 pod(s) not Ready (web-1, web-2)" in held.said
    assert resizes(api) == []  # nothing taken down beside the two down already
