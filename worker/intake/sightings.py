"""Sightings: each owner's newest adoption, carried to Temporal as a signal-with-start.

What ``causes.adoption`` says to signal is kept per owner, the newest (it says most), until
Temporal accepts it: at most ``MAX_CONCURRENT_SIGNALS`` in flight, each waiting for its turn
under the Temporal budget (``budget``), a failed send (ResourceExhausted too) retried with
backoff and never given up, and nothing sent while the engine's kill switch has automation
disabled (``workflows.pause.automation_off``): what arrives meanwhile is withheld and sent when
it is enabled again. What waits, and for what, is a gauge and each policy's ``AttemptsWaiting``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from datetime import timedelta

from temporalio.common import MetricMeter

from activities.writes import owner_object
from worker import temporal
from worker.intake.budget import ATTEMPT_ACTIONS
from worker.intake.causes import Notice, Sighted, Signalled, adoption
from worker.intake.delivery import MAX_CONCURRENT_SIGNALS, Delivery, backoff
from workflows.activity_api import OwnerRef
from workflows.pause import Pause
from workflows.policy import AnyPolicy
from workflows.state import OwnerState

log = logging.getLogger(__name__)


class Sightings:
    """Per owner, the adoption to deliver; sent through ``Delivery`` (its fence, its loop)."""

    def __init__(
        self, delivery: Delivery, meter: MetricMeter, uid_of: Callable[[OwnerRef], str | None]
    ) -> None:
        self.d, self.uid_of = delivery, uid_of  # uid_of: an owner's, for the Events on it
        self.stopped: Pause | None = None  # the kill switch, as the watch last showed it
        self.on_waiting: Callable[[], None] = lambda: None  # what waits changed
        self._lock = threading.Lock()
        self.undelivered: dict[OwnerRef, Sighted] = {}  # the newest per owner, until accepted
        self._signalled: dict[OwnerRef, Signalled] = {}  # one signal per owner, basis and all
        self._retained: dict[OwnerRef, str] = {}  # the fingerprint last logged as retained
        self._delivering: set[OwnerRef] = set()
        self._retrying: set[OwnerRef] = set()  # undelivered whose last send failed
        self._withheld: set[OwnerRef] = set()  # undelivered while automation is disabled
        self._sending: asyncio.Semaphore | None = None  # made on the loop, in _deliver
        self._waiting_gauge = meter.create_gauge(
            "rollback_intake_waiting_sightings",
            "adoptions accepted and not yet delivered to Temporal, by what they wait for: budget"
            " (their turn under the Temporal budget, or a send slot), temporal (a failed send,"
            " retried with backoff), automation (disabled by the kill switch)",
        )
        self._budget_wait = meter.create_histogram_timedelta(
            "rollback_intake_budget_wait", "how long each sighting waited for its budget turn"
        )

    def offer(self, seen: Sighted, state: OwnerState | None, policy: AnyPolicy | None) -> None:
        """Deliver ``seen`` if ``causes.adoption`` says so, given what was signalled last for
        its owner; it replaces the owner's undelivered sighting: the newest says most."""
        owner = seen.owner
        with self._lock:
            verdict = adoption(seen, state, policy, self._signalled.get(owner))
            self.d.stats[verdict.why] += 1
            fingerprint = seen.recommendation.fingerprint
            if verdict.why == "retained" and self._retained.get(owner) != fingerprint:
                self._retained[owner] = fingerprint  # said once per recommendation, not per pod
                log.info("%s: pod %s adopted %s but no policy matches: retained, not monitored",
                         owner, seen.pod, fingerprint)  # fmt: skip
            if verdict.signal is None or verdict.basis is None:
                return
            self._signalled[owner] = verdict.basis
            before = self.undelivered.get(owner)
            if before is not None and before.recommendation.fingerprint == fingerprint:
                # the same cut: adopted when first seen (a baseline ends before that)
                times = [t for t in (before.adopted_at, verdict.signal.adopted_at) if t]
                verdict.signal.adopted_at = min(times, default=None)
            self.undelivered[owner] = verdict.signal
            self._waiting_changed()
            log.info("%s: pod %s adopted %s, signalling", owner, seen.pod, verdict.basis[0])
            delivering = owner in self._delivering
            withheld = not delivering and self._withhold(owner)
            if not delivering and not withheld:
                self._delivering.add(owner)
        if withheld:
            self._tell_withheld(owner)  # not under the lock: an API call
        elif not delivering:
            self.d.spawn(self._deliver(owner))

    def _withhold(self, owner: OwnerRef) -> bool:
        """While automation is disabled, an owner's sighting is kept, not sent (under ``_lock``)."""
        if self.stopped is None:
            return False
        self._withheld.add(owner)
        self._retrying.discard(owner)
        self._waiting_changed()
        return True

    def _tell_withheld(self, owner: OwnerRef) -> None:
        """A Warning Event on the owner: its adoption waits for automation (once per
        recommendation)."""
        seen, off = self.undelivered.get(owner), self.stopped
        if seen is None or off is None:
            return
        self.d.warn(owner_object(owner, self.uid_of(owner)), Notice.withheld(seen, off))

    def switch(self, off: Pause | None) -> bool:
        """The kill switch as the watch shows it now; whether automation was enabled again,
        the sightings withheld meanwhile then sent."""
        with self._lock:
            was, self.stopped = self.stopped, off
            released = [] if off is not None else list(self._withheld - self._delivering)
            if off is None:
                self._withheld.clear()
                self._delivering.update(released)
                self._waiting_changed()
        if (was is None) != (off is None):
            log.warning("automation %s", "enabled again" if off is None else off.describe())
        for owner in released:
            self.d.spawn(self._deliver(owner))
        return was is not None and off is None

    async def _deliver(self, owner: OwnerRef) -> None:
        failures, d = 0, self.d
        while True:
            with self._lock:
                withheld = owner in self.undelivered and d.acting() and self._withhold(owner)
                done = owner not in self.undelivered or not d.acting() or withheld
                if done:  # a deposed leader drops it: the next one relists and sees it too
                    self._delivering.discard(owner)
            if done:
                if withheld:
                    await asyncio.to_thread(self._tell_withheld, owner)
                return
            if self._sending is None:
                self._sending = asyncio.Semaphore(MAX_CONCURRENT_SIGNALS)
            try:
                async with self._sending:
                    # Reserved in a send slot, so at most that many reservations are ahead.
                    waited = await d.budget.spend(ATTEMPT_ACTIONS)
                    if waited:
                        self._budget_wait.record(timedelta(seconds=waited))
                    with self._lock:
                        seen = self.undelivered[owner]  # the newest, after the wait
                    if not d.acting() or self.stopped is not None:  # meanwhile: fenced, off
                        continue
                    await temporal.observe(
                        d.client, d.cluster, d.task_queue, seen.owner,
                        seen.recommendation, pod=seen.pod, pod_created_at=seen.pod_created_at,
                        adopted_at=seen.adopted_at,
                        rpc_timeout=d.rpc_timeout(), turn=seen.turn, policy=seen.policy,
                    )  # fmt: skip
            except Exception as exc:  # RPC errors of every kind, ResourceExhausted too: retried
                failures += 1
                d.stats["signal_retries"] += 1
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
            d.stats["delivered"] += 1
            with self._lock:
                if self.undelivered.get(owner) is seen:
                    del self.undelivered[owner]
                self._retrying.discard(owner)
                self._waiting_changed()

    def _waiting_changed(self) -> None:
        """The gauge of what waits, and the status writer told (under ``_lock``)."""
        retrying, withheld = len(self._retrying), len(self._withheld)
        budget = len(self.undelivered) - retrying - withheld
        self._waiting_gauge.set(budget, {"waiting_for": "budget"})
        self._waiting_gauge.set(retrying, {"waiting_for": "temporal"})
        self._waiting_gauge.set(withheld, {"waiting_for": "automation"})
        self.on_waiting()

    def waiting(self) -> dict[str, list[str]]:
        """The owners whose adoption waits to be delivered, by the policy that opens it."""
        found: dict[str, list[str]] = {}
        with self._lock:
            for owner, seen in self.undelivered.items():
                if seen.policy is not None:
                    found.setdefault(str(seen.policy.ref), []).append(str(owner))
        return found

    def forget(self, owner: OwnerRef) -> None:
        """The owner went: what was signalled for it no longer matters."""
        with self._lock:
            self._signalled.pop(owner, None)
