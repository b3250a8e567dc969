"""No poison pills in the intake: a bad pod or a bad policy is that object's problem, no
adoption is lost while Temporal is away, and the probes say how the intake really is."""

from __future__ import annotations

import asyncio
import tempfile
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
from kubernetes.client import CoreV1Api, CustomObjectsApi
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment

from sim.apiserver import Fault, KubeEmulator, free_port
from sim.devserver import DevServer
from tests import CLUSTER
from tests.activity.builders import NS, owner, pod, policy
from tests.intake.test_intake import (  # noqa: F401  (env: the fixture)
    REC,
    Env,
    add_pods,
    deployment,
    env,
    eventually,
    started,
)
from tests.workflow.helpers import terminate_running
from worker import process
from worker import temporal as temporal_module
from worker.config import IntakeConfig, KubeConfig, TemporalConfig, WorkerConfig
from worker.health import Health
from worker.intake import Intake
from worker.intake import delivery as delivery_module
from worker.kube import api_client
from workflows.contract import EventReason, Obj

BAD_CPU = '{"app":{"cpu":"1e1000000"}}'


def poison_annotations() -> dict[str, str]:
    return {REC.requests_key or "": BAD_CPU}


def in_other(obj: Obj) -> Obj:
    obj["metadata"]["namespace"] = "other"
    return obj


def warnings(api: KubeEmulator, namespace: str, reason: EventReason) -> list[Obj]:
    items, _ = api.store.list_objects(api.store.rtype("Event"), namespace)
    return [e for e in items if e["reason"] == reason and e["type"] == "Warning"]


async def test_a_poison_pod_and_a_poison_policy_stop_nothing_else(env: Env) -> None:  # noqa: F811
    """``1e1000000`` in a pod's recommendation used to raise decimal.Overflow out of the handler:
    the relist restarted forever and no pod anywhere was seen. A policy with a period beyond any
    date overflowed the same way. Both are present before the intake starts (the relist path)."""
    api = env.api
    api.store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "other"}})
    bad_policy = policy(name="poison", monitoringPeriod="100000000000h")
    bad_policy["metadata"]["namespace"] = "other"
    api.store.create(bad_policy)
    api.store.create(in_other(pod("poison-0", {"app": "poison"}, annotations=poison_annotations())))
    api.store.create(policy(monitoringPeriod="2s"))  # the good policy, in NS
    rs = deployment(api, replicas=1)
    add_pods(api, rs, ["web-a"])  # a healthy adoption in another namespace than the poison
    await started(env)
    await eventually(lambda: env.intake.stats["delivered"] == 1)
    result = await env.result()
    assert result.mode.value == "monitoringSucceeded"
    pods_informer = env.intake.informers.running[-1]
    assert pods_informer.relists == 1  # one relist, completed: the watch runs
    assert env.intake.stats["malformed"] == 1 and env.intake.stats["invalid_policies"] == 1
    await eventually(lambda: len(warnings(api, "other", EventReason.POLICY_INVALID)) == 1)
    assert len(warnings(api, "other", EventReason.RECOMMENDATION_MALFORMED)) == 1
    # And during a live watch: a new poison pod is skipped, a new good adoption is not.
    api.store.create(in_other(pod("poison-1", {"app": "poison"}, annotations=poison_annotations())))
    add_pods(api, rs, ["web-b"])
    await eventually(lambda: env.intake.stats["malformed"] == 2)
    await eventually(lambda: env.intake.stats["adoptions"] == 2)
    assert pods_informer.relists == 1


async def test_an_unexpected_error_skips_one_object_only(
    env: Env,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A bug met on one object (here: an owner lookup that raises KeyError for one pod) is
    logged, counted, reported as a Warning Event on that object, and skipped."""
    original = env.intake.owners.owner_of

    def owner_of(pod_obj: dict) -> object:  # type: ignore[type-arg]
        if pod_obj["metadata"]["name"] == "web-cursed":
            raise KeyError("ownerReferences")
        return original(pod_obj)

    monkeypatch.setattr(env.intake.owners, "owner_of", owner_of)
    env.api.store.create(policy(monitoringPeriod="2s"))
    rs = deployment(env.api, replicas=1)
    add_pods(env.api, rs, ["web-cursed", "web-a"])
    await started(env)
    await eventually(lambda: env.intake.stats["delivered"] >= 1)
    assert (await env.result()).mode.value == "monitoringSucceeded"
    assert env.intake.stats["bad_objects"] == 1
    skipped = warnings(env.api, NS, EventReason.OBJECT_SKIPPED)
    assert [e["involvedObject"]["name"] for e in skipped] == ["web-cursed"]


async def test_no_adoption_is_lost_while_temporal_is_away(
    temporal_env: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Temporal away for far longer than the old give-up (10 tries, about 2.5 minutes at the real
    backoff, where the adoption was dropped for good): every adoption made during the outage
    starts its workflow once Temporal is back. The outage is played at our own boundary
    (``worker.temporal.observe`` fails while it lasts) and the backoff is shortened, so 40 tries
    per owner take a second; after it, the real signal-with-start runs on the real server."""
    monkeypatch.setattr(delivery_module, "SIGNAL_BACKOFF_BASE", 0.005)
    monkeypatch.setattr(delivery_module, "SIGNAL_BACKOFF_CAP", 0.02)
    outage = {"on": True}
    real_observe = temporal_module.observe

    async def observe_through_outage(*args: object, **kwargs: object) -> object:
        if outage["on"]:
            raise RPCError("tcp connect error", RPCStatusCode.UNAVAILABLE, b"")
        return await real_observe(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(temporal_module, "observe", observe_through_outage)
    with KubeEmulator() as api:
        kube = api_client(url=api.url)
        queue = f"outage-{uuid.uuid4().hex[:6]}"
        intake = Intake(
            CoreV1Api(kube),
            CustomObjectsApi(kube),
            temporal_env.client,
            CLUSTER,
            queue,
            asyncio.get_running_loop(),
        )
        api.store.create(policy(monitoringPeriod="1h"))
        names = ["web", "api", "db"]
        try:
            await asyncio.to_thread(intake.start)
            for name in names:
                dep = api.store.create(owner("Deployment", name=name, replicas=1))
                ref = {"kind": "Deployment", "name": name, "uid": dep["metadata"]["uid"]}
                api.store.create(
                    pod(
                        f"{name}-0",
                        {"app": name},
                        "512Mi",
                        REC,
                        owner_ref=ref | {"controller": True},
                    )
                )
            await eventually(lambda: intake.stats["signal_retries"] >= 3 * 40)
            assert intake.stats["delivered"] == 0
            outage["on"] = False  # Temporal is back
            await eventually(lambda: intake.stats["delivered"] == 3)
            # Described by id (read from the history, strongly consistent), not listed: a
            # visibility query may not show a workflow started a moment ago yet.
            for n in names:
                handle = temporal_env.client.get_workflow_handle(
                    f"rollback/{CLUSTER}/{NS}/Deployment/{n}"
                )
                assert (await handle.describe()).task_queue == queue
        finally:
            await asyncio.to_thread(intake.stop)
            await terminate_running(temporal_env.client, queue)


def probe(health: Health, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{health.port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


async def test_intake_probes_reflect_its_informers(
    temporal_env: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Probes used to hit /metrics: an intake whose informers fail forever was "healthy"."""
    monkeypatch.setattr(process, "STUCK_AFTER", 1.0)
    with KubeEmulator() as api:
        api.store.create(policy())
        config = IntakeConfig(
            TemporalConfig.at("unused", "q", CLUSTER),
            KubeConfig(url=api.url),
            identity="probe-test",
        )
        service = process.IntakeService(
            temporal_env.client, api_client(url=api.url), config, lease_duration=3.0
        ).start()
        health = Health()
        health.live("intake", service.live)
        health.ready("intake", service.ready)
        health.serve("127.0.0.1:0")
        try:
            await eventually(service.intake.started.is_set)  # leading, informers synced
            assert probe(health, "/readyz")[0] == 200
            assert probe(health, "/livez")[0] == 200
            # The API server starts failing every pod LIST and WATCH: not ready at once, not live
            # once the failures outlast STUCK_AFTER.
            api.inject(Fault(status=500, method="GET", path="/api/v1/pods", times=None))
            api.store.drop_watches()
            await eventually(lambda: probe(health, "/readyz")[0] == 503)
            await eventually(lambda: probe(health, "/livez")[0] == 503)
            assert "pods informer failing" in probe(health, "/livez")[1]
            api.faults.clear()
            await eventually(lambda: probe(health, "/livez")[0] == 200, timeout=40)
            await eventually(lambda: probe(health, "/readyz")[0] == 200)
        finally:
            health.stop()
            await asyncio.to_thread(service.stop)


async def test_worker_probes_reflect_temporal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(process, "TEMPORAL_CHECK_EVERY", 0.5)
    port, health_port = free_port(), free_port()
    with tempfile.TemporaryDirectory() as tmp, KubeEmulator() as api:
        server = DevServer(Path(tmp) / "t", port, headless=True, log_path=Path(tmp) / "log")
        await asyncio.to_thread(server.start)
        config = WorkerConfig(
            TemporalConfig.at(server.address, f"probe-{uuid.uuid4().hex[:6]}", CLUSTER),
            KubeConfig(url=api.url, health_address=f"127.0.0.1:{health_port}"),
        )
        stop = asyncio.Event()
        serving = asyncio.create_task(process.serve(stop, worker=config))

        def get(path: str) -> int:
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{health_port}{path}", timeout=5
                ) as r:
                    return r.status
            except urllib.error.HTTPError as err:
                return err.code
            except OSError:
                return 0

        try:
            await eventually(lambda: get("/readyz") == 200, timeout=30)
            assert get("/livez") == 200
            await asyncio.to_thread(server.stop)
            await eventually(lambda: get("/readyz") == 503, timeout=30)
        finally:
            stop.set()
            await asyncio.to_thread(server.stop)
            await asyncio.wait_for(serving, 60)
