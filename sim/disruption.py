"""The disruption controller of the simulated cluster: each PodDisruptionBudget's ``status`` as
kube-controller-manager's computes it (``pkg/controller/disruption``), so the engine reads the
same fields it would on a real cluster.

The rules followed (``getExpectedPodCount``, ``countHealthyPods``, ``updatePdbStatus``):

- ``maxUnavailable`` (a number, or a percentage rounded up) of ``expectedPods``, the sum of the
  scales of the controllers of the selected pods (a ReplicaSet of a Deployment counts the
  Deployment's); ``desiredHealthy = expectedPods - maxUnavailable``, at least 0;
- ``minAvailable`` as a number: ``desiredHealthy`` is it, ``expectedPods`` the selected pods;
  as a percentage: of the controllers' scales, rounded up;
- ``currentHealthy``: selected pods, not being deleted, whose Ready condition is True;
- ``disruptionsAllowed = currentHealthy - desiredHealthy``, 0 when negative or when no pod is
  expected; ``observedGeneration`` the PDB's generation.

Left out: ``disruptedPods`` (evictions in flight: the engine evicts nothing), the
``DisruptionAllowed`` condition, and pods without a controller under a percentage or
``maxUnavailable`` (the real controller reports them, and counts only the managed ones, as here).
A selector that is absent selects nothing; an empty one, every pod of the namespace (policy/v1).
"""

from __future__ import annotations

import math
import threading
from typing import Any

from sim.apiserver import ApiError, ResourceType, Store
from workflows.contract import Obj
from workflows.policy import LabelSelector

MERGE = "application/merge-patch+json"
# What a change of may change a budget's status: its pods, itself, the controllers' scales.
WATCHED = {"Pod", "PodDisruptionBudget", "Deployment", "ReplicaSet", "StatefulSet"}


def _ready(pod: Obj) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _scaled(value: Any, total: int) -> int:
    """``intstr.GetScaledValueFromIntOrPercent(value, total, roundUp=true)``."""
    if isinstance(value, str) and value.endswith("%"):
        return math.ceil(int(value[:-1]) * total / 100)
    return int(value)


class DisruptionController:
    """Keeps every PodDisruptionBudget's status true as the store changes (a listener: the
    status follows each pod's readiness within the write that changed it)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._busy = threading.local()  # our own status writes do not trigger us again
        store.listeners.append(self._changed)

    def _changed(self, kind: str, rtype: ResourceType, obj: Obj) -> None:
        if rtype.kind not in WATCHED or getattr(self._busy, "on", False):
            return
        self._busy.on = True
        try:
            self.sync(obj["metadata"].get("namespace"))
        finally:
            self._busy.on = False

    def sync(self, namespace: str | None) -> None:
        rtype = self.store.rtype("PodDisruptionBudget")
        for pdb in self.store.items("PodDisruptionBudget", namespace):
            status = self.status_of(pdb)
            if {k: (pdb.get("status") or {}).get(k) for k in status} == status:
                continue
            meta = pdb["metadata"]
            try:
                self.store.patch(
                    rtype, meta["namespace"], meta["name"], {"status": status}, MERGE, "status"
                )
            except ApiError:  # deleted meanwhile
                continue

    def status_of(self, pdb: Obj) -> dict[str, int]:
        spec, meta = pdb.get("spec") or {}, pdb["metadata"]
        pods = self._selected(meta["namespace"], spec.get("selector"))
        if spec.get("maxUnavailable") is not None:
            expected = self._scale(pods)
            most = _scaled(spec["maxUnavailable"], expected)
            desired = max(0, expected - most)
        elif isinstance(spec.get("minAvailable"), str):
            expected = self._scale(pods)
            desired = _scaled(spec["minAvailable"], expected)
        else:
            expected, desired = len(pods), int(spec.get("minAvailable") or 0)
        healthy = sum(1 for p in pods if _ready(p))
        allowed = healthy - desired if expected > 0 and healthy > desired else 0
        return {
            "currentHealthy": healthy,
            "desiredHealthy": desired,
            "expectedPods": expected,
            "disruptionsAllowed": allowed,
            "observedGeneration": int(meta.get("generation") or 1),
        }

    def _selected(self, namespace: str, selector: Obj | None) -> list[Obj]:
        if selector is None:
            return []
        wanted = LabelSelector.model_validate(selector)
        return [
            p
            for p in self.store.items("Pod", namespace)
            if not p["metadata"].get("deletionTimestamp")
            and wanted.matches(p["metadata"].get("labels") or {})
        ]

    def _scale(self, pods: list[Obj]) -> int:
        """The sum of the scales of the selected pods' controllers (each counted once)."""
        scales: dict[str, int] = {}
        for pod in pods:
            ref = next(
                (r for r in pod["metadata"].get("ownerReferences") or [] if r.get("controller")),
                None,
            )
            if ref is None or ref.get("uid") in scales:
                continue
            owner = self._owner(pod["metadata"]["namespace"], ref)
            if owner is None:
                continue
            if owner["kind"] == "ReplicaSet":  # a Deployment's: its scale is the Deployment's
                parent = next(
                    (r for r in owner["metadata"].get("ownerReferences") or []
                     if r.get("controller") and r.get("kind") == "Deployment"),
                    None,
                )  # fmt: skip
                deployment = self._owner(owner["metadata"]["namespace"], parent) if parent else None
                owner = deployment or owner
            scales[ref["uid"]] = int((owner.get("spec") or {}).get("replicas", 1))
        return sum(scales.values())

    def _owner(self, namespace: str, ref: Obj) -> Obj | None:
        try:
            return self.store.get(self.store.rtype(ref["kind"]), namespace, ref["name"])
        except ApiError:
            return None
