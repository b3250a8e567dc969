"""Pydantic models of ``RollbackPolicy`` and ``ClusterRollbackPolicy`` (v1alpha1).

Every field of the spec with its default. The models are strict in the same way as the CRD
schemas in ``deploy/crds/`` (a shared table in ``tests/unit/test_crd_schema.py`` proves that they
accept and reject the same documents): unknown fields are rejected with their path, required
fields are required, durations must be positive Go durations, ranges are enforced.

Metadata is the exception: the API server owns it, so unknown metadata fields (uid,
resourceVersion, managedFields, ...) are ignored rather than rejected.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Any, Literal, Self, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    ValidationError,
    model_validator,
)
from pydantic.alias_generators import to_camel

from workflows.contract import (
    DEFAULT_WORKLOAD_TYPES,
    GROUP_VERSION,
    OBSERVE_ONLY_ANNOTATION,
    RollbackTarget,
    WorkloadKind,
)
from workflows.durations import MAX_DURATION, MAX_DURATION_TEXT, Duration, format_duration
from workflows.promql import (
    PROMQL_DEPTH_MAX,
    PROMQL_MAX,
    PROMQL_OPERATORS_MAX,
    unconfined_selectors,
    valid_promql,
)

INT32_MAX = 2**31 - 1
WEIGHT_MIN = 0  # as in the reference engine's CRDs: weights are int32 from 0 up

NAMESPACE_PATTERN = r"^[a-z0-9*]([-a-z0-9*]*[a-z0-9*])?$"
"""A namespace name in which ``*`` matches any run of characters (``prod-*``, ``*-staging``)."""

# Names as Kubernetes validates them (apimachinery's validation package), shared with the CRDs.
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"  # namespaces: at most 63
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"  # 253
_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
LABEL_KEY_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?" + _LABEL_NAME + "$"
)
LABEL_VALUE_PATTERN = rf"^({_LABEL_NAME})?$"
LABEL_KEY_MAX, LABEL_VALUE_MAX = 317, 63  # an optional 253-character prefix, "/", 63 characters
MAX_LABELS = 64  # matchLabels entries; bounds the CRD's CEL cost too

LabelKey = Annotated[str, Field(pattern=LABEL_KEY_PATTERN, max_length=LABEL_KEY_MAX)]
LabelValue = Annotated[str, Field(pattern=LABEL_VALUE_PATTERN, max_length=LABEL_VALUE_MAX)]


class Model(BaseModel):
    """camelCase on the wire, snake_case in Python, unknown fields rejected."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
    )


class LabelSelectorRequirement(Model):
    """One requirement of a label selector: a key, an operator and, for In/NotIn, values."""

    key: LabelKey = Field(description="The label key the requirement applies to.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(
        description="In and NotIn take values; Exists and DoesNotExist take none."
    )
    values: list[LabelValue] = Field(
        default_factory=list,
        description="The label values for In and NotIn (at least one); empty otherwise.",
    )

    @model_validator(mode="after")
    def _values_fit_operator(self) -> Self:
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"operator {self.operator} requires a non-empty values list")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"operator {self.operator} takes no values")
        return self

    def matches(self, labels: dict[str, str]) -> bool:
        present = self.key in labels
        match self.operator:
            case "In":
                return present and labels[self.key] in self.values
            case "NotIn":
                return not present or labels[self.key] not in self.values
            case "Exists":
                return present
            case "DoesNotExist":
                return not present

    def describe(self) -> str:
        if self.values:
            return f"{self.key} {self.operator} ({', '.join(self.values)})"
        return f"{self.key} {self.operator}"


class LabelSelector(Model):
    """A Kubernetes label selector: every matchLabels pair and every expression must hold.

    An empty selector matches every workload, as in Kubernetes.
    """

    match_labels: Annotated[dict[LabelKey, LabelValue], Field(max_length=MAX_LABELS)] = Field(
        default_factory=dict,
        description="Labels the workload must carry, each with this value.",
    )
    match_expressions: list[LabelSelectorRequirement] = Field(
        default_factory=list, description="Requirements the workload's labels must all meet."
    )

    def unmet(self, labels: dict[str, str]) -> list[str]:
        """The requirements the labels fail, in a human form; empty when the selector matches."""
        unmet = [f"{k}={v}" for k, v in self.match_labels.items() if labels.get(k) != v]
        unmet += [e.describe() for e in self.match_expressions if not e.matches(labels)]
        return unmet

    def matches(self, labels: dict[str, str]) -> bool:
        return not self.unmet(labels)

    def to_query(self) -> str:
        """The string form a client sends as ``labelSelector`` (``a=b,tier in (api,worker)``)."""
        parts = [f"{k}={v}" for k, v in sorted(self.match_labels.items())]
        for e in self.match_expressions:
            parts.append(
                {
                    "In": f"{e.key} in ({','.join(e.values)})",
                    "NotIn": f"{e.key} notin ({','.join(e.values)})",
                    "Exists": e.key,
                    "DoesNotExist": f"!{e.key}",
                }[e.operator]
            )
        return ",".join(parts)


def glob_match(pattern: str, text: str) -> bool:
    """Whether ``text`` matches ``pattern``, where ``*`` matches any run of characters.

    Greedy with one backtrack point (the last ``*``), so the time is linear in
    ``len(pattern) + len(text)`` for typical patterns and O(len(pattern) * len(text)) at worst,
    never exponential: ``*a*a*a...*b`` against a 63-character name is a few thousand steps, where
    the equivalent regex ``.*a.*a.*...b`` backtracks exponentially.
    """
    p = t = 0
    star, mark = -1, 0
    while t < len(text):
        if p < len(pattern) and pattern[p] != "*" and pattern[p] == text[t]:
            p, t = p + 1, t + 1
        elif p < len(pattern) and pattern[p] == "*":
            star, mark = p, t
            p += 1
        elif star >= 0:
            p, mark = star + 1, mark + 1
            t = mark
        else:
            return False
    return all(c == "*" for c in pattern[p:])


NamespacePatternStr = Annotated[str, Field(pattern=NAMESPACE_PATTERN, max_length=63)]


class NamespaceSelector(Model):
    """Namespace names or ``*`` wildcard patterns to include (``In``) or exclude (``NotIn``)."""

    operator: Literal["In", "NotIn"] = Field(
        description="In: only the namespaces named; NotIn: every namespace but those."
    )
    values: Annotated[list[NamespacePatternStr], Field(min_length=1)] = Field(
        description='Namespace names or patterns where * matches any run of characters ("prod-*").'
    )

    def matches(self, namespace: str) -> bool:
        hit = any(glob_match(v, namespace) for v in self.values)
        return hit if self.operator == "In" else not hit


def _no_duplicates(kinds: list[WorkloadKind]) -> list[WorkloadKind]:
    if len(set(kinds)) != len(kinds):
        raise ValueError("workload types must not repeat")
    return kinds


WorkloadTypes = Annotated[list[WorkloadKind], Field(min_length=1), AfterValidator(_no_duplicates)]


class Scope(Model):
    """Which workloads the policy applies to."""

    label_selector: LabelSelector | None = Field(
        default=None,
        description="Kubernetes label selector over the workload's (the owner's) labels;"
        " none: every workload of the kinds in scope.",
    )
    workload_types: WorkloadTypes = Field(
        default_factory=lambda: list(DEFAULT_WORKLOAD_TYPES),
        description="Workload kinds the policy applies to (default: all but StrimziPodSet).",
    )


class ClusterScope(Scope):
    """Which workloads, in which namespaces, the cluster policy applies to."""

    namespace_selector: NamespaceSelector | None = Field(
        default=None,
        description="Namespaces to include (In) or exclude (NotIn); none: every namespace.",
    )


class Backoff(Model):
    """The wait after a rollback of turn N: timePeriod x multiplyByTurn x N; after maxAttempts
    turns the workload is failedPermanent."""

    time_period: Duration = Field(description="Base duration of a rollback turn, e.g. 1m.")
    multiply_by_turn: Annotated[StrictInt, Field(ge=1, le=1000)] = Field(
        description="Scales the base duration by the turn number: with 1m and 2, turn 1 waits"
        " 2m and turn 2 waits 4m."
    )
    max_attempts: Annotated[StrictInt, Field(ge=1, le=1000)] = Field(
        description="Turns before the rollback is marked failedPermanent and retries stop."
    )

    @model_validator(mode="after")
    def _longest_wait_is_schedulable(self) -> Self:
        longest = self.time_period * self.multiply_by_turn * self.max_attempts
        if longest > MAX_DURATION:
            raise ValueError(
                f"the longest wait, timePeriod x multiplyByTurn x maxAttempts ="
                f" {format_duration(longest)}, is longer than {MAX_DURATION_TEXT} (a year)"
            )
        return self


# --- health checks from Prometheus (docs/concepts/health-checks.md) -------------------------

DEFAULT_MAX_HOLD = timedelta(minutes=10)
Comparison = Literal["<", "<=", ">", ">="]
COMPARISONS: tuple[str, ...] = get_args(Comparison)
QUERIES_MAX = 10  # custom queries per policy


Percent = Annotated[StrictInt, Field(ge=1, le=100)]


class _Bounds(Model):
    max_percent: Percent | None = Field(
        default=None, description="Unhealthy above this percent, in any container."
    )
    max_increase_points: Percent | None = Field(
        default=None,
        description="Unhealthy when a container's percent rises by more than these points over"
        " the same workload's baseline (the same length of time before the resize).",
    )

    @model_validator(mode="after")
    def _a_bound(self) -> Self:
        if self.max_percent is None and self.max_increase_points is None:
            raise ValueError("set maxPercent, maxIncreasePoints or both")
        return self


class CpuThrottlingCheck(_Bounds):
    """CPU throttling of each container over the window: its CFS throttled periods over its
    periods (cAdvisor's container_cpu_cfs_throttled_periods_total and _periods_total)."""


class MemoryHeadroomCheck(_Bounds):
    """Memory used by each container over the window: its highest working set over its memory
    limit (cAdvisor's container_memory_working_set_bytes and container_spec_memory_limit_bytes),
    so a cut that leaves no room for the next peak is rolled back before it is OOMKilled."""


class QueryCheck(Model):
    """A PromQL query of your own, such as an SLO's error rate or latency, judged against a
    threshold, or against the same query over the baseline."""

    name: Annotated[str, Field(pattern=DNS_LABEL_PATTERN, max_length=63)] = Field(
        description="The check's name, as the failure (healthCheckFailed) names it."
    )
    promql: Annotated[
        str, Field(min_length=1, max_length=PROMQL_MAX), AfterValidator(valid_promql)
    ] = Field(
        description="An instant query returning one or more series, evaluated at the window's"
        " end; $namespace, $owner, $pods (a regular expression matching exactly the cohort's"
        " pods' names) and $window are replaced, each inside quotes ($window also as a range or"
        f" an offset). At most {PROMQL_DEPTH_MAX} brackets deep and {PROMQL_OPERATORS_MAX}"
        " operators. In a RollbackPolicy every"
        ' selector must carry namespace="$namespace". The highest value (the lowest, for > and'
        " >=) is judged."
    )
    healthy_when: Comparison = Field(
        description="How the value compares with the threshold when the workload is healthy."
    )
    threshold: StrictFloat | None = Field(
        default=None, description="The bound the value is compared with."
    )
    max_increase_percent: Annotated[StrictInt, Field(ge=1, le=100_000)] | None = Field(
        default=None,
        description="Unhealthy when the value is worse than the baseline's (the same query,"
        " the same length of time before the resize) by more than this percent.",
    )

    @model_validator(mode="after")
    def _a_bound(self) -> Self:
        if self.threshold is None and self.max_increase_percent is None:
            raise ValueError("set threshold, maxIncreasePercent or both")
        return self


class AutoscalerCheck(Model):
    """What the cut did to the owner's HorizontalPodAutoscaler (KEDA's included), read from the
    API server at the window's open and at its end: no Prometheus needed. A CPU cut raises the
    pods' utilisation of their requests, so a CPU-utilisation HPA scales out."""

    max_growth_percent: Annotated[StrictInt, Field(ge=1, le=10_000)] | None = Field(
        default=None,
        description="Unhealthy when the HPA's desired replicas at the window's end exceed those"
        " at its open by more than this percent, e.g. 50.",
    )
    fail_at_max: StrictBool = Field(
        default=True,
        description="Unhealthy when the HPA is at maxReplicas at the window's end and was not at"
        " its open (it can no longer absorb a peak).",
    )

    @model_validator(mode="after")
    def _a_bound(self) -> Self:
        if self.max_growth_percent is None and not self.fail_at_max:
            raise ValueError("set maxGrowthPercent, or leave failAtMax true")
        return self


def _unique_names(queries: list[QueryCheck]) -> list[QueryCheck]:
    names = [q.name for q in queries]
    if len(set(names)) != len(names):
        raise ValueError("query names must not repeat")
    return queries


class HealthChecks(Model):
    """Health that kills nothing, judged at the window's end, after adoption: from Prometheus,
    and from the owner's HorizontalPodAutoscaler."""

    cpu_throttling: CpuThrottlingCheck | None = Field(
        default=None, description="Roll back a cut that throttles the CPU (cpuThrottled)."
    )
    memory_headroom: MemoryHeadroomCheck | None = Field(
        default=None,
        description="Roll back a cut that leaves too little memory (memoryHeadroomLow).",
    )
    queries: Annotated[
        list[QueryCheck], Field(max_length=QUERIES_MAX), AfterValidator(_unique_names)
    ] = Field(default_factory=list, description="Queries of your own (healthCheckFailed).")
    autoscaler: AutoscalerCheck | None = Field(
        default=None,
        description="Roll back a cut that drives the owner's HPA out (autoscalerScaledOut);"
        " needs no Prometheus.",
    )
    on_prometheus_error: Literal["hold", "pass", "fail"] = Field(
        default="hold",
        description="When Prometheus cannot answer (unreachable, a query error, no data) after"
        " its retries: hold the verdict and ask again, pass, or fail (healthCheckFailed).",
    )
    max_hold: Duration = Field(
        default=DEFAULT_MAX_HOLD,
        description="How long onPrometheusError: hold holds a verdict, from the window's end;"
        " then the verdict is taken on adoption alone (as pass), and says so.",
    )

    @model_validator(mode="after")
    def _a_check(self) -> Self:
        if not (self.prometheus or self.autoscaler):
            raise ValueError(
                "name at least one check: cpuThrottling, memoryHeadroom, queries or autoscaler"
            )
        return self

    @property
    def prometheus(self) -> bool:
        """Whether a check asks Prometheus (the autoscaler check reads the API server)."""
        return bool(self.cpu_throttling or self.memory_headroom or self.queries)


DEFAULT_CONFIRMATION = timedelta(seconds=5)


class EarlyVerdict(Model):
    """Decide a window before its end when certain failures already lose it."""

    confirmation_period: Duration = Field(
        default=DEFAULT_CONFIRMATION,
        description="How long certain failures (OOMKilled, CrashLoopBackOff, an Infeasible"
        " resize, Unschedulable) must keep the cohort below the adoption threshold before the"
        " window is decided early, e.g. 10s: a pod that recovers within it is not rolled back"
        " early.",
    )


class PolicyBehaviour(Model):
    """The spec fields that drive an attempt: everything but ``scope`` and ``weight`` (which only
    choose the policy). The workflow carries exactly these (``PolicySettings``)."""

    monitoring_period: Duration = Field(
        description="How long a resize attempt is observed, newly created pods included,"
        " before success is declared or a rollback starts, e.g. 5m."
    )
    rollback_target: RollbackTarget = Field(
        description="What a rollback restores: manifest (the workload's own resources) or"
        " lastSuccessful (the resources recorded when monitoring last succeeded)."
    )
    adoption_threshold_percent: Annotated[StrictInt, Field(ge=1, le=100)] = Field(
        description="Percent of the baseline cohort (the desired replicas when the window"
        " opened) that must run the recommendation and be healthy when the window ends."
    )
    backoff: Backoff = Field(description="How long to wait between turns, and how many turns.")
    enable_monitoring_reopen: StrictBool = Field(
        default=True,
        description="false: a replacement pod with the same recommendation does not reopen a"
        " succeeded turn; only a new recommendation starts a fresh one.",
    )
    health_checks: HealthChecks | None = Field(
        default=None,
        description="Checks from Prometheus at the window's end: CPU throttling, memory"
        " headroom, queries of your own; an optional field beyond Kubex's policies.",
    )
    early_verdict: EarlyVerdict | None = Field(
        default=None,
        description="Roll back before the window's end when certain failures leave too few"
        " healthy pods to meet the threshold, confirmed for confirmationPeriod; absent, the"
        " verdict is taken at the window's end only (Kubex's behaviour; an optional field"
        " beyond Kubex's policies).",
    )


class _SpecFields(PolicyBehaviour):
    weight: Annotated[StrictInt, Field(ge=WEIGHT_MIN, le=INT32_MAX)] = Field(
        default=0,
        description="When several policies match, the higher weight wins; on a tie, the older"
        " policy.",
    )


class RollbackPolicySpec(_SpecFields):
    """What a namespaced policy asks of the workloads of its namespace."""

    scope: Scope = Field(
        default_factory=Scope, description="Which workloads of the namespace it applies to."
    )


class ClusterRollbackPolicySpec(_SpecFields):
    """What a cluster policy asks of the workloads its scope selects."""

    scope: ClusterScope = Field(
        default_factory=ClusterScope,
        description="Which workloads, in which namespaces, it applies to.",
    )


class ObjectMeta(Model):
    model_config = ConfigDict(extra="ignore")

    name: Annotated[str, Field(pattern=DNS_SUBDOMAIN_PATTERN, max_length=253)]
    namespace: Annotated[str, Field(pattern=DNS_LABEL_PATTERN, max_length=63)] | None = None
    uid: str | None = None  # the API server's (the Events on the policy name it)
    creation_timestamp: datetime | None = None
    generation: int | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class _ObserveOnly:
    if TYPE_CHECKING:
        metadata: ObjectMeta

    @property
    def observe_only(self) -> bool:
        """Annotated ``rightsizing.kubex.ai/observe-only: "true"``: decide and report, act not."""
        return self.metadata.annotations.get(OBSERVE_ONLY_ANNOTATION) == "true"


class RollbackPolicy(Model, _ObserveOnly):
    """Namespaced: applies to workloads of its own namespace."""

    api_version: Literal["rightsizing.kubex.ai/v1alpha1"] = GROUP_VERSION  # type: ignore[assignment]
    kind: Literal["RollbackPolicy"] = "RollbackPolicy"
    metadata: ObjectMeta
    spec: RollbackPolicySpec
    # Written by the engine (``workflows.policy_status``) and not validated on read: a status
    # from another version or tool never makes a valid policy invalid.
    status: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _queries_read_their_namespace(self) -> Self:
        """A namespace's owner writes this policy: its queries read that namespace only, and a
        value they print (Events, status) is of that namespace (docs/concepts/health-checks.md,
        "Tenancy")."""
        checks = self.spec.health_checks
        for i, query in enumerate(checks.queries if checks else []):
            found = unconfined_selectors(query.promql, self.metadata.namespace)
            if found:
                raise ValueError(
                    f"spec.healthChecks.queries[{i}].promql: a RollbackPolicy reads only its own"
                    f' namespace: every selector needs namespace="$namespace"; {"; ".join(found)}'
                )
        return self


class ClusterRollbackPolicy(Model, _ObserveOnly):
    """Cluster-scoped: applies across the namespaces its namespace selector admits."""

    api_version: Literal["rightsizing.kubex.ai/v1alpha1"] = GROUP_VERSION  # type: ignore[assignment]
    kind: Literal["ClusterRollbackPolicy"] = "ClusterRollbackPolicy"
    metadata: ObjectMeta
    spec: ClusterRollbackPolicySpec
    status: dict[str, Any] | None = None  # as for RollbackPolicy


AnyPolicy = RollbackPolicy | ClusterRollbackPolicy
POLICY_KINDS: dict[str, type[RollbackPolicy] | type[ClusterRollbackPolicy]] = {
    "RollbackPolicy": RollbackPolicy,
    "ClusterRollbackPolicy": ClusterRollbackPolicy,
}


def field_path(loc: tuple[int | str, ...]) -> str:
    """``('spec', 'scope', 'workloadTypes', 0)`` -> ``spec.scope.workloadTypes[0]``; a bad map
    key (pydantic's ``(..., key, '[key]')``) -> ``matchLabels["my key"] (key)``."""
    out = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
        elif part == "[key]":
            out += " (key)"
        elif i + 1 < len(loc) and loc[i + 1] == "[key]":
            out += f"[{json.dumps(part)}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def field_reason(error: Any) -> str:
    """A field error's reason in a few words."""
    kind, msg = error["type"], str(error["msg"])
    if kind == "extra_forbidden":
        return "unknown field"
    if kind == "missing":
        return "required field is missing"
    return msg.removeprefix("Value error, ")


def field_errors(exc: ValidationError, limit: int = 3) -> str:
    """A policy's validation errors in one line, ``field.path: reason`` each (the first
    ``limit``; how many more), for an Event or a status condition."""
    errors = exc.errors()
    said = "; ".join(f"{field_path(e['loc'])}: {field_reason(e)}" for e in errors[:limit])
    return said + (f" (and {len(errors) - limit} more)" if len(errors) > limit else "")
