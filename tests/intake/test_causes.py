"""The intake's causes, each a pure function, tested without a cluster, a Temporal or a thread:
what an adoption, a backed-off turn, a pause, a policy event and a control annotation mean."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from activities.kubetime import kube_time
from tests.activity.builders import NS, owner, pod, policy
from tests.workflow.helpers import rec
from worker.intake.causes import (
    Notice,
    PolicyAction,
    Sighted,
    adopted_recommendation,
    adoption,
    going_on,
    held,
    might_fail,
    pause_change,
    policy_change,
    suspect,
)
from worker.intake.controls import ControlAction, control_change, unknown_control
from workflows.activity_api import OwnerRef
from workflows.contract import (
    PAUSE_REASON_ANNOTATION,
    PAUSE_UNTIL_ANNOTATION,
    ROLLBACK_STATE_ANNOTATION,
    EventReason,
    Mode,
    WorkloadKind,
)
from workflows.policy import RollbackPolicy
from workflows.state import OwnerState

REF = OwnerRef(namespace=NS, kind=WorkloadKind.DEPLOYMENT, name="web")
REC = rec("768Mi")
NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
POLICY = RollbackPolicy.model_validate(policy())


def seen(pod: str = "web-0", created: datetime | None = NOW) -> Sighted:
    return Sighted(REF, REC, pod, created)


def stored(mode: Mode, at: datetime = NOW - timedelta(minutes=1), turn: int = 1) -> OwnerState:
    return OwnerState(
        mode=mode, active_recommendation_fingerprint=REC.fingerprint, turn=turn,
        last_transition_time=at,
    )  # fmt: skip


# --- adoption ------------------------------------------------------------------------------------


def test_an_adoption_without_a_policy_is_retained() -> None:
    assert adoption(seen(), None, None, None).why == "retained"


def test_a_first_adoption_signals_turn_one_with_the_policy_it_was_resolved_under() -> None:
    verdict = adoption(seen(), None, POLICY, None)
    assert verdict.why == "signals" and verdict.signal is not None
    assert verdict.signal.turn == 1 and verdict.basis == (REC.fingerprint, None)
    assert (
        verdict.signal.policy is not None
        and str(verdict.signal.policy.ref) == f"RollbackPolicy/{NS}/p"
    )


def test_a_settled_fingerprint_is_not_signalled_again() -> None:
    verdict = adoption(
        seen(created=NOW - timedelta(hours=1)), stored(Mode.MONITORING_SUCCEEDED), POLICY, None
    )
    assert (verdict.why, verdict.signal) == ("already_settled", None)


def test_a_backed_off_turn_goes_on_with_the_next_turn() -> None:
    verdict = adoption(seen(), stored(Mode.BACKED_OFF, turn=2), POLICY, None)
    assert verdict.signal is not None and verdict.signal.turn == 3


def test_the_same_grounds_are_signalled_once() -> None:
    first = adoption(seen(), None, POLICY, None)
    again = adoption(seen("web-1"), None, POLICY, first.basis)
    assert again.why == "deduplicated" and again.signal is None
    # The stored state moved on (the attempt it woke ended backedOff): signalled again.
    later = adoption(seen("web-2"), stored(Mode.BACKED_OFF), POLICY, first.basis)
    assert later.why == "signals"


def test_adopted_recommendation_is_the_one_whose_resources_the_pod_runs() -> None:
    assert adopted_recommendation(pod("web-0", {"app": "web"}, memory="768Mi", rec=REC)) == REC
    assert adopted_recommendation(pod("web-0", {"app": "web"}, memory="1Gi", rec=REC)) is None
    assert adopted_recommendation(pod("web-0", {"app": "web"})) is None


def test_the_newest_pod_still_on_a_backed_off_recommendation_goes_on() -> None:
    obj = owner("Deployment")
    assert going_on(obj, [seen()]) is None  # no stored state
    obj["metadata"]["annotations"] = {ROLLBACK_STATE_ANNOTATION: stored(Mode.BACKED_OFF).to_json()}
    older, newer = seen("web-0", NOW - timedelta(minutes=5)), seen("web-1", NOW)
    assert going_on(obj, [older, newer]) is newer
    other = Sighted(REF, rec("1Gi"), "x", NOW)
    assert going_on(obj, [other]) is None  # not on the turn's recommendation
    obj["metadata"]["annotations"] = {ROLLBACK_STATE_ANNOTATION: stored(Mode.MONITORING).to_json()}
    assert going_on(obj, [newer]) is None


def test_a_replacement_seen_before_the_turn_ended_reopens_it_once_the_state_says_so() -> None:
    """A pod replaced right after the verdict: seen while the state still said monitoring, its
    sighting is the running attempt's (deduplicated); once the owner's state shows the turn
    succeeded, before the pod was created, it is considered again and reopens the turn."""
    replacement = seen("web-2", NOW)
    first = adoption(seen("web-0", NOW - timedelta(minutes=5)), None, POLICY, None)
    while_running = adoption(replacement, stored(Mode.MONITORING), POLICY, first.basis)
    assert while_running.why == "deduplicated"
    obj = owner("Deployment")
    succeeded = stored(Mode.MONITORING_SUCCEEDED, at=NOW - timedelta(seconds=1))
    obj["metadata"]["annotations"] = {ROLLBACK_STATE_ANNOTATION: succeeded.to_json()}
    older = seen("web-0", NOW - timedelta(minutes=5))  # before the success: settled
    assert going_on(obj, [older, replacement]) is replacement
    again = adoption(replacement, succeeded, POLICY, first.basis)
    assert again.why == "signals" and again.signal is not None and again.signal.turn == 1
    assert going_on(obj, [older]) is None


# --- pauses ---------------------------------------------------------------------------------------


def paused(until: str | None, reason: str | None = None) -> dict:  # type: ignore[type-arg]
    annotations = {PAUSE_UNTIL_ANNOTATION: until} if until else {}
    if reason:
        annotations[PAUSE_REASON_ANNOTATION] = reason
    return {"metadata": {"name": "web", "namespace": NS, "annotations": annotations}}


def test_a_pause_that_appears_changes_the_condition_and_lifts_nothing() -> None:
    change = pause_change(None, "ADDED", paused("2999-01-01T00:00:00Z"))
    assert change.now == {PAUSE_UNTIL_ANNOTATION: "2999-01-01T00:00:00Z"}
    assert change.changed and not change.lifted


@pytest.mark.parametrize(
    ("event", "obj"),
    [("MODIFIED", paused(None)), ("DELETED", paused("2999-01-01T00:00:00Z")),
     ("MODIFIED", paused("2999-01-01T00:00:00Z", reason="incident 42"))],
    ids=["removed", "object-deleted", "reason-changed"],
)  # fmt: skip
def test_a_pause_that_goes_or_changes_is_lifted(event: str, obj: dict) -> None:  # type: ignore[type-arg]
    change = pause_change({PAUSE_UNTIL_ANNOTATION: "2999-01-01T00:00:00Z"}, event, obj)
    assert change.changed and change.lifted


def test_the_same_pause_seen_again_is_no_change() -> None:
    before = {PAUSE_UNTIL_ANNOTATION: "2999-01-01T00:00:00Z"}
    change = pause_change(before, "MODIFIED", paused("2999-01-01T00:00:00Z"))
    assert not change.changed and not change.lifted
    assert not pause_change(None, "MODIFIED", paused(None)).changed


def test_held_by_a_pause_on_the_namespace_the_owner_or_a_pod_until_it_expires() -> None:
    future, past = (
        {PAUSE_UNTIL_ANNOTATION: "2999-01-01T00:00:00Z"},
        {PAUSE_UNTIL_ANNOTATION: "2000-01-01T00:00:00Z"},
    )
    assert not held(REF, None, None, [], NOW)
    assert held(REF, future, None, [], NOW)
    assert held(REF, None, future, [], NOW)
    assert held(REF, None, None, [("web-0", future)], NOW)
    assert not held(REF, past, past, [("web-0", past)], NOW)


# --- policies -------------------------------------------------------------------------------------


def test_a_policy_event_validates_once_per_spec() -> None:
    obj = policy()
    obj["metadata"] |= {"uid": "u1", "generation": 1}
    first = policy_change("ADDED", obj, None)
    assert first.action is PolicyAction.VALID and first.policy is not None
    # Its status written (by us): the same uid, generation and annotations: nothing to redo.
    assert policy_change("MODIFIED", obj, first.handled).action is PolicyAction.SEEN
    obj["metadata"]["generation"] = 2
    assert policy_change("MODIFIED", obj, first.handled).action is PolicyAction.VALID
    assert policy_change("DELETED", obj, first.handled).action is PolicyAction.GONE


def test_an_invalid_policy_says_which_field_and_why() -> None:
    change = policy_change("ADDED", policy(adoptionThresholdPercent=150), None)
    assert change.action is PolicyAction.INVALID and change.policy is None
    # As docs/concepts/activities.md quotes it.
    assert (
        change.error == "spec.adoptionThresholdPercent: Input should be less than or equal to 100"
    )
    notice = Notice.invalid_policy(policy(), change.error)
    assert notice.reason is EventReason.POLICY_INVALID and change.error in notice.message


# --- controls -------------------------------------------------------------------------------------


def test_a_control_is_carried_out_once_until_its_removal_shows() -> None:
    assert control_change("MODIFIED", "cancel", busy=False) is ControlAction.CARRY_OUT
    assert control_change("MODIFIED", "cancel", busy=True) is ControlAction.BUSY
    assert control_change("MODIFIED", None, busy=True) is ControlAction.DONE
    assert control_change("DELETED", "cancel", busy=True) is ControlAction.FORGET


def test_an_unknown_control_is_refused_with_the_known_ones() -> None:
    assert unknown_control("cancel") is None and unknown_control("reopen") is None
    refusal = unknown_control("pause")
    assert refusal == "unknown value 'pause' (expected one of: cancel, reopen)"
    obj = owner("Deployment")
    obj["metadata"] |= {"uid": "u1", "resourceVersion": "7"}
    notice = Notice.control_refused(obj, "pause", refusal)
    assert notice.reason is EventReason.CONTROL_REJECTED and notice.identity == "u1/7/control"


# --- the early verdict ------------------------------------------------------------------------


def in_window(mode: Mode = Mode.MONITORING) -> dict:  # type: ignore[type-arg]
    obj = owner("Deployment")
    obj["metadata"]["annotations"] = {ROLLBACK_STATE_ANNOTATION: stored(mode).to_json()}
    return obj


def oom_killed(ready: bool = False, finished: datetime = NOW) -> dict:  # type: ignore[type-arg]
    killed = {"terminated": {"reason": "OOMKilled", "finishedAt": kube_time(finished)}}
    return pod("web-0", {"app": "web"}, ready=ready, last_state=killed)


EARLY = RollbackPolicy.model_validate(policy(earlyVerdict={"confirmationPeriod": "3s"}))


def test_a_pod_failing_for_certain_in_an_early_verdicts_window_is_suspected() -> None:
    assert suspect(oom_killed(), in_window(), EARLY)
    unschedulable = pod("web-1", {"app": "web"}, phase="Pending", conditions=[
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}])  # fmt: skip
    assert suspect(unschedulable, in_window(), EARLY)


def test_no_suspicion_without_an_early_verdict_a_window_or_a_certain_failure() -> None:
    assert not suspect(oom_killed(), in_window(), POLICY)  # no earlyVerdict: Kubex's behaviour
    assert not suspect(oom_killed(), in_window(Mode.BACKING_OFF), EARLY)
    assert not suspect(oom_killed(), owner("Deployment"), EARLY)  # no state: no window
    # Recovered (Ready again), before this window or in it: no certain failure now. Killed
    # before it and not ready since, it still fails (the window's rule, ``cohort.health``: a
    # cut's restart backoff can outlast a short window).
    before = NOW - timedelta(hours=1)
    assert not suspect(oom_killed(ready=True), in_window(), EARLY)
    assert not suspect(oom_killed(ready=True, finished=before), in_window(), EARLY)
    assert suspect(oom_killed(finished=before), in_window(), EARLY)
    starting = pod("web-0", {"app": "web"}, ready=False)  # not Ready, nothing certain
    assert might_fail(starting) and not suspect(starting, in_window(), EARLY)
    assert not might_fail(pod("web-0", {"app": "web"}))  # Ready: out before any lookup
