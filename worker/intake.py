"""The intake controller: turns cluster changes into rollback workflows.

It watches pods (all namespaces), both policy kinds (into a ``PolicyIndex``), namespaces, and
the workload kinds (``worker.workloads``: owners and their labels and state from a watch cache,
not a GET per pod). When a pod *newly adopts* a recommendation (it carries it and its actual
resources equal it, where before it did not), the intake resolves the pod's owner and policy and
signal-with-starts the owner's workflow (``observe``). The workflow decides what that means:
join the current window, supersede it with a new fingerprint, reopen a succeeded turn for a
newer pod, or start the next turn after ``backedOff``.

- No policy matches: retained. No workflow, no annotation.
- A sighting that the owner's stored state says would not wake it (``workflows.wake``, the rule
  the workflow itself applies: a settled fingerprint with no newer pod, a cancel, a permanent
  failure) signals nothing, so a restart or a relist does not wake every workload.
- Duplicate events (a pod updated without a change in what it adopted) signal nothing.
- One signal per (owner, fingerprint, stored state): the other pods of a rollout adopting the
  same recommendation signal nothing more, nor do they while the attempt they woke is running.
- A turn that ends ``backedOff`` goes on when its pods adopt the recommendation again; pods that
  never left it (nothing recreated them before the re-apply) are taken as adopting it when the
  owner's state turns ``backedOff``.
- Signals are sent off the watch thread, at most ``MAX_CONCURRENT_SIGNALS`` at once; an owner has
  at most one undelivered sighting (the newest), retried until Temporal accepts it.
- At start-up and after a relist, what the LIST shows is batched per (owner, fingerprint).
- A malformed recommendation annotation gets a Warning Event on the pod and a log line.
- The control annotation on an owner (``rightsizing.kubex.ai/rollback-control: cancel|reopen``)
  becomes the signal ``rollbackctl`` sends, then is removed; a control that would change nothing
  gets a ``RollbackControlRejected`` Event saying why (docs/concepts/status-and-control.md,
  "Control from kubectl").
- Each policy's ``status`` is kept by ``worker.status`` from these same watches.
- A pause annotation (``rightsizing.kubex.ai/pause-until``, ``workflows.pause``) that goes or
  changes on a namespace, an owner or a pod signals ``resume`` to the runs it may hold (owners
  with an active state there), so a held verdict or rollback looks again within seconds. A pause
  that went between two leaders' terms, when no watch saw it go, is found at the next term's
  start: the runs Temporal shows held (``RollbackHeld``) that no pause holds any more are resumed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes.client import CoreV1Api, CustomObjectsApi
from kubernetes.client.exceptions import ApiException
from temporalio.client import Client
from temporalio.common import MetricMeter

from activities.cohort import actual_resources
from activities.errors import first_line
from activities.kubetime import parse_kube_time
from activities.lookup import read_state
from activities.owners import OWNER_KINDS
from activities.writes import already_exists, event_body, transient
from worker import temporal as control
from worker.informer import Informer
from worker.status import StatusWriter
from worker.temporal import observe
from worker.workloads import WorkloadCache
from workflows.activity_api import OwnerRef
from workflows.contract import (
    API_GROUP,
    API_VERSION,
    CONTROL_ANNOTATION,
    GROUP_VERSION,
    PAUSE_REASON_ANNOTATION,
    PAUSE_UNTIL_ANNOTATION,
    Control,
    EventReason,
    Mode,
    Obj,
)
from workflows.fingerprint import (
    MalformedRecommendationError,
    Recommendation,
    is_recommendation_key,
    recommendations_from_annotations,
)
from workflows.pause import effective_pause
from workflows.policy import POLICY_KINDS
from workflows.selection import PROTECTED, PolicyIndex, Protection, WorkloadRef
from workflows.state import OwnerState, PolicyRef
from workflows.wake import LastAttempt, Sighting, Trigger, Wake, wake

log = logging.getLogger(__name__)


MAX_CONCURRENT_SIGNALS = 32  # signal-with-starts in flight at once (a burst queues, bounded)
SIGNAL_BACKOFF_BASE = 0.5  # seconds, doubling per failure up to the cap; never given up
SIGNAL_BACKOFF_CAP = 30.0
SIGNAL_TIMEOUT = 10.0  # seconds one signal may take before it counts as failed, at the most
CONTROL_REASON = f"requested with the annotation {CONTROL_ANNOTATION}"
JSON_PATCH = "application/json-patch+json"
REMOVE_ATTEMPTS = 5  # removals of a control annotation after a transient failure


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
    # The turn and policy of the attempt it opens, once decided: set with the run's start.
    turn: int | None = None
    policy: PolicyRef | None = None


@dataclass(frozen=True)
class Adoption:
    """What a pod runs: the fingerprint, and its sighting if its owner was known."""

    fingerprint: str
    seen: Observation | None


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
    ) -> None:
        self.core, self.custom = core, custom
        # The leader's fence (``LeaderElector.time_left``: the seconds it holds from now),
        # checked right before every write and signal, and the deadline of every signal, so none
        # lands after the term (the intake's Temporal client retries nothing by itself: a retry
        # is this intake's, fenced again); and this intake's own end. An Intake serves one
        # leadership term: once stopped it never acts again, whatever its threads were doing
        # (docs/concepts/intake.md, "Intake").
        self._fence = fence
        self._stopping = threading.Event()
        self.temporal, self.task_queue, self.loop = temporal, task_queue, loop
        # Every run this intake starts or signals is its own cluster's (``rollback_id``): in a
        # fleet on one Temporal, it never wakes another cluster's run.
        self.cluster = cluster
        self.owners = WorkloadCache(
            core, custom, self._on_owner, self._bad_object, on_change=self._owners_changed
        )
        self.status = StatusWriter(
            custom,
            self.owners.views,
            meter=meter,
            fence=self.acting,
            protection=protection,
            held=self.held,
            prometheus=prometheus,
        )
        self.index = PolicyIndex(protection)
        self.stats: Counter[str] = Counter()
        self._adopted: dict[str, Adoption] = {}  # pod uid -> what it runs, while it does
        # owner -> its pods' adoptions (uid -> sighting): a turn that ends backedOff on pods
        # that never left the recommendation goes on from these (``_backed_off``).
        self._adopters: dict[OwnerRef, dict[str, Observation]] = {}
        self._batch: dict[tuple[OwnerRef, str], Observation] = {}
        # What was last signalled per owner: (fingerprint, the stored state's transition time).
        self._signalled: dict[OwnerRef, tuple[str, datetime | None]] = {}
        self._sending: asyncio.Semaphore | None = None  # made on the loop, in _deliver
        self._lock = threading.RLock()
        self._informers: list[Informer] = []
        self.started = threading.Event()
        self._undelivered: dict[OwnerRef, Observation] = {}  # not yet accepted by Temporal
        self._delivering: set[OwnerRef] = set()
        self._controlling: set[OwnerRef] = set()  # control annotations being carried out
        # Controls carried out whose annotation is not yet seen removed: not carried out twice.
        self._carried_out: dict[OwnerRef, str] = {}
        self._policies_handled: dict[tuple[str, str | None, str], tuple[Any, ...]] = {}
        # Pause annotations as last seen, of the objects that carry one (bounded by them).
        self._pauses: dict[tuple[str, str, str], dict[str, str]] = {}
        self._paused_pods: dict[OwnerRef, set[str]] = {}  # owner -> its pods that carry one
        self.pending: set[Future[None]] = set()
        self._bad_objects = meter.create_counter(
            "rollback_bad_objects", "objects the intake could not handle and skipped, by kind"
        )

    # --- lifecycle ------------------------------------------------------------------------------

    @property
    def fresh(self) -> bool:
        """Never started nor stopped: it can serve a term."""
        return not self._stopping.is_set() and not self._informers

    def acting(self) -> bool:
        """Whether this intake may write or signal now: not stopped, and still the leader."""
        return not self._stopping.is_set() and self._fence() > 0

    def _rpc_timeout(self) -> timedelta:
        """A signal's deadline: ``SIGNAL_TIMEOUT``, or less, so that it ends within the term."""
        return timedelta(seconds=max(0.001, min(SIGNAL_TIMEOUT, self._fence())))

    def _launch(self, informer: Informer) -> bool:
        """Start ``informer`` unless this intake was stopped meanwhile (a start racing a lost
        Lease must not bring up what ``stop`` has already taken down)."""
        with self._lock:
            if self._stopping.is_set():
                return False
            self._informers.append(informer.start())
            return True

    def start(self) -> None:
        """Sync policies and namespaces first, so pods are resolved against a full index.
        Returns early, starting nothing more, once ``stop`` has been called."""
        policies = [
            Informer(
                "rollbackpolicies",
                self._list_policies("rollbackpolicies"),
                self._on_policy,
                on_bad_object=self._bad_object,
                type_meta=(GROUP_VERSION, "RollbackPolicy"),
            ),
            Informer(
                "clusterrollbackpolicies",
                self._list_policies("clusterrollbackpolicies"),
                self._on_policy,
                on_bad_object=self._bad_object,
                type_meta=(GROUP_VERSION, "ClusterRollbackPolicy"),
            ),
            Informer(
                "namespaces",
                self.core.list_namespace,
                self._on_namespace,
                on_bad_object=self._bad_object,
                type_meta=("v1", "Namespace"),
            ),
        ]
        policies += self.owners.informers()
        for informer in policies:
            if not self._launch(informer):
                return
        for informer in policies:
            informer.synced.wait(30)
        with self._lock:
            if self._stopping.is_set():
                return
            self.status.start()
        pods = Informer(
            "pods",
            self.core.list_pod_for_all_namespaces,
            self._on_pod,
            on_synced=self._flush_batch,
            on_bad_object=self._bad_object,
            project=_pod_key,
            type_meta=("v1", "Pod"),
        )
        if not self._launch(pods):
            return
        pods.synced.wait(60)
        if self._stopping.is_set():
            return
        self.started.set()
        log.info(
            "intake started: %d policies indexed, %d pods known", len(self.index), len(pods.cache)
        )
        self._spawn(self._resume_lifted())

    def problems(self, stuck_after: float) -> list[str]:
        """Why the running intake is not healthy: a dead informer thread, or one failing without
        a break for ``stuck_after`` seconds (0: failing at all, or not synced yet)."""
        found = []
        for informer in self._informers:
            if not informer.alive():
                found.append(f"{informer.name} informer stopped")
            elif not informer.synced.is_set() and stuck_after == 0:
                found.append(f"{informer.name} informer not synced")
            elif informer.failing_since is not None and informer.failing_for() >= stuck_after:
                found.append(f"{informer.name} informer failing for {informer.failing_for():.0f}s")
        return found

    def stop(self) -> None:
        """End this intake's term: no write or signal from now on (pending ones are cancelled
        and the rest check ``acting``), then the watches and the status writer stop."""
        with self._lock:
            self._stopping.set()
            informers, self._informers = self._informers, []
        self.started.clear()
        for future in list(self.pending):
            future.cancel()
        self.status.stop()
        for informer in informers:
            informer.stop()
        log.info("intake stopped")

    def _list_policies(self, plural: str) -> Callable[..., Any]:
        def call(**kwargs: Any) -> Any:
            return self.custom.list_cluster_custom_object(API_GROUP, API_VERSION, plural, **kwargs)

        return call

    # --- handlers -------------------------------------------------------------------------------

    def _on_policy(self, kind: str, obj: Obj, initial: bool) -> None:
        meta = obj["metadata"]
        key = (obj.get("kind", ""), meta.get("namespace"), meta["name"])
        # Spec and annotations as last handled: an update of the status alone (ours) changes
        # neither, and is not validated or reported again.
        handled = (meta.get("uid"), meta.get("generation"), meta.get("annotations"))
        with self._lock:
            if kind == "DELETED":
                self.index.remove(obj.get("kind", ""), meta.get("namespace"), meta["name"])
                self._policies_handled.pop(key, None)
                self.status.policy_gone(obj)
                return
            if self._policies_handled.get(key) == handled:
                self.status.status_seen(obj)
                return
            self._policies_handled[key] = handled
            try:
                policy = POLICY_KINDS[obj.get("kind", "")].model_validate(obj)
                self.index.upsert(policy)
            except Exception as exc:  # KeyError, ValidationError, or worse: this policy only
                self.index.remove(obj.get("kind", ""), meta.get("namespace"), meta["name"])
                invalid = exc
            else:
                self.status.policy_seen(obj, policy)
                return
        self.status.policy_seen(obj, None, first_line(invalid))
        log.warning("ignoring invalid %s %s: %s", obj.get("kind"), meta.get("name"), invalid)
        self.stats["invalid_policies"] += 1
        self._warn(
            obj,
            f"{meta.get('uid')}/{meta.get('generation')}/invalid",
            EventReason.POLICY_INVALID,
            f"policy ignored, it matches no workload until fixed: {first_line(invalid)}",
        )

    def _on_namespace(self, kind: str, obj: Obj, initial: bool) -> None:
        name = obj["metadata"]["name"]
        if kind == "DELETED":
            with self._lock:
                self.index.forget_namespace(name)
        if self._pause_lifted(("Namespace", "", name), kind, obj):
            self._resume(
                [o for o, view in self.owners.views() if o.namespace == name and _active(view)]
            )

    # --- pauses -------------------------------------------------------------------------------

    def _pause_lifted(self, key: tuple[str, str, str], kind: str, obj: Obj) -> bool:
        """Whether ``obj``'s pause went or changed since last seen (a held run looks again)."""
        annotations = obj["metadata"].get("annotations") or {}
        now = None
        if kind != "DELETED" and PAUSE_UNTIL_ANNOTATION in annotations:
            now = {
                k: annotations[k]
                for k in (PAUSE_UNTIL_ANNOTATION, PAUSE_REASON_ANNOTATION)
                if k in annotations
            }
        with self._lock:
            before = self._pauses.pop(key, None) if now is None else self._pauses.get(key)
            if now is not None:
                self._pauses[key] = now
        if before != now:
            self.status.changed()  # the policies' WorkloadsPaused condition
        return before is not None and before != now

    def held(self, owner: OwnerRef) -> bool:
        """Whether a pause holds the owner now, as the watches show: on a pod of it, on it, or
        on its namespace (``workflows.pause``; its other pods, which carry none, inherit)."""
        with self._lock:
            mine = self._pauses.get((owner.kind.value, owner.namespace, owner.name))
            namespace = self._pauses.get(("Namespace", "", owner.namespace))
            pods: list[tuple[str, Mapping[str, str] | None]] = [
                (name, self._pauses.get(("Pod", owner.namespace, name)))
                for name in self._paused_pods.get(owner, ())
            ]
        pause = effective_pause(
            [*pods, ("the others", None)],
            (str(owner), mine),
            (owner.namespace, namespace),
            datetime.now(UTC),
        )
        return pause is not None

    def _track_paused_pod(self, owner: OwnerRef, pod: str, paused: bool) -> None:
        with self._lock:
            pods = self._paused_pods.setdefault(owner, set())
            if paused:
                pods.add(pod)
            else:
                pods.discard(pod)
                if not pods:
                    del self._paused_pods[owner]

    def _resume(self, owners: list[OwnerRef]) -> None:
        if owners:
            self._spawn(self._send_resumes(owners))

    async def _send_resumes(self, owners: list[OwnerRef]) -> None:
        """``resume`` to each owner's run; one that fails is left to the run's own look again
        (``workflows.machine.PAUSE_RECHECK``)."""
        for owner in owners:
            if not self.acting():
                return
            try:
                await control.resume(self.temporal, self.cluster, owner, self._rpc_timeout())
                self.stats["resumes"] += 1
            except Exception as exc:  # RPC errors of every kind: the run looks again itself
                log.warning("%s: resume not sent (%s); the run looks again by itself", owner, exc)

    async def _resume_lifted(self) -> None:
        """Resume the runs held by a pause that the watches, just synced, no longer show: it
        went while no intake led (one visibility query a term)."""
        try:
            held = await control.held_runs(self.temporal, self.cluster)
        except Exception as exc:  # RPC errors of every kind: each run looks again by itself
            log.warning("held runs not listed (%s); each looks again by itself", exc)
            return
        await self._send_resumes([owner for owner in held if not self.held(owner)])

    def _on_pod(self, kind: str, pod: Obj, initial: bool) -> None:
        meta = pod["metadata"]
        key = ("Pod", meta.get("namespace") or "", meta["name"])
        paused = PAUSE_UNTIL_ANNOTATION in (meta.get("annotations") or {})
        if paused or key in self._pauses:
            owner = self.owners.owner_of(pod)
            if owner is not None:
                self._track_paused_pod(owner, meta["name"], paused and kind != "DELETED")
            view = self.owners.get(owner) if owner is not None else None
            if self._pause_lifted(key, kind, pod) and view is not None and _active(view):
                assert owner is not None
                self._resume([owner])
        uid = pod["metadata"].get("uid") or pod["metadata"]["name"]
        if kind == "DELETED":
            self._set_adoption(uid, None)
            return
        try:
            rec = adopted_recommendation(pod)
        except MalformedRecommendationError as exc:
            self._malformed(pod, exc)
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
        seen = Observation(owner, rec, pod["metadata"]["name"], _created(pod)) if owner else None
        if seen is not None:
            if initial:
                self._batch_observation(seen)
            else:
                self._consider(seen)
        self._set_adoption(uid, Adoption(rec.fingerprint, seen))
        self.stats["adoptions"] += 1

    def _set_adoption(self, uid: str, now: Adoption | None) -> None:
        """The pod ``uid`` runs ``now`` (None: nothing adopted, or it is gone) instead of what it
        ran before."""
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

    def _batch_observation(self, seen: Observation) -> None:
        """At start-up: one observation per (owner, fingerprint), the newest pod's."""
        with self._lock:
            key = (seen.owner, seen.recommendation.fingerprint)
            known = self._batch.get(key)
            if known is None or _by_pod_creation(seen) > _by_pod_creation(known):
                self._batch[key] = seen

    def _flush_batch(self) -> None:
        with self._lock:
            batch, self._batch = list(self._batch.values()), {}
        for seen in batch:
            self._consider(seen)

    # --- decisions ------------------------------------------------------------------------------

    def _info(self, owner: OwnerRef) -> tuple[dict[str, str], OwnerState | None] | None:
        """Owner labels (for the policy) and stored state, from the watch cache; None if gone."""
        obj = self.owners.get(owner)
        if obj is None:
            return None
        state, _ = read_state(obj)  # unreadable: the workflow reports and replaces it
        return obj["metadata"].get("labels") or {}, state

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
        # The workflow's own rule (workflows.wake): what it would ignore is not signalled.
        verdict = wake(
            LastAttempt.stored(state),
            Sighting(fingerprint, Trigger.OBSERVE, seen.pod_created_at),
            policy.spec.enable_monitoring_reopen,
        )
        if not verdict.wakes:
            self.stats["already_settled"] += 1
            log.debug("%s: %s not signalled: %s", owner, fingerprint, verdict.reason)
            return
        basis = (fingerprint, state.last_transition_time if state else None)
        with self._lock:
            last = self._signalled.get(owner)
            if (
                last is not None
                and last[0] == fingerprint
                and (verdict.wake is Wake.RESUME or last == basis)
            ):
                # Already told, on the same grounds (or the attempt it woke is running).
                self.stats["deduplicated"] += 1
                return
            self._signalled[owner] = basis
            # The newest sighting wins: it says the most.
            self._undelivered[owner] = dataclasses.replace(
                seen,
                turn=verdict.turn(state.turn if state else None),
                policy=PolicyRef.of(policy),
            )
            self.stats["signals"] += 1
            log.info("%s: pod %s adopted %s, signalling", owner, seen.pod, fingerprint)
            if owner in self._delivering:
                return
            self._delivering.add(owner)
        self._spawn(self._deliver(owner))

    def _owners_changed(self) -> None:
        self.status.changed()

    def _on_owner(self, kind: str, owner: OwnerRef, obj: Obj) -> None:
        key = (owner.kind.value, owner.namespace, owner.name)
        if self._pause_lifted(key, kind, obj) and kind != "DELETED" and _active(obj):
            self._resume([owner])
        if kind != "DELETED":
            self._backed_off(owner, obj)
        value = (obj["metadata"].get("annotations") or {}).get(CONTROL_ANNOTATION)
        with self._lock:
            if kind == "DELETED":  # what was signalled for it no longer matters
                self._signalled.pop(owner, None)
                self._controlling.discard(owner)
                self._carried_out.pop(owner, None)
                return
            if value is None:
                # The control is carried out once its removal shows in the watch: events older
                # than the removal (the watch delivers them in order) still hold it.
                self._controlling.discard(owner)
                self._carried_out.pop(owner, None)
                return
            if owner in self._controlling:
                return
            self._controlling.add(owner)
        self._spawn(self._control(owner, value, obj))

    def _backed_off(self, owner: OwnerRef, obj: Obj) -> None:
        """A turn that ended ``backedOff`` goes on when a pod adopts its recommendation again;
        pods that never left it (the rollback not yet applied to them when the re-apply cleared
        it) adopt nothing new, so their newest sighting is considered now. ``_consider``
        signals it once per stored state."""
        if owner not in self._adopters:  # most owner events: read no state
            return
        state, _ = read_state(obj)
        if state is None or state.mode is not Mode.BACKED_OFF:
            return
        fingerprint = state.active_recommendation_fingerprint
        with self._lock:
            running = [
                seen
                for seen in self._adopters.get(owner, {}).values()
                if seen.recommendation.fingerprint == fingerprint
            ]
        if running:
            self._consider(max(running, key=_by_pod_creation))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        if not self.acting():
            work.close()  # never started: a deposed or stopped intake sends nothing
            return
        future = asyncio.run_coroutine_threadsafe(work, self.loop)
        self.pending.add(future)
        future.add_done_callback(self.pending.discard)

    async def _control(self, owner: OwnerRef, value: str, obj: Obj) -> None:
        """Carry out a control annotation once: an Update the workflow answers (retried while
        Temporal or the workers are unreachable), say on the owner when it changed nothing (the
        workflow's reason), then remove the annotation."""
        refusal, cleared, newer = None, False, None
        with self._lock:  # carried out already, only its removal failed: not carried out twice
            done = self._carried_out.get(owner) == value
        try:
            if not done:
                answered, refusal = await self._send_control(owner, value, obj)
                if not answered:
                    return  # deposed: the next leader carries it out (the annotation stays)
                self.stats["controls"] += 1
                with self._lock:
                    self._carried_out[owner] = value
                if refusal is not None:
                    log.info("%s: control %s changed nothing: %s", owner, value, refusal)
                    await asyncio.to_thread(self._control_rejected, obj, value, refusal)
                else:
                    log.info("%s: control %s taken", owner, value)
            if not self.acting():
                return
            cleared, newer = await asyncio.to_thread(self._clear_control, owner, value)
        except Exception as exc:  # an Event or the removal failed: a later event tries again
            log.warning("%s: control %s not completed: %s", owner, value, exc)
        finally:
            if not cleared:  # still annotated: a later event tries again
                with self._lock:
                    self._controlling.discard(owner)
        if newer is not None:  # set to another value meanwhile: carried out next
            newer_value = newer["metadata"]["annotations"][CONTROL_ANNOTATION]
            self._spawn(self._control(owner, newer_value, newer))

    async def _send_control(self, owner: OwnerRef, value: str, obj: Obj) -> tuple[bool, str | None]:
        """Send a control until the workflow answers (retried while Temporal or the workers are
        unreachable): (answered, its refusal or None); not answered when this intake stopped
        leading first."""
        # One request however often it is retried: the workflow answers a repeated ID once.
        request = f"{value}@{obj['metadata'].get('resourceVersion', '')}"
        failures = 0
        while self.acting():
            try:
                if value == Control.CANCEL:
                    await control.cancel(
                        self.temporal,
                        self.cluster,
                        owner,
                        CONTROL_REASON,
                        self._rpc_timeout(),
                        self.acting,
                        request,
                    )
                elif value == Control.REOPEN:
                    await control.reopen(
                        self.temporal,
                        self.cluster,
                        self.task_queue,
                        owner,
                        self._rpc_timeout(),
                        self.acting,
                        request,
                    )
                else:
                    known = ", ".join(c.value for c in Control)
                    return True, f"unknown value {value!r} (expected one of: {known})"
                return True, None
            except control.ControlRefusedError as exc:
                return True, str(exc)
            except control.FencedError:
                return False, None  # deposed right before the send
            except Exception as exc:  # Temporal unreachable or failing: the annotation stays
                failures += 1
                delay = min(SIGNAL_BACKOFF_CAP, SIGNAL_BACKOFF_BASE * 2 ** min(failures, 16))
                log.warning("%s: control %s failed (%s), retrying", owner, value, exc)
                await asyncio.sleep(delay)
        return False, None

    def _control_rejected(self, obj: Obj, value: str, refusal: str) -> None:
        meta = obj["metadata"]
        self._warn(
            obj,
            f"{meta.get('uid')}/{meta.get('resourceVersion')}/control",
            EventReason.CONTROL_REJECTED,
            f"{CONTROL_ANNOTATION}: {value} changed nothing: {refusal}",
        )

    def _clear_control(self, owner: OwnerRef, value: str) -> tuple[bool, Obj | None]:
        """Remove the annotation if it still holds ``value``: (whether this control is done
        with, the owner when it holds another value now, to be carried out next)."""
        where = OWNER_KINDS[owner.kind]
        path = "/metadata/annotations/" + CONTROL_ANNOTATION.replace("~", "~0").replace("/", "~1")
        args = (where.group, where.version, owner.namespace, where.plural, owner.name)
        for attempt in range(REMOVE_ATTEMPTS):
            if not self.acting():
                return False, None
            try:
                self.custom.patch_namespaced_custom_object(
                    *args,
                    [{"op": "test", "path": path, "value": value}, {"op": "remove", "path": path}],
                    _content_type=JSON_PATCH,
                )
                return True, None
            except Exception as exc:
                status = exc.status if isinstance(exc, ApiException) else None
                if status == 404:
                    return True, None
                if status == 422:  # the test failed: the value changed meanwhile
                    break
                if status != 409 and not transient(exc):
                    log.warning("%s: removing %s failed: %s", owner, CONTROL_ANNOTATION, exc)
                    return False, None
            time.sleep(0.2 * 2**attempt)  # transient: the same removal again
        else:
            log.warning("%s: removing %s kept failing; a later event retries", owner, value)
            return False, None
        current: Obj = self.custom.get_namespaced_custom_object(*args)  # type: ignore[assignment]
        held = (current["metadata"].get("annotations") or {}).get(CONTROL_ANNOTATION)
        return True, (current if held is not None else None)

    async def _deliver(self, owner: OwnerRef) -> None:
        """Signal-with-start the owner's newest undelivered sighting until Temporal accepts it,
        retrying with capped backoff for as long as it takes: an adoption is never dropped,
        and memory stays bounded (one sighting per owner)."""
        failures = 0
        while True:
            with self._lock:
                seen = self._undelivered.get(owner)
                if seen is None or not self.acting():
                    self._delivering.discard(owner)
                    return  # a deposed leader drops it: the next one relists and sees it too
            if self._sending is None:
                self._sending = asyncio.Semaphore(MAX_CONCURRENT_SIGNALS)
            try:
                async with self._sending:
                    if not self.acting():  # fenced while waiting for a slot
                        continue
                    await observe(
                        self.temporal,
                        self.cluster,
                        self.task_queue,
                        seen.owner,
                        seen.recommendation,
                        pod=seen.pod,
                        pod_created_at=seen.pod_created_at,
                        rpc_timeout=self._rpc_timeout(),
                        turn=seen.turn,
                        policy=seen.policy,
                    )
            except Exception as exc:  # RPC errors of every kind: retried alike
                failures += 1
                self.stats["signal_retries"] += 1
                delay = min(SIGNAL_BACKOFF_CAP, SIGNAL_BACKOFF_BASE * 2 ** min(failures, 16))
                log.warning(
                    "%s: signal-with-start failed (%s), retrying in %.1fs", owner, exc, delay
                )
                await asyncio.sleep(delay)
                continue
            failures = 0
            self.stats["delivered"] += 1
            with self._lock:
                if self._undelivered.get(owner) is seen:
                    del self._undelivered[owner]

    def _malformed(self, pod: Obj, exc: Exception) -> None:
        meta = pod["metadata"]
        self.stats["malformed"] += 1
        log.warning(
            "pod %s/%s: malformed recommendation: %s", meta.get("namespace"), meta["name"], exc
        )
        self._warn(
            pod,
            f"{meta.get('uid')}{exc}",
            EventReason.ATTEMPT_ABORTED,
            f"malformed recommendation annotation, not monitored: {exc}",
        )

    def _bad_object(self, obj: Obj, exc: Exception) -> None:
        """What an informer could not handle (a bug met on this object): counted, reported on
        the object itself, skipped. The informer already logged it with its traceback."""
        self.stats["bad_objects"] += 1
        self._bad_objects.add(1, {"kind": str(obj.get("kind", "unknown"))})
        meta = obj.get("metadata") or {}
        self._warn(
            obj,
            f"{meta.get('uid')}/{meta.get('resourceVersion')}/unhandled",
            EventReason.OBJECT_SKIPPED,
            f"the rollback intake could not handle this object and skipped it: {first_line(exc)}",
        )

    def _warn(self, obj: Obj, identity: str, reason: EventReason, message: str) -> None:
        """A Warning Event on ``obj`` (named after ``identity``: emitted once per cause)."""
        if not self.acting():
            return
        meta = obj["metadata"]
        namespace = meta.get("namespace") or "default"  # cluster-scoped objects: default
        event = event_body(
            {
                "apiVersion": obj.get("apiVersion", "v1"),
                "kind": obj.get("kind", "Pod"),
                "name": meta["name"],
                "namespace": namespace,
                "uid": meta.get("uid"),
            },
            identity,
            reason.value,
            message,
            "Warning",
            "rightsizing-rollback-intake",
        )
        try:
            self.core.create_namespaced_event(namespace, event)  # type: ignore[arg-type]
        except ApiException as err:
            if not already_exists(err):
                raise  # transient: the informer retries the event


def _by_pod_creation(seen: Observation) -> datetime:
    """What orders sightings by their pod's creation, newest last (an unknown one oldest)."""
    return seen.pod_created_at or datetime.min.replace(tzinfo=UTC)


def _active(owner: Obj) -> bool:
    """Whether the owner's stored state is in an active mode (a run may be held)."""
    state, _ = read_state(owner)
    return state is not None and not state.mode.terminal


def _pod_key(pod: Obj) -> Obj:
    """All the pods informer keeps of a pod: enough to report its deletion after a relist."""
    meta = pod["metadata"]
    return {"metadata": {k: meta.get(k) for k in ("name", "namespace", "uid")}}
