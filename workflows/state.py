"""The rollback state JSON kept on the owner (annotation ``rightsizing.kubex.ai/rollback-state``).

This is the durable record the cluster sees; the workflow computes it at every transition and an
activity writes it. Field names are the cluster contract's (docs/concepts/activities.md,
"Annotations written")::

    {"mode": "backingOff", "activeRecommendationFingerprint": "3f9c...", "turn": 2,
     "failureReason": "oomKilled", "failureMessage": "2/5 pods OOMKilled (app)",
     "lastSuccessfulState": {"containers": {"app": {"requests": {...}, "limits": {...}}}},
     "expiryAt": "...", "policy": {"kind": "RollbackPolicy", "namespace": "shop", "name": "p"},
     "lastTransitionTime": "...", "history": [{"time": ..., "mode": ..., "turn": ..., ...}]}
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from workflows.contract import FailureReason, Mode
from workflows.fingerprint import Resources
from workflows.policy import AnyPolicy, RollbackPolicy

HISTORY_LIMIT = 10


class CamelModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)


class PolicyRef(CamelModel):
    """A policy's identity, the one way it is named: ``RollbackPolicy/ns/name`` or
    ``ClusterRollbackPolicy/name``."""

    kind: str
    namespace: str | None = None
    name: str

    @classmethod
    def of(cls, policy: AnyPolicy) -> PolicyRef:
        """A namespaced policy without a namespace lives in ``default``, as kubectl applies it."""
        namespaced = isinstance(policy, RollbackPolicy)
        return cls(
            kind=policy.kind,
            namespace=(policy.metadata.namespace or "default") if namespaced else None,
            name=policy.metadata.name,
        )

    def __str__(self) -> str:
        return "/".join(p for p in (self.kind, self.namespace, self.name) if p)


class ContainerResources(CamelModel):
    requests: dict[str, str] = Field(default_factory=dict)
    limits: dict[str, str] = Field(default_factory=dict)


class ResourceSnapshot(CamelModel):
    """Per-container requests and limits: what ``lastSuccessful`` restores."""

    containers: dict[str, ContainerResources] = Field(default_factory=dict)

    @classmethod
    def of(cls, requests: Resources, limits: Resources) -> ResourceSnapshot:
        names = sorted(set(requests) | set(limits))
        return cls(
            containers={
                n: ContainerResources(requests=requests.get(n, {}), limits=limits.get(n, {}))
                for n in names
            }
        )

    def requests(self) -> Resources:
        return {n: dict(c.requests) for n, c in self.containers.items() if c.requests}

    def limits(self) -> Resources:
        return {n: dict(c.limits) for n, c in self.containers.items() if c.limits}

    def describe(self) -> str:
        """``app: requests memory=768Mi; limits memory=768Mi``, for messages."""
        parts = []
        for name, c in self.containers.items():
            kinds = [
                f"{kind} " + ",".join(f"{k}={v}" for k, v in sorted(values.items()))
                for kind, values in (("requests", c.requests), ("limits", c.limits))
                if values
            ]
            parts.append(f"{name}: {'; '.join(kinds)}")
        return ", ".join(parts)


class Autoscaler(CamelModel):
    """The owner's HorizontalPodAutoscaler as its status shows it when read."""

    name: str
    desired: int = Field(ge=0, description="status.desiredReplicas")
    min: int = Field(ge=0, description="spec.minReplicas (1 when unset)")
    max: int = Field(ge=1, description="spec.maxReplicas")

    def describe(self) -> str:
        return f"HPA {self.name}: {self.desired} desired (min {self.min}, max {self.max})"


class Template(CamelModel):
    """The owner's pod template as a release changes it: a fingerprint of everything but the
    resources (the applier's) and the restart annotation, and the images, to say what changed."""

    fingerprint: str
    images: dict[str, str] = Field(default_factory=dict)  # container -> image


class WindowBaselines(CamelModel):
    """What a monitoring window took as its baselines when it opened, kept with the state so
    that a run which resumes the window (its worker lost before it completed a task) judges it
    against them, not against a read the cut may have moved already (an HPA's scale-out)."""

    baseline: int | None = None  # the cohort: the owner's desired replicas
    autoscaler: Autoscaler | None = None
    template: Template | None = None
    # Whether the recommendation raises a request above the owner's template (None: not read):
    # only then can the cut leave a pod unschedulable (``machine.caused_by_cut``).
    raises_requests: bool | None = None


class HistoryEntry(CamelModel):
    time: datetime
    mode: Mode
    turn: int
    fingerprint: str
    failure_reason: FailureReason | None = None


class OwnerState(CamelModel):
    """The annotation's JSON. Unknown keys written by a newer version are ignored on read."""

    model_config = ConfigDict(extra="ignore")

    mode: Mode
    active_recommendation_fingerprint: str
    turn: int = Field(ge=1)
    failure_reason: FailureReason | None = None
    failure_message: str | None = None
    last_successful_state: ResourceSnapshot | None = None
    expiry_at: datetime | None = None
    policy: PolicyRef | None = None
    last_transition_time: datetime
    history: list[HistoryEntry] = Field(default_factory=list)
    # The workflow run that wrote it: a run that reads back its own state knows a task of its
    # own recorded it and was lost before it completed (its worker died in between).
    run_id: str | None = None
    # How many transitions that run had made with this one: with ``run_id``, the transition's
    # notification key, for the run that reads back a transition its lost task recorded.
    transitions: int | None = None
    # While monitoring: the window's baselines, for a run that resumes it.
    window: WindowBaselines | None = None

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, exclude_none=True)
