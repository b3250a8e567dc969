"""PodDisruptionBudgets over a cohort: read before each paced batch (``activities.resize``).

Used by the ``roll_back`` and ``reapply_recommendation`` activities in ``in-place`` mode (through
``Pace.budget`` and ``Pace.budget_watch``), which take pods down to restart them. A budget is
read as the eviction API reads it: ``status.disruptionsAllowed``, and 0 while its status is
older than its spec (``observedGeneration`` behind ``generation``: "still being processed"). The
tightest budget that selects any pod of the cohort bounds every batch (the safe side, also for
a budget that selects only some of them). A budget whose selector cannot be read is taken as
selecting the cohort (its status still bounds it) and logged: one malformed object holds its
own workload's pace, nothing else. One LIST per batch; a wait for a budget that allows nothing
is a watch of the namespace's budgets, heartbeating.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any

from kubernetes.client import ApiClient, PolicyV1Api
from pydantic import ValidationError

from activities.errors import TransientError
from activities.lookup import body
from activities.resize import Budget, watch_slice
from workflows.contract import Obj
from workflows.policy import LabelSelector

log = logging.getLogger(__name__)


class Budgets:
    def __init__(self, api: ApiClient, namespace: str, heartbeat: Callable[[], None]) -> None:
        self.policy = PolicyV1Api(api)
        self.namespace = namespace
        self.heartbeat = heartbeat
        self.version = ""  # of the last LIST: a wait watches from it

    def tightest(self, pods: list[Obj]) -> Budget | None:
        """The budget selecting any of ``pods`` that allows the fewest disruptions now."""
        listed: Any = self.policy.list_namespaced_pod_disruption_budget(
            self.namespace, _preload_content=False
        )
        found = body(listed)
        self.version = found["metadata"].get("resourceVersion", "")
        labels = [p["metadata"].get("labels") or {} for p in pods]
        budgets = [_read(pdb) for pdb in found.get("items") or [] if _selects(pdb, labels)]
        return min(budgets, key=lambda b: (b.allowed, b.name), default=None)

    def wait(self, held: Budget, timeout: float) -> None:
        """Until a budget of the namespace changes so that ``held`` may allow a disruption
        (the caller reads again), heartbeating; past ``timeout``: transient (retried)."""
        deadline = time.monotonic() + timeout
        while True:
            self.heartbeat()
            if time.monotonic() > deadline:
                raise TransientError(f"{held.said} for {timeout:.0f}s; looking again")
            lister = functools.partial(
                self.policy.list_namespaced_pod_disruption_budget, self.namespace
            )
            for kind, obj in watch_slice(lister, self.version):
                if kind == "ERROR":
                    return  # an expired version: the caller LISTs afresh
                self.version = obj.get("metadata", {}).get("resourceVersion", self.version)
                if kind == "BOOKMARK" or obj.get("metadata", {}).get("name") != held.name:
                    continue
                if kind == "DELETED" or _read(obj).allowed > 0:
                    return
                self.heartbeat()


def _selects(pdb: Obj, labels: list[dict[str, str]]) -> bool:
    selector = (pdb.get("spec") or {}).get("selector")
    if selector is None:
        return False  # policy/v1: no selector selects nothing
    try:
        wanted = LabelSelector.model_validate(selector)
    except ValidationError as exc:
        name = pdb["metadata"].get("name")
        log.warning("PodDisruptionBudget %s: unreadable selector, taken as ours: %s", name, exc)
        return True
    return any(wanted.matches(each) for each in labels)


def _read(pdb: Obj) -> Budget:
    meta, status = pdb["metadata"], pdb.get("status") or {}
    name = meta["name"]
    if int(status.get("observedGeneration") or 0) < int(meta.get("generation") or 1):
        said = f"PodDisruptionBudget {name} allows 0 (its status is older than its spec)"
        return Budget(name, 0, said)
    allowed = int(status.get("disruptionsAllowed") or 0)
    healthy, desired = status.get("currentHealthy", 0), status.get("desiredHealthy", 0)
    said = f"PodDisruptionBudget {name} allows {allowed} ({healthy} healthy, {desired} desired)"
    return Budget(name, allowed, said)
