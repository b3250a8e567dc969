"""``rollbackctl pause|resume|automation`` (and ``kubectl rollback ...``): Kubex's pause annotations
(``rightsizing.kubex.ai/pause-until``, ``pause-reason``) written on a namespace, a workload or a
pod, as an operator would with ``kubectl annotate``, but with the value checked first (the rule
that reads it is ``workflows.pause``: a value it cannot read would hold until fixed) and, after,
the running attempts the pause covers listed.

A resume removes both annotations; the intake's watch sees them go and resumes what they held
within seconds (docs: Pause the engine in an incident).

``breaker [reset]`` reads or resets the storm breaker (``workflows.breaker``), on the same
namespace. ``automation off|on`` is the engine's kill switch for the whole cluster
(``rightsizing.kubex.ai/automation`` on the engine's namespace, ``workflows.pause.automation_off``):
off, no new attempt starts and nothing brings a cut back, while verdicts and rollbacks go on.
The engine's namespace is the one holding the intake's Lease, unless given.
"""

from __future__ import annotations

from contextlib import suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes.client import ApiClient, CoordinationV1Api, CoreV1Api, CustomObjectsApi
from kubernetes.client.exceptions import ApiException

from activities.lookup import OwnerLookup
from activities.lookup import body as response_body
from activities.owners import OWNER_KINDS
from activities.writes import MERGE_PATCH
from cli import ops
from cli.ops import OpsError, kind_of
from workflows.activity_api import OwnerRef
from workflows.contract import (
    AUTOMATION_ANNOTATION,
    AUTOMATION_REASON_ANNOTATION,
    INTAKE_LEASE,
    PAUSE_REASON_ANNOTATION,
    PAUSE_UNTIL_ANNOTATION,
    STORM_BREAKER_ANNOTATION,
    Obj,
)
from workflows.durations import parse_duration
from workflows.pause import (
    DISABLED,
    ENABLED,
    INFINITE,
    Pause,
    PauseScope,
    automation_off,
    breaker_reset,
    breaker_tripped,
    said,
)

NAMESPACE_WORDS = ("namespace", "namespaces", "ns")
POD_WORDS = ("pod", "pods", "po")


@dataclass(frozen=True)
class Target:
    """What a pause is written on: a namespace, a workload (``owner``) or a pod."""

    scope: PauseScope
    name: str
    namespace: str | None = None  # a pod's or a workload's
    owner: OwnerRef | None = None

    def __str__(self) -> str:
        if self.owner is not None:
            return str(self.owner)
        if self.scope is PauseScope.NAMESPACE:
            return f"namespace/{self.name}"
        return f"{self.namespace}/Pod/{self.name}"


def parse_target(text: str, namespace: str) -> Target:
    """``namespace/NAME`` (or ``ns/``), ``pod/NAME``, ``KIND/NAME`` (the kind as kubectl takes
    it) in ``namespace``, or ``NAMESPACE/KIND/NAME``."""
    parts = text.split("/")
    if not all(parts) or len(parts) not in (2, 3):
        raise OpsError(
            f"expected namespace/NAME, pod/NAME, KIND/NAME or NAMESPACE/KIND/NAME, got {text!r}"
        )
    if len(parts) == 3:
        namespace = parts.pop(0)
    word, name = parts
    if word.lower() in NAMESPACE_WORDS:
        if len(text.split("/")) == 3:
            raise OpsError(f"a namespace is not in a namespace: {text!r}")
        return Target(PauseScope.NAMESPACE, name)
    if word.lower() in POD_WORDS:
        return Target(PauseScope.POD, name, namespace)
    owner = OwnerRef(namespace=namespace, kind=kind_of(word), name=name)
    return Target(PauseScope.OWNER, name, namespace, owner)


def until_value(text: str | None, now: datetime) -> str:
    """The ``pause-until`` value for ``--until``: ``infinite`` (also when not given), a duration
    from now (``90m``, ``2h``) or an RFC 3339 time with its zone, written in UTC."""
    if text is None or text.strip().lower() == INFINITE:
        return INFINITE
    until = _until(text, now)
    if until is None:
        raise OpsError(
            f"--until: {text!r} is neither {INFINITE}, a duration (30m, 2h) nor an RFC 3339"
            " time with its zone (2026-12-05T18:00:00Z)"
        )
    if until <= now:
        raise OpsError(f"--until: {text} is not in the future: nothing would be paused")
    return until.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _until(text: str, now: datetime) -> datetime | None:
    with suppress(ValueError):
        return now + parse_duration(text)
    with suppress(ValueError):
        at = datetime.fromisoformat(text)
        return at if at.tzinfo is not None else None
    return None


def annotate(api: ApiClient, target: Target, annotations: dict[str, str | None]) -> Obj:
    """Merge ``annotations`` into the target's (None removes one), as ``kubectl annotate``;
    the object as written."""
    body = {"metadata": {"annotations": annotations}}
    raw: dict[str, Any] = {"_content_type": MERGE_PATCH, "_preload_content": False}
    core = CoreV1Api(api)
    written: Any
    try:
        if target.scope is PauseScope.NAMESPACE:
            written = core.patch_namespace(target.name, body, **raw)
        elif target.scope is PauseScope.POD:
            namespace = target.namespace or "default"
            written = core.patch_namespaced_pod(target.name, namespace, body, **raw)
        else:
            assert target.owner is not None
            where = OWNER_KINDS[target.owner.kind]
            written = CustomObjectsApi(api).patch_namespaced_custom_object(
                where.group, where.version, target.owner.namespace, where.plural,
                target.name, body, **raw,
            )  # fmt: skip
    except ApiException as exc:
        raise _refused(target, exc) from None
    obj: Obj = response_body(written)
    return obj


def _refused(target: Target, exc: ApiException) -> OpsError:
    """The API server's refusal of a read or write of ``target``, as one line."""
    if exc.status == 404:
        return OpsError(f"{target} not found in the cluster")
    return OpsError(f"{target}: the API server refused ({exc.status} {exc.reason})")


def pause_annotations(until: str, reason: str | None) -> dict[str, str | None]:
    """What a pause writes; without a reason, any earlier one is removed (it was another's)."""
    return {PAUSE_UNTIL_ANNOTATION: until, PAUSE_REASON_ANNOTATION: reason or None}


RESUME: dict[str, str | None] = {PAUSE_UNTIL_ANNOTATION: None, PAUSE_REASON_ANNOTATION: None}


def engine_namespace(api: ApiClient) -> str:
    """The namespace holding the intake's Lease (one LIST, by name): where the engine runs."""
    try:
        leases: Any = CoordinationV1Api(api).list_lease_for_all_namespaces(
            field_selector=f"metadata.name={INTAKE_LEASE}", _preload_content=False
        )
    except ApiException as exc:
        raise OpsError(f"leases: the API server refused ({exc.status} {exc.reason})") from None
    found = sorted({i["metadata"]["namespace"] for i in response_body(leases).get("items", [])})
    if len(found) != 1:
        said = f"in {', '.join(found)}" if found else "nowhere"
        raise OpsError(
            f"the intake's Lease {INTAKE_LEASE} is {said}: give --engine-namespace, the"
            " namespace the engine runs in"
        )
    return str(found[0])


def automation(
    api: ApiClient, namespace: str, off: bool | None, reason: str | None
) -> Pause | None:
    """Switch automation ``off`` or on (None: only read it); what the switch says now."""
    target = Target(PauseScope.NAMESPACE, namespace)
    if off is None:
        obj = _read_namespace(api, target)
    else:
        value = DISABLED if off else ENABLED
        reason = (reason or None) if off else None
        obj = annotate(
            api, target, {AUTOMATION_ANNOTATION: value, AUTOMATION_REASON_ANNOTATION: reason}
        )
    return automation_off((namespace, obj["metadata"].get("annotations")))


def breaker(api: ApiClient, namespace: str, reset: bool) -> tuple[Pause | None, str | None]:
    """The storm breaker (``reset``: reset it, recording when); whether it holds, and when it
    was tripped."""
    target = Target(PauseScope.NAMESPACE, namespace)
    if reset:
        obj = annotate(api, target, breaker_reset(datetime.now(UTC)))
    else:
        obj = _read_namespace(api, target)
    annotations = obj["metadata"].get("annotations") or {}
    return breaker_tripped((namespace, annotations)), annotations.get(STORM_BREAKER_ANNOTATION)


def _read_namespace(api: ApiClient, target: Target) -> Obj:
    try:
        read: Any = CoreV1Api(api).read_namespace(target.name, _preload_content=False)
    except ApiException as exc:
        raise _refused(target, exc) from None
    obj: Obj = response_body(read)
    return obj


def covered(rows: list[ops.Row], target: Target, owner: OwnerRef | None) -> list[ops.Row]:
    """The running attempts a pause on ``target`` covers (``owner``: the target's workload, a
    pod's own): each is held where it next acts."""
    running = [r for r in rows if r.status in ("Running", "Held")]
    if target.scope is PauseScope.NAMESPACE:
        return [r for r in running if r.namespace == target.name]
    if owner is None:
        return []
    return [r for r in running if (r.namespace, r.workload) == (owner.namespace, owner.workload)]


def target_owner(api: ApiClient, target: Target, written: Obj) -> OwnerRef | None:
    """The workload a target stands for: itself, or the pod's (up through its ReplicaSet)."""
    if target.scope is not PauseScope.POD:
        return target.owner
    return OwnerLookup(CoreV1Api(api), CustomObjectsApi(api)).owner_of(written)


@dataclass(frozen=True)
class PauseRow:
    """A pause annotation as written on one object, and whether it holds now."""

    target: str  # namespace/shop, shop/Deployment/api, shop/Pod/api-1
    until: str  # the value as written
    reason: str
    state: str  # in force, ended (its time passed), or unreadable (it holds until fixed)

    @property
    def resource_name(self) -> str:
        return self.target

    def as_json(self) -> dict[str, str]:
        return {"target": self.target, "until": self.until, "reason": self.reason,
                "state": self.state}  # fmt: skip


def pauses(api: ApiClient, namespace: str | None, now: datetime) -> list[PauseRow]:
    """Every pause annotation in ``namespace`` (or the cluster): on the namespace, on each
    workload of the nine kinds the cluster serves, on each pod. One LIST per kind."""
    core = CoreV1Api(api)
    raw: dict[str, Any] = {"_preload_content": False}
    found: list[tuple[str, PauseScope, Obj]] = []
    for ns in response_body(core.list_namespace(**raw))["items"]:
        if namespace in (None, ns["metadata"]["name"]):
            found.append((f"namespace/{ns['metadata']['name']}", PauseScope.NAMESPACE, ns))
    for kind, obj in ops.owners_listed(api, namespace):
        meta = obj["metadata"]
        found.append((f"{meta['namespace']}/{kind.value}/{meta['name']}", PauseScope.OWNER, obj))
    pods = (
        core.list_namespaced_pod(namespace, **raw)
        if namespace
        else core.list_pod_for_all_namespaces(**raw)
    )
    for pod in response_body(pods)["items"]:
        meta = pod["metadata"]
        found.append((f"{meta['namespace']}/Pod/{meta['name']}", PauseScope.POD, pod))
    rows = []
    for target, scope, obj in found:
        annotations = obj["metadata"].get("annotations") or {}
        if PAUSE_UNTIL_ANNOTATION not in annotations:
            continue
        _, pause = said((target, annotations), scope, now)
        state = "ended" if pause is None else "in force"
        if pause is not None and pause.problem:
            state = f"unreadable, holds until fixed ({pause.problem})"
        rows.append(PauseRow(target, annotations[PAUSE_UNTIL_ANNOTATION],
                             annotations.get(PAUSE_REASON_ANNOTATION, ""), state))  # fmt: skip
    return rows


def pauses_table(rows: list[PauseRow], wide: bool = False, header: bool = True) -> str:
    body = [(r.target, r.until, r.reason or "-", r.state) for r in rows]
    return ops.columns(("TARGET", "UNTIL", "REASON", "STATE"), body, header)
