"""An in-memory stand-in for the Kubernetes activities, registered under the same names.

Workflow tests need a cluster that behaves (pods OOM when their memory is below the app's
working set, some pods ignore resizes) without the Kubernetes stack. This is our own boundary:
the real activities are tested separately through the real client over HTTP.

Every effective change is journalled so tests can assert that nothing was applied twice.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import UTC, datetime

from temporalio import activity

from workflows.activity_api import (
    CHECK_HEALTH,
    LOAD_OWNER,
    REAPPLY_RECOMMENDATION,
    RECORD_TRANSITION,
    RESOLVE_POLICY,
    ROLL_BACK,
    SAMPLE_COHORT,
    ActuationResult,
    Certain,
    CohortSample,
    HealthInput,
    HealthResult,
    LoadOwnerInput,
    LoadOwnerResult,
    PolicySettings,
    ReapplyInput,
    RecordTransitionInput,
    RecordTransitionResult,
    ResolvePolicyInput,
    ResolvePolicyResult,
    RollBackInput,
    SampleCohortInput,
)
from workflows.contract import FailureReason, RollbackTarget
from workflows.fingerprint import Recommendation, Resources
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
from workflows.quantities import parse_quantity
from workflows.state import Autoscaler, OwnerState, ResourceSnapshot, Template


@dataclass
class FakePod:
    name: str
    requests: Resources
    recommendation: Recommendation | None = None
    ignores_resize: bool = False


@dataclass
class FakeOwner:
    policy: PolicySettings | None
    replicas: int = 5
    manifest: Resources = field(default_factory=lambda: {"app": {"memory": "1Gi"}})
    working_set: str = "512Mi"  # pods with less memory than this are OOMKilled
    crashing: bool = False  # every pod crash-loops whatever its resources (a bad image's)
    exists: bool = True
    state_json: str | None = None
    rollback_annotation: Resources | None = None
    events: dict[str, tuple[str, str, str]] = field(default_factory=dict)
    journal: list[tuple[str, str]] = field(default_factory=list)
    pods: list[FakePod] = field(default_factory=list)
    paused: Pause | None = None  # a pause in force: rollbacks and re-applies write nothing
    # Activity name -> an Event that activity waits for before it answers (load_owner, a held
    # roll_back): a test lands a signal or a query while a read's answer is on its way.
    gates: dict[str, asyncio.Event] = field(default_factory=dict)
    # What check_health answers, in order (the last one again once they run out): a result, or
    # an exception (Prometheus unreachable) to raise.
    health: list[HealthResult | Exception] = field(default_factory=list)
    health_asked: list[HealthInput] = field(default_factory=list)  # what check_health was asked
    event_counts: dict[str, int] = field(default_factory=dict)  # an Event series' count, by id
    # Its neighbours as the real reads report them: its pod template (a release changes it),
    # whether its rollout is complete, and the HPA that scales it.
    template: Template | None = None
    rolled_out: bool = True
    hpa: Autoscaler | None = None

    def __post_init__(self) -> None:
        if not self.pods:
            self.pods = [
                FakePod(f"pod-{i}", {c: dict(r) for c, r in self.manifest.items()})
                for i in range(self.replicas)
            ]

    @property
    def state(self) -> OwnerState | None:
        return OwnerState.model_validate_json(self.state_json) if self.state_json else None

    def apply(self, rec: Recommendation) -> None:
        """What an applier does: resize every pod that accepts it to the recommendation."""
        for pod in self.pods:
            if not pod.ignores_resize:
                pod.requests = _merged(pod.requests, rec.requests)
                pod.recommendation = rec

    def event_reasons(self) -> list[str]:
        return [reason for reason, _, _ in self.events.values()]


def _merged(current: Resources, wanted: Resources) -> Resources:
    out = {c: dict(r) for c, r in current.items()}
    for container, resources in wanted.items():
        out.setdefault(container, {}).update(resources)
    return out


class FakeCluster:
    def __init__(self) -> None:
        self.owners: dict[str, FakeOwner] = {}
        self.calls: dict[str, int] = {}
        self.notified: list[Notification] = []  # what one receiver, "fake", was sent
        self.reported: list[ReportInput] = []  # failures the NotifyWorkflow reported

    def _owner(self, key: object) -> FakeOwner | None:
        owner = self.owners.get(str(key))
        return owner if owner is not None and owner.exists else None

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    @activity.defn(name=LOAD_OWNER)
    async def load_owner(self, input: LoadOwnerInput) -> LoadOwnerResult:
        self._count(LOAD_OWNER)
        owner = self._owner(input.owner)
        if owner is None:
            return LoadOwnerResult(exists=False)
        if LOAD_OWNER in owner.gates:
            await owner.gates.pop(LOAD_OWNER).wait()
        policy = input.policy or owner.policy  # as the real one: the starter's, carried
        checks = policy.health_checks if policy else None
        return LoadOwnerResult(
            exists=True,
            state=owner.state,
            policy=policy,
            desired=owner.replicas,
            template=owner.template,
            autoscaler=owner.hpa if checks and checks.autoscaler else None,
        )

    @activity.defn(name=RESOLVE_POLICY)
    async def resolve_policy(self, input: ResolvePolicyInput) -> ResolvePolicyResult:
        self._count(RESOLVE_POLICY)
        owner = self._owner(input.owner)
        return ResolvePolicyResult(exists=owner is not None, policy=owner.policy if owner else None)

    @activity.defn(name=CHECK_HEALTH)
    async def check_health(self, input: HealthInput) -> HealthResult:
        self._count(CHECK_HEALTH)
        owner = self._owner(input.owner)
        assert owner is not None and owner.health, "check_health asked of an owner with no answer"
        answer = owner.health.pop(0) if len(owner.health) > 1 else owner.health[0]
        owner.health_asked.append(input)
        owner.journal.append(("health", type(answer).__name__))
        if isinstance(answer, Exception):
            raise answer
        return answer

    @activity.defn(name=SAMPLE_COHORT)
    async def sample_cohort(self, input: SampleCohortInput) -> CohortSample:
        self._count(SAMPLE_COHORT)
        owner = self._owner(input.owner)
        if owner is None:
            return CohortSample(exists=False, desired=0, pods=0, adopted=0, adopted_healthy=0)
        rec = input.recommendation
        adopted = [
            p
            for p in owner.pods
            if p.recommendation is not None
            and p.recommendation.fingerprint == rec.fingerprint
            and rec.equals_resources(p.requests, {})
        ]
        need = parse_quantity(owner.working_set)
        oom = [p for p in owner.pods if parse_quantity(p.requests["app"]["memory"]) < need]
        healthy_adopted = [p for p in adopted if p not in oom and not owner.crashing]
        unhealthy = {FailureReason.OOM_KILLED: len(oom)} if oom else {}
        message = f"{len(oom)}/{len(owner.pods)} pods OOMKilled (app)" if oom else ""
        if owner.crashing and not oom:
            unhealthy = {FailureReason.CRASH_LOOP_BACK_OFF: len(owner.pods)}
            message = f"{len(owner.pods)}/{len(owner.pods)} pods CrashLoopBackOff (app)"
        return CohortSample(
            desired=owner.replicas,
            pods=len(owner.pods),
            adopted=len(adopted),
            adopted_healthy=len(healthy_adopted),
            unhealthy=unhealthy,
            failing=unhealthy,  # an OOM-killed pod of the fake never gets Ready again
            # and the kubelet restarts it once per look: each look sees its restarts risen
            certain={
                p.name: Certain(reason=FailureReason.OOM_KILLED, restarts=self.calls[SAMPLE_COHORT])
                for p in oom
            },
            message=message,
            observed_at=datetime.now(UTC),
            template=owner.template,
            rolled_out=owner.rolled_out,
            autoscaler=owner.hpa if input.autoscaler else None,
        )

    @activity.defn(name=RECORD_TRANSITION)
    async def record_transition(self, input: RecordTransitionInput) -> RecordTransitionResult:
        self._count(RECORD_TRANSITION)
        owner = self._owner(input.owner)
        if owner is None:
            return RecordTransitionResult(exists=False)
        new_json = input.state.to_json() if input.state else None
        written = new_json != owner.state_json
        if written:
            owner.state_json = new_json
            owner.journal.append(("state", input.state.mode if input.state else "removed"))
        if input.clear_rollback_recommendation and owner.rollback_annotation is not None:
            owner.rollback_annotation = None
            owner.journal.append(("clear-rollback", ""))
        emitted = False
        if input.event_reason and (input.event_id not in owner.events or input.event_count > 1):
            owner.events[input.event_id] = (
                input.event_reason,
                input.event_message,
                input.event_type,
            )
            owner.event_counts[input.event_id] = input.event_count
            emitted = True
        return RecordTransitionResult(state_written=written, event_emitted=emitted)

    @activity.defn(name=ROLL_BACK)
    async def roll_back(self, input: RollBackInput) -> ActuationResult:
        self._count(ROLL_BACK)
        owner = self._owner(input.owner)
        if owner is None:
            return ActuationResult(exists=False)
        if owner.paused is not None:
            owner.journal.append(("held", "rollback"))
            paused = owner.paused
            if ROLL_BACK in owner.gates:
                await owner.gates.pop(ROLL_BACK).wait()
            return ActuationResult(paused=paused)
        if input.target is RollbackTarget.MANIFEST:
            snapshot = ResourceSnapshot.of(owner.manifest, {})
        else:
            assert input.resources is not None
            snapshot = input.resources
        target = snapshot.requests()
        if owner.rollback_annotation != target:
            owner.rollback_annotation = target
            owner.journal.append(("rollback", input.target))
        for pod in owner.pods:
            pod.requests = _merged(pod.requests, target)
            pod.recommendation = None
        return ActuationResult(
            applied=snapshot,
            pods_resized=len(owner.pods),
            message=f"{len(owner.pods)} pods resized to {input.target}",
        )

    @activity.defn(name=ROUTE_NOTIFICATION)
    async def route_notification(self, input: Notification) -> RouteResult:
        return RouteResult(receivers=["fake"])

    @activity.defn(name=SEND_NOTIFICATION)
    async def send_notification(self, input: SendInput) -> SendResult:
        self.notified.append(input.notification)
        return SendResult(receiver=input.receiver, delivered=True)

    @activity.defn(name=REPORT_NOTIFICATION_FAILURE)
    async def report_notification_failure(self, input: ReportInput) -> None:
        self.reported.append(input)

    @activity.defn(name=REAPPLY_RECOMMENDATION)
    async def reapply_recommendation(self, input: ReapplyInput) -> ActuationResult:
        self._count(REAPPLY_RECOMMENDATION)
        owner = self._owner(input.owner)
        if owner is None:
            return ActuationResult(exists=False)
        if owner.paused is not None:
            owner.journal.append(("held", "reapply"))
            return ActuationResult(paused=owner.paused)
        if any(
            p.recommendation != input.recommendation for p in owner.pods if not p.ignores_resize
        ):
            owner.journal.append(("reapply", input.recommendation.fingerprint))
        owner.apply(input.recommendation)
        return ActuationResult(pods_resized=len(owner.pods))
