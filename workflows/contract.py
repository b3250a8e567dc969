"""The cluster contract and the names defined once: API group, annotation keys, modes, reasons.

These names are shared with the Kubex automation engine (docs/concepts/activities.md, "Annotations
written" and
"Recommendations and fingerprints"), so they must not change: an applier that already uses them
runs beside this service.
"""

from __future__ import annotations

import re
from datetime import timedelta
from enum import StrEnum
from typing import Any

Obj = dict[str, Any]
"""A Kubernetes object as the API serves it (decoded JSON), kept as a plain dict throughout."""

API_GROUP = "rightsizing.kubex.ai"
API_VERSION = "v1alpha1"
GROUP_VERSION = f"{API_GROUP}/{API_VERSION}"

# Recommendation annotations, on pods (and on the owner for static policies):
#   <kind>.rightsizing.kubex.ai/desired-resource-requests            (fixed key)
#   <kind>.rightsizing.kubex.ai/h<digest>-desired-resource-requests  (multi-policy hashed key)
RECOMMENDATION_SUFFIX_REQUESTS = "desired-resource-requests"
RECOMMENDATION_SUFFIX_LIMITS = "desired-resource-limits"


def recommendation_key(source: str, limits: bool = False, digest: str | None = None) -> str:
    """A recommendation annotation's key: ``<source>.rightsizing.kubex.ai/`` then, for a key a
    policy owns, ``h<digest>-``, then ``desired-resource-requests`` (or ``-limits``)."""
    suffix = RECOMMENDATION_SUFFIX_LIMITS if limits else RECOMMENDATION_SUFFIX_REQUESTS
    return f"{source}.{API_GROUP}/" + (f"h{digest}-" if digest else "") + suffix


# The rollback recommendation this service publishes on the owner.
ROLLBACK_SOURCE = "rollbackpolicy"
ROLLBACK_REQUESTS_ANNOTATION = recommendation_key(ROLLBACK_SOURCE)
ROLLBACK_LIMITS_ANNOTATION = recommendation_key(ROLLBACK_SOURCE, limits=True)

# Rollback state JSON, on the owner only (never on pods).
ROLLBACK_STATE_ANNOTATION = "rightsizing.kubex.ai/rollback-state"

# Set by people, read by the engine (docs/concepts/status-and-control.md, "Policy status and
# control from kubectl"):
# on an owner, a one-shot command the intake carries out and then removes; on a policy, "true"
# makes it observe-only (monitor, decide and report; write no rollback, resize nothing).
CONTROL_ANNOTATION = "rightsizing.kubex.ai/rollback-control"
OBSERVE_ONLY_ANNOTATION = "rightsizing.kubex.ai/observe-only"
# Kubex's pause, on a namespace, an owner or a pod (``workflows.pause``): ``infinite`` or an
# RFC 3339 time, with an optional reason. The one annotation stops both engines.
PAUSE_UNTIL_ANNOTATION = "rightsizing.kubex.ai/pause-until"
PAUSE_REASON_ANNOTATION = "rightsizing.kubex.ai/pause-reason"
# The engine's kill switch, on the engine's own namespace (``workflows.pause.automation_off``):
# ``disabled`` stops new attempts and every write that brings a cut back, and lets the verdicts
# and rollbacks in flight finish (Kubex's ``automationEnabled: false``); ``enabled`` or none: on.
AUTOMATION_ANNOTATION = "rightsizing.kubex.ai/automation"
AUTOMATION_REASON_ANNOTATION = "rightsizing.kubex.ai/automation-reason"
# The engine's namespace where its pods do not say (POD_NAMESPACE): outside a cluster.
DEFAULT_ENGINE_NAMESPACE = "default"
INTAKE_LEASE = "rightsizing-rollback-intake"  # the intake's leader-election Lease
# The storm breaker (``workflows.breaker``), on the engine's namespace too: written by the intake
# when it trips (the time, and why), removed by an operator (``rollbackctl breaker reset``, which
# records when, so the verdicts before it are not counted again).
STORM_BREAKER_ANNOTATION = "rightsizing.kubex.ai/storm-breaker"
STORM_BREAKER_REASON_ANNOTATION = "rightsizing.kubex.ai/storm-breaker-reason"
STORM_BREAKER_RESET_ANNOTATION = "rightsizing.kubex.ai/storm-breaker-reset"

TASK_QUEUE = "rightsizing-rollback"  # the prefix of each cluster's task queue

# A cluster's name (docs/operating/fleet.md): a DNS label, as Kubernetes names a namespace. It is
# part of every workflow ID, search attribute, metric, log line and notification, so one Temporal
# serves a fleet whose clusters run the same workload names.
CLUSTER_PATTERN = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
_CLUSTER = re.compile(CLUSTER_PATTERN)


def check_cluster(name: str) -> str:
    """``name`` if it is a valid cluster name, else ``ValueError`` saying what a name must be."""
    if not _CLUSTER.match(name):
        raise ValueError(
            f"{name!r} is not a cluster name: a DNS label (lower-case letters, digits and '-',"
            " starting and ending with a letter or digit, at most 63 characters)"
        )
    return name


def task_queue_for(cluster: str) -> str:
    """Each cluster's default task queue: its workers poll only its own runs' tasks."""
    return f"{TASK_QUEUE}-{cluster}"


class Control(StrEnum):
    """The values of ``CONTROL_ANNOTATION``: the same signals ``rollbackctl`` sends."""

    CANCEL = "cancel"
    REOPEN = "reopen"


class WorkloadKind(StrEnum):
    """Owner kinds a policy can scope. ``StrimziPodSet`` is valid but not in the default set."""

    DEPLOYMENT = "Deployment"
    STATEFUL_SET = "StatefulSet"
    CRON_JOB = "CronJob"
    ROLLOUT = "Rollout"
    JOB = "Job"
    ANALYSIS_RUN = "AnalysisRun"
    DAEMON_SET = "DaemonSet"
    MODEL = "Model"
    STRIMZI_POD_SET = "StrimziPodSet"


DEFAULT_WORKLOAD_TYPES: tuple[WorkloadKind, ...] = tuple(
    k for k in WorkloadKind if k is not WorkloadKind.STRIMZI_POD_SET
)


class RollbackTarget(StrEnum):
    MANIFEST = "manifest"
    LAST_SUCCESSFUL = "lastSuccessful"


class Mode(StrEnum):
    """Rollback modes written to the owner's state. Terminal modes end a turn."""

    MONITORING = "monitoring"
    MONITORING_SUCCEEDED = "monitoringSucceeded"
    ROLLING_BACK = "rollingBack"
    BACKING_OFF = "backingOff"
    BACKED_OFF = "backedOff"
    FAILED_PERMANENT = "failedPermanent"
    CANCELLED = "cancelled"
    # ended by an error that retrying cannot fix (docs/concepts/activities.md, "Errors")
    ABORTED = "aborted"
    SUPERSEDED = "superseded"
    CLEARED = "cleared"

    @property
    def terminal(self) -> bool:
        """True when the workflow run ends in this mode (a later run may start a new turn)."""
        return self not in _ACTIVE_MODES


_ACTIVE_MODES = frozenset({Mode.MONITORING, Mode.ROLLING_BACK, Mode.BACKING_OFF})


class FailureReason(StrEnum):
    """Why an attempt failed, in the state's ``failureReason`` (the troubleshooting page says
    what each means)."""

    OOM_KILLED = "oomKilled"
    CRASH_LOOP_BACK_OFF = "crashLoopBackOff"
    UNSCHEDULABLE = "unschedulable"
    RESIZE_INFEASIBLE = "resizeInfeasible"
    RESIZE_DEFERRED = "resizeDeferred"
    RESIZE_ERROR = "resizeError"
    NOT_READY = "notReady"
    FAILED = "failed"
    ADOPTION_THRESHOLD_NOT_MET = "adoptionThresholdNotMet"
    ROLLBACK_RECOMMENDATION_UNAVAILABLE = "rollbackRecommendationUnavailable"
    OWNER_GONE = "ownerGone"
    MALFORMED_ANNOTATION = "malformedAnnotation"
    INVALID_OWNER = "invalidOwner"  # e.g. no spec.selector, a non-numeric spec.replicas
    API_REJECTED = "apiRejected"  # the API server refused a request for good (400, 403, 422, ...)
    # a ResourceQuota or LimitRange refused the pods' resources (a resize, a pod's creation)
    RESOURCES_REFUSED = "resourcesRefused"
    RETRY_BUDGET_EXHAUSTED = "retryBudgetExhausted"  # transient errors outlasted the budget
    UNEXPECTED_ERROR = "unexpectedError"  # a bug met on this object: logged with its traceback
    # the run belongs to another cluster than the worker's (a task queue shared by mistake)
    FOREIGN_CLUSTER = "foreignCluster"
    # health that kills nothing, from Prometheus (docs/concepts/health-checks.md)
    CPU_THROTTLED = "cpuThrottled"
    MEMORY_HEADROOM_LOW = "memoryHeadroomLow"
    HEALTH_CHECK_FAILED = "healthCheckFailed"  # a query of the policy's, or Prometheus (fail)
    # the owner's HorizontalPodAutoscaler pinned at its maximum, or grown past the policy's
    # share, by the window's end (healthChecks.autoscaler: no Prometheus needed)
    AUTOSCALER_SCALED_OUT = "autoscalerScaledOut"


# Failures no wait cures within a window: a container OOM-killed or crash-looping and not Ready,
# a resize the node can never take, a pod no node can take. The early verdict counts only these
# (``workflows.machine.early_failure``; the intake signals on them).
CERTAIN_REASONS = frozenset(
    {
        FailureReason.OOM_KILLED,
        FailureReason.CRASH_LOOP_BACK_OFF,
        FailureReason.RESIZE_INFEASIBLE,
        FailureReason.UNSCHEDULABLE,
    }
)


class EventReason(StrEnum):
    """The reasons of the Events the engine writes on an owner (or a pod, or a policy)."""

    PAUSED = "RollbackPaused"  # a verdict or an actuation held by a pause (workflows.pause)
    # an in-place batch held by a PodDisruptionBudget that allows no disruption now
    PACED = "RollbackPaced"
    # a restore's pods that could not take it in place, deleted for their controller to recreate
    PODS_RECREATED = "RollbackPodsRecreated"
    # Prometheus could not answer a verdict's health checks: held, passed or failed, as asked
    HEALTH_UNAVAILABLE = "RollbackHealthCheckUnavailable"
    MONITORING_STARTED = "RollbackMonitoringStarted"
    # a release (the owner's pod template changed, not by the engine or the applier) during a
    # window: the verdict waits for it to roll out, then a fresh window judges the cut on it
    RELEASE_SEEN = "RollbackReleaseSeen"
    MONITORING_SUCCEEDED = "RollbackMonitoringSucceeded"
    ROLLING_BACK_STARTED = "RollbackRollingBackStarted"
    BACKOFF_TURN_COMPLETED = "RollbackBackoffTurnCompleted"
    BACKOFF_EXHAUSTED = "RollbackBackoffExhausted"
    STATE_CLEARED = "RollbackStateCleared"
    RECOMMENDATION_UNAVAILABLE = "RollbackRecommendationUnavailable"
    # Beyond the reference engine's list: a cancel signal, an attempt ended by an error that
    # retrying cannot fix, and objects the intake ignores (docs/concepts/activities.md, "Errors").
    MONITORING_CANCELLED = "RollbackMonitoringCancelled"
    ATTEMPT_ABORTED = "RollbackAttemptAborted"
    POLICY_INVALID = "RollbackPolicyInvalid"
    CONTROL_REJECTED = "RollbackControlRejected"  # a control annotation that changed nothing
    NOTIFICATION_FAILED = "RollbackNotificationFailed"  # a receiver never took a notification
    OBJECT_SKIPPED = "RollbackObjectSkipped"
    # a pod whose recommendation annotation cannot be read: left out of its cohort, the others
    # judged (on the owner, and on the pod by the intake)
    RECOMMENDATION_MALFORMED = "RollbackRecommendationMalformed"
    # on the worker's own Pod: it refused a run of another cluster (docs/operating/fleet.md)
    FOREIGN_RUN_REFUSED = "RollbackForeignRunRefused"
    # on each policy: the storm breaker tripped, re-applies stop cluster-wide until it is reset
    STORM_BREAKER_TRIPPED = "RollbackStormBreakerTripped"


class SearchAttribute(StrEnum):
    """Custom search attributes upserted at every transition (registered on the server);
    ``RollbackCluster`` is set when a run starts; ``RollbackHeld`` only while a pause holds a
    step (what it holds and why), unset when the step goes ahead."""

    CLUSTER = "RollbackCluster"
    NAMESPACE = "RollbackNamespace"
    WORKLOAD = "RollbackWorkload"
    MODE = "RollbackMode"
    TURN = "RollbackTurn"
    POLICY = "RollbackPolicy"
    FINGERPRINT = "RollbackFingerprint"
    HELD = "RollbackHeld"


SEARCH_ATTRIBUTE_TYPES = {
    SearchAttribute.CLUSTER: "Keyword",
    SearchAttribute.NAMESPACE: "Keyword",
    SearchAttribute.WORKLOAD: "Keyword",
    SearchAttribute.MODE: "Keyword",
    SearchAttribute.TURN: "Int",
    SearchAttribute.POLICY: "Keyword",
    SearchAttribute.FINGERPRINT: "Keyword",
    SearchAttribute.HELD: "Keyword",
}


class Actuation(StrEnum):
    """How a worker carries out a rollback (``--actuation``)."""

    ANNOTATIONS = "annotations"  # publish the rollback recommendation for an external applier
    IN_PLACE = "in-place"  # publish it and resize running pods through pods/resize


DEFAULT_PROTECTED_NAMESPACES = ("kube-*", "openshift-*", "gmp-*")  # Kubex's defaults
DEFAULT_MIN_READY = timedelta(seconds=10)  # Kubex's minReadyDuration
# What kubectl-like commands take for the policy kinds (the CRDs' names and short names).
POLICY_ALIASES = {
    "rbp": "RollbackPolicy",
    "rollbackpolicy": "RollbackPolicy",
    "rollbackpolicies": "RollbackPolicy",
    "crbp": "ClusterRollbackPolicy",
    "clusterrollbackpolicy": "ClusterRollbackPolicy",
    "clusterrollbackpolicies": "ClusterRollbackPolicy",
}
