"""Pauses: what the watches show of Kubex's pause annotations and of the engine's kill switch,
and the runs to resume when one goes.

A pause (``rightsizing.kubex.ai/pause-until``) on a namespace, an owner or a pod is kept as last
seen (``causes.pause_change``), bounded by the objects that carry one; ``held`` answers from
them, as the worker's gate would from the cluster. A pause that goes or changes resumes the runs
it may hold (owners with an active state there), so they look again within seconds. The kill
switch (``rightsizing.kubex.ai/automation`` on the engine's namespace) withholds new sightings
while it says ``disabled`` (``sightings``); once neither it nor the storm breaker holds, every
run Temporal shows held is resumed (one a pause still holds holds on).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime

from worker.intake import causes
from worker.intake.causes import PauseSeen
from worker.intake.delivery import Delivery
from worker.intake.sightings import Sightings
from worker.workloads import WorkloadCache
from workflows.activity_api import OwnerRef
from workflows.contract import PAUSE_UNTIL_ANNOTATION, Obj
from workflows.pause import Pause, automation_off, cluster_hold

ObjectKey = tuple[str, str, str]  # (kind, namespace or "", name)


class Pauses:
    def __init__(
        self,
        delivery: Delivery,
        sightings: Sightings,
        owners: WorkloadCache,
        changed: Callable[[], None],
        engine: str,
    ) -> None:
        self.delivery, self.sightings, self.owners = delivery, sightings, owners
        self.changed = changed  # a pause came, changed or went (the policies' status)
        self.engine = engine  # the engine's namespace, where the kill switch is
        self.cluster_hold: Pause | None = None  # the kill switch's or the breaker's, if either
        self._lock = threading.Lock()
        # Pause annotations as last seen, of the objects that carry one (bounded by them).
        self._pauses: dict[ObjectKey, PauseSeen] = {}
        self._paused_pods: dict[OwnerRef, set[str]] = {}  # owner -> its pods that carry one

    def namespace_seen(self, event: str, obj: Obj, started: bool) -> None:
        name = obj["metadata"]["name"]
        if name == self.engine:  # the kill switch and the breaker: lifted, the held resumed
            seen = None if event == "DELETED" else obj["metadata"].get("annotations")
            self.sightings.switch(automation_off((name, seen)))
            was, self.cluster_hold = self.cluster_hold, cluster_hold((name, seen))
            if was is not None and self.cluster_hold is None and started:
                # The backoffs' ends and re-applies it may hold, from the watch (a run may have
                # read the hold and not yet shown it to Temporal), and every run Temporal shows
                # held. A resume to a run that holds nothing changes nothing.
                views = self.owners.views()
                sent = [o for o, v in views if causes.bringing_back(v)]
                self.delivery.resume(sent)
                self.delivery.spawn(self.delivery.resume_held(frozenset(sent)))
        if self._lifted(("Namespace", "", name), event, obj):
            views = self.owners.views()
            self.delivery.resume([o for o, v in views if o.namespace == name and causes.active(v)])

    def owner_seen(self, event: str, owner: OwnerRef, obj: Obj) -> None:
        key = (owner.kind.value, owner.namespace, owner.name)
        if self._lifted(key, event, obj) and event != "DELETED" and causes.active(obj):
            self.delivery.resume([owner])

    def pod_seen(self, event: str, pod: Obj) -> None:
        """A pod's pause, with its owner's for ``held``; one that went resumes the owner's run."""
        meta = pod["metadata"]
        key = ("Pod", meta.get("namespace") or "", meta["name"])
        paused = PAUSE_UNTIL_ANNOTATION in (meta.get("annotations") or {})
        if not paused and key not in self._pauses:
            return
        owner = self.owners.owner_of(pod)
        lifted = self._lifted(key, event, pod, owner)
        view = self.owners.get(owner) if owner is not None else None
        if lifted and owner is not None and view is not None and causes.active(view):
            self.delivery.resume([owner])

    def held(self, owner: OwnerRef) -> bool:
        """Whether a pause holds the owner now, as the watches show (``causes.held``)."""
        with self._lock:
            mine = self._pauses.get((owner.kind.value, owner.namespace, owner.name))
            namespace = self._pauses.get(("Namespace", "", owner.namespace))
            on_pods = self._paused_pods.get(owner, ())
            pods = [(pod, self._pauses.get(("Pod", owner.namespace, pod))) for pod in on_pods]
        return causes.held(owner, mine, namespace, pods, datetime.now(UTC))

    def _lifted(
        self, key: ObjectKey, event: str, obj: Obj, pod_owner: OwnerRef | None = None
    ) -> bool:
        """Whether ``obj``'s pause went or changed since last seen (``causes.pause_change``)."""
        with self._lock:
            change = causes.pause_change(self._pauses.get(key), event, obj)
            if change.now is None:
                self._pauses.pop(key, None)
            else:
                self._pauses[key] = change.now
            if pod_owner is not None:
                pods = self._paused_pods.setdefault(pod_owner, set())
                (pods.discard if change.now is None else pods.add)(key[2])
                if not pods:
                    del self._paused_pods[pod_owner]
        if change.changed:
            self.changed()  # the policies' WorkloadsPaused condition
        return change.lifted
