"""The simulated cluster's admission reads the owner as it is when a pod is created, as a real
admission webhook does, not as the controller's tick last saw it."""

import json

from sim.apiserver import RESOURCE_TYPES, Store
from sim.cluster import SimulatedCluster

REC_KEY = "static.rightsizing.kubex.ai/desired-resource-requests"
MERGE = "application/merge-patch+json"


def _deployment() -> dict:
    template = {
        "metadata": {"labels": {"app": "web"}},
        "spec": {
            "containers": [
                {"name": "app", "image": "x", "resources": {"requests": {"memory": "512Mi"}}}
            ]
        },
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "shop"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}}, "template": template},
    }


def _memory(pod: dict) -> str:
    return pod["spec"]["containers"][0]["resources"]["requests"]["memory"]


def test_a_replacement_is_admitted_on_the_owner_of_its_creation_not_of_the_tick() -> None:
    store = Store(RESOURCE_TYPES)
    store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}})
    sim = SimulatedCluster(store)
    sim.add(_deployment())
    sim.step()
    (old,) = store.items("Pod", "shop")
    assert _memory(old) == "512Mi"
    stale = store.get(store.rtype("Deployment"), "shop", "web")  # the tick's snapshot
    # Between the tick's read and its controllers: a recommendation lands, the pod is deleted.
    rec = {REC_KEY: json.dumps({"app": {"memory": "1Gi"}})}
    store.patch(store.rtype("Deployment"), "shop", "web", {"metadata": {"annotations": rec}}, MERGE)
    store.delete(store.rtype("Pod"), "shop", old["metadata"]["name"])
    sim._control(sim.workloads[("Deployment", "shop", "web")], stale)
    (new,) = store.items("Pod", "shop")
    assert _memory(new) == "1Gi"
    assert new["metadata"]["annotations"][REC_KEY] == rec[REC_KEY]
