"""Writing to the cluster: the owner's annotations and Events, each safe to repeat.

- ``OwnerWriter.patch_annotations`` computes the diff against a fresh read and applies it as one
  merge patch carrying the ``resourceVersion`` it was computed from; a 409 re-reads and
  recomputes; an empty diff writes nothing. A retried rollback is never published twice. A state
  record reads first too, and writes nothing over a newer state of its own run: a local
  activity runs again when the workflow task that ran it is lost (a worker killed or too slow
  to complete it), after later records of that task were written, and its older state written
  blind took the owner back (``failedPermanent`` to ``backingOff``: the cut re-applied; the
  soak saw it at 1,000 workloads).
- ``OwnerWriter.event`` creates an Event named after the transition (``event_body``): creating it
  again is 409 AlreadyExists, so a retry emits nothing new.
- Both retry here, up to ``WRITE_ATTEMPTS`` times, on 409 and on transient errors (429, 5xx,
  timeouts, dropped connections): cheaper than an activity retry, and safe for the two reasons
  above. What is left raises, and Temporal retries the activity (``workflows.rollback``).
  A write that acts (publishing or clearing a rollback recommendation, a record that brings a
  cut back) is its own last check: its gate (``held``) is read on the writer's own fresh read,
  before every try including the first, and the write carries that read's ``resourceVersion``,
  so a pause set on the owner after the read fails it with 409 and the next try reads and
  gates again (``HeldError``: nothing written).

Used by the activities (``activities.kubernetes``) and, for ``event_body``, by the intake.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable
from contextvars import ContextVar

from kubernetes.client import CoreV1Api, CustomObjectsApi
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from activities.errors import ConflictError
from activities.kubetime import kube_now
from activities.lookup import OwnerLookup
from activities.owners import OWNER_KINDS
from workflows.activity_api import OwnerRef
from workflows.contract import API_GROUP, Obj
from workflows.pause import Pause

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
WRITE_ATTEMPTS = 5
# True while a gated write is sent: the client does not resend it by itself after a 429's
# Retry-After (``worker.kube.UnprocessedRetry``); its writer tries again, its gate read first.
GATED_WRITE: ContextVar[bool] = ContextVar("gated_write", default=False)
TRANSIENT_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
COMPONENT = "rightsizing-rollback"


def already_exists(exc: ApiException) -> bool:
    """409 AlreadyExists on a create (not a 409 Conflict, which is worth retrying)."""
    if exc.status != 409:
        return False
    try:
        return bool(json.loads(exc.body or "{}").get("reason") == "AlreadyExists")
    except ValueError:
        return False


def transient(exc: Exception) -> bool:
    """An error after which the same request may well succeed."""
    if isinstance(exc, ApiException):
        return exc.status in TRANSIENT_STATUSES
    return isinstance(exc, (HTTPError, OSError))  # timeouts, refused or dropped connections


def pause_before_retry(what: str, exc: Exception, attempt: int) -> None:
    """Sleep briefly before another try of a safe-to-repeat write, or re-raise ``exc``."""
    if not transient(exc) or attempt + 1 >= WRITE_ATTEMPTS:
        raise exc
    log.info("%s failed (%s), retrying", what, str(exc).splitlines()[0])
    time.sleep(0.2 * 2**attempt)


def event_body(
    involved: Obj,
    identity: str,
    reason: str,
    message: str,
    event_type: str,
    component: str,
    instance: str | None = None,
) -> Obj:
    """A core/v1 Event about ``involved`` (an object reference), named after ``identity``
    (``<name>.rb-<digest>``): creating the same one again is 409 AlreadyExists."""
    now = kube_now()
    digest = hashlib.sha256(identity.encode()).hexdigest()[:12]
    body: Obj = {
        "metadata": {"name": f"{involved['name']}.rb-{digest}", "namespace": involved["namespace"]},
        "involvedObject": involved,
        "reason": reason,
        "message": message[:1024],
        "type": event_type,
        "source": {"component": component},
    }
    if instance is not None:
        body |= {"reportingComponent": f"{API_GROUP}/rollback", "reportingInstance": instance}
    return body | {"firstTimestamp": now, "lastTimestamp": now, "count": 1}


def emit_once(core: CoreV1Api, involved: Obj, body: Obj) -> bool:
    """Create the Event ``body`` (``event_body``) in ``involved``'s namespace; False when it
    exists already (its cause was told before)."""
    try:
        core.create_namespaced_event(involved["namespace"], body)  # type: ignore[arg-type]
        return True
    except ApiException as exc:
        if already_exists(exc):
            return False
        raise


def reference(obj: Obj) -> Obj:
    """An object reference to ``obj`` for an Event; a cluster-scoped object's Events go to
    the ``default`` namespace."""
    meta = obj.get("metadata") or {}
    return {
        "apiVersion": obj.get("apiVersion", "v1"),
        "kind": obj.get("kind", "Pod"),
        "name": meta["name"],
        "namespace": meta.get("namespace") or "default",
        "uid": meta.get("uid"),
    }


def owner_object(owner: OwnerRef, uid: str | None) -> Obj:
    """The owner as far as an Event about it needs it (``reference``), without reading it."""
    meta = {"name": owner.name, "namespace": owner.namespace, "uid": uid}
    return {
        "apiVersion": OWNER_KINDS[owner.kind].api_version,
        "kind": owner.kind.value,
        "metadata": meta,
    }


def remove_annotation(
    custom: CustomObjectsApi, owner: OwnerRef, key: str, value: str, acting: Callable[[], bool]
) -> tuple[bool, Obj | None]:
    """Remove the owner's annotation ``key`` if it still holds ``value`` (a JSON patch that
    tests it first), retrying transient errors while ``acting``: (whether it is done with:
    removed, or the owner gone; the owner when the annotation holds another value now)."""
    where = OWNER_KINDS[owner.kind]
    path = "/metadata/annotations/" + key.replace("~", "~0").replace("/", "~1")
    args = (where.group, where.version, owner.namespace, where.plural, owner.name)
    patch = [{"op": "test", "path": path, "value": value}, {"op": "remove", "path": path}]
    for attempt in range(WRITE_ATTEMPTS):
        if not acting():
            return False, None
        try:
            custom.patch_namespaced_custom_object(*args, patch, _content_type=JSON_PATCH)
            return True, None
        except Exception as exc:
            status = exc.status if isinstance(exc, ApiException) else None
            if status == 404:
                return True, None
            if status == 422:  # the test failed: the value changed meanwhile
                break
            if status != 409 and not transient(exc):
                log.warning("%s: removing %s failed: %s", owner, key, exc)
                return False, None
        time.sleep(0.2 * 2**attempt)  # transient: the same removal again
    else:
        log.warning("%s: removing %s kept failing; a later event retries", owner, key)
        return False, None
    current: Obj = custom.get_namespaced_custom_object(*args)  # type: ignore[assignment]
    held = (current["metadata"].get("annotations") or {}).get(key)
    return True, (current if held is not None else None)


class HeldError(Exception):
    """A retry of an acting write met a pause taken since its first try: nothing written."""

    def __init__(self, pause: Pause) -> None:
        super().__init__(f"held: {pause}")
        self.pause = pause


class OwnerWriter:
    def __init__(
        self, core: CoreV1Api, custom: CustomObjectsApi, lookup: OwnerLookup, instance: str
    ) -> None:
        self.core = core
        self.custom = custom
        self.lookup = lookup
        self.instance = instance

    def patch_annotations(
        self,
        owner: OwnerRef,
        wanted: dict[str, str | None],
        held: Callable[[Obj], Pause | None] | None = None,
        stale: Callable[[Obj], bool] | None = None,
    ) -> tuple[Obj | None, bool]:
        """Bring the owner's annotations to ``wanted`` (``None`` removes), read before each try;
        no diff, no write. Returns the owner as last read or written (None: it is gone) and
        whether it wrote. ``held`` (an acting write's gate) is read on each try's own read:
        ``HeldError`` if it holds. ``stale`` says the owner, as read, already shows something
        newer than ``wanted``: nothing is written."""
        for attempt in range(WRITE_ATTEMPTS):
            try:
                obj = self.lookup.get(owner)
                if obj is None:
                    return None, False
                if stale is not None and stale(obj):
                    return obj, False
                if held is not None and (pause := held(obj)) is not None:
                    raise HeldError(pause)
                current = obj["metadata"].get("annotations") or {}
                changes = {k: v for k, v in wanted.items() if current.get(k) != v}
                if not changes:
                    return obj, False
                version = obj["metadata"]["resourceVersion"]
                body = {"metadata": {"resourceVersion": version, "annotations": changes}}
                return self._patch(owner, body, gated=held is not None), True
            except (ApiException, HTTPError, OSError) as exc:
                status = getattr(exc, "status", None)
                if status == 404:
                    return None, False
                if status == 409:  # written meanwhile (maybe by our own timed-out try)
                    log.info("%s: conflict writing annotations, re-reading", owner)
                    continue
                pause_before_retry(f"{owner}: writing annotations", exc, attempt)
        raise ConflictError(f"{owner}: still conflicting after {WRITE_ATTEMPTS} attempts")

    def _patch(self, owner: OwnerRef, body: Obj, gated: bool) -> Obj:
        """One merge patch of the owner; ``gated``: not resent by the client (``GATED_WRITE``)."""
        kind, token = OWNER_KINDS[owner.kind], GATED_WRITE.set(gated)
        try:
            patched: Obj = self.custom.patch_namespaced_custom_object(  # type: ignore[assignment]
                kind.group,
                kind.version,
                owner.namespace,
                kind.plural,
                owner.name,
                body,
                _content_type=MERGE_PATCH,
            )
        finally:
            GATED_WRITE.reset(token)
        return patched

    def event(
        self,
        owner: OwnerRef,
        uid: str | None,
        identity: str,
        reason: str,
        message: str,
        event_type: str,
        count: int = 1,
    ) -> bool:
        """Emit the Event named after ``identity`` on the owner; False when it already exists.
        ``count`` > 1: the Event is a series; an existing one is brought to that count, its
        message and ``lastTimestamp`` (a retry sets the same count again)."""
        body = event_body(
            reference(owner_object(owner, uid)),
            identity,
            reason,
            message,
            event_type,
            COMPONENT,
            self.instance,
        )
        attempt = 0
        while True:  # until created, found, or pause_before_retry re-raises
            try:
                self.core.create_namespaced_event(owner.namespace, body)  # type: ignore[arg-type]
                return True
            except (ApiException, HTTPError, OSError) as exc:
                if isinstance(exc, ApiException) and already_exists(exc):
                    if count > 1:
                        series = {"count": count, "message": body["message"]}
                        series["lastTimestamp"] = kube_now()
                        self.core.patch_namespaced_event(
                            body["metadata"]["name"], owner.namespace, series
                        )
                        return True
                    return False  # this transition's Event exists: a retry
                pause_before_retry(f"{owner}: creating Event {reason}", exc, attempt)
            attempt += 1
