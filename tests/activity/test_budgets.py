"""Paced in-place work reads the disruption budgets and the pause before each batch, over the
real client: a PodDisruptionBudget that allows nothing holds the batch (a ``RollbackPaced``
Event names it, the wait is a watch) and, loosened, lets it go on one pod at a time; a budget
tighter than the workload's own ``maxUnavailable`` bounds every batch; a pause set mid-rollback
stops the next batch, and the rollback goes on from there once lifted, no pod resized twice;
``maxUnavailable`` 0 is said, not silently taken as 1. The budgets' status is the simulated
disruption controller's (``sim.disruption``), computed as the real one's."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from activities.kubernetes import KubernetesActivities
from sim.apiserver import KubeEmulator
from sim.disruption import DisruptionController
from tests import CLUSTER
from tests.activity.builders import NS, RestartingKubelet
from tests.activity.test_kubernetes_activities import LAST_GOOD, ref, restarting_cohort
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
