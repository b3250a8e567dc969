"""Policy status, the control annotation and observe-only policies, end to end: the simulated
cluster over HTTP, the real worker (a child process), the real intake, the real Temporal dev
server. One world, one namespace per story, so the stories run side by side."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import shlex
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from cli.main import main
from sim.scenario import Apply, Scenario, Step, World
from tests.conftest import ROOT
from worker import temporal as control
from worker.config import IntakeConfig, KubeConfig, TemporalConfig
from worker.process import IntakeService
from workflows.activity_api import OwnerRef
from workflows.contract import (
    CONTROL_ANNOTATION,
    OBSERVE_ONLY_ANNOTATION,
    PAUSE_UNTIL_ANNOTATION,
    ROLLBACK_REQUESTS_ANNOTATION,
    ROLLBACK_STATE_ANNOTATION,
    EventReason,
)

Obj = dict[str, Any]


def deployment(namespace: str, name: str = "api", replicas: int = 2) -> Obj:
    labels = {"app": name}
    return {
        "manifest": {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "containers": [
                            {
                                "name": "app",
                                "image": "shop/api:1",
                                "resources": {
                                    "requests": {"memory": "1Gi"},
                                    "limits": {"memory": "1Gi"},
                                },
                            }
                        ]
                    },
                },
            },
        },
        "behaviour": {"app": {"workingSet": "600Mi", "startup": 0.2}},
    }


def rollback_policy(namespace: str, *, annotations: Obj | None = None, **spec: Any) -> Obj:
    return {
        "apiVersion": "rightsizing.kubex.ai/v1alpha1",
        "kind": "RollbackPolicy",
        "metadata": {"name": "policy", "namespace": namespace, "annotations": annotations or {}},
        "spec": {
            "monitoringPeriod": "2s",
            "rollbackTarget": "manifest",
            "adoptionThresholdPercent": 100,
            "backoff": {"timePeriod": "3s", "multiplyByTurn": 1, "maxAttempts": 1},
            "weight": 0,  # the CRD's default, which a real API server fills in
        }
        | spec,
    }


SCENARIO = Scenario.model_validate(
    {
        "name": "policy-status",
        "workloads": [
            deployment("ok"),
            deployment("oom"),
            deployment("watch"),
            deployment("ctl"),
            deployment("none"),
            deployment("held"),
            deployment("held-pod"),
            deployment("held-between"),
        ],
        "policies": [
            rollback_policy("ok"),
            rollback_policy("oom"),
            rollback_policy("watch", annotations={OBSERVE_ONLY_ANNOTATION: "true"}),
            rollback_policy("ctl", monitoringPeriod="1h"),
            rollback_policy("none", scope={"labelSelector": {"matchLabels": {"app": "other"}}}),
            rollback_policy("held"),
            rollback_policy("held-pod"),
            rollback_policy("held-between"),
        ],
    }
)
FITS = {"app": {"memory": "768Mi"}}  # above the 600Mi working set: healthy
OOMS = {"app": {"memory": "256Mi"}}  # below it: OOMKilled


@pytest.fixture(scope="module")
async def world() -> AsyncIterator[World]:
    with tempfile.TemporaryDirectory(prefix="rollback-status-") as tmp:
        w = World(SCENARIO, lambda line: None, Path(tmp))
        try:
            await w.start()
            yield w
        finally:
            await w.stop()


async def until(check: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        found = check()
        if found:
            return found
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError("condition never held")
        await asyncio.sleep(0.1)


def status(world: World, namespace: str) -> Obj:
    store = world.api.store
    return store.get(store.rtype("RollbackPolicy"), namespace, "policy").get("status") or {}


def condition(world: World, namespace: str, kind: str) -> Obj:
    found = [c for c in status(world, namespace).get("conditions", []) if c["type"] == kind]
    return found[0] if found else {}


def owner(world: World, namespace: str) -> Obj:
    store = world.api.store
    return store.get(store.rtype("Deployment"), namespace, "api")


def state(world: World, namespace: str) -> Obj:
    raw = (owner(world, namespace)["metadata"].get("annotations") or {}).get(
        ROLLBACK_STATE_ANNOTATION
    )
    return json.loads(raw) if raw else {}


def events(world: World, namespace: str, reason: EventReason) -> list[Obj]:
    return [e for e in world.api.store.items("Event", namespace) if e.get("reason") == reason]


async def apply(world: World, namespace: str, requests: Obj) -> None:
    await world.run_step(
        Step(
            apply=Apply(workload=f"{namespace}/Deployment/api", requests=requests, limits=requests)
        )
    )


def annotate(world: World, namespace: str, value: str) -> None:
    store = world.api.store
    store.patch(
        store.rtype("Deployment"),
        namespace,
        "api",
        {"metadata": {"annotations": {CONTROL_ANNOTATION: value}}},
        "application/merge-patch+json",
    )


async def test_status_follows_success_rollback_failure_and_no_match(world: World) -> None:
    # Every policy gets a status; the one that selects nothing says so.
    await until(lambda: all(status(world, ns) for ns in ("ok", "oom", "watch", "ctl", "none")))
    none = condition(world, "none", "WorkloadsMatched")
    assert none["status"] == "False" and none["reason"] == "NoMatchingWorkloads"
    assert condition(world, "none", "Ready")["status"] == "True"
    matched = condition(world, "ok", "WorkloadsMatched")
    assert matched["status"] == "True" and "applies to 1" in matched["message"]
    assert status(world, "ok")["observedGeneration"] == 1

    await apply(world, "ok", FITS)
    await apply(world, "oom", OOMS)
    # A rollback: the workload counts as active while it rolls back and backs off ...
    await until(lambda: state(world, "oom").get("mode") == "backingOff")
    await until(lambda: status(world, "oom").get("activeTrackedWorkloads") == 1)
    # ... then as failed once the backoff is exhausted, with the reason in lastErrorSummary.
    await until(lambda: state(world, "oom").get("mode") == "failedPermanent")
    final = await until(lambda: (s := status(world, "oom")).get("failedWorkloads") == 1 and s)
    assert final["activeTrackedWorkloads"] == 0
    assert "oom/Deployment/api" in final["lastErrorSummary"]
    assert "oomKilled" in final["lastErrorSummary"]
    # The success: nothing active, nothing failed, no problem to report.
    await until(lambda: state(world, "ok").get("mode") == "monitoringSucceeded")
    ok = await until(lambda: (s := status(world, "ok")).get("activeTrackedWorkloads") == 0 and s)
    assert ok["failedWorkloads"] == 0 and "lastErrorSummary" not in ok


@pytest.mark.parametrize(("ns", "scope"), [("held", "namespace"), ("held-pod", "pod")])
async def test_a_pause_holds_the_verdict_and_the_policy_says_so(
    world: World, ns: str, scope: str
) -> None:
    """Kubex's pause on the namespace, or on the workload's pod, as a bad cut is monitored: the
    verdict waits (its RollbackPaused Event proves it was reached), the policy's WorkloadsPaused
    condition names the workload; the pause removed, the intake's resume lets the rollback go at
    once."""
    store = world.api.store
    paused_pods: list[str] = []

    def pause(value: str | None) -> None:
        body = {"metadata": {"annotations": {PAUSE_UNTIL_ANNOTATION: value}}}
        if scope == "namespace":
            store.patch(store.rtype("Namespace"), None, ns, body, "application/merge-patch+json")
            return
        paused_pods[:] = paused_pods or [p["metadata"]["name"] for p in store.items("Pod", ns)]
        for pod in paused_pods:
            store.patch(store.rtype("Pod"), ns, pod, body, "application/merge-patch+json")

    await apply(world, ns, OOMS)
    await until(lambda: state(world, ns).get("mode") == "monitoring")
    pause("infinite")
    (held,) = await until(lambda: events(world, ns, EventReason.PAUSED))
    assert held["message"].startswith(f"verdict held: paused by {scope} ")
    assert state(world, ns)["mode"] == "monitoring"  # nothing written
    paused = await until(
        lambda: (c := condition(world, ns, "WorkloadsPaused"))["status"] == "True" and c
    )
    assert paused["reason"] == "Held" and f"{ns}/Deployment/api" in paused["message"]
    pause(None)
    await until(lambda: state(world, ns).get("mode") in ("rollingBack", "backingOff"), 10)
    await until(lambda: condition(world, ns, "WorkloadsPaused")["status"] == "False")


async def restart_intake(world: World, identity: str) -> IntakeService:
    """A new intake in place of the world's, as a new leader's term would start."""
    assert world.intake is not None
    await asyncio.to_thread(world.intake.stop)
    temporal = TemporalConfig.at(world.temporal.address, world.task_queue, world.first.name)
    kube = KubeConfig(url=world.api.url)
    world.first.intake = IntakeService(
        await temporal.connect(),
        kube.client(),
        IntakeConfig(temporal, kube, identity=identity),
        lease_duration=3.0,
    ).start()
    return world.first.intake


async def test_a_pause_lifted_between_two_leaders_terms_resumes_the_run(world: World) -> None:
    """A pause holds the verdict, and goes while no intake leads, so no watch sees it go: the
    next term's intake finds the run Temporal shows held and resumes it. (A held verdict also
    wakes on the observe each term sends anew; a held rollback or re-apply would not, and
    would wait for its own look again, 10 minutes on.)"""
    ns, store = "held-between", world.api.store

    def pause(value: str | None) -> None:
        body = {"metadata": {"annotations": {PAUSE_UNTIL_ANNOTATION: value}}}
        store.patch(store.rtype("Namespace"), None, ns, body, "application/merge-patch+json")

    await apply(world, ns, OOMS)
    await until(lambda: state(world, ns).get("mode") == "monitoring")
    pause("infinite")
    await until(lambda: events(world, ns, EventReason.PAUSED))
    client = await TemporalConfig.at(world.temporal.address, world.task_queue).connect()
    runs: list[OwnerRef] = []
    for _ in range(100):  # Temporal's visibility shows it held (the new term's query reads it)
        if runs := await control.held_runs(client, world.first.name):
            break
        await asyncio.sleep(0.1)
    assert [str(o) for o in runs] == [f"{ns}/Deployment/api"]
    assert world.intake is not None
    await asyncio.to_thread(world.intake.stop)
    pause(None)  # no intake: no watch sees it go
    service = await restart_intake(world, "after-the-pause")
    await until(lambda: service.intake.stats["resumes"] == 1)
    await until(lambda: state(world, ns).get("mode") in ("rollingBack", "backingOff"))


async def test_status_survives_an_intake_restart_without_a_write(world: World) -> None:
    await until(lambda: state(world, "oom").get("mode") == "failedPermanent")
    await until(lambda: status(world, "oom").get("failedWorkloads") == 1)
    assert world.intake is not None
    # Every write due has been made and seen back through the watch: nothing is pending.
    await until(lambda: world.intake is not None and world.intake.intake.status.pending() == 0)
    before = {ns: status(world, ns) for ns in ("ok", "oom", "watch", "ctl", "none")}
    restarted = (await restart_intake(world, "restarted")).intake
    await until(lambda: restarted.status.passes >= 1)
    assert restarted.status.sync() == 0  # it computes the status it found: nothing to write
    assert restarted.status.writes == 0
    assert {ns: status(world, ns) for ns in before} == before


async def test_observe_only_reports_the_rollback_it_would_make_and_changes_nothing(
    world: World,
) -> None:
    await apply(world, "watch", OOMS)
    backing_off = await until(
        lambda: (s := state(world, "watch")).get("mode") == "backingOff" and s
    )
    assert [h["mode"] for h in backing_off["history"]] == [
        "monitoring",
        "rollingBack",
        "backingOff",
    ]
    assert "would have rolled back to manifest" in backing_off["failureMessage"]
    assert backing_off["failureReason"] == "oomKilled"
    (event,) = await until(lambda: events(world, "watch", EventReason.ROLLING_BACK_STARTED))
    assert "would roll back to manifest" in event["message"]
    await until(lambda: state(world, "watch").get("mode") == "failedPermanent")
    annotations = owner(world, "watch")["metadata"].get("annotations") or {}
    assert ROLLBACK_REQUESTS_ANNOTATION not in annotations  # no rollback was published
    for pod in world.api.store.items("Pod", "watch"):  # and every pod still runs the cut
        (container,) = pod["spec"]["containers"]
        assert container["resources"]["requests"]["memory"] == "256Mi"
    assert condition(world, "watch", "Ready")["reason"] == "Valid"
    assert "observe-only" in condition(world, "watch", "Ready")["message"]
    await until(lambda: status(world, "watch").get("failedWorkloads") == 1)


async def test_control_annotation_cancels_and_reopens_exactly_once(world: World) -> None:
    await apply(world, "ctl", FITS)
    await until(lambda: state(world, "ctl").get("mode") == "monitoring")
    await until(lambda: status(world, "ctl").get("activeTrackedWorkloads") == 1)

    annotate(world, "ctl", "cancel")
    await until(lambda: state(world, "ctl").get("mode") == "cancelled")
    await until(lambda: CONTROL_ANNOTATION not in owner(world, "ctl")["metadata"]["annotations"])
    await until(lambda: status(world, "ctl").get("activeTrackedWorkloads") == 0)

    annotate(world, "ctl", "reopen")
    await until(lambda: state(world, "ctl").get("mode") == "monitoring")
    await until(lambda: CONTROL_ANNOTATION not in owner(world, "ctl")["metadata"]["annotations"])

    annotate(world, "ctl", "sideways")  # an unknown value: said on the owner, removed
    (rejected,) = await until(lambda: events(world, "ctl", EventReason.CONTROL_REJECTED))
    assert "unknown value 'sideways'" in rejected["message"]
    await until(lambda: CONTROL_ANNOTATION not in owner(world, "ctl")["metadata"]["annotations"])

    # A duplicate would be carried out before a later control of the same owner (controls of
    # one owner run one at a time, in watch order): once a marker control is done, none is due.
    annotate(world, "ctl", "marker")
    await until(lambda: len(events(world, "ctl", EventReason.CONTROL_REJECTED)) == 2)
    await until(lambda: CONTROL_ANNOTATION not in owner(world, "ctl")["metadata"]["annotations"])
    assert len(events(world, "ctl", EventReason.MONITORING_CANCELLED)) == 1
    started = events(world, "ctl", EventReason.MONITORING_STARTED)
    assert [e["message"].split(" ")[0] for e in started] == ["Monitoring", "Reopened"]
    modes = [h["mode"] for h in state(world, "ctl")["history"]]
    assert modes == ["monitoring", "cancelled", "monitoring"]


async def rollbackctl(*argv: str) -> int:
    """``rollbackctl`` in a thread (it runs its own event loop); the test's logging restored."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        return await asyncio.to_thread(main, list(argv))
    finally:
        root.handlers[:], root.level = handlers, level


async def test_rollbackctl_shows_policies_as_kubectl_would(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    await until(lambda: status(world, "oom").get("failedWorkloads") == 1)
    await until(lambda: status(world, "ctl").get("activeTrackedWorkloads") == 1)
    kube = ["--kube-url", world.api.url]
    temporal = ["--address", world.temporal.address, "--task-queue", world.task_queue]

    code = await rollbackctl("get", "policies", *kube)
    out = capsys.readouterr().out
    assert code == 0
    header, *lines = out.splitlines()
    assert header.split() == [
        "KIND",
        "NAMESPACE",
        "NAME",
        "READY",
        "ACTIVE",
        "FAILED",
        "WEIGHT",
        "AGE",
    ]
    rows = {line.split()[1]: line.split() for line in lines}
    assert await rollbackctl("get", "policies", "-o", "wide", *kube) == 0
    wide = capsys.readouterr().out.splitlines()[0].split()
    assert wide[-4:] == ["TARGET", "MONITORING", "THRESHOLD", "AGE"]
    assert rows["oom"][3:7] == ["True", "0", "1", "0"]
    assert rows["ctl"][3:7] == ["True", "1", "0", "0"]
    assert len(rows) == len(SCENARIO.policies)

    code = await rollbackctl("describe", "rbp", "oom/policy", *kube, *temporal)
    out = capsys.readouterr().out
    assert code == 0, out
    assert "Failed:       1" in out and "WorkloadsMatched=True (Matched)" in out
    assert "Tracked workloads:\n  oom/Deployment/api  failedPermanent turn 1" in out

    code = await rollbackctl("describe", "rbp", "policy", "-n", "ctl", *kube, *temporal)
    out = capsys.readouterr().out
    assert code == 0 and "  ctl/Deployment/api  monitoring turn 1" in out

    code = await rollbackctl("describe", "rbp", "nope/policy", *kube, *temporal)
    assert code == 1 and "RollbackPolicy nope/policy not found" in capsys.readouterr().err
    await _as_the_docs_show(kube, temporal, capsys)


def _docs_example() -> list[tuple[list[str], list[str]]]:
    """The commands the status page shows "from a run of" this module's stories, with their
    output: (argv after ``rollbackctl``, lines)."""
    page = (ROOT / "docs" / "concepts" / "status-and-control.md").read_text(encoding="utf-8")
    block = re.search(r"From a run of `tests/e2e/test_policy_status.py`.*?```console\n(.*?)```",
                      page, re.S)  # fmt: skip
    assert block is not None, "the status page shows a run of this module's stories"
    shown = []
    for part in re.split(r"^\$ rollbackctl ", block[1], flags=re.M)[1:]:
        command, *output = part.splitlines()
        argv = shlex.split(command)
        shown.append((argv[: argv.index("--kube-url")], output))
    return shown


def _same(line: str) -> str:
    """A line as two runs print it alike: times, ages and ports aside."""
    line = re.sub(r"\d{4}-\d\d-\d\dT[\d:.]+(Z|\+00:00)", "<time>", line)
    return " ".join(re.sub(r"^\d+[smhd]$", "<age>", word) for word in line.split())


async def _as_the_docs_show(
    kube: list[str], temporal: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Each command the status page shows, run here: every line it shows is one it prints."""
    for argv, output in _docs_example():
        assert await rollbackctl(*argv, *kube, *temporal) == 0, argv
        printed = {_same(line) for line in capsys.readouterr().out.splitlines()}
        missing = [line for line in output if _same(line) not in printed]
        assert not missing, (argv, missing, sorted(printed))
