"""Fault injection: the story under faults ends as it does without them (``EXPECTED``).

Ten workloads on the simulated cluster: four succeed, four OOM and roll back to their manifest,
one is deleted in the middle of its window, one loses its policy in the middle of its backoff.
Bad input rides along: an unreadable rollback-state annotation on one owner and a malformed
recommendation on a pod. The faulted runs (annotations and in-place actuation) make about one
API request in five fail at the API server (500 and 429 on any verb, 409 on updates, and
timeouts: the server answers after the client gave up, so a write may land after its caller saw
it fail), SIGKILL the worker the moment a workload is first seen mid-window, mid-rollback and
mid-backoff, and restart the Temporal server once on its SQLite file. Asserted: the same final
mode for every workload as without faults, each rollback recommendation written once per
rollback, no pod resized back to its manifest (or, in place, deleted to be recreated) twice, no
workflow left running, and an Event for every bad input.
"""

from __future__ import annotations

import asyncio
import copy
import json
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowExecutionStatus

from sim.apiserver import Fault
from sim.scenario import Scenario, Step, World
from worker.config import WORKER_AGENT
from workflows.contract import ROLLBACK_REQUESTS_ANNOTATION, ROLLBACK_STATE_ANNOTATION, Mode

NS = "faults"
OK = {"app": {"memory": "512Mi"}}
OOM = {"app": {"memory": "256Mi"}}
MANIFEST_RESOURCES = {"requests": {"memory": "1Gi"}, "limits": {"memory": "1Gi"}}


def deployment(
    name: str, labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "manifest": {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                "name": name,
                "namespace": NS,
                "labels": labels or {},
                "annotations": annotations or {},
            },
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name}},
                    "spec": {
                        "containers": [
                            {
                                "name": "app",
                                "image": "x",
                                "resources": copy.deepcopy(MANIFEST_RESOURCES),
                            }
                        ]
                    },
                },
            },
        },
        "behaviour": {"app": {"workingSet": "400Mi", "startup": 0.3}},
    }


def policy(name: str, selector: dict[str, Any], backoff: str) -> dict[str, Any]:
    return {
        "apiVersion": "rightsizing.kubex.ai/v1alpha1",
        "kind": "RollbackPolicy",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "scope": {"labelSelector": selector},
            "monitoringPeriod": "3s",
            "rollbackTarget": "manifest",
            "adoptionThresholdPercent": 100,
            "backoff": {"timePeriod": backoff, "multiplyByTurn": 1, "maxAttempts": 1},
        },
    }


def apply(name: str, requests: dict[str, dict[str, str]], at: float) -> dict[str, Any]:
    return {
        "at": at,
        "apply": {"workload": f"{NS}/Deployment/{name}", "requests": requests, "limits": requests},
    }


OKS = ["ok-1", "ok-2", "ok-3", "ok-4"]
OOMS = ["oom-1", "oom-2", "oom-3", "oom-4"]
SCENARIO = {
    "name": "faults",
    "timeout": 90,
    "nodes": [{"name": "node-1", "cpu": "32", "memory": "64Gi"}],
    "workloads": [
        *(
            deployment(
                n, annotations={ROLLBACK_STATE_ANNOTATION: "{not json"} if n == "ok-2" else None
            )
            for n in OKS
        ),
        *(deployment(n) for n in OOMS),
        deployment("gone"),
        deployment("unpoliced", labels={"policy": "extra"}),
    ],
    "policies": [
        policy("main", {"matchExpressions": [{"key": "policy", "operator": "DoesNotExist"}]}, "2s"),
        # A long backoff: the policy is deleted once the backoff shows, however late under faults.
        policy("extra", {"matchLabels": {"policy": "extra"}}, "30s"),
    ],
    "steps": [
        *(apply(n, OK, 1) for n in OKS),
        *(apply(n, OOM, 1) for n in OOMS),
        apply("gone", OK, 1),
        apply("unpoliced", OOM, 1),
        {"at": 3, "delete": {"kind": "Deployment", "namespace": NS, "name": "gone"}},
    ],
}
EXPECTED = {
    **dict.fromkeys(OKS, "monitoringSucceeded"),
    **dict.fromkeys(OOMS, "failedPermanent"),
    "gone": "deleted",
    "unpoliced": None,
}
ROLLED_BACK_ONCE = dict.fromkeys([*OOMS, "unpoliced"], 1)
# The worker is SIGKILLed as soon as any workload is seen in each of these modes, in turn.
KILL_ON = (
    Mode.MONITORING,  # mid-window
    Mode.ROLLING_BACK,  # mid-rollback: the rollback is being published
    Mode.BACKING_OFF,  # mid-backoff
)


KUBE_TIMEOUT = 2.0


def api_faults() -> list[Fault]:
    """About 20% of requests: 6% each of 500 and 429, 4% timeouts, and 6% of updates 409."""
    return [
        Fault(status=500, times=None, probability=0.06),
        Fault(status=429, times=None, probability=0.06),
        Fault(status=None, delay=KUBE_TIMEOUT + 1, times=None, probability=0.04),
        Fault(status=409, method="PUT|PATCH", times=None, probability=0.06),
    ]


def bad_pod_reported(world: World) -> bool:
    """The malformed recommendation's Event is there (its creation may be retried a while)."""
    return any(
        e["owner"] == f"{NS}/Pod/stray" and e["reason"] == "RollbackRecommendationMalformed"
        for e in world.recorder.events
    )


async def kill_worker_in_modes(world: World, modes: tuple[Mode, ...]) -> list[str]:
    """SIGKILL the worker (back after 1s) the first time any workload is in each mode."""
    killed = []
    for mode in modes:
        while not any(
            (world.state_of(f"{NS}/Deployment/{name}") or {}).get("mode") == mode
            for name in EXPECTED
        ):
            await asyncio.sleep(0.05)
        await world.run_step(Step(kill_worker={"for": "1s"}))
        killed.append(mode.value)
    return killed


async def story(actuation: str = "annotations") -> dict[str, Any]:
    scenario = Scenario.model_validate({**copy.deepcopy(SCENARIO), "actuation": actuation})
    lines: list[str] = []
    rollbacks_written: Counter[str] = Counter()  # owner -> rollback recommendations published
    last_rollback: dict[str, str | None] = {}
    with tempfile.TemporaryDirectory() as tmp:
        world = World(scenario, lines.append, Path(tmp), kube_timeout=KUBE_TIMEOUT)

        def count_rollbacks(kind: str, rtype: Any, obj: dict[str, Any]) -> None:
            if rtype.kind == "Deployment" and kind == "MODIFIED":
                value = (obj["metadata"].get("annotations") or {}).get(ROLLBACK_REQUESTS_ANNOTATION)
                name = obj["metadata"]["name"]
                if value and last_rollback.get(name) != value:
                    rollbacks_written[name] += 1
                last_rollback[name] = value

        world.api.store.listeners.append(count_rollbacks)
        await world.start()
        injected = [world.api.inject(f) for f in api_faults()]
        kills = asyncio.create_task(kill_worker_in_modes(world, KILL_ON))
        steps = [Step.model_validate(s) for s in SCENARIO["steps"]]
        steps += [Step(at=7.5, restart_temporal={"for": "1s"})]
        for step in sorted(steps, key=lambda s: s.at):
            delay = step.at - (time.monotonic() - world.recorder.start)
            if delay > 0:
                await asyncio.sleep(delay)
            await world.run_step(step)
        # The policy goes away while its workload backs off (whenever that is, faults or not).
        while time.monotonic() - world.recorder.start < 90:
            if (world.state_of(f"{NS}/Deployment/unpoliced") or {}).get("mode") == "backingOff":
                break
            await asyncio.sleep(0.2)
        await world.run_step(
            Step(delete={"kind": "RollbackPolicy", "namespace": NS, "name": "extra"})
        )
        # A pod with a malformed recommendation. A bare one: the simulated applier keeps the
        # pods of a workload carrying exactly their owner's recommendation, so it would remove
        # the bad annotation, perhaps before an intake between two leaderships had seen it.
        world.api.store.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": "stray",
                    "namespace": NS,
                    "annotations": {
                        "proactive.rightsizing.kubex.ai/desired-resource-requests": "{oops"
                    },
                },
                "spec": {"containers": [{"name": "app", "image": "x"}]},
            }
        )
        deadline = time.monotonic() + 75
        modes: dict[str, Any] = {}
        while time.monotonic() < deadline:
            modes = {}
            for name in EXPECTED:
                try:
                    obj = world.api.store.get(world.api.store.rtype("Deployment"), NS, name)
                except Exception:
                    modes[name] = "deleted"
                    continue
                raw = (obj["metadata"].get("annotations") or {}).get(ROLLBACK_STATE_ANNOTATION)
                try:
                    modes[name] = json.loads(raw)["mode"] if raw else None
                except ValueError:
                    modes[name] = "unreadable"
            if modes == EXPECTED and bad_pod_reported(world):
                break
            await asyncio.sleep(0.5)
        # No stuck workflow: every run ends within a bounded time (activity retries included).
        assert world.intake is not None
        client = world.intake.intake.delivery.client
        running: list[str] = []
        for _ in range(60):
            running = [
                wf.id
                async for wf in client.list_workflows(f'TaskQueue = "{world.task_queue}"')
                if wf.status is WorkflowExecutionStatus.RUNNING
            ]
            if not running:
                break
            await asyncio.sleep(0.5)
        killed = await asyncio.wait_for(kills, 5)
        events = [(e["owner"], e["reason"]) for e in world.recorder.events]
        reported = bad_pod_reported(world)
        await world.stop(graceful=False)
        restored_by_resize = [
            pod
            for pod, resources in world.sim.resizes
            if json.loads(resources) == MANIFEST_RESOURCES
        ]
        recreated = [  # a restore's crash-looping pods, deleted by the worker (in place)
            r.path.rsplit("/", 1)[-1]
            for r in world.api.journal
            if r.method == "DELETE" and "/pods/" in r.path and r.status < 300
            and r.agent.startswith(WORKER_AGENT)
        ]  # fmt: skip
        return {
            "modes": modes,
            "rollbacks": dict(rollbacks_written),
            "running": running,
            "events": events,
            "lines": lines,
            "killed": killed,
            "bad_pod_reported": reported,
            # Pods the kubelet resized back to the manifest more than once, or a restore deleted
            # (to be recreated) more than once: a rollback applied twice. (Other values may
            # recur: a cleared rollback lets the recommendation back.)
            "rolled_back_twice": [
                pod
                for pod, n in (Counter(restored_by_resize) + Counter(recreated)).items()
                if n > 1
            ],
            "rolled_back_pods": {*restored_by_resize, *recreated},
            "requests": len(world.api.journal),
            "faults": {f"{f.status or 'timeout'} {f.method or 'any'}": f.hits for f in injected},
        }


ACTUATIONS = ("annotations", "in-place")


@pytest.fixture(scope="module")
async def stories() -> AsyncIterator[dict[str, asyncio.Task[dict[str, Any]]]]:
    """Both actuations' stories, told at once: each mostly waits (on its windows, on a killed
    worker's restart, on Temporal's), so together they take about as long as the longer."""
    tasks = {actuation: asyncio.create_task(story(actuation)) for actuation in ACTUATIONS}
    yield tasks
    for task in tasks.values():
        task.cancel()
    await asyncio.gather(*tasks.values(), return_exceptions=True)


@pytest.mark.parametrize("actuation", ACTUATIONS)
async def test_same_outcome_under_faults(
    actuation: str, stories: dict[str, asyncio.Task[dict[str, Any]]]
) -> None:
    result = await stories[actuation]
    detail = "\n".join(result["lines"][-60:])
    # The faults happened, at about the intended rate.
    print(f"{result['requests']} requests, faults injected: {result['faults']}")
    assert result["killed"] == [m.value for m in KILL_ON]
    assert all(result["faults"].values()), result["faults"]
    assert sum(result["faults"].values()) >= 0.1 * result["requests"]
    assert result["modes"] == EXPECTED, detail
    assert result["rollbacks"] == ROLLED_BACK_ONCE, (
        result["rollbacks"],
        detail,
    )
    assert result["running"] == [], detail
    assert result["rolled_back_twice"] == [], detail
    rolled_back_owners = {pod.rsplit("-", 2)[0] for pod in result["rolled_back_pods"]}
    assert rolled_back_owners == set(ROLLED_BACK_ONCE), result["rolled_back_pods"]
    reasons = set(result["events"])
    assert (
        f"{NS}/Deployment/ok-2",
        "RollbackMonitoringStarted",
    ) in reasons  # the unreadable state: replaced
    assert result["bad_pod_reported"], detail
    assert (f"{NS}/Deployment/unpoliced", "RollbackStateCleared") in reasons
