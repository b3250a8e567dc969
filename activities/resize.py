"""In-place actuation: resize the running cohort pods through ``pods/resize``.

Used by the ``roll_back`` and ``reapply_recommendation`` activities in ``in-place`` mode. Only
pods whose actual resources differ from the target are patched (a strategic merge patch of the
containers' resources), so a retried activity resizes nothing twice. A pod whose node lacks the
free allocatable for larger requests is filtered and reported, never deleted; pending pods are
left to admission. Containers with a ``RestartContainer`` resize policy are named in the result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal

from kubernetes.client import CoreV1Api

from activities.cohort import actual_resources
from activities.lookup import body as _body
from workflows.contract import Obj
from workflows.fingerprint import Resources
from workflows.quantities import parse_quantity

STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"


@dataclass
class Resized:
    """What one in-place actuation did."""

    resized: int = 0
    filtered: list[str] = field(default_factory=list)  # pods whose node lacks the capacity
    restarts: set[str] = field(default_factory=set)  # pod/container restarted to apply

    def describe(self) -> str:
        text = f"{self.resized} pods resized in place"
        if self.filtered:
            text += (
                f"; {len(self.filtered)} filtered for lack of node capacity"
                f" ({', '.join(self.filtered)})"
            )
        if self.restarts:
            text += (
                "; containers restart to apply (RestartContainer):"
                f" {', '.join(sorted(self.restarts))}"
            )
        return text


def resize_pods(
    core: CoreV1Api, namespace: str, pods: list[Obj], requests: Resources, limits: Resources
) -> Resized:
    """Resize running ``pods`` to the target; skip those whose node lacks capacity."""
    free = NodeCapacity(core)
    done = Resized()
    for pod in pods:
        if pod.get("status", {}).get("phase") != "Running":
            continue  # pending pods are admitted with the owner's resources when they start
        actual_req, actual_lim = actual_resources(pod)
        containers = _resize_body(pod, actual_req, actual_lim, requests, limits)
        if not containers:
            continue
        growth = _growth(actual_req, requests)
        if growth and not free.fits(pod, growth):
            done.filtered.append(pod["metadata"]["name"])
            continue
        core.patch_namespaced_pod_resize(
            pod["metadata"]["name"],
            namespace,
            {"spec": {"containers": containers}},
            _content_type=STRATEGIC_MERGE_PATCH,
            _preload_content=False,
        )
        free.take(pod, growth)
        done.resized += 1
        done.restarts |= _restarting(pod, containers)
    return done


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
