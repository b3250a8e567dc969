"""Leadership and informer errors at their edges (issue "trust at scale", points 1 and 2).

- A leader is fenced by its Lease: ``LeaderElector.holds`` turns false ``renew_deadline`` after
  the last renewal began, even while a renewal hangs in the API server; an intake whose fence is
  down sends no signal and writes nothing.
- An intake stopped while it waits for its informers to sync (the Lease lost during start-up)
  starts nothing more: no status writer, no pods watch, no write.
- The informer classifies a handler's API error: a 4xx is that object's problem (reported at
  once, not retried six times on the watch thread), a 5xx is retried and then reported; an object
  listed without ``kind`` is reported under the kind the informer lists.
"""

from __future__ import annotations

import asyncio
import math
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import ApiClient, CoreV1Api, CustomObjectsApi
from kubernetes.client.exceptions import ApiException
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from sim.apiserver import Fault, KubeEmulator, free_port
from sim.devserver import DevServer
from tests import CLUSTER
from tests.activity.builders import pod, policy
from tests.intake.test_intake import REC, WEB, add_pods, deployment, eventually
from worker import informer as informer_module
from worker.config import TemporalConfig
from worker.informer import Informer
from worker.intake import SIGNAL_TIMEOUT, Intake
from worker.kube import api_client
from worker.leader import LeaderElector
from workflows.contract import EventReason

WRITES = ("POST", "PUT", "PATCH", "DELETE")


@pytest.fixture
def cluster() -> Iterator[tuple[KubeEmulator, ApiClient]]:
    with KubeEmulator() as api, api_client(url=api.url) as client:
        yield api, client


def test_the_fence_falls_while_a_renewal_hangs(cluster: tuple[KubeEmulator, ApiClient]) -> None:
    api, client = cluster
    elector = LeaderElector(
        CustomObjectsApi(client), "default", "intake", "me", lambda: None, lambda: None,
        lease_duration=3.0, renew_deadline=1.0, retry_period=0.2,
    )  # fmt: skip
    elector.start()
    try:
        assert elector.leading.wait(5) and elector.holds()
        assert 0 < elector.time_left() <= 1.0  # what a signal may take: no more than the term
        # Every renewal now hangs in the server (4 s, past the client's patience or not).
        api.inject(Fault(status=None, method="PUT", path="/leases/", times=None, delay=4.0))
        deadline = time.monotonic() + 3
        while elector.holds() and time.monotonic() < deadline:
            time.sleep(0.02)
        # The election thread is stuck in the renewal; the fence fell anyway, before the
        # Lease (3 s) can expire for another candidate.
        assert not elector.holds() and elector.time_left() == 0
    finally:
        api.faults.clear()
        elector.stop(release=False)


def _intake(client: ApiClient, temporal: Any = None, fence: Any = lambda: math.inf) -> Intake:
    loop = asyncio.new_event_loop()
    return Intake(
        CoreV1Api(client), CustomObjectsApi(client), temporal, CLUSTER, "q", loop, fence=fence
    )


def test_an_intake_stopped_while_starting_starts_nothing_more(
    cluster: tuple[KubeEmulator, ApiClient],
) -> None:
    """The Lease is lost while the intake waits for its informers: ``stop`` runs, then ``start``
    must not carry on (it used to start the status writer and the pods watch: a non-leader
    writing statuses and signalling)."""
    api, client = cluster
    api.store.create(policy(monitoringPeriod="2s"))
    api.inject(Fault(status=None, method="GET", path="^/api/v1/namespaces$", delay=1.5))
    intake = _intake(client)
    starting = threading.Thread(target=intake.start)
    starting.start()
    deadline = time.monotonic() + 5
    while not any(r.path == "/api/v1/namespaces" for r in api.journal):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    intake.stop()  # the namespaces LIST is still being answered
    starting.join(10)
    assert not starting.is_alive() and not intake.started.is_set()
    assert api.store.watching("Pod") == 0
    assert not any("/pods" in r.path for r in api.journal)  # the pods informer never started
    assert intake.status._thread is None  # nor did the status writer
    assert [r for r in api.journal if r.method in WRITES] == []


async def test_a_fenced_intake_signals_and_writes_nothing(
    temporal_env: WorkflowEnvironment,
) -> None:
    """An intake whose Lease is gone (its fence down) sees adoptions and malformed pods as
    ever, but starts no workflow and emits no Event."""
    leading = threading.Event()
    with KubeEmulator() as api, api_client(url=api.url) as client:
        queue = f"fenced-{uuid.uuid4().hex[:6]}"
        intake = Intake(
            CoreV1Api(client), CustomObjectsApi(client), temporal_env.client, CLUSTER, queue,
            asyncio.get_running_loop(), fence=lambda: math.inf if leading.is_set() else 0.0,
        )  # fmt: skip
        api.store.create(policy(monitoringPeriod="2s"))
        await asyncio.to_thread(intake.start)
        try:
            add_pods(api, deployment(api), ["web-a"])
            broken = pod("web-x", WEB, rec=REC)
            broken["metadata"]["annotations"][REC.requests_key or ""] = "{not json"
            api.store.create(broken)
            await eventually(lambda: intake.stats["adoptions"] == 1)
            await eventually(lambda: intake.stats["malformed"] == 1)
            await eventually(lambda: not intake.delivery.pending)
            assert [r for r in api.journal if r.method in WRITES] == []
            # Its namespaces informer reports what it skips, as every other informer does.
            reported = intake.delivery.bad_object
            assert all(i.on_bad_object == reported for i in intake.informers.running)
            query = f'TaskQueue = "{queue}"'
            assert [wf async for wf in temporal_env.client.list_workflows(query)] == []
        finally:
            await asyncio.to_thread(intake.stop)


def test_a_4xx_from_a_handler_is_that_objects_problem_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []
    reported: list[tuple[dict[str, Any], Exception]] = []

    def handler(kind: str, obj: dict[str, Any], initial: bool) -> None:
        calls.append(obj["metadata"]["name"])
        status = 403 if obj["metadata"]["name"] == "forbidden" else 503
        raise ApiException(status=status, reason="no")

    monkeypatch.setattr(informer_module, "HANDLER_ATTEMPTS", 3)
    informer = Informer(
        "namespaces", lambda **_: None, handler,
        on_bad_object=lambda obj, exc: reported.append((obj, exc)),
        type_meta=("v1", "Namespace"),
    )  # fmt: skip
    informer._handle("ADDED", {"metadata": {"name": "forbidden"}}, False)
    assert calls == ["forbidden"]  # not retried: asking again gets the same 403
    informer._handle("ADDED", {"metadata": {"name": "flaky"}}, False)
    assert calls[1:] == ["flaky"] * 3  # a 503 is retried, then given up on, and reported
    assert [o["metadata"]["name"] for o, _ in reported] == ["forbidden", "flaky"]
    assert "gave up after 3 attempts" in str(reported[1][1])


def test_an_object_listed_without_kind_is_reported_under_its_own_kind(
    cluster: tuple[KubeEmulator, ApiClient],
) -> None:
    """A real server's LIST items carry no ``kind``: the report used to count it as "unknown"
    and address its Event to a Pod of that name."""
    api, client = cluster
    intake = _intake(client)

    def listing(**_: Any) -> Any:
        item = b'{"metadata": {"name": "shop", "uid": "u1"}}'
        body = b'{"metadata": {"resourceVersion": "1"}, "items": [' + item + b"]}"

        class Response:
            data = body

        return Response()

    def handler(kind: str, obj: dict[str, Any], initial: bool) -> None:
        raise KeyError("a bug met on this object")

    informer = Informer(
        "namespaces", listing, handler, on_bad_object=intake.delivery.bad_object,
        type_meta=("v1", "Namespace"),
    )  # fmt: skip
    assert informer._relist()
    (event,) = [e for e in api.store.items("Event", "default")]
    assert event["reason"] == EventReason.OBJECT_SKIPPED
    assert event["involvedObject"]["kind"] == "Namespace"
    assert event["involvedObject"]["name"] == "shop"


async def test_a_signal_may_take_no_longer_than_the_term_left(
    cluster: tuple[KubeEmulator, ApiClient],
) -> None:
    """A signal's deadline is the fence's time left (at most ``SIGNAL_TIMEOUT``), and the
    intake's Temporal client does not retry a call by itself, so no retry outlives the term."""
    _, client = cluster
    assert _intake(client, fence=lambda: 0.4).delivery.rpc_timeout() == timedelta(seconds=0.4)
    assert _intake(client).delivery.rpc_timeout() == timedelta(seconds=SIGNAL_TIMEOUT)
    with tempfile.TemporaryDirectory() as tmp:
        server = DevServer(Path(tmp) / "t", free_port(), headless=True, log_path=Path(tmp) / "log")
        await asyncio.to_thread(server.start)
        config = TemporalConfig.at(server.address)
        clients = {retries: await config.connect(retries=retries) for retries in (True, False)}
        await clients[False].count_workflows()  # it works
        await asyncio.to_thread(server.stop)
        took = {}
        for retries, temporal in clients.items():
            began = time.monotonic()
            with pytest.raises(RPCError):
                await temporal.count_workflows(rpc_timeout=timedelta(seconds=1))
            took[retries] = time.monotonic() - began
    # Temporal gone: the SDK's client tries again for seconds; the intake's, once.
    assert took[False] < 1.0 < took[True], took
