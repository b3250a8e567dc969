"""The activity interface of ``RollbackWorkflow``: names, typed inputs and results.

The workflow calls activities by these names only; ``activities.kubernetes`` implements them
against a cluster, the workflow tests register their own implementation of the same names. One
input and one result model per activity, pydantic throughout.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import ConfigDict, Field

from workflows.contract import EventReason, FailureReason, RollbackTarget, WorkloadKind
from workflows.fingerprint import Recommendation
from workflows.pause import Pause
from workflows.policy import AnyPolicy, HealthChecks, PolicyBehaviour
from workflows.state import (
    Autoscaler,
    CamelModel,
    OwnerState,
    PolicyRef,
    ResourceSnapshot,
    Template,
)


class OwnerRef(CamelModel):
    """The workload owner: rollback state and events live on it."""

    namespace: str
    kind: WorkloadKind
    name: str

    @property
    def workload(self) -> str:
        return f"{self.kind}/{self.name}"

    def __str__(self) -> str:
        return f"{self.namespace}/{self.kind}/{self.name}"


ROLLBACK_ID_PREFIX = "rollback"


def rollback_id(cluster: str, owner: OwnerRef) -> str:
    """``rollback/<cluster>/<namespace>/<Kind>/<name>``: one workflow per owner per cluster,
    readable in the UI; two clusters that run the same workload names never share one. A run
    started before clusters had names (0.1) has no cluster segment (docs/operating/upgrade.md)."""
    where = f"{cluster}/" if cluster else ""
    return f"{ROLLBACK_ID_PREFIX}/{where}{owner.namespace}/{owner.kind}/{owner.name}"


def parse_rollback_id(workflow_id: str) -> tuple[str, OwnerRef] | None:
    """``(cluster, owner)`` of a ``rollback_id`` (cluster "" for a 0.1 run), None for any other."""
    parts = workflow_id.split("/")
    if parts[0] != ROLLBACK_ID_PREFIX or len(parts) not in (4, 5):
        return None
    cluster = parts[1] if len(parts) == 5 else ""
    namespace, kind, name = parts[-3:]
    try:
        return cluster, OwnerRef(namespace=namespace, kind=WorkloadKind(kind), name=name)
    except ValueError:
        return None


class OwnerInput(CamelModel):
    """What every activity of a rollback acts on: an owner in a named cluster. A worker runs an
    activity only for its own cluster (``activities.clusters``)."""

    cluster: str
    owner: OwnerRef


class PolicySettings(PolicyBehaviour):
    """The resolved policy as the workflow carries it: its identity and its behaviour fields."""

    model_config = ConfigDict(extra="ignore")  # a payload written by a newer version still loads

    ref: PolicyRef
    observe_only: bool = False  # the policy's observe-only annotation: decide, report, act not

    @classmethod
    def of(cls, policy: AnyPolicy) -> PolicySettings:
        spec = policy.spec
        fields = {name: getattr(spec, name) for name in PolicyBehaviour.model_fields}
        return cls(ref=PolicyRef.of(policy), observe_only=policy.observe_only, **fields)


# --- load_owner ------------------------------------------------------------------------------


class LoadOwnerInput(OwnerInput):
    """Read the owner's state and resolve its policy when an attempt starts, unless the
    attempt's starter resolved it (``policy``): it is taken as is."""

    policy: PolicySettings | None = None
    recommendation: Recommendation | None = None  # the attempt's: does it raise a request?


class LoadOwnerResult(CamelModel):
    """The owner's stored state and its policy, read when an attempt starts."""

    exists: bool
    state: OwnerState | None = None
    state_error: str | None = None  # the annotation was present but malformed
    policy: PolicySettings | None = None
    # The baseline when the window opens: desired replicas or the kind's equivalent (None: the
    # kind has none, the window's first sample counts the pods). Absent from runs recorded before.
    desired: int | None = Field(default=None, ge=0)
    # The window's other baselines: the pod template (a release is its change) and, under a
    # policy with the autoscaler check, the owner's HPA. Absent from runs recorded before.
    template: Template | None = None
    autoscaler: Autoscaler | None = None
    # Whether the recommendation raises a request above the template's (None: not read).
    raises_requests: bool | None = None


# --- resolve_policy (turn boundaries) --------------------------------------------------------


class ResolvePolicyInput(OwnerInput):
    """Resolve the owner's policy again at a turn boundary; with ``attempt`` (the fingerprint),
    also read the pause over the workload when a rollback recommendation is published, whose
    clearing at the turn's end would act (the gate, ahead of the decision)."""

    attempt: str | None = None
    turn: int | None = None  # the turn whose backoff ends (``machine.backoff_end``)


class ResolvePolicyResult(CamelModel):
    exists: bool = True
    policy: PolicySettings | None = None
    paused: Pause | None = None  # the turn's end waits: a pause holds what it would clear


# --- sample_cohort ---------------------------------------------------------------------------


class CohortQuery(CamelModel):
    """How to LIST the owner's pods in one call: a label selector in the owner's namespace,
    narrowed client-side to pods whose owning Job's name matches ``job_name_pattern`` (CronJob).
    Computed from the owner at the first sample of a window and carried by the workflow, so later
    samples are a single LIST with no GET of the owner."""

    label_selector: str
    job_name_pattern: str | None = None


class SampleCohortInput(OwnerInput):
    recommendation: Recommendation
    window_started_at: datetime
    cohort: CohortQuery | None = None  # None: read the owner first (first sample of a window)
    final: bool = False  # the verdict's: a pause in force is looked for and held on
    # Read the owner's pod template too (an early verdict's sample: a release during the
    # window); the final one and a window's first read the owner anyway.
    releases: bool = False
    # The policy's autoscaler check: the HPA is read when the window opens and at its end.
    autoscaler: bool = False
    # The window's baseline: at its end, an owner with fewer desired replicas is asked whether
    # an HPA scaled it in (``machine``: the cohort follows the HPA).
    baseline: int | None = None


class Certain(CamelModel):
    """A pod failing for certain now (``contract.CERTAIN_REASONS``, not Ready): why, and how
    many times the kubelet restarted its failing containers (their ``restartCount``s)."""

    reason: FailureReason
    restarts: int = Field(default=0, ge=0)
    # When its failing containers last exited (the kubelet's ``finishedAt``, whole seconds): a
    # later one is a crash since (the kubelet restarts a first crash at once, uncounted yet).
    exited_at: datetime | None = None
    # Its failing containers are not running now (waiting to start again, or terminated): with
    # a restart counted, a restarted instance has failed too.
    down: bool = False


class CohortSample(CamelModel):
    """One look at the cohort: counts, and the pods not counted by reason."""

    exists: bool = True
    desired: int | None = Field(
        default=None, ge=0, description="desired replicas (or the kind's equivalent) when read"
    )
    pods: int = Field(ge=0)
    adopted: int = Field(ge=0, description="pods carrying the fingerprint on actual resources")
    adopted_healthy: int = Field(ge=0)
    unhealthy: dict[FailureReason, int] = Field(default_factory=dict)
    # Of the unhealthy, the pods failing for certain now (``contract.CERTAIN_REASONS``, not
    # Ready): what the early verdict counts. Absent from samples recorded before it.
    failing: dict[FailureReason, int] = Field(default_factory=dict)
    # The same pods by name, with their restarts: the early verdict confirms these pods, not a
    # count (absent from samples recorded before).
    certain: dict[str, Certain] = Field(default_factory=dict)
    message: str = ""
    cohort: CohortQuery | None = None
    observed_at: datetime | None = None
    # An attempt's end on the pods (a sample recorded before ``left_out`` existed: a malformed
    # recommendation annotation); replayed as recorded.
    error: str | None = None
    # Pods left out of the cohort, by name, and why: their recommendation annotation cannot be
    # read (not counted as adopted: they count against the baseline like a pod that never came).
    left_out: dict[str, str] = Field(default_factory=dict)
    paused: Pause | None = None  # a verdict's sample: the pause in force, the verdict waits
    # Read with the owner (``SampleCohortInput``): its pod template, whether its rollout is
    # complete (``owners.rolled_out``), and its HPA.
    template: Template | None = None
    rolled_out: bool | None = None
    autoscaler: Autoscaler | None = None
    raises_requests: bool | None = None  # a window's opening read, as ``LoadOwnerResult``'s


# --- record_transition -----------------------------------------------------------------------


class RecordTransitionInput(OwnerInput):
    """Write the owner state and emit one Event, idempotently (``event_id`` names the Event)."""

    state: OwnerState | None  # None clears the annotation
    event_reason: EventReason | None = None
    event_message: str = ""
    event_type: str = "Normal"
    event_id: str = ""
    # >1: the Event named ``event_id`` is a series, set to this count when it exists already
    # (idempotent: a retry sets the same count), as the Kubernetes recorder aggregates.
    event_count: int = Field(default=1, ge=1)
    clear_rollback_recommendation: bool = False
    # The machine found it may let the cut run again (``machine.brings_back``): the writer reads
    # the owner and, by the same rule on what it reads, holds it as every such write is held.
    brings_back: bool = False


class RecordTransitionResult(CamelModel):
    exists: bool = True
    state_written: bool = False
    event_emitted: bool = False
    # A record that acts (it clears a published rollback recommendation, or brings the cut
    # back) wrote nothing: a pause, the kill switch or the breaker is in force; the step waits.
    paused: Pause | None = None


# --- roll_back / reapply ---------------------------------------------------------------------


class RollBackInput(OwnerInput):
    target: RollbackTarget
    # For lastSuccessful: the recorded resources. For manifest: None (the activity reads the
    # workload template).
    resources: ResourceSnapshot | None = None


class ActuationResult(CamelModel):
    exists: bool = True
    applied: ResourceSnapshot | None = None
    pods_resized: int = 0
    pods_filtered: list[str] = Field(default_factory=list)
    message: str = ""
    paused: Pause | None = None  # nothing was written: a pause is in force, the step waits


class ReapplyInput(OwnerInput):
    """Re-apply the recommendation for the next turn (in-place actuation resizes the pods)."""

    recommendation: Recommendation


# --- check_health ----------------------------------------------------------------------------


class HealthInput(OwnerInput):
    """The policy's health checks, asked of Prometheus at the window's end, over the cohort's
    pods by name (``cohort``: the verdict's LIST; None: read the owner first)."""

    checks: HealthChecks
    window_started_at: datetime
    window_ends_at: datetime
    cohort: CohortQuery | None = None
    # Where the baseline (a relative bound's) ends: the turn's first window's start, before the
    # cut (``workflows.machine.baseline_at``); None: this window's start (runs recorded before).
    baseline_at: datetime | None = None


class CheckResult(CamelModel):
    """One check at the verdict: its value against its bound."""

    name: str  # cpuThrottling, memoryHeadroom, or the query's name
    reason: FailureReason  # what the attempt fails as when this check does
    value: float | None = None  # a percent for the built-in checks, the query's value else
    baseline: float | None = None  # the same, before the resize
    bound: str = ""
    passed: bool
    # False: no container of the cohort can have data for it (no CPU limit, no memory limit);
    # it passes, saying so.
    applicable: bool = True
    message: str = ""


class HealthResult(CamelModel):
    checks: list[CheckResult] = Field(default_factory=list)
    queries: int = 0  # sent to Prometheus
    # Prometheus could not answer (after the retries) and the policy passes or fails then,
    # as ``fallback`` says (``workflows.machine.health_unavailable``).
    unavailable: str | None = None
    fallback: str | None = None

    def failed(self) -> CheckResult | None:
        return next((c for c in self.checks if not c.passed), None)


LOAD_OWNER = "load_owner"
RESOLVE_POLICY = "resolve_policy"
SAMPLE_COHORT = "sample_cohort"
RECORD_TRANSITION = "record_transition"
ROLL_BACK = "roll_back"
REAPPLY_RECOMMENDATION = "reapply_recommendation"
CHECK_HEALTH = "check_health"
PROMETHEUS_NOT_CONFIGURED = "PrometheusNotConfigured"  # check_health's error: no URL given
# Short reads and state records: run as local activities (``workflows.rollback``). The rollback
# and the re-apply stay regular activities, each its own step in the UI.
LOCAL = frozenset({LOAD_OWNER, RESOLVE_POLICY, SAMPLE_COHORT, RECORD_TRANSITION})


class PermanentError(StrEnum):
    """``ApplicationError`` types the activities raise (non-retryable) for what retrying cannot
    fix, each with the failure reason the attempt ends with (docs/concepts/activities.md,
    "Errors")."""

    MALFORMED_RECOMMENDATION = "MalformedRecommendationError"
    INVALID_OWNER = "InvalidOwnerError"
    API_REJECTED = "ApiRejectedError"
    RESOURCES_REFUSED = "ResourcesRefusedError"
    UNEXPECTED = "UnexpectedError"
    FOREIGN_CLUSTER = "ForeignClusterError"

    @property
    def reason(self) -> FailureReason:
        return _PERMANENT_REASONS[self]


_PERMANENT_REASONS = {
    PermanentError.MALFORMED_RECOMMENDATION: FailureReason.MALFORMED_ANNOTATION,
    PermanentError.INVALID_OWNER: FailureReason.INVALID_OWNER,
    PermanentError.API_REJECTED: FailureReason.API_REJECTED,
    PermanentError.RESOURCES_REFUSED: FailureReason.RESOURCES_REFUSED,
    PermanentError.UNEXPECTED: FailureReason.UNEXPECTED_ERROR,
    PermanentError.FOREIGN_CLUSTER: FailureReason.FOREIGN_CLUSTER,
}
NON_RETRYABLE_ERRORS = [e.value for e in PermanentError]
