"""The health checks' rules in the pure core, on virtual time: what a verdict does when
Prometheus cannot answer (a hold bounded by maxHold, none without a Prometheus), and where a
relative bound's baseline ends (before the turn's first window, not a reopen's)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from workflows.activity_api import OwnerRef
from workflows.contract import Mode, WorkloadKind
from workflows.fingerprint import Recommendation
from workflows.machine import baseline_at, health_unavailable, initial_state
from workflows.policy import HealthChecks
from workflows.state import HistoryEntry

T0 = datetime(2026, 1, 1, tzinfo=UTC)
ENDS = T0 + timedelta(minutes=5)


def checks(on_error: str, max_hold: str = "10m") -> HealthChecks:
    return HealthChecks.model_validate(
        {"cpuThrottling": {"maxPercent": 25}, "onPrometheusError": on_error, "maxHold": max_hold}
    )


@pytest.mark.parametrize(
    ("on_error", "configured", "now", "fallback"),
    [
        pytest.param("hold", True, ENDS, None, id="hold-at-the-end"),
        pytest.param("hold", True, ENDS + timedelta(minutes=9, seconds=59), None,
                     id="hold-just-inside-max-hold"),
        pytest.param("hold", True, ENDS + timedelta(minutes=10),
                     "held 10m (maxHold): decided on adoption alone", id="hold-at-max-hold"),
        pytest.param("hold", False, ENDS,
                     "no hold without a Prometheus to ask: decided on adoption alone",
                     id="hold-without-prometheus"),
        pytest.param("pass", True, ENDS, "onPrometheusError: pass", id="pass"),
        pytest.param("fail", False, ENDS, "onPrometheusError: fail", id="fail-without"),
    ],
)  # fmt: skip
def test_what_a_verdict_does_when_prometheus_cannot_answer(
    on_error: str, configured: bool, now: datetime, fallback: str | None
) -> None:
    taken = health_unavailable(checks(on_error), "unreachable", configured, ENDS, now)
    if fallback is None:
        assert taken is None  # held: ask again
    else:
        assert taken is not None and (taken.unavailable, taken.fallback) == (
            "unreachable",
            fallback,
        )


def entry(minutes: int, mode: Mode, fingerprint: str, turn: int = 1) -> HistoryEntry:
    return HistoryEntry(
        time=T0 + timedelta(minutes=minutes), mode=mode, turn=turn, fingerprint=fingerprint
    )


def test_a_reopened_windows_baseline_ends_at_the_turns_first_window() -> None:
    rec = Recommendation(
        requests_key="static.rightsizing.kubex.ai/desired-resource-requests",
        requests={"app": {"cpu": "1"}},
    )
    state = initial_state(OwnerRef(namespace="shop", kind=WorkloadKind.DEPLOYMENT, name="api"), rec)
    fp, other = state.fingerprint, "another"
    state = state.model_copy(
        update={
            "window_started_at": T0 + timedelta(minutes=30),
            "history": [
                entry(0, Mode.MONITORING, fp),  # an older attempt of the same fingerprint
                entry(5, Mode.MONITORING_SUCCEEDED, fp),
                entry(6, Mode.MONITORING, other),  # then another recommendation
                entry(10, Mode.MONITORING, fp),  # back to this one: the cut, turn 1
                entry(15, Mode.MONITORING_SUCCEEDED, fp),
                entry(30, Mode.MONITORING, fp),  # a reopen after the success
            ],
        }
    )
    assert baseline_at(state) == T0 + timedelta(minutes=10)
    turn_two = state.model_copy(
        update={
            "turn": 2,
            "history": [*state.history, entry(31, Mode.ROLLING_BACK, fp),
                        entry(40, Mode.MONITORING, fp, turn=2)],
            "window_started_at": T0 + timedelta(minutes=40),
        }
    )  # fmt: skip
    assert baseline_at(turn_two) == T0 + timedelta(minutes=40)  # before its own re-apply
    alone = state.model_copy(update={"history": []})  # its first window left the history
    assert baseline_at(alone) == T0 + timedelta(minutes=30)
