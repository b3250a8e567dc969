"""Delivery: what the intake decided, carried to Temporal and answered on the cluster.

Sightings (signal-with-start ``observe``, per owner the newest, retried until accepted),
controls (an Update the workflow answers; a refusal as an Event; the annotation then removed),
resumes, and Warning Events (``causes.Notice``). Every send is fenced (``acting``: still the
leader, not stopped) and given a deadline within the term (``rpc_timeout``), so none lands
after it; the Temporal client retries nothing by itself (the package's docstring says more).
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

from activities.writes import emit_once, event_body, reference, remove_annotation
from worker import temporal
from worker.intake.causes import (
    ControlAction,
    Notice,
    Sighted,
    Signalled,
    adoption,
    control_change,
    unknown_control,
)
from workflows.activity_api import OwnerRef
from workflows.contract import CONTROL_ANNOTATION, Control, Obj
from workflows.policy import AnyPolicy
from workflows.state import OwnerState

log = logging.getLogger(__name__)

MAX_CONCURRENT_SIGNALS = 32  # signal-with-starts in flight at once (a burst queues, bounded)
SIGNAL_BACKOFF_BASE = 0.5  # seconds, doubling per failure up to the cap; never given up
SIGNAL_BACKOFF_CAP = 30.0
SIGNAL_TIMEOUT = 10.0  # seconds one signal may take before it counts as failed, at the most
CONTROL_REASON = f"requested with the annotation {CONTROL_ANNOTATION}"


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
    ) -> None:
        # Every run it starts or signals is its own cluster's (``rollback_id``): in a fleet on
        # one Temporal, it never wakes another cluster's run.
        self.client, self.cluster, self.task_queue, self.loop = client, cluster, task_queue, loop
        self.core, self.custom = kube
        self.acting, self._fence, self.stats = acting, fence, stats
        self.pending: set[Future[None]] = set()
        self._lock = threading.Lock()
        self.undelivered: dict[OwnerRef, Sighted] = {}  # the newest per owner, until accepted
        self._signalled: dict[OwnerRef, Signalled] = {}  # one signal per owner, basis and all
        self._delivering: set[OwnerRef] = set()
        self._sending: asyncio.Semaphore | None = None  # made on the loop, in _deliver
        self._controlling: set[OwnerRef] = set()  # control annotations being carried out
        # Controls carried out whose annotation is not yet seen removed: not carried out twice.
        self._carried_out: dict[OwnerRef, str] = {}

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
            if verdict.signal is None or verdict.basis is None:
                return
            self._signalled[owner] = verdict.basis
            self.undelivered[owner] = verdict.signal
            log.info("%s: pod %s adopted %s, signalling", owner, seen.pod, verdict.basis[0])
            if owner in self._delivering:
                return
            self._delivering.add(owner)
        self.spawn(self._deliver(owner))

    async def _deliver(self, owner: OwnerRef) -> None:
        failures = 0
        while True:
            with self._lock:
                seen = self.undelivered.get(owner)
                if seen is None or not self.acting():
                    self._delivering.discard(owner)
                    return  # a deposed leader drops it: the next one relists and sees it too
            if self._sending is None:
                self._sending = asyncio.Semaphore(MAX_CONCURRENT_SIGNALS)
            try:
                async with self._sending:
                    if not self.acting():  # fenced while waiting for a slot
                        continue
                    await temporal.observe(
                        self.client, self.cluster, self.task_queue, seen.owner,
                        seen.recommendation, pod=seen.pod, pod_created_at=seen.pod_created_at,
                        rpc_timeout=self.rpc_timeout(), turn=seen.turn, policy=seen.policy,
                    )  # fmt: skip
            except Exception as exc:  # RPC errors of every kind: retried alike
                failures += 1
                self.stats["signal_retries"] += 1
                delay = backoff(failures)
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

    # --- controls ----------------------------------------------------------------------------

    def owner_seen(self, owner: OwnerRef, obj: Obj | None) -> None:
        """An owner's event (``obj`` None: the owner went): its control annotation carried out
        once, until its removal shows (``causes.control_change``)."""
        annotations = {} if obj is None else obj["metadata"].get("annotations") or {}
        value = annotations.get(CONTROL_ANNOTATION)
        with self._lock:
            event = "DELETED" if obj is None else "MODIFIED"
            action = control_change(event, value, owner in self._controlling)
            if action is ControlAction.BUSY:
                return
            if action is ControlAction.FORGET:  # what was signalled for it no longer matters
                self._signalled.pop(owner, None)
            if action is not ControlAction.CARRY_OUT:
                self._controlling.discard(owner)
                self._carried_out.pop(owner, None)
                return
            self._controlling.add(owner)
        assert obj is not None and value is not None
        self.spawn(self._control(owner, value, obj))

    async def _control(self, owner: OwnerRef, value: str, obj: Obj) -> None:
        """Carry out a control annotation once: the Update, an Event when it changed nothing
        (the workflow's reason), then the annotation's removal."""
        cleared, newer = False, None
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
                    notice = Notice.control_refused(obj, value, refusal)
                    await asyncio.to_thread(self.warn, obj, notice)
                else:
                    log.info("%s: control %s taken", owner, value)
            if self.acting():
                cleared, newer = await asyncio.to_thread(
                    remove_annotation, self.custom, owner, CONTROL_ANNOTATION, value, self.acting
                )
        except Exception as exc:  # an Event or the removal failed: a later event tries again
            log.warning("%s: control %s not completed: %s", owner, value, exc)
        finally:
            if not cleared:  # still annotated: a later event tries again
                with self._lock:
                    self._controlling.discard(owner)
        if newer is not None:  # set to another value meanwhile: carried out next
            self.spawn(
                self._control(owner, newer["metadata"]["annotations"][CONTROL_ANNOTATION], newer)
            )

    async def _send_control(self, owner: OwnerRef, value: str, obj: Obj) -> tuple[bool, str | None]:
        """(answered, the workflow's refusal or None); not answered when this intake stopped
        leading first."""
        unknown = unknown_control(value)
        if unknown is not None:
            return True, unknown
        # One request however often it is retried: the workflow answers a repeated ID once.
        request = f"{value}@{obj['metadata'].get('resourceVersion', '')}"
        failures = 0
        while self.acting():
            try:
                if value == Control.CANCEL:
                    await temporal.cancel(
                        self.client, self.cluster, owner, CONTROL_REASON, self.rpc_timeout(),
                        self.acting, request,
                    )  # fmt: skip
                else:
                    await temporal.reopen(
                        self.client, self.cluster, self.task_queue, owner, self.rpc_timeout(),
                        self.acting, request,
                    )  # fmt: skip
                return True, None
            except temporal.ControlRefusedError as exc:
                return True, str(exc)
            except temporal.FencedError:
                return False, None  # deposed right before the send
            except Exception as exc:  # Temporal unreachable or failing: the annotation stays
                failures += 1
                log.warning("%s: control %s failed (%s), retrying", owner, value, exc)
                await asyncio.sleep(backoff(failures))
        return False, None

    # --- Events ------------------------------------------------------------------------------

    def warn(self, obj: Obj, notice: Notice) -> None:
        """``notice`` as a Warning Event on ``obj``; an error is the informer's to retry."""
        if self.acting():
            involved = reference(obj)
            emit_once(self.core, involved, event_body(
                involved, notice.identity, notice.reason.value, notice.message, "Warning",
                "rightsizing-rollback-intake",
            ))  # fmt: skip
