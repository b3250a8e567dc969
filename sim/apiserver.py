"""A stateful Kubernetes API emulator served over real HTTP (aiohttp, in its own thread).

What it honours, because the engine depends on it: namespaced and cluster-scoped resources of
the built-in and custom groups the engine touches; GET/LIST with label and field selectors;
POST, PUT (``resourceVersion`` preconditions, 409 on conflict), PATCH with merge,
strategic-merge and JSON patches; the ``status``, ``scale`` and ``pods/resize`` subresources;
LimitRange and ResourceQuota admission of pods (``sim.admission``); DELETE with
cascading garbage collection through ``ownerReferences``; WATCH streams with resourceVersion
resume, bookmarks, 410 Gone for an expired version and the streaming list (`sendInitialEvents`,
which `kubectl wait` uses); LISTs in pages (``limit``, ``continue``, 410 for an expired token).

For tests and benchmarks it keeps a request ``journal`` and takes injected ``faults``. Objects
are plain dicts, as the API serves them. ``store`` methods are thread-safe so a simulation (or a
test) can act on the cluster directly while clients talk HTTP to it.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
import random
import re
import socket
import threading
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from activities.kubetime import kube_now
from sim import admission, discovery
from sim.patches import PatchError, json_patch, merge_patch, strategic_merge_patch
from sim.selectors import matches, parse_field_selector, parse_label_selector
from workflows.contract import Obj


@dataclass(frozen=True)
class ResourceType:
    group: str  # "" for the core group
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    status_subresource: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


RESOURCE_TYPES = [
    ResourceType("", "v1", "pods", "Pod"),
    ResourceType("", "v1", "events", "Event", status_subresource=False),
    ResourceType("", "v1", "namespaces", "Namespace", namespaced=False),
    ResourceType("", "v1", "nodes", "Node", namespaced=False),
    ResourceType("", "v1", "configmaps", "ConfigMap", status_subresource=False),
    ResourceType("", "v1", "resourcequotas", "ResourceQuota"),
    ResourceType("", "v1", "limitranges", "LimitRange", status_subresource=False),
    ResourceType("apps", "v1", "deployments", "Deployment"),
    ResourceType("apps", "v1", "replicasets", "ReplicaSet"),
    ResourceType("apps", "v1", "statefulsets", "StatefulSet"),
    ResourceType("apps", "v1", "daemonsets", "DaemonSet"),
    ResourceType("batch", "v1", "jobs", "Job"),
    ResourceType("batch", "v1", "cronjobs", "CronJob"),
    ResourceType("coordination.k8s.io", "v1", "leases", "Lease", status_subresource=False),
    ResourceType("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget"),
    ResourceType("autoscaling", "v2", "horizontalpodautoscalers", "HorizontalPodAutoscaler"),
    ResourceType("argoproj.io", "v1alpha1", "rollouts", "Rollout"),
    ResourceType("argoproj.io", "v1alpha1", "analysisruns", "AnalysisRun"),
    ResourceType("kubeai.org", "v1", "models", "Model"),
    ResourceType("core.strimzi.io", "v1beta2", "strimzipodsets", "StrimziPodSet"),
    ResourceType(
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        namespaced=False,
    ),
    ResourceType("rightsizing.kubex.ai", "v1alpha1", "rollbackpolicies", "RollbackPolicy"),
    ResourceType(
        "rightsizing.kubex.ai",
        "v1alpha1",
        "clusterrollbackpolicies",
        "ClusterRollbackPolicy",
        namespaced=False,
    ),
]


def _patched_annotations(body: Any) -> dict[str, str | None]:
    """The annotations a merge or strategic-merge patch body sets (their values) or removes
    (None)."""
    meta = body.get("metadata") if isinstance(body, dict) else None
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    return dict(annotations) if isinstance(annotations, dict) else {}


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def body(self) -> Obj:
        body: Obj = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        return body | ({"details": self.details} if self.details else {})


Admission = Callable[[Obj], None]
"""Checks a write's resulting object before it is stored; raises ``ApiError`` to refuse it."""


@dataclass
class WatchEvent:
    rv: int
    type: str
    rtype: ResourceType
    obj: Obj


@dataclass
class Watcher:
    rtype: ResourceType
    namespace: str | None
    accept: Callable[[Obj], bool]
    queue: asyncio.Queue[WatchEvent | None]
    loop: asyncio.AbstractEventLoop


class Store:
    """The cluster's objects, with resourceVersions, a change log for watches, and GC."""

    def __init__(self, types: list[ResourceType], log_size: int = 50_000) -> None:
        self.types = {(t.group, t.plural): t for t in types}
        self.by_kind = {t.kind: t for t in types}
        self._objects: dict[ResourceType, dict[str | None, dict[str, Obj]]] = {t: {} for t in types}
        self._lock = threading.RLock()
        self._rv = itertools.count(1)
        self.resource_version = 0
        self._log: deque[WatchEvent] = deque(maxlen=log_size)
        self._watchers: list[Watcher] = []
        self.listeners: list[Callable[[str, ResourceType, Obj], None]] = []

    def rtype(self, kind_or_plural: str, group: str | None = None) -> ResourceType:
        if group is None and kind_or_plural in self.by_kind:
            return self.by_kind[kind_or_plural]
        for (g, plural), t in self.types.items():
            if plural == kind_or_plural and (group is None or g == group):
                return t
        raise ApiError(404, "NotFound", f"the server could not find the resource {kind_or_plural}")

    # --- reads --------------------------------------------------------------------------------

    def get(self, rtype: ResourceType, namespace: str | None, name: str) -> Obj:
        with self._lock:
            obj = self._objects[rtype].get(namespace if rtype.namespaced else None, {}).get(name)
            if obj is None:
                raise ApiError(404, "NotFound", f'{rtype.plural} "{name}" not found')
            return copy.deepcopy(obj)

    def list_objects(
        self,
        rtype: ResourceType,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> tuple[list[Obj], int]:
        try:
            labels = parse_label_selector(label_selector)
            fields = parse_field_selector(field_selector)
        except ValueError as exc:
            raise ApiError(400, "BadRequest", str(exc)) from exc
        with self._lock:
            buckets = self._objects[rtype]
            pools = (
                [buckets.get(namespace, {})] if namespace is not None else list(buckets.values())
            )
            items = [
                copy.deepcopy(o)
                for pool in pools
                for o in pool.values()
                if matches(labels, o["metadata"].get("labels")) and all(f(o) for f in fields)
            ]
            return items, self.resource_version

    def items(self, kind: str, namespace: str | None = None) -> Iterator[Obj]:
        """Direct (uncopied) iteration for the simulation; hold no reference past a step."""
        with self._lock:
            buckets = self._objects[self.by_kind[kind]]
            pools = (
                [buckets.get(namespace, {})] if namespace is not None else list(buckets.values())
            )
            snapshot = [o for pool in pools for o in pool.values()]
        yield from snapshot

    # --- writes -------------------------------------------------------------------------------

    def _bump(self, obj: Obj) -> None:
        self.resource_version = next(self._rv)
        obj["metadata"]["resourceVersion"] = str(self.resource_version)

    def _emit(self, kind: str, rtype: ResourceType, obj: Obj) -> None:
        event = WatchEvent(self.resource_version, kind, rtype, copy.deepcopy(obj))
        self._log.append(event)
        for watcher in list(self._watchers):
            if (
                watcher.rtype is rtype
                and (
                    watcher.namespace is None
                    or watcher.namespace == obj["metadata"].get("namespace")
                )
                and watcher.accept(obj)
            ):
                watcher.loop.call_soon_threadsafe(watcher.queue.put_nowait, event)
        for listener in self.listeners:
            listener(kind, rtype, obj)

    def create(self, obj: Obj, namespace: str | None = None, admit: Admission | None = None) -> Obj:
        rtype = self.rtype(obj.get("kind", ""))
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        ns = (namespace or meta.get("namespace") or "default") if rtype.namespaced else None
        if ns is not None:
            meta["namespace"] = ns
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise ApiError(422, "Invalid", "metadata.name: Required value")
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        obj["apiVersion"] = rtype.api_version
        discovery.default_policy(obj)
        discovery.default_workload(obj)
        if admit is not None:
            admit(obj)
        with self._lock:
            if rtype.kind == "Pod":
                self._admit_pod(obj, None)
            pool = self._objects[rtype].setdefault(ns, {})
            if meta["name"] in pool:
                raise ApiError(
                    409, "AlreadyExists", f'{rtype.plural} "{meta["name"]}" already exists'
                )
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", kube_now())
            meta["generation"] = 1
            self._bump(obj)
            pool[meta["name"]] = obj
            self._emit("ADDED", rtype, obj)
            return copy.deepcopy(obj)

    def replace(
        self,
        rtype: ResourceType,
        namespace: str | None,
        name: str,
        new: Obj,
        subresource: str | None = None,
        admit: Admission | None = None,
    ) -> Obj:
        with self._lock:
            current = (
                self._objects[rtype].get(namespace if rtype.namespaced else None, {}).get(name)
            )
            if current is None:
                raise ApiError(404, "NotFound", f'{rtype.plural} "{name}" not found')
            wanted_rv = (new.get("metadata") or {}).get("resourceVersion")
            if wanted_rv and wanted_rv != current["metadata"]["resourceVersion"]:
                raise ApiError(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {rtype.plural} "{name}": the object has'
                    " been modified; please apply your changes to the latest version and try again",
                )
            updated = self._admit(rtype, current, copy.deepcopy(new), subresource)
            if rtype.kind == "Pod" and subresource in (None, "resize"):
                self._admit_pod(updated, current)
            if subresource is None:
                discovery.default_policy(updated)
                discovery.default_workload(updated)
                if admit is not None:
                    admit(updated)
            if updated == current:
                return copy.deepcopy(current)  # no-op writes do not bump the version
            if updated.get("spec") != current.get("spec"):
                updated["metadata"]["generation"] = current["metadata"].get("generation", 1) + 1
            self._bump(updated)
            self._objects[rtype][namespace if rtype.namespaced else None][name] = updated
            self._emit("MODIFIED", rtype, updated)
            return copy.deepcopy(updated)

    def _admit_pod(self, pod: Obj, old: Obj | None) -> None:
        """LimitRanger and ResourceQuota (``sim.admission``), on every write of a pod's spec:
        by a client over HTTP and by the simulated controllers alike."""
        try:
            admission.admit_pod(pod, old, self.items, old is None)
        except admission.RefusedError as exc:
            raise ApiError(403, "Forbidden", exc.message) from exc

    def _admit(self, rtype: ResourceType, current: Obj, new: Obj, subresource: str | None) -> Obj:
        """What a write may change: the main resource, ``status``, or container resources."""
        meta = new.setdefault("metadata", {})
        for key in (
            "uid",
            "creationTimestamp",
            "namespace",
            "name",
            "resourceVersion",
            "generation",
        ):
            if key in current["metadata"]:
                meta[key] = current["metadata"][key]
        new["apiVersion"], new["kind"] = current.get("apiVersion"), current.get("kind")
        if subresource == "status":
            return {**current, "status": new.get("status", {})}
        if subresource == "resize":
            if rtype.kind != "Pod":
                raise ApiError(404, "NotFound", "resize is a subresource of pods only")
            return _resize(current, new)
        if subresource is not None:
            raise ApiError(404, "NotFound", f"unknown subresource {subresource}")
        if rtype.status_subresource:
            new["status"] = current.get("status", {})
            if "status" not in current:
                new.pop("status")
        return new

    def patch(
        self,
        rtype: ResourceType,
        namespace: str | None,
        name: str,
        body: Any,
        content_type: str,
        subresource: str | None = None,
        admit: Admission | None = None,
    ) -> Obj:
        with self._lock:
            current = self.get(rtype, namespace, name)
            try:
                if content_type.startswith("application/json-patch+json"):
                    patched = json_patch(current, body)
                elif content_type.startswith("application/strategic-merge-patch+json"):
                    if rtype.group not in ("", "apps", "batch", "coordination.k8s.io"):
                        raise ApiError(
                            415,
                            "UnsupportedMediaType",
                            "strategic merge patch is not supported for custom resources",
                        )
                    patched = strategic_merge_patch(current, body)
                elif content_type.startswith("application/merge-patch+json"):
                    patched = merge_patch(current, body)
                else:
                    raise ApiError(
                        415, "UnsupportedMediaType", f"unsupported patch type {content_type}"
                    )
            except PatchError as exc:
                raise ApiError(422, "Invalid", str(exc)) from exc
            # A patch carrying metadata.resourceVersion is a precondition, as on a real server.
            wanted = (
                body.get("metadata", {}).get("resourceVersion") if isinstance(body, dict) else None
            )
            if not wanted:
                patched.setdefault("metadata", {}).pop("resourceVersion", None)
            return self.replace(rtype, namespace, name, patched, subresource, admit)

    def delete(self, rtype: ResourceType, namespace: str | None, name: str) -> Obj:
        with self._lock:
            pool = self._objects[rtype].get(namespace if rtype.namespaced else None, {})
            obj = pool.pop(name, None)
            if obj is None:
                raise ApiError(404, "NotFound", f'{rtype.plural} "{name}" not found')
            self._bump(obj)
            self._emit("DELETED", rtype, obj)
            self._collect_garbage(obj["metadata"]["uid"])
            return copy.deepcopy(obj)

    def _collect_garbage(self, owner_uid: str) -> None:
        for rtype, buckets in self._objects.items():
            for ns, pool in list(buckets.items()):
                for name, obj in list(pool.items()):
                    refs = obj["metadata"].get("ownerReferences") or []
                    if any(r.get("uid") == owner_uid for r in refs):
                        self.delete(rtype, ns, name)

    # --- watches ------------------------------------------------------------------------------

    def watch(
        self,
        rtype: ResourceType,
        namespace: str | None,
        accept: Callable[[Obj], bool],
        since: int | None,
        loop: asyncio.AbstractEventLoop,
    ) -> tuple[Watcher, list[WatchEvent]]:
        """Register a watcher; returns it with the backlog to send first (after ``since``)."""
        with self._lock:
            queue: asyncio.Queue[WatchEvent | None] = asyncio.Queue()
            watcher = Watcher(rtype, namespace, accept, queue, loop)
            if since is None:  # no version: the current state as ADDED events
                backlog = [
                    WatchEvent(self.resource_version, "ADDED", rtype, copy.deepcopy(o))
                    for o in self.list_objects(rtype, namespace)[0]
                    if accept(o)
                ]
            else:
                oldest = self._log[0].rv if self._log else self.resource_version + 1
                if since < oldest - 1 and since < self.resource_version:
                    raise ApiError(410, "Expired", f"too old resource version: {since} ({oldest})")
                backlog = [
                    e
                    for e in self._log
                    if e.rv > since
                    and e.rtype is rtype
                    and accept(e.obj)
                    and (namespace is None or e.obj["metadata"].get("namespace") == namespace)
                ]
            self._watchers.append(watcher)
            return watcher, backlog

    def unwatch(self, watcher: Watcher) -> None:
        with self._lock:
            if watcher in self._watchers:
                self._watchers.remove(watcher)

    def watching(self, kind: str) -> int:
        """How many watch streams are open on ``kind``."""
        with self._lock:
            return sum(1 for w in self._watchers if w.rtype.kind == kind)

    def drop_watches(self) -> None:
        """End every open watch stream, as an API server restart or a load balancer would."""
        with self._lock:
            watchers, self._watchers = self._watchers, []
        for w in watchers:
            w.loop.call_soon_threadsafe(w.queue.put_nowait, None)


def _resize(current: Obj, new: Obj) -> Obj:
    """``pods/resize``: only container resources (and resize policies) may change."""
    updated = copy.deepcopy(current)
    wanted = {c["name"]: c for c in new.get("spec", {}).get("containers", [])}
    for container in updated.get("spec", {}).get("containers", []):
        if container["name"] in wanted:
            resources = wanted[container["name"]].get("resources")
            if resources is not None:
                container["resources"] = resources
    if updated.get("spec", {}).get("containers") and len(wanted) > len(
        updated["spec"]["containers"]
    ):
        raise ApiError(422, "Invalid", "pods/resize cannot add containers")
    return updated


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    content_type: str
    status: int = 0
    agent: str = ""  # the client's User-Agent (the intake's names its identity)
    at: float = 0.0  # wall-clock time it arrived
    # A PATCH's annotations, each value it sets (None: removed): which writes publish or clear
    # what, and which record which state
    annotations: dict[str, str | None] = field(default_factory=dict)

    @property
    def verb(self) -> str:
        """Kubernetes verb: get, list, watch, create, update, patch, delete."""
        if self.method == "GET":
            if self.query.get("watch") in ("true", "1"):
                return "watch"
            return "get" if _is_object_path(self.path) else "list"
        return {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(
            self.method, self.method.lower()
        )


def _is_object_path(path: str) -> bool:
    parts = _resource_parts(path)
    return parts is not None and parts[2] is not None


_PREFIX = re.compile(r"^/(?:api/(?P<cv>v1)|apis/(?P<g>[^/]+)/(?P<v>[^/]+))/(?P<rest>.*)$")


def _resource_parts(path: str) -> tuple[str, str | None, str | None, str | None, str] | None:
    """(plural, namespace, name, subresource, group) of an API path, or None."""
    m = _PREFIX.match(path)
    if m is None:
        return None
    group = m["g"] or ""
    segs = [s for s in m["rest"].split("/") if s]
    if len(segs) >= 3 and segs[0] == "namespaces":
        ns, plural = segs[1], segs[2]
        name = segs[3] if len(segs) > 3 else None
        sub = segs[4] if len(segs) > 4 else None
        if plural in ("status", "finalize") and len(segs) == 3:  # namespaces/<name>/status
            return "namespaces", None, ns, plural, group
        return plural, ns, name, sub, group
    if not segs:
        return None
    return (
        segs[0],
        None,
        segs[1] if len(segs) > 1 else None,
        segs[2] if len(segs) > 2 else None,
        group,
    )


@dataclass
class Fault:
    """Answer matching requests with ``status`` after ``delay`` seconds instead of serving them;
    with ``status=None``, serve them after the delay (a slow server: a client that timed out
    cannot tell whether its write happened). A 429 carries ``Retry-After: 1``, like the API
    server's priority-and-fairness rejections."""

    status: int | None = 500
    method: str | None = None  # a regular expression: "PATCH", "POST|PUT|PATCH"
    path: str = ""
    query: str = ""  # a regular expression over the query string (``labelSelector=app=web``)
    times: int | None = 1  # None: every time (with ``probability``)
    probability: float = 1.0
    delay: float = 0.0
    agent: str = ""  # only requests whose User-Agent contains this (one client's partition)
    hits: int = 0  # requests it answered
    # Run once the request was answered (served, or with ``status``), its answer not yet sent:
    # a change that lands right after a client's read or refusal, before it does anything next.
    after: Callable[[Request], None] | None = None

    def applies(self, request: Request, rng: random.Random) -> bool:
        if self.times is not None and self.times <= 0:
            return False
        if self.agent and self.agent not in request.agent:
            return False
        if self.method and not re.fullmatch(self.method, request.method):
            return False
        if self.path and not re.search(self.path, request.path):
            return False
        if self.query and not re.search(
            self.query, "&".join(f"{k}={v}" for k, v in sorted(request.query.items()))
        ):
            return False
        return rng.random() < self.probability


_HANDED_OUT: set[int] = set()
_PORTS = random.Random()  # its own: a seeded global generator's sequence is left as it is
LOWEST_PORT = 10_000
UI_OFFSET = 1000  # the dev server's Web UI listens this far above its port


def _ephemeral_low() -> int:
    """The lowest port of the kernel's ephemeral range (``ip_local_port_range``)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port() -> int:
    """A TCP port free on this machine now, for a server a process is about to start. Taken
    below the kernel's ephemeral range (with room for a Web UI ``UI_OFFSET`` above it): every
    outgoing connection, and every bind to port 0, takes its port from that range, so a port
    picked from it could be taken before its server binds it ("Address already in use"); one
    picked here stays free. Never the same one twice in a process."""
    high = _ephemeral_low() - UI_OFFSET - 1
    while True:
        port = _PORTS.randint(LOWEST_PORT, high)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port


CADVISOR_PATH = re.compile(r"/api/v1/nodes/([^/]+)/proxy/metrics/cadvisor")


class KubeEmulator:
    """The HTTP face of ``Store``: ``with KubeEmulator() as api: api.url``."""

    def __init__(
        self, types: list[ResourceType] | None = None, seed: int = 0, bookmark_interval: float = 5.0
    ) -> None:
        self.store = Store(types or RESOURCE_TYPES)
        self.journal: list[Request] = []
        self.faults: list[Fault] = []
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.bookmark_interval = bookmark_interval
        self.url = ""
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._ready = threading.Event()
        # A node's cAdvisor metrics by node name, as a kubelet serves them through the API
        # server's proxy (``SimulatedCluster.cadvisor``); None: not served.
        self.cadvisor: Callable[[str], str] | None = None
        # A paged LIST's rest by continue token: the snapshot its first page was cut from, as
        # the real server's etcd revision (``_page``); the oldest go first, as a compaction.
        self._pages: OrderedDict[str, tuple[list[Obj], int]] = OrderedDict()

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self, port: int = 0) -> KubeEmulator:
        self._thread = threading.Thread(
            target=self._serve, args=(port,), daemon=True, name="kube-emulator"
        )
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the Kubernetes emulator did not start")
        return self

    def _serve(self, port: int) -> None:
        self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self._loop)
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(
            app, access_log=None, handle_signals=False, shutdown_timeout=0.1
        )
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        self._loop.run_until_complete(site.start())
        sockets = site._server.sockets  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{sockets[0].getsockname()[1]}"
        self._ready.set()
        self._loop.run_forever()

    def stop(self) -> None:
        if self._loop is None:
            return
        self.store.drop_watches()
        assert self._runner is not None
        fut = asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop)
        try:
            fut.result(5)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            if self._thread is not None:
                self._thread.join(5)

    def __enter__(self) -> KubeEmulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- test helpers -------------------------------------------------------------------------

    def requests(self, verb: str | None = None, path: str = "") -> list[Request]:
        with self._lock:
            return [
                r
                for r in self.journal
                if (verb is None or r.verb == verb) and re.search(path, r.path)
            ]

    def clear_journal(self) -> None:
        with self._lock:
            self.journal.clear()

    def inject(self, fault: Fault) -> Fault:
        with self._lock:
            self.faults.append(fault)
        return fault

    # --- HTTP ---------------------------------------------------------------------------------

    def _fault_for(self, request: Request) -> Fault | None:
        with self._lock:
            for fault in self.faults:
                if fault.applies(request, self._rng):
                    if fault.times is not None:
                        fault.times -= 1
                    fault.hits += 1
                    return fault
        return None

    async def _handle(self, http: web.Request) -> web.StreamResponse:
        request = Request(
            http.method,
            http.path,
            dict(http.query),
            http.content_type or "",
            agent=http.headers.get("User-Agent", ""),
            at=time.time(),
        )
        with self._lock:
            self.journal.append(request)
        fault = self._fault_for(request)
        if fault is not None and fault.delay:
            await asyncio.sleep(fault.delay)
        if fault is not None and fault.status is not None:
            request.status = fault.status
            reason = {409: "Conflict", 429: "TooManyRequests", 404: "NotFound"}.get(
                fault.status, "InternalError"
            )
            error = ApiError(fault.status, reason, f"injected fault {fault.status}")
            headers = {"Retry-After": "1"} if fault.status == 429 else None
            if fault.after is not None:
                fault.after(request)
            return web.json_response(error.body(), status=fault.status, headers=headers)
        try:
            node = CADVISOR_PATH.fullmatch(http.path)
            if node is not None and self.cadvisor is not None:  # a kubelet's, through the proxy
                return web.Response(text=self.cadvisor(node[1]), content_type="text/plain")
            if http.path in ("/version", "/version/"):
                return web.json_response(
                    {"major": "1", "minor": "34", "gitVersion": "v1.34.0-emulator"}
                )
            found = self._discovery(http.path.rstrip("/"))
            if found is not None:
                return web.json_response(found)
            response = await self._dispatch(http, request)
        except ApiError as err:
            request.status = err.code
            return web.json_response(err.body(), status=err.code)
        request.status = response.status
        if fault is not None and fault.after is not None:
            fault.after(request)
        return response

    def _discovery(self, path: str) -> Obj | None:
        """``/api``, ``/apis``, ``/api/v1``, ``/apis/<group>/<version>``, ``/openapi/v3`` and its
        documents (``sim.discovery``)."""
        if path == "/api":
            return discovery.api_versions()
        if path == "/apis":
            return discovery.api_groups(RESOURCE_TYPES)
        if path == "/openapi/v3":
            return discovery.openapi_root(RESOURCE_TYPES)
        m = _OPENAPI.match(path)
        if m is not None:
            group, version = m["group"] or "", m["core"] or m["v"]
            crds = list(self.store.items("CustomResourceDefinition"))
            document = discovery.openapi_document(RESOURCE_TYPES, group, version, crds)
            if document is None:
                raise ApiError(404, "NotFound", f"no OpenAPI document for {path}")
            return document
        m = _DISCOVERY.match(path)
        if m is None:
            return None
        group, version = m["group"] or "", m["core"] or m["v"]
        found = discovery.resource_list(RESOURCE_TYPES, group, version)
        if found is None:
            raise ApiError(
                404, "NotFound", f"the server could not find the requested resource {path}"
            )
        return found

    async def _dispatch(self, http: web.Request, request: Request) -> web.StreamResponse:
        parts = _resource_parts(http.path)
        if parts is None:
            raise ApiError(
                404, "NotFound", f"the server could not find the requested resource {http.path}"
            )
        plural, namespace, name, sub, group = parts
        rtype = self.store.rtype(plural, group)
        store = self.store
        as_table = discovery.wants_table(http.headers.get("Accept", ""))
        if request.verb == "watch":
            return await self._watch(http, rtype, namespace, name, as_table)
        if http.content_type == PROTOBUF:  # as a server without protobuf answers (415)
            raise ApiError(
                415, "UnsupportedMediaType",
                f"the simulated cluster speaks JSON only, not {PROTOBUF} (kubectl create sends"
                " protobuf: write the object with kubectl apply -f instead)",
            )  # fmt: skip
        if sub == "scale":
            assert name is not None
            return web.json_response(await self._scale(http, rtype, namespace, name))
        if request.verb == "list":
            items, meta = self._page(http, rtype, namespace)
            if as_table:
                table = self._table(rtype, items, meta["resourceVersion"])
                return web.json_response(table | {"metadata": table["metadata"] | meta})
            body = {
                "kind": f"{rtype.kind}List",
                "apiVersion": rtype.api_version,
                "metadata": meta,
                "items": items,
            }
            return web.json_response(body)
        if http.method == "GET":
            assert name is not None
            found = store.get(rtype, namespace, name)
            if as_table:
                return web.json_response(
                    self._table(rtype, [found], found["metadata"]["resourceVersion"])
                )
            return web.json_response(found)
        if http.method == "DELETE":
            assert name is not None
            return web.json_response(store.delete(rtype, namespace, name))
        if request.content_type.startswith(APPLY_PATCH):
            return web.json_response(await self._server_side_apply(http, rtype, namespace, name))
        try:
            body = await http.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ApiError(400, "BadRequest", f"invalid JSON body: {exc}") from exc
        if http.method == "PATCH":  # read where the write is served, as it always was
            request.annotations = _patched_annotations(body)
        if http.method == "POST":
            if isinstance(body, dict) and not body.get("kind"):
                body["kind"] = rtype.kind
            return web.json_response(store.create(body, namespace, _validate), status=201)
        assert name is not None
        if http.method == "PUT":
            return web.json_response(store.replace(rtype, namespace, name, body, sub, _validate))
        if http.method == "PATCH":
            return web.json_response(
                store.patch(rtype, namespace, name, body, request.content_type, sub, _validate)
            )
        raise ApiError(405, "MethodNotAllowed", f"{http.method} is not supported")

    async def _scale(
        self, http: web.Request, rtype: ResourceType, namespace: str | None, name: str
    ) -> Obj:
        """The ``scale`` subresource (``kubectl scale``, an HPA): an ``autoscaling/v1`` Scale
        read from the object, and written back as its ``spec.replicas``; a Scale that names a
        ``resourceVersion`` is a precondition, as on a real server."""
        if rtype.kind not in SCALABLE:
            raise ApiError(404, "NotFound", f"{rtype.plural} have no scale subresource")
        if http.method in ("PUT", "PATCH"):
            try:
                body = await http.json()
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise ApiError(400, "BadRequest", f"invalid JSON body: {exc}") from exc
            # One read, one patch: the patch alone is atomic; a PUT's Scale that names a
            # resourceVersion makes it a precondition.
            scale, version = body, (body.get("metadata") or {}).get("resourceVersion")
            if http.method == "PATCH":
                current, version = _scale_of(self.store.get(rtype, namespace, name)), None
                try:
                    if http.content_type.startswith("application/json-patch+json"):
                        scale = json_patch(current, body)
                    else:
                        scale = merge_patch(current, body)
                except PatchError as exc:
                    raise ApiError(422, "Invalid", str(exc)) from exc
            replicas = (scale.get("spec") or {}).get("replicas")
            if not isinstance(replicas, int) or replicas < 0:
                raise ApiError(
                    422, "Invalid", f"spec.replicas: a non-negative integer, not {replicas!r}"
                )
            change: Obj = {"spec": {"replicas": replicas}}
            if version:
                change["metadata"] = {"resourceVersion": version}
            merge = "application/merge-patch+json"
            self.store.patch(rtype, namespace, name, change, merge)
        elif http.method != "GET":
            raise ApiError(405, "MethodNotAllowed", f"{http.method} is not supported on scale")
        return _scale_of(self.store.get(rtype, namespace, name))

    async def _server_side_apply(
        self, http: web.Request, rtype: ResourceType, namespace: str | None, name: str | None
    ) -> Obj:
        """``kubectl apply --server-side``: create the object, or merge the applied configuration
        into it. Approximated: no managedFields, so a field dropped from the configuration is
        kept rather than removed, and there are no conflicts between managers."""
        try:
            body = yaml.safe_load(await http.text())
        except yaml.YAMLError as exc:
            raise ApiError(400, "BadRequest", f"invalid apply body: {exc}") from exc
        if not isinstance(body, dict) or name is None:
            raise ApiError(400, "BadRequest", "an apply patch is one object, sent to its name")
        try:
            self.store.get(rtype, namespace, name)
        except ApiError as err:
            if err.code != 404:
                raise
            return self.store.create(body, namespace, _validate)
        merge = "application/merge-patch+json"
        return self.store.patch(rtype, namespace, name, body, merge, None, _validate)

    def _page(
        self, http: web.Request, rtype: ResourceType, namespace: str | None
    ) -> tuple[list[Obj], Obj]:
        """A LIST's items and metadata, in pages as the real server cuts them: ``limit`` items
        at most, in namespace and name order, with a ``continue`` token for the rest, each
        page of the snapshot the first was cut from (its ``resourceVersion``). A token the
        server no longer holds is ``410 Expired``: the client lists again from the start."""
        token, raw = http.query.get("continue"), http.query.get("limit") or "0"
        try:
            limit = int(raw)
        except ValueError:
            raise ApiError(400, "BadRequest", f"limit: {raw!r} is not an integer") from None
        if token:
            with self._lock:
                page = self._pages.pop(token, None)
            if page is None:
                raise ApiError(410, "Expired", CONTINUE_EXPIRED)
            items, rv = page
        else:
            items, rv = self.store.list_objects(
                rtype, namespace, http.query.get("labelSelector"), http.query.get("fieldSelector")
            )
            if limit > 0:  # pages follow the key order; an unpaged LIST keeps the store's
                items.sort(
                    key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"])
                )
        meta: Obj = {"resourceVersion": str(rv)}
        if 0 < limit < len(items):
            items, rest, token = items[:limit], items[limit:], uuid.uuid4().hex
            with self._lock:
                self._pages[token] = (rest, rv)
                while len(self._pages) > PAGES_KEPT:
                    self._pages.popitem(last=False)
            meta |= {"continue": token, "remainingItemCount": len(rest)}
        return items, meta

    def expire_pages(self) -> None:
        """Forget every continue token, as a compaction of the revision they read does."""
        with self._lock:
            self._pages.clear()

    def _table(self, rtype: ResourceType, objects: list[Obj], resource_version: str) -> Obj:
        crds = list(self.store.items("CustomResourceDefinition"))
        columns = discovery.printer_columns(crds, rtype.group, rtype.version, rtype.plural)
        return discovery.table(objects, columns, resource_version)

    async def _watch(
        self,
        http: web.Request,
        rtype: ResourceType,
        namespace: str | None,
        name: str | None,
        as_table: bool = False,
    ) -> web.StreamResponse:
        labels = parse_label_selector(http.query.get("labelSelector"))
        fields = parse_field_selector(http.query.get("fieldSelector"))

        def accept(obj: Obj) -> bool:
            return (
                (name is None or obj["metadata"]["name"] == name)
                and matches(labels, obj["metadata"].get("labels"))
                and all(f(obj) for f in fields)
            )

        rv_param = http.query.get("resourceVersion")
        since = int(rv_param) if rv_param not in (None, "", "0") else None
        # A streaming list (what the kubectl here asks for): the state now as ADDED events, then
        # a bookmark saying the initial events have ended, then the changes.
        initial = http.query.get("sendInitialEvents") == "true"
        if initial:
            since = None
        timeout = float(http.query.get("timeoutSeconds") or 3600)
        bookmarks = http.query.get("allowWatchBookmarks") in ("true", "1")
        loop = asyncio.get_running_loop()
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(http)
        try:
            watcher, backlog = self.store.watch(rtype, namespace, accept, since, loop)
        except ApiError as err:  # 410 Gone travels as an ERROR event inside a 200 stream
            await response.write(_line({"type": "ERROR", "object": err.body()}))
            return response

        def shown(obj: Obj) -> Obj:
            if not as_table:
                return obj
            return self._table(rtype, [obj], obj["metadata"].get("resourceVersion", ""))

        try:
            for old in backlog:
                await response.write(_line({"type": old.type, "object": shown(old.obj)}))
            if initial:
                snapshot = backlog[0].rv if backlog else self.store.resource_version
                ended = {
                    "kind": rtype.kind,
                    "apiVersion": rtype.api_version,
                    "metadata": {
                        "resourceVersion": str(snapshot),
                        "annotations": {"k8s.io/initial-events-end": "true"},
                    },
                }
                await response.write(_line({"type": "BOOKMARK", "object": ended}))
            deadline = loop.time() + timeout
            while True:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                wait = min(remaining, self.bookmark_interval) if bookmarks else remaining
                try:
                    event = await asyncio.wait_for(watcher.queue.get(), wait)
                except TimeoutError:
                    if bookmarks and loop.time() < deadline:
                        bookmark = {
                            "kind": rtype.kind,
                            "apiVersion": rtype.api_version,
                            "metadata": {"resourceVersion": str(self.store.resource_version)},
                        }
                        await response.write(_line({"type": "BOOKMARK", "object": bookmark}))
                    continue
                if event is None:  # dropped
                    break
                await response.write(_line({"type": event.type, "object": shown(event.obj)}))
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self.store.unwatch(watcher)
        return response


APPLY_PATCH = "application/apply-patch"
PAGES_KEPT = 256  # continue tokens held at once; older ones expire (410), as compacted ones do
CONTINUE_EXPIRED = (
    "The provided continue parameter is too old to display a consistent list result. You can"
    " start a new list without the continue parameter."
)
PROTOBUF = "application/vnd.kubernetes.protobuf"
SCALABLE = frozenset({"Deployment", "StatefulSet", "ReplicaSet", "Rollout"})


def _scale_of(obj: Obj) -> Obj:
    """The ``autoscaling/v1`` Scale of a scalable object, as the API server serves it."""
    meta = obj["metadata"]
    labels = ((obj.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
    return {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            k: meta[k]
            for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
            if k in meta
        },
        "spec": {"replicas": (obj.get("spec") or {}).get("replicas", 1)},
        "status": {
            "replicas": (obj.get("status") or {}).get("replicas", 0),
            "selector": ",".join(f"{k}={v}" for k, v in sorted(labels.items())),
        },
    }


_DISCOVERY = re.compile(r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<v>[^/]+))$")
_OPENAPI = re.compile(r"^/openapi/v3/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<v>[^/]+))$")


def _validate(obj: Obj) -> None:
    """What the API server's schema validation refuses, refused here too (HTTP writes only:
    a test may still store any object directly)."""
    invalid = discovery.invalid_policy(obj)
    if invalid is not None:
        raise ApiError(422, "Invalid", invalid["message"], invalid["details"])


def _line(event: Obj) -> bytes:
    return (json.dumps(event) + "\n").encode()
