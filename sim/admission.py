"""The API server's LimitRanger and ResourceQuota admission for pods, as the real plugins answer.

On a pod's create and on its resize (``pods/resize``; the main resource too): a container's
resources beyond a ``LimitRange``'s ``max`` or below its ``min`` (type ``Container``), and a
namespace's compute usage driven past a ``ResourceQuota``'s ``hard`` (``requests.cpu``,
``requests.memory``, ``limits.cpu``, ``limits.memory``, and ``cpu`` and ``memory`` for the
requests), are refused with 403 Forbidden and the plugins' messages:

    pods "web-0" is forbidden: exceeded quota: compute, requested: limits.memory=512Mi,
    used: limits.memory=3584Mi, limited: limits.memory=4Gi
    pods "web-0" is forbidden: maximum memory usage per Container is 1Gi, but limit is 2Gi

A resize is charged its increase only (the quota plugin evaluates the change), so one that
shrinks a pod is never refused. Usage is computed from the pods' specs at the time (a quota
controller always caught up); ``LimitRange`` defaults are applied on create. Left out: quota
scopes and scope selectors, object counts (``pods``, ``count/...``), extended resources; the
LimitRange types ``Pod`` and ``PersistentVolumeClaim``, and ``maxLimitRequestRatio``.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable
from decimal import Decimal

from workflows.contract import Obj
from workflows.quantities import format_decimal, parse_quantity

# The quota keys on pods' compute resources: each names (requests or limits, the resource).
QUOTA_KEYS = {
    "requests.cpu": ("requests", "cpu"),
    "requests.memory": ("requests", "memory"),
    "limits.cpu": ("limits", "cpu"),
    "limits.memory": ("limits", "memory"),
    "cpu": ("requests", "cpu"),
    "memory": ("requests", "memory"),
}
DONE_PHASES = frozenset({"Succeeded", "Failed"})  # a quota stops charging these


class RefusedError(Exception):
    """The admission's answer: 403 Forbidden with ``message`` (the API server's ``Status``)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def admit_pod(
    pod: Obj, old: Obj | None, objects: Callable[[str, str], Iterable[Obj]], create: bool
) -> None:
    """Apply the namespace's LimitRange defaults (on create) and check its LimitRanges and
    ResourceQuotas for ``pod`` (``old``: the stored pod a resize or update replaces).
    ``objects(kind, namespace)`` reads the store. Raises ``RefusedError``."""
    ns = pod["metadata"].get("namespace", "default")
    name = pod["metadata"].get("name", "")
    containers = (pod.get("spec") or {}).get("containers") or []
    limit_ranges = list(objects("LimitRange", ns))
    if create:
        for lr in limit_ranges:
            _default(containers, lr)
    errors = [e for lr in limit_ranges for c in containers for e in _limit_errors(c, lr)]
    if errors:
        joined = errors[0] if len(errors) == 1 else f"[{', '.join(errors)}]"
        raise RefusedError(f'pods "{name}" is forbidden: {joined}')
    quotas = list(objects("ResourceQuota", ns))
    pods = list(objects("Pod", ns)) if quotas else []  # listed once, for every quota
    for quota in quotas:
        _charge(pod, old, quota, pods, name)


def _amount(container: Obj, part: str, resource: str) -> Decimal | None:
    value = ((container.get("resources") or {}).get(part) or {}).get(resource)
    return None if value is None else parse_quantity(str(value))


def _default(containers: list[Obj], lr: Obj) -> None:
    for item in (lr.get("spec") or {}).get("limits") or []:
        if item.get("type") != "Container":
            continue
        for container in containers:
            resources = container.setdefault("resources", {})
            for part, key in (("limits", "default"), ("requests", "defaultRequest")):
                for resource, value in (item.get(key) or {}).items():
                    resources.setdefault(part, {}).setdefault(resource, value)
            for resource, value in (resources.get("limits") or {}).items():
                resources.setdefault("requests", {}).setdefault(resource, value)


# LimitRanger's two constraints on a container: (the bound's key, its word, the part checked
# first and missing is an error, the part checked then, the comparison that breaks the bound).
CONSTRAINTS = (
    ("max", "maximum", "limits", "requests", operator.gt),
    ("min", "minimum", "requests", "limits", operator.lt),
)
WORDS = {"limits": "limit", "requests": "request"}


def _limit_errors(container: Obj, lr: Obj) -> list[str]:
    """LimitRanger's ``maxConstraint`` and ``minConstraint`` for one container: at most one
    error each (the first part missing or past the bound, else the second past it)."""
    errors = []
    given = container.get("resources") or {}
    for item in (lr.get("spec") or {}).get("limits") or []:
        if item.get("type") != "Container":
            continue
        for key, word, first, then, breaks in CONSTRAINTS:
            for resource, bound in (item.get(key) or {}).items():
                said = f"{word} {resource} usage per Container is {bound}"
                edge = parse_quantity(str(bound))
                if _amount(container, first, resource) is None:
                    errors.append(f"{said}.  No {WORDS[first]} is specified")
                    continue
                for part in (first, then):
                    amount = _amount(container, part, resource)
                    if amount is not None and breaks(amount, edge):
                        errors.append(f"{said}, but {WORDS[part]} is {given[part][resource]}")
                        break
    return errors


def _usage(pod: Obj, key: str) -> Decimal:
    part, resource = QUOTA_KEYS[key]
    containers = (pod.get("spec") or {}).get("containers") or []
    return sum((_amount(c, part, resource) or Decimal(0) for c in containers), Decimal(0))


def _charge(pod: Obj, old: Obj | None, quota: Obj, pods: list[Obj], name: str) -> None:
    """The quota plugin: the pod's increase over ``old`` on each hard key, against what the
    namespace's live pods use (``old`` in place of the pod)."""
    hard = {
        k: v for k, v in ((quota.get("spec") or {}).get("hard") or {}).items() if k in QUOTA_KEYS
    }
    if not hard:
        return
    charged = [
        p for p in pods
        if p["metadata"].get("name") != name
        and (p.get("status") or {}).get("phase") not in DONE_PHASES
    ] + ([old] if old is not None else [])  # fmt: skip
    if old is None:
        missing = [
            k for k in sorted(hard)
            for c in (pod.get("spec") or {}).get("containers") or []
            if _amount(c, *QUOTA_KEYS[k]) is None
        ]  # fmt: skip
        if missing:
            quota_name = quota["metadata"]["name"]
            raise RefusedError(
                f'pods "{name}" is forbidden: failed quota: {quota_name}: must specify'
                f" {','.join(dict.fromkeys(missing))}"
            )
    exceeded = {}
    for key, limit in hard.items():
        requested = _usage(pod, key) - (_usage(old, key) if old is not None else Decimal(0))
        used = sum((_usage(p, key) for p in charged), Decimal(0))
        if requested > 0 and used + requested > parse_quantity(str(limit)):
            exceeded[key] = (requested, used, limit)
    if exceeded:
        keys = sorted(exceeded)

        def pretty(i: int) -> str:
            return ",".join(f"{k}={_format(exceeded[k][i])}" for k in keys)

        raise RefusedError(
            f'pods "{name}" is forbidden: exceeded quota: {quota["metadata"]["name"]},'
            f" requested: {pretty(0)}, used: {pretty(1)}, limited: {pretty(2)}"
        )


def _format(amount: Decimal | str) -> str:
    """A quantity as the API prints it: binary suffixes for whole MiB or GiB, else plain."""
    if isinstance(amount, str):
        return amount
    for suffix, size in (("Gi", 2**30), ("Mi", 2**20)):
        if amount >= size and amount % size == 0:
            return f"{amount // size}{suffix}"
    if amount != amount.to_integral_value():
        return f"{format_decimal(amount * 1000)}m"
    return format_decimal(amount)
