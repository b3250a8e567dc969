"""The horizontal pod autoscaler of the simulated cluster (``autoscaling/v2``): each
HorizontalPodAutoscaler's scale and ``status`` as kube-controller-manager's computes them
(``pkg/controller/podautoscaler``), closely enough for a cut's effect on it to show.

Each HPA is synced every ``SYNC_PERIOD`` seconds (the real controller's 15 s, compressed as the
rest of the simulation is; the policies' periods and stabilisation windows are taken as written):

- **the metric**: CPU utilisation of requests (a ``Resource`` metric, ``cpu``, target type
  ``Utilization``) over the target's Ready pods: the CPU their applications use (the scenario's
  ``cpu``, per pod) summed over the CPU they request (the pods' spec), in percent. A Ready pod
  without a CPU request makes the metric fail (``ScalingActive`` False,
  ``FailedGetResourceMetric``, "missing request for cpu"), as the real one does;
- **the proposal**: ``ceil(ready pods x utilisation / target)``, unchanged within the 10%
  tolerance (``|ratio - 1| <= 0.1``);
- **behaviour** (``spec.behavior``, the real defaults when unset): stabilisation (the highest
  proposal within ``scaleDown.stabilizationWindowSeconds``, 300 s by default, bounds a scale
  down; the lowest within ``scaleUp``'s, 0 s, a scale up), then the rate policies over their
  periods (scale up: 4 pods or 100% per 15 s, the larger; scale down: 100% per 15 s), then
  ``minReplicas`` (1 by default) and ``maxReplicas``, ``ScalingLimited`` saying which bound
  held (``TooManyReplicas``, ``TooFewReplicas``) or ``DesiredWithinRange``;
- **the scale**: ``spec.replicas`` of the target (Deployment, StatefulSet, Rollout) written when
  it changes, with a ``SuccessfulRescale`` Event on the HPA ("New size: 5; reason: cpu resource
  utilization (percentage of request) above target"); ``status``: ``currentReplicas``,
  ``desiredReplicas``, ``currentMetrics``, ``lastScaleTime``, ``conditions``.

An HPA with metrics other than CPU (KEDA's external metrics) is kept as it is: its
``desiredReplicas`` follow the target's scale, nothing here computes them. Left out: the CPU
initialisation period of new pods, memory metrics, ``selectPolicy: Disabled``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from activities.kubetime import kube_now
from activities.owners import dig
from sim.apiserver import ApiError, Store
from workflows.contract import Obj
from workflows.policy import LabelSelector
from workflows.quantities import parse_quantity

MERGE = "application/merge-patch+json"
SYNC_PERIOD = 1.0  # seconds between two syncs of an HPA
TOLERANCE = 0.1
DEFAULT_UP = {
    "stabilizationWindowSeconds": 0,
    "selectPolicy": "Max",
    "policies": [
        {"type": "Pods", "value": 4, "periodSeconds": 15},
        {"type": "Percent", "value": 100, "periodSeconds": 15},
    ],
}
DEFAULT_DOWN = {
    "stabilizationWindowSeconds": 300,
    "selectPolicy": "Max",
    "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}],
}

Usage = Callable[[Obj], Decimal | None]  # the CPU a pod's applications use now, in cores
Recorder = Callable[[Obj, str, str, str], None]  # (involved object, reason, message, component)


def _ready(pod: Obj) -> bool:
    conditions = dig(pod, "status", "conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _condition(kind: str, true: bool, reason: str, message: str) -> Obj:
    return {
        "type": kind,
        "status": "True" if true else "False",
        "reason": reason,
        "message": message,
        "lastTransitionTime": kube_now(),
    }


@dataclass
class _Memory:
    """What the controller remembers of one HPA between syncs (the real one's maps)."""

    last_sync: float = -math.inf
    proposals: list[tuple[float, int]] = field(default_factory=list)  # (time, replicas)
    scaled: list[tuple[float, int]] = field(default_factory=list)  # (time, change)


class AutoscalerController:
    """Syncs every HorizontalPodAutoscaler of the store (``step``, from the cluster's tick)."""

    def __init__(self, store: Store, usage: Usage, event: Recorder) -> None:
        self.store = store
        self.usage = usage
        self.event = event  # the cluster's Event recorder (the same one again counts up)
        self._memory: dict[str, _Memory] = {}

    def step(self, now: float) -> None:
        for hpa in list(self.store.items("HorizontalPodAutoscaler")):
            memory = self._memory.setdefault(hpa["metadata"]["uid"], _Memory())
            if now - memory.last_sync >= SYNC_PERIOD:
                memory.last_sync = now
                try:
                    self._sync(hpa, memory, now)
                except ApiError:  # deleted meanwhile, its target too: the next sync looks again
                    continue

    def _sync(self, hpa: Obj, memory: _Memory, now: float) -> None:
        spec, ns = hpa.get("spec") or {}, hpa["metadata"]["namespace"]
        ref = spec.get("scaleTargetRef") or {}
        try:
            target = self.store.get(self.store.rtype(ref.get("kind", "")), ns, ref.get("name", ""))
        except ApiError:
            why = f"the HPA controller was unable to get the target's current scale: {ref}"
            self._status(
                hpa, None, None, None, [_condition("AbleToScale", False, "FailedGetScale", why)]
            )
            return
        current = int((target.get("spec") or {}).get("replicas", 1))
        lowest, highest = int(spec.get("minReplicas") or 1), int(spec["maxReplicas"])
        cpu = _cpu_target(spec)
        if cpu is None or current == 0:  # not ours to compute (KEDA's external metrics)
            self._status(hpa, current, current, None, [])
            return
        measured = self._utilisation(target, ns)
        if isinstance(measured, str):
            failed = _condition("ScalingActive", False, "FailedGetResourceMetric", measured)
            self._status(hpa, current, current, None, [failed])
            return
        utilisation, ready = measured
        ratio = utilisation / cpu
        proposal = (
            current if abs(ratio - 1) <= TOLERANCE or ready == 0 else math.ceil(ratio * ready)
        )
        memory.proposals.append((now, proposal))
        behaviour = spec.get("behavior") or {}
        up = {**DEFAULT_UP, **(behaviour.get("scaleUp") or {})}
        down = {**DEFAULT_DOWN, **(behaviour.get("scaleDown") or {})}
        desired = self._stabilised(memory, current, proposal, now, up, down)
        desired, limited = _bounded(memory, current, desired, now, up, down, lowest, highest)
        conditions = [
            _condition("AbleToScale", True, "ReadyForNewScale", "recommended size is current"),
            _condition("ScalingActive", True, "ValidMetricFound",
                       "the HPA was able to successfully calculate a replica count from cpu"
                       " resource utilization (percentage of request)"),
            limited,
        ]  # fmt: skip
        if desired != current:
            self.store.patch(
                self.store.rtype(target["kind"]),
                ns,
                target["metadata"]["name"],
                {"spec": {"replicas": desired}},
                MERGE,
            )
            memory.scaled.append((now, desired - current))
            side = "above" if desired > current else "below"
            self._rescaled(hpa, desired, side)
        metric = {"type": "Resource", "resource": {
            "name": "cpu", "current": {"averageUtilization": round(utilisation)}}}  # fmt: skip
        self._status(hpa, current, desired, metric, conditions, scaled=desired != current)

    def _utilisation(self, target: Obj, ns: str) -> tuple[float, int] | str:
        """(percent of requests used, Ready pods) over the target's Ready pods; or why not."""
        selector = (target.get("spec") or {}).get("selector")
        if selector is None:
            return "the target has no selector"
        wanted = LabelSelector.model_validate(selector)
        used = requested = Decimal(0)
        ready = 0
        for pod in self.store.items("Pod", ns):
            meta = pod["metadata"]
            if meta.get("deletionTimestamp") or not wanted.matches(meta.get("labels") or {}):
                continue
            if not _ready(pod):
                continue
            ready += 1
            for container in dig(pod, "spec", "containers") or []:
                request = dig(container, "resources", "requests", "cpu")
                if request is None:
                    name = container["name"]
                    return f"missing request for cpu in container {name} of {meta['name']}"
                requested += parse_quantity(str(request))
            used += self.usage(pod) or Decimal(0)
        if ready == 0:
            return "did not receive metrics for any ready pods"
        return float(used * 100 / requested) if requested else 0.0, ready

    def _stabilised(
        self, memory: _Memory, current: int, proposal: int, now: float, up: Obj, down: Obj
    ) -> int:
        """``stabilizeRecommendationWithBehaviors``: the lowest proposal of the scale-up window
        bounds a scale up, the highest of the scale-down window a scale down."""
        up_cut = now - float(up["stabilizationWindowSeconds"])
        down_cut = now - float(down["stabilizationWindowSeconds"])
        keep = max(
            float(up["stabilizationWindowSeconds"]), float(down["stabilizationWindowSeconds"])
        )
        memory.proposals = [(t, r) for t, r in memory.proposals if t >= now - keep]
        upward = min([r for t, r in memory.proposals if t >= up_cut] or [proposal])
        downward = max([r for t, r in memory.proposals if t >= down_cut] or [proposal])
        return min(max(current, upward), downward)

    def _rescaled(self, hpa: Obj, size: int, side: str) -> None:
        meta = hpa["metadata"]
        involved = {
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            **{k: meta[k] for k in ("name", "namespace", "uid")},
        }
        message = (
            f"New size: {size}; reason: cpu resource utilization (percentage of request) {side}"
            " target"
        )
        self.event(involved, "SuccessfulRescale", message, "horizontal-pod-autoscaler")

    def _status(
        self,
        hpa: Obj,
        current: int | None,
        desired: int | None,
        metric: Obj | None,
        conditions: list[Obj],
        scaled: bool = False,
    ) -> None:
        status: dict[str, Any] = {"conditions": conditions} if conditions else {}
        if current is not None:
            status |= {"currentReplicas": current, "desiredReplicas": desired}
        if metric is not None:
            status["currentMetrics"] = [metric]
        if scaled:
            status["lastScaleTime"] = kube_now()
        before = hpa.get("status") or {}
        unchanged = {k: v for k, v in status.items() if k not in ("conditions", "lastScaleTime")}
        if (
            not scaled
            and all(before.get(k) == v for k, v in unchanged.items())
            and _same(before.get("conditions"), conditions)
        ):
            return  # written only when it changed, as the controller does
        meta = hpa["metadata"]
        self.store.patch(
            self.store.rtype("HorizontalPodAutoscaler"),
            meta["namespace"],
            meta["name"],
            {"status": status},
            MERGE,
            "status",
        )


def _same(before: list[Obj] | None, after: list[Obj]) -> bool:
    """Conditions alike but for their transition times."""

    def strip(conditions: list[Obj] | None) -> list[tuple[Any, ...]]:
        return [(c.get("type"), c.get("status"), c.get("reason")) for c in conditions or []]

    return strip(before) == strip(after)


def _cpu_target(spec: Obj) -> float | None:
    """The target CPU utilisation (percent of requests) of an HPA; None without one."""
    for metric in spec.get("metrics") or []:
        resource = metric.get("resource") or {}
        target = resource.get("target") or {}
        if (
            metric.get("type") == "Resource"
            and resource.get("name") == "cpu"
            and target.get("type") == "Utilization"
        ):
            return float(target.get("averageUtilization") or 80)
    return None


def _limit(
    rules: Obj, current: int, scaled: list[tuple[float, int]], now: float, grow: bool
) -> int:
    """``calculateScaleUpLimitWithScalingRules`` (and down): each policy's bound from the
    replicas at the start of its period, then the one allowing the most change
    (``selectPolicy: Max``) or the least (``Min``)."""
    bounds = []
    for policy in rules["policies"]:
        since = now - int(policy["periodSeconds"])
        changed = sum(d for t, d in scaled if t >= since and (d > 0 if grow else d < 0))
        start, value = current - changed, int(policy["value"])
        if policy["type"] == "Pods":
            bounds.append(start + value if grow else start - value)
        else:
            share = value / 100
            bounds.append(
                math.ceil(start * (1 + share)) if grow else math.ceil(start * (1 - share))
            )
    most = (rules.get("selectPolicy") or "Max") == "Max"
    return (max if most == grow else min)(bounds)


def _bounded(
    memory: _Memory,
    current: int,
    desired: int,
    now: float,
    up: Obj,
    down: Obj,
    lowest: int,
    highest: int,
) -> tuple[int, Obj]:
    """``convertDesiredReplicasWithBehaviorRate``: the rate policies over their periods, then
    min and max replicas; and the ``ScalingLimited`` condition that says which bound held."""
    longest = max(int(p["periodSeconds"]) for p in [*up["policies"], *down["policies"]])
    memory.scaled = [(t, d) for t, d in memory.scaled if t >= now - longest]
    if desired > current:
        desired = min(desired, _limit(up, current, memory.scaled, now, grow=True))
    elif desired < current:
        desired = max(desired, _limit(down, current, memory.scaled, now, grow=False))
    if desired > highest:
        return highest, _condition(
            "ScalingLimited", True, "TooManyReplicas",
            "the desired replica count is more than the maximum replica count",
        )  # fmt: skip
    if desired < lowest:
        return lowest, _condition(
            "ScalingLimited", True, "TooFewReplicas",
            "the desired replica count is less than the minimum replica count",
        )  # fmt: skip
    return desired, _condition(
        "ScalingLimited", False, "DesiredWithinRange",
        "the desired count is within the acceptable range",
    )  # fmt: skip
