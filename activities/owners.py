"""The nine owner kinds: where they live in the API, their cohort, baseline and manifest resources.

Every owner is read and patched through ``CustomObjectsApi`` with its group/version/plural (the
paths of built-in groups are the same shape, ``/apis/apps/v1/namespaces/ns/deployments/x``), so
one code path serves all kinds and objects stay plain dicts, as the API serves them.

Cohort (the pods an attempt is judged on) and baseline (its size when a window opens):

    Deployment, StatefulSet, Rollout    spec.selector               spec.replicas (default 1)
    DaemonSet                           spec.selector               status.desiredNumberScheduled
    Job                                 spec.selector               spec.parallelism (default 1)
    CronJob                             pods of Jobs named <name>-<n> jobTemplate parallelism
    AnalysisRun                         pods of its Jobs (by uid)   pods seen
    Model (kubeai.org)                  label model=<name>          spec.replicas/minReplicas
    StrimziPodSet                       spec.selector               len(spec.pods)

Going up, from a pod to its owner: ReplicaSet -> Deployment or Rollout, Job -> CronJob or
AnalysisRun, and StatefulSet, DaemonSet, Model, StrimziPodSet directly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from activities.errors import InvalidOwnerError
from workflows.activity_api import CohortQuery
from workflows.contract import Obj, WorkloadKind
from workflows.fingerprint import Resources
from workflows.policy import LabelSelector


@dataclass(frozen=True)
class OwnerKind:
    kind: WorkloadKind
    group: str
    version: str
    plural: str
    template: tuple[str, ...] | None  # path to the pod spec, for manifest resources

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"


OWNER_KINDS: dict[WorkloadKind, OwnerKind] = {
    k.kind: k
    for k in (
        OwnerKind(
            WorkloadKind.DEPLOYMENT, "apps", "v1", "deployments", ("spec", "template", "spec")
        ),
        OwnerKind(
            WorkloadKind.STATEFUL_SET, "apps", "v1", "statefulsets", ("spec", "template", "spec")
        ),
        OwnerKind(
            WorkloadKind.DAEMON_SET, "apps", "v1", "daemonsets", ("spec", "template", "spec")
        ),
        OwnerKind(WorkloadKind.JOB, "batch", "v1", "jobs", ("spec", "template", "spec")),
        OwnerKind(
            WorkloadKind.CRON_JOB,
            "batch",
            "v1",
            "cronjobs",
            ("spec", "jobTemplate", "spec", "template", "spec"),
        ),
        OwnerKind(
            WorkloadKind.ROLLOUT,
            "argoproj.io",
            "v1alpha1",
            "rollouts",
            ("spec", "template", "spec"),
        ),
        OwnerKind(WorkloadKind.ANALYSIS_RUN, "argoproj.io", "v1alpha1", "analysisruns", None),
        OwnerKind(WorkloadKind.MODEL, "kubeai.org", "v1", "models", None),
        OwnerKind(
            WorkloadKind.STRIMZI_POD_SET, "core.strimzi.io", "v1beta2", "strimzipodsets", None
        ),
    )
}

# Kinds a pod's controller reference may name on the way up, with their API coordinates.
INTERMEDIATE = {
    "ReplicaSet": ("apps", "v1", "replicasets"),
    "Job": ("batch", "v1", "jobs"),
}
ANALYSIS_RUN_UID_LABEL = "analysisrun.argoproj.io/uid"
JOB_NAME_LABEL = "job-name"


def dig(obj: Any, *path: str) -> Any:
    """``obj[path[0]][path[1]]...``, or None where a step is missing or not a mapping."""
    for step in path:
        obj = obj.get(step) if isinstance(obj, dict) else None
    return obj


def controller_of(obj: Obj) -> Obj | None:
    refs = obj.get("metadata", {}).get("ownerReferences") or []
    return next((r for r in refs if r.get("controller")), refs[0] if refs else None)


def cohort_query(kind: WorkloadKind, owner: Obj, job_names: list[str] | None = None) -> CohortQuery:
    """The one-LIST query for the owner's pods. AnalysisRun needs its Jobs' names."""
    name = owner["metadata"]["name"]
    if kind is WorkloadKind.MODEL:
        return CohortQuery(label_selector=f"model={name}")
    if kind is WorkloadKind.CRON_JOB:
        return CohortQuery(
            label_selector=JOB_NAME_LABEL, job_name_pattern=rf"^{re.escape(name)}-\d+$"
        )
    if kind is WorkloadKind.ANALYSIS_RUN:
        names = ",".join(sorted(job_names or [])) or "-none-"
        return CohortQuery(label_selector=f"{JOB_NAME_LABEL} in ({names})")
    raw = dig(owner, "spec", "selector")
    try:
        selector = LabelSelector.model_validate(raw).to_query() if raw else ""
    except ValidationError as exc:
        raise InvalidOwnerError(f"{kind} {name}: invalid spec.selector: {exc}") from None
    if not selector:
        raise InvalidOwnerError(f"{kind} {name} has no spec.selector")
    return CohortQuery(label_selector=selector)


def desired_replicas(kind: WorkloadKind, owner: Obj) -> int | None:
    """The baseline cohort size; ``None`` where the kind has no such notion (pods seen count)."""
    try:
        desired = _desired(kind, owner)
    except (TypeError, ValueError, AttributeError) as exc:  # replicas: null, "three", ...
        raise InvalidOwnerError(f"{kind} {owner['metadata']['name']}: {exc}") from None
    if desired is not None and desired < 0:
        raise InvalidOwnerError(f"{kind} {owner['metadata']['name']}: {desired} replicas")
    return desired


def _desired(kind: WorkloadKind, owner: Obj) -> int | None:
    spec = owner.get("spec") or {}
    match kind:
        case WorkloadKind.DAEMON_SET:
            return int(dig(owner, "status", "desiredNumberScheduled") or 0)
        case WorkloadKind.JOB:
            return int(spec.get("parallelism", 1))
        case WorkloadKind.CRON_JOB:
            return int(dig(spec, "jobTemplate", "spec", "parallelism") or 1)
        case WorkloadKind.MODEL:
            return int(spec.get("replicas") or spec.get("minReplicas") or 1)
        case WorkloadKind.STRIMZI_POD_SET:
            return len(spec.get("pods") or [])
        case WorkloadKind.ANALYSIS_RUN:
            return None
        case _:
            return int(spec.get("replicas", 1))


# Where each kind says how many pods a rolling update may take down at once, and its default
# when unset (Kubernetes' own); the other kinds say nothing: one pod at a time.
_MAX_UNAVAILABLE: dict[WorkloadKind, tuple[tuple[str, ...], int | str]] = {
    WorkloadKind.DEPLOYMENT: (("spec", "strategy", "rollingUpdate", "maxUnavailable"), "25%"),
    WorkloadKind.ROLLOUT: (("spec", "strategy", "canary", "maxUnavailable"), "25%"),
    WorkloadKind.STATEFUL_SET: (("spec", "updateStrategy", "rollingUpdate", "maxUnavailable"), 1),
    WorkloadKind.DAEMON_SET: (("spec", "updateStrategy", "rollingUpdate", "maxUnavailable"), 1),
}


def max_unavailable(kind: WorkloadKind, owner: Obj, desired: int | None) -> int:
    """How many pods an in-place resize that restarts containers may take down at once: the
    workload's own ``maxUnavailable`` (a number, or a percentage of ``desired`` rounded down, as
    the controllers do), never less than 1: a workload declaring 0 (it surges instead) is resized
    one pod at a time, each only while every other pod is Ready, and told so
    (``unavailable_note``). A value that is neither (a Rollout's CRD does not check it) paces
    one pod at a time: the safe side."""
    declared = _declared_unavailable(kind, owner, desired)
    return 1 if declared is None else max(1, declared)


def unavailable_note(kind: WorkloadKind, owner: Obj, desired: int | None) -> str | None:
    """What a paced resize says of a ``maxUnavailable`` that resolves to 0, else None."""
    if _declared_unavailable(kind, owner, desired) != 0:
        return None
    return (
        "maxUnavailable resolves to 0 (a rollout surges instead, which a resize cannot): one pod"
        " at a time, each only while every other pod is Ready"
    )


def _declared_unavailable(kind: WorkloadKind, owner: Obj, desired: int | None) -> int | None:
    path, default = _MAX_UNAVAILABLE.get(kind, ((), 1))
    value = dig(owner, *path) if path else None
    if value is None:
        value = default
    if isinstance(value, str) and value.endswith("%") and value[:-1].isdigit():
        return (desired or 0) * int(value[:-1]) // 100
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return None


def pod_containers(pod_spec: Obj | None) -> list[Obj]:
    return list((pod_spec or {}).get("containers") or [])


def resources_of(containers: list[Obj]) -> tuple[Resources, Resources]:
    requests: Resources = {}
    limits: Resources = {}
    for c in containers:
        res = c.get("resources") or {}
        if res.get("requests"):
            requests[c["name"]] = {k: str(v) for k, v in res["requests"].items()}
        if res.get("limits"):
            limits[c["name"]] = {k: str(v) for k, v in res["limits"].items()}
    return requests, limits


def manifest_resources(kind: WorkloadKind, owner: Obj) -> tuple[Resources, Resources] | None:
    """Requests and limits the workload's own manifest declares; ``None`` when it has none."""
    try:
        return _manifest_resources(kind, owner)
    except (TypeError, ValueError, AttributeError, KeyError, IndexError) as exc:
        raise InvalidOwnerError(f"{kind}: unreadable pod template: {exc!r}") from None


def _manifest_resources(kind: WorkloadKind, owner: Obj) -> tuple[Resources, Resources] | None:
    spec = OWNER_KINDS[kind]
    if spec.template is not None:
        return resources_of(pod_containers(dig(owner, *spec.template)))
    if kind is WorkloadKind.STRIMZI_POD_SET:
        pods = dig(owner, "spec", "pods") or []
        return resources_of(pod_containers(pods[0].get("spec"))) if pods else None
    return None  # AnalysisRun, Model: no pod template to go back to
