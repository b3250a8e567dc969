"""The storm breaker's side in the intake (the rule: ``workflows.breaker``).

Every verdict an owner's state annotation shows is counted once. When the breaker trips, the
intake writes it on the engine's namespace (``rightsizing.kubex.ai/storm-breaker``: the time,
and why), which the worker's gate reads before every write that brings a cut back; tells each
policy (a Warning Event ``RollbackStormBreakerTripped``), the receivers (a critical
notification naming the verdict that tripped it) and Prometheus
(``rollback_storm_breaker_tripped``). An operator resets it by removing the annotation
(``rollbackctl breaker reset`` also records when, so the verdicts before are not counted again
by this intake or the next leader).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

from temporalio.common import MetricMeter

from activities.lookup import read_state
from activities.writes import MERGE_PATCH
from worker.intake.causes import Notice
from worker.intake.delivery import Delivery
from workflows.activity_api import OwnerRef, rollback_id
from workflows.breaker import StormBreaker, Verdicts
from workflows.contract import (
    GROUP_VERSION,
    ROLLBACK_STATE_ANNOTATION,
    STORM_BREAKER_ANNOTATION,
    STORM_BREAKER_REASON_ANNOTATION,
    STORM_BREAKER_RESET_ANNOTATION,
    EventReason,
    Mode,
    Obj,
)
from workflows.notify import NOTIFY_WORKFLOW, Notification, Severity
from workflows.policy import AnyPolicy
from workflows.state import OwnerState

log = logging.getLogger(__name__)
VERDICT_MARKS = tuple(f'"{mode.value}"' for mode in (Mode.ROLLING_BACK, Mode.MONITORING_SUCCEEDED))
RESET_HINT = "kubectl rollback breaker reset"
TRIPPED = "storm breaker tripped"  # how its Events and its notification begin


class Breaker:
    """Counts the verdicts and trips the breaker, only while this intake leads."""

    def __init__(
        self,
        delivery: Delivery,
        spec: StormBreaker | None,
        engine: str,
        policies: Callable[[], Iterable[AnyPolicy]],
        meter: MetricMeter,
    ) -> None:
        self.d, self.engine, self.policies = delivery, engine, policies
        self.verdicts = Verdicts(spec) if spec is not None else None
        self.tripped = False
        self._known = False  # the engine's namespace seen: whether it is tripped already is known
        self._last: tuple[OwnerRef, OwnerState] | None = None  # the newest verdict, for its story
        self._lock = threading.Lock()
        self._gauge = meter.create_gauge(
            "rollback_storm_breaker_tripped",
            "1 while the storm breaker stops re-applies cluster-wide (reset it to go on)",
        )

    def namespace_seen(self, annotations: dict[str, str] | None) -> None:
        """The engine's namespace as its watch shows it: tripped or not, reset since when. The
        first time, the verdicts counted meanwhile (the owners' first LIST) may trip it."""
        annotations = annotations or {}
        tripped = STORM_BREAKER_ANNOTATION in annotations
        reset = _time(annotations.get(STORM_BREAKER_RESET_ANNOTATION))
        with self._lock:
            was, self.tripped, self._known = self.tripped, tripped, True
            if self.verdicts is not None and ((was and not tripped) or reset is not None):
                since = reset or datetime.now(UTC)
                if self.verdicts.since is None or since > self.verdicts.since:
                    self.verdicts.reset(since)
        self._gauge.set(1 if tripped else 0)
        if was and not tripped:
            log.warning("storm breaker reset: re-applies go on")
        self._judge()

    def owner_seen(self, owner: OwnerRef, obj: Obj) -> None:
        """An owner's event: its verdict counted (most events carry none: read nothing)."""
        raw = (obj["metadata"].get("annotations") or {}).get(ROLLBACK_STATE_ANNOTATION) or ""
        if self.verdicts is None or not any(mark in raw for mark in VERDICT_MARKS):
            return
        state, _ = read_state(obj)
        if state is None:
            return
        with self._lock:
            self.verdicts.record(str(owner), state)
            self._last = (owner, state)
        self._judge()

    def _judge(self) -> None:
        """Trip it if the verdicts say so, once it is known not to be tripped already."""
        with self._lock:
            if self.verdicts is None or self.tripped or not self._known or self._last is None:
                return
            why = self.verdicts.trips(datetime.now(UTC))
            if why is None or not self.d.acting():
                return
            self.tripped = True  # written once; the namespace's watch confirms it
            owner, state = self._last
        self._trip(why, owner, state)

    def _trip(self, why: str, owner: OwnerRef, state: OwnerState) -> None:
        now = datetime.now(UTC).replace(microsecond=0)
        at = now.strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {"metadata": {"annotations": {
            STORM_BREAKER_ANNOTATION: at, STORM_BREAKER_REASON_ANNOTATION: why}}}  # fmt: skip
        try:
            self.d.core.patch_namespace(self.engine, body, _content_type=MERGE_PATCH)
        except Exception as exc:  # API errors of every kind: the next verdict trips it again
            log.error("storm breaker tripped (%s) but not written on namespace %s: %s",
                      why, self.engine, exc)  # fmt: skip
            with self._lock:
                self.tripped = False
            return
        self._gauge.set(1)
        message = f"{TRIPPED}: {why}; re-applies stop cluster-wide until it is reset ({RESET_HINT})"
        log.error("%s (last: %s)", message, owner)
        notice = Notice(f"breaker/{at}", _TRIPPED, message)
        self.d.spawn(self._tell([_involved(p) for p in self.policies()], notice))
        self.d.spawn(self._notify(owner, state, message, now))

    async def _tell(self, policies: list[Obj], notice: Notice) -> None:
        """The Warning Event on each policy, each on its own: one that fails is tried again
        (the Event is the same, by its identity) while this intake leads, ``TELL_TRIES`` times
        at most. Before, one failed Event ended the telling of every policy: the trip, written
        once, does not come back through the informer that saw it."""
        for attempt in range(TELL_TRIES):
            failed: list[Obj] = []
            for policy in policies:
                try:
                    await asyncio.to_thread(self.d.warn, policy, notice)
                except Exception as exc:  # API errors of every kind: tried again
                    failed.append(policy)
                    log.warning("storm breaker not told on %s (%s)", policy["metadata"], exc)
            if not failed or not self.d.acting():
                return
            policies = failed
            await asyncio.sleep(2**attempt)

    async def _notify(self, owner: OwnerRef, state: OwnerState, message: str, at: datetime) -> None:
        """A critical notification, through the worker's receivers (its NotifyWorkflow),
        naming the verdict that tripped the breaker."""
        d = self.d
        key = hashlib.sha256(f"{d.cluster}/storm-breaker/{at.isoformat()}".encode()).hexdigest()
        notification = Notification(
            key=key[:32], severity=Severity.CRITICAL, transition=state.mode, cluster=d.cluster,
            owner=owner, policy=state.policy, turn=state.turn,
            fingerprint=state.active_recommendation_fingerprint, reason=state.failure_reason,
            message=message, time=at, workflow_id=rollback_id(d.cluster, owner), run_id="",
        )  # fmt: skip
        try:
            await d.client.start_workflow(
                NOTIFY_WORKFLOW, notification, id=f"notify/{d.cluster}/storm-breaker/{key[:12]}",
                task_queue=d.task_queue, rpc_timeout=d.rpc_timeout(),
            )  # fmt: skip
        except Exception as exc:  # RPC errors of every kind: the Events and the metric say it
            log.warning("storm breaker notification not started (%s)", exc)


_TRIPPED = EventReason.STORM_BREAKER_TRIPPED
TELL_TRIES = 5  # a policy's Event, tried over about 15 s


def _involved(policy: AnyPolicy) -> Obj:
    meta: dict[str, Any] = {"name": policy.metadata.name, "uid": policy.metadata.uid}
    if policy.metadata.namespace:
        meta["namespace"] = policy.metadata.namespace
    return {"apiVersion": GROUP_VERSION, "kind": policy.kind, "metadata": meta}


def _time(value: str | None) -> datetime | None:
    try:
        return datetime.fromisoformat(value) if value else None
    except ValueError:
        return None
