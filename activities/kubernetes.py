"""The workflow's activities against a real cluster, through the official ``kubernetes`` client.

``KubernetesActivities`` receives its API clients in the constructor and implements every name of
``workflows.activity_api``. The rules it keeps:

- One LIST of pods per owner per sample (selector based), never a GET per pod; the owner itself
  is read only at the first sample of a window (the workflow carries the cohort query after).
- Writes are computed first and applied as one merge patch carrying the ``resourceVersion`` it
  was computed from; a 409 re-reads and recomputes; an empty diff writes nothing. A retried
  activity therefore never applies a transition twice.
- Events are named after the transition (``<owner>.rb-<digest of workflow run and step>``): a
  retry that re-creates one gets 409 AlreadyExists and emits nothing new.
- 404 on the owner ends the attempt cleanly (``exists=False``). Writes are retried here a few
  times on 409 and on transient errors (429, 5xx, timeouts, dropped connections): safe, since
  the resourceVersion precondition and the Event names make a repeated write a no-op, and
  cheaper than an activity retry. Reads are retried inside the call by the API client
  (``worker.kube``). What is left raises, and Temporal retries the activity with backoff (see
  ``workflows.rollback.K8S_RETRY``).

Actuation has two modes (worker configuration): ``annotations`` publishes the rollback
recommendation on the owner for an external applier; ``in-place`` publishes it too and resizes
the running cohort pods through ``pods/resize``, skipping (never deleting) pods whose node lacks
the capacity for larger requests.
"""

from __future__ import annotations

import hashlib
import json
import logging
import socket
import time
from datetime import UTC, datetime
from decimal import Decimal
from enum import StrEnum
from typing import Any

from kubernetes.client import CoreV1Api, CustomObjectsApi
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError
from temporalio import activity
from urllib3.exceptions import HTTPError

from activities.cohort import Tally, actual_resources, in_cohort, judge
from activities.kubetime import kube_now
from activities.owners import (
    ANALYSIS_RUN_UID_LABEL,
    INTERMEDIATE,
    OWNER_KINDS,
    cohort_query,
    controller_of,
    desired_replicas,
    manifest_resources,
)
from workflows.activity_api import (
    LOAD_OWNER,
    REAPPLY_RECOMMENDATION,
    RECORD_TRANSITION,
    RESOLVE_POLICY,
    ROLL_BACK,
    SAMPLE_COHORT,
    ActuationResult,
    CohortQuery,
    CohortSample,
    LoadOwnerInput,
    LoadOwnerResult,
    OwnerRef,
    PolicySettings,
    ReapplyInput,
    RecordTransitionInput,
    RecordTransitionResult,
    ResolvePolicyInput,
    ResolvePolicyResult,
    RollBackInput,
    SampleCohortInput,
)
from workflows.contract import (
    API_GROUP,
    API_VERSION,
    ROLLBACK_LIMITS_ANNOTATION,
    ROLLBACK_REQUESTS_ANNOTATION,
    ROLLBACK_STATE_ANNOTATION,
    EventReason,
    RollbackTarget,
    WorkloadKind,
)
from workflows.fingerprint import MalformedRecommendationError, Resources
from workflows.policy import POLICY_KINDS, AnyPolicy
from workflows.quantities import parse_quantity
from workflows.selection import WorkloadRef, policy_id, resolve
from workflows.state import OwnerState, ResourceSnapshot

log = logging.getLogger(__name__)
Obj = dict[str, Any]

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
WRITE_ATTEMPTS = 5
TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})
COMPONENT = "rightsizing-rollback"
PARENT_CACHE_SIZE = 10_000
WORKLOAD_KINDS = frozenset(k.value for k in WorkloadKind)
# The workload kinds that may control an intermediate ReplicaSet or Job.
PARENT_KINDS = {"ReplicaSet": ("Deployment", "Rollout"), "Job": ("CronJob", "AnalysisRun")}


class Actuation(StrEnum):
    ANNOTATIONS = "annotations"  # publish the rollback recommendation for an external applier
    IN_PLACE = "in-place"  # publish it and resize running pods through pods/resize


def already_exists(exc: ApiException) -> bool:
    """409 AlreadyExists on a create (not a 409 Conflict, which is worth retrying)."""
    if exc.status != 409:
        return False
    try:
        return bool(json.loads(exc.body or "{}").get("reason") == "AlreadyExists")
    except ValueError:
        return False


def transient(exc: Exception) -> bool:
    """An error after which the same request may well succeed."""
    if isinstance(exc, ApiException):
        return exc.status in TRANSIENT_STATUSES
    return isinstance(exc, (HTTPError, OSError))  # timeouts, refused or dropped connections


def pause_before_retry(what: str, exc: Exception, attempt: int) -> None:
    """Sleep briefly before another try of a safe-to-repeat write, or re-raise ``exc``."""
    if not transient(exc) or attempt + 1 >= WRITE_ATTEMPTS:
        raise exc
    log.info("%s failed (%s), retrying", what, str(exc).splitlines()[0])
    time.sleep(0.2 * 2**attempt)


def event_body(
    involved: Obj,
    identity: str,
    reason: str,
    message: str,
    event_type: str,
    component: str,
    instance: str | None = None,
) -> Obj:
    """A core/v1 Event about ``involved`` (an object reference), named after ``identity``
    (``<name>.rb-<digest>``): creating the same one again is 409 AlreadyExists."""
    now = kube_now()
    digest = hashlib.sha256(identity.encode()).hexdigest()[:12]
    body: Obj = {
        "metadata": {"name": f"{involved['name']}.rb-{digest}", "namespace": involved["namespace"]},
        "involvedObject": involved,
        "reason": reason,
        "message": message[:1024],
        "type": event_type,
        "source": {"component": component},
    }
    if instance is not None:
        body |= {"reportingComponent": f"{API_GROUP}/rollback", "reportingInstance": instance}
    return body | {"firstTimestamp": now, "lastTimestamp": now, "count": 1}


class ConflictError(Exception):
    """The owner kept changing under us; Temporal retries the activity."""


def _body(response: Any) -> Any:
    """The decoded JSON of a call made with ``_preload_content=False`` (dicts, no models)."""
    return json.loads(response.data)


def _json(values: Resources) -> str | None:
    return json.dumps(values, sort_keys=True, separators=(",", ":")) if values else None


class KubernetesActivities:
    def __init__(
        self,
        core: CoreV1Api,
        custom: CustomObjectsApi,
        actuation: Actuation = Actuation.ANNOTATIONS,
        instance: str | None = None,
    ) -> None:
        self.core = core
        self.custom = custom
        self.actuation = actuation
        self.instance = instance or socket.gethostname()
        self._parents: dict[tuple[str, str, str], Obj | None] = {}

    # --- reads ----------------------------------------------------------------------------------

    def _owner(self, owner: OwnerRef) -> Obj | None:
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

    def _pods(self, namespace: str, query: CohortQuery) -> list[Obj]:
        response = self.core.list_namespaced_pod(
            namespace, label_selector=query.label_selector, _preload_content=False
        )
        pods: list[Obj] = _body(response)["items"]
        return [
            p for p in pods if in_cohort(p, query) and not p["metadata"].get("deletionTimestamp")
        ]

    def _cohort_query(self, owner: OwnerRef, obj: Obj) -> CohortQuery:
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

    def _policy(self, owner: OwnerRef, obj: Obj) -> PolicySettings | None:
        """Resolve the owner's policy from the cluster's policies (two LISTs)."""
        namespaced: Any = self.custom.list_namespaced_custom_object(
            API_GROUP, API_VERSION, owner.namespace, "rollbackpolicies"
        )
        cluster: Any = self.custom.list_cluster_custom_object(
            API_GROUP, API_VERSION, "clusterrollbackpolicies"
        )
        docs = namespaced.get("items", []) + cluster.get("items", [])
        policies: list[AnyPolicy] = []
        for doc in docs:
            try:
                policies.append(POLICY_KINDS[doc.get("kind", "")].model_validate(doc))
            except (KeyError, ValidationError) as exc:
                log.warning(
                    "ignoring invalid policy %s: %s", doc.get("metadata", {}).get("name"), exc
                )
        labels = obj["metadata"].get("labels") or {}
        workload = WorkloadRef(owner.kind, owner.namespace, owner.name, labels)
        winner = resolve(policies, workload).policy
        if winner is None:
            return None
        log.info("%s: policy %s applies", owner, policy_id(winner))
        return PolicySettings.of(winner)

    def owner_of(self, pod: Obj) -> OwnerRef | None:
        """The workload owning ``pod``: up through its ReplicaSet or Job where there is one.

        A ReplicaSet's or Job's own controller never changes, so each is read once and cached.
        Bare pods and pods of kinds that are not workloads (a bare ReplicaSet) have none.
        """
        ref = controller_of(pod)
        namespace = pod["metadata"].get("namespace", "default")
        if ref is None:
            return None
        kind, name = ref.get("kind", ""), ref.get("name", "")
        if kind in INTERMEDIATE:
            key = (namespace, kind, name)
            if key not in self._parents:
                group, version, plural = INTERMEDIATE[kind]
                try:
                    parent: Any = self.custom.get_namespaced_custom_object(
                        group, version, namespace, plural, name
                    )
                except ApiException as exc:
                    if exc.status == 404:
                        return None
                    raise
                if len(self._parents) >= PARENT_CACHE_SIZE:
                    self._parents.pop(next(iter(self._parents)))
                self._parents[key] = controller_of(parent)
            up = self._parents[key]
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

    # --- activities -----------------------------------------------------------------------------

    @activity.defn(name=LOAD_OWNER)
    def load_owner(self, input: LoadOwnerInput) -> LoadOwnerResult:
        obj = self._owner(input.owner)
        if obj is None:
            return LoadOwnerResult(exists=False)
        raw = (obj["metadata"].get("annotations") or {}).get(ROLLBACK_STATE_ANNOTATION)
        state, error = None, None
        if raw:
            try:
                state = OwnerState.model_validate_json(raw)
            except ValidationError as exc:
                error = f"{ROLLBACK_STATE_ANNOTATION}: {exc.errors()[0]['msg']}"
                log.warning("%s: unreadable rollback state: %s", input.owner, error)
        return LoadOwnerResult(
            exists=True, state=state, state_error=error, policy=self._policy(input.owner, obj)
        )

    @activity.defn(name=RESOLVE_POLICY)
    def resolve_policy(self, input: ResolvePolicyInput) -> ResolvePolicyResult:
        obj = self._owner(input.owner)
        if obj is None:
            return ResolvePolicyResult(exists=False)
        return ResolvePolicyResult(policy=self._policy(input.owner, obj))

    @activity.defn(name=SAMPLE_COHORT)
    def sample_cohort(self, input: SampleCohortInput) -> CohortSample:
        started = time.monotonic()
        try:
            return self._sample(input)
        finally:
            if activity.in_activity():
                activity.metric_meter().create_histogram(
                    "rollback_sample_latency", "one cohort sample", "ms"
                ).record(int((time.monotonic() - started) * 1000))

    def _sample(self, input: SampleCohortInput) -> CohortSample:
        owner, desired, query = input.owner, None, input.cohort
        if query is None:
            obj = self._owner(owner)
            if obj is None:
                return CohortSample(exists=False, pods=0, adopted=0, adopted_healthy=0)
            query, desired = self._cohort_query(owner, obj), desired_replicas(owner.kind, obj)
        tally = Tally()
        for pod in self._pods(owner.namespace, query):
            try:
                tally.add(judge(pod, input.recommendation, input.window_started_at))
            except MalformedRecommendationError as exc:
                error = f"pod {pod['metadata']['name']}: malformed recommendation: {exc}"
                log.warning("%s: %s", owner, error)
                return CohortSample(pods=0, adopted=0, adopted_healthy=0, error=error, cohort=query)
        return CohortSample(
            desired=desired,
            pods=tally.pods,
            adopted=tally.adopted,
            adopted_healthy=tally.adopted_healthy,
            unhealthy=dict(tally.reasons),
            message=tally.message(),
            observed_at=datetime.now(UTC),
            cohort=query,
        )

    @activity.defn(name=RECORD_TRANSITION)
    def record_transition(self, input: RecordTransitionInput) -> RecordTransitionResult:
        wanted: dict[str, str | None] = {
            ROLLBACK_STATE_ANNOTATION: input.state.to_json() if input.state else None
        }
        if input.clear_rollback_recommendation:
            wanted |= {ROLLBACK_REQUESTS_ANNOTATION: None, ROLLBACK_LIMITS_ANNOTATION: None}
        obj, written = self._patch_annotations(input.owner, wanted)
        if obj is None:
            return RecordTransitionResult(exists=False)
        emitted = False
        if input.event_reason is not None:
            emitted = self._event(input, input.event_reason, obj)
        return RecordTransitionResult(state_written=written, event_emitted=emitted)

    @activity.defn(name=ROLL_BACK)
    def roll_back(self, input: RollBackInput) -> ActuationResult:
        obj = self._owner(input.owner)
        if obj is None:
            return ActuationResult(exists=False)
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
        obj, _ = self._patch_annotations(
            input.owner,
            {
                ROLLBACK_REQUESTS_ANNOTATION: _json(requests),
                ROLLBACK_LIMITS_ANNOTATION: _json(limits),
            },
        )
        if obj is None:
            return ActuationResult(exists=False)
        result = ActuationResult(
            applied=ResourceSnapshot.of(requests, limits),
            message=f"rollback recommendation ({input.target}) published on the owner",
        )
        if self.actuation is Actuation.IN_PLACE:
            result = self._resize_cohort(input.owner, obj, requests, limits, result)
        return result

    @activity.defn(name=REAPPLY_RECOMMENDATION)
    def reapply_recommendation(self, input: ReapplyInput) -> ActuationResult:
        rec = input.recommendation
        result = ActuationResult(
            applied=ResourceSnapshot.of(rec.requests, rec.limits),
            message="rollback recommendation cleared: the applier re-applies the recommendation",
        )
        if self.actuation is not Actuation.IN_PLACE:
            return result
        obj = self._owner(input.owner)
        if obj is None:
            return ActuationResult(exists=False)
        return self._resize_cohort(input.owner, obj, rec.requests, rec.limits, result)

    # --- writes ---------------------------------------------------------------------------------

    def _patch_annotations(
        self, owner: OwnerRef, wanted: dict[str, str | None]
    ) -> tuple[Obj | None, bool]:
        """Bring the owner's annotations to ``wanted`` (``None`` removes); no diff, no write."""
        kind = OWNER_KINDS[owner.kind]
        for attempt in range(WRITE_ATTEMPTS):
            try:
                obj = self._owner(owner)
                if obj is None:
                    return None, False
                current = obj["metadata"].get("annotations") or {}
                changes = {k: v for k, v in wanted.items() if current.get(k) != v}
                if not changes:
                    return obj, False
                body = {
                    "metadata": {
                        "resourceVersion": obj["metadata"]["resourceVersion"],
                        "annotations": changes,
                    }
                }
                patched: Obj = self.custom.patch_namespaced_custom_object(  # type: ignore[assignment]
                    kind.group,
                    kind.version,
                    owner.namespace,
                    kind.plural,
                    owner.name,
                    body,
                    _content_type=MERGE_PATCH,
                )
                return patched, True
            except (ApiException, HTTPError, OSError) as exc:
                status = getattr(exc, "status", None)
                if status == 404:
                    return None, False
                if status == 409:  # written meanwhile (maybe by our own timed-out try)
                    log.info("%s: conflict writing annotations, re-reading", owner)
                    continue
                pause_before_retry(f"{owner}: writing annotations", exc, attempt)
        raise ConflictError(f"{owner}: still conflicting after {WRITE_ATTEMPTS} attempts")

    def _event(self, input: RecordTransitionInput, reason: EventReason, obj: Obj) -> bool:
        owner = input.owner
        body = event_body(
            {
                "apiVersion": OWNER_KINDS[owner.kind].api_version,
                "kind": owner.kind.value,
                "name": owner.name,
                "namespace": owner.namespace,
                "uid": obj["metadata"].get("uid"),
            },
            input.event_id,
            reason,
            input.event_message,
            input.event_type,
            COMPONENT,
            self.instance,
        )
        attempt = 0
        while True:  # until created, found, or pause_before_retry re-raises
            try:
                self.core.create_namespaced_event(owner.namespace, body)  # type: ignore[arg-type]
                return True
            except (ApiException, HTTPError, OSError) as exc:
                if isinstance(exc, ApiException) and already_exists(exc):
                    return False  # this transition's Event exists: a retry
                pause_before_retry(f"{owner}: creating Event {reason}", exc, attempt)
            attempt += 1

    def _resize_cohort(
        self,
        owner: OwnerRef,
        obj: Obj,
        requests: Resources,
        limits: Resources,
        result: ActuationResult,
    ) -> ActuationResult:
        """Resize running cohort pods to the target; skip those whose node lacks capacity."""
        pods = self._pods(owner.namespace, self._cohort_query(owner, obj))
        free = NodeCapacity(self.core)
        resized, filtered, restarts = 0, [], set()
        for pod in pods:
            if pod.get("status", {}).get("phase") != "Running":
                continue  # pending pods are admitted with the owner's resources when they start
            actual_req, actual_lim = actual_resources(pod)
            containers = _resize_body(pod, actual_req, actual_lim, requests, limits)
            if not containers:
                continue
            growth = _growth(actual_req, requests)
            if growth and not free.fits(pod, growth):
                filtered.append(pod["metadata"]["name"])
                continue
            self.core.patch_namespaced_pod_resize(
                pod["metadata"]["name"],
                owner.namespace,
                {"spec": {"containers": containers}},
                _content_type=STRATEGIC_MERGE_PATCH,
                _preload_content=False,
            )
            free.take(pod, growth)
            resized += 1
            restarts |= _restarting(pod, containers)
        message = f"{result.message}; {resized} pods resized in place"
        if filtered:
            message += (
                f"; {len(filtered)} filtered for lack of node capacity ({', '.join(filtered)})"
            )
        if restarts:
            message += (
                f"; containers restart to apply (RestartContainer): {', '.join(sorted(restarts))}"
            )
        return result.model_copy(
            update={"pods_resized": resized, "pods_filtered": filtered, "message": message}
        )


def _resize_body(
    pod: Obj, actual_req: Resources, actual_lim: Resources, requests: Resources, limits: Resources
) -> list[Obj]:
    """Container patches for what differs from the target; empty when the pod is already there."""
    body = []
    for container in pod.get("spec", {}).get("containers") or []:
        name = container["name"]
        change: Obj = {}
        for key, target, actual in (
            ("requests", requests, actual_req),
            ("limits", limits, actual_lim),
        ):
            wanted = target.get(name) or {}
            have = actual.get(name) or {}
            diff = {
                r: q
                for r, q in wanted.items()
                if r not in have or parse_quantity(have[r]) != parse_quantity(q)
            }
            if diff:
                change[key] = diff
        if change:
            body.append({"name": name, "resources": change})
    return body


def _growth(actual: Resources, target: Resources) -> dict[str, Decimal]:
    """By how much the pod's total requests grow, per resource (shrinks count as zero)."""
    growth: dict[str, Decimal] = {}
    for container, wanted in target.items():
        for resource, quantity in wanted.items():
            before = parse_quantity(actual.get(container, {}).get(resource, "0"))
            delta = parse_quantity(quantity) - before
            if delta > 0:
                growth[resource] = growth.get(resource, Decimal(0)) + delta
    return growth


def _restarting(pod: Obj, containers: list[Obj]) -> set[str]:
    """Containers whose resize policy restarts them for a resource this resize changes."""
    changed = {
        c["name"]: set(c["resources"].get("requests", {})) | set(c["resources"].get("limits", {}))
        for c in containers
    }
    names = set()
    for container in pod.get("spec", {}).get("containers") or []:
        for policy in container.get("resizePolicy") or []:
            if policy.get("restartPolicy") == "RestartContainer" and policy.get(
                "resourceName"
            ) in changed.get(container["name"], set()):
                names.add(f"{pod['metadata']['name']}/{container['name']}")
    return names


class NodeCapacity:
    """Free allocatable per node, read lazily (one LIST of nodes, one LIST of pods per node)."""

    def __init__(self, core: CoreV1Api) -> None:
        self.core = core
        self._free: dict[str, dict[str, Decimal]] | None = None
        self._nodes: dict[str, Obj] = {}

    def _load_node(self, node: str) -> dict[str, Decimal]:
        if self._free is None:
            listed = _body(self.core.list_node(_preload_content=False))["items"]
            self._nodes = {n["metadata"]["name"]: n for n in listed}
            self._free = {}
        if node not in self._free:
            allocatable = (self._nodes.get(node, {}).get("status") or {}).get("allocatable") or {}
            free = {r: parse_quantity(str(q)) for r, q in allocatable.items()}
            on_node = _body(
                self.core.list_pod_for_all_namespaces(
                    field_selector=f"spec.nodeName={node}", _preload_content=False
                )
            )["items"]
            for pod in on_node:
                if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                    continue
                requests, _ = actual_resources(pod)
                for values in requests.values():
                    for r, q in values.items():
                        if r in free:
                            free[r] -= parse_quantity(q)
            self._free[node] = free
        return self._free[node]

    def fits(self, pod: Obj, growth: dict[str, Decimal]) -> bool:
        node = pod.get("spec", {}).get("nodeName")
        if not node:
            return True
        free = self._load_node(node)
        return all(free.get(r, Decimal("Infinity")) >= g for r, g in growth.items())

    def take(self, pod: Obj, growth: dict[str, Decimal]) -> None:
        node = pod.get("spec", {}).get("nodeName")
        if node and self._free is not None and node in self._free:
            for r, g in growth.items():
                if r in self._free[node]:
                    self._free[node][r] -= g
