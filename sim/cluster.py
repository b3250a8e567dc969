"""A small control plane and kubelet on top of the emulator's store: enough cluster to watch a
rightsizing rollback happen.

Every tick (default 100ms) it runs, in order:

- **controllers**: Deployment and Rollout (through a ReplicaSet per template: a template change
  rolls the pods over to a new one), StatefulSet, DaemonSet (a pod per node), Job
  (``parallelism`` pods that run to completion), CronJob (one Job), KubeAI Model (``model=<name>``
  pods) and StrimziPodSet (one pod per ``spec.pods`` entry) create and recreate pods from their
  template, and delete extras; a workload created through the API (``kubectl apply``) is
  controlled too, its app with the default behaviour;
- **admission**: a new pod gets the owner's highest-precedence resources (the rollback
  recommendation, else the static/proactive recommendation, else the template) and the owner's
  recommendation annotations;
- **applier**: as a rightsizing engine would, resizes running pods in place to the owner's
  current target (rollback over recommendation), filtering pods whose node lacks the capacity;
  pending pods that can never schedule are deleted so admission gives them the new target. A
  cluster whose engine actuates in place (``applies_rollbacks=False``) leaves rollbacks to it;
- a container whose resize policy is ``RestartContainer`` restarts to apply a resize: not
  Ready for its startup time;
- **kubelet**: schedules pods onto nodes with free allocatable (else Pending/Unschedulable),
  starts them after their startup time, reports ``containerStatuses[].resources``, actuates
  ``pods/resize`` (Infeasible beyond the node, Deferred beyond its free capacity), OOM-kills a
  container whose memory is below the app's working set (exits one running a bad image with an
  error, as a bad release's would) and starts it again after the restart backoff
  (CrashLoopBackOff: 10 s doubling to 5 minutes, ``sim.backoff``), and completes Job pods.
- **disruption controller**: each PodDisruptionBudget's status, as the real one computes it
  (``sim.disruption``);
- **horizontal pod autoscaler**: each HorizontalPodAutoscaler scales its target on the CPU its
  Ready pods use of their requests, as the real one computes it (``sim.autoscaler``).

Each of them records the Events its real counterpart does, so a cluster's own history of its pods
is there to read (``kubectl get events``, ``rollbackctl describe --report``): the controllers'
``SuccessfulCreate``/``SuccessfulDelete`` ("Created pod: NAME") on the pod's parent, the
scheduler's ``Scheduled``, the kubelet's ``Started`` (each start of a container, a restart
too), ``BackOff`` (a crash loop), ``Killing`` (a deleted pod) and ``ResizeCompleted`` (the
resources an in-place resize actuated, in the kubelet's own message format). The same Event
again counts up (``count``, ``lastTimestamp``), as the recorders' aggregation does.

The application's behaviour per container (working set, startup time, run time) comes from the
scenario. Nothing here talks HTTP: it acts on the store, whose watches the engine sees.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from activities.kubetime import kube_now
from activities.owners import dig
from sim.apiserver import ApiError, Store
from sim.autoscaler import AutoscalerController
from sim.backoff import RestartBackoff
from sim.disruption import DisruptionController
from workflows.contract import (
    ROLLBACK_LIMITS_ANNOTATION,
    ROLLBACK_REQUESTS_ANNOTATION,
    ROLLBACK_STATE_ANNOTATION,
    Obj,
)
from workflows.durations import parse_duration
from workflows.fingerprint import (
    MalformedRecommendationError,
    Resources,
    is_recommendation_key,
    recommendations_from_annotations,
)
from workflows.quantities import parse_quantity, positive

log = logging.getLogger(__name__)

MERGE = "application/merge-patch+json"
OOM_EVERY = 1.0  # seconds an undersized (or broken) container runs before it exits


def _throttled(behaviour: Behaviour, limit: Any) -> float:
    """The share of CFS periods a container's CPU limit throttles: 1 - limit/usage, or 0."""
    if behaviour.cpu is None or limit is None:
        return 0.0
    usage, quota = parse_quantity(behaviour.cpu), parse_quantity(str(limit))
    return float(max(Decimal(0), 1 - quota / usage)) if usage > 0 else 0.0


def _reference(obj: Obj) -> Obj:
    """An Event's ``involvedObject`` for ``obj``."""
    meta = obj["metadata"]
    return {
        "apiVersion": obj.get("apiVersion", "v1"),
        "kind": obj.get("kind", "Pod"),
        "name": meta["name"],
        "namespace": meta.get("namespace", ""),
        "uid": meta.get("uid", ""),
    }


@dataclass
class Behaviour:
    """How the application in one container behaves."""

    working_set: str | None = None  # memory it needs; below it the container is OOMKilled
    startup: float = 0.5  # seconds from scheduling to Ready
    run_for: float | None = None  # Job pods: seconds until Succeeded
    # CPU it would use, in cores (e.g. "800m"): a CPU limit below it throttles the container
    # (the share of CFS periods throttled is 1 - limit/usage); None: idle.
    cpu: str | None = None
    # Its requests' latency when unthrottled (e.g. "50ms"), served as the app's own metric
    # app_request_latency_seconds; throttled, a request takes as much longer as its CPU is cut
    # (latency / (1 - throttled share)). None: no such metric.
    latency: str | None = None
    # Images that fail at start (a bad release): the container exits with an error a moment
    # after each start and waits in CrashLoopBackOff, whatever its resources.
    bad_images: tuple[str, ...] = ()


@dataclass
class Workload:
    kind: str
    namespace: str
    name: str
    behaviour: dict[str, Behaviour] = field(default_factory=dict)
    pod_template: Obj | None = None  # for kinds without one (Model)


def _merge(containers: list[Obj], requests: Resources, limits: Resources) -> list[Obj]:
    out = copy.deepcopy(containers)
    for c in out:
        res = c.setdefault("resources", {})
        for key, values in (("requests", requests), ("limits", limits)):
            if values.get(c["name"]):
                res.setdefault(key, {}).update(values[c["name"]])
    return out


def _requests(containers: list[Obj]) -> dict[str, Decimal]:
    total: dict[str, Decimal] = {}
    for c in containers:
        for r, q in ((c.get("resources") or {}).get("requests") or {}).items():
            total[r] = total.get(r, Decimal(0)) + parse_quantity(str(q))
    return total


def _same_resources(a: list[Obj], b: list[Obj]) -> bool:
    def canon(containers: list[Obj]) -> dict[str, Any]:
        return {
            c["name"]: {
                k: {r: parse_quantity(str(q)) for r, q in (v or {}).items()}
                for k, v in (c.get("resources") or {}).items()
            }
            for c in containers
        }

    return canon(a) == canon(b)


def _rs_name(owner: str, template: Obj) -> str:
    """The ReplicaSet of a pod template, named as the real controller names it (a hash)."""
    digest = hashlib.sha256(json.dumps(template, sort_keys=True).encode())
    return f"{owner}-{digest.hexdigest()[:8]}"


def _moved(before: Obj, after: Obj) -> set[str]:
    """The resources (cpu, memory) whose request or limit differs between two resources."""

    def value(resources: Obj, part: str, name: str) -> Decimal | None:
        found = (resources.get(part) or {}).get(name)
        return None if found is None else parse_quantity(str(found))

    names = {
        n for r in (before, after) for part in ("requests", "limits") for n in r.get(part) or {}
    }
    return {
        n for n in names
        if any(value(before, part, n) != value(after, part, n) for part in ("requests", "limits"))
    }  # fmt: skip


def _is_ready(pod: Obj) -> bool:
    conditions = dig(pod, "status", "conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _condition(kind: str, true: bool, reason: str, message: str, before: list[Obj]) -> Obj:
    """A condition; its transition time kept while its status holds (no write every tick)."""
    status = "True" if true else "False"
    old = next((c for c in before if c.get("type") == kind), None)
    since = old["lastTransitionTime"] if old and old.get("status") == status else kube_now()
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since,
        "lastUpdateTime": since,
    }


def _rolled_back(owner: Obj) -> bool:
    """Whether the owner carries a rollback recommendation (it wins over any other)."""
    annotations = owner["metadata"].get("annotations") or {}
    return ROLLBACK_REQUESTS_ANNOTATION in annotations or ROLLBACK_LIMITS_ANNOTATION in annotations


def _pod_conditions(before: list[Obj], *conditions: Obj) -> list[Obj]:
    """Pod conditions as the kubelet writes them: each with its ``lastTransitionTime``, kept
    while its status holds (a judge reads how long a pod has been Ready)."""
    old = {c.get("type"): c for c in before}
    stamped = []
    for c in conditions:
        prior = old.get(c["type"])
        held = prior is not None and prior.get("status") == c["status"]
        since = prior.get("lastTransitionTime") if held and prior else None
        stamped.append({**c, "lastTransitionTime": since or kube_now()})
    return stamped


def _deployment_conditions(
    owner: Obj, current: str, desired: int, updated: int, ready: int
) -> list[Obj]:
    before = dig(owner, "status", "conditions") or []
    available = ready >= desired
    done = updated >= desired and available
    return [
        _condition(
            "Available",
            available,
            "MinimumReplicasAvailable" if available else "MinimumReplicasUnavailable",
            "Deployment has minimum availability."
            if available
            else "Deployment does not have minimum availability.",
            before,
        ),
        _condition(
            "Progressing",
            True,
            "NewReplicaSetAvailable" if done else "ReplicaSetUpdated",
            f'ReplicaSet "{current}"'
            + (" has successfully progressed." if done else " is progressing."),
            before,
        ),
    ]


def _job_status(job: Obj, pods: list[Obj]) -> Obj:
    phases = [dig(p, "status", "phase") for p in pods]
    succeeded, failed = phases.count("Succeeded"), phases.count("Failed")
    completions = int(dig(job, "spec", "completions") or dig(job, "spec", "parallelism") or 1)
    before = dig(job, "status") or {}
    status: Obj = {
        "active": len(pods) - succeeded - failed,
        "succeeded": succeeded,
        "failed": failed,
        "startTime": before.get("startTime") or kube_now(),
    }
    if succeeded >= completions:
        status["completionTime"] = before.get("completionTime") or kube_now()
        complete = _condition(
            "Complete",
            True,
            "CompletionsReached",
            "Reached expected number of succeeded pods",
            before.get("conditions") or [],
        )
        status["conditions"] = [complete]
    return status


class SimulatedCluster:
    def __init__(self, store: Store, tick: float = 0.1, applies_rollbacks: bool = True) -> None:
        self.store = store
        self.tick = tick
        self.disruption = DisruptionController(store)  # the PodDisruptionBudgets' status
        self.autoscaler = AutoscalerController(store, self._cpu_used, self._event)
        # An applier that applies rollback recommendations too (annotations actuation); in
        # place, the engine resizes for a rollback itself and the applier leaves it be.
        self.applies_rollbacks = applies_rollbacks
        self.workloads: dict[tuple[str, str, str], Workload] = {}
        self._clock: dict[str, float] = {}  # pod uid (/container/event) -> monotonic time
        self._backoff = RestartBackoff()  # the kubelets' restart backoffs (CrashLoopBackOff)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.resizes: list[tuple[str, str]] = []  # (pod, "requests/limits json") actuated
        self._pod_workload: dict[tuple[str, str], Workload] = {}
        # (namespace, pod, container) -> [CFS periods, throttled periods, monotonic time of the
        # last account]: what ``cadvisor`` serves
        self._cfs: dict[tuple[str, str, str], list[float]] = {}
        self._metrics_lock = threading.Lock()
        store.listeners.append(self._created)

    # --- lifecycle ------------------------------------------------------------------------------

    def add(
        self,
        manifest: Obj,
        behaviour: dict[str, Behaviour] | None = None,
        pod_template: Obj | None = None,
    ) -> Obj:
        created = self.store.create(manifest)
        meta = created["metadata"]
        self.workloads[(created["kind"], meta.get("namespace", ""), meta["name"])] = Workload(
            created["kind"], meta.get("namespace", ""), meta["name"], behaviour or {}, pod_template
        )
        return created

    def _created(self, event: str, rtype: Any, obj: Obj) -> None:
        """A workload created through the API (``kubectl apply``, ``kubectl create``) is
        controlled as a scenario's is, its app with the default behaviour: as a cluster's
        controllers take every object of their kind. One another controller owns (a CronJob's
        Job) is that controller's."""
        if event != "ADDED" or rtype.kind not in CONTROLLERS:
            return
        meta = obj["metadata"]
        if any(ref.get("controller") for ref in meta.get("ownerReferences") or []):
            return
        key = (rtype.kind, meta.get("namespace", ""), meta["name"])
        self.workloads.setdefault(key, Workload(*key))

    def behave(self, workload: tuple[str, str, str], container: str, **changed: Any) -> None:
        """The container's behaviour from now on, ``changed`` fields replaced (a story's
        ``behave`` step)."""
        behaviours = self.workloads[workload].behaviour
        behaviours[container] = dataclasses.replace(
            behaviours.get(container, Behaviour()), **changed
        )

    def start(self) -> SimulatedCluster:
        self._thread = threading.Thread(target=self._run, name="sim-cluster", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception:  # pragma: no cover - a simulation bug must not stop the world
                log.exception("simulation step failed")
            self._stop.wait(self.tick)

    def step(self) -> None:
        # An object deleted meanwhile (by a scenario, a test, the engine) is that object's
        # business: the rest of the tick goes on, as the real controllers do.
        for workload in list(self.workloads.values()):
            owner = self._get(workload.kind, workload.namespace, workload.name)
            if owner is None:
                continue
            with contextlib.suppress(ApiError):
                self._control(workload, owner)
                self._apply(workload, owner)
                self._report(workload, owner)
        for pod in list(self.store.items("Pod")):
            with contextlib.suppress(ApiError):
                self._kubelet(pod)
        self.autoscaler.step(time.monotonic())

    # --- helpers --------------------------------------------------------------------------------

    def _get(self, kind: str, namespace: str, name: str) -> Obj | None:
        try:
            return self.store.get(self.store.rtype(kind), namespace or None, name)
        except ApiError:
            return None

    def _owned(self, kind: str, namespace: str, uid: str) -> list[Obj]:
        return [
            o
            for o in self.store.items(kind, namespace)
            if any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences") or [])
        ]

    def _ref(self, obj: Obj) -> Obj:
        return {
            "apiVersion": obj["apiVersion"],
            "kind": obj["kind"],
            "name": obj["metadata"]["name"],
            "uid": obj["metadata"]["uid"],
            "controller": True,
        }

    def _template(self, workload: Workload, owner: Obj) -> Obj:
        if workload.kind == "CronJob":
            return copy.deepcopy(dig(owner, "spec", "jobTemplate", "spec", "template") or {})
        if workload.pod_template is not None:
            return copy.deepcopy(workload.pod_template)
        return copy.deepcopy(dig(owner, "spec", "template") or {})

    @staticmethod
    def target(owner: Obj) -> tuple[Resources, Resources, dict[str, str]]:
        """The resources pods of ``owner`` should run with, and the annotations they carry."""
        annotations = owner["metadata"].get("annotations") or {}
        if _rolled_back(owner):
            requests = json.loads(annotations.get(ROLLBACK_REQUESTS_ANNOTATION) or "{}")
            limits = json.loads(annotations.get(ROLLBACK_LIMITS_ANNOTATION) or "{}")
            return requests, limits, {}
        try:
            recs = recommendations_from_annotations(annotations)
        except MalformedRecommendationError:
            recs = []
        if not recs:
            return {}, {}, {}
        rec = recs[0]
        try:
            state = json.loads(annotations.get(ROLLBACK_STATE_ANNOTATION) or "{}")
        except ValueError:
            state = {}
        if (
            state.get("mode") == "failedPermanent"
            and state.get("activeRecommendationFingerprint") == rec.fingerprint
        ):
            return {}, {}, {}  # an applier does not re-apply a recommendation that failed for good
        stamped = {k: annotations[k] for k in (rec.requests_key, rec.limits_key) if k}
        return rec.requests, rec.limits, stamped

    # --- controllers and admission --------------------------------------------------------------

    def _control(self, workload: Workload, owner: Obj) -> None:
        """What the workload's controller does each tick (``CONTROLLERS``, one per kind)."""
        controller = CONTROLLERS.get(workload.kind)
        if controller is not None:
            template = self._template(workload, owner)
            labels = dict(dig(template, "metadata", "labels") or {})
            controller(self, workload, owner, template, labels)

    def _deployment(self, workload: Workload, owner: Obj, template: Obj, labels: Obj) -> None:
        """One ReplicaSet per template, as the real controller names them: a template change (a
        rollout) replaces the old ReplicaSet's pods with the new one's (a Rollout alike)."""
        ns, spec = workload.namespace, owner.get("spec") or {}
        rs_name = _rs_name(workload.name, template)
        for old in self._owned("ReplicaSet", ns, owner["metadata"]["uid"]):
            if old["metadata"]["name"] != rs_name:
                for pod in self._owned("Pod", ns, old["metadata"]["uid"]):
                    self._delete_pod(pod)
                with contextlib.suppress(ApiError):
                    self.store.delete(self.store.rtype("ReplicaSet"), ns, old["metadata"]["name"])
        rs = self._get("ReplicaSet", ns, rs_name)
        if rs is None:
            rs = self.store.create(
                {"apiVersion": "apps/v1", "kind": "ReplicaSet",
                 "metadata": {"name": rs_name, "namespace": ns, "labels": labels,
                              "ownerReferences": [self._ref(owner)]},
                 "spec": {"replicas": spec.get("replicas", 1), "selector": spec.get("selector"),
                          "template": template}}
            )  # fmt: skip
        replicas = int(spec.get("replicas", 1))
        self._scale(workload, owner, rs, replicas, template, labels, "random")

    def _stateful_set(self, workload: Workload, owner: Obj, template: Obj, labels: Obj) -> None:
        replicas = int((owner.get("spec") or {}).get("replicas", 1))
        self._scale(workload, owner, owner, replicas, template, labels, "ordinal")

    def _daemon_set(self, workload: Workload, owner: Obj, template: Obj, labels: Obj) -> None:
        """A pod on every node, and the status's count of them."""
        ns, name = workload.namespace, workload.name
        nodes = [n["metadata"]["name"] for n in self.store.items("Node")]
        if dig(owner, "status", "desiredNumberScheduled") != len(nodes):
            status = {"status": {"desiredNumberScheduled": len(nodes)}}
            self.store.patch(self.store.rtype("DaemonSet"), ns, name, status, MERGE, "status")
        have = {p["spec"].get("nodeName") for p in self._owned("Pod", ns, owner["metadata"]["uid"])}
        for node in nodes:
            if node not in have:
                self._create_pod(owner, owner, template, labels, f"{name}-{node}", node)

    def _strimzi_pod_set(self, workload: Workload, owner: Obj, template: Obj, labels: Obj) -> None:
        """One pod per entry of ``spec.pods``, named by the entry."""
        pods = self._owned("Pod", workload.namespace, owner["metadata"]["uid"])
        existing = {p["metadata"]["name"]: p for p in pods}
        wanted = [e for e in dig(owner, "spec", "pods") or [] if dig(e, "metadata", "name")]
        for entry in wanted:
            if entry["metadata"]["name"] not in existing:
                meta, spec = entry.get("metadata") or {}, entry.get("spec") or {}
                entry_labels = dict(dig(entry, "metadata", "labels") or {})
                self._create_pod(
                    owner, owner, {"metadata": meta, "spec": spec}, entry_labels, meta["name"]
                )
        for pod_name, pod in existing.items():
            if pod_name not in {e["metadata"]["name"] for e in wanted}:
                self._delete_pod(pod)

    def _job_owner(self, workload: Workload, owner: Obj, template: Obj, labels: Obj) -> None:
        self._job(owner, template, labels)

    def _cron_job(self, workload: Workload, owner: Obj, template: Obj, labels: Obj) -> None:
        """A Job a minute when none is there; each Job's pods run as a Job's do."""
        ns, uid = workload.namespace, owner["metadata"]["uid"]
        if not self._owned("Job", ns, uid):
            job_template = dig(owner, "spec", "jobTemplate", "spec") or {}
            self.store.create(
                {"apiVersion": "batch/v1", "kind": "Job",
                 "metadata": {"name": f"{workload.name}-{int(time.time() // 60)}", "namespace": ns,
                              "ownerReferences": [self._ref(owner)]},
                 "spec": {**copy.deepcopy(job_template), "template": template}}
            )  # fmt: skip
        for job in self._owned("Job", ns, uid):
            self._job(job, template, {**labels, "job-name": job["metadata"]["name"]}, owner)

    def _model(self, workload: Workload, owner: Obj, template: Obj, labels: Obj) -> None:
        """A KubeAI Model: ``replicas`` (or ``minReplicas``) pods labelled with its name."""
        spec = owner.get("spec") or {}
        replicas = int(spec.get("replicas") or spec.get("minReplicas") or 1)
        labels = {**labels, "model": workload.name}
        self._scale(workload, owner, owner, replicas, template, labels, "random")

    def _job(self, job: Obj, template: Obj, labels: Obj, top: Obj | None = None) -> None:
        pods = self._owned("Pod", job["metadata"]["namespace"], job["metadata"]["uid"])
        running = [p for p in pods if dig(p, "status", "phase") not in ("Succeeded", "Failed")]
        done = [p for p in pods if dig(p, "status", "phase") == "Succeeded"]
        parallelism = int(dig(job, "spec", "parallelism") or 1)
        completions = int(dig(job, "spec", "completions") or parallelism)
        labels = {**labels, "job-name": job["metadata"]["name"]}
        for _ in range(
            max(0, min(parallelism - len(running), completions - len(done) - len(running)))
        ):
            self._create_pod(
                top or job,
                job,
                template,
                labels,
                f"{job['metadata']['name']}-{uuid.uuid4().hex[:5]}",
            )

    def _scale(
        self,
        workload: Workload,
        owner: Obj,
        parent: Obj,
        replicas: int,
        template: Obj,
        labels: Obj,
        naming: str,
    ) -> None:
        ns = workload.namespace
        pods = self._owned("Pod", ns, parent["metadata"]["uid"])
        if naming == "ordinal":
            have = {p["metadata"]["name"] for p in pods}
            for i in range(replicas):
                if f"{workload.name}-{i}" not in have:
                    self._create_pod(owner, parent, template, labels, f"{workload.name}-{i}")
            extras = [p for p in pods if int(p["metadata"]["name"].rsplit("-", 1)[1]) >= replicas]
        else:
            for _ in range(replicas - len(pods)):
                self._create_pod(
                    owner,
                    parent,
                    template,
                    labels,
                    f"{parent['metadata']['name']}-{uuid.uuid4().hex[:5]}",
                )
            pods.sort(key=lambda p: p["metadata"]["creationTimestamp"])
            extras = pods[replicas:] if len(pods) > replicas else []
        for pod in extras:
            self._delete_pod(pod)

    def _create_pod(
        self,
        owner: Obj,
        parent: Obj,
        template: Obj,
        labels: Obj,
        name: str,
        node: str | None = None,
    ) -> None:
        """Admission: the owner's current target resources and recommendation annotations.

        The owner is read again here, as a real admission webhook reads it when the pod is
        created: the tick's snapshot may predate a change made since (a recommendation applied
        and the old pods deleted while this tick ran would otherwise admit the replacements on
        the old resources)."""
        meta = owner["metadata"]
        owner = self._get(owner["kind"], meta.get("namespace", ""), meta["name"]) or owner
        requests, limits, stamped = self.target(owner)
        workload = self.workloads.get((owner["kind"], meta.get("namespace", ""), meta["name"]))
        if workload is not None:
            self._pod_workload[(parent["metadata"]["namespace"], name)] = workload
        containers = _merge(list(dig(template, "spec", "containers") or []), requests, limits)
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": parent["metadata"]["namespace"],
                "labels": labels,
                "annotations": {**(dig(template, "metadata", "annotations") or {}), **stamped},
                "ownerReferences": [self._ref(parent)],
            },
            "spec": {
                **copy.deepcopy(template.get("spec") or {}),
                "containers": containers,
                **({"nodeName": node} if node else {}),
            },
            "status": {"phase": "Pending", "conditions": []},
        }
        controller = f"{parent['kind'].lower()}-controller"
        try:
            self.store.create(pod)
        except ApiError as exc:
            if exc.code == 403:  # a quota or LimitRange refused it: tried again next tick
                self._event(_reference(parent), "FailedCreate", f"Error creating: {exc.message}",
                            controller, warning=True)  # fmt: skip
            elif exc.code != 409:
                raise
            return
        self._event(_reference(parent), "SuccessfulCreate", f"Created pod: {name}", controller)

    def _delete_pod(self, pod: Obj) -> None:
        meta = pod["metadata"]
        with contextlib.suppress(ApiError):  # already gone
            self.store.delete(self.store.rtype("Pod"), meta["namespace"], meta["name"])
            for ref in meta.get("ownerReferences") or []:
                parent = {**ref, "namespace": meta["namespace"]}
                controller = f"{ref['kind'].lower()}-controller"
                self._event(parent, "SuccessfulDelete", f"Deleted pod: {meta['name']}", controller)
            for c in pod["spec"]["containers"]:
                self._event(_reference(pod), "Killing", f"Stopping container {c['name']}")
        with self._metrics_lock:  # cAdvisor forgets a container that is gone
            for c in pod["spec"]["containers"]:
                self._cfs.pop((meta["namespace"], meta["name"], c["name"]), None)

    def _event(
        self,
        involved: Obj,
        reason: str,
        message: str,
        component: str = "kubelet",
        warning: bool = False,
    ) -> None:
        """Record an Event on ``involved`` (an object reference); the same one again counts up."""
        identity = f"{involved.get('kind')}/{involved['name']}/{reason}/{message}"
        name = f"{involved['name']}.{hashlib.sha256(identity.encode()).hexdigest()[:16]}"
        rtype, now = self.store.rtype("Event"), kube_now()
        try:
            before = self.store.get(rtype, involved["namespace"], name)
        except ApiError:
            before = None
        if before is not None:
            patch = {"count": int(before.get("count") or 1) + 1, "lastTimestamp": now}
            with contextlib.suppress(ApiError):
                self.store.patch(rtype, involved["namespace"], name, patch, MERGE)
            return
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": involved["namespace"]},
            "involvedObject": {
                k: involved[k]
                for k in ("apiVersion", "kind", "name", "namespace", "uid")
                if k in involved
            },
            "reason": reason,
            "message": message,
            "type": "Warning" if warning else "Normal",
            "source": {"component": component},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        with contextlib.suppress(ApiError):  # the same Event, created by a racing tick
            self.store.create(body)

    # --- workload status ------------------------------------------------------------------------

    def _report(self, workload: Workload, owner: Obj) -> None:
        """Keep the workload's (and its ReplicaSets') status true to its pods, as the real
        controllers do, so ``kubectl get deploy`` and ``describe`` tell the truth. Written only
        when it changed."""
        ns, uid, spec = workload.namespace, owner["metadata"]["uid"], owner.get("spec") or {}
        pods = self._pods_of(workload, owner)
        ready = [p for p in pods if _is_ready(p)]
        desired = int(spec.get("replicas", 1) if "replicas" in spec else 1)
        generation = {"observedGeneration": owner["metadata"].get("generation", 1)}
        match workload.kind:
            case "Deployment" | "Rollout":
                current = _rs_name(workload.name, self._template(workload, owner))
                updated = []
                for rs in self._owned("ReplicaSet", ns, uid):
                    mine = self._owned("Pod", ns, rs["metadata"]["uid"])
                    ready_here = [p for p in mine if _is_ready(p)]
                    if rs["metadata"]["name"] == current:
                        updated = mine
                    self._set_status(
                        rs,
                        {
                            "replicas": len(mine),
                            "fullyLabeledReplicas": len(mine),
                            "readyReplicas": len(ready_here),
                            "availableReplicas": len(ready_here),
                            "observedGeneration": rs["metadata"].get("generation", 1),
                        },
                    )
                status = {
                    **generation,
                    "replicas": len(pods),
                    "updatedReplicas": len(updated),
                    "readyReplicas": len(ready),
                    "availableReplicas": len(ready),
                    "unavailableReplicas": max(0, desired - len(ready)),
                    "conditions": _deployment_conditions(
                        owner, current, desired, len(updated), len(ready)
                    ),
                }
            case "StatefulSet":
                status = {
                    **generation,
                    "replicas": len(pods),
                    "currentReplicas": len(pods),
                    "updatedReplicas": len(pods),
                    "readyReplicas": len(ready),
                    "availableReplicas": len(ready),
                }
            case "DaemonSet":
                status = {
                    **generation,
                    "desiredNumberScheduled": len(list(self.store.items("Node"))),
                    "currentNumberScheduled": len(pods),
                    "updatedNumberScheduled": len(pods),
                    "numberReady": len(ready),
                    "numberAvailable": len(ready),
                    "numberMisscheduled": 0,
                }
            case "Job":
                status = _job_status(owner, pods)
            case _:
                return  # CronJob (its Jobs report), Model, StrimziPodSet: no status kept
        self._set_status(owner, status)

    def _set_status(self, obj: Obj, wanted: Obj) -> None:
        current = obj.get("status") or {}
        if all(current.get(k) == v for k, v in wanted.items()):
            return
        with contextlib.suppress(ApiError):  # deleted meanwhile
            self.store.patch(
                self.store.rtype(obj["kind"]),
                obj["metadata"].get("namespace"),
                obj["metadata"]["name"],
                {"status": wanted},
                MERGE,
                "status",
            )

    # --- the applier ----------------------------------------------------------------------------

    def _apply(self, workload: Workload, owner: Obj) -> None:
        if _rolled_back(owner) and not self.applies_rollbacks:
            return  # in place: the engine resizes the running pods for a rollback
        requests, limits, stamped = self.target(owner)
        if not requests and not limits and not stamped:
            # Nothing to apply (none, or one that failed for good): a pod that never started on
            # other resources than the template's is replaced, so it gets the template's.
            template = _merge(list(dig(self._template(workload, owner), "spec", "containers")
                                   or []), {}, {})  # fmt: skip
            for pod in self._pods_of(workload, owner):
                pending = dig(pod, "status", "phase") == "Pending"
                if (
                    pending
                    and not pod["spec"].get("nodeName")
                    and not _same_resources(pod["spec"]["containers"], template)
                ):
                    self._delete_pod(pod)
            return
        for pod in self._pods_of(workload, owner):
            phase = dig(pod, "status", "phase")
            current = pod["metadata"].get("annotations") or {}
            # Pods carry exactly the owner's current recommendation annotations (none during a
            # rollback), whether or not their resources could follow.
            annotations = {k: v for k, v in stamped.items() if current.get(k) != v}
            annotations |= {
                k: None for k in current if is_recommendation_key(k) and k not in stamped
            }
            patch: Obj = {"metadata": {"annotations": annotations}} if annotations else {}
            containers = pod["spec"]["containers"]
            resized = _merge(containers, requests, limits)
            if not _same_resources(containers, resized):
                if phase == "Pending" and not pod["spec"].get("nodeName"):
                    self._delete_pod(pod)  # never started: re-admitted with the new target
                    continue
                if phase == "Running" and self._fits(pod, resized):
                    patch["spec"] = {
                        "containers": [
                            {"name": c["name"], "resources": c["resources"]} for c in resized
                        ]
                    }
                # otherwise filtered for lack of node capacity: never deleted
            if patch:
                self.store.patch(
                    self.store.rtype("Pod"),
                    pod["metadata"]["namespace"],
                    pod["metadata"]["name"],
                    patch,
                    "application/strategic-merge-patch+json",
                )

    def _pods_of(self, workload: Workload, owner: Obj) -> list[Obj]:
        ns, uid = workload.namespace, owner["metadata"]["uid"]
        parents = [uid]
        if workload.kind in ("Deployment", "Rollout"):
            parents = [rs["metadata"]["uid"] for rs in self._owned("ReplicaSet", ns, uid)]
        elif workload.kind == "CronJob":
            parents = [job["metadata"]["uid"] for job in self._owned("Job", ns, uid)]
        return [p for parent in parents for p in self._owned("Pod", ns, parent)]

    def _node_free(
        self, node: str, exclude: str | None = None
    ) -> tuple[dict[str, Decimal], dict[str, Decimal]]:
        obj = self._get("Node", "", node)
        allocatable = {
            r: parse_quantity(str(q)) for r, q in (dig(obj, "status", "allocatable") or {}).items()
        }
        free = dict(allocatable)
        for pod in self.store.items("Pod"):
            if pod["spec"].get("nodeName") != node or pod["metadata"]["name"] == exclude:
                continue
            if dig(pod, "status", "phase") in ("Succeeded", "Failed"):
                continue
            for r, q in _requests(pod["spec"]["containers"]).items():
                if r in free:
                    free[r] -= q
        return allocatable, free

    def _fits(self, pod: Obj, containers: list[Obj]) -> bool:
        node = pod["spec"].get("nodeName")
        if not node:
            return True
        _, free = self._node_free(node, exclude=pod["metadata"]["name"])
        return all(free.get(r, Decimal("Infinity")) >= q for r, q in _requests(containers).items())

    # --- the kubelet ----------------------------------------------------------------------------

    def _cpu_used(self, pod: Obj) -> Decimal | None:
        """The CPU the pod's applications use now, in cores (the HPA's metric); None: idle."""
        used = [
            parse_quantity(cpu)
            for c in dig(pod, "spec", "containers") or []
            if (cpu := self._behaviour(pod, c["name"]).cpu) is not None
        ]
        return sum(used, Decimal(0)) if used else None

    def _behaviour(self, pod: Obj, container: str) -> Behaviour:
        workload = self._pod_workload.get((pod["metadata"]["namespace"], pod["metadata"]["name"]))
        return workload.behaviour.get(container, Behaviour()) if workload else Behaviour()

    def _kubelet(self, pod: Obj) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        status = copy.deepcopy(pod.get("status") or {})
        uid, now = meta["uid"], time.monotonic()
        phase = status.get("phase", "Pending")
        before = status.get("conditions") or []
        if phase in ("Succeeded", "Failed"):
            return
        if not spec.get("nodeName"):
            node = self._schedule(pod)
            if node is None:
                status["conditions"] = _pod_conditions(
                    before,
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": "0/N nodes are available: insufficient resources",
                    },
                )
                status["phase"] = "Pending"
                self._write_status(pod, status)
                return
            self.store.patch(
                self.store.rtype("Pod"),
                meta["namespace"],
                meta["name"],
                {"spec": {"nodeName": node}},
                MERGE,
            )
            assigned = f"Successfully assigned {meta['namespace']}/{meta['name']} to {node}"
            self._event(_reference(pod), "Scheduled", assigned, "default-scheduler")
            return
        startup = max(self._behaviour(pod, c["name"]).startup for c in spec["containers"])
        started = self._clock.setdefault(uid, now)
        if phase == "Pending" and now - started < startup:
            status["conditions"] = _pod_conditions(
                before,
                {"type": "PodScheduled", "status": "True"},
                {"type": "Ready", "status": "False"},
            )
            self._write_status(pod, status)
            return
        status["phase"] = "Running"
        statuses = {cs["name"]: cs for cs in status.get("containerStatuses") or []}
        conditions = [{"type": "PodScheduled", "status": "True"}]
        ready = True
        resize_condition = self._resize(pod, statuses)
        if resize_condition:
            conditions.append(resize_condition)
        new_statuses = []
        for c in spec["containers"]:
            cs = statuses.get(c["name"]) or {
                "name": c["name"],
                "image": c.get("image", "app"),
                "imageID": "sha256:sim",
                "restartCount": 0,
                "lastState": {},
                "resources": copy.deepcopy(c.get("resources") or {}),
            }
            cs.setdefault("resources", copy.deepcopy(c.get("resources") or {}))
            behaviour = self._behaviour(pod, c["name"])
            if behaviour.run_for is not None and now - started >= startup + behaviour.run_for:
                status["phase"] = "Succeeded"
            if not self._run_container(pod, c["name"], cs, behaviour, now):
                ready = False
            new_statuses.append(cs)
        status["containerStatuses"] = new_statuses
        conditions.append(
            {
                "type": "Ready",
                "status": "True" if ready and status["phase"] == "Running" else "False",
            }
        )
        status["conditions"] = _pod_conditions(before, *conditions)
        self._write_status(pod, status)

    def _run_container(
        self, pod: Obj, name: str, cs: Obj, behaviour: Behaviour, now: float
    ) -> bool:
        """One container's state this tick. Below the app's working set it is OOM-killed (an
        image of its ``bad_images`` exits with an error) ``OOM_EVERY`` after each start and
        started again when the kubelet's restart backoff lets it (``sim.backoff``), waiting in
        CrashLoopBackOff meanwhile; a container started again
        (after a crash or a resize's restart) is not ready for its startup time. True when it
        is ready."""
        uid, ref = pod["metadata"]["uid"], _reference(pod)
        self._account(pod, name, cs, behaviour, now)
        run = f"{uid}/{name}/run"  # when the container's current instance started
        if not cs.get("state"):  # its first start
            self._event(ref, "Started", f"Started container {name}")
            cs["state"] = {"running": {"startedAt": kube_now()}}
            self._clock[run] = now
        if "waiting" in cs["state"] and not self._start_again(pod, name, cs, now):
            cs["ready"] = False
            return False
        res = cs["resources"]
        memory = (res.get("limits") or {}).get("memory") or (res.get("requests") or {}).get(
            "memory"
        )
        starving = (
            behaviour.working_set is not None
            and memory is not None
            and parse_quantity(str(memory)) < parse_quantity(behaviour.working_set)
        )
        broken = cs.get("image") in behaviour.bad_images
        exits = ("OOMKilled", 137) if starving else ("Error", 1) if broken else None
        if exits is not None and now - self._clock.setdefault(run, now) >= OOM_EVERY:
            reason, code = exits
            cs["lastState"] = {
                "terminated": {"reason": reason, "exitCode": code, "finishedAt": kube_now()}
            }
            cs["state"] = {"waiting": {"reason": "CrashLoopBackOff"}}
            self._clock[f"{uid}/{name}/exit"] = now
            if not self._start_again(pod, name, cs, now):
                cs["ready"] = False
                return False
        began = self._clock.setdefault(run, now)
        starting = cs.get("restartCount", 0) > 0 and now - began < behaviour.startup
        cs["ready"] = exits is None and not starting
        return bool(cs["ready"])

    def _start_again(self, pod: Obj, name: str, cs: Obj, now: float) -> bool:
        """Start an exited container again if its restart backoff is over (True), else leave it
        waiting in CrashLoopBackOff, the delay in its message (False)."""
        uid, ref = pod["metadata"]["uid"], _reference(pod)
        exited = self._clock.setdefault(f"{uid}/{name}/exit", now)
        key = self._backoff.key(uid, name, cs.get("resources"))
        left = self._backoff.delay(key, exited, now)
        if left > 0:
            if "message" not in cs["state"]["waiting"]:
                wait = f"back-off {left:.0f}s restarting failed container={name} pod={ref['name']}"
                cs["state"]["waiting"]["message"] = wait
                backoff = f"Back-off restarting failed container {name} in pod {ref['name']}"
                self._event(ref, "BackOff", backoff, warning=True)
            return False
        self._backoff.started(key, exited, now)
        self._restarted(pod, name, cs, now)
        return True

    def _restarted(self, pod: Obj, name: str, cs: Obj, now: float) -> None:
        """A new instance of the container runs (its count goes up): not ready for its startup."""
        cs["restartCount"] = cs.get("restartCount", 0) + 1
        cs["state"] = {"running": {"startedAt": kube_now()}}
        self._clock[f"{pod['metadata']['uid']}/{name}/run"] = now
        self._event(_reference(pod), "Started", f"Started container {name}")

    def _account(self, pod: Obj, name: str, cs: Obj, behaviour: Behaviour, now: float) -> None:
        """cAdvisor's counters of one running container since the last tick: CFS periods (one
        per 100 ms) and those throttled (the share its CPU limit leaves of its usage)."""
        key = (pod["metadata"]["namespace"], pod["metadata"]["name"], name)
        with self._metrics_lock:
            cfs = self._cfs.setdefault(key, [0.0, 0.0, now])
            elapsed, cfs[2] = max(0.0, now - cfs[2]), now
            limit = dig(cs, "resources", "limits", "cpu")
            if not positive(limit):
                return  # no quota, no CFS enforcement periods (the kernel counts none)
            throttled = _throttled(behaviour, limit)
            cfs[0] += elapsed * 10
            cfs[1] += elapsed * 10 * throttled

    def cadvisor(self, node: str) -> str:
        """The metrics a kubelet's cAdvisor serves for the containers running on ``node``
        (``/api/v1/nodes/<node>/proxy/metrics/cadvisor``): CFS periods and throttled periods
        (only under a CPU limit), the working set, the memory limit (0 when none)."""
        lines = [
            "# TYPE container_cpu_cfs_periods_total counter",
            "# TYPE container_cpu_cfs_throttled_periods_total counter",
            "# TYPE container_memory_working_set_bytes gauge",
            "# TYPE container_spec_memory_limit_bytes gauge",
        ]
        for pod in self.store.items("Pod"):
            if dig(pod, "spec", "nodeName") != node or dig(pod, "status", "phase") != "Running":
                continue
            meta = pod["metadata"]
            for cs in dig(pod, "status", "containerStatuses") or []:
                if "running" not in (cs.get("state") or {}):
                    continue
                key = (meta["namespace"], meta["name"], cs["name"])
                labels = f'namespace="{key[0]}",pod="{key[1]}",container="{key[2]}"'
                with self._metrics_lock:
                    periods, throttled, _ = self._cfs.get(key, [0.0, 0.0, 0.0])
                limit = dig(cs, "resources", "limits", "memory")
                behaviour = self._behaviour(pod, cs["name"])
                working = behaviour.working_set
                if behaviour.latency is not None:
                    share = _throttled(behaviour, dig(cs, "resources", "limits", "cpu"))
                    seconds = parse_duration(behaviour.latency).total_seconds()
                    slowed = seconds / max(1 - share, 0.01)
                    lines.append(f"app_request_latency_seconds{{{labels}}} {slowed:.6f}")
                # cAdvisor's Prometheus collector exports the CFS series only for a container
                # with a CPU quota (their condition: ``s.Cpu.Quota != 0``, that is a CPU limit),
                # and the memory limit always, as 0 when unlimited (``specMemoryValue``).
                if positive(dig(cs, "resources", "limits", "cpu")):
                    lines += [
                        f"container_cpu_cfs_periods_total{{{labels}}} {int(periods)}",
                        f"container_cpu_cfs_throttled_periods_total{{{labels}}} {int(throttled)}",
                    ]
                lines += [
                    f"container_memory_working_set_bytes{{{labels}}}"
                    f" {int(parse_quantity(working)) if working else 0}",
                    f"container_spec_memory_limit_bytes{{{labels}}}"
                    f" {int(parse_quantity(str(limit))) if positive(limit) else 0}",
                ]
        return "\n".join(lines) + "\n"

    def _resize(self, pod: Obj, statuses: dict[str, Obj]) -> Obj | None:
        """Actuate a spec change on a running pod, or say why it cannot be (Infeasible/Deferred)."""
        changed = [
            c
            for c in pod["spec"]["containers"]
            if c["name"] in statuses
            and not _same_resources(
                [c], [{"name": c["name"], "resources": statuses[c["name"]].get("resources")}]
            )
        ]
        if not changed:
            return None
        node = pod["spec"]["nodeName"]
        allocatable, free = self._node_free(node, exclude=pod["metadata"]["name"])
        wanted = _requests(pod["spec"]["containers"])
        if any(q > allocatable.get(r, Decimal("Infinity")) for r, q in wanted.items()):
            return {
                "type": "PodResizePending",
                "status": "True",
                "reason": "Infeasible",
                "message": "the node's allocatable is smaller than the requests",
            }
        if any(q > free.get(r, Decimal("Infinity")) for r, q in wanted.items()):
            return {
                "type": "PodResizePending",
                "status": "True",
                "reason": "Deferred",
                "message": "the node has no free capacity for the requests right now",
            }
        for c in changed:
            cs = statuses[c["name"]]
            moved = _moved(cs.get("resources") or {}, c.get("resources") or {})
            cs["resources"] = copy.deepcopy(c.get("resources") or {})
            policies = {
                p.get("resourceName"): p.get("restartPolicy") for p in c.get("resizePolicy") or []
            }
            running = "running" in (cs.get("state") or {})
            # The kubelet restarts a container for a resource whose policy says so, only when
            # that resource's value changes (a CPU resize leaves a memory-restart container up).
            if running and any(policies.get(r) == "RestartContainer" for r in moved):
                self._restarted(pod, c["name"], cs, time.monotonic())
            self.resizes.append(
                (pod["metadata"]["name"], json.dumps(cs["resources"], sort_keys=True))
            )
        resized = [{"name": c["name"], "resources": c.get("resources") or {}} for c in changed]
        generation = pod["metadata"].get("generation", 1)
        done = json.dumps({"containers": resized, "generation": generation}, separators=(",", ":"))
        self._event(_reference(pod), "ResizeCompleted", f"Pod resize completed: {done}")
        return None

    def _schedule(self, pod: Obj) -> str | None:
        wanted = _requests(pod["spec"]["containers"])
        selector = pod["spec"].get("nodeSelector") or {}
        for node in self.store.items("Node"):
            labels = node["metadata"].get("labels") or {}
            if any(labels.get(k) != v for k, v in selector.items()):
                continue  # as kube-scheduler: only the nodes the pod selects
            name: str = node["metadata"]["name"]
            _, free = self._node_free(name)
            if all(free.get(r, Decimal("Infinity")) >= q for r, q in wanted.items()):
                return name
        return None

    def _write_status(self, pod: Obj, status: Obj) -> None:
        current = pod.get("status") or {}
        if self._stable(current) == self._stable(status):
            return
        with contextlib.suppress(ApiError):  # deleted meanwhile
            self.store.patch(
                self.store.rtype("Pod"),
                pod["metadata"]["namespace"],
                pod["metadata"]["name"],
                {"status": status},
                MERGE,
                "status",
            )

    @staticmethod
    def _stable(status: Obj) -> str:
        """Status without timestamps that change every tick (a write only when something did)."""
        clean = copy.deepcopy(status)
        for cs in clean.get("containerStatuses") or []:
            (cs.get("state") or {}).get("running", {}).pop("startedAt", None)
        return json.dumps(clean, sort_keys=True)


Controller = Callable[[SimulatedCluster, Workload, Obj, Obj, Obj], None]
# What each kind's controller does each tick; a kind not here (AnalysisRun) is not simulated.
CONTROLLERS: dict[str, Controller] = {
    "Deployment": SimulatedCluster._deployment,
    "Rollout": SimulatedCluster._deployment,
    "StatefulSet": SimulatedCluster._stateful_set,
    "DaemonSet": SimulatedCluster._daemon_set,
    "StrimziPodSet": SimulatedCluster._strimzi_pod_set,
    "Job": SimulatedCluster._job_owner,
    "CronJob": SimulatedCluster._cron_job,
    "Model": SimulatedCluster._model,
}
