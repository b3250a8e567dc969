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
from collections.abc import Callable, Collection, Coroutine
from concurrent.futures import Future
from datetime import timedelta
from typing import Any

from kubernetes.client import CoreV1Api, CustomObjectsApi
from temporalio.client import Client
from temporalio.common import MetricMeter

from activities.writes import emit_once, event_body, reference
from worker import temporal
from worker.intake.budget import Budget
from worker.intake.causes import (
    Notice,
)
from workflows.activity_api import OwnerRef
from workflows.contract import Obj

log = logging.getLogger(__name__)

MAX_CONCURRENT_SIGNALS = 32  # signal-with-starts in flight at once (a burst queues, bounded)
SIGNAL_BACKOFF_BASE = 0.5  # seconds, doubling per failure up to the cap; never given up
SIGNAL_BACKOFF_CAP = 30.0
SIGNAL_TIMEOUT = 10.0  # seconds one signal may take before it counts as failed, at the most
HELD_TRIES = 7  # listings of the held runs (0.5 s doubling: about a minute, a Temporal restart)
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
        self.pending: set[Future[None]] = set()
        self._lock = threading.Lock()
        self._failing: set[str] = set()  # pods failing for certain, by uid (``suspect``)
        self._suspecting: set[OwnerRef] = set()  # a suspect sent within its debounce
        self._suspect_again: set[OwnerRef] = set()  # another pod failed meanwhile
        self._bad_objects = meter.create_counter(
            "rollback_bad_objects", "objects the intake could not handle and skipped, by kind"
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

    async def resume_held(self, sent: Collection[OwnerRef] = ()) -> None:
        """Resume every run Temporal shows held (one visibility query) but those ``sent`` one
        already: the kill switch or the breaker went, or a pause went while no intake led. Each
        looks again: one whose owner a pause still holds holds on until that pause's own end,
        the rest go on. Not only those no pause holds: a run held by the breaker whose owner's
        pause, still in force at the reset, ends by its time (no event), would wait out its
        ``PAUSE_RECHECK``."""
        for failures in range(HELD_TRIES):
            try:
                listed = await temporal.held_runs(self.client, self.cluster)
                break
            except Exception as exc:  # RPC errors of every kind (Temporal restarting): again
                log.warning("held runs not listed (%s), trying again", exc)
                await asyncio.sleep(backoff(failures))
        else:
            log.warning("held runs not listed; each looks again by itself")
            return
        await self._send_resumes([owner for owner in listed if owner not in sent])

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
