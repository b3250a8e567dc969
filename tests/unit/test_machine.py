"""The pure state machine on virtual time: every mode, reason and signal path."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from workflows import machine
from workflows.activity_api import (
    ActuationResult,
    Certain,
    CohortSample,
    LoadOwnerResult,
    OwnerRef,
    PolicySettings,
    ResolvePolicyResult,
)
from workflows.contract import EventReason, FailureReason, Mode, RollbackTarget, WorkloadKind
from workflows.fingerprint import Recommendation
from workflows.machine import (
    HOLDS,
    PAUSE_RECHECK,
    TRANSITIONS,
    Aborted,
    AttemptStarted,
    BackoffOver,
    Cancel,
    Decision,
    Hold,
    HoldEnds,
    Observed,
    PauseSeen,
    Reapplied,
    Reapply,
    Record,
    Reopen,
    RollBack,
    RollbackState,
    RolledBack,
    Sampled,
    SampleFailed,
    StartOver,
    Step,
    Suspected,
    decide,
    dominant_reason,
    early_failure,
    initial_state,
    required_adopters,
)
from workflows.pause import Pause, PauseScope
from workflows.policy import Backoff, EarlyVerdict
from workflows.state import OwnerState, PolicyRef, ResourceSnapshot
from workflows.wake import Trigger

T0 = datetime(2026, 1, 1, tzinfo=UTC)
DRAWN = {(before, after) for before, _, after in TRANSITIONS}
TAKEN: set[tuple[Mode | None, Mode]] = set()
RAN: set[str] = set()
# The records that let a cut run again, as the owner stood before them (its stored mode on a
# run's start) and after: held by a pause, the kill switch and the breaker (the status and
# control page's table). Every other record is not.
BRINGS_BACK = {
    (Mode.BACKING_OFF, Mode.BACKED_OFF): "a backoff's end with turns left",
    (Mode.BACKING_OFF, Mode.CLEARED): "a backoff's end whose policy is gone",
    (Mode.FAILED_PERMANENT, Mode.MONITORING): "a retry after failedPermanent",
    (Mode.FAILED_PERMANENT, Mode.CLEARED): "a start whose policy is gone, over failedPermanent",
    # A new recommendation adopted mid-rollback: its rollback cleared, the new cut runs.
    (Mode.ROLLING_BACK, Mode.SUPERSEDED): "a new recommendation while rolling back",
    (Mode.BACKING_OFF, Mode.SUPERSEDED): "a new recommendation while backing off",
}
MARKED: set[tuple[Mode | None, Mode]] = set()


def _check_marks(state: RollbackState, obs: machine.Observation, decision: Decision) -> None:
    """Each record of ``decision`` is marked as bringing the cut back exactly where the table
    above says so, whatever path decided it."""
    before: Mode | None = state.mode
    if isinstance(obs, AttemptStarted):
        before = obs.loaded.state.mode if obs.loaded.state else None
    for record in (e for e in decision.effects if isinstance(e, Record)):
        after = Mode.CLEARED if record.remove_state else decision.state.mode
        expected = (before, after) in BRINGS_BACK
        assert record.brings_back == expected, (before, after, record)
        if expected:
            MARKED.add((before, after))


@pytest.fixture(autouse=True)
def _only_drawn_transitions(
    monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    """Every transition a test makes must be a row of ``machine.TRANSITIONS`` (the docs draw
    the state machine from it); the rows taken are kept for the last test of this module."""

    def checked(state: RollbackState, obs: machine.Observation) -> Decision:
        decision = machine.decide(state, obs)
        _check_marks(state, obs, decision)
        before = None if isinstance(obs, AttemptStarted) else state.mode
        moved = decision.state.transitions != state.transitions
        if moved or (before is not None and decision.state.mode is not state.mode):
            pair = (before, decision.state.mode)
            assert pair in DRAWN, f"{pair} is not in workflows.machine.TRANSITIONS"
            TAKEN.add(pair)
        return decision

    monkeypatch.setitem(globals(), "decide", checked)
    RAN.add(request.node.originalname)


OWNER = OwnerRef(namespace="shop", kind=WorkloadKind.DEPLOYMENT, name="api")
KEY = "static.rightsizing.kubex.ai/desired-resource-requests"
REC = Recommendation(requests_key=KEY, requests={"app": {"memory": "256Mi"}})
OTHER = Recommendation(requests_key=KEY, requests={"app": {"memory": "512Mi"}})
GOOD = ResourceSnapshot.of({"app": {"memory": "1Gi"}}, {})


def policy(
    target: RollbackTarget = RollbackTarget.LAST_SUCCESSFUL,
    *,
    max_attempts: int = 2,
    reopen: bool = True,
    threshold: int = 80,
    observe_only: bool = False,
) -> PolicySettings:
    return PolicySettings(
        ref=PolicyRef(kind="RollbackPolicy", namespace="shop", name="p"),
        monitoring_period=timedelta(minutes=5),
        rollback_target=target,
        adoption_threshold_percent=threshold,
        backoff=Backoff(
            time_period=timedelta(minutes=1), multiply_by_turn=2, max_attempts=max_attempts
        ),
        enable_monitoring_reopen=reopen,
        observe_only=observe_only,
    )


def stored(
    mode: Mode,
    turn: int = 1,
    fingerprint: str = REC.fingerprint,
    last_successful: ResourceSnapshot | None = GOOD,
) -> OwnerState:
    return OwnerState(
        mode=mode,
        active_recommendation_fingerprint=fingerprint,
        turn=turn,
        last_successful_state=last_successful,
        last_transition_time=T0,
    )


def start(
    loaded: LoadOwnerResult,
    *,
    trigger: Trigger = Trigger.OBSERVE,
    pod_created: datetime | None = None,
    rec: Recommendation = REC,
) -> Decision:
    state = initial_state(OWNER, rec)
    return decide(state, AttemptStarted(T0, loaded, trigger, pod_created))


def sample(adopted_healthy: int, desired: int = 5, **unhealthy: int) -> CohortSample:
    return CohortSample(
        desired=desired,
        pods=desired,
        adopted=desired,
        adopted_healthy=adopted_healthy,
        unhealthy={FailureReason(k): v for k, v in unhealthy.items()},
    )


def monitoring(
    p: PolicySettings | None = None, last_successful: ResourceSnapshot | None = GOOD
) -> RollbackState:
    d = start(
        LoadOwnerResult(
            exists=True,
            state=stored(
                Mode.MONITORING_SUCCEEDED, fingerprint="old", last_successful=last_successful
            ),
            policy=p or policy(),
        )
    )
    assert d.state.mode is Mode.MONITORING
    return d.state


def end_window(state: RollbackState, s: CohortSample) -> Decision:
    first = decide(state, Sampled(T0, s))  # fixes the baseline
    assert first.state.mode is Mode.MONITORING and not first.effects
    return decide(first.state, Sampled(T0 + timedelta(minutes=5), s))


@pytest.mark.parametrize(
    ("baseline", "percent", "required"),
    [
        (5, 80, 4),
        (3, 80, 3),
        (10, 90, 9),
        (1, 1, 1),
        (0, 100, 0),
        (7, 100, 7),
        (100, 1, 1),
        (4, 50, 2),
    ],
)
def test_required_adopters(baseline: int, percent: int, required: int) -> None:
    assert required_adopters(baseline, percent) == required


def test_dominant_reason() -> None:
    assert dominant_reason({}) is None
    assert (
        dominant_reason({FailureReason.NOT_READY: 3, FailureReason.OOM_KILLED: 1})
        is FailureReason.NOT_READY
    )
    assert (
        dominant_reason({FailureReason.NOT_READY: 2, FailureReason.OOM_KILLED: 2})
        is FailureReason.OOM_KILLED
    )


@pytest.mark.parametrize(
    ("adopted_healthy", "mode"),
    [
        pytest.param(4, Mode.MONITORING_SUCCEEDED, id="4-of-5-at-80-passes"),
        pytest.param(5, Mode.MONITORING_SUCCEEDED, id="all-pass"),
        pytest.param(3, Mode.ROLLING_BACK, id="3-of-5-at-80-fails"),
        pytest.param(0, Mode.ROLLING_BACK, id="none"),
    ],
)
def test_threshold_at_end_of_window(adopted_healthy: int, mode: Mode) -> None:
    decision = end_window(monitoring(), sample(adopted_healthy))
    assert decision.state.mode is mode


def test_success_records_last_successful_and_clears_rollback() -> None:
    decision = end_window(monitoring(), sample(5))
    assert decision.state.last_successful is not None
    assert decision.state.last_successful.containers["app"].requests == {"memory": "256Mi"}
    (record,) = decision.effects
    assert isinstance(record, Record) and record.event_reason is EventReason.MONITORING_SUCCEEDED
    assert record.clear_rollback_recommendation
    owner_state = decision.state.owner_state()
    assert owner_state.mode is Mode.MONITORING_SUCCEEDED and owner_state.expiry_at is None


def test_mid_window_unhealth_does_not_fail_and_baseline_is_fixed_at_start() -> None:
    state = monitoring()
    early = decide(state, Sampled(T0 + timedelta(seconds=30), sample(0, oomKilled=5)))
    assert early.state.mode is Mode.MONITORING and early.effects == []
    assert early.state.baseline == 5
    # Scale-down during the window does not shrink the denominator: 3 of baseline 5 fail.
    late = decide(early.state, Sampled(T0 + timedelta(minutes=5), sample(3, desired=3)))
    assert late.state.mode is Mode.ROLLING_BACK


def test_the_baseline_read_at_the_start_leaves_one_sample_at_the_window_end() -> None:
    previous = stored(Mode.MONITORING_SUCCEEDED, fingerprint="old")
    state = start(LoadOwnerResult(exists=True, state=previous, policy=policy(), desired=5)).state
    assert state.baseline == 5 and state.next_sample_at == state.window_ends_at
    # However long the window, the final sample is the only one, and it decides: 3 of 5 fail.
    late = decide(state, Sampled(T0 + timedelta(minutes=5), sample(3, desired=3)))
    assert late.state.mode is Mode.ROLLING_BACK and late.state.samples_taken == 1


def test_a_reopened_window_is_sampled_when_it_opens() -> None:
    state = start(LoadOwnerResult(exists=True, policy=policy(), desired=5)).state
    reopened = decide(state, Reopen(T0 + timedelta(minutes=1))).state
    assert reopened.baseline is None and reopened.next_sample_at == T0 + timedelta(minutes=1)
    opened = decide(reopened, Sampled(T0 + timedelta(minutes=1), sample(4, desired=4))).state
    assert opened.baseline == 4 and opened.next_sample_at == opened.window_ends_at


def test_oom_rolls_back_to_last_successful() -> None:
    decision = end_window(monitoring(), sample(2, oomKilled=3))
    assert decision.state.failure_reason is FailureReason.OOM_KILLED
    record, rollback = decision.effects
    assert isinstance(record, Record) and record.event_reason is EventReason.ROLLING_BACK_STARTED
    assert record.warning
    assert isinstance(rollback, RollBack)
    assert rollback.target is RollbackTarget.LAST_SUCCESSFUL and rollback.resources == GOOD


def test_observe_only_decides_and_reports_the_same_but_acts_not() -> None:
    acting = end_window(monitoring(), sample(2, oomKilled=3))
    watching = end_window(monitoring(policy(observe_only=True)), sample(2, oomKilled=3))
    assert watching.state.mode is acting.state.mode is Mode.ROLLING_BACK
    assert watching.state.failure_reason is acting.state.failure_reason
    record, rollback = watching.effects
    assert isinstance(record, Record) and record.event_reason is EventReason.ROLLING_BACK_STARTED
    assert "would roll back to lastSuccessful (app: requests memory=1Gi)" in record.message
    assert "nothing written" in record.message
    assert isinstance(rollback, RollBack) and rollback.observe_only
    acted = acting.effects[1]
    assert isinstance(acted, RollBack) and not acted.observe_only
    assert "restoring lastSuccessful (app: requests memory=1Gi)" in acting.effects[0].message  # type: ignore[union-attr]
    backing_off = decide(watching.state, RolledBack(T0, ActuationResult(message="observe-only")))
    assert backing_off.state.mode is Mode.BACKING_OFF
    (note,) = backing_off.effects
    assert isinstance(note, Record) and note.message.startswith("Would have rolled back")
    over = decide(
        backing_off.state,
        BackoffOver(T0 + timedelta(hours=1), ResolvePolicyResult(policy=policy(observe_only=True))),
    )
    assert over.state.mode is Mode.BACKED_OFF
    reapply = over.effects[1]
    assert isinstance(reapply, Reapply) and reapply.observe_only


def test_messages_say_each_clause_once_and_match_the_mode() -> None:
    quiet = end_window(monitoring(), sample(1))  # nobody unhealthy: the tally is the problem
    record = quiet.effects[0]
    assert isinstance(record, Record)
    assert record.message.count("pods adopted and healthy") == 1
    assert quiet.state.failure_message == record.message
    assert "restoring lastSuccessful (app: requests memory=1Gi)" in record.message
    # Once the rollback is done the state says so, and no later mode says "restoring".
    backing_off = decide(quiet.state, RolledBack(T0, ActuationResult(pods_resized=5)))
    over = decide(
        backing_off.state,
        BackoffOver(T0 + timedelta(hours=1), ResolvePolicyResult(policy=policy(max_attempts=1))),
    )
    for state in (backing_off.state, over.state):
        assert state.failure_message is not None
        assert "restoring" not in state.failure_message
        assert state.failure_message.endswith(
            "; rolled back to lastSuccessful (app: requests memory=1Gi)"
        )
    assert over.state.mode is Mode.FAILED_PERMANENT


def test_threshold_not_met_without_unhealthy_pods() -> None:
    decision = end_window(monitoring(), sample(1))
    assert decision.state.failure_reason is FailureReason.ADOPTION_THRESHOLD_NOT_MET


def test_manifest_target_needs_no_record() -> None:
    decision = end_window(
        monitoring(policy(RollbackTarget.MANIFEST), last_successful=None), sample(0)
    )
    rollback = decision.effects[1]
    assert isinstance(rollback, RollBack) and rollback.target is RollbackTarget.MANIFEST
    assert rollback.resources is None


def test_last_successful_unavailable_is_permanent() -> None:
    decision = end_window(monitoring(last_successful=None), sample(0, crashLoopBackOff=5))
    assert decision.state.mode is Mode.FAILED_PERMANENT
    assert decision.state.failure_reason is FailureReason.ROLLBACK_RECOMMENDATION_UNAVAILABLE
    (record,) = decision.effects
    assert (
        isinstance(record, Record) and record.event_reason is EventReason.RECOMMENDATION_UNAVAILABLE
    )


def rolled_back(
    p: PolicySettings | None = None, turn_state: RollbackState | None = None
) -> Decision:
    state = turn_state or end_window(monitoring(p), sample(0, oomKilled=5)).state
    return decide(state, RolledBack(T0 + timedelta(minutes=5), ActuationResult(pods_resized=5)))


def test_backoff_wait_follows_formula() -> None:
    decision = rolled_back()
    assert decision.state.mode is Mode.BACKING_OFF
    assert decision.state.backoff_ends_at == T0 + timedelta(minutes=5) + timedelta(
        minutes=2
    )  # 1m*2*1
    assert decision.state.failure_reason is FailureReason.OOM_KILLED
    assert decision.state.owner_state().expiry_at == decision.state.backoff_ends_at


def test_backoff_over_before_last_turn_backs_off_and_reapplies() -> None:
    state = rolled_back().state
    decision = decide(
        state, BackoffOver(T0 + timedelta(minutes=7), ResolvePolicyResult(policy=policy()))
    )
    assert decision.state.mode is Mode.BACKED_OFF
    record, reapply = decision.effects
    assert isinstance(record, Record) and record.event_reason is EventReason.BACKOFF_TURN_COMPLETED
    assert record.clear_rollback_recommendation
    assert isinstance(reapply, Reapply) and reapply.recommendation == REC


def test_backoff_over_on_last_turn_is_permanent() -> None:
    state = rolled_back(policy(max_attempts=1)).state
    decision = decide(
        state,
        BackoffOver(T0 + timedelta(minutes=7), ResolvePolicyResult(policy=policy(max_attempts=1))),
    )
    assert decision.state.mode is Mode.FAILED_PERMANENT
    assert decision.state.failure_reason is FailureReason.OOM_KILLED
    (record,) = decision.effects
    assert isinstance(record, Record) and record.event_reason is EventReason.BACKOFF_EXHAUSTED


def test_policy_gone_at_turn_boundary_clears_state() -> None:
    state = rolled_back().state
    decision = decide(
        state, BackoffOver(T0 + timedelta(minutes=7), ResolvePolicyResult(policy=None))
    )
    assert decision.state.mode is Mode.CLEARED
    (record,) = decision.effects
    assert (
        isinstance(record, Record)
        and record.remove_state
        and record.event_reason is EventReason.STATE_CLEARED
    )


def test_next_turn_starts_after_backed_off() -> None:
    decision = start(
        LoadOwnerResult(exists=True, state=stored(Mode.BACKED_OFF, turn=1), policy=policy())
    )
    assert decision.state.mode is Mode.MONITORING and decision.state.turn == 2
    assert decision.state.last_successful == GOOD


def test_same_fingerprint_after_failed_permanent_is_not_monitored() -> None:
    decision = start(
        LoadOwnerResult(exists=True, state=stored(Mode.FAILED_PERMANENT, turn=2), policy=policy())
    )
    assert decision.state.mode is Mode.FAILED_PERMANENT and decision.effects == []


def test_reopen_after_failed_permanent_retries_from_turn_one() -> None:
    """An operator's retry of a failed workload: a fresh attempt at turn 1 (maxAttempts turns
    again), the recommendation re-applied since the pods run the rolled-back resources."""
    decision = start(
        LoadOwnerResult(exists=True, state=stored(Mode.FAILED_PERMANENT, turn=2), policy=policy()),
        trigger=Trigger.REOPEN,
    )
    assert decision.state.mode is Mode.MONITORING and decision.state.turn == 1
    assert decision.state.last_successful == GOOD and decision.state.failure_reason is None
    record, reapply = decision.effects
    assert isinstance(record, Record) and record.event_reason is EventReason.MONITORING_STARTED
    assert "Retrying" in record.message and "(turn 1)" in record.message
    assert isinstance(reapply, Reapply) and reapply.recommendation == REC


def test_a_retrys_held_re_apply_opens_its_window_when_it_lands() -> None:
    """A retry after failedPermanent whose re-apply a pause held past the window's length: the
    window opens when the re-apply lands (a fresh one, on the baselines it opened with), so no
    verdict is taken on the kills that failed the last turn; a re-apply for a next turn (the
    run ended backedOff) changes nothing."""
    loaded = LoadOwnerResult(
        exists=True, state=stored(Mode.FAILED_PERMANENT, turn=2), policy=policy(), desired=5
    )
    retry = start(loaded, trigger=Trigger.REOPEN).state
    landed = T0 + timedelta(minutes=20)  # held: the 5-minute window would be long over
    at_once = decide(retry, Reapplied(T0, ActuationResult(pods_resized=5)))  # not held
    assert at_once.state == retry and at_once.effects == []
    fresh = decide(retry, Reapplied(landed, ActuationResult(pods_resized=5), held=True))
    assert fresh.state.mode is Mode.MONITORING and fresh.state.turn == 1
    assert (fresh.state.window_started_at, fresh.state.window_ends_at) == (
        landed,
        landed + timedelta(minutes=5),
    )
    assert fresh.state.baseline == 5 and fresh.state.next_sample_at == fresh.state.window_ends_at
    (record,) = fresh.effects
    assert isinstance(record, Record) and record.event_reason is EventReason.MONITORING_STARTED
    assert record.message.startswith("Re-applied, then monitoring recommendation")
    not_yet = decide(fresh.state, Sampled(landed + timedelta(minutes=1), sample(0, oomKilled=5)))
    assert not_yet.state.mode is Mode.MONITORING  # the old window's evidence is no verdict
    backed_off = rolled_back().state.model_copy(update={"mode": Mode.BACKED_OFF})
    assert decide(backed_off, Reapplied(landed, ActuationResult())).state == backed_off


def test_new_fingerprint_starts_turn_one_and_keeps_last_successful() -> None:
    decision = start(
        LoadOwnerResult(
            exists=True,
            state=stored(Mode.FAILED_PERMANENT, turn=2, fingerprint="x"),
            policy=policy(),
        )
    )
    assert decision.state.mode is Mode.MONITORING and decision.state.turn == 1
    assert decision.state.last_successful == GOOD
    (record,) = decision.effects
    assert isinstance(record, Record) and record.event_reason is EventReason.MONITORING_STARTED


@pytest.mark.parametrize(
    ("reopen_enabled", "trigger", "pod_created", "mode"),
    [
        pytest.param(
            True,
            Trigger.OBSERVE,
            T0 + timedelta(seconds=1),
            Mode.MONITORING,
            id="newer-pod-reopens",
        ),
        pytest.param(
            True,
            Trigger.OBSERVE,
            T0 - timedelta(seconds=1),
            Mode.MONITORING_SUCCEEDED,
            id="older-pod",
        ),
        pytest.param(True, Trigger.OBSERVE, None, Mode.MONITORING_SUCCEEDED, id="no-pod-info"),
        pytest.param(True, Trigger.REOPEN, None, Mode.MONITORING, id="explicit-reopen"),
        pytest.param(
            False,
            Trigger.OBSERVE,
            T0 + timedelta(seconds=1),
            Mode.MONITORING_SUCCEEDED,
            id="disabled",
        ),
        pytest.param(
            False, Trigger.REOPEN, None, Mode.MONITORING_SUCCEEDED, id="disabled-explicit"
        ),
    ],
)
def test_reopen_after_success(
    reopen_enabled: bool, trigger: Trigger, pod_created: datetime | None, mode: Mode
) -> None:
    loaded = LoadOwnerResult(
        exists=True, state=stored(Mode.MONITORING_SUCCEEDED), policy=policy(reopen=reopen_enabled)
    )
    decision = start(loaded, trigger=trigger, pod_created=pod_created)
    assert decision.state.mode is mode
    assert bool(decision.effects) is (mode is Mode.MONITORING)


def test_no_policy_retains_or_clears() -> None:
    retained = start(LoadOwnerResult(exists=True, state=None, policy=None))
    assert retained.state.mode is Mode.CLEARED and retained.effects == []
    cleared = start(LoadOwnerResult(exists=True, state=stored(Mode.BACKED_OFF), policy=None))
    (record,) = cleared.effects
    assert isinstance(record, Record) and record.remove_state


def test_owner_gone() -> None:
    gone = start(LoadOwnerResult(exists=False))
    assert gone.state.mode is Mode.CLEARED and gone.state.failure_reason is FailureReason.OWNER_GONE
    mid = decide(
        monitoring(),
        Sampled(T0, CohortSample(exists=False, desired=0, pods=0, adopted=0, adopted_healthy=0)),
    )
    assert mid.state.failure_reason is FailureReason.OWNER_GONE and mid.effects == []


def test_malformed_recommendation_ends_attempt_with_event() -> None:
    bad = CohortSample(
        desired=5, pods=5, adopted=0, adopted_healthy=0, error="pod api-1: not valid JSON"
    )
    decision = decide(monitoring(), Sampled(T0, bad))
    assert decision.state.mode is Mode.ABORTED
    assert decision.state.failure_reason is FailureReason.MALFORMED_ANNOTATION
    (record,) = decision.effects
    assert (
        isinstance(record, Record)
        and record.warning
        and record.event_reason is EventReason.ATTEMPT_ABORTED
    )


def test_unreadable_state_is_replaced_with_a_warning() -> None:
    decision = start(
        LoadOwnerResult(exists=True, state=None, state_error="not JSON", policy=policy())
    )
    (record,) = decision.effects
    assert decision.state.mode is Mode.MONITORING and isinstance(record, Record) and record.warning
    assert "unreadable" in record.message


def test_cancel_and_reopen_signals() -> None:
    state = monitoring()
    cancelled = decide(state, Cancel(T0, "maintenance"))
    assert cancelled.state.mode is Mode.CANCELLED
    assert decide(cancelled.state, Cancel(T0)).effects == []  # nothing left to cancel
    reopened = decide(state, Reopen(T0 + timedelta(minutes=1)))
    assert reopened.state.window_ends_at == T0 + timedelta(minutes=6)
    disabled = decide(monitoring(policy(reopen=False)), Reopen(T0 + timedelta(minutes=1)))
    assert disabled.effects == [] and "enableMonitoringReopen" in disabled.note
    backing_off = rolled_back().state
    assert decide(backing_off, Reopen(T0)).effects == []


def test_observed_same_fingerprint_joins_new_one_supersedes() -> None:
    state = monitoring()
    same = decide(state, Observed(T0, REC))
    assert same.state == state and same.effects == []
    superseded = decide(state, Observed(T0, OTHER))
    assert superseded.state.mode is Mode.SUPERSEDED
    record, start_over = superseded.effects
    assert isinstance(record, Record) and record.clear_rollback_recommendation
    assert isinstance(start_over, StartOver) and start_over.recommendation == OTHER


def test_history_is_short_and_ordered() -> None:
    state = monitoring()
    for i in range(20):
        state = decide(state, Reopen(T0 + timedelta(seconds=i))).state
    assert len(state.history) == 10
    assert state.history[-1].time == T0 + timedelta(seconds=19)


@pytest.mark.parametrize("mode", [Mode.MONITORING, Mode.ROLLING_BACK, Mode.BACKING_OFF])
def test_every_active_mode_ends_on_cancel_supersede_abort_and_owner_gone(mode: Mode) -> None:
    def active() -> RollbackState:
        state = monitoring()
        if mode is not Mode.MONITORING:
            state = end_window(state, sample(0, oomKilled=5)).state
        if mode is Mode.BACKING_OFF:
            state = rolled_back(turn_state=state).state
        assert state.mode is mode
        return state

    later = T0 + timedelta(minutes=6)
    assert decide(active(), Cancel(later)).state.mode is Mode.CANCELLED
    assert decide(active(), Observed(later, OTHER)).state.mode is Mode.SUPERSEDED
    aborted = decide(active(), Aborted(later, FailureReason.MALFORMED_ANNOTATION, "bad"))
    assert aborted.state.mode is Mode.ABORTED
    gone = {
        Mode.MONITORING: Sampled(
            later, CohortSample(exists=False, pods=0, adopted=0, adopted_healthy=0)
        ),
        Mode.ROLLING_BACK: RolledBack(later, ActuationResult(exists=False)),
        Mode.BACKING_OFF: BackoffOver(later, ResolvePolicyResult(exists=False)),
    }[mode]
    cleared = decide(active(), gone).state
    assert (cleared.mode, cleared.failure_reason) == (Mode.CLEARED, FailureReason.OWNER_GONE)


HELD_IN = {Step.VERDICT: Mode.MONITORING, Step.ROLLBACK: Mode.ROLLING_BACK,
           Step.BACKOFF_END: Mode.BACKING_OFF, Step.REAPPLY: Mode.BACKED_OFF,
           Step.RECORD: Mode.BACKED_OFF}  # fmt: skip


@pytest.mark.parametrize("row", HOLDS, ids=[row[0].value for row in HOLDS])
def test_a_pause_holds_each_step_as_the_table_says(
    row: tuple[Step, str, frozenset[HoldEnds], str],
) -> None:
    """A step that found a pause is held by the machine, never a transition: until the pause's
    time (at least a second on, at most PAUSE_RECHECK), ended early by what ``HOLDS`` says; a
    cancel gives up only a rollback or a re-apply, and not in a run from before it could."""
    step, mode, ends, _ = row
    state = monitoring()
    if HELD_IN[step] is not Mode.MONITORING:
        state = end_window(state, sample(0, oomKilled=5)).state
    if HELD_IN[step] in (Mode.BACKING_OFF, Mode.BACKED_OFF):
        state = rolled_back(turn_state=state).state
    if HELD_IN[step] is Mode.BACKED_OFF:
        over = state.backoff_ends_at
        assert over is not None
        state = decide(state, BackoffOver(over, ResolvePolicyResult(policy=policy()))).state
    assert mode in (state.mode.value, "any")
    now = T0 + timedelta(hours=1)
    soon = Pause(
        scope=PauseScope.OWNER, name="shop/Deployment/api", until=now + timedelta(minutes=3)
    )
    for pause, wait in (
        (soon, timedelta(minutes=3)),
        (soon.model_copy(update={"until": now - timedelta(seconds=5)}), timedelta(seconds=1)),
        (soon.model_copy(update={"until": None}), PAUSE_RECHECK),
    ):
        decision = decide(state, PauseSeen(now, step, pause, resumes=4))
        assert decision.state == state  # holding changes nothing, and is no transition
        [hold] = decision.effects
        assert isinstance(hold, Hold)
        assert (hold.step, hold.until, hold.ends, hold.after_resumes) == (step, now + wait, ends, 4)
    assert hold.label == ("backedOff record" if step is Step.RECORD else step.value)
    assert HoldEnds.RESUME in hold.ends
    assert hold.gives_up(True) is (step in (Step.ROLLBACK, Step.REAPPLY, Step.RECORD))
    assert not hold.gives_up(False)


# --- the early verdict (docs/concepts/early-verdict.md) --------------------------------------


def early_policy(confirm: timedelta = timedelta(seconds=10)) -> PolicySettings:
    return policy().model_copy(update={"early_verdict": EarlyVerdict(confirmation_period=confirm)})


def failing(adopted_healthy: int, desired: int = 5, restarts: int = 0, **now: int) -> CohortSample:
    """A sample whose pods fail now for the reasons given (each also among the unhealthy), the
    failing pods named ``<reason>-<n>``, each restarted ``restarts`` times by the kubelet."""
    reasons = {FailureReason(k): v for k, v in now.items()}
    certain = {
        f"{reason}-{n}": Certain(reason=reason, restarts=restarts)
        for reason, count in reasons.items()
        for n in range(count)
    }
    return sample(adopted_healthy, desired, **now).model_copy(
        update={"failing": reasons, "certain": certain}
    )


@pytest.mark.parametrize(
    ("failing_now", "cohort", "pods", "percent", "reason"),
    [
        ({FailureReason.OOM_KILLED: 2}, 5, 5, 80, FailureReason.OOM_KILLED),  # 3 left, 4 required
        ({FailureReason.OOM_KILLED: 1}, 5, 5, 80, None),  # 4 left: the window can still pass
        ({FailureReason.NOT_READY: 5}, 5, 5, 80, None),  # not a certain failure
        ({FailureReason.UNSCHEDULABLE: 1, FailureReason.CRASH_LOOP_BACK_OFF: 2}, 5, 5, 80,
         FailureReason.CRASH_LOOP_BACK_OFF),
        ({FailureReason.RESIZE_INFEASIBLE: 1}, 1, 1, 1, FailureReason.RESIZE_INFEASIBLE),
        ({}, 0, 0, 100, None),
        # An HPA's scale-out from 2 to 6 on a full node: the 2 pods of the cohort may pass it.
        ({FailureReason.UNSCHEDULABLE: 4}, 2, 6, 100, None),
        ({FailureReason.OOM_KILLED: 3}, 2, 4, 100, FailureReason.OOM_KILLED),  # 1 could, 2 needed
        ({FailureReason.OOM_KILLED: 1}, 5, 3, 60, None),  # 2 missing may come: 4 could, 3 needed
        ({FailureReason.OOM_KILLED: 3}, 5, 3, 60, FailureReason.OOM_KILLED),  # 2 could
    ],
)  # fmt: skip
def test_early_failure_counts_only_certain_failures_that_lose_the_window(
    failing_now: dict[FailureReason, int], cohort: int, pods: int, percent: int,
    reason: FailureReason,
) -> None:  # fmt: skip
    assert early_failure(failing_now, cohort, pods, percent) is reason


def test_a_policy_without_an_early_verdict_ignores_suspicion_and_decides_at_the_end() -> None:
    state = monitoring()
    seen = decide(state, Suspected(T0 + timedelta(seconds=30)))
    assert seen.state == state and seen.effects == []
    mid = decide(state, Sampled(T0 + timedelta(seconds=30), failing(0, oomKilled=5)))
    assert mid.state.mode is Mode.MONITORING and mid.state.early_since is None


def test_a_certain_failure_confirmed_decides_the_window_early() -> None:
    state = decide(monitoring(early_policy()), Sampled(T0, sample(5))).state  # baseline 5
    t1 = T0 + timedelta(seconds=30)
    suspected = decide(state, Suspected(t1)).state
    assert suspected.next_sample_at == t1  # sample now
    crossing = decide(suspected, Sampled(t1, failing(0, oomKilled=3)))
    assert crossing.state.mode is Mode.MONITORING and crossing.effects == []
    assert crossing.state.early_since == t1
    assert crossing.state.next_sample_at == t1 + timedelta(seconds=10)  # the confirmation
    # A suspicion meanwhile changes nothing: the confirmation's sample is due at its end.
    assert decide(crossing.state, Suspected(t1 + timedelta(seconds=2))).state == crossing.state
    t2 = t1 + timedelta(seconds=10)
    decided = decide(crossing.state, Sampled(t2, failing(0, restarts=1, oomKilled=3)))
    assert decided.state.mode is Mode.ROLLING_BACK
    assert decided.state.failure_reason is FailureReason.OOM_KILLED
    assert decided.state.early_since is None
    message = decided.state.failure_message or ""
    assert message.startswith("decided early (3/5 pods failing for certain since 10s ago and still")
    assert [type(e).__name__ for e in decided.effects] == [
        type(e).__name__ for e in end_window(monitoring(), sample(0, oomKilled=3)).effects
    ]  # the same Record and rollback as at the window's end


def test_a_confirming_sample_that_fails_is_taken_again_the_confirmation_kept() -> None:
    """The API refuses the confirming sample (a 503 burst): the confirmation is not dropped to
    the window's end (the intake does not tell the same failure twice), it is sampled again."""
    state = decide(monitoring(early_policy()), Sampled(T0, sample(5))).state
    t1 = T0 + timedelta(seconds=30)
    crossing = decide(state, Sampled(t1, failing(0, oomKilled=3))).state
    t2 = t1 + timedelta(seconds=12)  # the confirmation's sample, after its own retries
    refused = decide(crossing, SampleFailed(t2, "ServiceException: (503)"))
    assert refused.state.early_since == t1
    assert refused.state.next_sample_at == t2 + timedelta(seconds=10)
    assert refused.note is not None and refused.note.startswith("confirming sample failed")
    again = Sampled(t2 + timedelta(seconds=10), failing(0, restarts=1, oomKilled=3))
    assert decide(refused.state, again).state.mode is Mode.ROLLING_BACK
    # Near the window's end, the next try is the end's own sample.
    late = T0 + timedelta(minutes=4, seconds=55)  # the window is 5 minutes
    near_end = decide(crossing, SampleFailed(late, "ServiceException: (503)")).state
    assert near_end.next_sample_at == near_end.window_ends_at
    # An opening sample that fails is skipped: the window's end decides.
    opening = decide(monitoring(early_policy()), SampleFailed(T0, "timeout")).state
    assert opening.early_since is None and opening.next_sample_at == opening.window_ends_at


def test_a_failed_sample_a_certain_failure_asked_for_is_taken_again() -> None:
    """The window's baseline is known (no opening sample); the intake tells a pod's certain
    failure once, and the sample it asks for meets a 503 burst: it is taken again a
    confirmation period later, not left to the window's end (the soak's early-oom fate stayed
    monitoring through its hour when it was)."""
    state = decide(monitoring(early_policy()), Sampled(T0, sample(5))).state
    assert state.baseline == 5 and state.early_since is None
    t1 = T0 + timedelta(seconds=30)
    suspected = decide(state, Suspected(t1)).state
    assert suspected.next_sample_at == t1
    t2 = t1 + timedelta(seconds=3)
    refused = decide(suspected, SampleFailed(t2, "ServiceException: (503)"))
    assert refused.state.next_sample_at == t2 + timedelta(seconds=10)
    assert refused.note is not None and refused.note.startswith("a certain failure's sample")
    crossing = decide(refused.state, Sampled(t2 + timedelta(seconds=10), failing(0, oomKilled=3)))
    assert crossing.state.early_since == t2 + timedelta(seconds=10)  # the confirmation begins


def test_a_pod_that_recovers_within_the_confirmation_is_not_rolled_back_early() -> None:
    state = decide(monitoring(early_policy()), Sampled(T0, sample(5))).state
    t1 = T0 + timedelta(seconds=30)
    crossing = decide(state, Sampled(t1, failing(3, oomKilled=2))).state
    assert crossing.early_since == t1
    # Restarted and Ready again: an OOM kill in the window, no certain failure now.
    recovered = decide(crossing, Sampled(t1 + timedelta(seconds=10), sample(5, oomKilled=2)))
    assert recovered.state.mode is Mode.MONITORING and recovered.state.early_since is None
    assert recovered.state.next_sample_at == recovered.state.window_ends_at


def test_a_crash_is_certain_only_once_the_kubelets_next_restart_failed_too() -> None:
    """One pod of 20 crashes under a 100% threshold: its crash alone loses the window, but the
    kubelet restarts it 10 s later (the confirmation is 5 s): not decided at the confirmation,
    looked at again each period; it recovers, and the window's end decides. Had its restart
    failed too (its restarts risen), the crash would be confirmed."""
    policy_ = early_policy(timedelta(seconds=5)).model_copy(
        update={"adoption_threshold_percent": 100}
    )
    state = decide(monitoring(policy_), Sampled(T0, sample(20, desired=20))).state
    t1 = T0 + timedelta(seconds=30)
    crossing = decide(state, Sampled(t1, failing(19, 20, crashLoopBackOff=1))).state
    assert crossing.early_since == t1
    t2 = t1 + timedelta(seconds=5)  # still backing off: the same restart count
    waiting = decide(crossing, Sampled(t2, failing(19, 20, crashLoopBackOff=1)))
    assert waiting.state.mode is Mode.MONITORING and waiting.state.early_since == t1
    assert waiting.state.next_sample_at == t2 + timedelta(seconds=5)
    # The intake tells the pod's next failure (its restart crashed): looked at now, not later.
    told = decide(waiting.state, Suspected(t2 + timedelta(seconds=2)))
    assert told.state.next_sample_at == t2 + timedelta(seconds=2)
    early_on = decide(crossing, Suspected(t1 + timedelta(seconds=2)))  # within the first period
    assert early_on.state.next_sample_at == t1 + timedelta(seconds=5)
    back = decide(waiting.state, Sampled(t2 + timedelta(seconds=5), sample(20, desired=20)))
    assert back.state.mode is Mode.MONITORING and back.state.early_since is None
    crashed_again = Sampled(t2 + timedelta(seconds=5), failing(19, 20, 1, crashLoopBackOff=1))
    assert decide(waiting.state, crashed_again).state.mode is Mode.ROLLING_BACK


def test_a_crash_since_first_seen_confirms_it_when_its_count_has_not_moved() -> None:
    """The kubelet starts a first crash again at once: the first look may already count that
    restart, and the second crash shows only as a later exit (``finishedAt``)."""
    state = decide(monitoring(early_policy()), Sampled(T0, sample(5))).state
    t1 = T0 + timedelta(seconds=30)

    def killed(at: datetime) -> CohortSample:
        seen = failing(0, restarts=1, oomKilled=3)
        certain = {n: c.model_copy(update={"exited_at": at}) for n, c in seen.certain.items()}
        return seen.model_copy(update={"certain": certain})

    crossing = decide(state, Sampled(t1, killed(t1))).state
    t2 = t1 + timedelta(seconds=10)
    assert decide(crossing, Sampled(t2, killed(t1))).state.mode is Mode.MONITORING  # no crash since
    assert decide(crossing, Sampled(t2, killed(t1 + timedelta(seconds=1)))).state.mode is (
        Mode.ROLLING_BACK
    )


def test_an_oom_kill_seen_twice_in_one_look_is_confirmed_a_crash_loop_not() -> None:
    """The first look comes after the second kill (the kubelet restarted the first at once):
    a restart counted and the restarted instance down again is killed twice, confirmed; a
    crash loop so (another cause than memory) waits for its next restart to fail."""
    state = decide(monitoring(early_policy()), Sampled(T0, sample(5))).state
    t1 = T0 + timedelta(seconds=30)

    def twice(**reasons: int) -> CohortSample:
        seen = failing(0, restarts=1, **reasons)
        certain = {n: c.model_copy(update={"down": True}) for n, c in seen.certain.items()}
        return seen.model_copy(update={"certain": certain})

    t2 = t1 + timedelta(seconds=10)
    oom = decide(state, Sampled(t1, twice(oomKilled=3))).state
    assert decide(oom, Sampled(t2, twice(oomKilled=3))).state.mode is Mode.ROLLING_BACK
    crash = decide(state, Sampled(t1, twice(crashLoopBackOff=3))).state
    assert decide(crash, Sampled(t2, twice(crashLoopBackOff=3))).state.mode is Mode.MONITORING


def test_the_confirmation_is_of_the_same_pods_not_of_a_count() -> None:
    """Three pods OOM-killed, then at the confirmation three others (the first three came back,
    three new ones crashed): nothing is confirmed; those three are confirmed a period later."""
    state = decide(monitoring(early_policy()), Sampled(T0, sample(5))).state
    t1 = T0 + timedelta(seconds=30)
    crossing = decide(state, Sampled(t1, failing(0, oomKilled=3))).state
    others = failing(0, restarts=4, oomKilled=3)
    others = others.model_copy(update={"certain": {
        f"other-{n}": c for n, c in enumerate(others.certain.values())}})  # fmt: skip
    t2 = t1 + timedelta(seconds=10)
    moved = decide(crossing, Sampled(t2, others))
    assert moved.state.mode is Mode.MONITORING and set(moved.state.early_pods) == {
        "other-0", "other-1", "other-2"}  # fmt: skip
    later = others.model_copy(update={"certain": {
        n: c.model_copy(update={"restarts": 5}) for n, c in others.certain.items()}})  # fmt: skip
    assert decide(moved.state, Sampled(t2 + timedelta(seconds=10), later)).state.mode is (
        Mode.ROLLING_BACK
    )


def test_a_pod_with_no_node_is_the_cuts_only_where_it_raised_a_request() -> None:
    """A node drained, 2 of 5 replacements Pending: under a cut that lowers requests that is
    not the cut's (the window's end judges it); under one that raises a request it is."""
    for raises, mode in ((False, Mode.MONITORING), (True, Mode.ROLLING_BACK)):
        opened = sample(5).model_copy(update={"raises_requests": raises})
        state = decide(monitoring(early_policy()), Sampled(T0, opened)).state
        t1 = T0 + timedelta(seconds=30)
        crossing = decide(state, Sampled(t1, failing(3, unschedulable=2))).state
        t2 = t1 + timedelta(seconds=10)
        assert decide(crossing, Sampled(t2, failing(3, unschedulable=2))).state.mode is mode


def test_a_start_whose_policy_is_gone_over_failed_permanent_brings_the_cut_back() -> None:
    """The state removed, the applier applies the recommendation it had given up: marked (the
    module's checker holds every record to ``BRINGS_BACK``); over backedOff, nothing to hold."""
    failed = LoadOwnerResult(exists=True, state=stored(Mode.FAILED_PERMANENT), policy=None)
    (record,) = start(failed).effects
    assert isinstance(record, Record) and record.remove_state and record.brings_back
    backed_off = LoadOwnerResult(exists=True, state=stored(Mode.BACKED_OFF), policy=None)
    (record,) = start(backed_off).effects
    assert isinstance(record, Record) and not record.brings_back


def test_every_drawn_transition_is_taken() -> None:
    """Last in this module: each row of the table is a transition some test above makes."""
    others = {name for name in globals() if name.startswith("test_")} - {
        "test_every_drawn_transition_is_taken"
    }
    if not others <= RAN:
        pytest.skip("needs the whole module (it counts the transitions its tests take)")
    assert set() == DRAWN - TAKEN
    assert set(BRINGS_BACK) == MARKED  # each record that brings a cut back, met
