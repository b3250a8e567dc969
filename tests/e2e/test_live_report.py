"""``rollbackctl describe OWNER --report``'s page from a live cluster's own history of its pods
(``cli.podhistory``, through the real client over HTTP to the simulated cluster, whose kubelet
and controllers record the Events real ones do), laid out by headless Chromium."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from activities.owners import dig
from cli import podhistory
from cli import report as story
from sim.apiserver import KubeEmulator
from sim.cluster import Behaviour, SimulatedCluster
from tests.conftest import measure_report, overlapping
from worker.kube import api_client
from workflows.activity_api import OwnerRef
from workflows.contract import EventReason, Obj, WorkloadKind

REC_KEY = "static.rightsizing.kubex.ai/desired-resource-requests"
MERGE = "application/merge-patch+json"
OWNER = OwnerRef(namespace="shop", kind=WorkloadKind.DEPLOYMENT, name="api")


def _deployment(replicas: int) -> dict:  # type: ignore[type-arg]
    template = {
        "metadata": {"labels": {"app": "api"}},
        "spec": {"containers": [{"name": "app", "image": "x",
                                 "resources": {"requests": {"memory": "1Gi"}}}]},
    }  # fmt: skip
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "api", "namespace": "shop"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "api"}},
                 "template": template},
    }  # fmt: skip


def _until(sim: SimulatedCluster, check: Callable[[list[Obj]], bool]) -> None:
    """Step the simulated cluster until ``check`` holds for its pods."""
    deadline = time.monotonic() + 10
    while not check(list(sim.store.items("Pod", "shop"))):
        assert time.monotonic() < deadline, "the simulated cluster never got there"
        sim.step()
        time.sleep(0.05)


def _statuses(pods: list[Obj]) -> list[Obj]:
    return [cs for p in pods for cs in (p.get("status") or {}).get("containerStatuses") or []]


def _running(pods: list[Obj]) -> bool:
    return len(pods) == 3 and all(dig(p, "status", "phase") == "Running" for p in pods)


def _on(memory: str) -> Callable[[list[Obj]], bool]:
    def resized(pods: list[Obj]) -> bool:
        statuses = _statuses(pods)
        return len(statuses) == len(pods) and all(
            cs["resources"]["requests"]["memory"] == memory for cs in statuses
        )

    return resized


def _crash_looping(pods: list[Obj]) -> bool:
    """Killed, started again at once, killed again: backing off (10 s) in CrashLoopBackOff."""
    return all("waiting" in cs["state"] for cs in _statuses(pods))


def _cluster_history() -> podhistory.OwnerHistory:
    """Three pods resized in place to a cut that OOMs, then to one that fits; one scaled away."""
    with KubeEmulator() as api:
        store = api.store
        store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}})
        allocatable = {"cpu": "8", "memory": "16Gi", "pods": "110"}
        node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}
        store.create({**node, "status": {"allocatable": allocatable}})
        sim = SimulatedCluster(store)
        sim.add(_deployment(3), {"app": Behaviour(working_set="512Mi", startup=0.0)})
        _until(sim, _running)
        deployments = store.rtype("Deployment")
        for memory in ("256Mi", "768Mi"):
            rec = {REC_KEY: json.dumps({"app": {"memory": memory}})}
            store.patch(deployments, "shop", "api", {"metadata": {"annotations": rec}}, MERGE)
            _until(sim, _on(memory))
            if memory == "256Mi":  # OOMKilled twice: a restart, then a crash loop
                _until(sim, _crash_looping)
        store.patch(deployments, "shop", "api", {"spec": {"replicas": 2}}, MERGE)
        _until(sim, lambda pods: len(pods) == 2)
        return podhistory.read(api_client(url=api.url), OWNER)


def test_the_live_report_draws_each_pods_resources_as_they_changed(tmp_path: Path) -> None:
    history = _cluster_history()
    # Every pod, the gone one too, with its resizes in the order they were actuated.
    assert len(history.pods) == 3
    (gone,) = [p for p in history.pods if p.status is None]
    assert gone.deleted is not None and gone.created is not None
    for pod in history.pods:
        assert [m for _, m in pod.resizes] == ["256Mi", "768Mi"], pod
        started = [h for h in pod.happenings if h.reason == "Started"]
        assert started and started[0].count >= 3  # the start, the OOM restart, the resize's
        assert any(h.reason == "BackOff" for h in pod.happenings)
    assert all(
        p.last_restart and p.last_restart[1] == "OOMKilled" for p in history.pods if p.status
    )

    # The page: the story's own range (not up to a "now" minutes later), every pod's resources
    # as spans, no two labels over each other.
    first = min(p.created for p in history.pods if p.created)
    last = max(t for p in history.pods for t, _ in p.resizes)
    transitions = [(first, "monitoring", 1), (last, "rollingBack", 1)]
    history.events += [
        {"time": first + timedelta(seconds=s), "reason": reason, "message": message,
         "warning": False}
        for s, reason, message in [
            (0.0, EventReason.MONITORING_STARTED, "Monitoring recommendation 1 (turn 1)"),
            (0.1, EventReason.ROLLING_BACK_STARTED,
             "Rolling back: 0/3 pods adopted and healthy, 3 required; 3/3 pods OOMKilled (app)"),
            (0.2, EventReason.BACKOFF_TURN_COMPLETED, "Backoff turn 1 of 2 completed"),
            (0.3, EventReason.BACKOFF_EXHAUSTED, "Backoff exhausted after 2 turns"),
        ]
    ]  # fmt: skip
    later = datetime.now(UTC) + timedelta(minutes=3)
    page = tmp_path / "story.html"
    drawn = story.from_live(str(OWNER), "RollbackPolicy/shop/p", transitions, [], history, later)
    page.write_text(story.render(drawn))
    assert drawn.quiet > 170 and "then quiet for" in page.read_text()  # the tail is folded
    shown = measure_report(page)
    (lane,) = shown["lanes"]
    assert lane["labels"] and overlapping(lane["labels"]) == []
    assert any("0/3 adopted and healthy" in text for text, _ in lane["labels"])
    left, _, right, _ = lane["track"]
    assert lane["reach"] >= left + 0.9 * (right - left)  # the story fills the width
    assert len(shown["pods"]) == 3
    for pod in shown["pods"]:
        texts = [text for text, _ in pod["spans"]]
        assert "256Mi" in texts and "768Mi" in texts, pod  # each resize, drawn
