"""Reading the cluster: owners, the owner above a pod, an owner's stored state and policy, and its
cohort's pods. Every read of the activities and of the intake goes through ``OwnerLookup``.

- ``get``: one GET of the owner (any of the nine kinds, through ``CustomObjectsApi``); None on 404.
- ``owner_of``: up from a pod through its ReplicaSet or Job. A ReplicaSet's or Job's controller
  never changes, so each is read once and cached (bounded); bare pods have no owner.
- ``policy``: the owner's policy from two LISTs (namespaced, cluster), resolved by
  ``workflows.selection``; invalid policies are skipped with a log line. At an attempt's start
  the policy its starter resolved is carried instead (no LIST), unless the namespace is
  protected.
- ``cohort_query`` / ``pods``: how to LIST the cohort in one call, and that LIST.

Reads are retried inside the call by the API client (``worker.kube``); nothing here retries.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

from kubernetes.client import CoreV1Api, CustomObjectsApi
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from activities.cohort import in_cohort
from activities.neighbours import autoscaler_of
from activities.owners import (
    ANALYSIS_RUN_UID_LABEL,
    INTERMEDIATE,
    OWNER_KINDS,
    cohort_query,
    controller_of,
)
from workflows.activity_api import CohortQuery, OwnerRef, PolicySettings
from workflows.contract import (
    API_GROUP,
    API_VERSION,
    DEFAULT_ENGINE_NAMESPACE,
    ROLLBACK_STATE_ANNOTATION,
    Obj,
    WorkloadKind,
)
from workflows.pause import Pause, cluster_hold, effective_pause
from workflows.policy import POLICY_KINDS, AnyPolicy
from workflows.selection import PROTECTED, Protection, WorkloadRef, resolve
from workflows.state import Autoscaler, OwnerState, PolicyRef

log = logging.getLogger(__name__)

PARENT_CACHE_SIZE = 10_000
WORKLOAD_KINDS = frozenset(k.value for k in WorkloadKind)
# The workload kinds that may control an intermediate ReplicaSet or Job.
PARENT_KINDS = {"ReplicaSet": ("Deployment", "Rollout"), "Job": ("CronJob", "AnalysisRun")}


def body(response: Any) -> Any:
    """The decoded JSON of a call made with ``_preload_content=False`` (dicts, no models)."""
    return json.loads(response.data)


def read_state(obj: Obj) -> tuple[OwnerState | None, str | None]:
    """The owner's stored rollback state, or why it is unreadable (the workflow replaces it)."""
    raw = (obj["metadata"].get("annotations") or {}).get(ROLLBACK_STATE_ANNOTATION)
    if not raw:
        return None, None
    try:
        return OwnerState.model_validate_json(raw), None
    except ValidationError as exc:
        return None, f"{ROLLBACK_STATE_ANNOTATION}: {exc.errors()[0]['msg']}"


class OwnerLookup:
    def __init__(
        self,
        core: CoreV1Api,
        custom: CustomObjectsApi,
        protection: Protection = PROTECTED,
        engine_namespace: str = DEFAULT_ENGINE_NAMESPACE,
    ) -> None:
        self.core = core
        self.custom = custom
        self.protection = protection  # namespaces where no policy applies
        self.engine_namespace = engine_namespace  # where the kill switch and the breaker are
        self._parents: dict[tuple[str, str, str], Obj | None] = {}

    def get(self, owner: OwnerRef) -> Obj | None:
        kind = OWNER_KINDS[owner.kind]
        try:
            obj: Obj = self.custom.get_namespaced_custom_object(  # type: ignore[assignment]
                kind.group, kind.version, owner.namespace, kind.plural, owner.name
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return obj

    def owner_of(self, pod: Obj) -> OwnerRef | None:
        """The workload owning ``pod``: up through its ReplicaSet or Job where there is one."""
        ref = controller_of(pod)
        namespace = pod["metadata"].get("namespace", "default")
        if ref is None:
            return None
        kind, name = ref.get("kind", ""), ref.get("name", "")
        if kind in INTERMEDIATE:
            found, up = self.parent(namespace, kind, name)
            if not found:
                return None
            if up is not None and up.get("kind") in PARENT_KINDS[kind]:
                return OwnerRef(namespace=namespace, kind=WorkloadKind(up["kind"]), name=up["name"])
            return (
                OwnerRef(namespace=namespace, kind=WorkloadKind.JOB, name=name)
                if kind == "Job"
                else None
            )
        if kind in WORKLOAD_KINDS:
            return OwnerRef(namespace=namespace, kind=WorkloadKind(kind), name=name)
        return None

    def parent(self, namespace: str, kind: str, name: str) -> tuple[bool, Obj | None]:
        """(exists, its controller reference) of a ReplicaSet or Job: read once, then cached
        (a controller never changes)."""
        key = (namespace, kind, name)
        if key not in self._parents:
            group, version, plural = INTERMEDIATE[kind]
            try:
                parent: Any = self.custom.get_namespaced_custom_object(
                    group, version, namespace, plural, name
                )
            except ApiException as exc:
                if exc.status == 404:
                    return False, None
                raise
            if len(self._parents) >= PARENT_CACHE_SIZE:
                self._parents.pop(next(iter(self._parents)))
            self._parents[key] = controller_of(parent)
        return True, self._parents[key]

    def policy(
        self, owner: OwnerRef, obj: Obj, carried: PolicySettings | None = None
    ) -> PolicySettings | None:
        """The owner's policy: ``carried`` (resolved by the attempt's starter, the intake, from
        its watch) unless the namespace is protected, else resolved from the cluster's
        policies (two LISTs)."""
        if carried is not None and self.protection.reason(owner.namespace) is None:
            return carried
        namespaced: Any = self.custom.list_namespaced_custom_object(
            API_GROUP, API_VERSION, owner.namespace, "rollbackpolicies"
        )
        cluster: Any = self.custom.list_cluster_custom_object(
            API_GROUP, API_VERSION, "clusterrollbackpolicies"
        )
        policies: list[AnyPolicy] = []
        for doc in namespaced.get("items", []) + cluster.get("items", []):
            try:
                policies.append(POLICY_KINDS[doc.get("kind", "")].model_validate(doc))
            except Exception as exc:  # one bad policy is that policy's problem: skip it
                log.warning(
                    "ignoring invalid policy %s: %s", doc.get("metadata", {}).get("name"), exc
                )
        labels = obj["metadata"].get("labels") or {}
        workload = WorkloadRef(owner.kind, owner.namespace, owner.name, labels)
        winner = resolve(policies, workload, self.protection)
        if winner.policy is None:
            return None
        log.info("%s: policy %s applies", owner, PolicyRef.of(winner.policy))
        return PolicySettings.of(winner.policy)

    def autoscaler(self, owner: OwnerRef) -> Autoscaler | None:
        """The owner's HorizontalPodAutoscaler (``neighbours.autoscaler_of``): one LIST of its
        namespace's; None when none scales it, or the cluster serves no autoscaling/v2."""
        try:
            listed: Any = self.custom.list_namespaced_custom_object(
                "autoscaling", "v2", owner.namespace, "horizontalpodautoscalers"
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return autoscaler_of(owner.kind, owner.name, listed.get("items", []))

    def cohort_query(self, owner: OwnerRef, obj: Obj) -> CohortQuery:
        jobs = None
        if owner.kind is WorkloadKind.ANALYSIS_RUN:
            listed: Any = self.custom.list_namespaced_custom_object(
                "batch",
                "v1",
                owner.namespace,
                "jobs",
                label_selector=f"{ANALYSIS_RUN_UID_LABEL}={obj['metadata'].get('uid', '')}",
            )
            jobs = [j["metadata"]["name"] for j in listed.get("items", [])]
        return cohort_query(owner.kind, obj, jobs)

    def pause(self, owner: OwnerRef, obj: Obj, pods: list[Obj]) -> Pause | None:
        """The pause holding the owner now (``workflows.pause``), from its annotations, its
        pods' (as listed) and its namespace's (one GET)."""
        return effective_pause(
            [(p["metadata"]["name"], p["metadata"].get("annotations")) for p in pods],
            (str(owner), obj["metadata"].get("annotations")),
            (owner.namespace, self._namespace_annotations(owner.namespace)),
            datetime.now(UTC),
        )

    def cluster_hold(self) -> Pause | None:
        """The kill switch or the storm breaker, off the engine's namespace (one GET;
        ``workflows.pause.cluster_hold``)."""
        name = self.engine_namespace
        return cluster_hold((name, self._namespace_annotations(name)))

    def _namespace_annotations(self, name: str) -> dict[str, str] | None:
        try:
            namespace: Any = self.core.read_namespace(name, _preload_content=False)
        except ApiException as exc:
            if exc.status != 404:
                raise
            return None
        annotations: dict[str, str] | None = body(namespace)["metadata"].get("annotations")
        return annotations

    def pods(self, namespace: str, query: CohortQuery) -> list[Obj]:
        """The cohort in one LIST: the selector server-side, the Job-name pattern client-side."""
        return self.pods_listed(namespace, query)[0]

    def pods_listed(self, namespace: str, query: CohortQuery) -> tuple[list[Obj], str]:
        """``pods``, and the LIST's resourceVersion (to watch from)."""
        response = self.core.list_namespaced_pod(
            namespace, label_selector=query.label_selector, _preload_content=False
        )
        listed = body(response)
        pods: list[Obj] = listed["items"]
        cohort = [
            p for p in pods if in_cohort(p, query) and not p["metadata"].get("deletionTimestamp")
        ]
        return cohort, listed["metadata"]["resourceVersion"]
