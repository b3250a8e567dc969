"""The built-in kinds' Table columns, as a real API server prints them for ``kubectl get``.

``sim.discovery.table`` serves these for pods, deployments, replicasets, statefulsets,
daemonsets, jobs, cronjobs, events, nodes and namespaces (the columns and their order are
Kubernetes' own printers, ``pkg/printers/internalversion``), so ``kubectl get events`` shows
LAST SEEN, TYPE, REASON, OBJECT, MESSAGE and ``kubectl get pods`` READY, STATUS, RESTARTS.
A column with priority 1 shows with ``-o wide`` only. Any other kind gets Name and Age.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from activities.owners import dig
from workflows.contract import Obj
from workflows.jsonpath import age


@dataclass(frozen=True)
class Column:
    name: str
    type: str
    cell: Callable[[Obj, datetime], Any]
    priority: int = 0
    description: str = ""

    def definition(self) -> Obj:
        return {
            "name": self.name,
            "type": self.type,
            "format": "name" if self.name == "Name" else "",
            "description": self.description,
            "priority": self.priority,
        }


def _name(obj: Obj, _: datetime) -> Any:
    return obj["metadata"]["name"]


def _age(obj: Obj, now: datetime) -> Any:
    return age(obj["metadata"].get("creationTimestamp"), now)


NAME = Column("Name", "string", _name, description="Name must be unique within a namespace.")
AGE = Column(
    "Age", "string", _age, description="CreationTimestamp is the time the object was made."
)


def _status(path: str, default: Any = 0) -> Callable[[Obj, datetime], Any]:
    def cell(obj: Obj, _: datetime) -> Any:
        value = dig(obj, "status", *path.split("."))
        return default if value is None else value

    return cell


def _ready_of(desired: str, ready: str) -> Callable[[Obj, datetime], Any]:
    """``2/3``: ready of desired."""

    def cell(obj: Obj, _: datetime) -> Any:
        want = dig(obj, *desired.split("."))
        have = dig(obj, "status", ready) or 0
        return f"{have}/{want if want is not None else 1}"

    return cell


def _containers(obj: Obj, _: datetime) -> Any:
    template = dig(obj, "spec", "template", "spec", "containers") or []
    return ",".join(c.get("name", "") for c in template)


def _images(obj: Obj, _: datetime) -> Any:
    template = dig(obj, "spec", "template", "spec", "containers") or []
    return ",".join(c.get("image", "") for c in template)


def _selector(obj: Obj, _: datetime) -> Any:
    labels = dig(obj, "spec", "selector", "matchLabels") or {}
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "<none>"


# --- pods --------------------------------------------------------------------------------------


def _pod_ready(pod: Obj, _: datetime) -> Any:
    statuses = dig(pod, "status", "containerStatuses") or []
    total = len(dig(pod, "spec", "containers") or [])
    return f"{sum(1 for cs in statuses if cs.get('ready'))}/{total}"


def pod_status(pod: Obj) -> str:
    """What kubectl's STATUS says: a waiting or terminated reason over the phase."""
    status = pod.get("status") or {}
    if pod["metadata"].get("deletionTimestamp"):
        return "Terminating"
    reason = status.get("phase") or "Pending"
    for cs in status.get("containerStatuses") or []:
        state = cs.get("state") or {}
        waiting = (state.get("waiting") or {}).get("reason")
        terminated = (state.get("terminated") or {}).get("reason")
        if waiting or terminated:
            reason = waiting or terminated
    return str(reason)


def _restarts(pod: Obj, _: datetime) -> Any:
    statuses = dig(pod, "status", "containerStatuses") or []
    return sum(int(cs.get("restartCount", 0)) for cs in statuses)


PODS = [
    NAME,
    Column("Ready", "string", _pod_ready, description="The ready containers of all."),
    Column("Status", "string", lambda p, _: pod_status(p), description="The pod's state."),
    Column("Restarts", "string", _restarts, description="Container restarts."),
    AGE,
    Column("IP", "string", lambda p, _: dig(p, "status", "podIP") or "<none>", 1),
    Column("Node", "string", lambda p, _: dig(p, "spec", "nodeName") or "<none>", 1),
    Column("Nominated Node", "string", lambda p, _: "<none>", 1),
    Column("Readiness Gates", "string", lambda p, _: "<none>", 1),
]

# --- workloads ---------------------------------------------------------------------------------

DEPLOYMENTS = [
    NAME,
    Column("Ready", "string", _ready_of("spec.replicas", "readyReplicas")),
    Column("Up-to-date", "integer", _status("updatedReplicas")),
    Column("Available", "integer", _status("availableReplicas")),
    AGE,
    Column("Containers", "string", _containers, 1),
    Column("Images", "string", _images, 1),
    Column("Selector", "string", _selector, 1),
]

REPLICASETS = [
    NAME,
    Column("Desired", "integer", lambda o, _: dig(o, "spec", "replicas") or 0),
    Column("Current", "integer", _status("replicas")),
    Column("Ready", "integer", _status("readyReplicas")),
    AGE,
    Column("Containers", "string", _containers, 1),
    Column("Images", "string", _images, 1),
    Column("Selector", "string", _selector, 1),
]

STATEFULSETS = [
    NAME,
    Column("Ready", "string", _ready_of("spec.replicas", "readyReplicas")),
    AGE,
    Column("Containers", "string", _containers, 1),
    Column("Images", "string", _images, 1),
]


def _node_selector(obj: Obj, _: datetime) -> Any:
    selector = dig(obj, "spec", "template", "spec", "nodeSelector") or {}
    return ",".join(f"{k}={v}" for k, v in sorted(selector.items())) or "<none>"


DAEMONSETS = [
    NAME,
    Column("Desired", "integer", _status("desiredNumberScheduled")),
    Column("Current", "integer", _status("currentNumberScheduled")),
    Column("Ready", "integer", _status("numberReady")),
    Column("Up-to-date", "integer", _status("updatedNumberScheduled")),
    Column("Available", "integer", _status("numberAvailable")),
    Column(
        "Node Selector",
        "string",
        lambda o, _: (
            ",".join(
                f"{k}={v}"
                for k, v in (dig(o, "spec", "template", "spec", "nodeSelector") or {}).items()
            )
            or "<none>"
        ),
    ),
    AGE,
    Column("Containers", "string", _containers, 1),
    Column("Images", "string", _images, 1),
    Column("Selector", "string", _selector, 1),
]


def _job_status(job: Obj, _: datetime) -> Any:
    for condition in dig(job, "status", "conditions") or []:
        if condition.get("status") == "True" and condition.get("type") in ("Complete", "Failed"):
            return condition["type"]
    return "Running"


def _completions(job: Obj, _: datetime) -> Any:
    want = dig(job, "spec", "completions") or dig(job, "spec", "parallelism") or 1
    return f"{dig(job, 'status', 'succeeded') or 0}/{want}"


def _duration(job: Obj, now: datetime) -> Any:
    start = dig(job, "status", "startTime")
    if start is None:
        return ""
    end = dig(job, "status", "completionTime")
    return age(start, datetime.fromisoformat(end.replace("Z", "+00:00")) if end else now)


JOBS = [
    NAME,
    Column("Status", "string", _job_status),
    Column("Completions", "string", _completions),
    Column("Duration", "string", _duration),
    AGE,
    Column("Containers", "string", _containers, 1),
    Column("Images", "string", _images, 1),
    Column("Selector", "string", _selector, 1),
]

CRONJOBS = [
    NAME,
    Column("Schedule", "string", lambda o, _: dig(o, "spec", "schedule") or ""),
    Column("Timezone", "string", lambda o, _: dig(o, "spec", "timeZone") or "<none>"),
    Column("Suspend", "boolean", lambda o, _: bool(dig(o, "spec", "suspend"))),
    Column("Active", "integer", lambda o, _: len(dig(o, "status", "active") or [])),
    Column(
        "Last Schedule",
        "string",
        lambda o, now: age(dig(o, "status", "lastScheduleTime"), now) or "<none>",
    ),
    AGE,
]

# --- events, nodes, namespaces -----------------------------------------------------------------


def _last_seen(event: Obj, now: datetime) -> Any:
    when = event.get("lastTimestamp") or event.get("eventTime") or event.get("firstTimestamp")
    return age(when or event["metadata"].get("creationTimestamp"), now)


def _object(event: Obj, _: datetime) -> Any:
    involved = event.get("involvedObject") or {}
    return f"{str(involved.get('kind', '')).lower()}/{involved.get('name', '')}"


def _source(event: Obj, _: datetime) -> Any:
    return dig(event, "source", "component") or event.get("reportingComponent") or ""


EVENTS = [
    Column("Last Seen", "string", _last_seen),
    Column("Type", "string", lambda e, _: e.get("type", "")),
    Column("Reason", "string", lambda e, _: e.get("reason", "")),
    Column("Object", "string", _object),
    Column("Subobject", "string", lambda e, _: dig(e, "involvedObject", "fieldPath") or "", 1),
    Column("Source", "string", _source, 1),
    Column("Message", "string", lambda e, _: e.get("message", "")),
    Column("First Seen", "string", lambda e, now: age(e.get("firstTimestamp") or "", now) or "", 1),
    Column("Count", "integer", lambda e, _: e.get("count", 1), 1),
    Column("Name", "string", _name, 1),
]


def _node_status(node: Obj, _: datetime) -> Any:
    for condition in dig(node, "status", "conditions") or []:
        if condition.get("type") == "Ready":
            return "Ready" if condition.get("status") == "True" else "NotReady"
    return "Ready"  # the simulated nodes carry no conditions: they are always up


NODES = [
    NAME,
    Column("Status", "string", _node_status),
    Column("Roles", "string", lambda n, _: "<none>"),
    AGE,
    Column("Version", "string", lambda n, _: dig(n, "status", "nodeInfo", "kubeletVersion") or ""),
]

NAMESPACES = [
    NAME,
    Column("Status", "string", lambda n, _: dig(n, "status", "phase") or "Active"),
    AGE,
]

BUILT_IN: dict[tuple[str, str], list[Column]] = {
    ("", "pods"): PODS,
    ("apps", "deployments"): DEPLOYMENTS,
    ("apps", "replicasets"): REPLICASETS,
    ("apps", "statefulsets"): STATEFULSETS,
    ("apps", "daemonsets"): DAEMONSETS,
    ("batch", "jobs"): JOBS,
    ("batch", "cronjobs"): CRONJOBS,
    ("", "events"): EVENTS,
    ("", "nodes"): NODES,
    ("", "namespaces"): NAMESPACES,
}
