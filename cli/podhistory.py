"""A workload's pods as they changed, from what the cluster keeps: its Events and its pods now.

``rollbackctl describe OWNER --report`` draws these (``cli.report.from_live``). One LIST of the
namespace's Events and one of the cohort give:

- which pods were the owner's, the gone ones too: those its controllers (the owner itself, or
  its ReplicaSets and Jobs, named ``<owner>-<hash>``) created or deleted (``SuccessfulCreate``,
  ``SuccessfulDelete``: "Created pod: NAME"), and those of the cohort now;
- when each was created and deleted, and its resources as in-place resizes changed them (the
  kubelet's ``ResizeCompleted``: "Pod resize completed: {containers: [...]}"); a pod's
  resources before its first resize are known only while it runs unresized (its spec);
- its starts and restarts (``Started``) and crash loops (``BackOff``): the kubelet's recorder
  counts a repeat into the Event it already wrote, so of a run only its first time stays put (a
  later repeat moves the last time and the count); the report places each run at its first;
- for a pod still there, from its status: since when each container runs now, and the gap
  before it, from its last exit (``lastState.terminated``: when and why) to its start again,
  which it spent waiting in its restart backoff (or waits still).

Nothing is guessed: what the cluster did not keep (an Event past its TTL, a gone pod's resources
at admission, a pod's state between the times it records) is left unknown, and the page says so.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kubernetes.client import ApiClient, CoreV1Api, CustomObjectsApi

from activities.cohort import actual_resources, memory_text, pod_state
from activities.kubernetes import KubernetesActivities
from activities.kubetime import parse_kube_time
from workflows.activity_api import OwnerRef
from workflows.contract import Obj

CREATED = re.compile(r"^Created pod: (\S+)$")
DELETED = re.compile(r"^Deleted pod: (\S+)$")
RESIZED = "Pod resize completed: "


@dataclass
class Happening:
    """One Event about a pod: the first and the last time it was recorded, and how often."""

    first: datetime
    last: datetime
    reason: str
    message: str
    count: int = 1
    warning: bool = False


@dataclass
class PodHistory:
    name: str
    created: datetime | None = None
    deleted: datetime | None = None
    status: str | None = None  # now; None: gone
    memory: str = ""  # now (or, for a gone pod, after its last resize)
    resizes: list[tuple[datetime, str]] = field(default_factory=list)  # (when, memory after)
    happenings: list[Happening] = field(default_factory=list)
    restarts: int = 0  # now, of a pod still there
    running_since: datetime | None = None  # every container runs, since (a pod still there)
    # Of a pod still there: each container's last exit (when, why) to its start again (None:
    # it waits in its restart backoff still).
    down: list[tuple[datetime, datetime | None, str]] = field(default_factory=list)

    @property
    def last_restart(self) -> tuple[datetime, str] | None:
        """(when, cause) of the last container's last exit, of a pod still there."""
        return (self.down[-1][0], self.down[-1][2]) if self.down else None


@dataclass
class OwnerHistory:
    events: list[dict[str, Any]]  # the owner's own Events: {time, reason, message, warning}
    pods: list[PodHistory]


def _memory(containers: dict[str, Obj]) -> str:
    """``memory_text`` of the containers, sorted by name."""
    return memory_text(dict(sorted(containers.items())))


def _when(event: Any) -> tuple[datetime | None, datetime | None]:
    first = event.first_timestamp or event.event_time or event.metadata.creation_timestamp
    return first, event.last_timestamp or first


def _containers(pod: PodHistory, statuses: list[Obj]) -> None:
    """From a pod's container statuses now: its restarts, since when it runs, its gaps."""
    starts = [
        parse_kube_time(((cs.get("state") or {}).get("running") or {}).get("startedAt"))
        for cs in statuses
    ]
    if statuses and all(starts):
        pod.running_since = max(t for t in starts if t is not None)
    for cs, started in zip(statuses, starts, strict=True):
        pod.restarts += int(cs.get("restartCount") or 0)
        terminated = (cs.get("lastState") or {}).get("terminated")
        at = parse_kube_time((terminated or {}).get("finishedAt"))
        if terminated and at is not None:
            pod.down.append((at, started, str(terminated.get("reason") or "restart")))


def history(owner: OwnerRef, events: list[Any], pods: list[Obj]) -> OwnerHistory:
    """``events`` (the namespace's, as the client returns them) and ``pods`` (the cohort now)."""
    parents = re.compile(rf"^{re.escape(owner.name)}(-[a-z0-9]+)?$")
    found: dict[str, PodHistory] = {}
    own: list[dict[str, Any]] = []
    for e in events:
        involved, (first, last) = e.involved_object, _when(e)
        if first is None or last is None:
            continue
        if involved.kind == owner.kind.value and involved.name == owner.name:
            own.append(
                {
                    "time": last,
                    "reason": e.reason or "",
                    "message": e.message or "",
                    "warning": e.type == "Warning",
                }
            )
        if involved.kind == "Pod" or not parents.match(involved.name or ""):
            continue
        for pattern, attr in ((CREATED, "created"), (DELETED, "deleted")):
            if matched := pattern.match(e.message or ""):
                pod = found.setdefault(matched[1], PodHistory(matched[1]))
                setattr(pod, attr, first)
    for p in pods:
        name = p["metadata"]["name"]
        pod = found.setdefault(name, PodHistory(name))
        pod.created = parse_kube_time(p["metadata"].get("creationTimestamp")) or pod.created
        pod.status = pod_state(p)
        requests, limits = actual_resources(p)
        pod.memory = _memory(
            {c: {"requests": requests.get(c), "limits": limits.get(c)} for c in requests | limits}
        )
        _containers(pod, (p.get("status") or {}).get("containerStatuses") or [])
    for e in events:
        involved, (first, last) = e.involved_object, _when(e)
        if involved.kind != "Pod" or involved.name not in found or first is None:
            continue
        assert last is not None
        pod = found[involved.name]
        message = e.message or ""
        if e.reason == "ResizeCompleted" and message.startswith(RESIZED):
            try:
                said = json.loads(message[len(RESIZED) :])
            except ValueError:
                said = None  # a message not in the kubelet's format: no resources known
            resized = said.get("containers") if isinstance(said, dict) else None
            containers = resized if isinstance(resized, list) else []
            by_name = {
                c.get("name", ""): c.get("resources") or {}
                for c in containers
                if isinstance(c, dict)
            }
            pod.resizes.append((first, _memory(by_name)))
            continue
        pod.happenings.append(
            Happening(first, last, e.reason or "", message, int(e.count or 1), e.type == "Warning")
        )
    for pod in found.values():
        pod.resizes.sort(key=lambda resize: resize[0])  # in one second: as recorded
        pod.happenings.sort(key=lambda h: h.first)
        if pod.status is None and pod.resizes:
            pod.memory = pod.resizes[-1][1]
    ordered = sorted(found.values(), key=lambda p: (p.created is None, p.created, p.name))
    return OwnerHistory(own, ordered)


def read(kube: ApiClient, owner: OwnerRef) -> OwnerHistory:
    """The owner's history from the cluster: one LIST of Events, one of the cohort."""
    core = CoreV1Api(kube)
    events = core.list_namespaced_event(owner.namespace).items
    lookup = KubernetesActivities(core, CustomObjectsApi(kube)).lookup
    obj = lookup.get(owner)
    pods = [] if obj is None else lookup.pods(owner.namespace, lookup.cohort_query(owner, obj))
    return history(owner, events, pods)
