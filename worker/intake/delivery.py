"""Delivery: what the intake decided, carried to Temporal and answered on the cluster.

Sightings (signal-with-start ``observe``, per owner the newest, retried until accepted, paced by
the Temporal budget when one is set: ``budget``), controls (an Update the workflow answers; a
refusal as an Event; the annotation then removed), resumes, and Warning Events
(``causes.Notice``). Every send is fenced (``acting``: still the leader, not stopped) and given
a deadline within the term (``rpc_timeout``), so none lands after it; the Temporal client
retries nothing by itself (the package's docstring says more).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import Counter
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from datetime import timedelta
from typing import Any

from kubernetes.client import CoreV1Api, CustomObjectsApi
from temporalio.client import Client
from temporalio.common import MetricMeter

from activities.writes import emit_once, event_body, reference
from worker import temporal
from worker.intake.budget import ATTEMPT_ACTIONS, Budget
from worker.intake.causes import (
    Notice,
    Sighted,
    Signalled,
    adoption,
)
from workflows.activity_api import OwnerRef
from workflows.contract import Obj
from workflows.policy import AnyPolicy
from workflows.state import OwnerState

log = logging.getLogger(__name__)

MAX_CONCURRENT_SIGNALS = 32  # signal-with-starts in flight at once (a burst queues, bounded)
SIGNAL_BACKOFF_BASE = 0.5  # seconds, doubling per failure up to the cap; never given up
SIGNAL_BACKOFF_CAP = 30.0
SIGNAL_TIMEOUT = 10.0  # seconds one signal may take before it counts as failed, at the most
SUSPECT_DEBOUNCE = 1.0  # seconds between two suspect signals to one owner, at least


def backoff(failures: int) -> float:
    return float(min(SIGNAL_BACKOFF_CAP, SIGNAL_BACKOFF_BASE * 2 ** min(failures, 16)))


class Delivery:
    """The intake's sends, on its event loop; owns what is in flight."""

    def __init__(
        self,
        client: Client,
        cluster: str,
        task_queue: str,
        loop: asyncio.AbstractEventLoop,
        kube: tuple[CoreV1Api, CustomObjectsApi],
        acting: Callable[[], bool],
        fence: Callable[[], float],
        stats: Counter[str],
        meter: MetricMeter,
        budget: Budget | None = None,
    ) -> None:
        # Every run it starts or signals is its own cluster's (``rollback_id``): in a fleet on
        # one Temporal, it never wakes another cluster's run.
        self.client, self.cluster, self.task_queue, self.loop = client, cluster, task_queue, loop
        self.core, self.custom = kube
        self.acting, self._fence, self.stats = acting, fence, stats
        self.budget = budget or Budget(None)
        self.on_waiting: Callable[[], None] = lambda: None  # the sightings waiting changed
        self.pending: set[Future[None]] = set()
        self._lock = threading.Lock()
        self.undelivered: dict[OwnerRef, Sighted] = {}  # the newest per owner, until accepted
        self._signalled: dict[OwnerRef, Signalled] = {}  # one signal per owner, basis and all
        self._retained: dict[OwnerRef, str] = {}  # the fingerprint last logged as retained
        self._delivering: set[OwnerRef] = set()
        self._retrying: set[OwnerRef] = set()  # undelivered whose last send failed
        self._sending: asyncio.Semaphore | None = None  # made on the loop, in _deliver
        self._failing: set[str] = set()  # pods failing for certain, by uid (``suspect``)
        self._suspecting: set[OwnerRef] = set()  # a suspect sent within its debounce
        self._suspect_again: set[OwnerRef] = set()  # another pod failed meanwhile
        self._bad_objects = meter.create_counter(
            "rollback_bad_objects", "objects the intake could not handle and skipped, by kind"
        )
        self._waiting_gauge = meter.create_gauge(
            "rollback_intake_waiting_sightings",
            "adoptions accepted and not yet delivered to Temporal, by what they wait for: budget"
            " (their turn under the Temporal budget, or a send slot), temporal (a failed send,"
            " retried with backoff)",
        )
        self._budget_wait = meter.create_histogram_timedelta(
            "rollback_intake_budget_wait", "how long each sighting waited for its budget turn"
        )

    def rpc_timeout(self) -> timedelta:
        """A send's deadline: ``SIGNAL_TIMEOUT``, or less, so that it ends within the term."""
        return timedelta(seconds=max(0.001, min(SIGNAL_TIMEOUT, self._fence())))

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        if not self.acting():
            work.close()  # never started: a deposed or stopped intake sends nothing
            return
        future = asyncio.run_coroutine_threadsafe(work, self.loop)
        self.pending.add(future)
        future.add_done_callback(self.pending.discard)

    def cancel(self) -> None:
        for future in list(self.pending):
            future.cancel()

    # --- sightings ---------------------------------------------------------------------------

    def offer(self, seen: Sighted, state: OwnerState | None, policy: AnyPolicy | None) -> None:
        """Deliver ``seen`` if ``causes.adoption`` says so, given what was signalled last for
        its owner; it replaces the owner's undelivered sighting: the newest says most."""
        owner = seen.owner
        with self._lock:
            verdict = adoption(seen, state, policy, self._signalled.get(owner))
            self.stats[verdict.why] += 1
            fingerprint = seen.recommendation.fingerprint
            if verdict.why == "retained" and self._retained.get(owner) != fingerprint:
                self._retained[owner] = fingerprint  # said once per recommendation, not per pod
                log.info("%s: pod %s adopted %s but no policy matches: retained, not monitored",
                         owner, seen.pod, fingerprint)  # fmt: skip
            if verdict.signal is None or verdict.basis is None:
                return
            self._signalled[owner] = verdict.basis
            self.undelivered[owner] = verdict.signal
            self._waiting_changed()
            log.info("%s: pod %s adopted %s, signalling", owner, seen.pod, verdict.basis[0])
            if owner in self._delivering:
                return
            self._delivering.add(owner)
        self.spawn(self._deliver(owner))

    async def _deliver(self, owner: OwnerRef) -> None:
        failures = 0
        while True:
            with self._lock:
                if owner not in self.undelivered or not self.acting():
                    self._delivering.discard(owner)
                    return  # a deposed leader drops it: the next one relists and sees it too
            if self._sending is None:
                self._sending = asyncio.Semaphore(MAX_CONCURRENT_SIGNALS)
            try:
                async with self._sending:
                    # Reserved in a send slot, so at most that many reservations are ahead.
                    waited = await self.budget.spend(ATTEMPT_ACTIONS)
                    if waited:
                        self._budget_wait.record(timedelta(seconds=waited))
                    with self._lock:
                        seen = self.undelivered[owner]  # the newest, after the wait
                    if not self.acting():  # fenced while waiting for a slot or the budget
                        continue
                    await temporal.observe(
                        self.client, self.cluster, self.task_queue, seen.owner,
                        seen.recommendation, pod=seen.pod, pod_created_at=seen.pod_created_at,
                        rpc_timeout=self.rpc_timeout(), turn=seen.turn, policy=seen.policy,
                    )  # fmt: skip
            except Exception as exc:  # RPC errors of every kind, ResourceExhausted too: retried
                failures += 1
                self.stats["signal_retries"] += 1
                delay = backoff(failures)
                with self._lock:
                    self._retrying.add(owner)
                    self._waiting_changed()
                log.warning(
                    "%s: signal-with-start failed (%s), retrying in %.1fs", owner, exc, delay
                )
                await asyncio.sleep(delay)
                continue
            failures = 0
            self.stats["delivered"] += 1
            with self._lock:
                if self.undelivered.get(owner) is seen:
                    del self.undelivered[owner]
                self._retrying.discard(owner)
                self._waiting_changed()

    def _waiting_changed(self) -> None:
        """The gauge of what waits, and the status writer told (under ``_lock``)."""
        retrying = len(self._retrying)
        self._waiting_gauge.set(len(self.undelivered) - retrying, {"waiting_for": "budget"})
        self._waiting_gauge.set(retrying, {"waiting_for": "temporal"})
        self.on_waiting()

    def waiting(self) -> dict[str, list[str]]:
        """The owners whose adoption waits to be delivered, by the policy that opens it."""
        found: dict[str, list[str]] = {}
        with self._lock:
            for owner, seen in self.undelivered.items():
                if seen.policy is not None:
                    found.setdefault(str(seen.policy.ref), []).append(str(owner))
        return found

    # --- resumes -----------------------------------------------------------------------------

    def resume(self, owners: list[OwnerRef]) -> None:
        if owners:
            self.spawn(self._send_resumes(owners))

    async def _send_resumes(self, owners: list[OwnerRef]) -> None:
        """``resume`` to each owner's run; one that fails is left to the run's own look again
        (``workflows.machine.PAUSE_RECHECK``)."""
        for owner in owners:
            if not self.acting():
                return
            self.budget.charge(1)  # a resume never waits for the budget (nor a suspect)
            try:
                await temporal.resume(self.client, self.cluster, owner, self.rpc_timeout())
                self.stats["resumes"] += 1
            except Exception as exc:  # RPC errors of every kind: the run looks again itself
                log.warning("%s: resume not sent (%s); the run looks again by itself", owner, exc)

    async def resume_lifted(self, held: Callable[[OwnerRef], bool]) -> None:
        """Resume the runs Temporal shows held that no pause holds now: it went while no intake
        led (one visibility query a term)."""
        try:
            listed = await temporal.held_runs(self.client, self.cluster)
        except Exception as exc:  # RPC errors of every kind: each run looks again by itself
            log.warning("held runs not listed (%s); each looks again by itself", exc)
            return
        await self._send_resumes([owner for owner in listed if not held(owner)])

    # --- the early verdict ---------------------------------------------------------------------

    def suspect(self, owner: OwnerRef | None, pod: Obj, failing: bool) -> None:
        """A pod's certain failure as each of its events shows it (``causes.suspect``): its
        owner's run is told as the pod starts failing; at most once per owner a
        ``SUSPECT_DEBOUNCE``, a failure meanwhile told at the end of it."""
        uid = pod["metadata"].get("uid") or pod["metadata"]["name"]
        if not failing and uid not in self._failing:
            return  # the common case, a pod not failing before or now: no lock taken
        with self._lock:
            was = uid in self._failing
            (self._failing.add if failing else self._failing.discard)(uid)
            if owner is None or not failing or was:
                return
            if owner in self._suspecting:
                self._suspect_again.add(owner)
                return
            self._suspecting.add(owner)
        self.spawn(self._suspect(owner, pod["metadata"]["name"]))

    async def _suspect(self, owner: OwnerRef, pod: str) -> None:
        try:
            while self.acting():
                self.budget.charge(1)
                try:
                    await temporal.suspect(
                        self.client, self.cluster, owner, pod, self.rpc_timeout()
                    )
                    self.stats["suspects"] += 1
                except Exception as exc:  # RPC errors of every kind: the window's end decides
                    log.warning("%s: suspect not sent (%s)", owner, exc)
                await asyncio.sleep(SUSPECT_DEBOUNCE)
                with self._lock:
                    if owner not in self._suspect_again:
                        return
                    self._suspect_again.discard(owner)
        finally:
            with self._lock:
                self._suspecting.discard(owner)

    def forget(self, owner: OwnerRef) -> None:
        """The owner went: what was signalled for it no longer matters."""
        with self._lock:
            self._signalled.pop(owner, None)

    # --- Events ------------------------------------------------------------------------------

    def bad_object(self, obj: Obj, exc: Exception) -> None:
        """What an informer could not handle (a bug met on this object): counted, reported on
        the object itself, skipped. The informer already logged it with its traceback."""
        self.stats["bad_objects"] += 1
        self._bad_objects.add(1, {"kind": str(obj.get("kind", "unknown"))})
        self.warn(obj, Notice.skipped(obj, exc))

    def warn(self, obj: Obj, notice: Notice) -> None:
        """``notice`` as a Warning Event on ``obj``; an error is the informer's to retry."""
        if self.acting():
            involved = reference(obj)
            emit_once(self.core, involved, event_body(
                involved, notice.identity, notice.reason.value, notice.message, "Warning",
                "rightsizing-rollback-intake",
            ))  # fmt: skip
