"""The intake's watch cache of workloads: ReplicaSets, Jobs and the nine owner kinds.

Going up from a pod to its owner and reading the owner's labels (for its policy) and rollback
state (for the wake rule) are dictionary lookups here, not GETs: one informer per kind (LIST,
then WATCH, cluster-wide) keeps a slim projection of each object, for a ReplicaSet or Job its
controller reference, for an owner its labels and the rollback-state annotation as stored.

- A miss falls back to one GET (``OwnerLookup``): a new ReplicaSet's pods can be seen before the
  ReplicaSet itself, and a kind whose informer has not synced yet has nothing to answer from.
- A kind the API server does not serve (Argo Rollouts, KubeAI or Strimzi not installed) is
  ``absent`` (``worker.informer``): nothing of it exists, so a miss there is a miss, not a GET.
- ``on_owner`` hears of each owner event (the intake forgets deleted owners and carries out the
  control annotation); ``on_change`` of each change to what the cache holds (the policy status
  is recomputed then, not on every event).

Cost: one watch per kind (10), and per cached object a few hundred bytes plus its state
annotation (measured in ``bench``, "burst"). RBAC: list and watch on each kind (``deploy/base``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from kubernetes.client import CoreV1Api, CustomObjectsApi

from activities.lookup import OwnerLookup
from activities.owners import INTERMEDIATE, OWNER_KINDS, controller_of
from worker.informer import BadObjectHandler, Informer
from workflows.activity_api import OwnerRef
from workflows.contract import CONTROL_ANNOTATION, ROLLBACK_STATE_ANNOTATION, Obj, WorkloadKind


def _view(obj: Obj) -> Obj:
    """What the intake reads of a workload, in the object's own shape (``read_state`` and
    ``controller_of`` work on it): name, uid (its Events), labels, the rollback state and
    control annotations, the controller."""
    meta = obj.get("metadata") or {}
    view: Obj = {
        "name": meta.get("name"),
        "namespace": meta.get("namespace"),
        "uid": meta.get("uid"),
    }
    if meta.get("labels"):
        view["labels"] = meta["labels"]
    annotations = meta.get("annotations") or {}
    kept = {
        k: annotations[k]
        for k in (ROLLBACK_STATE_ANNOTATION, CONTROL_ANNOTATION)
        if k in annotations
    }
    if kept:
        view["annotations"] = kept
    ref = controller_of(obj)
    if ref is not None:
        view["ownerReferences"] = [
            {"kind": ref.get("kind"), "name": ref.get("name"), "controller": True}
        ]
    return {"metadata": view}


class WorkloadCache(OwnerLookup):
    """``OwnerLookup`` answered from informers where they know, from the API where they don't."""

    def __init__(
        self,
        core: CoreV1Api,
        custom: CustomObjectsApi,
        on_owner: Callable[[str, OwnerRef, Obj], None] = lambda *_: None,
        on_bad_object: BadObjectHandler | None = None,
        on_change: Callable[[], None] | None = None,
        label_selector: str | None = None,  # the owners of these labels only (a CLI's -l)
    ) -> None:
        super().__init__(core, custom)
        self.on_owner = on_owner
        self.label_selector = label_selector
        self.owners: dict[WorkloadKind, Informer] = {}
        self.parents: dict[str, Informer] = {}
        for kind, where in OWNER_KINDS.items():
            self.owners[kind] = Informer(
                where.plural,
                self._lister(where.group, where.version, where.plural),
                self._owner_event(kind),
                on_bad_object=on_bad_object,
                project=_view,
                on_change=on_change,
                type_meta=(f"{where.group}/{where.version}".lstrip("/"), kind.value),
            )
        for parent, (group, version, plural) in INTERMEDIATE.items():
            if parent == "Job":  # a Job is an owner kind as well: one informer serves both
                self.parents[parent] = self.owners[WorkloadKind.JOB]
                continue
            self.parents[parent] = Informer(
                plural,
                self._lister(group, version, plural),
                lambda *_: None,
                on_bad_object=on_bad_object,
                project=_view,
                type_meta=(f"{group}/{version}".lstrip("/"), parent),
            )

    def informers(self) -> list[Informer]:
        return [*self.owners.values(), self.parents["ReplicaSet"]]

    def _lister(self, group: str, version: str, plural: str) -> Callable[..., Any]:
        def call(**kwargs: Any) -> Any:
            if self.label_selector is not None:
                kwargs["label_selector"] = self.label_selector
            return self.custom.list_cluster_custom_object(group, version, plural, **kwargs)

        return call

    def _owner_event(self, kind: WorkloadKind) -> Callable[[str, Obj, bool], None]:
        def handle(event: str, obj: Obj, initial: bool) -> None:
            meta = obj["metadata"]
            owner = OwnerRef(namespace=meta.get("namespace") or "", kind=kind, name=meta["name"])
            self.on_owner(event, owner, obj)

        return handle

    def views(self) -> Iterator[tuple[OwnerRef, Obj]]:
        """Every owner the watches know, with its view (a snapshot per kind: thread-safe)."""
        for kind, informer in self.owners.items():
            for (namespace, name), view in informer.cache.copy().items():
                yield OwnerRef(namespace=namespace, kind=kind, name=name), view

    def get(self, owner: OwnerRef) -> Obj | None:
        informer = self.owners[owner.kind]
        if informer.synced.is_set():
            found: Obj | None = informer.cache.get((owner.namespace, owner.name))
            if found is not None or informer.absent:
                return found
        return super().get(owner)  # not synced yet, or newer than the watch has told

    def parent(self, namespace: str, kind: str, name: str) -> tuple[bool, Obj | None]:
        informer = self.parents[kind]
        if informer.synced.is_set():
            found = informer.cache.get((namespace, name))
            if found is not None:
                return True, controller_of(found)
            if informer.absent:
                return False, None
        return super().parent(namespace, kind, name)
