"""The wake rule: does a sighting of a recommendation wake an owner, and how?

One pure function, ``wake``, answers it for everyone who asks (docs/concepts/workflow.md, "The
RollbackWorkflow",
*Runs*):

- the intake (``worker.intake``), before it signals: against the state stored on the owner;
- the workflow, when its run ends with signals still pending: against the run's final state;
- the state machine, when a run starts (``workflows.machine``): against the stored state.

So a sighting the intake would skip is one the workflow would ignore, and the other way round.

The rule, for the same fingerprint as the last attempt (any other fingerprint is a new attempt,
turn 1):

    last mode             observe (pods adopted it)             reopen (someone asked)
    backedOff             next turn (N+1)                       next turn (N+1)
    monitoringSucceeded   reopen, if a pod is newer than the    reopen
                          success and the policy allows it      (if the policy allows it)
    cancelled, aborted    nothing: a cancel (or an error that   reopen
                          ended the attempt) sticks until an    (if the policy allows it)
                          explicit reopen or a new
                          recommendation, even for newer pods
    failedPermanent       nothing                               retry: a fresh attempt, turn 1,
                                                                the recommendation re-applied
    cleared               nothing (the state is gone)           nothing
    monitoring, rollingBack, backingOff, superseded
                          resume that attempt                   resume that attempt
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from workflows.contract import Mode
from workflows.state import OwnerState


class Trigger(StrEnum):
    OBSERVE = "observe"  # the intake saw pods carrying the recommendation
    REOPEN = "reopen"  # someone asked for a fresh window on the same fingerprint


class Wake(StrEnum):
    NEW = "new"  # a recommendation with no attempt yet: turn 1
    NEXT_TURN = "nextTurn"  # the turn after backedOff
    REOPEN = "reopen"  # a fresh window for a settled turn
    RETRY = "retry"  # an operator retries a failed recommendation: a fresh attempt, turn 1
    RESUME = "resume"  # an attempt that was still active
    NONE = "none"  # the sighting does not wake the owner


def created_since(pod_created_at: datetime | None, at: datetime | None) -> bool:
    """Whether a pod created at ``pod_created_at`` is newer than a transition at ``at``, at the
    API's precision: ``creationTimestamp`` is whole seconds, rounded down, so a pod created in
    the second of the transition counts (a window cannot have judged it for a whole second; a
    strict comparison would lose a replacement created just after a success)."""
    if pod_created_at is None or at is None:
        return False
    return pod_created_at >= at.replace(microsecond=0)


@dataclass(frozen=True)
class LastAttempt:
    """What the rule needs of the owner's last attempt (stored state or a run's final state)."""

    fingerprint: str
    mode: Mode
    at: datetime | None  # the last transition

    @classmethod
    def stored(cls, state: OwnerState | None) -> LastAttempt | None:
        """The last attempt the owner's state annotation records (None: no state)."""
        if state is None:
            return None
        return cls(state.active_recommendation_fingerprint, state.mode, state.last_transition_time)


@dataclass(frozen=True)
class Sighting:
    fingerprint: str
    trigger: Trigger = Trigger.OBSERVE
    pod_created_at: datetime | None = None


@dataclass(frozen=True)
class Verdict:
    wake: Wake
    reason: str

    @property
    def wakes(self) -> bool:
        return self.wake is not Wake.NONE

    def turn(self, last: int | None) -> int:
        """The turn of the attempt this verdict leads to, after the last attempt's ``last``
        (the one it keeps when it wakes nothing)."""
        if last is None or self.wake in (Wake.NEW, Wake.RETRY):
            return 1
        return last + 1 if self.wake is Wake.NEXT_TURN else last


def wake(last: LastAttempt | None, sighting: Sighting, reopen_enabled: bool) -> Verdict:
    """How ``sighting`` wakes an owner whose last attempt is ``last``; see the module table."""
    if last is None or last.fingerprint != sighting.fingerprint:
        return Verdict(Wake.NEW, "a new recommendation")
    reopen = sighting.trigger is Trigger.REOPEN
    match last.mode:
        case Mode.FAILED_PERMANENT if reopen:
            # An operator's explicit retry (docs/concepts/intake.md, "Retrying a failed
            # workload"), whatever
            # enableMonitoringReopen says: that setting is about pods, not people.
            return Verdict(Wake.RETRY, "retried: a fresh attempt from turn 1")
        case Mode.FAILED_PERMANENT:
            return Verdict(Wake.NONE, "already failed permanently: reopen retries it")
        case Mode.CLEARED:
            return Verdict(Wake.NONE, "the attempt was cleared")
        case Mode.BACKED_OFF:
            return Verdict(Wake.NEXT_TURN, "the next turn after backing off")
        case Mode.CANCELLED | Mode.ABORTED if not reopen:
            return Verdict(Wake.NONE, f"{last.mode}: only reopen or a new recommendation resumes")
        case Mode.MONITORING_SUCCEEDED | Mode.CANCELLED | Mode.ABORTED:
            if not reopen_enabled:
                return Verdict(Wake.NONE, "reopen disabled by the policy")
            if not (reopen or created_since(sighting.pod_created_at, last.at)):
                return Verdict(Wake.NONE, "no newer pod: nothing to reopen")
            return Verdict(Wake.REOPEN, "reopened" if reopen else "a newer pod")
        case _:
            return Verdict(Wake.RESUME, f"resumes the attempt in {last.mode}")
