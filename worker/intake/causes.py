"""What a change means: one pure function per cause the intake reacts to (adoption, a backed-off
turn going on, a pause, a pod failing for certain, a policy event, a control annotation, the
Warning Event a change deserves). The watching side holds what was last seen and hands it here
with the new object; no I/O, no lock, no clock of their own (``now`` is passed), so each is
tested without a cluster (tests/intake/test_causes.py)."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from pydantic import ValidationError

from activities.cohort import (
    actual_resources,
    failing_for_certain,
    health,
    is_ready,
    resize_blocked,
)
from activities.errors import first_line
from activities.kubetime import parse_kube_time
from activities.lookup import read_state
from workflows.activity_api import OwnerRef, PolicySettings
from workflows.contract import (
    CONTROL_ANNOTATION,
    PAUSE_REASON_ANNOTATION,
    PAUSE_UNTIL_ANNOTATION,
    EventReason,
    FailureReason,
    Mode,
    Obj,
)
from workflows.fingerprint import (
    Recommendation,
    is_recommendation_key,
    recommendations_from_annotations,
)
from workflows.machine import may_bring_back
from workflows.pause import Pause, effective_pause
from workflows.policy import POLICY_KINDS, AnyPolicy, field_errors
from workflows.state import OwnerState
from workflows.wake import LastAttempt, Sighting, Trigger, Wake, created_since, wake

PauseSeen = dict[str, str]  # an object's pause annotations, as last seen
Signalled = tuple[str, datetime | None]  # (fingerprint, the stored state's transition time)


# --- adoption ----------------------------------------------------------------------------------


def adopted_recommendation(pod: Obj) -> Recommendation | None:
    """The recommendation this pod runs on, if any (raises on malformed annotations)."""
    annotations = pod["metadata"].get("annotations") or {}
    if not any(is_recommendation_key(k) for k in annotations):
        return None
    recs = recommendations_from_annotations(annotations)
    if not recs:
        return None
    requests, limits = actual_resources(pod)
    return next((r for r in recs if r.equals_resources(requests, limits)), None)


@dataclass
class Sighted:
    """A pod seen adopting a recommendation: what the intake signals to its owner's run."""

    owner: OwnerRef
    recommendation: Recommendation
    pod: str
    pod_created_at: datetime | None
    adopted_at: datetime | None = None  # the watch's event, else the pod's creation: at latest
    turn: int | None = None  # with ``policy``: the attempt it opens, once decided, for its start
    policy: PolicySettings | None = None

    @classmethod
    def of(cls, owner: OwnerRef, rec: Recommendation, pod: Obj, seen: datetime | None) -> Sighted:
        created = parse_kube_time(pod["metadata"].get("creationTimestamp"))
        return cls(owner, rec, pod["metadata"]["name"], created, seen or created)


@dataclass(frozen=True)
class Adoption:
    """What a pod runs: the fingerprint, and its sighting if its owner was known."""

    fingerprint: str
    seen: Sighted | None


def by_pod_creation(seen: Sighted) -> datetime:
    """What orders sightings by their pod's creation, newest last (an unknown one oldest)."""
    return seen.pod_created_at or datetime.min.replace(tzinfo=UTC)


@dataclass(frozen=True)
class AdoptionVerdict:
    """``signal``: the sighting to deliver, with its turn and policy (None: nothing to send);
    ``why``: the intake's stat it counts under; ``basis``: what it was signalled on."""

    why: str
    signal: Sighted | None = None
    basis: Signalled | None = None


def adoption(
    seen: Sighted, state: OwnerState | None, policy: AnyPolicy | None, last: Signalled | None
) -> AdoptionVerdict:
    """Whether ``seen`` is signalled, given the owner's stored ``state``, the ``policy`` that
    matches it and what was ``last`` signalled for it: not without a policy (retained), not
    what the run itself would ignore (``workflows.wake``), not twice on the same grounds."""
    if policy is None:
        return AdoptionVerdict("retained")
    fingerprint = seen.recommendation.fingerprint
    verdict = wake(
        LastAttempt.stored(state),
        Sighting(fingerprint, Trigger.OBSERVE, seen.pod_created_at),
        policy.spec.enable_monitoring_reopen,
    )
    if not verdict.wakes:
        return AdoptionVerdict("already_settled")
    basis = (fingerprint, state.last_transition_time if state else None)
    if (
        last is not None
        and last[0] == fingerprint
        and (verdict.wake is Wake.RESUME or last == basis)
    ):
        return AdoptionVerdict("deduplicated")  # same grounds, or the attempt it woke runs
    turn = verdict.turn(state.turn if state else None)
    signal = replace(seen, turn=turn, policy=PolicySettings.of(policy))
    return AdoptionVerdict("signals", signal, basis)


def going_on(owner: Obj, adopters: Iterable[Sighted]) -> Sighted | None:
    """An adoption the owner's new state makes news of (``adoption`` judges it): the newest pod
    on the recommendation of a turn that ended ``backedOff`` (pods that never left it adopt
    nothing new when the re-apply clears the rollback), or of one that ended before the pod was
    created (a replacement seen while the state still said ``monitoring``: it reopens the turn,
    as the wake rule says)."""
    state, _ = read_state(owner)
    if state is None:
        return None
    fingerprint = state.active_recommendation_fingerprint
    running = [s for s in adopters if s.recommendation.fingerprint == fingerprint]
    if state.mode is not Mode.BACKED_OFF:
        ended = state.last_transition_time if state.mode.terminal else None
        running = [s for s in running if created_since(s.pod_created_at, ended)]
    return max(running, key=by_pod_creation) if running else None


def might_fail(pod: Obj) -> bool:
    """Whether ``pod`` may fail for certain (not Ready, or a resize Infeasible): the cheap test
    of every pod event, before its owner is looked up."""
    return not is_ready(pod) or resize_blocked(pod) is FailureReason.RESIZE_INFEASIBLE


def suspect(pod: Obj, owner: Obj, policy: AnyPolicy | None) -> bool:
    """Whether ``pod`` fails for certain now (the run's sample's rule) while its owner's window
    runs under an early verdict: its run is told to sample (``machine.Suspected``)."""
    if not might_fail(pod) or policy is None or policy.spec.early_verdict is None:
        return False
    state, _ = read_state(owner)
    if state is None or state.mode is not Mode.MONITORING or state.last_transition_time is None:
        return False
    reason = health(pod, state.last_transition_time)[0] or resize_blocked(pod)
    return failing_for_certain(pod, reason)


def active(owner: Obj) -> bool:
    """Whether the owner's stored state is in an active mode (a run may be held)."""
    state, _ = read_state(owner)
    return state is not None and not state.mode.terminal


def bringing_back(owner: Obj) -> bool:
    """Whether its run may bring its cut back next (``machine.may_bring_back``)."""
    return (state := read_state(owner)[0]) is not None and may_bring_back(state.mode)


# --- pauses ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PauseChange:
    now: PauseSeen | None  # what the object carries now (None: no pause)
    changed: bool  # the policies' WorkloadsPaused condition is to be recomputed
    lifted: bool  # a pause went or changed: the runs it may hold look again


def pause_change(before: PauseSeen | None, event: str, obj: Obj) -> PauseChange:
    annotations = obj["metadata"].get("annotations") or {}
    now = None
    if event != "DELETED" and PAUSE_UNTIL_ANNOTATION in annotations:
        keys = (PAUSE_UNTIL_ANNOTATION, PAUSE_REASON_ANNOTATION)
        now = {k: annotations[k] for k in keys if k in annotations}
    return PauseChange(now, before != now, before is not None and before != now)


def held(
    owner: OwnerRef,
    on_owner: Mapping[str, str] | None,
    on_namespace: Mapping[str, str] | None,
    on_pods: Iterable[tuple[str, Mapping[str, str] | None]],
    now: datetime,
) -> bool:
    """Whether a pause holds the owner: on a pod of it, on it, or on its namespace
    (``workflows.pause``; its other pods, which carry none, inherit)."""
    pods = [*on_pods, ("the others", None)]
    pause = effective_pause(pods, (str(owner), on_owner), (owner.namespace, on_namespace), now)
    return pause is not None


# --- policies ----------------------------------------------------------------------------------


class PolicyAction(enum.Enum):
    GONE = "gone"  # deleted: out of the index
    SEEN = "seen"  # its status alone changed (ours): nothing to validate or report again
    VALID = "valid"  # into the index
    INVALID = "invalid"  # out of the index, reported


@dataclass(frozen=True)
class PolicyChange:
    action: PolicyAction
    handled: tuple[object, ...]  # spec and annotations as handled, to tell SEEN next time
    policy: AnyPolicy | None = None
    error: str = ""


def policy_change(event: str, obj: Obj, before: tuple[object, ...] | None) -> PolicyChange:
    meta = obj["metadata"]
    handled = (meta.get("uid"), meta.get("generation"), meta.get("annotations"))
    if event == "DELETED":
        return PolicyChange(PolicyAction.GONE, handled)
    if before == handled:
        return PolicyChange(PolicyAction.SEEN, handled)
    try:
        policy = POLICY_KINDS[obj.get("kind", "")].model_validate(obj)
    except ValidationError as exc:
        return PolicyChange(PolicyAction.INVALID, handled, error=field_errors(exc))
    except Exception as exc:  # KeyError, or worse: this policy only
        return PolicyChange(PolicyAction.INVALID, handled, error=first_line(exc))
    return PolicyChange(PolicyAction.VALID, handled, policy)


# --- Warning Events ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Notice:
    """A Warning Event on an object, named after ``identity``: emitted once per cause."""

    identity: str
    reason: EventReason
    message: str

    @classmethod
    def invalid_policy(cls, obj: Obj, error: str) -> Notice:
        meta = obj["metadata"]
        return cls(
            f"{meta.get('uid')}/{meta.get('generation')}/invalid", EventReason.POLICY_INVALID,
            f"policy ignored, it matches no workload until fixed: {error}",
        )  # fmt: skip

    @classmethod
    def withheld(cls, seen: Sighted, off: Pause) -> Notice:
        fingerprint = seen.recommendation.fingerprint
        return cls(
            f"{seen.owner}/{fingerprint}/withheld", EventReason.PAUSED,
            f"adoption of {fingerprint} (pod {seen.pod}) withheld, no attempt started:"
            f" {off.describe()}; it starts once automation is on again",
        )  # fmt: skip

    @classmethod
    def malformed(cls, pod: Obj, exc: Exception) -> Notice:
        return cls(
            f"{pod['metadata'].get('uid')}{exc}", EventReason.RECOMMENDATION_MALFORMED,
            f"malformed recommendation annotation, this pod left out: {exc}",
        )  # fmt: skip

    @classmethod
    def skipped(cls, obj: Obj, exc: Exception) -> Notice:
        meta = obj.get("metadata") or {}
        return cls(
            f"{meta.get('uid')}/{meta.get('resourceVersion')}/unhandled",
            EventReason.OBJECT_SKIPPED,
            f"the rollback intake could not handle this object and skipped it: {first_line(exc)}",
        )

    @classmethod
    def control_refused(cls, obj: Obj, value: str, refusal: str) -> Notice:
        meta = obj["metadata"]
        return cls(
            f"{meta.get('uid')}/{meta.get('resourceVersion')}/control",
            EventReason.CONTROL_REJECTED,
            f"{CONTROL_ANNOTATION}: {value} changed nothing: {refusal}",
        )
