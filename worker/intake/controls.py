"""The kubectl control annotation (``rightsizing.kubex.ai/rollback-control: cancel|reopen``),
carried out once per value: an Update the workflow answers (the one judge, retried while
Temporal or the workers are unreachable, one request ID however often it is retried), a
``RollbackControlRejected`` Event when it changed nothing, then the annotation removed if it
still holds the value (docs/concepts/status-and-control.md, "Control from kubectl")."""

from __future__ import annotations

import asyncio
import enum
import logging
import threading

from kubernetes.client import CustomObjectsApi

from activities.writes import remove_annotation
from worker import temporal
from worker.intake.causes import Notice
from worker.intake.delivery import Delivery, backoff
from worker.intake.sightings import Sightings
from workflows.activity_api import OwnerRef
from workflows.contract import CONTROL_ANNOTATION, Control, Obj

log = logging.getLogger(__name__)
CONTROL_REASON = f"requested with the annotation {CONTROL_ANNOTATION}"


class ControlAction(enum.Enum):
    FORGET = "forget"  # the owner is gone
    DONE = "done"  # no annotation (any more): a control carried out is over once seen removed
    BUSY = "busy"  # being carried out already
    CARRY_OUT = "carry out"


def control_change(event: str, value: str | None, busy: bool) -> ControlAction:
    """What an owner event asks of its control annotation ``value``. A control is carried out
    once its removal shows in the watch: events older than the removal (the watch delivers
    them in order) still hold it, and are ``BUSY``."""
    if event == "DELETED":
        return ControlAction.FORGET
    if value is None:
        return ControlAction.DONE
    return ControlAction.BUSY if busy else ControlAction.CARRY_OUT


def unknown_control(value: str) -> str | None:
    """The refusal of a value that is no control, or None."""
    if value in {c.value for c in Control}:
        return None
    known = ", ".join(c.value for c in Control)
    return f"unknown value {value!r} (expected one of: {known})"


class Controls:
    """Owns the controls being carried out; sends through ``delivery`` (fenced, deadlined)."""

    def __init__(self, delivery: Delivery, sightings: Sightings, custom: CustomObjectsApi) -> None:
        self.delivery, self.sightings, self.custom = delivery, sightings, custom
        self._lock = threading.Lock()
        self._controlling: set[OwnerRef] = set()  # control annotations being carried out
        # Controls carried out whose annotation is not yet seen removed: not carried out twice.
        self._carried_out: dict[OwnerRef, str] = {}

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
            if action is ControlAction.FORGET:
                self.sightings.forget(owner)
            if action is not ControlAction.CARRY_OUT:
                self._controlling.discard(owner)
                self._carried_out.pop(owner, None)
                return
            self._controlling.add(owner)
        assert obj is not None and value is not None
        self.delivery.spawn(self._control(owner, value, obj))

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
                self.delivery.stats["controls"] += 1
                with self._lock:
                    self._carried_out[owner] = value
                if refusal is not None:
                    log.info("%s: control %s changed nothing: %s", owner, value, refusal)
                    notice = Notice.control_refused(obj, value, refusal)
                    await asyncio.to_thread(self.delivery.warn, obj, notice)
                else:
                    log.info("%s: control %s taken", owner, value)
            if self.delivery.acting():
                cleared, newer = await asyncio.to_thread(
                    remove_annotation,
                    self.custom,
                    owner,
                    CONTROL_ANNOTATION,
                    value,
                    self.delivery.acting,
                )
        except Exception as exc:  # an Event or the removal failed: a later event tries again
            log.warning("%s: control %s not completed: %s", owner, value, exc)
        finally:
            if not cleared:  # still annotated: a later event tries again
                with self._lock:
                    self._controlling.discard(owner)
        if newer is not None:  # set to another value meanwhile: carried out next
            self.delivery.spawn(
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
        failures, d = 0, self.delivery
        while d.acting():
            d.budget.charge(1)  # an operator's control never waits for the budget; it counts
            try:
                if value == Control.CANCEL:
                    await temporal.cancel(
                        d.client, d.cluster, owner, CONTROL_REASON, d.rpc_timeout(), d.acting,
                        request,
                    )  # fmt: skip
                else:
                    await temporal.reopen(
                        d.client, d.cluster, d.task_queue, owner, d.rpc_timeout(), d.acting,
                        request,
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
