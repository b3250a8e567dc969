"""The rollback state machine: ``decide(state, observation) -> Decision``, pure and total.

The workflow is a thin loop around this module: it observes (an activity result, a timer, a
signal), calls ``decide``, then performs the decision's effects (activities) and waits for what
the new mode calls for. Nothing here knows about Temporal or Kubernetes, so every path is tested
on virtual time in ``tests/unit/test_machine.py``.

Modes and transitions: ``TRANSITIONS`` below, the table the docs draw the diagram from
(docs/concepts.md).

One authoritative sample decides, at the end of the window. The baseline comes from the owner
read when the window opens (``AttemptStarted.loaded.desired``); only a kind without a desired
count (an AnalysisRun) or a reopened window is sampled when it opens as well. Nothing else is
sampled in between, so an attempt costs the same whatever its window (docs/concepts/workflow.md,
"The RollbackWorkflow"); except under a policy with an ``earlyVerdict``, when the intake sees a
pod of the cohort fail for certain (``Suspected``): then a sample, and if certain failures lose
the window (``early_failure``), another after the confirmation period, which decides it early
as its end would (docs/concepts/early-verdict.md).

Adoption threshold, evaluated once at the end of the window against the *baseline cohort* (the
desired replicas when the attempt's window opened), with integer math so that no float rounding
can flip a verdict::

    required = ceil(baseline * percent / 100) = (baseline * percent + 99) // 100


    baseline 5, 80%  -> required 4: 4 adopted and healthy pass, 3 fail
    baseline 3, 80%  -> required 3 (2.4 rounds up: "at least 80%" means 2 of 3 is not enough)
    baseline 10, 90% -> required 9
    baseline 1, 1%   -> required 1
    baseline 0       -> required 0: nothing to judge, the attempt succeeds

Pods that never came up count against the threshold, pods beyond the baseline (a scale-up)
count for it. Transient restarts during the window do not fail it; only health at the end does.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from pydantic import Field

from workflows.activity_api import (
    ActuationResult,
    Certain,
    CohortSample,
    HealthResult,
    LoadOwnerResult,
    OwnerRef,
    PolicySettings,
    ResolvePolicyResult,
)
from workflows.backoff import backoff_wait
from workflows.contract import CERTAIN_REASONS, EventReason, FailureReason, Mode, RollbackTarget
from workflows.durations import format_duration
from workflows.fingerprint import Recommendation
from workflows.neighbours import autoscaler_check, judged_cohort, release_recheck, release_seen
from workflows.pause import Pause
from workflows.policy import HealthChecks
from workflows.state import (
    HISTORY_LIMIT,
    Autoscaler,
    CamelModel,
    HistoryEntry,
    OwnerState,
    ResourceSnapshot,
    Template,
    WindowBaselines,
)
from workflows.wake import LastAttempt, Sighting, Trigger, Verdict, Wake, wake

_ACTIVE = (Mode.MONITORING, Mode.ROLLING_BACK, Mode.BACKING_OFF)
# Every transition ``decide`` makes, as (from, on what, to); ``None`` is a run's start. A run that
# starts and ends at once in the mode it finds (nothing to do) makes none. The docs' diagram is
# drawn from this table (``cli.docs``), and tests/unit/test_machine.py fails on a transition the
# code makes that is not here, and on a row no test takes.
TRANSITIONS: tuple[tuple[Mode | None, str, Mode], ...] = (
    (None, "a policy matches the adopted recommendation", Mode.MONITORING),
    (None, "no policy matches any more", Mode.CLEARED),
    (Mode.MONITORING, "reopen (a fresh window)", Mode.MONITORING),
    (Mode.MONITORING, "a release rolled out (a fresh window)", Mode.MONITORING),
    (Mode.MONITORING, "a retry's re-apply landed (a fresh window)", Mode.MONITORING),
    (Mode.MONITORING, "window ends, threshold met", Mode.MONITORING_SUCCEEDED),
    (Mode.MONITORING, "window ends, threshold not met", Mode.ROLLING_BACK),
    (Mode.MONITORING, "lastSuccessful target, nothing recorded", Mode.FAILED_PERMANENT),
    (Mode.ROLLING_BACK, "rolled back", Mode.BACKING_OFF),
    (Mode.BACKING_OFF, "wait over, turns left", Mode.BACKED_OFF),
    (Mode.BACKING_OFF, "wait over, last turn (maxAttempts)", Mode.FAILED_PERMANENT),
    (Mode.BACKING_OFF, "no policy matches any more", Mode.CLEARED),
    *((mode, "cancel", Mode.CANCELLED) for mode in _ACTIVE),
    *((mode, "a new recommendation adopted", Mode.SUPERSEDED) for mode in _ACTIVE),
    *((mode, "an error retrying cannot fix", Mode.ABORTED) for mode in _ACTIVE),
    *((mode, "owner deleted", Mode.CLEARED) for mode in _ACTIVE),
)

# Most telling first: when several reasons are present in equal numbers, this one is reported.
REASON_PRIORITY = (
    FailureReason.OOM_KILLED,
    FailureReason.CRASH_LOOP_BACK_OFF,
    FailureReason.RESIZE_INFEASIBLE,
    FailureReason.UNSCHEDULABLE,
    FailureReason.RESIZE_ERROR,
    FailureReason.RESIZE_DEFERRED,
    FailureReason.FAILED,
    FailureReason.NOT_READY,
)


def required_adopters(baseline: int, percent: int) -> int:
    """``ceil(baseline * percent / 100)`` in integers; see the module docstring's examples."""
    return (baseline * percent + 99) // 100


def dominant_reason(unhealthy: dict[FailureReason, int]) -> FailureReason | None:
    present = [r for r in REASON_PRIORITY if unhealthy.get(r, 0) > 0]
    if not present:
        return None
    return max(present, key=lambda r: (unhealthy[r], -REASON_PRIORITY.index(r)))


def early_failure(
    failing: Mapping[FailureReason, int], cohort: int, pods: int, percent: int
) -> FailureReason | None:
    """The early verdict's rule: the dominant certain reason when the pods failing for certain
    (``contract.CERTAIN_REASONS``) leave fewer than the threshold of the judged ``cohort``
    requires, even if every other pod there is (``pods``) or may yet come (up to ``cohort``)
    adopted and was healthy; None while the window can still pass. So it decides only what the
    window's end would decide on the same sample: there, at most ``pods`` less the failing are
    adopted and healthy (pods an HPA added count for the end: they count here too).

    >>> early_failure({FailureReason.UNSCHEDULABLE: 4}, cohort=2, pods=6, percent=100)  # HPA
    >>> early_failure({FailureReason.OOM_KILLED: 2}, cohort=5, pods=5, percent=80)
    <FailureReason.OOM_KILLED: 'oomKilled'>
    """
    certain = {r: n for r, n in failing.items() if r in CERTAIN_REASONS and n > 0}
    could = max(cohort, pods) - sum(certain.values())
    if not certain or could >= required_adopters(cohort, percent):
        return None
    return dominant_reason(certain)


def caused_by_cut(
    reason: FailureReason, raises_requests: bool | None, release: bool = False
) -> bool:
    """Whether the cut can cause a pod's ``reason``, the one rule of attribution (the early
    verdict's, and a release's): an OOM kill under its limits and a resize the node can never
    take are its whatever else changed; a pod with no node to run on is its only where it raised
    a request above the template (a drain's or an HPA's Pending pods under a cut that lowers
    requests are not); any other failure (a crash loop, a failing probe) is its unless a
    ``release`` rolls out, whose new image may crash or fail by itself."""
    if reason is FailureReason.UNSCHEDULABLE:
        return raises_requests is True
    if reason in (FailureReason.OOM_KILLED, FailureReason.RESIZE_INFEASIBLE):
        return True
    return not release


def confirmed(before: Certain, now: Certain) -> bool:
    """Whether a pod failing for certain when first seen (``before``) is confirmed by a later
    look (``now``): a crash (an OOM kill, a crash loop) once the kubelet's next run of it failed
    too: it crashed again since (its restarts rose, or it exited later than first seen), or,
    for an OOM kill, it is killed twice (a restart counted, and the restarted instance down
    again: the kubelet starts a first crash again at once, so the second kill may come before
    the first look); a pod with no node, or a resize the node can never take, once it still
    fails so."""
    if now.reason not in (FailureReason.OOM_KILLED, FailureReason.CRASH_LOOP_BACK_OFF):
        return True
    exits = (before.exited_at, now.exited_at)
    later = exits[0] is not None and exits[1] is not None and exits[1] > exits[0]
    twice = now.reason is FailureReason.OOM_KILLED and now.restarts >= 1 and now.down
    return now.restarts > before.restarts or later or twice


class RollbackState(CamelModel):
    """Everything the workflow knows; carried across continue-as-new and returned by ``status``."""

    owner: OwnerRef
    recommendation: Recommendation
    fingerprint: str
    mode: Mode
    turn: int = 1
    policy: PolicySettings | None = None
    baseline: int | None = None
    failure_reason: FailureReason | None = None
    failure_message: str | None = None
    last_successful: ResourceSnapshot | None = None
    window_started_at: datetime | None = None
    window_ends_at: datetime | None = None
    next_sample_at: datetime | None = None
    backoff_ends_at: datetime | None = None
    last_sample: CohortSample | None = None
    last_health: HealthResult | None = None  # the verdict's health checks, when it asked
    samples_taken: int = 0
    transitions: int = 0
    last_transition_time: datetime | None = None
    history: list[HistoryEntry] = Field(default_factory=list)
    # What failed and what the rollback restores, kept apart so that each later mode states its
    # own outcome ("restoring X" while rolling back, "rolled back to X" once the turn is over).
    problem: str | None = None
    restore: str | None = None
    # When certain failures were first seen to lose this window (``early_failure``): the early
    # verdict's confirmation runs from it; None while they do not (or without one). The pods
    # failing then, with their restarts: the confirmation is of these pods (``_early``).
    early_since: datetime | None = None
    early_pods: dict[str, Certain] = Field(default_factory=dict)
    # The window's opening read: whether the recommendation raises a request above the owner's
    # template (``caused_by_cut``: only then is a pod's Unschedulable the cut's).
    raises_requests: bool | None = None
    # When the intake saw the cut adopted (a pod changed to it): a relative health bound's
    # baseline ends before it (``baseline_at``), not at the window's start, which may be later.
    adopted_at: datetime | None = None
    # The window's other baselines (its opening read): the owner's pod template (a release is
    # its change) and its HPA (the autoscaler check), ``workflows.neighbours``.
    template: Template | None = None
    autoscaler: Autoscaler | None = None
    # A release seen during this window (what changed): the verdict waits for its rollout,
    # looking again ``release_looks`` times so far.
    release: str | None = None
    release_looks: int = 0
    release_since: datetime | None = None  # when first seen: the wait's bound runs from it

    @property
    def required(self) -> int | None:
        if self.baseline is None or self.policy is None:
            return None
        return required_adopters(self.baseline, self.policy.adoption_threshold_percent)

    @property
    def expiry_at(self) -> datetime | None:
        if self.mode is Mode.MONITORING:
            return self.window_ends_at
        if self.mode is Mode.BACKING_OFF:
            return self.backoff_ends_at
        return None

    def last_attempt(self) -> LastAttempt:
        return LastAttempt(self.fingerprint, self.mode, self.last_transition_time)

    def wake(self, sighting: Sighting) -> Verdict:
        """Whether ``sighting``, arriving as this run ends, starts the owner's next run."""
        reopen_enabled = self.policy.enable_monitoring_reopen if self.policy else True
        return wake(self.last_attempt(), sighting, reopen_enabled)

    def reopen_refusal(self, running: bool) -> str | None:
        """Why a ``reopen`` would change nothing (None: it opens a fresh window). A running run
        reopens only a window (``decide``); an ended one wakes by the wake rule, and so does one
        that is ending (a terminal mode, recorded but not yet closed: its run-end rule takes the
        signal to the next run), so a reopen right after a cancel is not refused."""
        if not running or self.mode.terminal:
            verdict = self.wake(Sighting(self.fingerprint, Trigger.REOPEN))
            return None if verdict.wakes else verdict.reason
        if self.mode is not Mode.MONITORING or self.policy is None:
            return f"reopen is ignored in mode {self.mode}"
        if not self.policy.enable_monitoring_reopen:
            return "reopen disabled by the policy (enableMonitoringReopen: false)"
        return None

    def owner_state(self) -> OwnerState:
        """The annotation JSON for this state."""
        assert self.last_transition_time is not None
        return OwnerState(
            mode=self.mode,
            active_recommendation_fingerprint=self.fingerprint,
            turn=self.turn,
            failure_reason=self.failure_reason,
            failure_message=self.failure_message,
            last_successful_state=self.last_successful,
            expiry_at=self.expiry_at,
            policy=self.policy.ref if self.policy else None,
            last_transition_time=self.last_transition_time,
            history=self.history,
            transitions=self.transitions,
            window=self.window_baselines(),
        )

    def window_baselines(self) -> WindowBaselines | None:
        """The running window's baselines (None outside one, or before it has any)."""
        if self.mode is not Mode.MONITORING or self.baseline is None:
            return None
        return WindowBaselines(
            baseline=self.baseline,
            autoscaler=self.autoscaler,
            template=self.template,
            raises_requests=self.raises_requests,
        )


# --- observations ---------------------------------------------------------------------------


@dataclass(frozen=True)
class AttemptStarted:
    now: datetime
    loaded: LoadOwnerResult
    trigger: Trigger = Trigger.OBSERVE
    observed_pod_created_at: datetime | None = None
    adopted_at: datetime | None = None  # when the intake saw the cut adopted (``baseline_at``)


@dataclass(frozen=True)
class Sampled:
    now: datetime
    sample: CohortSample
    # The verdict's health checks (``health_due``), when the policy has some and adoption
    # passed: failing ones roll back; None when none were asked.
    health: HealthResult | None = None


@dataclass(frozen=True)
class SampleFailed:
    """A sample inside the window failed after its retries: an opening one (taken only when
    the baseline is not known yet) is only informative, the final sample decides; an early
    verdict's confirming one is taken again (``_sample_failed``)."""

    now: datetime
    error: str = ""


@dataclass(frozen=True)
class RolledBack:
    now: datetime
    result: ActuationResult


@dataclass(frozen=True)
class Reapplied:
    now: datetime
    result: ActuationResult
    held: bool = False  # a pause (or the kill switch, the breaker) held it before it landed


@dataclass(frozen=True)
class BackoffOver:
    now: datetime
    resolution: ResolvePolicyResult


@dataclass(frozen=True)
class Cancel:
    now: datetime
    reason: str = ""


@dataclass(frozen=True)
class Suspected:
    """The intake saw a pod of the cohort fail for certain: under an early verdict, sample now."""

    now: datetime


@dataclass(frozen=True)
class Reopen:
    now: datetime


@dataclass(frozen=True)
class Aborted:
    """An activity failed for good: a permanent error, or transient ones past the retry budget."""

    now: datetime
    reason: FailureReason
    message: str


@dataclass(frozen=True)
class Observed:
    """The intake saw pods of the owner carrying ``recommendation``."""

    now: datetime
    recommendation: Recommendation
    pod_created_at: datetime | None = None
    adopted_at: datetime | None = None  # when the intake saw it adopted


class Step(StrEnum):
    """The steps a pause may hold: the verdict (decided on what runs), and each write that
    changes what runs (``activities.kubernetes``'s gate)."""

    VERDICT = "verdict"
    ROLLBACK = "rollback"
    BACKOFF_END = "backoff end"  # its record clears the rollback: the applier re-applies the cut
    REAPPLY = "re-apply"
    RECORD = "record"  # a state record that clears a published rollback (read again as it writes)


@dataclass(frozen=True)
class PauseSeen:
    """A step found a pause in force and wrote nothing."""

    now: datetime
    step: Step
    pause: Pause
    resumes: int = 0  # resume signals counted as the step read the pause: one more ends the hold


Observation = (
    AttemptStarted
    | Sampled
    | SampleFailed
    | RolledBack
    | Reapplied
    | BackoffOver
    | Cancel
    | Reopen
    | Observed
    | Aborted
    | PauseSeen
    | Suspected
)


# --- effects --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Record:
    """Write the owner state (``None``: remove it) and emit one Event."""

    event_reason: EventReason | None
    message: str
    warning: bool = False
    clear_rollback_recommendation: bool = False
    remove_state: bool = False
    # Names the Event beside the transition's (one that is not a transition: a release seen).
    identity: str = ""
    # It lets the owner's cut run again (``brings_back``; ``decide`` marks every record): the
    # kill switch, the storm breaker and a pause hold it.
    brings_back: bool = False


@dataclass(frozen=True)
class RollBack:
    """Publish the rollback (``observe_only``: nothing is written; the shell reports it)."""

    target: RollbackTarget
    resources: ResourceSnapshot | None
    observe_only: bool = False


@dataclass(frozen=True)
class Reapply:
    recommendation: Recommendation
    observe_only: bool = False  # nothing was rolled back, so there is nothing to re-apply


@dataclass(frozen=True)
class StartOver:
    """End this run and start monitoring ``recommendation`` in a fresh one (continue-as-new)."""

    recommendation: Recommendation
    adopted_at: datetime | None = None


class HoldEnds(StrEnum):
    """What ends a hold before the time it looks again at (``Hold.until``)."""

    RESUME = "resume"  # the intake saw the pause go (one since the step read it)
    CONTROL = "control"  # any signal: a cancel, a reopen, a new recommendation, taken as ever
    CANCEL = "cancel"  # a cancel: the held step is given up, nothing written, then it is taken


@dataclass(frozen=True)
class Hold:
    """Wait, durably, while ``pause`` holds ``step``: until ``until`` (the pause's time, or
    ``PAUSE_RECHECK``), or what ``ends`` it; then the step is tried again (unless a cancel ended
    it: given up). Changes no state."""

    step: Step
    label: str  # as shown: ``verdict``, ``backedOff record``
    pause: Pause
    until: datetime
    ends: frozenset[HoldEnds]
    after_resumes: int  # a resume counted past this many ends it

    def gives_up(self, cancel_pending: bool) -> bool:
        """Whether the held step is given up: a cancel ended the hold and may end it."""
        return cancel_pending and HoldEnds.CANCEL in self.ends


Effect = Record | RollBack | Reapply | StartOver | Hold

RELEASE_WAIT_MIN = timedelta(minutes=10)  # ``release_wait``: a Deployment's progressDeadline
# A held step looks again at least this often: the intake signals ``resume`` when a pause
# annotation goes, but a term that ended before it could is caught up with here.
PAUSE_RECHECK = timedelta(minutes=10)
_ANY = frozenset({HoldEnds.RESUME, HoldEnds.CONTROL})
_GIVE_UP = frozenset({HoldEnds.RESUME, HoldEnds.CANCEL})
# Every hold ``decide`` makes on a ``PauseSeen``, as (step, the mode it holds, what ends it
# besides its time, what follows): the docs draw them (``cli.docs``) and
# tests/unit/test_machine.py takes each row. A control signal ending a hold is decided as when
# nothing holds (a cancel ends the attempt ``cancelled``, a reopen opens a fresh window). A
# cancel gives up a held actuation or record (nothing written) and is taken on what the owner
# shows: a record's, on the state before the decision that made it.
HOLDS: tuple[tuple[Step, str, frozenset[HoldEnds], str], ...] = (
    (Step.VERDICT, Mode.MONITORING.value, _ANY, "the verdict on a fresh sample"),
    (Step.ROLLBACK, Mode.ROLLING_BACK.value, _GIVE_UP, "the rollback from what the pods show"),
    (Step.BACKOFF_END, Mode.BACKING_OFF.value, _ANY, "the backoff's end, the policy read again"),
    (Step.REAPPLY, Mode.BACKED_OFF.value, _GIVE_UP, "the re-apply from what the pods show"),
    (Step.RECORD, "any", _GIVE_UP, "the same record"),
)
_HOLD_ENDS = {step: ends for step, _, ends, _ in HOLDS}


@dataclass(frozen=True)
class Decision:
    state: RollbackState
    effects: list[Effect] = field(default_factory=list)
    note: str = ""  # why nothing happened, for logs and tests


# --- decide ---------------------------------------------------------------------------------


def initial_state(owner: OwnerRef, recommendation: Recommendation) -> RollbackState:
    return RollbackState(
        owner=owner,
        recommendation=recommendation,
        fingerprint=recommendation.fingerprint,
        mode=Mode.MONITORING,
    )


def news_after_start(
    pending: list[Observation], fingerprint: str, trigger: Trigger
) -> list[Observation]:
    """The signals still news once a run has started: what signal-with-start delivered with the
    start (the ``observe`` of this fingerprint, or the ``reopen`` the trigger already names) and
    further sightings of the same recommendation are not: the start accounted for them."""
    return [
        o
        for o in pending
        if not (isinstance(o, Observed) and o.recommendation.fingerprint == fingerprint)
        and not (isinstance(o, Reopen) and trigger is Trigger.REOPEN)
    ]


def decide(state: RollbackState, obs: Observation) -> Decision:
    """The next state and the effects that get there, each record marked with whether it
    brings the owner's cut back (``brings_back``). Never raises on any observation."""
    return _marked(state, obs, _decide(state, obs))


def _marked(state: RollbackState, obs: Observation, decision: Decision) -> Decision:
    """``decision`` with each record marked by ``brings_back``, the owner before it as this run
    knows it: its stored state on a run's start, else this run's; a rollback published while
    rolling back or backing off. A record that clears a rollback is decided again by the writer
    on the owner as it reads it (it may show one published in another mode: a cancel's)."""
    if not any(isinstance(e, Record) for e in decision.effects):
        return decision
    before: Mode | None = state.mode
    if isinstance(obs, AttemptStarted):
        stored = obs.loaded.state
        before = stored.mode if stored is not None else None
    published = before in (Mode.ROLLING_BACK, Mode.BACKING_OFF)
    effects = [
        replace(
            e,
            brings_back=brings_back(
                before,
                None if e.remove_state else decision.state.mode,
                published=published,
                clears=e.clear_rollback_recommendation,
            ),
        )
        if isinstance(e, Record)
        else e
        for e in decision.effects
    ]
    return replace(decision, effects=effects)


def _decide(state: RollbackState, obs: Observation) -> Decision:
    match obs:
        case AttemptStarted():
            return _start(state, obs)
        case Observed():
            return _observed(state, obs)
        case Cancel():
            return _cancel(state, obs)
        case Reopen():
            return _reopen(state, obs)
        case Sampled():
            return _sampled(state, obs)
        case SampleFailed():
            return _sample_failed(state, obs)
        case RolledBack():
            return _rolled_back(state, obs)
        case Reapplied():
            return _reapplied(state, obs)
        case BackoffOver():
            return _backoff_over(state, obs)
        case Aborted():
            return _aborted(state, obs)
        case PauseSeen():
            return _held(state, obs)
        case Suspected():
            return _suspected(state, obs)


def _held(state: RollbackState, obs: PauseSeen) -> Decision:
    """A step found a pause: hold it (``HOLDS``) until the pause's time (at least a second on,
    so that a clock a little behind the annotator's does not spin), ``PAUSE_RECHECK`` at the
    latest. The state does not change: holding is not a transition."""
    wait = PAUSE_RECHECK
    if obs.pause.until is not None:
        wait = min(wait, max(obs.pause.until - obs.now, timedelta(seconds=1)))
    ends = _HOLD_ENDS[obs.step]
    label = f"{state.mode} record" if obs.step is Step.RECORD else obs.step.value
    hold = Hold(obs.step, label, obs.pause, obs.now + wait, ends, obs.resumes)
    return Decision(state, [hold], note=f"{label} held: {obs.pause.describe()}")


def _transition(
    state: RollbackState,
    now: datetime,
    mode: Mode,
    *,
    failure_reason: FailureReason | None = None,
    failure_message: str | None = None,
    **changes: object,
) -> RollbackState:
    """A new state in ``mode``, with its history entry. Failure fields reset unless given."""
    moved = state.model_copy(
        update={
            "mode": mode,
            "failure_reason": failure_reason,
            "failure_message": failure_message,
            "last_transition_time": now,
            "transitions": state.transitions + 1,
            "early_since": None,
            "early_pods": {},
            **changes,
        }
    )
    entry = HistoryEntry(
        time=now,
        mode=mode,
        turn=moved.turn,
        fingerprint=moved.fingerprint,
        failure_reason=failure_reason,
    )
    return moved.model_copy(update={"history": [*moved.history, entry][-HISTORY_LIMIT:]})


def _abort(
    state: RollbackState, now: datetime, reason: FailureReason, cause: str, message: str
) -> Decision:
    """End the attempt ``aborted``: resources stay as they are (like a cancel), a Warning Event
    says why, and only ``reopen`` or a new recommendation resumes it (``workflows.wake``)."""
    aborted = _transition(state, now, Mode.ABORTED, failure_reason=reason, failure_message=cause)
    return Decision(aborted, [Record(EventReason.ATTEMPT_ABORTED, message, warning=True)])


def _aborted(state: RollbackState, obs: Aborted) -> Decision:
    if state.mode.terminal:
        return Decision(state, note=f"run already ended; ignored: {obs.message}")
    message = (
        f"Attempt on recommendation {state.fingerprint} aborted in mode {state.mode}"
        f" ({obs.reason}): {obs.message}"
    )
    return _abort(state, obs.now, obs.reason, obs.message, message)


def _policy_gone(cleared: RollbackState) -> Decision:
    """No policy matches any more: the state (``cleared``) and any published rollback go."""
    message = "No rollback policy matches this workload any more; rollback state cleared"
    record = Record(
        EventReason.STATE_CLEARED, message, clear_rollback_recommendation=True, remove_state=True
    )
    return Decision(cleared, [record])


def _owner_gone(state: RollbackState) -> Decision:
    """The owner was deleted: the attempt ends, there is nothing left to write to."""
    note = "owner no longer exists"
    return Decision(
        state.model_copy(
            update={
                "mode": Mode.CLEARED,
                "failure_reason": FailureReason.OWNER_GONE,
                "failure_message": note,
            }
        ),
        note=note,
    )


def _noop_end(state: RollbackState, mode: Mode, note: str, **changes: object) -> Decision:
    """The run ends in ``mode`` without a transition: nothing is written, no Event."""
    return Decision(state.model_copy(update={"mode": mode, **changes}), note=note)


# An owner as read when a window opens: the attempt's first read, or a sample's (a release's end).
OwnerRead = LoadOwnerResult | CohortSample


def _window(
    state: RollbackState, now: datetime, policy: PolicySettings, opened: OwnerRead | None = None
) -> dict[str, Any]:
    """A window opening now, with the baselines of the owner as ``opened`` read it: sampled
    when it opens only if the baseline is not known yet (the sample reads them then)."""
    ends = now + policy.monitoring_period
    baseline = opened.desired if opened is not None else None
    known = baseline is not None
    return {
        "policy": policy,
        "window_started_at": now,
        "window_ends_at": ends,
        "next_sample_at": ends if known else now,
        "backoff_ends_at": None,
        "baseline": baseline if known else None,
        "last_sample": None,
        "last_health": None,
        "template": opened.template if known and opened is not None else None,
        "autoscaler": opened.autoscaler if known and opened is not None else None,
        "raises_requests": opened.raises_requests if known and opened is not None else None,
        "release": None,
        "release_looks": 0,
        "release_since": None,
    }


def _monitoring_message(state: RollbackState, policy: PolicySettings, how: str) -> str:
    return (
        f"{how} recommendation {state.fingerprint} (turn {state.turn}) for"
        f" {format_duration(policy.monitoring_period)} under {policy.ref}; success needs"
        f" {policy.adoption_threshold_percent}% of the cohort adopted and healthy"
    )


_HOW = {
    Wake.NEW: "Monitoring",
    Wake.NEXT_TURN: "Re-monitoring",
    Wake.REOPEN: "Reopened monitoring of",
    Wake.RESUME: "Resumed monitoring of",
    Wake.RETRY: "Retrying (after failedPermanent)",
}


def _start(state: RollbackState, obs: AttemptStarted) -> Decision:
    loaded = obs.loaded
    if not loaded.exists:
        return _owner_gone(state)
    stored = loaded.state
    if loaded.policy is None:
        if stored is None:
            return _noop_end(state, Mode.CLEARED, "no policy matches: retained, not monitored")
        return _policy_gone(_transition(state, obs.now, Mode.CLEARED, history=stored.history))
    policy = loaded.policy
    carried: dict[str, object] = {"policy": policy}
    if obs.adopted_at is not None:
        carried["adopted_at"] = obs.adopted_at
    if stored is not None:
        carried.update(last_successful=stored.last_successful_state, history=stored.history)
    state = state.model_copy(update=carried)
    sighting = Sighting(state.fingerprint, obs.trigger, obs.observed_pod_created_at)
    verdict = wake(LastAttempt.stored(stored), sighting, policy.enable_monitoring_reopen)
    turn = verdict.turn(stored.turn if stored is not None else None)
    if not verdict.wakes:
        assert stored is not None
        kept = {
            "turn": turn,
            "failure_reason": stored.failure_reason,
            "failure_message": stored.failure_message,
        }
        return _noop_end(state, stored.mode, verdict.reason, **kept)
    how = _HOW[verdict.wake]
    state = state.model_copy(update={"turn": turn})
    window = stored.window if stored is not None and verdict.wake is Wake.RESUME else None
    if window is not None:  # a window resumed: it opens with the baselines it first opened with
        loaded = loaded.model_copy(
            update={"desired": window.baseline, "autoscaler": window.autoscaler,
                    "template": window.template, "raises_requests": window.raises_requests}
        )  # fmt: skip
    started = _transition(
        state,
        obs.now,
        Mode.MONITORING,
        turn=turn,
        **_window(state, obs.now, policy, loaded),
    )
    message = _monitoring_message(started, policy, how)
    if loaded.state_error:
        message += (
            f" (the previous rollback state was unreadable and was replaced: {loaded.state_error})"
        )
    effects: list[Effect] = [
        Record(EventReason.MONITORING_STARTED, message, warning=bool(loaded.state_error))
    ]
    if verdict.wake is Wake.RETRY:  # the pods were rolled back: the recommendation goes again
        effects.append(Reapply(started.recommendation, observe_only=policy.observe_only))
    return Decision(started, effects)


def _observed(state: RollbackState, obs: Observed) -> Decision:
    if state.mode.terminal:
        return Decision(state, note="run is ending")
    if obs.recommendation.fingerprint == state.fingerprint:
        return Decision(state, note="same recommendation: new pods join the current window")
    superseded = _transition(
        state, obs.now, Mode.SUPERSEDED, window_ends_at=None, backoff_ends_at=None
    )
    message = (
        f"Recommendation {state.fingerprint} superseded by {obs.recommendation.fingerprint};"
        " monitoring restarts for the new recommendation"
    )
    return Decision(
        superseded,
        [
            Record(None, message, clear_rollback_recommendation=True),
            StartOver(obs.recommendation, obs.adopted_at),
        ],
    )


def control_refusal(state: RollbackState, control: Cancel | Reopen) -> str | None:
    """The one judge of a control sent to a running run, by signal or by Update (the Update's
    caller gets this text): why it would change nothing, None when it is taken."""
    if isinstance(control, Cancel):
        if not state.mode.terminal:
            return None
        return f"no attempt is running for {state.owner} ({state.mode}): nothing to cancel"
    refusal = state.reopen_refusal(running=True)
    if refusal is None:
        return None
    return f"{state.owner} cannot be reopened ({state.mode}): {refusal}"


def _cancel(state: RollbackState, obs: Cancel) -> Decision:
    if (refusal := control_refusal(state, obs)) is not None:
        return Decision(state, note=refusal)
    message = f"Monitoring of recommendation {state.fingerprint} cancelled in mode {state.mode}"
    if obs.reason:
        message += f": {obs.reason}"
    cancelled = _transition(state, obs.now, Mode.CANCELLED, failure_message=obs.reason or None)
    return Decision(cancelled, [Record(EventReason.MONITORING_CANCELLED, message)])


def _reopen(state: RollbackState, obs: Reopen) -> Decision:
    refusal, policy = control_refusal(state, obs), state.policy
    if refusal is not None or policy is None:
        return Decision(state, note=refusal or "no policy")
    reopened = _transition(state, obs.now, Mode.MONITORING, **_window(state, obs.now, policy))
    message = _monitoring_message(reopened, policy, "Reopened monitoring of")
    return Decision(reopened, [Record(EventReason.MONITORING_STARTED, message)])


def _sampled(state: RollbackState, obs: Sampled) -> Decision:
    sample, policy, window_ends_at = obs.sample, state.policy, state.window_ends_at
    if state.mode is not Mode.MONITORING or policy is None or window_ends_at is None:
        return Decision(state, note="sample outside a window ignored")
    if not sample.exists:
        return _owner_gone(state)
    if sample.error:
        message = f"Attempt on recommendation {state.fingerprint} ended: {sample.error}"
        return _abort(state, obs.now, FailureReason.MALFORMED_ANNOTATION, sample.error, message)
    final = obs.now >= window_ends_at
    seen = release_seen(state.template, sample.template)
    health = _with_autoscaler(state, policy, sample, obs.health) if final else obs.health
    opening = state.baseline is None and not final  # the window's first look: its baselines
    state = state.model_copy(
        update={
            "baseline": _baseline_of(state, sample),
            "last_sample": sample,
            "last_health": health if health is not None else state.last_health,
            "samples_taken": state.samples_taken + 1,
            "next_sample_at": window_ends_at,  # after the opening sample, the final one
            "template": sample.template if opening else state.template,
            "autoscaler": sample.autoscaler if opening else state.autoscaler,
            "raises_requests": sample.raises_requests if opening else state.raises_requests,
        }
    )
    if seen is not None or state.release is not None:
        return _releasing(state, policy, sample, obs.now, seen)
    if not final:
        return _early(state, policy, sample, obs.now)
    return _evaluate(state, policy, sample, obs.now, health)


def _releasing(
    state: RollbackState,
    policy: PolicySettings,
    sample: CohortSample,
    now: datetime,
    seen: str | None,
) -> Decision:
    """A release during the window (``workflows.neighbours``): the cut is not judged on what
    the release may cause. The verdict waits for it to roll out, looking again after
    ``release_recheck``; then a fresh window of the same turn, the new release its baseline.
    What only the cut can cause (``caused_by_cut``: an OOM kill, ...) is judged at the window's
    end as usual: a release the cut keeps from rolling out (its new pods are admitted with the
    cut too) is never waited for. Nor is one that does not roll out within ``release_wait``:
    then the window's end judges the workload as it is. Each is told once."""
    effects: list[Effect] = []
    if state.release is None:
        assert seen is not None
        state, effects = _release_seen(state, policy, seen, now)
    assert state.window_ends_at is not None
    if now < state.window_ends_at:  # an early verdict's look: the window's end looks again
        return Decision(state, effects, note=f"release seen: {state.release}")
    cut = {
        reason: n
        for reason, n in sample.unhealthy.items()
        if n and caused_by_cut(reason, state.raises_requests, release=True)
    }
    if cut:  # what the release cannot explain: judged now, the release not waited for
        decided = _evaluate(state, policy, sample, now)
        return Decision(decided.state, [*effects, *decided.effects], note="the cut's own failures")
    bound = (state.release_since or now) + release_wait(policy)
    if not sample.rolled_out and now < bound:
        look = min(now + release_recheck(state.release_looks), bound)
        waiting = state.model_copy(
            update={
                "window_ends_at": look,
                "next_sample_at": look,
                "release_looks": state.release_looks + 1,
            }
        )
        return Decision(waiting, effects, note=f"the release is rolling out: {state.release}")
    if not sample.rolled_out:  # the bound decides: judged as it is, and told
        message = (
            f"The release seen during the window of recommendation {state.fingerprint} did not"
            f" roll out within {format_duration(release_wait(policy))} ({state.release}): the"
            " verdict is taken now, on the workload as it is"
        )
        told = Record(EventReason.RELEASE_SEEN, message, warning=True, identity="release-bound")
        decided = _evaluate(state, policy, sample, now)
        return Decision(decided.state, [*effects, told, *decided.effects])
    fresh = _transition(state, now, Mode.MONITORING, **_window(state, now, policy, sample))
    images = sample.template.images if sample.template else {}
    running = ", ".join(f"{name} {image}" for name, image in sorted(images.items()))
    how = (
        f"After a release rolled out (now {running or 'its new template'}): restarted monitoring of"
    )
    message = _monitoring_message(fresh, policy, how)
    return Decision(fresh, [*effects, Record(EventReason.MONITORING_STARTED, message)])


def _release_seen(
    state: RollbackState, policy: PolicySettings, seen: str, now: datetime
) -> tuple[RollbackState, list[Effect]]:
    """A release first seen in the window: kept, and told once."""
    message = (
        f"A release during the window of recommendation {state.fingerprint} (turn"
        f" {state.turn}): {seen}, not by the engine or the applier. The cut is not judged on"
        " what the release may cause: the verdict waits for the release to roll out (at"
        f" most {format_duration(release_wait(policy))}), then a fresh window judges the cut"
        " on it; what only the cut causes (an OOM kill under its limits) is judged as usual"
    )
    update = {"release": seen, "release_since": now, "early_since": None, "early_pods": {}}
    told = Record(EventReason.RELEASE_SEEN, message, identity="release")
    return state.model_copy(update=update), [told]


def release_wait(policy: PolicySettings) -> timedelta:
    """How long a verdict waits for a release to roll out, from when it was seen: a monitoring
    period, 10 minutes at least (a rollout's own progress deadline is 10 minutes by default)."""
    return max(policy.monitoring_period, RELEASE_WAIT_MIN)


def _suspected(state: RollbackState, obs: Suspected) -> Decision:
    """A certain failure seen by the intake: sample now, under a policy with an early verdict,
    unless a confirmation's first period is still running (its sample is due at its end)."""
    policy, due = state.policy, state.next_sample_at
    if state.mode is not Mode.MONITORING or policy is None or policy.early_verdict is None:
        return Decision(state, note="no early verdict in this mode or policy: ignored")
    if state.release is not None:
        return Decision(state, note="a release is rolling out: the window's end looks")
    if due is None or due <= obs.now:
        return Decision(state, note="a sample is due already")
    early = policy.early_verdict
    if state.early_since is not None and obs.now < state.early_since + early.confirmation_period:
        return Decision(state, note="the confirmation's sample is due at its end")
    # A pod failed for certain again (a crash loop's next restart): look now, not at the next
    # period (``_early``: a crash is confirmed once its next restart failed too).
    return Decision(state.model_copy(update={"next_sample_at": obs.now}), note="sample now")


def _early(
    state: RollbackState, policy: PolicySettings, sample: CohortSample, now: datetime
) -> Decision:
    """A sample inside the window, under a policy with an early verdict. The pods failing for
    certain by a cause the cut can have (``caused_by_cut``), when they lose the window
    (``early_failure``), are looked at again ``confirmationPeriod`` later: those still failing
    then, each ``confirmed`` (a crash once the kubelet's next restart failed too), decide the
    window now if they alone still lose it, as its end would decide on the same sample. Until
    then it looks again each confirmation period; a cohort that recovered waits for the end."""
    early = policy.early_verdict
    cleared = state.model_copy(update={"early_since": None, "early_pods": {}})
    if early is None:
        return Decision(cleared)
    cohort, _ = judged_cohort(state.baseline or 0, sample)
    percent = policy.adoption_threshold_percent
    seen = {
        name: pod
        for name, pod in sample.certain.items()
        if caused_by_cut(pod.reason, state.raises_requests)
    }
    if early_failure(_by_reason(seen), cohort, sample.pods, percent) is None:
        return Decision(cleared)
    since = state.early_since or now
    first = {name: state.early_pods.get(name, pod) for name, pod in seen.items()}  # as first seen
    sure = {n: p for n, p in seen.items() if n in state.early_pods and confirmed(first[n], p)}
    reason = early_failure(_by_reason(sure), cohort, sample.pods, percent)
    if reason is None:
        at = since + early.confirmation_period  # the first confirmation, then each period on
        due = at if now < at else now + early.confirmation_period
        waiting = state.model_copy(
            update={"early_since": since, "early_pods": first, "next_sample_at": due}
        )
        return Decision(waiting, note=f"{len(seen)} pods failing for certain: confirm at {due}")
    required = required_adopters(cohort, percent)
    problem = (
        f"decided early ({len(sure)}/{cohort} pods failing for certain since"
        f" {format_duration(timedelta(seconds=round((now - since).total_seconds())))} ago and"
        f" still, {required} required healthy): {sample.message} on recommendation"
        f" {state.fingerprint}"
    )
    return _failed_verdict(state, policy, now, reason, problem)


def _by_reason(pods: Mapping[str, Certain]) -> Counter[FailureReason]:
    return Counter(pod.reason for pod in pods.values())


def health_due(state: RollbackState, sample: CohortSample, now: datetime) -> bool:
    """Whether this sample is a verdict that passes adoption, and the autoscaler check where
    there is one, under a policy with checks that ask Prometheus: then Prometheus is asked
    before the verdict is decided (only then: a verdict that fails rolls back whatever
    Prometheus says; a release's verdict waits)."""
    policy, ends = state.policy, state.window_ends_at
    checks = policy.health_checks if policy is not None else None
    if policy is None or checks is None or not checks.prometheus or ends is None or now < ends:
        return False
    if state.mode is not Mode.MONITORING or not sample.exists or sample.error:
        return False
    if state.release is not None or release_seen(state.template, sample.template) is not None:
        return False
    scaled = _with_autoscaler(state, policy, sample, None)
    if scaled is not None and scaled.failed() is not None:
        return False
    cohort, _ = judged_cohort(_baseline_of(state, sample), sample)
    return sample.adopted_healthy >= required_adopters(cohort, policy.adoption_threshold_percent)


def _with_autoscaler(
    state: RollbackState,
    policy: PolicySettings,
    sample: CohortSample,
    health: HealthResult | None,
) -> HealthResult | None:
    """The verdict's health with the autoscaler check's result first, where the policy has it
    (it needs no Prometheus: judged here, from the readings at the window's open and end)."""
    checks = policy.health_checks
    if checks is None or checks.autoscaler is None:
        return health
    scaled = autoscaler_check(checks.autoscaler, state.autoscaler, sample.autoscaler)
    health = health or HealthResult()
    return health.model_copy(update={"checks": [scaled, *health.checks]})


def baseline_at(state: RollbackState) -> datetime | None:
    """Where a relative health bound's baseline ends (the activity takes one scrape interval
    more off it): before the cut, when the intake saw it adopted (``adopted_at``), or at the
    start of this turn's first window if that was earlier. A window opens after the adoption
    (signal-with-start, the run's first read: seconds, more under load), and a reopened one (in
    this run or after a success) under the cut already, so the turn's earliest ``monitoring``
    of this fingerprint in the history counts too; a turn whose first window has left the
    short history falls back to this window's start."""
    start = state.window_started_at
    for entry in reversed(state.history):
        if entry.fingerprint != state.fingerprint or entry.turn != state.turn:
            break
        if entry.mode is Mode.MONITORING and (start is None or entry.time < start):
            start = entry.time
    if state.adopted_at is not None and (start is None or state.adopted_at < start):
        start = state.adopted_at
    return start


def health_unavailable(
    checks: HealthChecks, why: str, configured: bool, window_ends_at: datetime, now: datetime
) -> HealthResult | None:
    """What a verdict does when its health checks could not be asked, after their retries: a
    result it takes (which fails it only under ``onPrometheusError: fail``), or None: hold, and
    ask again. A hold is bounded: ``maxHold`` from the window's end, and none at all without a
    Prometheus to ask (a URL comes only with a restart); then the verdict is taken on adoption
    alone, and says so."""
    choice = checks.on_prometheus_error
    if choice != "hold":
        return HealthResult(unavailable=why, fallback=f"onPrometheusError: {choice}")
    if not configured:
        return HealthResult(
            unavailable=why,
            fallback="no hold without a Prometheus to ask: decided on adoption alone",
        )
    if now >= window_ends_at + checks.max_hold:
        held = format_duration(checks.max_hold)
        return HealthResult(
            unavailable=why, fallback=f"held {held} (maxHold): decided on adoption alone"
        )
    return None


# A verdict held for Prometheus asks again this often (or as often as its window is long, when
# shorter), up to its maxHold (docs/concepts/health-checks.md).
HEALTH_RECHECK = timedelta(minutes=1)


@dataclass(frozen=True)
class HealthHold:
    """The verdict waits for Prometheus (``onPrometheusError: hold``): ask again after
    ``recheck``; ``message`` is the Warning Event's."""

    recheck: timedelta
    message: str


def health_hold(state: RollbackState, why: str, now: datetime) -> HealthHold:
    """How long a verdict that ``health_unavailable`` holds waits before it asks again (within
    its window's length and its ``maxHold``), and what it says."""
    policy = state.policy
    assert policy is not None and policy.health_checks is not None
    assert state.window_ends_at is not None
    checks = policy.health_checks
    message = (
        f"Health checks of recommendation {state.fingerprint} not judged: {why};"
        f" the verdict waits (onPrometheusError: hold) and asks again in"
    )
    until = state.window_ends_at + checks.max_hold
    left = max(until - now, timedelta(seconds=1))
    recheck = min(HEALTH_RECHECK, policy.monitoring_period, left)
    return HealthHold(
        recheck,
        f"{message} {format_duration(recheck)}, until {until.isoformat(timespec='seconds')} at"
        f" most (maxHold {format_duration(checks.max_hold)}); then it is decided on adoption"
        " alone",
    )


def _sample_failed(state: RollbackState, obs: SampleFailed) -> Decision:
    """Skip a failed opening sample (the baseline not known yet): the final one decides (and
    sets the baseline this one was to). Under an early verdict, a failed sample that a certain
    failure asked for, or its confirmation, is taken again a confirmation period later, the
    confirmation (if any) still under way: nothing else would (the intake tells a certain
    failure once, when the pod's status changes), so skipping it would leave the window to its
    end."""
    policy, ends = state.policy, state.window_ends_at
    if state.mode is not Mode.MONITORING or policy is None or ends is None:
        return Decision(state, note="sample failure outside a window ignored")
    # A known baseline: not the opening sample (a confirmation's implies one too).
    if state.baseline is not None and policy.early_verdict is not None:
        again = min(obs.now + policy.early_verdict.confirmation_period, ends)
        what = "confirming" if state.early_since is not None else "a certain failure's"
        note = f"{what} sample failed, taken again at {again.isoformat()}: {obs.error}"
        return Decision(state.model_copy(update={"next_sample_at": again}), note=note)
    later = state.model_copy(update={"next_sample_at": ends})
    return Decision(later, note=f"opening sample failed, skipped: {obs.error}")


def _baseline_of(state: RollbackState, sample: CohortSample) -> int:
    """The window's baseline: the one set when it opened, else this sample's."""
    return state.baseline if state.baseline is not None else _baseline(sample)


def _baseline(sample: CohortSample) -> int:
    """The cohort size an attempt is judged against: desired replicas, else the pods seen."""
    return sample.desired if sample.desired is not None else sample.pods


def _evaluate(
    state: RollbackState,
    policy: PolicySettings,
    sample: CohortSample,
    now: datetime,
    health: HealthResult | None = None,
) -> Decision:
    assert state.baseline is not None
    cohort, scaled_in = judged_cohort(state.baseline, sample)
    required = required_adopters(cohort, policy.adoption_threshold_percent)
    tally = (
        f"{sample.adopted_healthy}/{cohort} pods adopted and healthy, {required} required"
        f"{scaled_in}"
    )
    unhealthy = _unhealthy(health, policy)
    if unhealthy is not None:  # adopted, but what kills nothing hurts: roll back
        tally = f"{tally}; {unhealthy[1]}"
    elif health is not None:
        tally = f"{tally}; {_health_text(health)}"
    if unhealthy is None and sample.adopted_healthy >= required:
        succeeded = _transition(
            state,
            now,
            Mode.MONITORING_SUCCEEDED,
            last_successful=_merge(state.last_successful, state.recommendation),
        )
        message = f"Recommendation {state.fingerprint} succeeded (turn {state.turn}): {tally}"
        return Decision(
            succeeded,
            [Record(EventReason.MONITORING_SUCCEEDED, message, clear_rollback_recommendation=True)],
        )
    reason = (
        unhealthy[0]
        if unhealthy is not None
        else dominant_reason(sample.unhealthy) or FailureReason.ADOPTION_THRESHOLD_NOT_MET
    )
    problem = (
        f"{sample.message} on recommendation {state.fingerprint} ({tally})"
        if sample.message
        else f"{tally} on recommendation {state.fingerprint}"
    )
    return _failed_verdict(state, policy, now, reason, problem)


def _failed_verdict(
    state: RollbackState,
    policy: PolicySettings,
    now: datetime,
    reason: FailureReason,
    problem: str,
) -> Decision:
    """A window that failed for ``reason``: roll back to the policy's target, or fail
    permanently when that target is ``lastSuccessful`` and none was ever recorded."""
    if policy.rollback_target is RollbackTarget.LAST_SUCCESSFUL and state.last_successful is None:
        message = (
            f"{problem}; rollbackTarget lastSuccessful but no successful state was ever recorded"
            " for this workload: failed permanently"
        )
        failed = _transition(
            state,
            now,
            Mode.FAILED_PERMANENT,
            failure_reason=FailureReason.ROLLBACK_RECOMMENDATION_UNAVAILABLE,
            failure_message=message,
        )
        return Decision(
            failed,
            [
                Record(
                    EventReason.RECOMMENDATION_UNAVAILABLE,
                    message,
                    warning=True,
                    clear_rollback_recommendation=True,
                )
            ],
        )
    resources = (
        state.last_successful if policy.rollback_target is RollbackTarget.LAST_SUCCESSFUL else None
    )
    restore = f"{policy.rollback_target}" + (f" ({resources.describe()})" if resources else "")
    action = (
        f"observe-only policy: would roll back to {restore}; nothing written"
        if policy.observe_only
        else f"restoring {restore}"
    )
    message = f"{problem}; {action}"
    rolling = _transition(
        state,
        now,
        Mode.ROLLING_BACK,
        failure_reason=reason,
        failure_message=message,
        problem=problem,
        restore=restore,
    )
    return Decision(
        rolling,
        [
            Record(EventReason.ROLLING_BACK_STARTED, message, warning=True),
            RollBack(policy.rollback_target, resources, observe_only=policy.observe_only),
        ],
    )


def _unhealthy(
    health: HealthResult | None, policy: PolicySettings
) -> tuple[FailureReason, str] | None:
    """The failure a verdict's health checks make of it: the first failing check's, or
    Prometheus's unavailability under ``onPrometheusError: fail``."""
    if health is None:
        return None
    if health.unavailable is not None:
        checks = policy.health_checks
        if checks is not None and checks.on_prometheus_error == "fail":
            return FailureReason.HEALTH_CHECK_FAILED, f"health checks failed: {health.unavailable}"
        return None
    failed = health.failed()
    return (
        (failed.reason, f"health check {failed.name} failed: {failed.message}") if failed else None
    )


def _health_text(health: HealthResult) -> str:
    if health.unavailable is not None:
        fallback = health.fallback or "onPrometheusError: pass"
        return f"health checks not judged ({health.unavailable}); {fallback}"
    return "health checks passed: " + "; ".join(c.message for c in health.checks)


def _merge(previous: ResourceSnapshot | None, rec: Recommendation) -> ResourceSnapshot:
    """Last successful resources: the previous record updated with what just succeeded."""
    requests = previous.requests() if previous else {}
    limits = previous.limits() if previous else {}
    for target, values in ((requests, rec.requests), (limits, rec.limits)):
        for container, resources in values.items():
            target.setdefault(container, {}).update(resources)
    return ResourceSnapshot.of(requests, limits)


def _rolled_back(state: RollbackState, obs: RolledBack) -> Decision:
    if state.mode is not Mode.ROLLING_BACK or state.policy is None:
        return Decision(state, note="rollback result outside rollingBack ignored")
    if not obs.result.exists:
        return _owner_gone(state)
    wait = backoff_wait(state.policy.backoff, state.turn)
    backing_off = _transition(
        state,
        obs.now,
        Mode.BACKING_OFF,
        failure_reason=state.failure_reason,
        failure_message=_rolled_back_message(state, state.policy),
        backoff_ends_at=obs.now + wait,
        window_ends_at=None,
    )
    done = "Would have rolled back" if state.policy.observe_only else "Rolled back"
    message = f"{done} ({obs.result.message or 'applied'}); backing off {format_duration(wait)}"
    return Decision(backing_off, [Record(None, message)])


def _rolled_back_message(state: RollbackState, policy: PolicySettings) -> str | None:
    """A turn's failure once its rollback is done: what failed, and what was restored."""
    if state.problem is None:  # a run from before the problem was kept apart
        return state.failure_message
    done = "would have rolled back to" if policy.observe_only else "rolled back to"
    return f"{state.problem}; {done} {state.restore}"


def _reapplied(state: RollbackState, obs: Reapplied) -> Decision:
    """The recommendation is back: for the next turn (the run has already ended backedOff), or
    for a retry's window (after ``failedPermanent``). A retry's re-apply that a pause held
    opens its window again when it lands, on the baselines it opened with: the cut lands only
    now, and what the pods did before (the kills that failed the last turn) is not evidence."""
    if not obs.result.exists:
        return Decision(state, note="owner gone before the recommendation was re-applied")
    policy = state.policy
    if state.mode is not Mode.MONITORING or policy is None or not obs.held:
        return Decision(state, note=f"re-applied: {obs.result.message}")
    opened = LoadOwnerResult(
        exists=True, desired=state.baseline, template=state.template,
        autoscaler=state.autoscaler, raises_requests=state.raises_requests,
    )  # fmt: skip
    fresh = _transition(state, obs.now, Mode.MONITORING, **_window(state, obs.now, policy, opened))
    message = _monitoring_message(fresh, policy, "Re-applied, then monitoring")
    return Decision(fresh, [Record(EventReason.MONITORING_STARTED, message)])


def last_turn(turn: int, policy: PolicySettings) -> bool:
    """Whether the backoff after ``turn`` is the last: it ends ``failedPermanent``, re-applying
    nothing (else ``backedOff``, the cut re-applied)."""
    return turn >= policy.backoff.max_attempts


def backoff_end(turn: int, policy: PolicySettings | None) -> Mode:
    """What the end of turn ``turn``'s backoff goes to under ``policy`` (read afresh): cleared
    when none matches any more, ``failedPermanent`` after the last turn, else ``backedOff``."""
    if policy is None:
        return Mode.CLEARED
    return Mode.FAILED_PERMANENT if last_turn(turn, policy) else Mode.BACKED_OFF


# --- what brings a cut back: the one rule the kill switch, the breaker and the pauses hold by --


def holds_cut_off(mode: Mode | None, published: bool) -> bool:
    """Whether an owner keeps its cut from running: a rollback recommendation is published on
    it (the applier applies that instead), or its state is ``failedPermanent`` (the applier
    applies that recommendation no more). No state (``None``, ``cleared``) keeps nothing off."""
    return published or mode is Mode.FAILED_PERMANENT


def brings_back(before: Mode | None, after: Mode | None, *, published: bool, clears: bool) -> bool:
    """Whether a write that takes an owner from ``before`` (a rollback ``published`` on it or
    not) to ``after`` (``None``: its state removed; ``clears``: the write removes that rollback)
    lets its cut run again: it kept the cut off before and keeps it off no more. Such a write is
    held by a pause, the kill switch and a tripped storm breaker, whichever path writes it (the
    README's status and control page, "What brings a cut back", is this rule's table):

    >>> brings_back(Mode.BACKING_OFF, Mode.BACKED_OFF, published=True, clears=True)
    True
    >>> brings_back(Mode.BACKING_OFF, None, published=True, clears=True)  # policy gone: cleared
    True
    >>> brings_back(Mode.BACKING_OFF, Mode.FAILED_PERMANENT, published=True, clears=True)
    False
    >>> brings_back(Mode.FAILED_PERMANENT, Mode.MONITORING, published=False, clears=False)
    True
    """
    return holds_cut_off(before, published) and not holds_cut_off(after, published and not clears)


def may_bring_back(mode: Mode) -> bool:
    """Whether a run whose owner shows ``mode`` may next write what brings its cut back (what a
    lifted kill switch or breaker resumes first, from the watch): a backoff's end, which clears
    ``backingOff``'s published rollback, or the re-apply after it (``backedOff``). A held retry
    after ``failedPermanent`` (its run ended; a reopen's new run is held) is resumed from
    Temporal's listing of held runs."""
    return mode in (Mode.BACKING_OFF, Mode.BACKED_OFF)


def _backoff_over(state: RollbackState, obs: BackoffOver) -> Decision:
    if state.mode is not Mode.BACKING_OFF:
        return Decision(state, note="backoff end outside backingOff ignored")
    resolution = obs.resolution
    if not resolution.exists:
        return _owner_gone(state)
    policy = resolution.policy
    end = backoff_end(state.turn, policy)
    if policy is None:
        return _policy_gone(_transition(state, obs.now, end, backoff_ends_at=None))
    turns = policy.backoff.max_attempts
    last = end is Mode.FAILED_PERMANENT
    # The policy read afresh; the rolled-back turn's reason stays; its rollback is cleared.
    after = _transition(
        state,
        obs.now,
        end,
        failure_reason=state.failure_reason,
        failure_message=_rolled_back_message(state, policy),
        policy=policy,
        backoff_ends_at=None,
    )
    if last:
        message = (
            f"Backoff exhausted after {state.turn} of {turns} turns on recommendation"
            f" {state.fingerprint}: failed permanently"
        )
        exhausted = Record(
            EventReason.BACKOFF_EXHAUSTED, message, warning=True, clear_rollback_recommendation=True
        )
        return Decision(after, [exhausted])
    message = (
        f"Backoff turn {state.turn} of {turns} completed; recommendation {state.fingerprint} is"
        f" re-applied and monitored again as turn {state.turn + 1}"
    )
    return Decision(
        after,
        [
            Record(EventReason.BACKOFF_TURN_COMPLETED, message, clear_rollback_recommendation=True),
            Reapply(state.recommendation, observe_only=policy.observe_only),
        ],
    )
