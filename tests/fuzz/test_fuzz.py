"""Property-based fuzzing (``hypothesis``): hostile or careless input never escapes as anything
but the documented error type, and every input is handled in bounded time (``deadline``).

What is thrown: annotation values (recommendations and the rollback state), pod objects with
arbitrary annotations and resources, policy documents of any shape, owner specs of any shape,
namespace patterns; at the parsers, the models, the cohort judge, the owner helpers, the wake
rule, and the intake's informer handler (through the real client, on the emulator).
"""

from __future__ import annotations

import asyncio
import json
import re
import string
import time
from collections.abc import Iterator
from contextlib import suppress
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes.client import CoreV1Api, CustomObjectsApi
from pydantic import ValidationError

from activities.cohort import judge
from activities.errors import InvalidOwnerError
from activities.lookup import read_state
from activities.owners import cohort_query, desired_replicas, manifest_resources
from cli.policyfiles import parse_policy
from sim.apiserver import KubeEmulator
from tests import CLUSTER
from worker.informer import Informer, identity
from worker.intake import Intake, adopted_recommendation
from worker.kube import api_client
from workflows.contract import GROUP_VERSION, ROLLBACK_STATE_ANNOTATION, Mode, WorkloadKind
from workflows.durations import parse_duration
from workflows.fingerprint import (
    MalformedRecommendationError,
    Recommendation,
    recommendations_from_annotations,
)
from workflows.policy import POLICY_KINDS, glob_match
from workflows.quantities import parse_quantity
from workflows.wake import LastAttempt, Sighting, Trigger, wake

FAST = settings(
    max_examples=150,
    deadline=timedelta(milliseconds=500),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
KEY = "static.rightsizing.kubex.ai/desired-resource-requests"
HASHED = "proactive.rightsizing.kubex.ai/h1a2b-desired-resource-limits"
REC = Recommendation(requests_key=KEY, requests={"app": {"memory": "512Mi"}})

json_leaf = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30)
json_value = st.recursive(
    json_leaf,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=20,
)
quantity_text = st.one_of(
    st.text(alphabet="0123456789.eE+-mkKMGTPiun", max_size=20),
    st.from_regex(r"\A[0-9]{1,400}(e[0-9]{1,8})?(Ki|Mi|Gi|m)?\Z"),
    st.text(max_size=20),
)
resources = st.dictionaries(
    st.text(max_size=8),
    st.dictionaries(st.sampled_from(["cpu", "memory", "x"]), quantity_text, max_size=3),
    max_size=3,
)
annotation_value = st.one_of(
    st.text(max_size=60),
    resources.map(json.dumps),
    json_value.map(json.dumps),
    st.just('{"app":{"cpu":"1e1000000"}}'),
)
annotations = st.dictionaries(
    st.sampled_from(
        [KEY, HASHED, "rollbackpolicy.rightsizing.kubex.ai/desired-resource-requests", "other"]
    ),
    annotation_value,
    max_size=3,
)


def pod_with(annos: dict[str, str], spec_resources: Any, reported: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "p",
            "namespace": "shop",
            "uid": "u",
            "annotations": annos,
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": {"containers": [{"name": "app", "resources": {"requests": spec_resources}}]},
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {"name": "app", "ready": True, "resources": {"requests": reported}}
            ],
        },
    }


@FAST
@given(annotations)
def test_recommendation_annotations(annos: dict[str, str]) -> None:
    try:
        recs = recommendations_from_annotations(annos)
    except MalformedRecommendationError:
        return
    for rec in recs:
        assert len(rec.fingerprint) == 16


@FAST
@given(annotations, st.dictionaries(st.sampled_from(["cpu", "memory"]), quantity_text, max_size=2))
def test_pod_adoption_and_judging(annos: dict[str, str], res: dict[str, str]) -> None:
    pod = pod_with(annos, res, res)
    with suppress(MalformedRecommendationError):
        adopted_recommendation(pod)
    with suppress(MalformedRecommendationError):
        judge(pod, REC, datetime(2026, 1, 1, tzinfo=UTC))


@FAST
@given(quantity_text)
def test_quantities(text: str) -> None:
    try:
        amount = parse_quantity(text)
    except ValueError:
        return
    assert amount.is_finite()


@FAST
@given(
    st.one_of(
        st.text(max_size=40), st.from_regex(r"\A([0-9]{1,30}(\.[0-9]{1,5})?(h|m|s|ms)){1,4}\Z")
    )
)
def test_durations(text: str) -> None:
    try:
        value = parse_duration(text)
    except ValueError:
        return
    assert timedelta(0) < value <= timedelta(hours=8760)


@FAST
@given(st.one_of(json_value.map(json.dumps), st.text(max_size=80)))
def test_state_annotation(raw: str) -> None:
    state, error = read_state({"metadata": {"annotations": {ROLLBACK_STATE_ANNOTATION: raw}}})
    assert state is None or error is None


policy_spec = st.fixed_dictionaries(
    {},
    optional={
        "monitoringPeriod": st.one_of(st.text(max_size=20), json_value),
        "rollbackTarget": st.one_of(st.sampled_from(["manifest", "lastSuccessful"]), json_value),
        "adoptionThresholdPercent": json_value,
        "backoff": st.one_of(
            json_value,
            st.fixed_dictionaries(
                {
                    "timePeriod": st.text(max_size=20),
                    "multiplyByTurn": json_value,
                    "maxAttempts": json_value,
                }
            ),
        ),
        "weight": json_value,
        "enableMonitoringReopen": json_value,
        "scope": json_value,
    },
)


@FAST
@given(
    st.sampled_from(list(POLICY_KINDS)),
    st.one_of(policy_spec, json_value),
    st.one_of(st.text(max_size=70), json_value),
)
def test_policy_documents(kind: str, spec: Any, name: Any) -> None:
    doc = {
        "apiVersion": "rightsizing.kubex.ai/v1alpha1",
        "kind": kind,
        "metadata": {"name": name},
        "spec": spec,
    }
    with suppress(ValidationError):
        POLICY_KINDS[kind].model_validate(doc)
    policy, problems = parse_policy(doc, "fuzz.yaml", 1)
    assert (policy is None) == bool(problems)


@FAST
@given(st.sampled_from(list(WorkloadKind)), json_value)
def test_owner_objects(kind: WorkloadKind, spec: Any) -> None:
    owner = {
        "metadata": {"name": "web", "namespace": "shop", "uid": "u"},
        "spec": spec,
        "status": spec,
    }
    for helper in (
        lambda: cohort_query(kind, owner, []),
        lambda: desired_replicas(kind, owner),
        lambda: manifest_resources(kind, owner),
    ):
        with suppress(InvalidOwnerError):
            helper()


@FAST
@given(
    st.text(alphabet="ab*-", max_size=12),
    st.text(alphabet="ab-", max_size=12),
)
def test_namespace_patterns_match_like_the_glob_they_mean(pattern: str, namespace: str) -> None:
    regex = ".*".join(re.escape(p) for p in pattern.split("*"))
    assert glob_match(pattern, namespace) == (re.fullmatch(regex, namespace) is not None)


def test_a_long_pattern_matches_in_microseconds() -> None:
    """``*a*a*a...*b`` used to make the regex backtrack exponentially (policy explain hung)."""
    pattern, namespace = "*a" * 99 + "*b", "a" * 63
    assert len(pattern) == 200
    started = time.perf_counter()
    for _ in range(100):
        assert not glob_match(pattern, namespace)
    assert (time.perf_counter() - started) / 100 < 0.005  # far under a millisecond in practice


@FAST
@given(
    st.sampled_from(list(Mode)),
    st.sampled_from(list(Trigger)),
    st.booleans(),
    st.booleans(),
    st.integers(-3, 3),
)
def test_wake_is_total(mode: Mode, trigger: Trigger, same: bool, enabled: bool, age: int) -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    last = LastAttempt("f", mode, now)
    verdict = wake(
        last, Sighting("f" if same else "g", trigger, now + timedelta(minutes=age)), enabled
    )
    assert verdict.reason


# --- the intake's informer handler, through the real client on the emulator -------------------


@pytest.fixture(scope="module")
def intake() -> Iterator[Intake]:
    with KubeEmulator() as api:
        kube = api_client(url=api.url)
        loop = asyncio.new_event_loop()
        yield Intake(CoreV1Api(kube), CustomObjectsApi(kube), None, CLUSTER, "fuzz", loop)  # type: ignore[arg-type]
        loop.close()


owner_refs = st.lists(
    st.fixed_dictionaries(
        {
            "kind": st.sampled_from(["ReplicaSet", "Job", "Deployment", "Pod", "x"]),
            "name": st.text(string.ascii_lowercase, min_size=1, max_size=8),
        },
        optional={"controller": st.booleans(), "uid": st.text(max_size=5)},
    ),
    max_size=2,
)


@settings(
    max_examples=60,
    deadline=timedelta(seconds=2),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    annotations,
    owner_refs,
    st.dictionaries(st.sampled_from(["cpu", "memory"]), quantity_text, max_size=2),
)
def test_intake_handlers_never_raise(
    intake: Intake, annos: dict[str, str], refs: list[Any], res: dict[str, str]
) -> None:
    """Whatever a pod or a policy holds, the intake's own handlers deal with it: a malformed
    recommendation is reported as such, an invalid policy as invalid; nothing reaches the
    informer's last line of defence (``on_bad_object``, for bugs), which would have swallowed
    it. The informers are built as the intake builds them (the pods' projection included)."""
    pod = pod_with(annos, res, res)
    pod["metadata"]["ownerReferences"] = refs
    pod.pop("kind", None)  # as a real server's LIST items: the informer fills it in
    bad: list[tuple[Any, Exception]] = []
    pods = Informer(
        "pods",
        lambda **_: None,
        intake._on_pod,
        on_bad_object=lambda obj, exc: bad.append((obj, exc)),
        project=identity,
        type_meta=("v1", "Pod"),
    )
    pods._handle("ADDED", pod, True)
    pods._handle("MODIFIED", pod, False)
    pods._handle("DELETED", pod, False)
    policies = Informer(
        "rollbackpolicies",
        lambda **_: None,
        intake._on_policy,
        on_bad_object=lambda obj, exc: bad.append((obj, exc)),
        type_meta=(GROUP_VERSION, "RollbackPolicy"),
    )
    policy = {"kind": "RollbackPolicy", "metadata": {"name": "p", "namespace": "shop"}}
    policies._handle("ADDED", policy | {"spec": annos}, False)
    policies._handle("DELETED", policy | {"spec": annos}, False)
    assert bad == [], bad
