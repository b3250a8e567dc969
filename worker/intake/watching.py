"""Watching: ``Intake`` runs the watches (both policy kinds into a ``PolicyIndex``, namespaces,
the workload kinds through ``worker.workloads``, pods) for one leadership term, keeps what they
last showed, asks ``causes`` what each change means and hands it to ``delivery``."""

from __future__ import annotations

import asyncio
import logging
import math
import threading
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from typing import Any

from kubernetes.client import CoreV1Api, CustomObjectsApi
from temporalio.client import Client
from temporalio.common import MetricMeter

from activities.lookup import read_state
from worker.informer import Informer, Informers, identity
from worker.intake import causes
from worker.intake.breaker import Breaker
from worker.intake.budget import Budget
from worker.intake.causes import Adoption, Sighted
from worker.intake.controls import Controls
from worker.intake.delivery import Delivery
from worker.intake.pauses import Pauses
from worker.intake.sightings import Sightings
from worker.intake.suspects import Suspects
from worker.status import StatusWriter
from worker.workloads import WorkloadCache
from workflows.activity_api import OwnerRef
from workflows.breaker import StormBreaker
from workflows.contract import API_GROUP, API_VERSION, GROUP_VERSION, Obj
from workflows.contract import DEFAULT_ENGINE_NAMESPACE as ENGINE
from workflows.fingerprint import MalformedRecommendationError
from workflows.policy import AnyPolicy
from workflows.selection import PROTECTED, PolicyIndex, Protection, WorkloadRef

log = logging.getLogger(__name__)
ObjectKey = tuple[str, str, str]  # (kind, namespace or "", name)


class Intake:
    def __init__(
        self,
        core: CoreV1Api,
        custom: CustomObjectsApi,
        temporal: Client,
        cluster: str,
        task_queue: str,
        loop: asyncio.AbstractEventLoop,
        meter: MetricMeter = MetricMeter.noop,
        fence: Callable[[], float] = lambda: math.inf,
        protection: Protection = PROTECTED,
        prometheus: bool = True,  # the worker has a Prometheus to ask (for the policies' status)
        budget: float | None = None,  # the Temporal budget, actions a second (``budget``)
        engine_namespace: str = ENGINE,  # where the kill switch is (``pauses``)
        storm_breaker: StormBreaker | None = None,  # ``breaker``; None: none
    ) -> None:
        self.core, self.custom, self.cluster = core, custom, cluster
        # The leader's fence (``LeaderElector.time_left``) and this intake's end, checked right
        # before every write and signal (``acting``; docs/concepts/intake.md).
        self._fence = fence
        self.informers = Informers()
        self.stats: Counter[str] = Counter()
        kube = (core, custom)
        self.delivery = Delivery(
            temporal, cluster, task_queue, loop, kube, self.acting, fence, self.stats, meter,
            Budget(budget),
        )  # fmt: skip
        self.sightings = Sightings(self.delivery, meter, self._uid)
        self.controls = Controls(self.delivery, self.sightings, custom)
        self.owners = WorkloadCache(
            core, custom, self._on_owner, self.delivery.bad_object, on_change=self._owners_changed
        )
        self.status = StatusWriter(
            custom, self.owners.views, meter=meter, fence=self.acting, protection=protection,
            held=self.held, prometheus=prometheus, budget=budget, waiting=self.sightings.waiting,
        )  # fmt: skip
        changed = self.status.changed
        self.pauses = Pauses(self.delivery, self.sightings, self.owners, changed, engine_namespace)
        self.breaker = Breaker(self.delivery, storm_breaker, engine_namespace, self._told, meter)
        if budget is not None:
            self.sightings.on_waiting = self.status.changed
        self.index = PolicyIndex(protection)
        self._lock = threading.RLock()
        self.started = threading.Event()
        self._adopted: dict[str, Adoption] = {}  # pod uid -> what it runs, while it does
        self._adopters: dict[OwnerRef, dict[str, Sighted]] = {}  # owner -> uid -> sighting
        self._batch: dict[tuple[OwnerRef, str], Sighted] = {}  # the start-up LIST's, newest
        self._policies_handled: dict[ObjectKey, tuple[object, ...]] = {}
        self.suspects = Suspects(self.delivery, self.owners, self._policy)

    # --- lifecycle -----------------------------------------------------------------------------

    def acting(self) -> bool:
        """Whether this intake may write or signal now: not stopped, and still the leader."""
        return not self.informers.ended.is_set() and self._fence() > 0

    def _informer(self, name: str, listing: Callable[..., Any], on: Any, **kw: Any) -> Informer:
        return Informer(name, listing, on, on_bad_object=self.delivery.bad_object, **kw)

    def start(self) -> None:
        """Sync policies and namespaces first, so pods are resolved against a full index.
        Returns early, starting nothing more, once ``stop`` has been called."""
        listing = partial(self.custom.list_cluster_custom_object, API_GROUP, API_VERSION)
        first = [
            self._informer(p, partial(listing, p), self._on_policy, type_meta=(GROUP_VERSION, k))
            for p, k in (("rollbackpolicies", "RollbackPolicy"),
                         ("clusterrollbackpolicies", "ClusterRollbackPolicy"))
        ]  # fmt: skip
        namespaces = ("namespaces", self.core.list_namespace, self._on_namespace)
        first.append(self._informer(*namespaces, type_meta=("v1", "Namespace")))
        first += self.owners.informers()
        if not all(self.informers.launch(informer) for informer in first):
            return
        for informer in first:
            informer.synced.wait(30)
        with self._lock:
            if self.informers.ended.is_set():
                return
            self.status.start()
        pods = self._informer(
            "pods", self.core.list_pod_for_all_namespaces, self._on_pod,
            on_synced=self._flush_batch, project=identity, type_meta=("v1", "Pod"),
        )  # fmt: skip
        if not self.informers.launch(pods):
            return
        pods.synced.wait(60)
        if self.informers.ended.is_set():
            return
        self.started.set()
        log.info("intake started: %d policies, %d pods", len(self.index), len(pods.cache))
        if self.pauses.cluster_hold is None:  # the kill switch or breaker: what it holds stays
            self.delivery.spawn(self.delivery.resume_held())

    def stop(self) -> None:
        """End this intake's term: no write or signal from now on (pending ones are cancelled
        and the rest check ``acting``), then the watches and the status writer stop."""
        with self._lock:  # not while ``start`` starts the status writer
            self.informers.ended.set()
        self.started.clear()
        self.delivery.cancel()
        self.status.stop()
        self.informers.end()
        log.info("intake stopped")

    # --- handlers ------------------------------------------------------------------------------

    def _on_policy(self, event: str, obj: Obj, initial: bool) -> None:
        meta = obj["metadata"]
        key = (obj.get("kind", ""), meta.get("namespace") or "", meta["name"])
        with self._lock:
            before = self._policies_handled.get(key)
        # Validated off the lock, which every pod's adoption takes (a policy's queries are
        # bounded, docs/concepts/health-checks.md "Bounds"); this informer alone writes ``key``.
        change = causes.policy_change(event, obj, before)
        with self._lock:
            if change.action is causes.PolicyAction.SEEN:
                self.status.status_seen(obj)
                return
            self._policies_handled[key] = change.handled
            if change.policy is not None:
                self.index.upsert(change.policy)
                self.status.policy_seen(obj, change.policy)
                return
            self.index.remove(obj.get("kind", ""), meta.get("namespace"), meta["name"])
            if change.action is causes.PolicyAction.GONE:
                del self._policies_handled[key]
                self.status.policy_gone(obj)
                return
        self.status.policy_seen(obj, None, change.error)
        log.warning("ignoring invalid %s %s: %s", obj.get("kind"), meta.get("name"), change.error)
        self.stats["invalid_policies"] += 1
        self.delivery.warn(obj, causes.Notice.invalid_policy(obj, change.error))

    def _on_namespace(self, event: str, obj: Obj, initial: bool) -> None:
        meta = obj["metadata"]
        if event == "DELETED":
            with self._lock:
                self.index.forget_namespace(meta["name"])
        if meta["name"] == self.pauses.engine:
            self.breaker.namespace_seen(None if event == "DELETED" else meta.get("annotations"))
        self.pauses.namespace_seen(event, obj, self.started.is_set())

    def _on_owner(self, event: str, owner: OwnerRef, obj: Obj) -> None:
        self.pauses.owner_seen(event, owner, obj)
        if event != "DELETED":
            self.breaker.owner_seen(owner, obj)
        if event != "DELETED" and owner in self._adopters:  # most owner events: read no state
            with self._lock:
                adopters = list(self._adopters.get(owner, {}).values())
            going_on = causes.going_on(obj, adopters)
            if going_on is not None:
                self._consider(going_on)
        if event != "DELETED":
            self.suspects.owner_seen(owner, obj)
        self.controls.owner_seen(owner, None if event == "DELETED" else obj)

    def _owners_changed(self) -> None:
        self.status.changed()

    def _on_pod(self, event: str, pod: Obj, initial: bool) -> None:
        meta = pod["metadata"]
        self.pauses.pod_seen(event, pod)
        self.suspects.pod_seen(event, pod)
        uid = meta.get("uid") or meta["name"]
        try:
            rec = None if event == "DELETED" else causes.adopted_recommendation(pod)
        except MalformedRecommendationError as exc:
            self.stats["malformed"] += 1
            notice = causes.Notice.malformed(pod, exc)
            log.warning("pod %s/%s: %s", meta.get("namespace"), meta["name"], notice.message)
            self.delivery.warn(pod, notice)
            return
        if rec is None:
            self._set_adoption(uid, None)
            return
        known = self._adopted.get(uid)
        if known is not None and known.fingerprint == rec.fingerprint:
            return  # nothing new: a duplicate event
        # Marked as seen only once handled: if an API call below fails, the informer delivers
        # this event again and it must not look like a duplicate then.
        owner = self.owners.owner_of(pod)
        seen_at = None if initial else datetime.now(UTC)  # the start-up LIST's: the pod's creation
        seen = Sighted.of(owner, rec, pod, seen_at) if owner else None
        if seen is not None and initial:
            with self._lock:  # at start-up: one per (owner, fingerprint), the newest pod's
                key = (seen.owner, rec.fingerprint)
                self._batch[key] = max(self._batch.get(key, seen), seen, key=causes.by_pod_creation)
        elif seen is not None:
            self._consider(seen)
        self._set_adoption(uid, Adoption(rec.fingerprint, seen))
        self.stats["adoptions"] += 1

    def _set_adoption(self, uid: str, now: Adoption | None) -> None:
        """The pod ``uid`` runs ``now`` (None: nothing, or it is gone), not what it ran before."""
        with self._lock:
            before = self._adopted.pop(uid, None)
            if before is not None and before.seen is not None:
                pods = self._adopters[before.seen.owner]
                del pods[uid]
                if not pods:
                    del self._adopters[before.seen.owner]
            if now is not None:
                self._adopted[uid] = now
                if now.seen is not None:
                    self._adopters.setdefault(now.seen.owner, {})[uid] = now.seen

    def _flush_batch(self) -> None:
        with self._lock:
            batch, self._batch = list(self._batch.values()), {}
        for seen in batch:
            self._consider(seen)

    def _consider(self, seen: Sighted) -> None:
        obj = self.owners.get(seen.owner)
        if obj is not None:
            state, _ = read_state(obj)  # unreadable: the workflow reports and replaces it
            self.sightings.offer(seen, state, self._policy(seen.owner, obj))

    def _policy(self, owner: OwnerRef, obj: Obj) -> AnyPolicy | None:
        labels = obj["metadata"].get("labels") or {}
        with self._lock:
            return self.index.policy_of(
                WorkloadRef(owner.kind, owner.namespace, owner.name, labels)
            )

    def _told(self) -> list[AnyPolicy]:
        with self._lock:
            return self.index.told()

    def _uid(self, owner: OwnerRef) -> str | None:
        view = self.owners.get(owner)
        return None if view is None else view["metadata"].get("uid")

    def held(self, owner: OwnerRef) -> bool:
        """Whether a pause holds the owner now, as the watches show (``pauses``)."""
        return self.pauses.held(owner)
