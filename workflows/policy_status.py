"""What each policy's ``status`` says, computed from the cluster alone.

The intake's leader writes it (``worker.status``); this module decides its content from the
policies and every owner's labels and stored rollback state, so a restarted intake computes the
same status it left, and writes nothing when nothing changed. Field names are the reference
engine's (docs/concepts/status-and-control.md, "Policy status"):

- ``observedGeneration``: the policy generation the status describes.
- ``activeTrackedWorkloads``: owners whose stored state names this policy in an active mode
  (``monitoring``, ``rollingBack``, ``backingOff``); ``failedWorkloads``: in ``failedPermanent``.
- ``lastErrorSummary``: the newest problem, ``<time> <owner>: <mode> (<reason>): <message>``, or
  ``invalid: <error>``. It is kept when the problem's state is later replaced (the newest one
  seen, by its leading time), so a success does not erase why the previous turn rolled back.
- ``conditions`` (``metav1.Condition``): ``Ready`` (False: ``Invalid`` or ``Shadowed``) and
  ``WorkloadsMatched`` (False: ``NoMatchingWorkloads``, ``ProtectedNamespaces``, ``Shadowed`` or
  ``Invalid``); its message names the protected namespaces the scope reaches, where the policy
  leaves workloads alone; and, for a valid policy, ``WorkloadsPaused`` (True: ``Held``, naming
  the active attempts a pause on a pod of theirs, their owner or namespace holds); and, for a
  policy with health checks, ``HealthChecksAsked`` (False: ``NoPrometheus``, the engine has no
  Prometheus to ask, so its verdicts are decided on adoption alone, or failed under
  ``onPrometheusError: fail``); and, where the engine has a Temporal budget
  (``--temporal-budget``), ``AttemptsWaiting`` (True: ``Budget``, how many of the policy's
  adoptions wait for their turn under it, naming the first). A condition keeps its
  ``lastTransitionTime`` while its status does not change.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import ConfigDict, Field, ValidationError

from workflows.contract import Mode
from workflows.policy import AnyPolicy
from workflows.selection import PolicyIndex, WorkloadRef, mismatch, precedence_key
from workflows.state import CamelModel, OwnerState, PolicyRef

READY, MATCHED, PAUSED = "Ready", "WorkloadsMatched", "WorkloadsPaused"
HEALTH = "HealthChecksAsked"  # only on a policy with health checks
WAITING = "AttemptsWaiting"  # only where the engine has a Temporal budget
ConditionStatus = Literal["True", "False", "Unknown"]
SUMMARY_MAX = 1024  # characters of lastErrorSummary
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"  # metav1.Time: RFC 3339 to the second


class Condition(CamelModel):
    """``metav1.Condition``."""

    type: str
    status: ConditionStatus
    reason: str
    message: str
    last_transition_time: datetime
    observed_generation: int | None = None


class PolicyStatus(CamelModel):
    model_config = ConfigDict(extra="ignore")  # fields another writer added are not ours

    observed_generation: int | None = None
    active_tracked_workloads: int = 0
    failed_workloads: int = 0
    last_error_summary: str | None = None
    conditions: list[Condition] = Field(default_factory=list)

    @classmethod
    def read(cls, stored: Any) -> PolicyStatus | None:
        """The status as stored, or None when absent or not in this shape."""
        if not isinstance(stored, dict) or not stored:
            return None
        try:
            return cls.model_validate(stored)
        except ValidationError:
            return None

    def body(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)

    def condition(self, kind: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == kind), None)


@dataclass(frozen=True)
class Workload:
    """An owner as the status sees it: what selects it, and the attempt its state records."""

    ref: WorkloadRef
    state: OwnerState | None
    held: bool = False  # a pause on a pod of it, on it or on its namespace is in force


@dataclass
class Tally:
    selected: int = 0  # workloads the policy's scope selects
    applies: int = 0  # of those, the ones where it wins precedence
    taken_by: str | None = None  # a policy that won one of its selected workloads
    protected: set[str] = field(default_factory=set)  # protected namespaces its scope reaches
    held: list[str] = field(default_factory=list)  # active attempts a pause holds
    active: int = 0
    failed: int = 0
    newest_problem: tuple[datetime, str] | None = None


def tally(index: PolicyIndex, workloads: Iterable[Workload]) -> dict[str, Tally]:
    """Per policy (keyed ``str(PolicyRef)``): what it selects, wins and tracks."""
    found: dict[str, Tally] = defaultdict(Tally)
    names: dict[int, str] = {}  # id(policy) -> its ref, built once per pass
    protected: dict[str, bool] = {}  # namespace -> protected, decided once per pass
    for w in workloads:
        matched = [p for p in index.candidates(w.ref.namespace) if mismatch(p, w.ref) is None]
        ns = w.ref.namespace
        if ns not in protected:
            protected[ns] = index.protection.pattern_for(ns) is not None
        if matched and protected[ns]:
            for p in matched:
                name = names.get(id(p)) or names.setdefault(id(p), str(PolicyRef.of(p)))
                found[name].protected.add(ns)
        elif matched:
            winner = min(matched, key=precedence_key)
            for p in matched:
                name = names.get(id(p)) or names.setdefault(id(p), str(PolicyRef.of(p)))
                t = found[name]
                t.selected += 1
                if p is winner:
                    t.applies += 1
                else:
                    t.taken_by = names.get(id(winner)) or str(PolicyRef.of(winner))
        state = w.state
        if state is None or state.policy is None:
            continue
        t = found[str(state.policy)]
        if not state.mode.terminal:
            t.active += 1
            if w.held:
                t.held.append(w.ref.key)
        elif state.mode is Mode.FAILED_PERMANENT:
            t.failed += 1
        if state.failure_reason is not None:
            at = state.last_transition_time
            text = (
                f"{_time(at)} {w.ref.key}: {state.mode} ({state.failure_reason}):"
                f" {state.failure_message or ''}"
            ).rstrip(": ")
            if t.newest_problem is None or at > t.newest_problem[0]:
                t.newest_problem = (at, text[:SUMMARY_MAX])
    return found


Said = tuple[ConditionStatus, str, str]  # a condition's status, reason and message


def status_of(
    policy: AnyPolicy,
    counts: Tally | None,
    previous: PolicyStatus | None,
    now: datetime,
    prometheus: bool = True,
    budget: float | None = None,
    waiting: Iterable[str] = (),
) -> PolicyStatus:
    """The status of a valid policy; ``prometheus``: whether the engine has one to ask;
    ``budget``: the engine's Temporal budget (actions a second), ``waiting``: the owners whose
    adoption under this policy waits for its turn."""
    counts = counts or Tally()
    generation = policy.metadata.generation
    summary = previous.last_error_summary if previous else None
    if counts.newest_problem is not None:
        at, text = counts.newest_problem
        stored_at = _leading_time(summary)
        if stored_at is None or at.replace(microsecond=0) > stored_at:
            summary = text
    ready, matched = _ready_and_matched(policy, counts)
    return PolicyStatus(
        observed_generation=generation,
        active_tracked_workloads=counts.active,
        failed_workloads=counts.failed,
        last_error_summary=summary,
        conditions=[
            _condition(previous, READY, ready, now, generation),
            _condition(previous, MATCHED, matched, now, generation),
            _condition(previous, PAUSED, _paused(counts), now, generation),
            *_health(policy, prometheus, previous, now, generation),
            *_waiting(budget, list(waiting), previous, now, generation),
        ],
    )


def _ready_and_matched(policy: AnyPolicy, counts: Tally) -> tuple[Said, Said]:
    """The ``Ready`` and ``WorkloadsMatched`` conditions of a valid policy."""
    if counts.selected and not counts.applies:
        shadowed = (
            f"every workload it selects ({counts.selected}) is taken by a policy of higher"
            f" precedence, e.g. {counts.taken_by}"
        )
        return ("False", "Shadowed", shadowed), ("False", "Shadowed", shadowed)
    mode = "observe-only: decides and reports, writes no rollback" if policy.observe_only else ""
    ready: Said = ("True", "Valid", mode or "valid and in effect")
    spared = _some(counts.protected, 5)
    if counts.applies:
        message = f"applies to {counts.applies} workload(s)"
        if counts.protected:
            message += f"; leaves alone those in protected namespaces ({spared})"
        return ready, ("True", "Matched", message)
    if counts.protected:
        return ready, (
            "False",
            "ProtectedNamespaces",
            f"selects workloads only in protected namespaces ({spared}), where no policy applies",
        )
    kinds = ", ".join(policy.spec.scope.workload_types)
    return ready, ("False", "NoMatchingWorkloads", f"no workload in scope (kinds: {kinds})")


def _paused(counts: Tally) -> Said:
    """The ``WorkloadsPaused`` condition: the tracked workloads a pause holds."""
    if not counts.held:
        return ("False", "NoneHeld", "no tracked workload is paused")
    return (
        "True",
        "Held",
        f"{len(counts.held)} tracked workload(s) held by a pause"
        f" (rightsizing.kubex.ai/pause-until): {_some(counts.held, 3)}",
    )


def _health(
    policy: AnyPolicy,
    prometheus: bool,
    previous: PolicyStatus | None,
    now: datetime,
    generation: int | None,
) -> list[Condition]:
    checks = policy.spec.health_checks
    if checks is None or not checks.prometheus:
        return []  # the autoscaler check reads the API server: nothing to say of Prometheus
    if prometheus:
        said: Said = (
            "True",
            "PrometheusConfigured",
            "asked at each verdict that passes adoption",
        )
    else:
        rule = (
            "failed (onPrometheusError: fail)"
            if checks.on_prometheus_error == "fail"
            else "decided on adoption alone, at once"
        )
        said = (
            "False",
            "NoPrometheus",
            "the engine has no Prometheus to ask (--prometheus-url, the chart's prometheus.url):"
            f" the health checks are not run and each verdict is {rule}",
        )
    return [_condition(previous, HEALTH, said, now, generation)]


def _waiting(
    budget: float | None,
    waiting: list[str],
    previous: PolicyStatus | None,
    now: datetime,
    generation: int | None,
) -> list[Condition]:
    if budget is None:
        return []
    rate = f"{budget:g} actions/s"
    said: Said = (
        ("True", "Budget", f"{len(waiting)} adoption(s) wait for their turn under the engine's"
         f" Temporal budget ({rate}): {_some(waiting, 3)}")
        if waiting
        else ("False", "NoneWaiting", f"no adoption waits for the Temporal budget ({rate})")
    )  # fmt: skip
    return [_condition(previous, WAITING, said, now, generation)]


def invalid_status(
    error: str,
    generation: int | None,
    counts: Tally | None,
    previous: PolicyStatus | None,
    now: datetime,
) -> PolicyStatus:
    """The status of a policy the models reject: it applies to nothing until fixed."""
    counts = counts or Tally()
    message = f"invalid: {error}"[:SUMMARY_MAX]
    ignored = "the policy is ignored until fixed"
    return PolicyStatus(
        observed_generation=generation,
        active_tracked_workloads=counts.active,
        failed_workloads=counts.failed,
        last_error_summary=message,
        conditions=[
            _condition(previous, READY, ("False", "Invalid", message), now, generation),
            _condition(previous, MATCHED, ("False", "Invalid", ignored), now, generation),
        ],
    )


def _some(names: Iterable[str], most: int) -> str:
    """``a, b, c, ...``: the first ``most`` names, sorted, and a mark when there are more."""
    ordered = sorted(names)
    return ", ".join(ordered[:most]) + (", ..." if len(ordered) > most else "")


def _condition(
    previous: PolicyStatus | None,
    kind: str,
    what: Said,
    now: datetime,
    generation: int | None,
) -> Condition:
    status, reason, message = what
    before = previous.condition(kind) if previous else None
    since = (
        before.last_transition_time
        if before and before.status == status
        else now.replace(microsecond=0)
    )
    return Condition(
        type=kind,
        status=status,
        reason=reason,
        message=message,
        last_transition_time=since,
        observed_generation=generation,
    )


def _time(at: datetime) -> str:
    return at.strftime(TIME_FORMAT)


def _leading_time(summary: str | None) -> datetime | None:
    """The time a summary starts with (None: no summary, or one without a time)."""
    if not summary:
        return None
    try:
        return datetime.strptime(summary.split(" ", 1)[0], TIME_FORMAT).replace(tzinfo=UTC)
    except ValueError:
        return None
