"""Every notification failure is seen: a receiver URL that cannot work is refused when the file
is loaded, a bad one from the environment is reported at once (not retried), and what the child
workflow reports (a last attempt that timed out, a routing that failed) becomes the same log
line, metric and Warning Event on the owner, through the real client over HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes.client import ApiClient, CoreV1Api, CustomObjectsApi
from temporalio.testing import ActivityEnvironment

from activities.kubernetes import KubernetesActivities
from activities.notify import NotificationConfig
from sim.apiserver import KubeEmulator
from tests import CLUSTER
from worker.kube import api_client
from workflows.activity_api import OwnerRef, rollback_id
from workflows.contract import Actuation, EventReason, Mode, WorkloadKind
from workflows.notify import Notification, ReportInput, SendInput

OWNER = OwnerRef(namespace="shop", kind=WorkloadKind.DEPLOYMENT, name="api")


def notification() -> Notification:
    made = Notification.of(
        cluster=CLUSTER,
        owner=OWNER,
        mode=Mode.ROLLING_BACK,
        turn=1,
        fingerprint="1f0f06687fee0df3",
        reason=None,
        message="3/3 pods OOMKilled",
        policy=None,
        time=datetime(2026, 1, 1, tzinfo=UTC),
        workflow_id=rollback_id(CLUSTER, OWNER),
        run_id="run",
        transitions=1,
    )
    assert made is not None
    return made


def test_the_key_comes_from_the_run_and_its_transition_not_from_the_clock() -> None:
    """A workflow's clock after a local activity may read otherwise on replay (a suite's run
    whose replay started another child and hung): the key, and so the child's ID, does not
    depend on it."""
    made = notification()
    again = made.model_copy(update={"time": datetime(2026, 1, 1, 0, 0, 1, tzinfo=UTC)})

    def of(n: Notification, **change: Any) -> Notification | None:
        fields = {"cluster": n.cluster, "owner": n.owner, "mode": n.transition, "turn": n.turn,
                  "fingerprint": n.fingerprint, "reason": n.reason, "message": n.message,
                  "policy": n.policy, "time": n.time, "workflow_id": n.workflow_id,
                  "run_id": n.run_id, "transitions": 1}  # fmt: skip
        return Notification.of(**(fields | change))

    assert of(again) == again.model_copy(update={"key": made.key})  # another time, same key
    assert of(made, transitions=2).key != made.key  # the run's next transition
    assert of(made, run_id="another").key != made.key  # another run's
    assert made.workflow_id_for_child().endswith(f"/rollingBack/turn-1/{made.key[:12]}")


@pytest.mark.parametrize(
    "url", ["not a url", "ftp://example.com/hook", "http:///no-host", "hooks.example.com/x"]
)
def test_a_receiver_url_that_cannot_work_is_refused_when_loaded(url: str) -> None:
    with pytest.raises(ValueError, match="is not an http:// or https:// URL with a host"):
        NotificationConfig.model_validate({"receivers": [{"name": "oncall", "url": url}]})


def test_a_receiver_url_from_the_environment_is_checked_when_loaded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ONCALL_URL", "oncall.example.com")
    with pytest.raises(ValueError, match=r"\$ONCALL_URL"):
        NotificationConfig.model_validate(
            {"receivers": [{"name": "oncall", "urlEnv": "ONCALL_URL"}]}
        )


@pytest.fixture
def cluster() -> Iterator[tuple[KubeEmulator, ApiClient]]:
    with KubeEmulator() as api, api_client(url=api.url) as client:
        api.store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}})
        api.store.create(
            {"apiVersion": "apps/v1", "kind": "Deployment",
             "metadata": {"name": "api", "namespace": "shop"}, "spec": {"replicas": 1}}
        )  # fmt: skip
        yield api, client


def _acts(client: ApiClient, config: dict[str, Any]) -> KubernetesActivities:
    return KubernetesActivities(
        CoreV1Api(client),
        CustomObjectsApi(client),
        Actuation.ANNOTATIONS,
        "test",
        notifications=NotificationConfig.model_validate(config),
    )


def _failed_events(api: KubeEmulator) -> list[str]:
    return [
        e["message"]
        for e in api.store.items("Event", "shop")
        if e["reason"] == EventReason.NOTIFICATION_FAILED
    ]


def test_a_bad_url_set_after_loading_is_reported_at_once(
    cluster: tuple[KubeEmulator, ApiClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The variable was unset when the file was read; the send finds it malformed: no retry
    (it would fail the same way), a failed outcome and a Warning Event instead."""
    api, client = cluster
    acts = _acts(client, {"receivers": [{"name": "oncall", "urlEnv": "ONCALL_URL"}]})
    monkeypatch.setenv("ONCALL_URL", "oncall.example.com/hook")
    result = ActivityEnvironment().run(
        acts.send_notification, SendInput(receiver="oncall", notification=notification())
    )
    assert not result.delivered and "$ONCALL_URL" in result.detail
    (message,) = _failed_events(api)
    assert "to oncall failed" in message and "not an http:// or https:// URL" in message


def test_what_the_child_reports_becomes_an_event(cluster: tuple[KubeEmulator, ApiClient]) -> None:
    api, client = cluster
    acts = _acts(client, {"receivers": []})
    report = ReportInput(
        receiver="oncall",
        notification=notification(),
        detail="activity StartToClose timeout",
    )
    environment = ActivityEnvironment()
    environment.run(acts.report_notification_failure, report)
    environment.run(acts.report_notification_failure, report)  # a retried report: one Event
    (message,) = _failed_events(api)
    assert "notification of rollingBack (turn 1) to oncall failed" in message
    assert "StartToClose timeout" in message
