"""A small informer: LIST (in pages of ``LIST_PAGE``), then WATCH from that resourceVersion, and
keep going.

- Resumes each watch from the last resourceVersion it saw (events and BOOKMARKs advance it), so
  a dropped connection or a server-side timeout loses nothing.
- Relists on 410 Gone (the version expired): objects that vanished meanwhile are reported as
  DELETED, the rest as a resync.
- Backs off exponentially (with jitter, capped) on errors, and resets after a healthy watch.
- Objects stay plain dicts (``_preload_content=False``): no model deserialisation on the hot path.

The handler receives ``(event_type, obj, initial)``; ``initial`` is true for objects delivered by
a (re)list, so a consumer can batch what it learns at start-up instead of reacting per object.
The cache keeps ``project(obj)``, only what its reader needs (a DELETED found by a relist is
delivered as that projection); without ``project`` it keeps whole objects. ``on_change`` is
called when the cache's content changed (an object added, removed, or its projection changed):
a reader of the cache can recompute then rather than on every event.

A resource the API server does not serve (404 on the LIST: a CRD that is not installed) is
``absent``: synced and empty, not failing, and looked for again every ``ABSENT_RECHECK_SECONDS``.

No poison pills: an exception from the projection, or from the handler that is not a
transient API error, is that object's problem. It is logged with the object's identity, counted
(``bad_objects``), reported to ``on_bad_object`` (the intake emits a Warning Event), and skipped:
a relist always completes and the watch always starts, whatever one object holds. API errors are
classified (``activities.writes.transient``): a 4xx answer to a handler's own write (400, 403,
404, 409, 422, ...) will not change by asking again, so the object is skipped and reported at
once; 408, 429, 5xx and connection errors are retried a few times, then reported the same way.

A real API server's LIST items carry no ``kind``/``apiVersion``: the informer fills in those of
the resource it lists (``type_meta``), so a report names the object's real kind.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from typing import Any

from kubernetes.client.exceptions import ApiException
from kubernetes.watch import watch as _watch
from urllib3.exceptions import HTTPError

from activities.writes import transient
from worker.kube import CONNECT_TIMEOUT
from workflows.contract import Obj

log = logging.getLogger(__name__)

Handler = Callable[[str, Obj, bool], None]
BadObjectHandler = Callable[[Obj, Exception], None]
iter_resp_lines: Callable[[Any], Any] = _watch.iter_resp_lines  # untyped in the client

WATCH_TIMEOUT_SECONDS = 300
MAX_BACKOFF_SECONDS = 30.0
HANDLER_ATTEMPTS = 6
ABSENT_RECHECK_SECONDS = 60.0
LIST_PAGE = 500  # items per LIST page (client-go's default pager size)
LIST_RESTARTS = 3  # a paged LIST started over at most this often on expired tokens, then backed off


def object_key(obj: Obj) -> tuple[str, str]:
    meta = obj["metadata"]
    return meta.get("namespace") or "", meta["name"]


class Informer:
    def __init__(
        self,
        name: str,
        list_call: Callable[..., Any],
        handler: Handler,
        on_synced: Callable[[], None] | None = None,
        watch_timeout: int = WATCH_TIMEOUT_SECONDS,
        on_bad_object: BadObjectHandler | None = None,
        project: Callable[[Obj], Any] | None = None,
        on_change: Callable[[], None] | None = None,
        type_meta: tuple[str, str] | None = None,
    ) -> None:
        self.name = name
        self.type_meta = type_meta  # (apiVersion, kind) of what it lists
        self.list_call = list_call
        self.handler = handler
        self.on_synced = on_synced
        self.on_bad_object = on_bad_object
        self.bad_objects = 0
        self.failing_since: float | None = None  # monotonic time of the first failure in a row
        self.watch_timeout = watch_timeout
        self.project = project or (lambda obj: obj)
        self.on_change = on_change
        self.absent = False  # the API server does not serve this resource (yet)
        self.cache: dict[tuple[str, str], Any] = {}
        self.resource_version: str | None = None
        self.synced = threading.Event()
        self.relists = 0
        self.watches = 0
        self._stop = threading.Event()
        self._response: Any = None
        self._thread: threading.Thread | None = None

    def start(self) -> Informer:
        self._thread = threading.Thread(target=self.run, name=f"informer-{self.name}", daemon=True)
        self._thread.start()
        return self

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def failing_for(self) -> float:
        """Seconds since the first of the failures in a row (0 when it is not failing)."""
        since = self.failing_since
        return 0.0 if since is None else time.monotonic() - since

    def problem(self, stuck_after: float) -> str | None:
        """Why it is not healthy: its thread died, or it has been failing without a break for
        ``stuck_after`` seconds (0: failing at all, or not synced yet); None if it is."""
        if not self.alive():
            return f"{self.name} informer stopped"
        if not self.synced.is_set() and stuck_after == 0:
            return f"{self.name} informer not synced"
        if self.failing_since is not None and self.failing_for() >= stuck_after:
            return f"{self.name} informer failing for {self.failing_for():.0f}s"
        return None

    def stop(self) -> None:
        self._stop.set()
        response = self._response
        if response is not None:
            with suppress(Exception):  # shutdown() unblocks the read in the informer's thread
                response.shutdown()
        if self._thread is not None:
            self._thread.join(5)

    def run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                if self.resource_version is None and not self._relist():
                    self._stop.wait(ABSENT_RECHECK_SECONDS)
                    continue
                self._watch()
                failures = 0
                self.failing_since = None
            except Exception as exc:  # an informer must outlive any one failure
                if self._stop.is_set():
                    break  # stop() closed the stream under the read
                failures += 1
                if self.failing_since is None:
                    self.failing_since = time.monotonic()
                delay = min(MAX_BACKOFF_SECONDS, 0.2 * 2**failures) * random.uniform(0.5, 1.0)
                expected = isinstance(exc, (ApiException, HTTPError, OSError, ValueError))
                log.log(
                    logging.WARNING if expected else logging.ERROR,
                    "%s informer: %s; retrying in %.1fs",
                    self.name,
                    exc,
                    delay,
                    exc_info=not expected,
                )
                self._stop.wait(delay)

    def _relist(self) -> bool:
        """LIST and deliver everything; False when the resource is not served (absent)."""
        try:
            items, resource_version = self._list_pages()
        except ApiException as exc:
            if exc.status != 404:
                raise
            if not self.absent:
                log.info("%s informer: not served by the API; looking again later", self.name)
            self.absent = True
            self.failing_since = None
            self.synced.set()
            return False
        self.absent = False
        fresh: dict[tuple[str, str], Obj] = {}
        for obj in items:
            if self.type_meta is not None and isinstance(obj, dict):
                obj.setdefault("apiVersion", self.type_meta[0])
                obj.setdefault("kind", self.type_meta[1])
            try:
                fresh[object_key(obj)] = obj
            except Exception as exc:  # no name: nothing to key it by, skipped
                self._bad(obj, exc)
        for key in set(self.cache) - set(fresh):
            self._handle("DELETED", self.cache[key], True)
        for obj in fresh.values():
            self._handle("ADDED", obj, True)
        self.resource_version = resource_version
        self.relists += 1
        self.failing_since = None
        if not self.synced.is_set():
            self.synced.set()
        if self.on_synced is not None:
            self.on_synced()
        return True

    def _list_pages(self) -> tuple[list[Obj], str]:
        """Every item, ``LIST_PAGE`` at a time as client-go's pager does (one answer per page,
        not one of the whole cluster), and the resourceVersion of the snapshot they were cut
        from. A continue token the server no longer holds (410) starts the list over."""
        items: list[Obj] = []
        token: str | None = None
        restarts = 0
        while True:
            paging = {"limit": LIST_PAGE} | ({"_continue": token} if token else {})
            try:
                body = json.loads(self.list_call(_preload_content=False, **paging).data)
            except ApiException as exc:
                expired = exc.status == 410 and token is not None
                if not expired or restarts == LIST_RESTARTS or self._stop.is_set():
                    raise  # the informer's own backoff takes it from there
                log.info("%s informer: its continue token expired; listing again", self.name)
                items, token, restarts = [], None, restarts + 1
                continue
            items += body.get("items") or []
            token = (body.get("metadata") or {}).get("continue") or None
            if token is None:
                return items, body["metadata"]["resourceVersion"]

    def _handle(self, kind: str, obj: Obj, initial: bool) -> None:
        """Cache and deliver one event; a handler failing on a transient API error is retried,
        so the event is not lost (the resourceVersion has already moved past it)."""
        try:
            self._cache(kind, obj)
        except Exception as exc:  # a projection failing on this object: skip it
            self._bad(obj, exc)
            return
        for attempt in range(HANDLER_ATTEMPTS):
            try:
                self.handler(kind, obj, initial)
                return
            except Exception as exc:
                if not transient(exc):  # this object's problem only: skip it, keep going
                    self._bad(obj, exc)
                    return
                if self._stop.is_set():
                    return
                if attempt + 1 == HANDLER_ATTEMPTS:
                    gave_up = RuntimeError(f"gave up after {HANDLER_ATTEMPTS} attempts: {exc}")
                    self._bad(obj, gave_up)
                    return
                log.warning("%s informer: handling %s failed (%s), retrying", self.name, kind, exc)
                self._stop.wait(min(MAX_BACKOFF_SECONDS, 0.2 * 2**attempt))

    def _cache(self, kind: str, obj: Obj) -> None:
        key = object_key(obj)
        before = self.cache.get(key)
        if kind == "DELETED":
            self.cache.pop(key, None)
            after = None
        else:
            after = self.cache[key] = self.project(obj)
        if after != before and self.on_change is not None:
            self.on_change()

    def _bad(self, obj: Obj, exc: Exception) -> None:
        self.bad_objects += 1
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        identity = "/".join(
            str(p) for p in ((meta or {}).get("namespace"), (meta or {}).get("name")) if p
        )
        log.error(
            "%s informer: skipped %s: %s",
            self.name,
            identity or "an object",
            exc,
            exc_info=None if isinstance(exc, ApiException) or transient(exc) else exc,
        )
        if self.on_bad_object is not None:
            try:
                self.on_bad_object(obj, exc)
            except Exception as err:  # reporting must not become a poison pill of its own
                log.warning("%s informer: reporting %s failed: %s", self.name, identity, err)

    def _watch(self) -> None:
        self.watches += 1
        self._response = self.list_call(
            watch=True,
            resource_version=self.resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=self.watch_timeout,
            # A quiet watch sends nothing until the server ends it: only a longer silence is a
            # dead connection.
            _request_timeout=(CONNECT_TIMEOUT, self.watch_timeout + 30),
            _preload_content=False,
        )
        self.failing_since = None  # the watch is open: the API server answers again
        try:
            for line in iter_resp_lines(self._response):
                if self._stop.is_set():
                    return
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        log.info("%s informer: resourceVersion expired, relisting", self.name)
                        self.resource_version = None
                        return
                    raise ApiException(status=obj.get("code"), reason=obj.get("message"))
                self.resource_version = obj.get("metadata", {}).get(
                    "resourceVersion", self.resource_version
                )
                if kind == "BOOKMARK":
                    continue
                self._handle(kind, obj, False)
        finally:
            response, self._response = self._response, None
            if response is not None:
                response.release_conn()


def identity(obj: Obj) -> Obj:
    """An object's identity alone, for a cache that needs no more (``project``): enough to
    report its deletion after a relist."""
    meta = obj["metadata"]
    return {"metadata": {k: meta.get(k) for k in ("name", "namespace", "uid")}}


class Informers:
    """The informers of one term (a leader's): each started unless the term ended meanwhile (a
    start racing a lost Lease must not bring up what ``stop`` already took down), stopped
    together, and their health in a few words."""

    def __init__(self) -> None:
        self.ended = threading.Event()
        self.running: list[Informer] = []
        self._lock = threading.Lock()

    @property
    def fresh(self) -> bool:
        """Never started nor ended: it can serve a term."""
        return not self.ended.is_set() and not self.running

    def launch(self, informer: Informer) -> bool:
        """Start ``informer``; False, starting nothing, once the term ended."""
        with self._lock:
            if self.ended.is_set():
                return False
            self.running.append(informer.start())
            return True

    def end(self) -> None:
        with self._lock:
            self.ended.set()
            running, self.running = self.running, []
        for informer in running:
            informer.stop()

    def problems(self, stuck_after: float) -> list[str]:
        """Why they are not healthy (``Informer.problem``)."""
        return [p for i in self.running if (p := i.problem(stuck_after)) is not None]
