"""Every error an activity can raise is classified (``activities.errors``), through the real
client over HTTP: transient ones raise as they are (Temporal retries them, within the retry
budget), permanent ones become non-retryable errors that end the attempt ``aborted``."""

from __future__ import annotations

import pytest
from kubernetes.client.exceptions import ApiException
from temporalio.exceptions import ApplicationError

from activities.errors import InvalidOwnerError, classify
from activities.kubernetes import KubernetesActivities
from activities.notify import NotificationError
from sim.apiserver import Fault, KubeEmulator
from tests.activity.builders import owner, pod
from tests.activity.test_kubernetes_activities import REC, WEB, record, sample, state
from workflows.activity_api import PermanentError
from workflows.contract import FailureReason
from workflows.fingerprint import MalformedRecommendationError


def permanent(info: pytest.ExceptionInfo[ApplicationError], kind: PermanentError) -> None:
    assert info.value.type == kind.value and info.value.non_retryable


@pytest.mark.parametrize("status", [400, 403, 413, 422])
def test_a_rejected_write_is_permanent(
    api: KubeEmulator, acts: KubernetesActivities, status: int
) -> None:
    """An admission webhook's denial, an annotation over the size limit: retrying gets the same
    answer, so the attempt must end instead of retrying forever."""
    api.store.create(owner("Deployment"))
    api.inject(Fault(status=status, method="PATCH", path="/deployments/web", times=None))
    with pytest.raises(ApplicationError) as info:
        record(acts, state())
    permanent(info, PermanentError.API_REJECTED)
    assert str(status) in info.value.message
    assert len(api.requests("patch")) == 1  # not retried inside the activity either


def test_a_rejected_event_is_permanent(api: KubeEmulator, acts: KubernetesActivities) -> None:
    api.store.create(owner("Deployment"))
    api.inject(Fault(status=403, method="POST", path="/events", times=None))
    with pytest.raises(ApplicationError) as info:
        record(acts, state())
    permanent(info, PermanentError.API_REJECTED)


def test_transient_errors_stay_retryable(api: KubeEmulator, acts: KubernetesActivities) -> None:
    api.store.create(owner("Deployment"))
    api.inject(Fault(status=503, method="PATCH", path="/deployments/web", times=None))
    with pytest.raises(ApiException) as info:
        record(acts, state())
    assert info.value.status == 503


@pytest.mark.parametrize(
    ("kind", "spec_change"),
    [
        pytest.param("Deployment", {"selector": None}, id="deployment-without-selector"),
        pytest.param("StrimziPodSet", {"selector": None}, id="strimzi-without-selector"),
        pytest.param("StatefulSet", {"replicas": None}, id="replicas-null"),
        pytest.param("Deployment", {"replicas": "three"}, id="replicas-not-a-number"),
        pytest.param("Deployment", {"selector": {"matchLabels": 7}}, id="selector-garbage"),
    ],
)
def test_an_owner_that_cannot_be_judged_is_permanent(
    api: KubeEmulator, acts: KubernetesActivities, kind: str, spec_change: dict[str, object]
) -> None:
    obj = owner(kind)
    obj["spec"] = {**obj["spec"], **spec_change}
    api.store.create(obj)
    with pytest.raises(ApplicationError) as info:
        sample(acts, kind)
    permanent(info, PermanentError.INVALID_OWNER)


def test_a_huge_quantity_in_the_cohort_is_a_malformed_recommendation(
    api: KubeEmulator, acts: KubernetesActivities
) -> None:
    """``1e1000000`` used to raise decimal.Overflow, which nothing caught: the final sample
    retried forever. It is now a malformed recommendation, like any other bad value: that pod
    is left out of the cohort, saying why."""
    api.store.create(owner("Deployment", replicas=1))
    api.store.create(
        pod(
            "web-0",
            WEB,
            annotations={REC.requests_key or "": '{"app":{"cpu":"1e1000000"}}'},
        )
    )
    result = sample(acts)
    assert result.error is None and "out of range" in result.left_out["web-0"]


@pytest.mark.parametrize(
    ("exc", "kind", "reason"),
    [
        (
            MalformedRecommendationError("x"),
            PermanentError.MALFORMED_RECOMMENDATION,
            "malformedAnnotation",
        ),
        (InvalidOwnerError("x"), PermanentError.INVALID_OWNER, "invalidOwner"),
        (
            ApiException(status=422, reason="Unprocessable"),
            PermanentError.API_REJECTED,
            "apiRejected",
        ),
        (KeyError("spec"), PermanentError.UNEXPECTED, "unexpectedError"),
        (ZeroDivisionError(), PermanentError.UNEXPECTED, "unexpectedError"),
    ],
)
def test_classify_permanent(exc: Exception, kind: PermanentError, reason: str) -> None:
    """Each permanent error ends the attempt with its own failure reason, as the README's table
    of reasons names it (the state's ``failureReason``)."""
    converted = classify(exc)
    assert isinstance(converted, ApplicationError) and converted.type == kind.value
    assert converted.non_retryable
    assert PermanentError(converted.type).reason == FailureReason(reason)


@pytest.mark.parametrize(
    "exc",
    [
        ApiException(status=500),
        ApiException(status=429),
        ConnectionError(),
        TimeoutError(),
        NotificationError("receiver oncall: HTTP 503"),  # the notification activities' retry
    ],
)
def test_classify_transient(exc: Exception) -> None:
    assert classify(exc) is exc
