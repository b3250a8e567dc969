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
from workflows.policy import AnyPolicy, PolicyBehaviour
from workflows.state import CamelModel, OwnerState, PolicyRef, ResourceSnapshot


class OwnerRef(CamelModel):
    """The workload owner: rollback state and events live on it."""

    namespace: str
    kind: WorkloadKind
    name: str

    @property
    def workflow_id(self) -> str:
        """``rollback/<namespace>/<Kind>/<name>``: one workflow per owner, readable in the UI."""
        return f"rollback/{self.namespace}/{self.kind}/{self.name}"

    @property
    def workload(self) -> str:
        return f"{self.kind}/{self.name}"

    def __str__(self) -> str:
        return f"{self.namespace}/{self.kind}/{self.name}"


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


class LoadOwnerInput(CamelModel):
    owner: OwnerRef


class LoadOwnerResult(CamelModel):
    """The owner's stored state and its policy, read when an attempt starts."""

    exists: bool
    state: OwnerState | None = None
    state_error: str | None = None  # the annotation was present but malformed
    policy: PolicySettings | None = None
    # The baseline when the window opens: desired replicas or the kind's equivalent (None: the
    # kind has none, the window's first sample counts the pods). Absent from runs recorded before.
    desired: int | None = Field(default=None, ge=0)


# --- resolve_policy (turn boundaries) --------------------------------------------------------


class ResolvePolicyInput(CamelModel):
    owner: OwnerRef


class ResolvePolicyResult(CamelModel):
    exists: bool = True
    policy: PolicySettings | None = None


# --- sample_cohort ---------------------------------------------------------------------------


class CohortQuery(CamelModel):
    """How to LIST the owner's pods in one call: a label selector in the owner's namespace,
    narrowed client-side to pods whose owning Job's name matches ``job_name_pattern`` (CronJob).
    Computed from the owner at the first sample of a window and carried by the workflow, so later
    samples are a single LIST with no GET of the owner."""

    label_selector: str
    job_name_pattern: str | None = None


class SampleCohortInput(CamelModel):
    owner: OwnerRef
    recommendation: Recommendation
    window_started_at: datetime
    cohort: CohortQuery | None = None  # None: read the owner first (first sample of a window)


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
    message: str = ""
    cohort: CohortQuery | None = None
    observed_at: datetime | None = None
    error: str | None = None  # e.g. a malformed recommendation annotation on the pods


# --- record_transition -----------------------------------------------------------------------


class RecordTransitionInput(CamelModel):
    """Write the owner state and emit one Event, idempotently (``event_id`` names the Event)."""

    owner: OwnerRef
    state: OwnerState | None  # None clears the annotation
    event_reason: EventReason | None = None
    event_message: str = ""
    event_type: str = "Normal"
    event_id: str = ""
    clear_rollback_recommendation: bool = False


class RecordTransitionResult(CamelModel):
    exists: bool = True
    state_written: bool = False
    event_emitted: bool = False


# --- roll_back / reapply ---------------------------------------------------------------------


class RollBackInput(CamelModel):
    owner: OwnerRef
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


class ReapplyInput(CamelModel):
    owner: OwnerRef
    recommendation: Recommendation


LOAD_OWNER = "load_owner"
RESOLVE_POLICY = "resolve_policy"
SAMPLE_COHORT = "sample_cohort"
RECORD_TRANSITION = "record_transition"
ROLL_BACK = "roll_back"
REAPPLY_RECOMMENDATION = "reapply_recommendation"
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
    UNEXPECTED = "UnexpectedError"

    @property
    def reason(self) -> FailureReason:
        return _PERMANENT_REASONS[self]


_PERMANENT_REASONS = {
    PermanentError.MALFORMED_RECOMMENDATION: FailureReason.MALFORMED_ANNOTATION,
    PermanentError.INVALID_OWNER: FailureReason.INVALID_OWNER,
    PermanentError.API_REJECTED: FailureReason.API_REJECTED,
    PermanentError.UNEXPECTED: FailureReason.UNEXPECTED_ERROR,
}
NON_RETRYABLE_ERRORS = [e.value for e in PermanentError]
