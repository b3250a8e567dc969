"""The intake controller: turns cluster changes into rollback workflows.

It watches pods (all namespaces), both policy kinds (into a ``PolicyIndex``) and namespaces.
When a pod *newly adopts* a recommendation (it carries it and its actual resources equal it,
where before it did not), the intake resolves the pod's owner and policy and signal-with-starts
the owner's workflow (``observe``). The workflow decides what that means: join the current
window, supersede it with a new fingerprint, reopen a succeeded turn for a newer pod, or start
the next turn after ``backedOff``.

- No policy matches: retained. No workflow, no annotation.
- A sighting that the owner's stored state says would not wake it (``workflows.wake``, the rule
  the workflow itself applies: a settled fingerprint with no newer pod, a cancel, a permanent
  failure) signals nothing, so a restart or a relist does not wake every workload.
- Duplicate events (a pod updated without a change in what it adopted) signal nothing.
- At start-up and after a relist, what the LIST shows is batched per (owner, fingerprint).
- A malformed recommendation annotation gets a Warning Event on the pod and a log line.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes.client import CoreV1Api, CustomObjectsApi
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError
from temporalio.client import Client

from activities.cohort import actual_resources
from activities.kubetime import parse_kube_time
from activities.lookup import OwnerLookup, read_state
from activities.writes import already_exists, event_body
from worker.informer import Informer
from worker.temporal import observe
from workflows.activity_api import OwnerRef
from workflows.contract import (
    API_GROUP,
    API_VERSION,
    EventReason,
    Obj,
)
from workflows.fingerprint import (
    MalformedRecommendationError,
    Recommendation,
    is_recommendation_key,
    recommendations_from_annotations,
)
from workflows.machine import DEFAULT_SAMPLE_INTERVAL
from workflows.policy import POLICY_KINDS
from workflows.selection import PolicyIndex, WorkloadRef
from workflows.state import OwnerState
from workflows.wake import LastAttempt, Sighting, Trigger, wake

log = logging.getLogger(__name__)


OWNER_INFO_TTL = 30.0
SIGNAL_ATTEMPTS = 10  # about two minutes of backoff


def _created(pod: Obj) -> datetime | None:
    return parse_kube_time(pod["metadata"].get("creationTimestamp"))


def adopted_recommendation(pod: Obj) -> Recommendation | None:
    """The recommendation this pod runs on, if any (raises on malformed annotations)."""
    annotations = pod["metadata"].get("annotations") or {}
    if not any(is_recommendation_key(k) for k in annotations):
        return None
    recs = recommendations_from_annotations(annotations)
    if not recs:
        return None
    requests, limits = actual_resources(pod)
    return next((r for r in recs if r.equals_resources(requests, limits)), None)


@dataclass
class Observation:
    owner: OwnerRef
    recommendation: Recommendation
    pod: str
    pod_created_at: datetime | None


class Intake:
    def __init__(
        self,
        core: CoreV1Api,
        custom: CustomObjectsApi,
        temporal: Client,
        task_queue: str,
        loop: asyncio.AbstractEventLoop,
        sample_interval: timedelta = DEFAULT_SAMPLE_INTERVAL,
    ) -> None:
        self.core, self.custom = core, custom
        self.temporal, self.task_queue, self.loop = temporal, task_queue, loop
        self.sample_interval = sample_interval
        self.owners = OwnerLookup(core, custom)  # owner_of() and its cache
        self.index = PolicyIndex()
        self.stats: Counter[str] = Counter()
        self._adopted: dict[str, str | None] = {}  # pod uid -> fingerprint it runs on
        self._batch: dict[tuple[OwnerRef, str], Observation] = {}
        self._owner_info: dict[OwnerRef, tuple[float, dict[str, str], OwnerState | None]] = {}
        self._lock = threading.RLock()
        self._informers: list[Informer] = []
        self.pending: list[Future[Any]] = []

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        """Sync policies and namespaces first, so pods are resolved against a full index."""
        policies = [
            Informer("rollbackpolicies", self._list_policies("rollbackpolicies"), self._on_policy),
            Informer(
                "clusterrollbackpolicies",
                self._list_policies("clusterrollbackpolicies"),
                self._on_policy,
            ),
            Informer("namespaces", self.core.list_namespace, self._on_namespace),
        ]
        for informer in policies:
            informer.start()
        for informer in policies:
            informer.synced.wait(30)
        pods = Informer(
            "pods", self.core.list_pod_for_all_namespaces, self._on_pod, on_synced=self._flush_batch
        )
        self._informers = [*policies, pods.start()]
        pods.synced.wait(60)
        log.info(
            "intake started: %d policies indexed, %d pods known", len(self.index), len(pods.cache)
        )

    def stop(self) -> None:
        for informer in self._informers:
            informer.stop()
        self._informers = []
        log.info("intake stopped")

    def _list_policies(self, plural: str) -> Callable[..., Any]:
        def call(**kwargs: Any) -> Any:
            return self.custom.list_cluster_custom_object(API_GROUP, API_VERSION, plural, **kwargs)

        return call

    # --- handlers -------------------------------------------------------------------------------

    def _on_policy(self, kind: str, obj: Obj, initial: bool) -> None:
        meta = obj["metadata"]
        with self._lock:
            if kind == "DELETED":
                self.index.remove(obj.get("kind", ""), meta.get("namespace"), meta["name"])
                return
            try:
                self.index.upsert(POLICY_KINDS[obj.get("kind", "")].model_validate(obj))
            except (KeyError, ValidationError) as exc:
                log.warning("ignoring invalid %s %s: %s", obj.get("kind"), meta.get("name"), exc)
                self.index.remove(obj.get("kind", ""), meta.get("namespace"), meta["name"])

    def _on_namespace(self, kind: str, obj: Obj, initial: bool) -> None:
        if kind == "DELETED":
            with self._lock:
                self.index.forget_namespace(obj["metadata"]["name"])

    def _on_pod(self, kind: str, pod: Obj, initial: bool) -> None:
        uid = pod["metadata"].get("uid") or pod["metadata"]["name"]
        if kind == "DELETED":
            self._adopted.pop(uid, None)
            return
        try:
            rec = adopted_recommendation(pod)
        except MalformedRecommendationError as exc:
            self._malformed(pod, exc)
            return
        if rec is None:
            self._adopted[uid] = None
            return
        if self._adopted.get(uid) == rec.fingerprint:
            return  # nothing new: a duplicate event
        # Marked as seen only once handled: if an API call below fails, the informer delivers
        # this event again and it must not look like a duplicate then.
        owner = self.owners.owner_of(pod)
        if owner is not None:
            seen = Observation(owner, rec, pod["metadata"]["name"], _created(pod))
            if initial:
                self._batch_observation(seen)
            else:
                self._consider(seen)
        self._adopted[uid] = rec.fingerprint
        self.stats["adoptions"] += 1

    def _batch_observation(self, seen: Observation) -> None:
        """At start-up: one observation per (owner, fingerprint), the newest pod's."""
        oldest = datetime.min.replace(tzinfo=UTC)
        with self._lock:
            key = (seen.owner, seen.recommendation.fingerprint)
            known = self._batch.get(key)
            if known is None or (seen.pod_created_at or oldest) > (known.pod_created_at or oldest):
                self._batch[key] = seen

    def _flush_batch(self) -> None:
        with self._lock:
            batch, self._batch = list(self._batch.values()), {}
        for seen in batch:
            self._consider(seen)

    # --- decisions ------------------------------------------------------------------------------

    def _info(self, owner: OwnerRef) -> tuple[dict[str, str], OwnerState | None] | None:
        """Owner labels (for the policy) and stored state, cached briefly; None if it is gone."""
        cached = self._owner_info.get(owner)
        if cached is not None and time.monotonic() - cached[0] < OWNER_INFO_TTL:
            return cached[1], cached[2]
        obj = self.owners.get(owner)
        if obj is None:
            return None
        state, _ = read_state(obj)  # unreadable: the workflow reports and replaces it
        labels = obj["metadata"].get("labels") or {}
        self._owner_info[owner] = (time.monotonic(), labels, state)
        return labels, state

    def _consider(self, seen: Observation) -> None:
        owner, fingerprint = seen.owner, seen.recommendation.fingerprint
        info = self._info(owner)
        if info is None:
            return
        labels, state = info
        with self._lock:
            policy = self.index.resolve(
                WorkloadRef(owner.kind, owner.namespace, owner.name, labels)
            ).policy
        if policy is None:
            self.stats["retained"] += 1
            return
        if state is not None:
            # The workflow's own rule (workflows.wake): what it would ignore is not signalled.
            last = LastAttempt(
                state.active_recommendation_fingerprint, state.mode, state.last_transition_time
            )
            verdict = wake(
                last,
                Sighting(fingerprint, Trigger.OBSERVE, seen.pod_created_at),
                policy.spec.enable_monitoring_reopen,
            )
            if not verdict.wakes:
                self.stats["already_settled"] += 1
                log.info("%s: %s not signalled: %s", owner, fingerprint, verdict.reason)
                return
        self._owner_info.pop(owner, None)  # the workflow is about to write a new state
        self.stats["signals"] += 1
        log.info("%s: pod %s adopted %s, signalling", owner, seen.pod, fingerprint)
        future = asyncio.run_coroutine_threadsafe(self._deliver(seen), self.loop)
        self.pending = [f for f in self.pending if not f.done()] + [future]

    async def _deliver(self, seen: Observation) -> None:
        """Signal-with-start, retried with backoff: Temporal being briefly away (a restart, a
        deploy) must not lose an adoption."""
        for attempt in range(SIGNAL_ATTEMPTS):
            try:
                await observe(
                    self.temporal,
                    self.task_queue,
                    seen.owner,
                    seen.recommendation,
                    pod=seen.pod,
                    pod_created_at=seen.pod_created_at,
                    sample_interval=self.sample_interval,
                )
                return
            except Exception as exc:  # RPC errors of every kind: retried alike
                log.warning("%s: signal-with-start failed (%s), retrying", seen.owner, exc)
                await asyncio.sleep(min(30.0, 0.5 * 2**attempt))
        self.stats["signal_errors"] += 1
        log.error("%s: signal-with-start failed %d times; dropped", seen.owner, SIGNAL_ATTEMPTS)

    def _malformed(self, pod: Obj, exc: Exception) -> None:
        meta = pod["metadata"]
        self.stats["malformed"] += 1
        log.warning(
            "pod %s/%s: malformed recommendation: %s", meta.get("namespace"), meta["name"], exc
        )
        event = event_body(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": meta["name"],
                "namespace": meta.get("namespace"),
                "uid": meta.get("uid"),
            },
            f"{meta.get('uid')}{exc}",
            EventReason.ATTEMPT_ABORTED.value,
            f"malformed recommendation annotation, not monitored: {exc}",
            "Warning",
            "rightsizing-rollback-intake",
        )
        try:
            self.core.create_namespaced_event(meta.get("namespace", "default"), event)  # type: ignore[arg-type]
        except ApiException as err:
            if not already_exists(err):
                raise  # transient: the informer retries the event
