"""The wake rule (``workflows.wake``), and that the intake's and the workflow's callers agree.

One table covers every (last mode, trigger, pod age, policy) case. The start of a run
(``workflows.machine``), the end of a run (``RollbackState.wake``) and the intake apply the same
function; the agreement tests below drive the state machine and the run-end rule with the same
sightings and check they answer as the table does.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.unit.test_machine import OWNER, REC, T0, policy, start, stored
from workflows.activity_api import ActuationResult, LoadOwnerResult
from workflows.contract import Mode
from workflows.machine import (
    Cancel,
    Observed,
    Reapplied,
    Reopen,
    SampleFailed,
    decide,
    initial_state,
    news_after_start,
)
from workflows.wake import LastAttempt, Sighting, Trigger, Wake, wake

F = REC.fingerprint
NEWER = T0 + timedelta(minutes=1)
OLDER = T0 - timedelta(minutes=1)
OBS, REO = Trigger.OBSERVE, Trigger.REOPEN

CASES = [
    # mode, trigger, pod created, reopen enabled, expected
    pytest.param(None, OBS, None, True, Wake.NEW, id="no-state-new"),
    pytest.param(Mode.BACKED_OFF, OBS, None, True, Wake.NEXT_TURN, id="backed-off-next-turn"),
    pytest.param(Mode.BACKED_OFF, REO, None, False, Wake.NEXT_TURN, id="backed-off-reopen-next"),
    pytest.param(Mode.MONITORING_SUCCEEDED, OBS, NEWER, True, Wake.REOPEN, id="succ-newer-pod"),
    pytest.param(Mode.MONITORING_SUCCEEDED, OBS, OLDER, True, Wake.NONE, id="succ-older-pod"),
    pytest.param(Mode.MONITORING_SUCCEEDED, OBS, None, True, Wake.NONE, id="succ-no-pod-age"),
    pytest.param(Mode.MONITORING_SUCCEEDED, OBS, NEWER, False, Wake.NONE, id="succ-reopen-off"),
    pytest.param(Mode.MONITORING_SUCCEEDED, REO, None, True, Wake.REOPEN, id="succ-explicit"),
    pytest.param(Mode.MONITORING_SUCCEEDED, REO, None, False, Wake.NONE, id="succ-explicit-off"),
    pytest.param(Mode.CANCELLED, OBS, NEWER, True, Wake.NONE, id="cancelled-newer-pod-sticks"),
    pytest.param(Mode.CANCELLED, OBS, OLDER, True, Wake.NONE, id="cancelled-older-pod"),
    pytest.param(Mode.CANCELLED, REO, None, True, Wake.REOPEN, id="cancelled-explicit-reopen"),
    pytest.param(Mode.CANCELLED, REO, None, False, Wake.NONE, id="cancelled-reopen-off"),
    pytest.param(Mode.FAILED_PERMANENT, OBS, NEWER, True, Wake.NONE, id="failed-permanent"),
    pytest.param(Mode.FAILED_PERMANENT, REO, None, True, Wake.RETRY, id="failed-permanent-retry"),
    pytest.param(Mode.FAILED_PERMANENT, REO, None, False, Wake.RETRY, id="failed-retry-reopen-off"),
    pytest.param(Mode.CLEARED, OBS, NEWER, True, Wake.NONE, id="cleared"),
    pytest.param(Mode.MONITORING, OBS, None, True, Wake.RESUME, id="monitoring-resumes"),
    pytest.param(Mode.BACKING_OFF, OBS, None, True, Wake.RESUME, id="backing-off-resumes"),
    pytest.param(Mode.SUPERSEDED, OBS, None, True, Wake.RESUME, id="superseded-resumes"),
]


@pytest.mark.parametrize(("mode", "trigger", "pod", "enabled", "expected"), CASES)
def test_wake_table(
    mode: Mode | None, trigger: Trigger, pod: datetime | None, enabled: bool, expected: Wake
) -> None:
    last = None if mode is None else LastAttempt(F, mode, T0)
    verdict = wake(last, Sighting(F, trigger, pod), enabled)
    assert verdict.wake is expected
    assert verdict.wakes is (expected is not Wake.NONE)
    assert verdict.reason


def test_a_pod_created_in_the_second_a_turn_succeeded_in_is_newer() -> None:
    # creationTimestamp is whole seconds, rounded down; the transition is not. A replacement
    # created 0.5 s after a success at .3 s reads as created 0.3 s before it.
    succeeded = LastAttempt(F, Mode.MONITORING_SUCCEEDED, T0 + timedelta(seconds=10.3))
    same_second = Sighting(F, OBS, T0 + timedelta(seconds=10))
    assert wake(succeeded, same_second, True).wake is Wake.REOPEN
    second_before = Sighting(F, OBS, T0 + timedelta(seconds=9))
    assert wake(succeeded, second_before, True).wake is Wake.NONE


@pytest.mark.parametrize("mode", list(Mode))
def test_another_fingerprint_is_always_new(mode: Mode) -> None:
    assert wake(LastAttempt("other", mode, T0), Sighting(F, OBS, None), False).wake is Wake.NEW


# The start of a run: the stored state's last attempt is judged by the same table.
_STARTABLE = [c for c in CASES if c.values[0] not in (None, Mode.CLEARED)]


@pytest.mark.parametrize(("mode", "trigger", "pod", "enabled", "expected"), _STARTABLE)
def test_run_start_follows_the_rule(
    mode: Mode, trigger: Trigger, pod: datetime | None, enabled: bool, expected: Wake
) -> None:
    loaded = LoadOwnerResult(exists=True, state=stored(mode, turn=2), policy=policy(reopen=enabled))
    decision = start(loaded, trigger=trigger, pod_created=pod)
    if expected is Wake.NONE:
        assert decision.state.mode is mode and decision.effects == [], decision.note
    else:
        assert decision.state.mode is Mode.MONITORING
        turns = {Wake.NEXT_TURN: 3, Wake.RETRY: 1}
        assert decision.state.turn == turns.get(expected, 2)


@pytest.mark.parametrize(("mode", "trigger", "pod", "enabled", "expected"), CASES[1:])
def test_run_end_follows_the_rule(
    mode: Mode, trigger: Trigger, pod: datetime | None, enabled: bool, expected: Wake
) -> None:
    state = initial_state(OWNER, REC).model_copy(
        update={"mode": mode, "last_transition_time": T0, "policy": policy(reopen=enabled)}
    )
    assert state.wake(Sighting(F, trigger, pod)).wake is expected


def test_a_newer_pod_after_cancel_does_not_resume_a_reopen_does() -> None:
    """Decided: a cancel sticks for its recommendation. A replacement pod (a rollout restart, a
    drained node) must not silently undo an operator's cancel; ``reopen`` or a new
    recommendation does."""
    monitoring = start(LoadOwnerResult(exists=True, policy=policy())).state
    cancelled = decide(monitoring, Cancel(T0, "maintenance")).state
    assert not cancelled.wake(Sighting(F, OBS, datetime.now(UTC) + timedelta(days=1))).wakes
    assert cancelled.wake(Sighting(F, REO)).wake is Wake.REOPEN
    assert cancelled.wake(Sighting("another", OBS)).wake is Wake.NEW


def test_what_the_start_accounted_for_is_not_news() -> None:
    other = REC.model_copy(update={"requests": {"app": {"memory": "1Gi"}}})
    pending = [Observed(T0, REC), Reopen(T0), Observed(T0, other), Cancel(T0)]
    assert news_after_start(pending, F, OBS) == [pending[1], pending[2], pending[3]]
    assert news_after_start(pending, F, REO) == [pending[2], pending[3]]


def test_a_failed_window_opening_sample_leaves_the_decision_to_the_final_one() -> None:
    state = start(LoadOwnerResult(exists=True, policy=policy())).state
    later = decide(state, SampleFailed(NEWER, "API down"))
    assert later.state.next_sample_at == state.window_ends_at
    assert later.effects == [] and "API down" in later.note
    ended = state.model_copy(update={"mode": Mode.BACKING_OFF})
    assert decide(ended, SampleFailed(NEWER)).state == ended


def test_reapply_result_is_an_observation() -> None:
    state = initial_state(OWNER, REC).model_copy(update={"mode": Mode.BACKED_OFF})
    done = decide(state, Reapplied(T0, ActuationResult(message="3 pods resized in place")))
    assert done.state == state and "3 pods resized" in done.note
    gone = decide(state, Reapplied(T0, ActuationResult(exists=False)))
    assert "gone" in gone.note


@pytest.mark.parametrize(
    ("mode", "running", "reopen", "refusal"),
    [
        (Mode.FAILED_PERMANENT, False, True, None),  # a retry
        (Mode.FAILED_PERMANENT, False, False, None),
        (Mode.CLEARED, False, True, "the attempt was cleared"),
        (Mode.CANCELLED, False, True, None),
        (Mode.CANCELLED, False, False, "reopen disabled by the policy"),
        (Mode.MONITORING, True, True, None),
        (Mode.MONITORING, True, False, "reopen disabled by the policy"),
        (Mode.BACKING_OFF, True, True, "reopen is ignored in mode backingOff"),
        # Cancelled but the run not closed yet: its run-end rule reopens (the wake rule).
        (Mode.CANCELLED, True, True, None),
        (Mode.CANCELLED, True, False, "reopen disabled by the policy"),
    ],
)
def test_reopen_refusal_says_what_a_reopen_would_do(
    mode: Mode, running: bool, reopen: bool, refusal: str | None
) -> None:
    """What `rollbackctl reopen` checks before it signals: the machine's own rule for a running
    run, the wake rule for an ended one."""
    state = start(LoadOwnerResult(exists=True, policy=policy(reopen=reopen))).state
    state = state.model_copy(update={"mode": mode})
    said = state.reopen_refusal(running)
    assert said == refusal if refusal is None else (said is not None and refusal in said)
    if running and mode is Mode.MONITORING:  # the machine agrees with what was said
        reopened = decide(state, Reopen(NEWER))
        assert (reopened.state.window_started_at == NEWER) == (refusal is None)
