"""The simulated kubelet's crash loop (``sim.cluster`` over ``sim.backoff``), stepped on a clock
of the test's: an undersized container is OOM-killed, started again at once the first time,
then only after 10 s, then 20 s, waiting in CrashLoopBackOff meanwhile; a resize to enough
memory starts it again at once (the 1.34 kubelet's backoff key holds the resources)."""

from __future__ import annotations

from typing import Any

import pytest

from sim import cluster as sim_cluster
from sim.apiserver import RESOURCE_TYPES, Store
from sim.cluster import Behaviour, SimulatedCluster

NS = "shop"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def deployment(memory: str) -> dict[str, Any]:
    resources = {"requests": {"cpu": "100m", "memory": memory}, "limits": {"memory": memory}}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "api", "namespace": NS},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "api"}},
            "template": {
                "metadata": {"labels": {"app": "api"}},
                "spec": {"containers": [{"name": "app", "image": "x", "resources": resources}]},
            },
        },
    }


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> tuple[SimulatedCluster, Clock]:
    clock = Clock()
    monkeypatch.setattr(sim_cluster.time, "monotonic", clock)
    store = Store(RESOURCE_TYPES)
    store.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-1"},
                  "status": {"allocatable": {"cpu": "4", "memory": "8Gi"}}})  # fmt: skip
    cluster = SimulatedCluster(store)
    cluster.add(deployment("256Mi"), {"app": Behaviour(working_set="600Mi", startup=0.3)})
    return cluster, clock


def container(cluster: SimulatedCluster) -> dict[str, Any]:
    (pod,) = cluster.store.items("Pod")
    (cs,) = pod["status"]["containerStatuses"]
    return cs


def after(cluster: SimulatedCluster, clock: Clock, seconds: float) -> dict[str, Any]:
    clock.now += seconds
    cluster.step()
    return container(cluster)


def test_a_crash_loop_waits_ten_seconds_then_twenty_and_a_resize_ends_it_at_once(
    world: tuple[SimulatedCluster, Clock],
) -> None:
    cluster, clock = world
    for _ in range(3):  # the pod created, scheduled, started
        cluster.step()
    clock.now += 0.5
    cluster.step()
    cs = container(cluster)
    assert "running" in cs["state"] and cs["restartCount"] == 0 and not cs["ready"]  # starving
    cs = after(cluster, clock, 1.0)  # OOM-killed; the first exit starts it again at once
    assert cs["lastState"]["terminated"]["reason"] == "OOMKilled"
    assert "running" in cs["state"] and cs["restartCount"] == 1
    cs = after(cluster, clock, 1.0)  # killed again: backs off 10 s
    assert cs["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    assert cs["state"]["waiting"]["message"].startswith("back-off 10s restarting failed")
    assert after(cluster, clock, 9.5)["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    cs = after(cluster, clock, 0.6)
    assert "running" in cs["state"] and cs["restartCount"] == 2
    cs = after(cluster, clock, 1.0)  # killed a third time: 20 s now
    assert cs["state"]["waiting"]["message"].startswith("back-off 20s")
    assert after(cluster, clock, 19.5)["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    assert "running" in after(cluster, clock, 0.6)["state"]
    cs = after(cluster, clock, 1.0)
    assert cs["state"]["waiting"]["message"].startswith("back-off 40s")

    (pod,) = cluster.store.items("Pod")
    body = {"spec": {"containers": [{"name": "app", "resources": {
        "requests": {"memory": "1Gi"}, "limits": {"memory": "1Gi"}}}]}}  # fmt: skip
    cluster.store.patch(cluster.store.rtype("Pod"), NS, pod["metadata"]["name"], body,
                        "application/strategic-merge-patch+json", "resize")  # fmt: skip
    cs = after(cluster, clock, 0.1)  # the resize's new key: no backoff, started at once
    assert "running" in cs["state"] and cs["restartCount"] == 4 and not cs["ready"]
    assert cs["resources"]["limits"]["memory"] == "1Gi"
    cs = after(cluster, clock, 0.35)  # up after its startup, and no longer killed
    assert cs["ready"]
    assert after(cluster, clock, 5.0)["ready"]
    reasons = [e["reason"] for e in cluster.store.items("Event")]
    assert reasons.count("BackOff") >= 1 and "Started" in reasons
