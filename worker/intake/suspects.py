"""Suspects: the intake's side of the early verdict. A pod of an owner whose window runs under
an early verdict, seen failing for certain (``causes.suspect``), tells the owner's run
(``Delivery.suspect``: once as it starts failing, debounced per owner).

The pods that may fail (``causes.might_fail``) are kept by owner, each before its owner's state
is read: a pod that failed before the owner cache showed the window open (its state written a
moment after the kill, or shown late by the watch) is asked again on the owner's event, since
its own next event can be minutes away (the kubelet's restart delay in a crash loop).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from worker.intake import causes
from worker.intake.delivery import Delivery
from worker.workloads import WorkloadCache
from workflows.activity_api import OwnerRef
from workflows.contract import Obj
from workflows.policy import AnyPolicy


class Suspects:
    def __init__(
        self,
        delivery: Delivery,
        owners: WorkloadCache,
        policy_of: Callable[[OwnerRef, Obj], AnyPolicy | None],
    ) -> None:
        self.delivery, self.owners, self.policy_of = delivery, owners, policy_of
        self._lock = threading.Lock()
        self._unready: dict[OwnerRef, dict[str, Obj]] = {}  # owner -> pod uid -> pod, as seen
        self._owner_of: dict[str, OwnerRef] = {}  # pod uid -> its owner, while kept

    def pod_seen(self, event: str, pod: Obj) -> None:
        """Each pod event: kept (or let go), then its certain failure told or cleared."""
        may = event != "DELETED" and causes.might_fail(pod)
        owner = self.owners.owner_of(pod) if may else None
        self._keep(pod, owner)
        obj = self.owners.get(owner) if owner else None
        failing = bool(owner and obj and causes.suspect(pod, obj, self.policy_of(owner, obj)))
        self.delivery.suspect(owner, pod, failing)

    def owner_seen(self, owner: OwnerRef, obj: Obj) -> None:
        """An owner event: its kept pods asked again, as their own events would be."""
        if owner not in self._unready:
            return  # most owners: no pod that may fail, nothing read
        with self._lock:
            pods = list(self._unready.get(owner, {}).values())
        policy = self.policy_of(owner, obj)
        for pod in pods:
            self.delivery.suspect(owner, pod, causes.suspect(pod, obj, policy))

    def _keep(self, pod: Obj, owner: OwnerRef | None) -> None:
        uid = pod["metadata"].get("uid") or pod["metadata"]["name"]
        if owner is None and uid not in self._owner_of:
            return  # the common case, a Ready pod not kept before: no lock taken
        with self._lock:
            before = self._owner_of.pop(uid, None)
            if before is not None:
                pods = self._unready[before]
                del pods[uid]
                if not pods:
                    del self._unready[before]
            if owner is not None:
                self._owner_of[uid] = owner
                self._unready.setdefault(owner, {})[uid] = pod
