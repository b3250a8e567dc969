"""The soak's oracle: what must be 0, one function per invariant (the package's docstring says
what each counts), each reading the ``Evidence`` the story left: the ``Timeline`` read off the
store as it happened, the emulator's journal of requests, the final cluster, the receiver's
notifications, the workers' logs and (for the signals and runs) Temporal."""

from __future__ import annotations

import json
import math
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client

from activities.owners import OWNER_KINDS
from bench.soak.fates import GROWN, MANIFEST, MAX_UNAVAILABLE, PROTECTED_NS, Workload
from sim.apiserver import Request, Store
from sim.scenario import ENGINE_REASONS, owner_key, running_resources
from worker.config import INTAKE_AGENT, WORKER_AGENT
from worker.intake.breaker import TRIPPED
from workflows.contract import (
    API_GROUP,
    DEFAULT_ENGINE_NAMESPACE,
    ROLLBACK_LIMITS_ANNOTATION,
    ROLLBACK_REQUESTS_ANNOTATION,
    ROLLBACK_STATE_ANNOTATION,
    Obj,
)
from workflows.pause import automation_off, breaker_tripped
from workflows.rollback import WORKFLOW_NAME

# What the oracle counts in every cluster; an in-place one also counts ``moreUnavailable``.
INVARIANTS = ("wrongEnd", "lostOrStuck", "doubleRollback", "notNotified", "notifiedTwice",
              "nonLeaderWrites", "nonLeaderSignals", "crossedClusters", "actedWhilePaused",
              "actedInProtected", "reappliedWhileOff", "reappliedWhileTripped")  # fmt: skip
ROLLBACK_KEYS = {ROLLBACK_REQUESTS_ANNOTATION, ROLLBACK_LIMITS_ANNOTATION}
NOTABLE = {"rollingBack", "failedPermanent", "cancelled", "aborted"}
# Modes a run must be there to leave: backedOff waits for the next turn, which the pods' next
# adoption starts.
WAITING = {"monitoring", "rollingBack", "backingOff", "backedOff"}
WRITES = ("POST", "PUT", "PATCH", "DELETE")
KIND_OF_PLURAL = {k.plural: k.kind.value for k in OWNER_KINDS.values()}  # deployments: Deployment
# A write already past its gate as the pause is set still lands: the gate reads the pause right
# before the write, so one in flight (its answer slowed by up to 0.5 s: the ``slow`` fault) is
# no breach. ``actedWhilePaused`` counts the writes from this long after the pause was set.
GATE_GRACE = 1.0
# A pod down for a cause of its own counts against a batch's pace once the batch's LIST could
# have seen it: down at least this long before the engine's write (``moreUnavailable``).
LISTED_BEFORE = 1.0
RESTART_WITHIN = 5.0  # a resize that restarts a container takes its pod down within this
Bad = Callable[[str, str], None]  # (invariant, what was seen): one breach


class Timeline:
    """Read off the store as the story happens, what the invariants need (``sim.scenario``'s
    ``Recorder`` keeps what a person reads instead): each owner's full state at each change and
    the rollbacks published, the Lease holder over time, the engine's Events, each pod's
    readiness and the disruption budgets over an owner's pods, at wall-clock times."""

    def __init__(self) -> None:
        self.states: dict[str, list[tuple[float, Obj | None]]] = defaultdict(list)
        self.holders: list[tuple[float, str]] = []
        self.events: dict[str, list[str]] = defaultdict(list)  # owner -> reasons
        # owner -> (published at, the owner's state then: mode, turn) for each rollback published
        self.rollbacks: dict[str, list[tuple[float, str | None, int | None]]] = defaultdict(list)
        self._last: dict[str, str | None] = {}
        self._published: set[str] = set()  # owners carrying a rollback recommendation now
        self.kinds: dict[tuple[str, str], str] = {}  # (namespace, app label) -> owner kind
        # owner -> pod -> (time, Ready) at each change, and (time, None) when it went
        self.pods: dict[str, dict[str, list[tuple[float, bool | None]]]] = defaultdict(dict)
        # owner -> (time, the maxUnavailable of the disruption budget over its pods; None: none)
        self.budgets: dict[str, list[tuple[float, int | None]]] = defaultdict(list)
        self.automation: list[tuple[float, bool]] = []  # (time, off) as the kill switch changed
        self.breaker: list[tuple[float, bool]] = []  # (time, tripped) as the storm breaker changed

    def __call__(self, kind: str, rtype: Any, obj: Obj) -> None:
        meta = obj.get("metadata") or {}
        if rtype.kind == "Lease":
            holder = (obj.get("spec") or {}).get("holderIdentity") or ""
            if not self.holders or self.holders[-1][1] != holder:
                self.holders.append((time.time(), holder))
            return
        if rtype.kind == "Event" and kind == "ADDED":
            if obj.get("reason") not in ENGINE_REASONS:  # the kubelet's, the controllers'
                return
            involved = obj.get("involvedObject") or {}
            owner = owner_key(*(str(involved.get(k)) for k in ("kind", "namespace", "name")))
            self.events[owner].append(str(obj.get("reason")))
            return
        if rtype.kind == "Pod":
            self._pod(kind, obj)
            return
        if rtype.kind == "PodDisruptionBudget":
            self._budget(kind, obj)
            return
        if rtype.kind == "Namespace" and meta.get("name") == DEFAULT_ENGINE_NAMESPACE:
            engine = (DEFAULT_ENGINE_NAMESPACE, meta.get("annotations"))
            for changes, holds in (
                (self.automation, automation_off(engine) is not None),
                (self.breaker, breaker_tripped(engine) is not None),
            ):
                if not changes or changes[-1][1] != holds:
                    changes.append((time.time(), holds))
            return
        if rtype.kind not in ("Deployment", "StatefulSet"):
            return
        owner = owner_key(rtype.kind, str(meta.get("namespace")), str(meta.get("name")))
        annotations = {} if kind == "DELETED" else (meta.get("annotations") or {})
        if ROLLBACK_REQUESTS_ANNOTATION in annotations and owner not in self._published:
            self._published.add(owner)
            raw_state = annotations.get(ROLLBACK_STATE_ANNOTATION)
            state = json.loads(raw_state) if raw_state else {}
            self.rollbacks[owner].append((time.time(), state.get("mode"), state.get("turn")))
        elif ROLLBACK_REQUESTS_ANNOTATION not in annotations:
            self._published.discard(owner)
        raw = (
            None
            if kind == "DELETED"
            else (meta.get("annotations") or {}).get(ROLLBACK_STATE_ANNOTATION)
        )
        if self._last.get(owner) == raw and owner in self._last:
            return
        self._last[owner] = raw
        self.states[owner].append((time.time(), json.loads(raw) if raw else None))

    def _pod(self, kind: str, pod: Obj) -> None:
        """Whether each pod of an owner is Ready, each time that changes."""
        meta = pod.get("metadata") or {}
        namespace, app = str(meta.get("namespace")), str((meta.get("labels") or {}).get("app"))
        owner_kind = self.kinds.get((namespace, app))
        if owner_kind is None:
            return
        owner = owner_key(owner_kind, namespace, app)
        conditions = (pod.get("status") or {}).get("conditions") or []
        ready = None if kind == "DELETED" else any(
            c.get("type") == "Ready" and c.get("status") == "True" for c in conditions
        )  # fmt: skip
        changes = self.pods[owner].setdefault(str(meta.get("name")), [])
        if not changes or changes[-1][1] != ready:
            changes.append((time.time(), ready))

    def _budget(self, kind: str, pdb: Obj) -> None:
        """The soak's budgets select one owner's pods by its ``app`` label, by maxUnavailable."""
        namespace = str(pdb["metadata"].get("namespace"))
        spec = pdb.get("spec") or {}
        app = str(((spec.get("selector") or {}).get("matchLabels") or {}).get("app"))
        owner_kind = self.kinds.get((namespace, app))
        if owner_kind is not None:
            bound = None if kind == "DELETED" else int(spec["maxUnavailable"])
            self.budgets[owner_key(owner_kind, namespace, app)].append((time.time(), bound))

    def off_since(self, when: float) -> float | None:
        """Since when automation was off at ``when`` (None: it was on)."""
        return _held_since(self.automation, when)

    def tripped_since(self, when: float) -> float | None:
        """Since when the storm breaker was tripped at ``when`` (None: it was not)."""
        return _held_since(self.breaker, when)

    def budget_at(self, owner: str, when: float) -> int | None:
        """The maxUnavailable of the budget over ``owner``'s pods at ``when`` (None: none)."""
        return next((b for t, b in reversed(self.budgets.get(owner, [])) if t <= when), None)

    def held_by(self, who: str, since: float, until: float) -> bool:
        """Whether ``who`` held the Lease at some time in [since, until]."""
        if self.holder_at(since) == who:
            return True
        return any(name == who for at, name in self.holders if since <= at <= until)

    def holder_at(self, when: float) -> str:
        holder = ""
        for at, name in self.holders:
            if at > when:
                break
            holder = name
        return holder


@dataclass
class Evidence:
    """What the story left for the oracle to read, once it has settled."""

    cluster: str
    queue: str
    workloads: list[Workload]
    timeline: Timeline
    journal: list[Request]  # the emulator's, every request with its client and time
    store: Store  # the cluster as it ended
    received: list[tuple[str, Obj]]  # the notifications, with their idempotency keys
    worker_logs: list[Path]

    def run_id(self, w: Workload) -> str:
        return f"rollback/{self.cluster}/{w.ref}"

    def worker_patches(self) -> list[Request]:
        """The workers' PATCHes the API server took, in the journal's order."""
        return self.worker_writes("PATCH")

    def worker_writes(self, method: str) -> list[Request]:
        """The workers' requests of ``method`` the API server took, in the journal's order."""
        return [
            r for r in self.journal
            if r.agent.startswith(WORKER_AGENT) and r.method == method and r.status < 300
        ]  # fmt: skip


# --- wrongEnd, lostOrStuck -------------------------------------------------------------------


def wrong_end(ev: Evidence, w: Workload, in_place: bool) -> str | None:
    """How ``w``'s end differs from its script (mode, turn, reason, its pods' memory), or None."""
    state, fate = w.state(ev.store), w.fate
    if fate.name == "owner-deleted":
        return None if w.owner(ev.store) is None else "owner still there"
    if fate.protected:
        states = [s for _, s in ev.timeline.states.get(w.ref, [])]
        if any(states) or ev.timeline.events.get(w.ref):
            return "a state or an Event in a protected namespace"
    elif fate.mode is None:
        if state is not None:
            return f"state {state.get('mode')}, expected cleared"
        if "RollbackStateCleared" not in ev.timeline.events.get(w.ref, []):
            return "cleared without its RollbackStateCleared Event"
    else:
        if state is None:
            return f"no state, expected {fate.mode}"
        have = (state.get("mode"), state.get("turn"), state.get("failureReason"))
        want = (fate.mode, fate.turn, fate.reason)
        also = (fate.mode, fate.turn, fate.in_place_reason) if in_place else None
        too = (fate.mode, fate.turn, fate.reason_too)
        if have not in (want, also, too):
            return f"{have}, expected {want}"
    memory = sorted(str((r.get("requests") or {}).get("memory"))
                    for p in w.pods(ev.store) for r in running_resources(p).values())  # fmt: skip
    if fate.name == "partial-above":
        want_memory = sorted([GROWN] * (fate.fits or 0) + [MANIFEST])
    elif fate.pods is None:
        want_memory = []
    elif fate.hpa:  # as many as the HPA keeps: each at the fate's memory
        want_memory = [str(fate.pods)] * max(len(memory), 1)
    else:
        want_memory = [fate.pods] * fate.replicas
    return None if memory == want_memory else f"pods {memory}, expected {want_memory}"


def ends(
    ev: Evidence, bad: Bad, runs: dict[str, set[str]], wrong: Callable[[Workload], str | None]
) -> None:
    """``wrongEnd`` (``wrong``: ``wrong_end`` of a workload), and ``lostOrStuck`` from
    Temporal's runs of this cluster (``runs``: each workflow ID's runs' statuses, closed ones
    too) against the scripted fates and the owners' final states: a fate the engine must act on
    that never had a run; a run still going whose fate ends; none going for a fate that does
    not; an owner left in a mode that waits for a next step with no run to take it."""
    for w in ev.workloads:
        said = wrong(w)
        if said:
            bad("wrongEnd", f"{w.ref} ({w.fate.name}): {said}; actions {w.actions}")
        statuses = runs.get(ev.run_id(w), set())
        going = "RUNNING" in statuses
        mode = (w.state(ev.store) or {}).get("mode")
        lost = (
            "never started" if not statuses and not w.fate.protected
            else "still running" if going and w.fate.terminal
            else "not running" if not going and not w.fate.terminal
            else f"left {mode} with no run to go on" if mode in WAITING and not going
            else None
        )  # fmt: skip
        if lost:
            bad("lostOrStuck", f"{w.ref} ({w.fate.name}): {lost}")


# --- doubleRollback --------------------------------------------------------------------------


def double_rollback(ev: Evidence, bad: Bad) -> None:
    """A turn that entered ``rollingBack`` twice, or a rollback published (the rollback
    annotations written onto an owner that had none) twice in one turn, or while its state was
    not ``rollingBack`` (the previous turn's written again)."""
    for ref, states in ev.timeline.states.items():
        # Entered: from another mode or turn (the same state recorded again, as after a worker
        # killed while its decision's record was not yet in the history, is not).
        modes = [((s or {}).get("mode"), (s or {}).get("turn")) for _, s in states]
        entered = Counter(
            turn for i, (mode, turn) in enumerate(modes)
            if mode == "rollingBack" and (i == 0 or modes[i - 1] != (mode, turn))
        )  # fmt: skip
        for turn, times in entered.items():
            if times > 1:
                bad("doubleRollback", f"{ref}: rollingBack {times} times in turn {turn}")
    for ref, published in ev.timeline.rollbacks.items():
        for (mode, turn), times in Counter((m, t) for _, m, t in published).items():
            if mode != "rollingBack":
                bad("doubleRollback", f"{ref}: a rollback published in {mode} turn {turn}")
            elif times > 1:
                bad("doubleRollback", f"{ref}: a rollback published {times} times in turn {turn}")


# --- notNotified, notifiedTwice --------------------------------------------------------------


def notifications(ev: Evidence, bad: Bad) -> None:
    """Each notable transition told once: under one idempotency key, however often it was sent
    (the storm breaker's own notification, which names the verdict that tripped it, aside)."""
    keys: dict[tuple[str, str, int], set[str]] = defaultdict(set)
    for key, body in ev.received:
        if body.get("cluster") != ev.cluster or str(body.get("message")).startswith(TRIPPED):
            continue  # another cluster's, on the same receiver; or the breaker's
        owner = body.get("owner") or {}
        ref = f"{owner.get('namespace')}/{owner.get('kind')}/{owner.get('name')}"
        keys[(ref, str(body.get("transition")), int(body.get("turn") or 0))].add(key)
    for ref, states in ev.timeline.states.items():
        seen = {(s["mode"], s["turn"]) for _, s in states if s and s["mode"] in NOTABLE}
        for mode, turn in seen:
            got = keys.get((ref, mode, turn), set())
            if not got:
                bad("notNotified", f"{ref}: {mode} turn {turn}")
            elif len(got) > 1:
                bad("notifiedTwice", f"{ref}: {mode} turn {turn}: {len(got)} keys")


# --- nonLeaderWrites, nonLeaderSignals -------------------------------------------------------


def non_leader_writes(ev: Evidence, bad: Bad) -> None:
    """A write by an intake while the Lease named another holder (campaigning excepted)."""
    for r in ev.journal:
        if not r.agent.startswith(INTAKE_AGENT) or r.method not in WRITES or "/leases" in r.path:
            continue
        who = r.agent.split("/", 1)[1]
        holder = ev.timeline.holder_at(r.at)
        if holder != who:
            bad("nonLeaderWrites", f"{who} {r.method} {r.path} while {holder!r} led")


async def non_leader_signals(ev: Evidence, client: Any, bad: Bad) -> None:
    """A signal, a start or a control Update from an intake while the Lease named another
    holder. A signal or a start is in the history when the server got it. An Update is there
    when a worker accepted it, which may be long after it was sent (the server keeps it while no
    worker can take it: a worker killed, Temporal restarted): one counts when its intake held
    the Lease at no time from its control's annotation to its acceptance."""
    intakes = {"intake-a", "intake-b"}
    for w in ev.workloads:
        async for run in client.list_workflows(f'WorkflowId = "{ev.run_id(w)}"'):
            handle = client.get_workflow_handle(ev.run_id(w), run_id=run.run_id)
            async for event in handle.fetch_history_events():
                who, update = _sender(event)
                if who not in intakes:
                    continue
                at = event.event_time.ToDatetime().timestamp()
                since = max((t for t in w.controls if t <= at), default=at) if update else at
                if not ev.timeline.held_by(who, since, at):
                    holder = ev.timeline.holder_at(at)
                    bad("nonLeaderSignals", f"{who} signalled {w.ref} while {holder!r} led")


def _sender(event: HistoryEvent) -> tuple[str, bool]:
    """Who sent the signal, the start or the control Update ``event`` records ("" for any other
    event), and whether it is an Update."""
    if event.HasField("workflow_execution_signaled_event_attributes"):
        return event.workflow_execution_signaled_event_attributes.identity, False
    if event.HasField("workflow_execution_started_event_attributes"):
        return event.workflow_execution_started_event_attributes.identity, False
    if event.HasField("workflow_execution_update_accepted_event_attributes"):
        accepted = event.workflow_execution_update_accepted_event_attributes
        return accepted.accepted_request.meta.identity, True
    return "", False


# --- crossedClusters -------------------------------------------------------------------------


async def crossed_clusters(ev: Evidence, client: Client | Any, bad: Bad) -> None:
    """No run crosses clusters: every run named for this cluster carries its cluster's search
    attribute and ran on its task queue, and its workers refused nothing (a refusal is a run of
    another cluster reaching them: ``activities.clusters``)."""
    prefix = f"rollback/{ev.cluster}/"
    async for wf in client.list_workflows(f'WorkflowType = "{WORKFLOW_NAME}"'):
        attrs = {p.key.name: p.value for p in wf.typed_search_attributes}
        ours_by_id = wf.id.startswith(prefix)
        ours_by_attribute = attrs.get("RollbackCluster") == ev.cluster
        if ours_by_id != ours_by_attribute or (ours_by_id and wf.task_queue != ev.queue):
            bad("crossedClusters", f"{wf.id}: {attrs.get('RollbackCluster')} on {wf.task_queue}")
    for log in ev.worker_logs:
        if "ForeignClusterError" in log.read_text(errors="replace"):
            bad("crossedClusters", f"{ev.cluster} {log.name} refused another cluster's run")


# --- actedWhilePaused, actedInProtected ------------------------------------------------------


def acted_while_paused(ev: Evidence, bad: Bad) -> None:
    """An acting write sent from ``GATE_GRACE`` after the pause was set until it ended; from
    the pause itself where it was set right after the step's read, before its write (the
    ``paused-at-gate`` fate: the write, which reads its gate again, must not go)."""
    acted = acting_writes(ev)
    for w in ev.workloads:
        if w.paused is None:
            continue
        start, until = w.paused
        grace = 0.0 if w.fate.paused_in == "gate" else GATE_GRACE
        for at, what in acted.get(w.ref, []):
            if start + grace <= at < until:
                bad("actedWhilePaused", f"{w.ref}: {what} {until - at:.1f}s"
                    " before its pause ended")  # fmt: skip


def reapplied_while_off(ev: Evidence, bad: Bad) -> None:
    """A cut brought back while the kill switch had automation off, from ``GATE_GRACE`` after
    it was switched off."""
    _brought_back_while(
        ev, bad, "reappliedWhileOff", ev.timeline.off_since, "the kill switch's off"
    )


def reapplied_while_tripped(ev: Evidence, bad: Bad) -> None:
    """A cut brought back while the storm breaker was tripped, from ``GATE_GRACE`` after it
    tripped, until the operator reset it."""
    _brought_back_while(
        ev, bad, "reappliedWhileTripped", ev.timeline.tripped_since, "the storm breaker's trip"
    )


def _brought_back_while(
    ev: Evidence, bad: Bad, name: str, held_since: Callable[[float], float | None], what: str
) -> None:
    """A worker's PATCH that brought an owner's cut back: the owner kept it off before (a
    rollback recommendation published on it, or ``failedPermanent``, from the engine's earlier
    PATCHes) and not after (a backoff's end, a clear for a policy gone, a retry over
    ``failedPermanent``). Judged as the PATCH reached the API server (the journal's time): the
    gate reads the hold right before the write, and a write sent before the hold that the
    server serves late (a client that timed out) lands into it, sent past its gate."""
    published: dict[str, bool] = defaultdict(bool)
    modes: dict[str, str | None] = {}
    for r in ev.worker_patches():
        owner = patched_owner(r)
        if owner is None:
            continue
        kept_off = published[owner] or modes.get(owner) == "failedPermanent"
        if ROLLBACK_REQUESTS_ANNOTATION in r.annotations:
            published[owner] = r.annotations[ROLLBACK_REQUESTS_ANNOTATION] is not None
        if ROLLBACK_STATE_ANNOTATION in r.annotations:
            raw = r.annotations[ROLLBACK_STATE_ANNOTATION]
            modes[owner] = json.loads(raw).get("mode") if raw else None
        keeps_off = published[owner] or modes.get(owner) == "failedPermanent"
        since = held_since(r.at)
        if kept_off and not keeps_off and since is not None and r.at >= since + GATE_GRACE:
            bad(name, f"{owner}: its cut brought back ({modes.get(owner)}) {r.at - since:.1f}s"
                f" into {what}")  # fmt: skip


def _held_since(changes: list[tuple[float, bool]], when: float) -> float | None:
    """Since when a cluster-wide hold (``changes``: (time, held) at each change) held at
    ``when`` (None: it did not)."""
    since = None
    for at, held in changes:
        if at > when:
            break
        since = at if held else None
    return since


def patched_owner(r: Request) -> str | None:
    """The owner a request's path names (``apis/GROUP/VERSION/namespaces/NS/KINDS/NAME``), as
    ``owner_key``; None for any other path."""
    parts = r.path.strip("/").split("/")
    if len(parts) != 7 or parts[5] not in KIND_OF_PLURAL:
        return None
    return owner_key(KIND_OF_PLURAL[parts[5]], parts[4], parts[6])


def acting_writes(ev: Evidence) -> dict[str, list[tuple[float, str]]]:
    """Every write of a worker that changes what runs, by owner, from the journal: a rollback
    annotation published or cleared on the owner (the keys a PATCH carries), a pod resized or
    deleted to be recreated (its owner from the pods the timeline saw)."""
    pod_owner = {
        (owner.split("/", 1)[0], pod): owner
        for owner, pods in ev.timeline.pods.items()
        for pod in pods
    }
    acted: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for r in ev.worker_patches():
        if (pod := resized_pod(r)) is not None:
            owner = pod_owner.get(pod)
            if owner is not None:
                acted[owner].append((r.at, f"pod {pod[1]} resized"))
        elif (owner := patched_owner(r)) is not None and ROLLBACK_KEYS & set(r.annotations):
            acted[owner].append((r.at, "rollback annotation written (published or cleared)"))
    for r in ev.worker_writes("DELETE"):
        if (pod := deleted_pod(r)) is not None and (owner := pod_owner.get(pod)) is not None:
            acted[owner].append((r.at, f"pod {pod[1]} deleted to be recreated"))
    return acted


def acted_in_protected(ev: Evidence, bad: Bad) -> None:
    """Engine writes into the protected namespace, but to our own policies (whose status says
    the namespace is protected)."""
    for r in ev.journal:
        engine = r.agent.startswith((WORKER_AGENT, INTAKE_AGENT))
        ours = r.path.startswith(f"/apis/{API_GROUP}/")
        if engine and r.method in WRITES and not ours and f"/namespaces/{PROTECTED_NS}/" in r.path:
            bad("actedInProtected", f"{r.agent} {r.method} {r.path}")


# --- moreUnavailable -------------------------------------------------------------------------


def more_unavailable(ev: Evidence, bad: Bad) -> int:
    """Each time a worker's resize takes a pod down (it lands on a Ready pod, which goes not
    Ready within ``RESTART_WITHIN``: a rollback's or a re-apply's), the owner's pods not Ready
    as it goes down never outnumber the tighter of its ``maxUnavailable`` and the disruption
    budget over its pods then. A restore's delete of a Ready pod (recreated by its controller)
    takes it down too, until a replacement is Ready. Counted: this pod, the others the engine
    took down and not yet Ready again, and any down for a cause of its own (an OOM kill, the
    applier's restart) since ``LISTED_BEFORE`` before the write (the batch's LIST saw it). A pod
    resized twice before it went down (a retry whose first answer was lost) is down once.
    Returns how many take-downs were checked."""
    writes: dict[tuple[str, str], list[tuple[float, bool | None]]] = defaultdict(list)
    for r in ev.worker_patches():  # a resize: the pod goes not Ready (False)
        if (where := resized_pod(r)) is not None:
            writes[where].append((r.at, False))
    for r in ev.worker_writes("DELETE"):  # a delete: the pod goes (None)
        if (where := deleted_pod(r)) is not None:
            writes[where].append((r.at, None))
    checked = 0
    for owner, pods in ev.timeline.pods.items():
        namespace = owner.split("/", 1)[0]
        downs: dict[tuple[str, float], float] = {}  # (pod, went down) -> the write's time
        deletes: set[tuple[str, float]] = set()  # the downs that are deletes
        taken: dict[tuple[str, float], float] = {}  # (pod, went down) -> back (or replaced)
        for pod, changes in pods.items():
            for at, went in sorted(writes.get((namespace, pod), []), key=lambda w: w[0]):
                ready_then = next((r for t, r in reversed(changes) if t <= at), None)
                down = next((t for t, r in changes if t >= at and r is went), None)
                if ready_then and down is not None and down - at < RESTART_WITHIN:
                    downs.setdefault((pod, down), at)
                    if went is None:
                        deletes.add((pod, down))
                    taken[(pod, down)] = (
                        _back_at(changes, down) if went is False else _replaced_at(pods, down)
                    )
        for (pod, down), at in sorted(downs.items(), key=lambda item: item[0][1]):
            checked += 1
            engine = {p for (p, d), up in taken.items() if d <= down < up}
            own = {p for p, changes in pods.items()
                   if _down_since(changes, down) <= at - LISTED_BEFORE}  # fmt: skip
            budget = ev.timeline.budget_at(owner, at)
            allowed = MAX_UNAVAILABLE if budget is None else min(MAX_UNAVAILABLE, budget)
            if len(engine | own | {pod}) > allowed:
                said = "" if budget is None else f" (its budget's maxUnavailable {budget})"
                write = "delete" if (pod, down) in deletes else "resize"
                bad("moreUnavailable", f"{owner}: {pod} taken down at +{down - at:.1f}s after"
                    f" its {write} with {sorted((engine | own) - {pod})} not Ready:"
                    f" {allowed} allowed{said}")  # fmt: skip
    return checked


def resized_pod(request: Request) -> tuple[str, str] | None:
    """(namespace, pod) of a ``pods/resize`` request, None for any other path."""
    parts = request.path.strip("/").split("/")  # api/v1/namespaces/NS/pods/NAME/resize
    if len(parts) == 7 and parts[4] == "pods" and parts[6] == "resize":
        return parts[3], parts[5]
    return None


def deleted_pod(request: Request) -> tuple[str, str] | None:
    """(namespace, pod) of a pod's DELETE, None for any other path."""
    parts = request.path.strip("/").split("/")  # api/v1/namespaces/NS/pods/NAME
    if len(parts) == 6 and parts[4] == "pods":
        return parts[3], parts[5]
    return None


def _replaced_at(pods: dict[str, list[tuple[float, bool | None]]], gone: float) -> float:
    """When a pod deleted at ``gone`` was replaced: the first pod absent then (a new name, or a
    StatefulSet's same one) Ready after it (inf: none yet)."""
    return min(
        (
            next((t for t, r in changes if t > gone and r is True), math.inf)
            for changes in pods.values()
            if next((r for t, r in reversed(changes) if t <= gone), None) is None
        ),
        default=math.inf,
    )


def _back_at(changes: list[tuple[float, bool | None]], down: float) -> float:
    """When a pod down at ``down`` was Ready again, or went (inf: neither yet)."""
    return next((t for t, r in changes if t > down and r is not False), math.inf)


def _down_since(changes: list[tuple[float, bool | None]], when: float) -> float:
    """Since when a pod has been not Ready at ``when`` (created so, or gone down); inf when it
    is Ready or gone then."""
    last = next(((t, r) for t, r in reversed(changes) if t <= when), None)
    return last[0] if last is not None and last[1] is False else math.inf
