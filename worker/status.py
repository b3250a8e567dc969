"""The policy status writer: keeps each policy's ``status`` true, and cheap.

It runs in the intake, so only the elected leader writes. What a status says is decided by
``workflows.policy_status`` from what the intake's watches already hold (the policies, and every
owner's labels and stored rollback state from ``worker.workloads``), so computing it costs no
API request, and a restarted intake computes the status it left. It recomputes when a watch
reports a change to what it caches (``changed``), at most once every ``STATUS_PERIOD`` seconds,
and PATCHes ``/status`` only for the policies whose status differs from the stored one: at most
one write per policy per period, whatever the number of workloads (``bench``, "status").
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from kubernetes.client import CustomObjectsApi
from kubernetes.client.exceptions import ApiException
from temporalio.common import MetricMeter

from activities.lookup import read_state
from activities.writes import MERGE_PATCH, transient
from workflows.activity_api import OwnerRef
from workflows.contract import API_GROUP, API_VERSION, ROLLBACK_STATE_ANNOTATION, Mode, Obj
from workflows.policy import AnyPolicy
from workflows.policy_status import (
    PolicyStatus,
    Workload,
    invalid_status,
    status_of,
    tally,
)
from workflows.selection import PROTECTED, PolicyIndex, Protection, WorkloadRef
from workflows.state import OwnerState, PolicyRef

log = logging.getLogger(__name__)

STATUS_PERIOD = 2.0  # seconds between two recomputations (and so between two writes of one policy)
PLURALS = {"RollbackPolicy": "rollbackpolicies", "ClusterRollbackPolicy": "clusterrollbackpolicies"}


@dataclass
class Known:
    """A policy as its watch last showed it: the model (None when invalid), the stored status."""

    ref: PolicyRef
    policy: AnyPolicy | None
    generation: int | None
    stored: PolicyStatus | None
    error: str | None = None


class StatusWriter:
    def __init__(
        self,
        custom: CustomObjectsApi,
        owners: Callable[[], Iterable[tuple[OwnerRef, Obj]]],
        period: float = STATUS_PERIOD,
        meter: MetricMeter = MetricMeter.noop,
        fence: Callable[[], bool] = lambda: True,
        protection: Protection = PROTECTED,
        held: Callable[[OwnerRef], bool] = lambda _: False,
        prometheus: bool = True,
        budget: float | None = None,
        waiting: Callable[[], dict[str, list[str]]] = dict,
    ) -> None:
        self.custom, self.owners, self.period = custom, owners, period
        self.prometheus = prometheus  # whether the worker has a Prometheus (health checks)
        self.budget, self.waiting = budget, waiting  # the Temporal budget, what waits under it
        self.protection = protection
        self.held = held  # whether a pause on a pod of it, on it or on its namespace is in force
        self.fence = fence  # checked before each write: only the acting leader writes
        self._owners_gauge = meter.create_gauge(
            "rollback_owner_workloads", "owners by the policy and mode of their stored state"
        )
        self._since_gauge = meter.create_gauge_float(
            "rollback_mode_since_timestamp_seconds",
            "transition time of the owner longest in each mode (0: none in it)",
        )
        self._exported: set[tuple[str, str]] = set()
        self.writes = 0  # status PATCHes sent
        self.passes = 0  # recomputations
        self._policies: dict[str, Known] = {}
        self._states: dict[str, tuple[str, OwnerState | None]] = {}  # parsed once per change
        self._lock = threading.Lock()
        self._dirty = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- what the intake's watches report ---------------------------------------------------

    def policy_seen(self, obj: Obj, policy: AnyPolicy | None, error: str | None = None) -> None:
        meta = obj["metadata"]
        ref = _ref(obj)
        with self._lock:
            self._policies[str(ref)] = Known(
                ref, policy, meta.get("generation"), PolicyStatus.read(obj.get("status")), error
            )
        self.changed()

    def status_seen(self, obj: Obj) -> None:
        """Only the policy's status changed (most likely by this writer)."""
        with self._lock:
            known = self._policies.get(str(_ref(obj)))
            if known is not None:
                known.stored = PolicyStatus.read(obj.get("status"))
        self.changed()

    def policy_gone(self, obj: Obj) -> None:
        with self._lock:
            self._policies.pop(str(_ref(obj)), None)
        self.changed()

    def changed(self) -> None:
        self._dirty.set()

    # --- lifecycle --------------------------------------------------------------------------

    def start(self) -> StatusWriter:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="policy-status", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._dirty.set()
        if self._thread is not None:
            self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._dirty.wait()
            if self._stop.is_set():
                return
            self._dirty.clear()
            try:
                self.sync()
            except Exception:  # a bug here must not stop the statuses for good
                log.exception("policy status: recomputation failed; retrying")
                self._dirty.set()
            self._stop.wait(self.period)

    # --- one pass -----------------------------------------------------------------------------

    def sync(self, now: datetime | None = None) -> int:
        """Recompute every policy's status and write the ones that changed; returns the count."""
        self.passes += 1
        written = 0
        for known, status in self._due(now or datetime.now(UTC), export=True):
            if self._write(known, status):
                written += 1
        return written

    def pending(self) -> int:
        """How many policies' statuses differ from what is stored (nothing is written): 0 once
        the writer has caught up with everything the watches told it."""
        return len(self._due(datetime.now(UTC)))

    def _due(self, now: datetime, export: bool = False) -> list[tuple[Known, PolicyStatus]]:
        with self._lock:
            known = list(self._policies.values())
        index = PolicyIndex(self.protection)
        for k in known:
            if k.policy is not None:
                index.upsert(k.policy)
        workloads = self._workloads()
        counts = tally(index, workloads)
        if export:
            self._export(workloads)
        waiting = self.waiting() if self.budget is not None else {}
        due = []
        for k in known:
            key = str(k.ref)
            if k.policy is not None:
                status = status_of(
                    k.policy, counts.get(key), k.stored, now, self.prometheus,
                    self.budget, waiting.get(key, ()),
                )  # fmt: skip
            else:
                status = invalid_status(
                    k.error or "invalid", k.generation, counts.get(key), k.stored, now
                )
            if status != k.stored:
                due.append((k, status))
        return due

    def _export(self, workloads: list[Workload]) -> None:
        """``rollback_owner_workloads{policy,mode}`` (bounded by policies x modes: no owner is
        ever a label) and ``rollback_mode_since_timestamp_seconds{mode}``, the transition time
        of the owner longest in each mode (alerts: stuck in rollingBack)."""
        counts: Counter[tuple[str, str]] = Counter()
        oldest: dict[str, float] = {}
        for w in workloads:
            if w.state is None:
                continue
            mode = w.state.mode.value
            counts[(str(w.state.policy or "none"), mode)] += 1
            since = w.state.last_transition_time.timestamp()
            oldest[mode] = min(since, oldest.get(mode, since))
        for policy, mode in self._exported - set(counts):  # gone since the last pass
            self._owners_gauge.set(0, {"policy": policy, "mode": mode})
        for (policy, mode), count in counts.items():
            self._owners_gauge.set(count, {"policy": policy, "mode": mode})
        for mode in {m.value for m in Mode} - set(oldest):
            self._since_gauge.set(0, {"mode": mode})  # 0: no owner in this mode
        for mode, since in oldest.items():
            self._since_gauge.set(since, {"mode": mode})
        self._exported = set(counts)

    def _workloads(self) -> list[Workload]:
        found, seen = [], set()
        for owner, view in self.owners():
            meta = view["metadata"]
            key = str(owner)
            seen.add(key)
            state = self._state(key, view)
            found.append(
                Workload(
                    WorkloadRef(owner.kind, owner.namespace, owner.name, meta.get("labels") or {}),
                    state,
                    state is not None and not state.mode.terminal and self.held(owner),
                )
            )
        for gone in set(self._states) - seen:
            del self._states[gone]
        return found

    def _state(self, key: str, view: Obj) -> OwnerState | None:
        raw = (view["metadata"].get("annotations") or {}).get(ROLLBACK_STATE_ANNOTATION)
        if raw is None:
            self._states.pop(key, None)
            return None
        cached = self._states.get(key)
        if cached is None or cached[0] != raw:
            state, _ = read_state(view)  # unreadable: no state to count
            cached = self._states[key] = (raw, state)
        return cached[1]

    def _write(self, known: Known, status: PolicyStatus) -> bool:
        if not self.fence():
            return False
        ref, body = known.ref, {"status": status.body()}
        plural = PLURALS[ref.kind]
        try:
            if ref.namespace is not None:
                self.custom.patch_namespaced_custom_object_status(
                    API_GROUP, API_VERSION, ref.namespace, plural, ref.name, body,
                    _content_type=MERGE_PATCH,
                )  # fmt: skip
            else:
                self.custom.patch_cluster_custom_object_status(
                    API_GROUP, API_VERSION, plural, ref.name, body, _content_type=MERGE_PATCH
                )
        except Exception as exc:
            if isinstance(exc, ApiException) and exc.status == 404:
                return False  # deleted meanwhile: its watch will say so
            # A merge patch of a status has no precondition: a 409 says "not now", not "no".
            if transient(exc) or (isinstance(exc, ApiException) and exc.status == 409):
                log.warning("policy status: writing %s failed (%s), retrying", ref, exc)
                self._dirty.set()
                return False
            # Refused for good (a schema or RBAC problem): said once, not retried until the
            # status changes again.
            log.error("policy status: the API server refused the status of %s: %s", ref, exc)
            with self._lock:
                known.stored = status
            return False
        self.writes += 1
        with self._lock:
            if self._policies.get(str(ref)) is known:
                known.stored = status  # not rewritten before the watch shows it
        log.debug("policy status: %s updated", ref)
        return True


def _ref(obj: Obj) -> PolicyRef:
    meta, kind = obj["metadata"], obj.get("kind", "")
    namespace = (meta.get("namespace") or "default") if kind == "RollbackPolicy" else None
    return PolicyRef(kind=kind, namespace=namespace, name=meta["name"])
