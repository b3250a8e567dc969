"""The workflow's activities against a real cluster: a thin ``@activity.defn`` layer.

``KubernetesActivities`` receives its API clients in the constructor and implements every name of
``workflows.activity_api`` by composing three helpers, one per concern:

- ``activities.lookup.OwnerLookup``: every read (owner, policy, cohort pods); one LIST of pods per
  owner per sample, never a GET per pod; the owner is read only at the first sample of a window
  (the workflow carries the cohort query after).
- ``activities.writes.OwnerWriter``: the owner's annotations (one merge patch with the read
  ``resourceVersion``, no diff no write) and Events (named after the transition), each retried
  here on transient errors and safe to repeat.
- ``activities.resize``: in-place actuation through ``pods/resize``.

404 on the owner ends the attempt cleanly (``exists=False``). Every other error leaves through
``activities.errors.classified``: transient ones raise as they are and Temporal retries the
activity with backoff, within the attempt's retry budget (``workflows.rollback``); permanent ones
become non-retryable errors that end the attempt ``aborted``.

Actuation has two modes (worker configuration): ``annotations`` publishes the rollback
recommendation on the owner for an external applier; ``in-place`` publishes it too and resizes
the running cohort pods.
"""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from kubernetes.client import CoreV1Api, CustomObjectsApi
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.budgets import Budgets
from activities.cohort import Tally, judge, raises_requests
from activities.errors import InvalidOwnerError, TransientError, classified
from activities.health import Cohort, Prometheus, check_health
from activities.lookup import OwnerLookup, read_state
from activities.neighbours import rolled_out, template_of
from activities.notify import NotificationConfig, Notifier
from activities.owners import (
    desired_replicas,
    manifest_resources,
    max_unavailable,
    unavailable_note,
)
from activities.resize import Budget, Pace, resize_paced
from activities.writes import HeldError, OwnerWriter
from workflows import machine
from workflows.activity_api import (
    CHECK_HEALTH,
    LOAD_OWNER,
    PROMETHEUS_NOT_CONFIGURED,
    REAPPLY_RECOMMENDATION,
    RECORD_TRANSITION,
    RESOLVE_POLICY,
    ROLL_BACK,
    SAMPLE_COHORT,
    ActuationResult,
    CohortQuery,
    CohortSample,
    HealthInput,
    HealthResult,
    LoadOwnerInput,
    LoadOwnerResult,
    OwnerRef,
    ReapplyInput,
    RecordTransitionInput,
    RecordTransitionResult,
    ResolvePolicyInput,
    ResolvePolicyResult,
    RollBackInput,
    SampleCohortInput,
)
from workflows.contract import (
    DEFAULT_ENGINE_NAMESPACE,
    ROLLBACK_LIMITS_ANNOTATION,
    ROLLBACK_REQUESTS_ANNOTATION,
    ROLLBACK_STATE_ANNOTATION,
    Actuation,
    EventReason,
    Obj,
    RollbackTarget,
)
from workflows.fingerprint import MalformedRecommendationError, Recommendation, Resources
from workflows.notify import (
    REPORT_NOTIFICATION_FAILURE,
    ROUTE_NOTIFICATION,
    SEND_NOTIFICATION,
    Notification,
    ReportInput,
    RouteResult,
    SendInput,
    SendResult,
)
from workflows.pause import Pause
from workflows.selection import PROTECTED, Protection
from workflows.state import OwnerState, ResourceSnapshot

log = logging.getLogger(__name__)


def _json(values: Resources) -> str | None:
    return json.dumps(values, sort_keys=True, separators=(",", ":")) if values else None


def cohort_sample(
    owner: OwnerRef,
    pods: list[Obj],
    input: SampleCohortInput,
    desired: int | None,
    query: CohortQuery,
    min_ready: timedelta = timedelta(0),
    carried: bool = True,
) -> CohortSample:
    """The cohort judged (``activities.cohort``): counts and the reasons pods do not count; a
    pod counts only once Ready for ``min_ready`` (``carried``: ``cohort.health``)."""
    now = datetime.now(UTC)
    tally = Tally(min_ready=min_ready)
    since, ready_by = input.window_started_at, now - min_ready
    left_out: dict[str, str] = {}
    for pod in pods:
        try:
            tally.add(judge(pod, input.recommendation, since, ready_by, carried))
        except MalformedRecommendationError as exc:  # that pod's problem, not the workload's
            left_out[pod["metadata"]["name"]] = str(exc)
    message = tally.message()
    if left_out:
        said = "; ".join(f"{name}: {why}" for name, why in sorted(left_out.items()))
        told = f"{len(left_out)} pod(s) left out, their recommendation unreadable ({said})"
        message = f"{message}; {told}" if message else told
        log.warning("%s: pods left out of the cohort: %s", owner, said)
    return CohortSample(
        desired=desired,
        pods=tally.pods,
        adopted=tally.adopted,
        adopted_healthy=tally.adopted_healthy,
        unhealthy=dict(tally.reasons),
        failing={reason: n for reason, n in tally.failing.items() if n},
        certain=tally.certain,
        message=message,
        observed_at=now,
        cohort=query,
        left_out=left_out,
    )


def _raises(owner: OwnerRef, obj: Obj, recommendation: Recommendation | None) -> bool | None:
    """Whether ``recommendation`` raises a request above ``obj``'s template (None: unknown)."""
    if recommendation is None:
        return None
    try:
        manifest = manifest_resources(owner.kind, obj)
    except InvalidOwnerError:
        return None
    return raises_requests(recommendation, manifest[0] if manifest else None)


@dataclass(frozen=True)
class Listed:
    """The cohort as one LIST found it (none: it was not read)."""

    query: CohortQuery | None = None
    pods: list[Obj] = field(default_factory=list)
    version: str = ""


def _newer_of_its_run(obj: Obj, state: OwnerState | None) -> bool:
    """Whether ``obj`` shows a state its run recorded after ``state`` (more transitions)."""
    stored, _ = read_state(obj)
    if state is None or stored is None or state.run_id is None or stored.run_id != state.run_id:
        return False
    return (stored.transitions or 0) > (state.transitions or 0)


def _published(owner: Obj) -> bool:
    """Whether the owner carries a rollback recommendation (clearing it would act)."""
    annotations = owner["metadata"].get("annotations") or {}
    return bool({ROLLBACK_REQUESTS_ANNOTATION, ROLLBACK_LIMITS_ANNOTATION} & annotations.keys())


def _heartbeat() -> None:
    if activity.in_activity():
        activity.heartbeat()


class KubernetesActivities:
    def __init__(
        self,
        core: CoreV1Api,
        custom: CustomObjectsApi,
        actuation: Actuation = Actuation.ANNOTATIONS,
        instance: str | None = None,
        notifications: NotificationConfig | None = None,
        protection: Protection = PROTECTED,
        min_ready: timedelta = timedelta(0),
        prometheus: Prometheus | None = None,
        engine_namespace: str = DEFAULT_ENGINE_NAMESPACE,
    ) -> None:
        self.core = core
        self.prometheus = prometheus  # the health checks' (None: none configured)
        self.actuation = actuation
        # How long a pod must have been Ready to count; the worker's configuration gives
        # Kubex's 10 s by default (``--min-ready-duration``).
        self.min_ready = min_ready
        self.lookup = OwnerLookup(core, custom, protection, engine_namespace)
        self.writer = OwnerWriter(core, custom, self.lookup, instance or socket.gethostname())
        self.notifier = Notifier(notifications or NotificationConfig(), self.lookup, self.writer)

    @activity.defn(name=ROUTE_NOTIFICATION)
    def route_notification(self, input: Notification) -> RouteResult:
        with classified():
            return self.notifier.route(input)

    @activity.defn(name=SEND_NOTIFICATION)
    def send_notification(self, input: SendInput) -> SendResult:
        with classified():
            return self.notifier.send(input)

    @activity.defn(name=REPORT_NOTIFICATION_FAILURE)
    def report_notification_failure(self, input: ReportInput) -> None:
        with classified():
            self.notifier.report(input)

    @activity.defn(name=CHECK_HEALTH)
    def check_health(self, input: HealthInput) -> HealthResult:
        """The policy's health checks at the window's end (``activities.health``)."""
        if self.prometheus is None:
            raise ApplicationError(
                "the policy has health checks and this worker no Prometheus to ask"
                " (--prometheus-url, ROLLBACK_PROMETHEUS_URL)",
                type=PROMETHEUS_NOT_CONFIGURED,
                non_retryable=True,
            )
        with classified():
            query = input.cohort
            if query is None:
                obj = self.lookup.get(input.owner)
                if obj is None:
                    raise TransientError(f"{input.owner} is gone: no cohort to check")
                query = self.lookup.cohort_query(input.owner, obj)
            pods = self.lookup.pods(input.owner.namespace, query)
            if not pods:
                raise TransientError(f"{input.owner}: no pod of the cohort to check")
            return check_health(self.prometheus, input, Cohort.of(pods))

    @activity.defn(name=LOAD_OWNER)
    def load_owner(self, input: LoadOwnerInput) -> LoadOwnerResult:
        with classified():
            obj = self.lookup.get(input.owner)
            if obj is None:
                return LoadOwnerResult(exists=False)
            state, error = read_state(obj)
            if error:
                log.warning("%s: unreadable rollback state: %s", input.owner, error)
            policy = self.lookup.policy(input.owner, obj, input.policy)
            checks = policy.health_checks if policy else None
            return LoadOwnerResult(
                exists=True,
                state=state,
                state_error=error,
                policy=policy,
                desired=desired_replicas(input.owner.kind, obj),
                template=template_of(input.owner.kind, obj),
                autoscaler=(
                    self.lookup.autoscaler(input.owner) if checks and checks.autoscaler else None
                ),
                raises_requests=_raises(input.owner, obj, input.recommendation),
            )

    @activity.defn(name=RESOLVE_POLICY)
    def resolve_policy(self, input: ResolvePolicyInput) -> ResolvePolicyResult:
        with classified():
            obj = self.lookup.get(input.owner)
            if obj is None:
                return ResolvePolicyResult(exists=False)
            policy = self.lookup.policy(input.owner, obj)
            paused = None
            if input.attempt is not None and _published(obj):
                # The kill switch and the breaker hold a backoff's end where, by the machine's
                # rule, what it goes to lets the cut run again (backedOff; cleared, the policy
                # gone), not where it ends failedPermanent; a pause holds it either way.
                state, _ = read_state(obj)
                turn = input.turn or (state.turn if state else 1)
                back = machine.brings_back(
                    state.mode if state else None,
                    machine.backoff_end(turn, policy),
                    published=True,
                    clears=True,
                )
                step, attempt = "backoff end", input.attempt
                _, paused = self._gate(input.owner, obj, step, attempt, brings_back=back)
            return ResolvePolicyResult(policy=policy, paused=paused)

    @activity.defn(name=SAMPLE_COHORT)
    def sample_cohort(self, input: SampleCohortInput) -> CohortSample:
        with classified():
            started = time.monotonic()
            try:
                return self._sample(input)
            finally:
                if activity.in_activity():
                    activity.metric_meter().create_histogram(
                        "rollback_sample_latency", "one cohort sample", "ms"
                    ).record(int((time.monotonic() - started) * 1000))

    def _sample(self, input: SampleCohortInput) -> CohortSample:
        owner, desired, query, obj = input.owner, None, input.cohort, None
        opening = query is None
        # The verdict reads the owner's pause too; a window's first, its baselines; an early
        # verdict's, its template (a release).
        if opening or input.final or input.releases:
            obj = self.lookup.get(owner)
            if obj is None:
                return CohortSample(exists=False, pods=0, adopted=0, adopted_healthy=0)
            desired = desired_replicas(owner.kind, obj)
        if query is None:
            assert obj is not None
            query = self.lookup.cohort_query(owner, obj)
        pods = self.lookup.pods(owner.namespace, query)
        sample = cohort_sample(owner, pods, input, desired, query, self.min_ready)
        for pod, why in sample.left_out.items():  # told once per pod and cause
            message = (
                f"pod {pod} left out of the cohort of {input.recommendation.fingerprint}: its"
                f" recommendation annotation cannot be read ({why}); the other pods are judged"
            )
            uid = (obj or {}).get("metadata", {}).get("uid")
            identity = f"{owner}/{pod}/malformed/{why}"
            self.writer.event(
                owner, uid, identity, EventReason.RECOMMENDATION_MALFORMED, message, "Warning"
            )
        if obj is None:
            return sample
        neighbours: dict[str, object] = {
            "template": template_of(owner.kind, obj),
            "rolled_out": rolled_out(owner.kind, obj),
        }
        if opening:
            neighbours["raises_requests"] = _raises(owner, obj, input.recommendation)
        scaled_in = input.baseline is not None and (desired or 0) < input.baseline
        if (input.autoscaler and (opening or input.final)) or (input.final and scaled_in):
            neighbours["autoscaler"] = self.lookup.autoscaler(owner)
        sample = sample.model_copy(update=neighbours)
        if input.final:
            paused = self._paused(owner, obj, pods, "verdict", input.recommendation.fingerprint)
            if paused is not None:
                return sample.model_copy(update={"paused": paused})
        return sample

    def _paused(
        self,
        owner: OwnerRef,
        obj: Obj,
        pods: list[Obj],
        step: str,
        attempt: str,
        brings_back: bool = False,
    ) -> Pause | None:
        """The pause in force on ``owner`` (``workflows.pause``), and for a step that
        ``brings_back`` a cut the kill switch or the storm breaker before it, told where it
        holds ``step`` of the attempt on ``attempt`` (a fingerprint): one Warning Event per
        pause, a log line, the ``rollback_holds`` metric."""
        pause = self.lookup.pause(owner, obj, pods)
        # Read last, right before the write: the hold an operator sets in an incident.
        off = self.lookup.cluster_hold() if brings_back else None
        paused = off or pause
        if paused is None:
            return None
        message = f"{step} held: {paused.describe()}"
        log.warning("%s: %s", owner, message)
        if activity.in_activity():
            activity.metric_meter().create_counter(
                "rollback_holds", "verdicts and actuations held by a pause, by its scope"
            ).add(1, {"scope": paused.scope.value, "step": step})
        self.writer.event(
            owner,
            obj["metadata"].get("uid"),
            f"{owner}/{attempt}/{step}/paused/{paused.model_dump_json()}",
            EventReason.PAUSED,
            message,
            "Warning",
        )
        return paused

    @activity.defn(name=RECORD_TRANSITION)
    def record_transition(self, input: RecordTransitionInput) -> RecordTransitionResult:
        with classified():
            wanted: dict[str, str | None] = {
                ROLLBACK_STATE_ANNOTATION: input.state.to_json() if input.state else None
            }
            if input.clear_rollback_recommendation:
                wanted |= {ROLLBACK_REQUESTS_ANNOTATION: None, ROLLBACK_LIMITS_ANNOTATION: None}
            # Read first: a record that may act goes through its gate on that read, and none is
            # written over a newer state of its run (a local activity run again).
            try:
                obj, written = self.writer.patch_annotations(
                    input.owner,
                    wanted,
                    held=self._record_gate(input),
                    stale=lambda obj: _newer_of_its_run(obj, input.state),
                )
            except HeldError as exc:
                return RecordTransitionResult(paused=exc.pause)
            if obj is None:
                return RecordTransitionResult(exists=False)
            emitted = False
            if input.event_reason is not None:
                emitted = self.writer.event(
                    input.owner,
                    obj["metadata"].get("uid"),
                    input.event_id,
                    input.event_reason,
                    input.event_message,
                    input.event_type,
                    input.event_count,
                )
            return RecordTransitionResult(state_written=written, event_emitted=emitted)

    @activity.defn(name=ROLL_BACK)
    def roll_back(self, input: RollBackInput) -> ActuationResult:
        with classified():
            obj = self.lookup.get(input.owner)
            if obj is None:
                return ActuationResult(exists=False)
            listed, paused = self._gate(input.owner, obj, "rollback", input.target.value)
            if paused is not None:
                return ActuationResult(paused=paused, message=paused.describe())
            if input.target is RollbackTarget.MANIFEST:
                manifest = manifest_resources(input.owner.kind, obj)
                if manifest is None:
                    return ActuationResult(
                        message=f"{input.owner.kind} has no manifest resources to restore"
                    )
                requests, limits = manifest
            else:
                assert input.resources is not None, "lastSuccessful rollback without resources"
                requests, limits = input.resources.requests(), input.resources.limits()
            try:
                written, _ = self.writer.patch_annotations(
                    input.owner,
                    {
                        ROLLBACK_REQUESTS_ANNOTATION: _json(requests),
                        ROLLBACK_LIMITS_ANNOTATION: _json(limits),
                    },
                    held=self._regate(input.owner, "rollback", input.target.value),
                )
            except HeldError as exc:
                return ActuationResult(paused=exc.pause, message=exc.pause.describe())
            if written is None:
                return ActuationResult(exists=False)
            result = ActuationResult(
                applied=ResourceSnapshot.of(requests, limits),
                message=f"rollback recommendation ({input.target}) published on the owner",
            )
            return self._actuate(
                input.owner,
                written,
                listed,
                requests,
                limits,
                result,
                "rollback",
                input.target,
                recreate=True,
            )

    @activity.defn(name=REAPPLY_RECOMMENDATION)
    def reapply_recommendation(self, input: ReapplyInput) -> ActuationResult:
        with classified():
            rec = input.recommendation
            result = ActuationResult(
                applied=ResourceSnapshot.of(rec.requests, rec.limits),
                message="rollback recommendation cleared: the applier re-applies it",
            )
            obj = self.lookup.get(input.owner)
            if obj is None:
                return ActuationResult(exists=False)
            listed, paused = self._gate(
                input.owner, obj, "re-apply", rec.fingerprint, brings_back=True
            )
            if paused is not None:
                return ActuationResult(paused=paused, message=paused.describe())
            return self._actuate(
                input.owner,
                obj,
                listed,
                rec.requests,
                rec.limits,
                result,
                "re-apply",
                rec.fingerprint,
                stop_on_crash=True,
                brings_back=True,
            )

    def _gate(
        self, owner: OwnerRef, obj: Obj, step: str, attempt: str, brings_back: bool = False
    ) -> tuple[Listed, Pause | None]:
        """The one gate of every write that changes what runs (docs/concepts/status-and-control.md,
        "Pauses"): the cohort from one LIST, and the pause in force over it read right before
        the write, at every level (its pods', the owner's as ``obj`` shows it, its namespace's).
        Publishing a rollback recommendation, clearing one, a re-apply and each batch of resizes
        (``_actuate``'s ``Pace.paused``) go through it, in both actuation modes. A write that
        ``brings_back`` a cut (a backoff's end, a re-apply, clearing a published rollback) also
        reads the engine's kill switch and storm breaker first."""
        query = self.lookup.cohort_query(owner, obj)
        listed = Listed(query, *self.lookup.pods_listed(owner.namespace, query))
        return listed, self._paused(owner, obj, listed.pods, step, attempt, brings_back)

    def _record_gate(self, input: RecordTransitionInput) -> Callable[[Obj], Pause | None] | None:
        """The gate of a record that may act, read on the owner as the writer reads it: the
        pause over the workload when the record clears a published rollback, and the kill
        switch and the breaker too when, by ``machine.brings_back`` on what that read shows,
        it lets the cut run again (a backoff's end, a clear for a policy gone, a retry's first
        state over ``failedPermanent``). None: the record cannot act."""
        if not (input.clear_rollback_recommendation or input.brings_back):
            return None
        after = input.state.mode if input.state else None
        attempt = input.state.active_recommendation_fingerprint if input.state else "-"
        step = f"{after or 'cleared'} record"

        def held(obj: Obj) -> Pause | None:
            stored, _ = read_state(obj)
            published = _published(obj)
            clears = input.clear_rollback_recommendation and published
            back = machine.brings_back(
                stored.mode if stored else None, after, published=published, clears=clears
            )
            if not (back or clears):
                return None  # it acts on nothing the owner shows
            return self._gate(input.owner, obj, step, attempt, brings_back=back)[1]

        return held

    def _regate(
        self, owner: OwnerRef, step: str, attempt: str, brings_back: bool = False
    ) -> Callable[[Obj], Pause | None]:
        """The gate of a write that acts, read on the owner as the writer reads it before each
        try (``writes.OwnerWriter.patch_annotations``): its cohort LISTed again, the pause on
        that read, and the kill switch and the breaker where it ``brings_back`` a cut."""
        return lambda obj: self._gate(owner, obj, step, attempt, brings_back)[1]

    def _paced(self, owner: OwnerRef, obj: Obj, step: str, attempt: str, budget: Budget) -> None:
        """Tell once, on the owner, that ``budget`` holds a batch of ``step``."""
        message = f"{step} of {attempt} waits: {budget.said}, before it takes a pod down"
        self._tell(owner, obj, f"paced.{budget.name}", EventReason.PACED, message)

    def _recreated(
        self, owner: OwnerRef, obj: Obj, step: str, attempt: str, pods: dict[str, str]
    ) -> None:
        """Tell, on the owner, which pods a batch of ``step`` deleted for their controller to
        recreate with the restored resources, and why."""
        why = ", ".join(f"{pod} ({reason})" for pod, reason in sorted(pods.items()))
        message = (
            f"{step} of {attempt} recreates {why}: they cannot take it in place; their"
            " replacements are admitted with it"
        )
        identity = f"recreated.{','.join(sorted(pods))}"
        self._tell(owner, obj, identity, EventReason.PODS_RECREATED, message)

    def _tell(self, owner: OwnerRef, obj: Obj, identity: str, reason: str, message: str) -> None:
        """A Normal Event on the owner, once per run and ``identity``; logged too."""
        run = activity.info().workflow_run_id if activity.in_activity() else "-"
        log.info("%s: %s", owner, message)
        self.writer.event(
            owner, obj["metadata"].get("uid"), f"{run}.{identity}", reason, message, "Normal"
        )

    def _actuate(
        self,
        owner: OwnerRef,
        obj: Obj,
        listed: Listed,
        requests: Resources,
        limits: Resources,
        result: ActuationResult,
        step: str,
        attempt: str,
        stop_on_crash: bool = False,
        recreate: bool = False,
        brings_back: bool = False,
    ) -> ActuationResult:
        """In-place mode: resize the cohort to the target, paced by the workload's
        ``maxUnavailable`` and the disruption budgets over it, the pause read again before each
        batch (``activities.resize``), and say what happened; a re-apply (``stop_on_crash``)
        takes no more pods down once one crashes on the new resources, a restore
        (``recreate``) recreates the pods that cannot take it in place."""
        if self.actuation is not Actuation.IN_PLACE:
            return result
        assert listed.query is not None
        query, first = listed.query, [(listed.pods, listed.version)]

        def cohort() -> tuple[list[Obj], str]:  # the LIST the pause was read on, then afresh
            return first.pop() if first else self.lookup.pods_listed(owner.namespace, query)

        def paused(pods: list[Obj]) -> Pause | None:  # the owner's and namespace's, afresh
            now = self.lookup.get(owner)
            return (
                None if now is None else self._paused(owner, now, pods, step, attempt, brings_back)
            )

        desired = desired_replicas(owner.kind, obj)
        budgets = Budgets(self.core.api_client, owner.namespace, _heartbeat)
        note = unavailable_note(owner.kind, obj, desired)
        pace = Pace(
            max_unavailable(owner.kind, obj, desired),
            heartbeat=_heartbeat,
            stop_on_crash=stop_on_crash,
            recreate=recreate,
            paused=paused,
            budget=budgets.tightest,
            budget_watch=budgets.wait,
            on_held=lambda budget: self._paced(owner, obj, step, attempt, budget),
            on_recreated=lambda pods: self._recreated(owner, obj, step, attempt, pods),
            notes=(note,) if note else (),
        )
        done = resize_paced(
            self.core, owner.namespace, cohort, query.label_selector, requests, limits, pace
        )
        return result.model_copy(
            update={
                "pods_resized": done.resized,
                "pods_filtered": done.filtered,
                "message": f"{result.message}; {done.describe()}",
                "paused": done.paused,
            }
        )
