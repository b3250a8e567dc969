"""The storm breaker's rule (``workflows.breaker``): its setting, and when the verdicts trip it."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

from workflows.breaker import StormBreaker, Verdicts
from workflows.contract import Mode
from workflows.state import OwnerState

T0 = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


def verdict(mode: Mode, seconds: float, turn: int = 1, fingerprint: str = "f1") -> OwnerState:
    return OwnerState(
        mode=mode,
        active_recommendation_fingerprint=fingerprint,
        turn=turn,
        last_transition_time=T0 + timedelta(seconds=seconds),
    )


def test_the_setting_is_share_window_and_an_optional_minimum() -> None:
    assert StormBreaker.parse("50%/10m") == StormBreaker(50.0, timedelta(minutes=10), 10)
    assert StormBreaker.parse(" 30.5%/1h30m/25 ") == StormBreaker(30.5, timedelta(minutes=90), 25)
    assert str(StormBreaker.parse("50%/10m")) == "50%/10m/10"
    for bad, why in (
        ("50/10m", "is not SHARE%/WINDOW[/MIN]"),
        ("50%", "is not SHARE%/WINDOW[/MIN]"),
        ("0%/10m", "above 0 and below 100"),
        ("100%/10m", "above 0 and below 100"),
        ("50%/soon", "invalid duration"),
        ("50%/10m/0", "1 verdict or more"),
    ):
        with pytest.raises(ValueError, match=re.escape(why)):
            StormBreaker.parse(bad)


def test_it_trips_past_the_share_of_enough_verdicts_within_the_window() -> None:
    verdicts = Verdicts(StormBreaker.parse("50%/1m/4"))
    verdicts.record("a", verdict(Mode.ROLLING_BACK, 0))
    verdicts.record("b", verdict(Mode.ROLLING_BACK, 1))
    verdicts.record("c", verdict(Mode.ROLLING_BACK, 2))
    assert verdicts.trips(T0 + timedelta(seconds=3)) is None  # 3 verdicts: fewer than 4
    verdicts.record("d", verdict(Mode.MONITORING_SUCCEEDED, 3))
    verdicts.record("e", verdict(Mode.MONITORING_SUCCEEDED, 4))
    verdicts.record("e", verdict(Mode.MONITORING_SUCCEEDED, 4))  # the same verdict again: once
    verdicts.record("f", verdict(Mode.BACKING_OFF, 4))  # not a verdict
    assert verdicts.trips(T0 + timedelta(seconds=5)) == (
        "3 of 5 verdicts rolled back within 1m (60% > 50%)"
    )
    # Half exactly is not more than half; verdicts older than the window are forgotten.
    verdicts.record("g", verdict(Mode.MONITORING_SUCCEEDED, 5))
    assert verdicts.trips(T0 + timedelta(seconds=5)) is None  # 3 of 6
    assert verdicts.trips(T0 + timedelta(seconds=61.5)) is None  # a, b gone: 1 of 4


def test_a_reset_counts_from_then_on_only() -> None:
    verdicts = Verdicts(StormBreaker.parse("50%/1h/2"))
    for owner, at in (("a", 0), ("b", 1)):
        verdicts.record(owner, verdict(Mode.ROLLING_BACK, at))
    assert verdicts.trips(T0 + timedelta(seconds=2)) is not None
    verdicts.reset(T0 + timedelta(seconds=10))
    assert verdicts.trips(T0 + timedelta(seconds=11)) is None  # both before the reset
    verdicts.record("c", verdict(Mode.ROLLING_BACK, 5))  # a late event of an earlier verdict
    verdicts.record("a", verdict(Mode.ROLLING_BACK, 12, turn=2))  # its next turn: a new one
    assert verdicts.trips(T0 + timedelta(seconds=13)) is None  # 1 verdict: fewer than 2
    verdicts.record("b", verdict(Mode.ROLLING_BACK, 13, turn=2))
    assert verdicts.trips(T0 + timedelta(seconds=14)) == (
        "2 of 2 verdicts rolled back within 1h (100% > 50%)"
    )
