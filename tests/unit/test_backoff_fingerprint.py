"""Backoff schedule (the spec's table) and recommendation fingerprints."""

from __future__ import annotations

from datetime import timedelta

import pytest

from workflows.backoff import backoff_schedule, backoff_wait, is_last_turn
from workflows.fingerprint import (
    MalformedRecommendationError,
    Recommendation,
    recommendations_from_annotations,
)
from workflows.policy import Backoff

SPEC_BACKOFF = Backoff.model_validate({"timePeriod": "1m", "multiplyByTurn": 2, "maxAttempts": 3})


@pytest.mark.parametrize(("turn", "minutes"), [(1, 2), (2, 4), (3, 6)])
def test_spec_backoff_table(turn: int, minutes: int) -> None:
    assert backoff_wait(SPEC_BACKOFF, turn) == timedelta(minutes=minutes)


def test_schedule_has_one_wait_per_attempt() -> None:
    assert backoff_schedule(SPEC_BACKOFF) == [timedelta(minutes=m) for m in (2, 4, 6)]
    cluster = Backoff.model_validate({"timePeriod": "2m", "multiplyByTurn": 3, "maxAttempts": 5})
    assert backoff_schedule(cluster) == [timedelta(minutes=6 * t) for t in range(1, 6)]
    assert is_last_turn(SPEC_BACKOFF, 3) and not is_last_turn(SPEC_BACKOFF, 2)


def test_turns_count_from_one() -> None:
    with pytest.raises(ValueError):
        backoff_wait(SPEC_BACKOFF, 0)


FIXED = "static.rightsizing.kubex.ai/desired-resource-requests"
FIXED_LIMITS = "static.rightsizing.kubex.ai/desired-resource-limits"
HASHED = "static.rightsizing.kubex.ai/h9f3c2a-desired-resource-requests"


def rec(key: str = FIXED, **containers: dict[str, str]) -> Recommendation:
    return Recommendation(requests_key=key, requests=containers)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        pytest.param(rec(app={"cpu": "250m"}), rec(app={"cpu": "0.25"}), id="cpu-forms"),
        pytest.param(rec(app={"memory": "1Gi"}), rec(app={"memory": "1024Mi"}), id="memory-forms"),
        pytest.param(
            rec(app={"cpu": "1", "memory": "1Gi"}, side={"cpu": "100m"}),
            rec(side={"cpu": "0.1"}, app={"memory": "1024Mi", "cpu": "1000m"}),
            id="order-independent",
        ),
    ],
)
def test_equal_recommendations_share_a_fingerprint(a: Recommendation, b: Recommendation) -> None:
    assert a.fingerprint == b.fingerprint
    assert len(a.fingerprint) == 16


@pytest.mark.parametrize(
    ("a", "b"),
    [
        pytest.param(rec(FIXED, app={"cpu": "1"}), rec(HASHED, app={"cpu": "1"}), id="key-change"),
        pytest.param(rec(app={"cpu": "1"}), rec(app={"cpu": "2"}), id="value-change"),
        pytest.param(rec(app={"cpu": "1"}), rec(other={"cpu": "1"}), id="container-change"),
        pytest.param(
            rec(app={"cpu": "1"}),
            Recommendation(limits_key=FIXED_LIMITS, limits={"app": {"cpu": "1"}}),
            id="requests-vs-limits",
        ),
    ],
)
def test_different_recommendations_differ(a: Recommendation, b: Recommendation) -> None:
    assert a.fingerprint != b.fingerprint


def test_recommendations_from_annotations_pairs_requests_and_limits() -> None:
    found = recommendations_from_annotations(
        {
            FIXED: '{"app": {"cpu": "500m", "memory": "256Mi"}}',
            FIXED_LIMITS: '{"app": {"memory": "512Mi"}}',
            HASHED: '{"app": {"cpu": "1"}}',
            "rollbackpolicy.rightsizing.kubex.ai/desired-resource-requests": "{}",
            "unrelated/annotation": "x",
        }
    )
    assert len(found) == 2
    fixed = next(r for r in found if r.requests_key == FIXED)
    assert fixed.limits_key == FIXED_LIMITS
    assert fixed.equals_resources(
        {"app": {"cpu": "0.5", "memory": "256Mi"}}, {"app": {"memory": "512Mi"}}
    )
    assert not fixed.equals_resources(
        {"app": {"cpu": "1", "memory": "256Mi"}}, {"app": {"memory": "512Mi"}}
    )
    hashed = next(r for r in found if r.requests_key == HASHED)
    assert hashed.limits_key is None


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ("{not json", "not valid JSON"),
        ('["app"]', "expected a JSON object"),
        ('{"app": "1"}', "must map resource names"),
        ('{"app": {"cpu": "lots"}}', "app.cpu: invalid resource quantity"),
    ],
)
def test_malformed_annotations_say_why(raw: str, why: str) -> None:
    with pytest.raises(MalformedRecommendationError, match=why):
        recommendations_from_annotations({FIXED: raw})
