"""Pauses: Kubex's ``rightsizing.kubex.ai/pause-until``, and whether it holds a workload now.

An operator stops automation during an incident by annotating a namespace, an owner or a pod
with ``rightsizing.kubex.ai/pause-until: infinite`` (or an RFC 3339 time) and, optionally,
``rightsizing.kubex.ai/pause-reason``. The same annotation stops Kubex and this engine.

Which annotation decides, per pod, as Kubex: the pod's own, else its owner's, else its
namespace's (the most specific level that carries the key decides, even when its time has
passed: a pod annotated with a past time is not paused by its namespace). A workload is held
when any pod of its cohort is paused, or, without pods, when its owner (else its namespace) is.
A value that cannot be read holds the workload until it is fixed: an operator meant to stop
something.

The activities read the annotations where they act (the verdict's sample, the rollback, the
re-apply) and return the ``Pause`` they found; the workflow holds on it (``workflows.rollback``,
until the time, or until the intake signals that the annotation went). Pure: no I/O, the time
is given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from enum import StrEnum

from workflows.contract import (
    AUTOMATION_ANNOTATION,
    AUTOMATION_REASON_ANNOTATION,
    PAUSE_REASON_ANNOTATION,
    PAUSE_UNTIL_ANNOTATION,
    STORM_BREAKER_ANNOTATION,
    STORM_BREAKER_REASON_ANNOTATION,
    STORM_BREAKER_RESET_ANNOTATION,
)
from workflows.state import CamelModel

INFINITE = "infinite"


class PauseScope(StrEnum):
    POD = "pod"
    OWNER = "owner"
    NAMESPACE = "namespace"
    # The engine's kill switch (``automation_off``) and its storm breaker (``breaker_tripped``):
    # each holds what brings a cut back only.
    CLUSTER = "cluster"
    BREAKER = "breaker"


class Pause(CamelModel):
    """A pause in force: where it is set, until when (None: until it is removed), and why."""

    scope: PauseScope
    name: str  # the annotated object: a pod's name, ``<ns>/<Kind>/<name>``, a namespace
    until: datetime | None = None
    reason: str | None = None
    problem: str | None = None  # the value could not be read: held until it is fixed

    def describe(self) -> str:
        """``paused by namespace shop until 2026-12-05T10:00:00Z: incident 4711``."""
        why = f": {self.reason}" if self.reason else ""
        if self.scope is PauseScope.BREAKER:
            where = f"{STORM_BREAKER_ANNOTATION} on namespace {self.name}"
            return f"re-applies stopped by the storm breaker ({where}) until it is reset{why}"
        if self.scope is PauseScope.CLUSTER:
            where = f"{AUTOMATION_ANNOTATION} on namespace {self.name}"
            if self.problem is not None:
                return f"automation stopped until {where} is fixed ({self.problem}){why}"
            return f"automation disabled by {where} until it is enabled{why}"
        if self.problem is not None:
            until = f"until its {PAUSE_UNTIL_ANNOTATION} is fixed ({self.problem})"
        elif self.until is None:
            until = "until the annotation is removed"
        else:
            until = f"until {self.until.strftime('%Y-%m-%dT%H:%M:%SZ')}"
        return f"paused by {self.scope} {self.name} {until}{why}"


Annotated = tuple[str, Mapping[str, str] | None]  # (name, annotations) of one object


def said(level: Annotated, scope: PauseScope, now: datetime) -> tuple[bool, Pause | None]:
    """Whether this level says anything (it carries the key: the next level does not decide),
    and the ``Pause`` it puts in force (None: its time has passed)."""
    name, annotations = level
    value = (annotations or {}).get(PAUSE_UNTIL_ANNOTATION)
    if value is None:
        return False, None
    reason = (annotations or {}).get(PAUSE_REASON_ANNOTATION) or None
    text = value.strip()
    if text.lower() == INFINITE:
        return True, Pause(scope=scope, name=name, reason=reason)
    try:
        until = datetime.fromisoformat(text)
        if until.tzinfo is None:
            raise ValueError("no time zone")
    except ValueError:
        problem = f"{value!r} is neither {INFINITE} nor an RFC 3339 time"
        return True, Pause(scope=scope, name=name, reason=reason, problem=problem)
    return True, (
        Pause(scope=scope, name=name, until=until, reason=reason) if until > now else None
    )


def effective_pause(
    pods: Sequence[Annotated], owner: Annotated, namespace: Annotated, now: datetime
) -> Pause | None:
    """The pause that holds the workload now (see the module), or None."""
    says, inherited = said(owner, PauseScope.OWNER, now)
    if not says:
        _, inherited = said(namespace, PauseScope.NAMESPACE, now)
    if not pods:
        return inherited
    for pod in pods:
        says, own = said(pod, PauseScope.POD, now)
        found = own if says else inherited
        if found is not None:
            return found
    return None


ENABLED, DISABLED = "enabled", "disabled"


def automation_off(engine: Annotated) -> Pause | None:
    """The engine's kill switch, read off its own namespace's annotations: ``disabled`` stops
    new attempts and every write that brings a cut back (a backoff's end, a re-apply, a record
    clearing a published rollback); verdicts and rollbacks go on. ``enabled`` or no annotation:
    on. Any other value stops it until fixed, as an unreadable pause holds."""
    name, annotations = engine
    value = (annotations or {}).get(AUTOMATION_ANNOTATION)
    if value is None or value.strip().lower() == ENABLED:
        return None
    reason = (annotations or {}).get(AUTOMATION_REASON_ANNOTATION) or None
    if value.strip().lower() == DISABLED:
        return Pause(scope=PauseScope.CLUSTER, name=name, reason=reason)
    problem = f"{value!r} is neither {ENABLED} nor {DISABLED}"
    return Pause(scope=PauseScope.CLUSTER, name=name, reason=reason, problem=problem)


def breaker_tripped(engine: Annotated) -> Pause | None:
    """The storm breaker, read off the engine's namespace: tripped while its annotation is there
    (whatever its value: the intake wrote the time), until an operator removes it."""
    name, annotations = engine
    if STORM_BREAKER_ANNOTATION not in (annotations or {}):
        return None
    reason = (annotations or {}).get(STORM_BREAKER_REASON_ANNOTATION) or None
    return Pause(scope=PauseScope.BREAKER, name=name, reason=reason)


def breaker_reset(now: datetime) -> dict[str, str | None]:
    """The annotations an operator's reset writes on the engine's namespace (a merge patch):
    the breaker's two removed, and when it was reset, so the verdicts before are not counted
    again (``worker.intake.breaker``)."""
    return {
        STORM_BREAKER_ANNOTATION: None,
        STORM_BREAKER_REASON_ANNOTATION: None,
        STORM_BREAKER_RESET_ANNOTATION: now.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def cluster_hold(engine: Annotated) -> Pause | None:
    """What holds every write that brings a cut back, cluster-wide: the kill switch, else the
    storm breaker (None: neither)."""
    return automation_off(engine) or breaker_tripped(engine)
