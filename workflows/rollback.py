"""``RollbackWorkflow``: one workflow per workload owner, one run per resize attempt.

A thin, deterministic shell over ``workflows.machine``: observe (an activity, a durable timer or
a signal) -> ``decide`` -> perform the decision's effects (activities) -> wait for what the new
mode calls for. All timing is Temporal's (``workflow.now``, timers), so a monitoring window or a
backoff survives worker crashes, deploys and server restarts.

Workflow ID: ``rollback/<cluster>/<namespace>/<Kind>/<name>`` (``activity_api.rollback_id``): a
fleet's clusters share one Temporal and never a run. The intake starts runs with
signal-with-start (``observe``), so signalling a finished owner starts its next run: the next
turn after ``backedOff``, a reopen after ``monitoringSucceeded``, or a new recommendation.

Signals: ``observe`` (pods carry a recommendation: the same fingerprint joins the window, a new
one supersedes the run), ``cancel`` (stop, leave resources as they are), ``reopen`` (fresh
window for the same fingerprint, unless the policy disables it), ``resume`` (a pause
annotation went: a held step looks again). Updates: ``request_cancel``, ``request_reopen`` (the
controls, judged by the same function as their signals, answered). Queries: ``status``,
``held``.

Pauses (``workflows.pause``): the verdict's sample, the rollback, the backoff's end, the re-apply
and a record that clears a rollback find the pause in force, if any, and write nothing; the
machine decides the hold (``machine.HOLDS``: until the pause's time, the intake's ``resume``, or
``PAUSE_RECHECK`` for a resume the intake could not send; and which signals end it early) and
this shell carries it out, then the step looks again: a verdict decides on what it sees then. A
hold sets the ``RollbackHeld`` search attribute (what ``rollbackctl get`` and the UI show),
unset with the next state shown.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from contextlib import suppress
from datetime import datetime, timedelta
from typing import Any, NoReturn, TypeVar

from pydantic import Field, field_validator
from temporalio import workflow
from temporalio.common import (
    RetryPolicy,
    SearchAttributeKey,
    SearchAttributePair,
    SearchAttributeUpdate,
    TypedSearchAttributes,
)
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    CancelledError,
    FailureError,
    RetryState,
    WorkflowAlreadyStartedError,
)

with workflow.unsafe.imports_passed_through():
    from workflows.activity_api import (
        CHECK_HEALTH,
        LOAD_OWNER,
        LOCAL,
        NON_RETRYABLE_ERRORS,
        PROMETHEUS_NOT_CONFIGURED,
        REAPPLY_RECOMMENDATION,
        RECORD_TRANSITION,
        RESOLVE_POLICY,
        ROLL_BACK,
        SAMPLE_COHORT,
        ActuationResult,
        CohortSample,
        HealthInput,
        HealthResult,
        LoadOwnerInput,
        LoadOwnerResult,
        OwnerRef,
        PermanentError,
        PolicySettings,
        ReapplyInput,
        RecordTransitionInput,
        RecordTransitionResult,
        ResolvePolicyInput,
        ResolvePolicyResult,
        RollBackInput,
        SampleCohortInput,
    )
    from workflows.contract import EventReason, FailureReason, Mode, SearchAttribute, check_cluster
    from workflows.durations import Duration
    from workflows.fingerprint import Recommendation
    from workflows.machine import (
        Aborted,
        AttemptStarted,
        BackoffOver,
        Cancel,
        Decision,
        Hold,
        HoldEnds,
        Observation,
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
        baseline_at,
        control_refusal,
        decide,
        health_due,
        health_hold,
        health_unavailable,
        initial_state,
        news_after_start,
    )
    from workflows.notify import Notification, NotifyWorkflow, severity_of
    from workflows.pause import Pause
    from workflows.state import CamelModel, OwnerState
    from workflows.wake import Sighting, Trigger

R = TypeVar("R")
WORKFLOW_NAME = "RollbackWorkflow"
CONTROL_REFUSED = "ControlRefused"  # the error type of a control Update refused
UPDATE_RECORDED = timedelta(milliseconds=1)  # a control Update acts after this timer (``_take``)
MAX_SAMPLES_PER_RUN = 500  # many reopened windows in one run: continue-as-new well before 50k
# A window's history grows only with signals now; past this many events (or when the server
# suggests it) the same attempt continues in a fresh run.
MAX_HISTORY_EVENTS = 10_000
# The modes a window's verdict leads to (timed by the rollback_time_to_verdict histogram).
VERDICTS = frozenset({Mode.MONITORING_SUCCEEDED, Mode.ROLLING_BACK, Mode.FAILED_PERMANENT})
# Health checks (docs/concepts/health-checks.md): Prometheus is asked five times over about half
# a minute; then the policy's onPrometheusError says what the verdict does (the machine's
# ``health_unavailable``, and ``health_hold`` for how long a held verdict waits).
HEALTH_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=2),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=5,
    non_retryable_error_types=NON_RETRYABLE_ERRORS,
)

# Kubernetes calls: retried with backoff until they succeed (a write must eventually land; the
# window's verdict needs its final sample), except for errors that retrying cannot fix.
K8S_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=60),
    non_retryable_error_types=NON_RETRYABLE_ERRORS,
)
# A window's opening sample (its baseline not known yet) is only informative: a few tries, then
# skip it (the final sample sets the baseline).
OPENING_SAMPLE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_attempts=3,
    non_retryable_error_types=NON_RETRYABLE_ERRORS,
)
ACTIVITY_TIMEOUT = timedelta(seconds=20)  # a killed worker's activity is retried after this
# A rollback or re-apply in place waits for each batch of restarted pods to be Ready again
# (``activities.resize``): it may run long, heartbeating; a killed worker's is retried after
# the heartbeat timeout, and resumes from what the pods show.
ACTUATIONS = frozenset({ROLL_BACK, REAPPLY_RECOMMENDATION})
ACTUATION_TIMEOUT = timedelta(hours=2)
ACTUATION_HEARTBEAT = timedelta(seconds=30)
# A local activity retries a few times in the worker (about 3 s of backoff); then the same call
# becomes a regular activity, which retries durably under a retry budget of its own and shows its
# failures in the UI.
LOCAL_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_attempts=3,
    non_retryable_error_types=NON_RETRYABLE_ERRORS,
)
LOCAL_BUDGET = timedelta(seconds=30)
# How long one activity may keep failing transiently (API server down, throttled, a webhook
# timing out) before the attempt ends aborted (retryBudgetExhausted) instead of retrying forever.
RETRY_BUDGET = timedelta(minutes=30)
# A new attempt starts on the Worker Deployment's current version; a long window's
# continue-as-new (the same attempt) keeps its pinned version.
NEW_ATTEMPT = workflow.ContinueAsNewVersioningBehavior.AUTO_UPGRADE
# What an observe-only policy's rollback and re-apply "did": no activity runs (README,
# "Observe-only policies").
OBSERVE_ONLY_RESULT = ActuationResult(message="observe-only: nothing written, nothing resized")

SA_CLUSTER = SearchAttributeKey.for_keyword(SearchAttribute.CLUSTER)
SA_NAMESPACE = SearchAttributeKey.for_keyword(SearchAttribute.NAMESPACE)
SA_WORKLOAD = SearchAttributeKey.for_keyword(SearchAttribute.WORKLOAD)
SA_MODE = SearchAttributeKey.for_keyword(SearchAttribute.MODE)
SA_TURN = SearchAttributeKey.for_int(SearchAttribute.TURN)
SA_POLICY = SearchAttributeKey.for_keyword(SearchAttribute.POLICY)
SA_FINGERPRINT = SearchAttributeKey.for_keyword(SearchAttribute.FINGERPRINT)
SA_HELD = SearchAttributeKey.for_keyword(SearchAttribute.HELD)
HELD_SHOWN_CHARS = 250  # a pause's reason is free text; a Keyword attribute is not


class RollbackInput(CamelModel):
    # The cluster the owner lives in (``workflows.contract.check_cluster``); "" only in runs
    # started before clusters had names (0.1), which a worker refuses to act for.
    cluster: str = ""
    owner: OwnerRef
    recommendation: Recommendation
    trigger: Trigger = Trigger.OBSERVE
    observed_pod_created_at: datetime | None = None
    # When the intake saw the pod adopt it (its clock): where a relative baseline ends.
    adopted_at: datetime | None = None
    max_samples_per_run: int = Field(default=MAX_SAMPLES_PER_RUN, ge=1)
    max_history_events: int = Field(default=MAX_HISTORY_EVENTS, ge=1)
    retry_budget: Duration = RETRY_BUDGET
    resume: RollbackState | None = None  # set by continue-as-new in a long window
    # The policy the starter resolved (the intake, from its watch of the policies), carried to
    # the attempt's first read instead of resolved again there; None: that read resolves it.
    policy: PolicySettings | None = None

    @field_validator("cluster")
    @classmethod
    def _cluster(cls, value: str) -> str:
        return check_cluster(value) if value else value


class ObserveSignal(CamelModel):
    recommendation: Recommendation
    pod: str | None = None
    pod_created_at: datetime | None = None
    adopted_at: datetime | None = None  # when the intake saw it adopted (``RollbackInput``)


class CancelSignal(CamelModel):
    reason: str = ""


class ReopenSignal(CamelModel):
    reason: str = ""


class ResumeSignal(CamelModel):
    reason: str = ""


class SuspectSignal(CamelModel):
    """From the intake: a pod of the cohort failing for certain (under an early verdict)."""

    pod: str = ""


class RollbackResult(CamelModel):
    owner: OwnerRef
    mode: Mode
    turn: int
    fingerprint: str
    failure_reason: FailureReason | None = None
    message: str | None = None


def _failure(err: ActivityError) -> tuple[FailureReason, str]:
    """The failure reason and message of an activity that failed for good."""
    cause = err.cause
    if isinstance(cause, ApplicationError) and cause.type in NON_RETRYABLE_ERRORS:
        return PermanentError(cause.type).reason, cause.message
    if err.retry_state in (RetryState.TIMEOUT, RetryState.MAXIMUM_ATTEMPTS_REACHED):
        last = cause.message if isinstance(cause, FailureError) else str(cause or err)
        return FailureReason.RETRY_BUDGET_EXHAUSTED, f"{err.activity_type} kept failing: {last}"
    return FailureReason.UNEXPECTED_ERROR, str(cause or err)


def _activity_error(name: str) -> ActivityError:
    """A local activity's permanent failure as the ``ActivityError`` a regular one raises (the
    caller chains the cause, which ``_failure`` reads)."""
    return ActivityError(
        f"{name} failed",
        scheduled_event_id=0,
        started_event_id=0,
        identity="",
        activity_type=name,
        activity_id="",
        retry_state=RetryState.NON_RETRYABLE_FAILURE,
    )


def search_attributes(state: RollbackState, cluster: str) -> list[SearchAttributeUpdate[Any]]:
    """What the UI and ``rollbackctl get`` filter on, e.g. ``RollbackMode = "failedPermanent"``
    (a 0.1 run, with no cluster, upserts what it did then)."""
    return [
        *([SA_CLUSTER.value_set(cluster)] if cluster else []),
        SA_NAMESPACE.value_set(state.owner.namespace),
        SA_WORKLOAD.value_set(state.owner.workload),
        SA_MODE.value_set(state.mode.value),
        SA_TURN.value_set(state.turn),
        SA_POLICY.value_set(str(state.policy.ref) if state.policy else ""),
        SA_FINGERPRINT.value_set(state.fingerprint),
    ]


@workflow.defn(name=WORKFLOW_NAME)
class RollbackWorkflow:
    """Pinned under Worker Versioning (the versioned worker's default behaviour, which is why it
    is not declared here: an unversioned worker refuses a workflow that declares one). A run
    finishes on the build it started on, so a workflow change never meets a history it did not
    write; a new attempt (a new recommendation, the next turn, a reopen) continues-as-new onto
    the current version, while a long window's continue-as-new, the same attempt, stays pinned
    (docs/operating/upgrade.md, "Worker versioning")."""

    # The cost benchmark's baseline turns it off (bench/regular.py): every activity a regular
    # one, to show what the local ones save; nothing else does.
    local_activities = True

    def __init__(self) -> None:
        self._state: RollbackState | None = None
        self._pending: list[Observation] = []
        self._input: RollbackInput | None = None
        self._samples_this_run = 0
        self._held_by: Pause | None = None  # the pause a step waits on now
        # The search attributes the run shows (set with its start, inherited across
        # continue-as-new, or upserted since), by name: an upsert carries only what differs.
        self._shown: dict[str, Any] = {}
        self._resumes = 0  # resume signals received
        self._holds = 0  # holds waited in this run (a re-apply's: its window opens when it lands)
        self._health_holds = 0  # verdicts held for Prometheus in this run

    # --- signals and query -------------------------------------------------------------------

    @workflow.signal
    def observe(self, signal: ObserveSignal) -> None:
        self._pending.append(
            Observed(  # adopted when the intake saw it, else when the signal came
                workflow.now(),
                signal.recommendation,
                signal.pod_created_at,
                signal.adopted_at or workflow.now(),
            )
        )

    @workflow.signal
    def cancel(self, signal: CancelSignal) -> None:
        self._pending.append(Cancel(workflow.now(), signal.reason))

    @workflow.signal
    def reopen(self, signal: ReopenSignal) -> None:
        self._pending.append(Reopen(workflow.now()))

    @workflow.signal
    def resume(self, signal: ResumeSignal) -> None:
        self._resumes += 1

    @workflow.signal
    def suspect(self, signal: SuspectSignal) -> None:
        self._pending.append(Suspected(workflow.now()))

    # The controls as Updates: judged by the same function as their signals
    # (``machine.control_refusal``), and the caller gets the answer: the state the control was
    # taken in, or refused with the reason (a refusal known before the run has decided its
    # start is given once it has; one known now is rejected before it enters the history).

    @workflow.update
    async def request_cancel(self, request: CancelSignal) -> RollbackState:
        return await self._take(lambda: Cancel(workflow.now(), request.reason))

    @request_cancel.validator
    def _judge_cancel(self, request: CancelSignal) -> None:
        self._judge(Cancel(workflow.now(), request.reason))

    @workflow.update
    async def request_reopen(self, request: ReopenSignal) -> RollbackState:
        return await self._take(lambda: Reopen(workflow.now()))

    @request_reopen.validator
    def _judge_reopen(self, request: ReopenSignal) -> None:
        self._judge(Reopen(workflow.now()))

    def _judge(self, control: Cancel | Reopen) -> None:
        if self._state is not None and (refusal := control_refusal(self._state, control)):
            raise ApplicationError(refusal, type=CONTROL_REFUSED, non_retryable=True)

    async def _take(self, control: Callable[[], Cancel | Reopen]) -> RollbackState:
        """Judge ``control`` once the run has decided its start, and take it once its acceptance
        is in the history (a timer's round trip; judged again then, on the state it finds). A
        control decided in the task that accepts it acts there (its record is a local
        activity), and a lost task (its worker killed) would lose the Update while the record
        it wrote stays on the owner; a signal, in the history as it arrives, is decided again."""
        await workflow.wait_condition(lambda: self._state is not None)
        self._judge(control())
        await workflow.sleep(UPDATE_RECORDED, summary="control accepted: take it")
        taken = control()
        self._judge(taken)
        self._pending.append(taken)
        return self.state

    @workflow.query
    def status(self) -> RollbackState | None:
        return self._state

    @workflow.query
    def held(self) -> Pause | None:
        """The pause a step of this run waits on now (None: none)."""
        return self._held_by

    # --- run ---------------------------------------------------------------------------------

    @workflow.run
    async def run(self, input: RollbackInput) -> RollbackResult:
        self._input = input
        self._shown = {p.key.name: p.value for p in workflow.info().typed_search_attributes}
        initial = input.resume or initial_state(input.owner, input.recommendation)
        try:
            await self._attempt(input, initial)
        except ActivityError as err:
            await self._abort(initial, err)
        await workflow.wait_condition(workflow.all_handlers_finished)
        self._start_next_run_if_signalled()
        state = self.state
        workflow.set_current_details(f"Ended: **{state.mode}** (turn {state.turn})")
        return RollbackResult(
            owner=state.owner,
            mode=state.mode,
            turn=state.turn,
            fingerprint=state.fingerprint,
            failure_reason=state.failure_reason,
            message=state.failure_message,
        )

    async def _attempt(self, input: RollbackInput, initial: RollbackState) -> None:
        if input.resume is not None:
            self._state = input.resume
        else:
            # The status query answers None until the start has been decided.
            loaded = await self._activity(
                LOAD_OWNER,
                LoadOwnerInput(
                    cluster=input.cluster,
                    owner=input.owner,
                    policy=input.policy,
                    recommendation=input.recommendation,
                ),
                LoadOwnerResult,
                summary=f"read {input.owner} state and policy",
            )
            if loaded.state is not None and loaded.state.run_id == workflow.info().run_id:
                # A task of this run recorded that transition and was lost before it completed,
                # with the notification it was to start: start it now (the same child).
                await self._announce(loaded.state, loaded.state.failure_message or "")
            started = AttemptStarted(
                workflow.now(), loaded, input.trigger, input.observed_pod_created_at,
                input.adopted_at,
            )  # fmt: skip
            await self._step(initial, started)
            self._pending = news_after_start(self._pending, initial.fingerprint, input.trigger)
        while not self.state.mode.terminal:
            await self._drain_signals()
            self._maybe_continue_as_new()
            if self.state.mode is Mode.MONITORING:
                await self._monitor_step()
            elif self.state.mode is Mode.BACKING_OFF:
                await self._backoff_step()

    async def _abort(self, initial: RollbackState, err: ActivityError) -> None:
        """An activity failed for good (a permanent error, or its retry budget ran out): the
        attempt ends ``aborted`` with the reason, as far as the cluster can still be told."""
        reason, message = _failure(err)
        workflow.logger.warning("%s: attempt aborted (%s): %s", initial.owner, reason, message)
        try:
            await self._step(self._state or initial, Aborted(workflow.now(), reason, message))
        except ActivityError as again:  # the abort itself cannot be recorded: end regardless
            workflow.logger.error("%s: abort not recorded: %s", initial.owner, again.cause)
            self._state = (self._state or initial).model_copy(
                update={"mode": Mode.ABORTED, "failure_reason": reason, "failure_message": message}
            )

    @property
    def state(self) -> RollbackState:
        assert self._state is not None
        return self._state

    @property
    def cluster(self) -> str:
        assert self._input is not None
        return self._input.cluster

    async def _drain_signals(self) -> None:
        while self._pending and not self.state.mode.terminal:
            await self._step(self.state, self._pending.pop(0))

    async def _step(self, state: RollbackState, obs: Observation) -> None:
        """decide -> carry out; an effect's result is the next observation, until none is left."""
        follow: Observation | None = obs
        while follow is not None:
            follow = await self._apply(decide(state, follow))
            state = self.state

    def _start_next_run_if_signalled(self) -> None:
        """A signal that arrived as the run ended starts the next run instead of being lost,
        when the wake rule (``workflows.wake``) says it wakes the owner."""
        assert self._input is not None
        state = self.state
        for obs in self._pending:
            adopted_at = None
            if isinstance(obs, Observed):
                sighting = Sighting(
                    obs.recommendation.fingerprint, Trigger.OBSERVE, obs.pod_created_at
                )
                recommendation, adopted_at = obs.recommendation, obs.adopted_at
            elif isinstance(obs, Reopen):
                sighting = Sighting(state.fingerprint, Trigger.REOPEN)
                recommendation = state.recommendation
            else:
                continue
            if state.wake(sighting).wakes:
                self._new_attempt(
                    recommendation=recommendation,
                    trigger=sighting.trigger,
                    observed_pod_created_at=sighting.pod_created_at,
                    adopted_at=adopted_at,
                )

    def _new_attempt(self, **changes: Any) -> NoReturn:
        """Continue-as-new onto a new attempt, on the current version: its start reads the owner
        and resolves the policy afresh (a policy the first start carried was that attempt's)."""
        assert self._input is not None
        workflow.continue_as_new(
            self._input.model_copy(update={**changes, "resume": None, "policy": None}),
            initial_versioning_behavior=NEW_ATTEMPT,
        )

    async def _wait(self, until: datetime, summary: str) -> None:
        """Sleep on a durable timer until ``until``, waking early for a signal."""
        remaining = until - workflow.now()
        if remaining > timedelta(0):
            with suppress(TimeoutError):  # the timer fired: time to act
                await workflow.wait_condition(
                    lambda: bool(self._pending), timeout=remaining, timeout_summary=summary
                )

    async def _monitor_step(self) -> None:
        state = self.state
        assert state.window_ends_at is not None and state.next_sample_at is not None
        due = min(state.next_sample_at, state.window_ends_at)
        if workflow.now() < due:
            final = due >= state.window_ends_at
            workflow.set_current_details(self._details())
            await self._wait(due, "window ends" if final else "next cohort sample")
            return
        resumes = self._resumes
        final = workflow.now() >= state.window_ends_at
        # An early verdict's confirmation decides too: it reads the pause, as the end's does.
        sampled = await self._sample(final, verdict=final or state.early_since is not None)
        if isinstance(sampled, Sampled) and (pause := sampled.sample.paused) is not None:
            await self._held(PauseSeen(workflow.now(), Step.VERDICT, pause, resumes))
        elif isinstance(sampled, Sampled) and health_due(state, sampled.sample, sampled.now):
            health = await self._check_health(state)
            if health is not None:  # else held: the verdict is taken again, sampled afresh
                await self._step(state, dataclasses.replace(sampled, health=health))
        else:
            await self._step(state, sampled)
        self._samples_this_run += 1
        self._maybe_continue_as_new()

    def _control_pending(self) -> bool:
        """A signal that ends a hold: any but an early verdict's ``suspect`` (a held step is
        taken again, sampled afresh, when its hold ends anyway)."""
        return any(not isinstance(o, Suspected) for o in self._pending)

    def _cancel_pending(self) -> bool:
        return any(isinstance(o, Cancel) for o in self._pending)

    async def _held(self, seen: PauseSeen) -> bool:
        """A step found a pause: carry out the hold the machine decides (``machine.HOLDS``).
        True when a cancel ended it and the step is given up (it writes nothing)."""
        given_up = False
        for effect in decide(self.state, seen).effects:
            if isinstance(effect, Hold):
                given_up = await self._hold(effect)
        return given_up

    async def _hold(self, hold: Hold) -> bool:
        """Wait, durably, until ``hold.until`` or what ends it (``hold.ends``): a ``resume``
        counted since the step read the pause (one that came while that read's answer was on
        its way wakes it at once, as one after it does), any control signal, or a cancel.
        True when the held step is given up (``Hold.gives_up``)."""
        self._held_by = hold.pause
        self._holds += 1
        resumes = hold.after_resumes
        workflow.set_current_details(f"**Held**: the {hold.label} waits, {hold.pause.describe()}")
        # Once per hold, not once per look again.
        self._show([SA_HELD.value_set(f"{hold.label}: {hold.pause.describe()}"[:HELD_SHOWN_CHARS])])
        with suppress(TimeoutError):
            await workflow.wait_condition(
                lambda: (
                    self._resumes > resumes
                    or (HoldEnds.CONTROL in hold.ends and self._control_pending())
                    or (HoldEnds.CANCEL in hold.ends and self._cancel_pending())
                ),
                timeout=hold.until - workflow.now(),
                timeout_summary="pause ends, or look again",
            )
        self._held_by = None
        return hold.gives_up(self._cancel_pending())

    async def _check_health(self, state: RollbackState) -> HealthResult | None:
        """The policy's health checks at the window's end; when Prometheus cannot answer within
        its retries, what ``onPrometheusError`` says: a result that passes or fails the verdict,
        or (hold) None after a Warning Event and a wait of ``HEALTH_RECHECK``."""
        checks = state.policy.health_checks if state.policy else None
        assert checks is not None and state.window_started_at and state.window_ends_at
        request = HealthInput(
            cluster=self.cluster,
            owner=state.owner,
            checks=checks,
            window_started_at=state.window_started_at,
            window_ends_at=state.window_ends_at,
            cohort=state.last_sample.cohort if state.last_sample else None,
            baseline_at=baseline_at(state),
        )
        try:
            return await self._activity(
                CHECK_HEALTH,
                request,
                HealthResult,
                summary=f"health checks of {state.fingerprint} at the window's end",
                retry=HEALTH_RETRY,
            )
        except ActivityError as err:
            why = str(err.cause or err)
            configured = not (
                isinstance(err.cause, ApplicationError)
                and err.cause.type == PROMETHEUS_NOT_CONFIGURED
            )
        taken = health_unavailable(checks, why, configured, state.window_ends_at, workflow.now())
        if taken is not None:
            return taken
        self._health_holds += 1
        hold = health_hold(state, why, workflow.now())
        await self._record(
            Record(EventReason.HEALTH_UNAVAILABLE, hold.message, warning=True),
            # One Event for the hold, its count the looks so far (as the recorder aggregates).
            event_id=f"{workflow.info().run_id}.{state.transitions}.health",
            event_count=self._health_holds,
        )
        workflow.set_current_details(f"**Held**: the verdict waits for Prometheus: {why}")
        await self._wait(workflow.now() + hold.recheck, "ask Prometheus again")
        return None

    async def _sample(self, final: bool, verdict: bool) -> Sampled | SampleFailed:
        """``final``: the window's end (retried until it answers, or the attempt aborts);
        ``verdict``: a sample that may decide, which reads the pause in force."""
        state = self.state
        assert state.window_started_at is not None
        checks = state.policy.health_checks if state.policy else None
        request = SampleCohortInput(
            cluster=self.cluster,
            owner=state.owner,
            recommendation=state.recommendation,
            window_started_at=state.window_started_at,
            cohort=state.last_sample.cohort if state.last_sample else None,
            final=verdict,
            releases=verdict and state.template is not None,
            autoscaler=bool(checks and checks.autoscaler),
            baseline=state.baseline,
        )
        what = (
            "final sample: evaluate adoption" if final
            else "early verdict: confirm the certain failures" if verdict
            else "sample cohort health"
        )  # fmt: skip
        try:
            sample = await self._activity(
                SAMPLE_COHORT,
                request,
                CohortSample,
                summary=f"{what} of {state.fingerprint}",
                retry=K8S_RETRY if final else OPENING_SAMPLE_RETRY,
            )
        except ActivityError as err:
            permanent = isinstance(err.cause, ApplicationError) and err.cause.non_retryable
            if final or permanent:
                raise  # the attempt ends aborted (see run)
            return SampleFailed(workflow.now(), str(err.cause or err))
        return Sampled(workflow.now(), sample)

    async def _backoff_step(self) -> None:
        state = self.state
        assert state.backoff_ends_at is not None
        if workflow.now() < state.backoff_ends_at:
            workflow.set_current_details(self._details())
            await self._wait(state.backoff_ends_at, f"backoff of turn {state.turn}")
            return
        resumes = self._resumes
        # Replay-safe without a patch: a result recorded before carries no pause.
        resolution = await self._activity(
            RESOLVE_POLICY,
            ResolvePolicyInput(
                cluster=self.cluster, owner=state.owner, attempt=state.fingerprint, turn=state.turn
            ),
            ResolvePolicyResult,
            summary="re-resolve the policy at the turn boundary",
        )
        if (pause := resolution.paused) is not None:  # its end clears the rollback: not now
            await self._held(PauseSeen(workflow.now(), Step.BACKOFF_END, pause, resumes))
            return  # the loop takes a cancel or a new recommendation, or looks again
        await self._step(state, BackoffOver(workflow.now(), resolution))

    def _maybe_continue_as_new(self) -> None:
        assert self._input is not None
        if self._pending or self.state.mode is not Mode.MONITORING:
            return
        info, limits = workflow.info(), self._input
        if (
            info.is_continue_as_new_suggested()
            or info.get_current_history_length() >= limits.max_history_events
            or self._samples_this_run >= limits.max_samples_per_run
        ):
            workflow.continue_as_new(self._input.model_copy(update={"resume": self.state}))

    # --- effects -----------------------------------------------------------------------------

    async def _apply(self, decision: Decision) -> Observation | None:
        """Carry out ``decision``; an actuation's result comes back as the next observation."""
        before = self._state
        self._state = decision.state
        if decision.note:
            workflow.logger.info("%s: %s", self.state.owner, decision.note)
        # What the UI and `get` show moves with every decided state, including a run's first
        # (a run that ends at once, its sighting waking nothing, shows the mode it kept).
        shown = before is None or (before.mode, before.turn, before.transitions) != (
            self.state.mode,
            self.state.turn,
            self.state.transitions,
        )
        # A transition happened only when the machine made one (``transitions`` counts them):
        # not when a run that wakes nothing ends in the mode it found.
        transitioned = self.state.transitions > (before.transitions if before else 0)
        if shown:
            # (a step that was held has gone ahead: this state is what came of it)
            self._show([*search_attributes(self.state, self.cluster), SA_HELD.value_unset()])
        if transitioned:
            self._count_transition()
        follow: Observation | None = None
        for effect in decision.effects:
            match effect:
                case Record():
                    if not await self._record(effect):
                        self._record_given_up(before)
                        return None
                case RollBack() | Reapply():
                    follow = await self._actuation(effect)
                case StartOver():
                    self._new_attempt(
                        recommendation=effect.recommendation,
                        trigger=Trigger.OBSERVE,
                        adopted_at=effect.adopted_at,
                    )
        if transitioned:
            await self._notify(decision)
        return follow

    async def _actuation(self, effect: RollBack | Reapply) -> Observation | None:
        """A rollback or re-apply carried out (an observe-only one reports what it would have
        done): its result, the next observation; None when a cancel gave it up while held."""
        if effect.observe_only:
            if isinstance(effect, RollBack):
                return RolledBack(workflow.now(), OBSERVE_ONLY_RESULT)
            return Reapplied(workflow.now(), OBSERVE_ONLY_RESULT)
        owner = self.state.owner
        if isinstance(effect, RollBack):
            request = RollBackInput(
                cluster=self.cluster, owner=owner, target=effect.target, resources=effect.resources
            )
            result = await self._actuate(ROLL_BACK, request, f"roll back to {effect.target}")
            return None if result is None else RolledBack(workflow.now(), result)
        reapply = ReapplyInput(
            cluster=self.cluster, owner=owner, recommendation=effect.recommendation
        )
        summary = f"re-apply {self.state.fingerprint} for the next turn"
        holds = self._holds
        result = await self._actuate(REAPPLY_RECOMMENDATION, reapply, summary)
        if result is None:
            return None
        return Reapplied(workflow.now(), result, held=self._holds > holds)

    async def _actuate(
        self, name: str, request: RollBackInput | ReapplyInput, summary: str
    ) -> ActuationResult | None:
        """A rollback or re-apply; while a pause holds it (the activity wrote nothing more),
        wait and try again; None: a cancel came while it was held or stopped it between pods,
        and the step is given up (the cancel writes nothing that acts)."""
        while True:
            resumes = self._resumes
            try:
                result = await self._activity(name, request, ActuationResult, summary=summary)
            except ActivityError as err:
                if isinstance(err.cause, CancelledError) and self._cancel_pending():
                    return None  # a cancel stopped it between pods: taken next (see run)
                raise
            if result.paused is None:
                return result
            step = Step.ROLLBACK if name == ROLL_BACK else Step.REAPPLY
            seen = PauseSeen(workflow.now(), step, result.paused, resumes)
            if await self._held(seen):
                return None

    def _show(self, updates: list[SearchAttributeUpdate[Any]]) -> None:
        """Upsert the attributes whose value differs from what the run shows: a state that its
        start already named (the intake sets them with it) costs no upsert."""
        changed = [u for u in updates if self._shown.get(u.key.name) != u.value]
        if changed:
            workflow.upsert_search_attributes(changed)
            self._shown.update({u.key.name: u.value for u in changed})

    async def _notify(self, decision: Decision) -> None:
        """A transition that matters is announced, with its Event's message."""
        state = self.state
        if severity_of(state.mode) is None:
            return
        message = next(
            (e.message for e in decision.effects if isinstance(e, Record)),
            state.failure_message or "",
        )
        await self._announce(state.owner_state(), message)

    async def _announce(self, state: OwnerState, message: str) -> None:
        """Start a ``NotifyWorkflow`` child (``workflows.notify``) for the transition into
        ``state``, abandoned when this run closes: the rollback waits for its start only."""
        assert self._input is not None
        info, owner = workflow.info(), self._input.owner
        notification = Notification.of(
            cluster=self.cluster,
            owner=owner,
            mode=state.mode,
            turn=state.turn,
            fingerprint=state.active_recommendation_fingerprint,
            reason=state.failure_reason,
            message=message,
            policy=state.policy,
            time=state.last_transition_time,
            workflow_id=info.workflow_id,
            run_id=info.run_id,
            transitions=state.transitions or 0,
        )
        if notification is None:
            return
        # Named after its owner and transition, with the owner's search attributes: the UI lists
        # it readably and a filter on a workload finds it.
        attributes = TypedSearchAttributes(
            [
                SearchAttributePair(SA_CLUSTER, self.cluster),
                SearchAttributePair(SA_NAMESPACE, owner.namespace),
                SearchAttributePair(SA_WORKLOAD, owner.workload),
                SearchAttributePair(SA_FINGERPRINT, notification.fingerprint),
            ]
        )
        with suppress(WorkflowAlreadyStartedError):  # this transition is being notified already
            await workflow.start_child_workflow(
                NotifyWorkflow.run,
                notification,
                id=notification.workflow_id_for_child(),
                search_attributes=attributes,
                task_queue=info.task_queue,
                parent_close_policy=workflow.ParentClosePolicy.ABANDON,
                static_summary=f"Notify {owner}: {state.mode} (turn {state.turn})",
            )

    def _count_transition(self) -> None:
        """Metrics (the SDK skips them during replay): transitions, rollbacks, ended runs."""
        state, meter = self.state, workflow.metric_meter()
        meter.create_counter("rollback_transitions", "transitions by mode").add(
            1, {"mode": state.mode.value}
        )
        if state.mode is Mode.ROLLING_BACK:
            meter.create_counter("rollback_rollbacks", "rollbacks started by reason").add(
                1, {"reason": str(state.failure_reason)}
            )
        if state.mode.terminal:
            meter.create_counter("rollback_attempts", "runs ended by outcome and reason").add(
                1, {"outcome": state.mode.value, "reason": str(state.failure_reason or "none")}
            )
        opened = state.window_started_at
        if opened is not None and state.mode in VERDICTS:
            meter.create_histogram_timedelta(
                "rollback_time_to_verdict", "from a window opening to its verdict", "duration"
            ).record(workflow.now() - opened, {"verdict": state.mode.value})

    def _record_given_up(self, before: RollbackState | None) -> None:
        """A cancel ended a record's hold: nothing was written, so the owner shows what it
        showed before that decision, and the cancel is decided on it (it takes the cut off no
        less: a published rollback stays). The run's first record (a start or a reopen over
        what the last attempt left) has nothing before it: the attempt ends cancelled with
        nothing written, the owner keeping that attempt's state (failedPermanent stays)."""
        if before is not None:
            self._state = before
        else:
            cancel = next(o for o in self._pending if isinstance(o, Cancel))
            self._pending.remove(cancel)
            self._state = decide(self.state, cancel).state
            workflow.logger.info("%s: cancelled before its first record", self.state.owner)
        self._show([*search_attributes(self.state, self.cluster), SA_HELD.value_unset()])

    async def _record(
        self, effect: Record, event_id: str | None = None, event_count: int = 1
    ) -> bool:
        """Write ``effect`` (the decided state, its Event); while a pause holds it, wait and
        write it again. False: a cancel ended the hold and nothing was written."""
        state = self.state
        workflow.logger.info(
            "%s: %s turn %d: %s",
            state.owner,
            state.mode,
            state.turn,
            effect.message,
            extra={"owner": str(state.owner), "fingerprint": state.fingerprint},
        )
        while True:
            resumes = self._resumes
            recorded = await self._activity(
                RECORD_TRANSITION,
                RecordTransitionInput(
                    cluster=self.cluster,
                    owner=state.owner,
                    state=None
                    if effect.remove_state
                    else state.owner_state().model_copy(update={"run_id": workflow.info().run_id}),
                    event_reason=effect.event_reason,
                    event_message=effect.message,
                    event_type="Warning" if effect.warning else "Normal",
                    # The mode too: a task lost after its record and run again on a fresh look
                    # may decide another transition, whose Event is not the lost one's.
                    event_id=event_id
                    or f"{workflow.info().run_id}.{state.transitions}.{state.mode}"
                    + (f".{effect.identity}" if effect.identity else ""),
                    event_count=event_count,
                    clear_rollback_recommendation=effect.clear_rollback_recommendation,
                    brings_back=effect.brings_back,
                ),
                RecordTransitionResult,
                summary=f"record {state.mode} (turn {state.turn})",
            )
            if recorded.paused is None:
                return True
            # It would clear a published rollback under a pause (set since the step read it):
            # nothing was written; the same record once the pause lifts, none if a cancel came.
            if await self._held(PauseSeen(workflow.now(), Step.RECORD, recorded.paused, resumes)):
                return False

    async def _activity(
        self,
        name: str,
        arg: object,
        result_type: type[R],
        *,
        summary: str,
        retry: RetryPolicy = K8S_RETRY,
    ) -> R:
        assert self._input is not None
        if name in LOCAL and self.local_activities:
            try:
                local: R = await workflow.execute_local_activity(
                    name,
                    arg,
                    result_type=result_type,
                    start_to_close_timeout=ACTIVITY_TIMEOUT,
                    schedule_to_close_timeout=min(LOCAL_BUDGET, self._input.retry_budget),
                    retry_policy=LOCAL_RETRY if retry is K8S_RETRY else retry,
                    summary=summary,
                )
                return local
            except FailureError as err:
                # A local activity's failure comes unwrapped (an ApplicationError, a
                # TimeoutError); the rest of the workflow handles ActivityError alone.
                cause = err.cause if isinstance(err, ActivityError) else err
                if isinstance(cause, ApplicationError) and (
                    cause.non_retryable or cause.type in NON_RETRYABLE_ERRORS
                ):
                    raise _activity_error(name) from cause
                workflow.logger.warning(
                    "%s: %s kept failing locally (%s); retrying it as a regular activity",
                    self._input.owner,
                    name,
                    cause,
                )
        paced = name in ACTUATIONS
        handle = workflow.start_activity(
            name,
            arg,
            result_type=result_type,
            start_to_close_timeout=ACTUATION_TIMEOUT if paced else ACTIVITY_TIMEOUT,
            heartbeat_timeout=ACTUATION_HEARTBEAT if paced else None,
            schedule_to_close_timeout=self._input.retry_budget
            + (ACTUATION_TIMEOUT if paced else timedelta(0)),
            retry_policy=retry,
            summary=summary,
            cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
        )
        if paced:
            # A cancel stops a rollback or re-apply between pods: the activity hears it at its
            # next heartbeat (raised in its thread) and this waits until it has stopped; the
            # caller gives the step up (``_actuate``).
            await workflow.wait_condition(lambda: handle.done() or self._cancel_pending())
            if not handle.done():
                handle.cancel()
        result: R = await handle
        return result

    def _details(self) -> str:
        """Markdown for the UI's "current details": what the run waits for, and why."""
        s = self.state
        policy = s.policy.ref if s.policy else "-"
        lines = [f"**{s.mode}** turn {s.turn} of `{s.fingerprint}` under `{policy}`"]
        if s.mode is Mode.MONITORING and s.release is not None and s.window_ends_at:
            lines.append(
                f"a release during the window ({s.release}): the verdict waits for it to roll"
                f" out, looking again {s.window_ends_at.isoformat()}"
            )
        elif s.mode is Mode.MONITORING and s.window_ends_at:
            lines.append(f"window ends {s.window_ends_at.isoformat()}")
            if s.last_sample is not None:
                lines.append(
                    f"last sample: {s.last_sample.adopted_healthy}/{s.baseline} adopted and healthy"
                    f" (required {s.required}); {s.last_sample.message or 'all healthy'}"
                )
        if s.mode is Mode.BACKING_OFF and s.backoff_ends_at:
            lines.append(
                f"backing off until {s.backoff_ends_at.isoformat()} after {s.failure_reason}:"
                f" {s.failure_message}"
            )
        return "\n\n".join(lines)
