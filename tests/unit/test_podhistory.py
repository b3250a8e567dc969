"""The report's pod history from Events: a resize Event whose message is not in the kubelet's
format is kept as a resize with no resources known, never a crash of the report."""

from __future__ import annotations

from datetime import UTC, datetime

from kubernetes.client import CoreV1Event, V1ObjectMeta, V1ObjectReference

from cli.podhistory import history
from workflows.activity_api import OwnerRef
from workflows.contract import WorkloadKind

OWNER = OwnerRef(namespace="shop", kind=WorkloadKind.DEPLOYMENT, name="api")
AT = datetime(2026, 12, 5, tzinfo=UTC)


def event(kind: str, name: str, reason: str, message: str) -> CoreV1Event:
    return CoreV1Event(
        involved_object=V1ObjectReference(kind=kind, name=name, namespace="shop"),
        metadata=V1ObjectMeta(name=f"{name}.x", namespace="shop"),
        reason=reason,
        message=message,
        first_timestamp=AT,
        last_timestamp=AT,
        count=1,
    )


def test_a_resize_message_not_in_the_kubelets_format_is_a_resize_of_unknown_resources() -> None:
    resize = '{"containers":[{"name":"app","resources":{"limits":{"memory":"768Mi"}}}]}'
    events = [
        event("ReplicaSet", "api-7d4", "SuccessfulCreate", "Created pod: api-7d4-x"),
        event("Pod", "api-7d4-x", "ResizeCompleted", f"Pod resize completed: {resize}"),
        *(
            event("Pod", "api-7d4-x", "ResizeCompleted", f"Pod resize completed: {said}")
            for said in ("[1]", "{oops", '{"containers": 3}', '{"containers": [7]}')
        ),
    ]
    (pod,) = history(OWNER, events, []).pods
    assert sorted(m for _, m in pod.resizes) == ["", "", "", "", "768Mi"]
