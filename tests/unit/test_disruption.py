"""The simulated disruption controller computes a PodDisruptionBudget's status as
kube-controller-manager's does (``sim.disruption``): expected pods from the controllers' scale
(a Deployment's through its ReplicaSet) for a percentage or ``maxUnavailable``, from the
selected pods for a number; a percentage rounded up; Ready pods healthy; nothing allowed while
no pod is expected; a selector that is absent selects nothing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from sim.apiserver import KubeEmulator, Store
from sim.disruption import DisruptionController

NS = "shop"
MERGE = "application/merge-patch+json"


@pytest.fixture
def store() -> Iterator[Store]:
    with KubeEmulator() as api:
        DisruptionController(api.store)
        deployment = api.store.create(
            {"apiVersion": "apps/v1", "kind": "Deployment",
             "metadata": {"name": "web", "namespace": NS}, "spec": {"replicas": 4}}
        )  # fmt: skip
        rs = api.store.create(
            {"apiVersion": "apps/v1", "kind": "ReplicaSet",
             "metadata": {"name": "web-1", "namespace": NS, "ownerReferences": [
                 {"kind": "Deployment", "name": "web", "uid": deployment["metadata"]["uid"],
                  "controller": True}]},
             "spec": {"replicas": 4}}
        )  # fmt: skip
        for i in range(3):  # one of the four not created yet: expected counts it, pods do not
            api.store.create(
                {"apiVersion": "v1", "kind": "Pod",
                 "metadata": {"name": f"web-1-{i}", "namespace": NS, "labels": {"app": "web"},
                              "ownerReferences": [{"kind": "ReplicaSet", "name": "web-1",
                                                   "uid": rs["metadata"]["uid"],
                                                   "controller": True}]},
                 "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
            )  # fmt: skip
        yield api.store


def status(store: Store, spec: dict[str, Any]) -> dict[str, Any]:
    store.create(
        {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
         "metadata": {"name": "pdb", "namespace": NS}, "spec": spec}
    )  # fmt: skip
    found: dict[str, Any] = store.get(store.rtype("PodDisruptionBudget"), NS, "pdb")["status"]
    return {k: found[k] for k in ("expectedPods", "desiredHealthy", "currentHealthy",
                                  "disruptionsAllowed")}  # fmt: skip


WEB = {"matchLabels": {"app": "web"}}


@pytest.mark.parametrize(
    ("spec", "want"),
    [
        pytest.param({"minAvailable": 2, "selector": WEB}, (3, 2, 3, 1), id="min-number"),
        pytest.param({"minAvailable": "50%", "selector": WEB}, (4, 2, 3, 1), id="min-percent"),
        pytest.param({"minAvailable": "60%", "selector": WEB}, (4, 3, 3, 0),
                     id="min-percent-rounds-up"),
        pytest.param({"maxUnavailable": 1, "selector": WEB}, (4, 3, 3, 0), id="max-number"),
        pytest.param({"maxUnavailable": "30%", "selector": WEB}, (4, 2, 3, 1),
                     id="max-percent-rounds-up"),
        pytest.param({"minAvailable": 0, "selector": {}}, (3, 0, 3, 3), id="empty-selects-all"),
        pytest.param({"minAvailable": 0}, (0, 0, 0, 0), id="absent-selects-none"),
    ],
)  # fmt: skip
def test_a_budgets_status_is_the_disruption_controllers(
    store: Store, spec: dict[str, Any], want: tuple[int, int, int, int]
) -> None:
    assert tuple(status(store, spec).values()) == want


def test_the_status_follows_readiness(store: Store) -> None:
    assert status(store, {"minAvailable": 2, "selector": WEB})["disruptionsAllowed"] == 1
    down = {"status": {"conditions": [{"type": "Ready", "status": "False"}]}}
    store.patch(store.rtype("Pod"), NS, "web-1-0", down, MERGE, "status")
    pdb = store.get(store.rtype("PodDisruptionBudget"), NS, "pdb")["status"]
    assert (pdb["currentHealthy"], pdb["disruptionsAllowed"]) == (2, 0)
