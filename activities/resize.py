"""In-place actuation: resize the running cohort pods through ``pods/resize``.

Used by the ``roll_back`` and ``reapply_recommendation`` activities in ``in-place`` mode. Only
pods whose actual resources differ from the target are patched (a strategic merge patch of the
containers' resources), so a retried activity resizes nothing twice. A pod whose node lacks the
free allocatable for larger requests is filtered and reported; pending pods are left to
admission. Containers with a ``RestartContainer`` resize policy are named in the result.

A restore (``Pace.recreate``: a rollback) lands where a resize would not: a pod not Ready that
cannot take it in place (``recreate_reason``: a container in CrashLoopBackOff, which a kubelet
before 1.33 starts with the restored resources only when its restart backoff ends, up to 5
minutes on, and whose pod cgroup a resize may leave at the cut, kubernetes#138760; a resize left
``Deferred`` or ``Infeasible``; a node without the room) is deleted, and its
controller recreates it, admitted with the restored resources and placed by the scheduler
wherever there is room; told once a batch (``Pace.on_recreated``: a ``RollbackPodsRecreated``
Event). A Ready pod is never deleted: it keeps serving, filtered as above where its node lacks
the room.

Paced (``resize_paced``): a resize that restarts a container takes its pod down until it is
Ready again, so a rollback meant to restore service must not restart the whole cohort at once.
Pods whose resize restarts nothing, and pods already not Ready, are resized at once (no
availability is lost); Ready pods that would restart go in batches that keep at most the
workload's ``maxUnavailable`` pods not Ready (``activities.owners.max_unavailable``), each batch
waited on (a watch of the cohort, heartbeating) until its pods have restarted and are Ready
again. Every round starts from a fresh LIST, so a retried activity (a worker that died
mid-batch) resizes no pod twice and forgets none: what is at the target is skipped, a pod still
restarting counts as unavailable. A 429 from the API server (throttling) is transient: the
activity is retried.

Before each round, the first included (the activity's gate read it on the same LIST, but a
write may come between), the pause is read again on the owner read afresh (``Pace.paused``): a
pause set mid-rollback stops the next batch, and the step, held
by the workflow, goes on from where it stopped once the pause lifts. And each batch of pods it
takes down is bounded by the PodDisruptionBudgets selecting the cohort too (``Pace.budget``: the
smallest ``status.disruptionsAllowed``, 0 while a budget's status is older than its spec, as the
eviction API holds it): a budget that allows nothing holds the batch, told once
(``Pace.on_held``: a ``RollbackPaced`` Event naming it), watched until it allows one.

A pod of the batch that crashes on its new resources (restarted again after the resize's
restart: OOMKilled, CrashLoopBackOff) will not be Ready by waiting: the batch is over. A
re-apply (``Pace.stop_on_crash``) then stops, taking no more pods down: the crash is the
window's evidence, and the verdict rolls it back. A rollback goes on to its target.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from kubernetes.client import CoreV1Api
from kubernetes.client.exceptions import ApiException
from kubernetes.watch import watch as _watch

from activities.cohort import actual_resources, is_ready
from activities.errors import TransientError
from activities.lookup import body as _body
from workflows.contract import Obj
from workflows.fingerprint import Resources
from workflows.pause import Pause
from workflows.quantities import parse_quantity

STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
BATCH_TIMEOUT = 300.0  # seconds a batch may take to be Ready again before the activity retries
WATCH_SLICE = 5  # seconds per watch request: a heartbeat at least this often
iter_resp_lines: Callable[[Any], Iterator[str]] = _watch.iter_resp_lines  # untyped in the client


@dataclass
class Resized:
    """What one in-place actuation did."""

    resized: int = 0
    filtered: list[str] = field(default_factory=list)  # pods whose node lacks the capacity
    # A restore's pods that cannot take it in place, deleted for their controller to recreate
    # with the restored resources: pod -> why (``recreate_reason``)
    recreated: dict[str, str] = field(default_factory=dict)
    restarts: set[str] = field(default_factory=set)  # pod/container restarted to apply
    batches: int = 0  # paced batches of pods taken down to restart
    most_unavailable: int = 0  # pods not Ready at once, at the most, as the batches started
    crashed: list[str] = field(default_factory=list)  # pods that crashed on their new resources
    left: int = 0  # pods a stop on a crash left as they were
    paused: Pause | None = None  # a pause read before a batch stopped it there
    held_by: dict[str, str] = field(default_factory=dict)  # budget -> as it held a batch
    notes: list[str] = field(default_factory=list)  # how the pace was read (maxUnavailable 0)

    def describe(self) -> str:
        text = f"{self.resized} pods resized in place"
        if self.filtered:
            text += (
                f"; {len(self.filtered)} filtered for lack of node capacity"
                f" ({', '.join(self.filtered)})"
            )
        if self.recreated:
            why = ", ".join(f"{pod}: {reason}" for pod, reason in sorted(self.recreated.items()))
            text += f"; {len(self.recreated)} recreated to take it ({why})"
        if self.restarts:
            text += (
                "; containers restart to apply (RestartContainer):"
                f" {', '.join(sorted(self.restarts))}"
            )
        if self.batches:
            text += (
                f"; paced in {self.batches} batch(es), at most {self.most_unavailable} pod(s)"
                " not Ready at once"
            )
            text += "".join(f" ({note})" for note in self.notes)
        if self.held_by:
            text += f"; held by {', '.join(self.held_by.values())}"
        if self.crashed:
            text += f"; crashed on the new resources: {', '.join(self.crashed)}"
        if self.left:
            text += f"; stopped there, {self.left} pod(s) left as they were"
        if self.paused is not None:
            text += f"; stopped before the next batch: {self.paused.describe()}"
        return text


@dataclass(frozen=True)
class Budget:
    """The tightest PodDisruptionBudget over the cohort: how many pods it lets go down now."""

    name: str
    allowed: int
    said: str  # e.g. "PodDisruptionBudget web allows 0 (2 healthy, 2 desired)"


@dataclass
class Pace:
    """How a paced resize may take pods down, and how it says it is alive."""

    max_unavailable: int
    heartbeat: Callable[[], None] = lambda: None
    batch_timeout: float = BATCH_TIMEOUT
    stop_on_crash: bool = False  # a re-apply: a pod crashing on the new resources stops it
    # A restore: a pod not Ready that cannot take it in place (``recreate_reason``) is deleted
    # for its controller to recreate it with the restored resources.
    recreate: bool = False
    on_recreated: Callable[[dict[str, str]], None] = lambda pods: None  # told once a batch
    # The pause in force over the cohort as listed, the owner read afresh (before each batch).
    paused: Callable[[list[Obj]], Pause | None] = lambda pods: None
    # The tightest disruption budget over the cohort as listed (None: none selects it), and
    # where to watch it when it allows nothing.
    budget: Callable[[list[Obj]], Budget | None] = lambda pods: None
    budget_watch: Callable[[Budget, float], None] | None = None
    on_held: Callable[[Budget], None] = lambda budget: None  # told once per budget that holds
    notes: tuple[str, ...] = ()


Lister = Callable[[], tuple[list[Obj], str]]  # the cohort now, and the LIST's resourceVersion


def resize_paced(
    core: CoreV1Api,
    namespace: str,
    cohort: Lister,
    selector: str | None,
    requests: Resources,
    limits: Resources,
    pace: Pace,
) -> Resized:
    """Resize the cohort to the target, paced by ``pace`` (see the module)."""
    free = NodeCapacity(core)
    done = Resized(notes=list(pace.notes))
    while True:
        pods, version = cohort()
        if (paused := pace.paused(pods)) is not None:  # every batch, the first included
            done.paused = paused
            return done
        plan = _plan(pods, done.filtered, requests, limits, pending=pace.recreate)
        if not plan:
            return done
        down = sum(1 for p in pods if _down(p))
        budget, pdb = _allowed(pace, pods, plan, down)
        recreated = len(done.recreated)
        waiting_on, held_back = _batch(
            core, namespace, plan, requests, free, budget, done, pace.recreate
        )
        if len(done.recreated) > recreated:
            pace.on_recreated(dict(list(done.recreated.items())[recreated:]))
        if held_back and not waiting_on and pdb is not None and pdb.allowed <= 0:
            _hold(pace, done, pdb)  # the budget, not the workload's own pace, holds every pod
            continue
        if held_back and not waiting_on:  # the workload's own pace: others are down already
            _tell(pace, done, _down_by_others(pace, pods))
        if waiting_on or held_back:
            done.batches += 1
            # Not Ready as the batch starts: those already down and those it takes down.
            taken = sum(1 for name in waiting_on if name in _ready_names(pods))
            done.most_unavailable = max(done.most_unavailable, down + taken)
            # Until this batch is back (or, with none, another pod is Ready): then the next.
            back = _back(waiting_on) if waiting_on else _any_ready(down)
            waited = (
                f"pods {', '.join(sorted(waiting_on))} not Ready again within"
                f" {pace.batch_timeout:.0f}s of their resize"
                if waiting_on
                else f"none of the {down} pods not Ready before this batch Ready again within"
                f" {pace.batch_timeout:.0f}s: {held_back} pod(s) wait to be restored"
            )
            seen = _wait(core, namespace, selector, version, pods, pace, back, waited)
            crashed = [n for n, counts in waiting_on.items() if n in seen
                       and _crashed(seen[n], counts)]  # fmt: skip
            done.crashed += crashed
            if crashed and pace.stop_on_crash:
                done.left = held_back
                return done
        if not held_back:
            return done


def _batch(
    core: CoreV1Api,
    namespace: str,
    plan: list[tuple[Obj, list[Obj], set[str]]],
    requests: Resources,
    free: NodeCapacity,
    budget: int,
    done: Resized,
    recreate: bool = False,
) -> tuple[dict[str, dict[str, int]], int]:
    """Resize what this batch may: every pod whose resize takes none down, and up to
    ``budget`` that do; a pod its node cannot take grown is filtered. For a restore
    (``recreate``), a pod not Ready that cannot take it in place (``recreate_reason``) is
    deleted instead, for its controller to recreate (it takes no pod down: it is down). The
    pods that restart, with their restart counts before the resize, and how many were held
    back."""
    waiting_on: dict[str, dict[str, int]] = {}
    held_back = 0
    for pod, containers, restarts in plan:
        actual_req, _ = actual_resources(pod)
        growth = _growth(actual_req, requests)
        roomless = bool(growth) and not free.fits(pod, growth)
        # Only a pod not Ready: deleting a serving one would bet it on the scheduler's room.
        why = recreate_reason(pod, roomless) if recreate and not is_ready(pod) else None
        if why is not None:
            _delete(core, namespace, pod)
            done.recreated[pod["metadata"]["name"]] = why
            continue
        takes_down = bool(restarts) and is_ready(pod)
        if takes_down and budget <= 0:
            held_back += 1
            continue
        if roomless:
            done.filtered.append(pod["metadata"]["name"])
            continue
        if restarts:
            waiting_on[pod["metadata"]["name"]] = _restart_counts(pod)
        _patch(core, namespace, pod, containers)
        free.take(pod, growth)
        done.resized += 1
        done.restarts |= restarts
        if takes_down:
            budget -= 1
    return waiting_on, held_back


def _allowed(
    pace: Pace, pods: list[Obj], plan: list[tuple[Obj, list[Obj], set[str]]], down: int
) -> tuple[int, Budget | None]:
    """How many pods this batch may take down: the workload's pace less those already down,
    and at most what the tightest disruption budget allows (read only when the batch would take
    a pod down); and that budget."""
    budget = pace.max_unavailable - down
    if not any(restarts and is_ready(pod) for pod, _, restarts in plan):
        return budget, None
    pdb = pace.budget(pods)
    return (min(budget, pdb.allowed) if pdb is not None else budget), pdb


def _hold(pace: Pace, done: Resized, pdb: Budget) -> None:
    """Wait for a budget that allows nothing to allow a disruption, told once."""
    _tell(pace, done, pdb)
    if pace.budget_watch is None:
        raise TransientError(f"{pdb.said}; looking again")
    pace.budget_watch(pdb, pace.batch_timeout)


def _plan(
    pods: list[Obj],
    filtered: list[str],
    requests: Resources,
    limits: Resources,
    pending: bool = False,
) -> list[tuple[Obj, list[Obj], set[str]]]:
    """The running pods (``pending``: and the Pending ones, a restore's to recreate) not at the
    target yet: each with its containers' patches and the containers whose resize restarts
    them."""
    plan = []
    for pod in pods:
        name = pod["metadata"]["name"]
        terminating = pod["metadata"].get("deletionTimestamp") is not None
        phase = pod.get("status", {}).get("phase")
        taken = phase == "Running" or (pending and phase == "Pending")
        if not taken or name in filtered or terminating:
            continue
        containers = _resize_body(pod, *actual_resources(pod), requests, limits)
        if containers:
            plan.append((pod, containers, _restarting(pod, containers)))
    # The pods down first: a batch mends (or recreates) what is down before it takes one down.
    return sorted(plan, key=lambda planned: is_ready(planned[0]))


def _ready_names(pods: list[Obj]) -> set[str]:
    return {p["metadata"]["name"] for p in pods if is_ready(p)}


def _patch(core: CoreV1Api, namespace: str, pod: Obj, containers: list[Obj]) -> None:
    core.patch_namespaced_pod_resize(
        pod["metadata"]["name"],
        namespace,
        {"spec": {"containers": containers}},
        _content_type=STRATEGIC_MERGE_PATCH,
        _preload_content=False,
    )


def recreate_reason(pod: Obj, roomless: bool) -> str | None:
    """Why a restore cannot land on this pod in place, if it cannot: a container in
    CrashLoopBackOff (see the module's docstring: its resize may wait out the restart backoff
    or not reach the pod's cgroup), a resize the kubelet left pending (``Deferred``,
    ``Infeasible``) or a node without the room for it; a recreated pod is placed by the
    scheduler, wherever there is room."""
    if (pod.get("status") or {}).get("phase") == "Pending":
        return "Pending: nothing runs in it"
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    if any(
        ((cs.get("state") or {}).get("waiting") or {}).get("reason") == "CrashLoopBackOff"
        for cs in statuses
    ):
        return "CrashLoopBackOff"
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodResizePending" and condition.get("status") == "True":
            return f"resize {condition.get('reason') or 'pending'}"
    return "its node lacks the room" if roomless else None


def _delete(core: CoreV1Api, namespace: str, pod: Obj) -> None:
    """Delete a pod for its controller to recreate (one already gone is as good)."""
    try:
        core.delete_namespaced_pod(pod["metadata"]["name"], namespace, _preload_content=False)
    except ApiException as exc:
        if exc.status != 404:
            raise


def _restart_counts(pod: Obj) -> dict[str, int]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return {cs["name"]: int(cs.get("restartCount") or 0) for cs in statuses}


Done = Callable[[dict[str, Obj]], bool]  # over the cohort by name, as the watch shows it


def _crashed(pod: Obj, before: dict[str, int]) -> bool:
    """Restarted again after the resize's own restart, or backing off: it crashes on them."""
    now = _restart_counts(pod)
    if any(now.get(c, 0) > n + 1 for c, n in before.items()):
        return True
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return any(
        ((cs.get("state") or {}).get("waiting") or {}).get("reason") == "CrashLoopBackOff"
        for cs in statuses
        if cs.get("name") in before and (cs.get("restartCount") or 0) > before[cs["name"]]
    )


def _back(before: dict[str, dict[str, int]]) -> Done:
    """Every pod of the batch restarted (a restart count went up) and is Ready, or crashed on
    its new resources (waiting will not bring it back), or is gone."""

    def check(pods: dict[str, Obj]) -> bool:
        for name, counts in before.items():
            pod = pods.get(name)
            if pod is None:
                continue  # deleted: its replacement is admitted with the owner's target
            now = _restart_counts(pod)
            restarted = any(now.get(c, 0) > n for c, n in counts.items())
            if not (restarted and is_ready(pod)) and not _crashed(pod, counts):
                return False
        return True

    return check


def _any_ready(down: int) -> Done:
    """Fewer pods down than ``down``: another may be taken down."""
    return lambda pods: sum(1 for p in pods.values() if _down(p)) < down


def _down(pod: Obj) -> bool:
    """Whether the pod is down as the workload's pace counts it: not Ready, and it ran (a pod
    that never ran, Pending, serves nothing and takes nothing down: a restore recreates it)."""
    return not is_ready(pod) and (pod.get("status") or {}).get("phase") != "Pending"


def _down_by_others(pace: Pace, pods: list[Obj]) -> Budget:
    """The workload's own pace, as a budget that holds a batch: its ``maxUnavailable`` spent on
    pods down for a cause of their own."""
    down = sorted(p["metadata"]["name"] for p in pods if _down(p))
    said = (
        f"maxUnavailable {pace.max_unavailable} with {len(down)} pod(s) not Ready"
        f" ({', '.join(down)}): it waits for one to be Ready again"
    )
    return Budget("maxUnavailable", 0, said)


def _tell(pace: Pace, done: Resized, budget: Budget) -> None:
    """Tell once what holds a batch (``Pace.on_held``), and keep it for the result."""
    if budget.name not in done.held_by:
        done.held_by[budget.name] = budget.said
        pace.on_held(budget)


def _wait(
    core: CoreV1Api,
    namespace: str,
    selector: str | None,
    version: str,
    listed: list[Obj],
    pace: Pace,
    done: Done,
    waited: str,
) -> dict[str, Obj]:
    """Watch the cohort from the LIST it was ``listed`` in (``version``: the resizes since come
    as events) until ``done``, and return it as last seen; heartbeat on the way. Past the batch
    timeout: a transient error saying what it ``waited`` on (the activity is retried, and
    starts from a fresh LIST)."""
    pods = {p["metadata"]["name"]: p for p in listed}
    deadline = time.monotonic() + pace.batch_timeout
    while not done(pods):
        pace.heartbeat()
        if time.monotonic() > deadline:
            raise TransientError(f"{waited}; looking again")
        lister = functools.partial(core.list_namespaced_pod, namespace, label_selector=selector)
        for kind, obj in watch_slice(lister, version):
            if kind == "ERROR":
                return pods  # an expired version: the caller's next round LISTs afresh
            version = obj.get("metadata", {}).get("resourceVersion", version)
            if kind == "DELETED":
                pods.pop(obj["metadata"]["name"], None)
            elif kind in ("ADDED", "MODIFIED"):
                pods[obj["metadata"]["name"]] = obj
            if done(pods):
                return pods
            pace.heartbeat()
    return pods


def watch_slice(lister: Callable[..., Any], version: str) -> Iterator[tuple[str, Obj]]:
    """One watch request of ``lister`` (a LIST call) from ``version``, at most ``WATCH_SLICE``
    seconds, bookmarks included: each event's type and object (``ERROR``: the version expired)."""
    response: Any = lister(
        watch=True,
        resource_version=version,
        allow_watch_bookmarks=True,
        timeout_seconds=WATCH_SLICE,
        _preload_content=False,
    )
    try:
        for line in iter_resp_lines(response):
            event = json.loads(line)
            yield event.get("type", ""), event.get("object") or {}
    finally:
        response.release_conn()


def _resize_body(
    pod: Obj, actual_req: Resources, actual_lim: Resources, requests: Resources, limits: Resources
) -> list[Obj]:
    """Container patches for what differs from the target; empty when the pod is already there."""
    body = []
    for container in pod.get("spec", {}).get("containers") or []:
        name = container["name"]
        change: Obj = {}
        for key, target, actual in (
            ("requests", requests, actual_req),
            ("limits", limits, actual_lim),
        ):
            wanted = target.get(name) or {}
            have = actual.get(name) or {}
            diff = {
                r: q
                for r, q in wanted.items()
                if r not in have or parse_quantity(have[r]) != parse_quantity(q)
            }
            if diff:
                change[key] = diff
        if change:
            body.append({"name": name, "resources": change})
    return body


def _growth(actual: Resources, target: Resources) -> dict[str, Decimal]:
    """By how much the pod's total requests grow, per resource (shrinks count as zero)."""
    growth: dict[str, Decimal] = {}
    for container, wanted in target.items():
        for resource, quantity in wanted.items():
            before = parse_quantity(actual.get(container, {}).get(resource, "0"))
            delta = parse_quantity(quantity) - before
            if delta > 0:
                growth[resource] = growth.get(resource, Decimal(0)) + delta
    return growth


def _restarting(pod: Obj, containers: list[Obj]) -> set[str]:
    """Containers whose resize policy restarts them for a resource this resize changes."""
    changed = {
        c["name"]: set(c["resources"].get("requests", {})) | set(c["resources"].get("limits", {}))
        for c in containers
    }
    names = set()
    for container in pod.get("spec", {}).get("containers") or []:
        for policy in container.get("resizePolicy") or []:
            if policy.get("restartPolicy") == "RestartContainer" and policy.get(
                "resourceName"
            ) in changed.get(container["name"], set()):
                names.add(f"{pod['metadata']['name']}/{container['name']}")
    return names


class NodeCapacity:
    """Free allocatable per node, read lazily (one LIST of nodes, one LIST of pods per node)."""

    def __init__(self, core: CoreV1Api) -> None:
        self.core = core
        self._free: dict[str, dict[str, Decimal]] | None = None
        self._nodes: dict[str, Obj] = {}

    def _load_node(self, node: str) -> dict[str, Decimal]:
        if self._free is None:
            listed = _body(self.core.list_node(_preload_content=False))["items"]
            self._nodes = {n["metadata"]["name"]: n for n in listed}
            self._free = {}
        if node not in self._free:
            allocatable = (self._nodes.get(node, {}).get("status") or {}).get("allocatable") or {}
            free = {r: parse_quantity(str(q)) for r, q in allocatable.items()}
            on_node = _body(
                self.core.list_pod_for_all_namespaces(
                    field_selector=f"spec.nodeName={node}", _preload_content=False
                )
            )["items"]
            for pod in on_node:
                if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                    continue
                requests, _ = actual_resources(pod)
                for values in requests.values():
                    for r, q in values.items():
                        if r in free:
                            free[r] -= parse_quantity(q)
            self._free[node] = free
        return self._free[node]

    def fits(self, pod: Obj, growth: dict[str, Decimal]) -> bool:
        node = pod.get("spec", {}).get("nodeName")
        if not node:
            return True
        free = self._load_node(node)
        return all(free.get(r, Decimal("Infinity")) >= g for r, g in growth.items())

    def take(self, pod: Obj, growth: dict[str, Decimal]) -> None:
        node = pod.get("spec", {}).get("nodeName")
        if node and self._free is not None and node in self._free:
            for r, g in growth.items():
                if r in self._free[node]:
                    self._free[node][r] -= g
