"""``python -m bench --only soak [--soak N]``: many workloads, many faults at once, an oracle.

N workloads (default 1,000; the CI test runs 100) across namespaces, two owner kinds
(Deployment, StatefulSet) and both policy kinds, on the simulated cluster, each with a scripted
fate and so a known end (``FATES``). The engine runs as in production, as separate processes:
two workers and two intakes electing a leader on a Lease in the emulator, against the real
Temporal dev server. A fault schedule runs throughout: a worker SIGKILLed (each in turn), the
leading intake SIGKILLed (twice), the leader cut off its Lease for 20 s, its elector stuck in a
renewal past the Lease's expiry, while work falls due (the ``late`` fates applied, the
``cancel-in-cut`` ones annotated) before and after the other intake takes over, Temporal
restarted, the
emulator answering about 10% of the engine's requests with 5xx, 429 or a timeout, 409 to
patches, slow answers, every watch stream cut now and then, and a burst of 503s on one
namespace's pod LISTs through each ``flaky-verdict`` fate's verdict, long enough to drive its
sample from a local activity to a regular one (the fallbacks are counted from the workers' logs).

The oracle, checked once the story has settled, counts what must be 0:

- ``wrongEnd``: a workload whose final mode, turn, failure reason or pods' memory differ from
  its script;
- ``lostOrStuck``: from Temporal's runs of the cluster, closed ones too, against the fates and
  the owners' final states: an attempt that never started, one still running that should have
  ended, or an owner left in a mode that waits for a next step with no run to take it;
- ``doubleRollback``: from the owners' history in the store, a turn that entered ``rollingBack``
  twice, or a rollback published (its annotations written) twice in a turn or outside
  ``rollingBack``;
- ``notNotified`` / ``notifiedTwice``: a notable transition (rollingBack, failedPermanent,
  cancelled, aborted) that no receiver got, or got under two different idempotency keys;
- ``nonLeaderWrites`` / ``nonLeaderSignals``: a write to the API server or a signal (a start,
  a control Update) to a workflow from an intake while the Lease named another holder (the
  emulator records each request's client, from its User-Agent, and the Lease holder over time;
  each signal's identity is in the workflow's history);
- ``actedWhilePaused``: a write of a worker that changes what runs (a rollback annotation
  published or cleared on the owner, one of its pods resized: from the emulator's journal)
  while its pause (``rightsizing.kubex.ai/pause-until``) was in force, from ``GATE_GRACE``
  after it was set (a write already past its gate lands). The ``paused`` fate sets it as its
  window opens, to end after the window; ``paused-infinite`` without an end, lifted by the
  script once the engine's ``RollbackPaused`` Event shows the hold; ``paused-backoff`` as its
  backoff begins, to end after the backoff's end (which must not clear the rollback, and so
  re-apply the cut, before); ``paused-mid-rollback`` (in place) once its paced rollback has a
  pod down, for the next batch to wait;
- ``actedInProtected``: a write by the engine (a worker or an intake, by the User-Agent the
  emulator journals) into ``kube-soak``, a namespace protected by the default patterns that the
  ``protected`` fate's workload lives in and the cluster policy's selector names anyway (our
  policies' status there excepted: it says the namespace is protected);
- ``moreUnavailable`` (a cluster whose engine actuates in place, ``in_place``: the fleet's second
  cluster): a pod taken down by the engine (a rollback's or a re-apply's resize) while the
  owner's pods not Ready then (the engine's, and those down for a cause of their own that the
  batch could see) already reached the tighter of its ``maxUnavailable`` (1, set on every
  owner) and the disruption budget over its pods (the ``budget-held`` fate's: maxUnavailable 0
  from its first window until the engine's ``RollbackPaced`` Event shows the hold, then 1).
  Every container's memory resize policy is ``RestartContainer``, so each Ready pod a resize
  reaches restarts; which pods a worker resized and when comes from the emulator's journal,
  when they were Ready, and the budgets, from the store.

Also printed: faults injected by kind, workloads by outcome, the intakes' relists, the peak RSS
of each process, the wall time.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import yaml
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client

from activities.kubetime import kube_time, parse_kube_time
from bench import CLUSTER
from bench.memory import memory_mib
from sim.apiserver import Fault, KubeEmulator, Request, free_port
from sim.cluster import Behaviour, SimulatedCluster
from sim.devserver import DevServer, die_with_parent
from sim.scenario import ENGINE_REASONS, running_resources
from worker.config import INTAKE_AGENT, WORKER_AGENT, TemporalConfig
from workflows.contract import (
    API_GROUP,
    CONTROL_ANNOTATION,
    PAUSE_REASON_ANNOTATION,
    PAUSE_UNTIL_ANNOTATION,
    ROLLBACK_LIMITS_ANNOTATION,
    ROLLBACK_REQUESTS_ANNOTATION,
    ROLLBACK_STATE_ANNOTATION,
    EventReason,
    Obj,
    recommendation_key,
)
from workflows.durations import parse_duration
from workflows.notify import IDEMPOTENCY_HEADER, NOTIFY_WORKFLOW
from workflows.rollback import WORKFLOW_NAME

MERGE = "application/merge-patch+json"
ROLLBACK_KEYS = {ROLLBACK_REQUESTS_ANNOTATION, ROLLBACK_LIMITS_ANNOTATION}
REC_KEY = recommendation_key("static")
LIMITS_KEY = recommendation_key("static", limits=True)
MANIFEST, HEALTHY, OOM, GROWN, HUGE = "512Mi", "384Mi", "256Mi", "1Gi", "200Ti"
WORKING_SET = "300Mi"
KUBE_TIMEOUT = 3.0
# The intakes wait longer on the API server: in the Lease cut a renewal hangs that long, so the
# cut-off leader's elector is stuck past the Lease's expiry (15 s) and only the fence (its
# renew deadline, 10 s, on its own clock) keeps its other threads from acting.
INTAKE_KUBE_TIMEOUT = 20.0
MAX_UNAVAILABLE = 1  # every owner's rolling-update maxUnavailable (what in-place paces by)
MIN_READY = "2s"  # the workers' --min-ready-duration
PROTECTED_NS = "kube-soak"  # protected by the default patterns (kube-*), named by a policy
NOTABLE = {"rollingBack", "failedPermanent", "cancelled", "aborted"}
# Modes a run must be there to leave: backedOff waits for the next turn, which the pods' next
# adoption starts.
WAITING = {"monitoring", "rollingBack", "backingOff", "backedOff"}
# What the oracle counts in every cluster (the module's docstring); an in-place one also counts
# ``moreUnavailable``.
INVARIANTS = ("wrongEnd", "lostOrStuck", "doubleRollback", "notNotified", "notifiedTwice",
              "nonLeaderWrites", "nonLeaderSignals", "crossedClusters", "actedWhilePaused",
              "actedInProtected")  # fmt: skip
ACTED_IN = ("rollingBack", "backingOff")  # when the policy-changed/-deleted fates act (turn 1)
# Seconds into the Lease cut at which its work falls: while the cut-off leader still holds the
# Lease, past its renew deadline (10 s: it must have stopped acting), and after the Lease has
# expired (15 s) and the other intake has taken it, its elector still stuck in a renewal.
CUT_WORK = (1.0, 8.0, 11.0, 13.0, 17.0, 19.0)
# A write already past its gate as the pause is set still lands: the gate reads the pause right
# before the write, so one in flight (its answer slowed by up to 0.5 s: the ``slow`` fault) is
# no breach. ``actedWhilePaused`` counts the writes from this long after the pause was set.
GATE_GRACE = 1.0
# A pod down for a cause of its own counts against a batch's pace once the batch's LIST could
# have seen it: down at least this long before the engine's write (``moreUnavailable``).
LISTED_BEFORE = 1.0
RESTART_WITHIN = 5.0  # a resize that restarts a container takes its pod down within this


@dataclass(frozen=True, kw_only=True)
class Fate:
    """A workload's script: its recommendation, what happens to it, and its known end (every
    field named where a fate is written)."""

    name: str
    memory: str  # the recommendation's memory request (and limit, unless ``grow_only``)
    mode: str | None  # the end; None: no state (cleared, or the owner deleted)
    turn: int | None = None
    reason: str | None = None
    pods: str | None = MANIFEST  # every pod's memory at the end (None: no pods)
    replicas: int = 1
    grow_only: bool = False  # a request only (the partial-adoption fates)
    fits: int | None = None  # pods of this workload that can grow on its node
    own_policy: bool = False  # a policy of its own (changed or deleted mid-backoff)
    max_attempts: int = 2
    long_window: bool = False  # a window that outlasts the soak (cancel, reopen)
    terminal: bool = True  # its workflow has ended by the end of the soak
    # In place, another reason this end may be given: two actuators (the cluster's applier and
    # the engine's re-apply) each resize the pods they see room for, and the kubelet defers the
    # one the node cannot take after all: ``resizeDeferred`` says the cut did not fit as well.
    in_place_reason: str | None = None
    protected: bool = False  # lives in PROTECTED_NS: never a state, an Event or a rollback
    in_cut: bool = False  # its scripted act (applied, or annotated) falls inside the Lease cut
    # When the script pauses its owner (``Soak._pause``): as its first window opens, as its
    # first backoff begins, or once its first rollback has taken a pod down (in place).
    paused_in: str | None = None
    in_place_only: bool = False  # dealt only where the engine actuates in place
    budget: bool = False  # a disruption budget that allows nothing while it rolls back


# Fates that end as ``oom``'s (turn 2 rolled back, failed for good), or as ``partial-below``'s
# (5 pods, 3 of which can grow: 60% adopted), whatever happens to them on the way.
_as_oom = functools.partial(Fate, memory=OOM, mode="failedPermanent", turn=2, reason="oomKilled")
_as_partial_below = functools.partial(
    Fate,
    memory=GROWN,
    mode="failedPermanent",
    turn=2,
    reason="adoptionThresholdNotMet",
    replicas=5,
    grow_only=True,
    fits=3,
    in_place_reason="resizeDeferred",
)
FATES = [
    Fate(name="healthy", memory=HEALTHY, mode="monitoringSucceeded", turn=1, pods=HEALTHY),
    _as_oom(name="oom"),
    Fate(
        name="partial-above",
        memory=GROWN,
        mode="monitoringSucceeded",
        turn=1,
        replicas=5,
        grow_only=True,
        fits=4,
    ),
    _as_partial_below(name="partial-below"),
    # Running pods cannot grow (filtered, never deleted) and the replacements stay Pending. One
    # turn only (a policy of its own): whether a turn 2 starts depends on whether a replacement
    # is still Pending when the recommendation comes back, a race no script can know the end of.
    Fate(
        name="unschedulable",
        memory=HUGE,
        mode="failedPermanent",
        turn=1,
        reason="unschedulable",
        grow_only=True,
        own_policy=True,
        max_attempts=1,
    ),
    Fate(name="owner-deleted", memory=HEALTHY, mode=None, pods=None),
    Fate(
        name="policy-changed",
        memory=OOM,
        mode="failedPermanent",
        turn=1,
        reason="oomKilled",
        own_policy=True,
    ),
    # Paused on its owner as its first window opens, until after the window: the verdict waits,
    # then rolls back as the oom fate does.
    _as_oom(
        name="paused",
        paused_in="monitoring",
    ),
    # Paused without an end (``infinite``) on its owner as its first window opens; the script
    # lifts the pause once the engine's RollbackPaused Event shows the verdict held. Whichever
    # intake leads then (they are killed and cut off on the way) must resume it.
    _as_oom(
        name="paused-infinite",
        paused_in="monitoring",
    ),
    # Paused as its first backoff begins, until after the backoff's end: the end's clearing of
    # the rollback (which re-applies the cut) waits for the pause, then turn 2 goes as oom's.
    _as_oom(
        name="paused-backoff",
        paused_in="backingOff",
    ),
    # In place, paused once its paced rollback has taken its first pod down: the next batch
    # waits for the pause, then the rollback goes on from where it stopped.
    _as_partial_below(
        name="paused-mid-rollback",
        paused_in="rollingBack",
        in_place_only=True,
    ),
    # In place, a PodDisruptionBudget (maxUnavailable 0) over its pods from its first window
    # on: its rollback holds (RollbackPaced) until the script, seeing that Event, lets the
    # budget allow one (maxUnavailable 1); every later batch is bounded by it.
    _as_partial_below(
        name="budget-held",
        in_place_only=True,
        budget=True,
    ),
    Fate(name="policy-deleted", memory=OOM, mode=None, pods=OOM, own_policy=True),
    Fate(name="cancel", memory=HEALTHY, mode="cancelled", turn=1, pods=HEALTHY, long_window=True),
    Fate(
        name="reopen",
        memory=HEALTHY,
        mode="monitoring",
        turn=1,
        pods=HEALTHY,
        long_window=True,
        terminal=False,
    ),
    # Its scripted act falls while the leader is cut off its Lease, so the deposed leader has
    # work it must not do: applied only then (late), or its cancel annotated only then.
    _as_oom(name="late", in_cut=True),
    Fate(
        name="cancel-in-cut",
        memory=HEALTHY,
        mode="cancelled",
        turn=1,
        pods=HEALTHY,
        long_window=True,
        in_cut=True,
    ),
    # Its namespace's pod LISTs by the workers fail (503) from its window's start until 10 s past
    # its end: the verdict's sample exhausts its local tries and goes on as a regular activity
    # (the fallback), and must still end right.
    Fate(name="flaky-verdict", memory=HEALTHY, mode="monitoringSucceeded", turn=1, pods=HEALTHY),
    # In a protected namespace that the cluster policy's selector names: it OOMs on its cut and
    # nothing rolls it back, since no policy applies there.
    Fate(name="protected", memory=OOM, mode=None, pods=OOM, protected=True),
]


@dataclass
class Workload:
    index: int
    fate: Fate
    namespace: str
    name: str
    kind: str
    policy_kind: str  # which policy kind applies: RollbackPolicy or ClusterRollbackPolicy
    actions: list[str] = field(default_factory=list)  # scripted actions taken
    paused: tuple[float, float] | None = None  # wall times a pause was set and ends
    controls: list[float] = field(default_factory=list)  # when each control was annotated

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.kind}/{self.name}"


def _policy(
    kind: str,
    name: str,
    namespace: str | None,
    selector: Obj,
    window: str,
    backoff: str = "3s",
    max_attempts: int = 2,
    **spec: Any,
) -> Obj:
    """A policy of the soak; ``window`` comfortably longer than the simulated cluster takes to
    resize every pod (its tick slows down with the number of workloads), and a backoff long
    enough for the applier to see the rollback it publishes, so that the script's ends hold: a
    window is a promise about the cluster, not about the engine."""
    return {
        "apiVersion": "rightsizing.kubex.ai/v1alpha1",
        "kind": kind,
        "metadata": {"name": name, **({"namespace": namespace} if namespace else {})},
        "spec": {
            "scope": selector,
            "monitoringPeriod": window,
            "rollbackTarget": "manifest",
            "adoptionThresholdPercent": 80,
            "backoff": {"timePeriod": backoff, "multiplyByTurn": 1, "maxAttempts": max_attempts},
            **spec,
        },
    }


def _manifest(w: Workload, in_place: bool = False) -> Obj:
    """The owner; ``in_place``: its memory resizes restart the container, paced by
    ``MAX_UNAVAILABLE``."""
    selector = {"pool": f"part-{w.name}" if w.fate.fits else "main"}
    labels = {"app": w.name, "policy": "own" if w.fate.own_policy else w.policy_kind}
    if w.fate.long_window:
        labels["policy"] = "long"
    spec: Obj = {
        "replicas": w.fate.replicas,
        "selector": {"matchLabels": {"app": w.name}},
        "template": {
            "metadata": {"labels": {"app": w.name}},
            "spec": {
                "nodeSelector": selector,
                "containers": [
                    {
                        "name": "app",
                        "image": "soak/app:1",
                        "resources": {
                            "requests": {"cpu": "10m", "memory": MANIFEST},
                            "limits": {"memory": MANIFEST if not w.fate.grow_only else "2Gi"},
                        },
                    }
                ],
            },
        },
    }
    if w.kind == "StatefulSet":
        spec["serviceName"] = w.name
    if in_place:
        container = spec["template"]["spec"]["containers"][0]
        container["resizePolicy"] = [
            {"resourceName": "memory", "restartPolicy": "RestartContainer"}
        ]
        pace = {"rollingUpdate": {"maxUnavailable": MAX_UNAVAILABLE}}
        spec["strategy" if w.kind == "Deployment" else "updateStrategy"] = pace
    api_version = "apps/v1"
    return {
        "apiVersion": api_version,
        "kind": w.kind,
        "metadata": {"name": w.name, "namespace": w.namespace, "labels": labels},
        "spec": spec,
    }


def plan(count: int, namespaces: int, in_place: bool = False) -> list[Workload]:
    """Fates dealt round-robin; owner and policy kinds alternate within each fate. In place,
    no ``unschedulable``: an in-place rollback resizes running pods and leaves a Pending one to
    admission, which nothing re-runs there (docs/concepts/activities.md); the ``in_place_only``
    ones only there (the cluster's applier, not the engine, acts on pods otherwise)."""
    fates = [
        f for f in FATES
        if (f.name != "unschedulable" or not in_place) and (in_place or not f.in_place_only)
    ]  # fmt: skip
    workloads = []
    for i in range(count):
        fate = fates[i % len(fates)]
        round_ = i // len(fates)
        workloads.append(
            Workload(
                i,
                fate,
                PROTECTED_NS if fate.protected else f"soak-{i % namespaces:02d}",
                f"{fate.name}-{i}",
                "Deployment" if round_ % 2 == 0 else "StatefulSet",
                "RollbackPolicy"
                if (round_ // 2) % 2 == 0 and not fate.protected
                else "ClusterRollbackPolicy",
            )
        )
    return workloads


class Child:
    """A process of the engine (a worker or an intake), SIGKILLable and restartable."""

    def __init__(self, name: str, command: list[str], log: Path) -> None:
        self.name, self.command, self.log = name, command, log
        self.process: subprocess.Popen[bytes] | None = None
        self.peak_rss_mib = 0.0

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                die_with_parent(self.command), stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )  # fmt: skip

    def sample_rss(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.peak_rss_mib = max(self.peak_rss_mib, peak_rss(self.process.pid))

    def kill(self) -> None:
        self.sample_rss()
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        self.sample_rss()
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()


def peak_rss(pid: int) -> float:
    """VmHWM of ``pid`` in MiB (Linux), 0 when it is gone."""
    try:
        return memory_mib(pid, "VmHWM")
    except OSError:
        return 0.0


class Receiver(BaseHTTPRequestHandler):
    """The notification receiver: every POST, with its idempotency key."""

    received: ClassVar[list[tuple[str, Obj]]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.received.append((self.headers.get(IDEMPOTENCY_HEADER, ""), body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *_: object) -> None:
        pass


class Timeline:
    """Read off the store: each owner's state changes, the Lease holder over time, Events."""

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
            owner = f"{involved.get('namespace')}/{involved.get('kind')}/{involved.get('name')}"
            self.events[owner].append(str(obj.get("reason")))
            return
        if rtype.kind == "Pod":
            self._pod(kind, obj)
            return
        if rtype.kind == "PodDisruptionBudget":
            self._budget(kind, obj)
            return
        if rtype.kind not in ("Deployment", "StatefulSet"):
            return
        owner = f"{meta.get('namespace')}/{rtype.kind}/{meta.get('name')}"
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
        owner = f"{namespace}/{owner_kind}/{app}"
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
            self.budgets[f"{namespace}/{owner_kind}/{app}"].append((time.time(), bound))

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
class SoakResult:
    workloads: int
    invariants: dict[str, int]
    examples: dict[str, list[str]]
    faults: Counter[str]
    outcomes: Counter[str]
    relists: int
    leaders: int  # times the Lease changed hands
    rss: dict[str, float]
    wall: float
    settled: bool
    logs: str | None = None  # where the processes' logs were kept, when it failed
    cluster: str = ""
    fates: int = len(FATES)  # the scripted fates dealt

    @property
    def passed(self) -> bool:
        return self.settled and not any(self.invariants.values())


class Soak:
    def __init__(
        self,
        count: int,
        workdir: Path,
        seed: int = 1,
        cluster: str = CLUSTER,
        temporal: DevServer | None = None,
        restarts_temporal: bool = True,
        in_place: bool = False,
    ) -> None:
        """``cluster``: the cluster it plays; ``temporal``: a dev server its caller runs (a
        fleet: every cluster on one Temporal, the same workload names in each), restarted as a
        fault by this soak only if ``restarts_temporal``; ``in_place``: its engine actuates in
        place (``--actuation in-place``) and its containers restart to resize."""
        self.restarts_temporal = restarts_temporal
        self.in_place = in_place
        self.workdir = workdir
        self.cluster = cluster
        self.namespaces = max(2, min(50, count // 20))
        self.workloads = plan(count, self.namespaces, in_place)
        self.api = KubeEmulator(seed=seed)
        self.sim = SimulatedCluster(
            self.api.store, tick=0.25 if count <= 200 else 0.5, applies_rollbacks=not in_place
        )
        self.window = f"{max(8, count // 40)}s"  # 8s for 100 workloads, 25s for 1,000
        self.backoff = f"{max(3, count // 100)}s"  # 3s for 100, 10s for 1,000
        # The fates that act mid-backoff (policy changed or deleted) get a backoff the script's
        # polling cannot miss however slowly it goes round.
        self.acted_backoff = f"{max(15, count // 50)}s"
        self.timeline = Timeline()
        self.timeline.kinds = {(w.namespace, w.name): w.kind for w in self.workloads}
        self.api.store.listeners.append(self.timeline)
        self.owns_temporal = temporal is None
        self.temporal = temporal or DevServer(
            workdir / "temporal", free_port(), headless=True, log_path=workdir / "temporal.log"
        )
        self.queue = f"soak-{cluster}"
        self.faults: Counter[str] = Counter()
        self.api_faults: list[tuple[str, Fault]] = []
        self.children: dict[str, Child] = {}
        self.due: set[int] = set()  # workloads whose in-cut act is due (``_due``)

    # --- the world ------------------------------------------------------------------------------

    def build(self) -> None:
        store = self.api.store
        store.create(
            {"apiVersion": "v1", "kind": "Node",
             "metadata": {"name": "pool-1", "labels": {"pool": "main"}},
             "status": {"allocatable": {"cpu": "100000", "memory": "100Ti", "pods": "100000"}}}
        )  # fmt: skip
        for ns in sorted({w.namespace for w in self.workloads} | {"default"}):
            store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        store.create(
            _policy("ClusterRollbackPolicy", "soak-cluster", None,
                    {"namespaceSelector": {"operator": "In", "values": ["soak-*", PROTECTED_NS]},
                     "labelSelector": {"matchLabels": {"policy": "ClusterRollbackPolicy"}}},
                    self.window, self.backoff)
        )  # fmt: skip
        for ns in sorted({w.namespace for w in self.workloads}):
            store.create(
                _policy("RollbackPolicy", "soak-ns", ns,
                        {"labelSelector": {"matchLabels": {"policy": "RollbackPolicy"}}},
                        self.window, self.backoff)
            )  # fmt: skip
            store.create(
                _policy("RollbackPolicy", "soak-long", ns,
                        {"labelSelector": {"matchLabels": {"policy": "long"}}}, "1h")
            )  # fmt: skip
        behaviour = {"app": Behaviour(WORKING_SET, startup=0.3)}
        for w in self.workloads:
            if w.fate.fits is not None:  # its own node: ``fits`` pods can grow on it
                grown = 1024 * w.fate.fits + 512 * (w.fate.replicas - w.fate.fits)
                store.create(
                    {"apiVersion": "v1", "kind": "Node",
                     "metadata": {"name": f"part-{w.name}", "labels": {"pool": f"part-{w.name}"}},
                     "status": {"allocatable": {"cpu": "64", "memory": f"{grown}Mi",
                                                "pods": "110"}}}
                )  # fmt: skip
            if w.fate.own_policy:
                store.create(
                    _policy("RollbackPolicy", w.name, w.namespace,
                            {"labelSelector": {"matchLabels": {"app": w.name}}}, self.window,
                            self.acted_backoff, w.fate.max_attempts)
                )  # fmt: skip
            self.sim.add(_manifest(w, self.in_place), behaviour)

    def _engine(self) -> None:
        address, url = self.temporal.address, self.api.url
        # Its own file: a fleet's clusters share the work directory, and a worker restarted
        # after another cluster wrote a shared one would notify that cluster's receiver (which
        # stops answering when that story ends: CI's notNotified of soak-00/.../late-28).
        receivers = self.workdir / f"receivers-{self.cluster}.yaml"
        server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self.receiver = server
        receivers.write_text(
            yaml.safe_dump(
                {
                    "receivers": [
                        {
                            "name": "soak",
                            "minSeverity": "info",
                            "url": f"http://127.0.0.1:{server.server_port}/",
                        }
                    ]
                }
            )
        )
        common = ["--cluster", self.cluster, "--address", address, "--task-queue", self.queue,
                  "--kube-url", url]  # fmt: skip
        # The soak's windows are seconds long: a pod restarted by an in-place resize must not
        # need Kubex's default 10 s of Ready, longer than the 8 s window, to count.
        actuation = ["--min-ready-duration", MIN_READY]
        actuation += ["--actuation", "in-place"] if self.in_place else []
        for name in ("worker-a", "worker-b"):
            self.children[name] = Child(
                name,
                [
                    sys.executable,
                    "-m",
                    "worker",
                    *common,
                    "--kube-timeout",
                    str(KUBE_TIMEOUT),
                    *actuation,
                    "--notifications",
                    str(receivers),
                ],
                self.workdir / f"{self.cluster}-{name}.log",
            )
        for name in ("intake-a", "intake-b"):
            self.children[name] = Child(
                name,
                [sys.executable, "-m", "cli.main", "intake", *common, "--identity", name,
                 "--kube-timeout", str(INTAKE_KUBE_TIMEOUT),
                 "--lease-namespace", "default"],
                self.workdir / f"{self.cluster}-{name}.log",
            )  # fmt: skip
        for child in self.children.values():
            child.start()

    # --- the script -----------------------------------------------------------------------------

    def _owner(self, w: Workload) -> Obj | None:
        store = self.api.store
        try:
            return store.get(store.rtype(w.kind), w.namespace, w.name)
        except Exception:
            return None

    def _state(self, w: Workload) -> Obj | None:
        owner = self._owner(w)
        raw = ((owner or {}).get("metadata", {}).get("annotations") or {}).get(
            ROLLBACK_STATE_ANNOTATION
        )
        return json.loads(raw) if raw else None

    def _apply(self, w: Workload) -> None:
        store, fate = self.api.store, w.fate
        if fate.name == "late" and w.index not in self.due:
            return  # applied by the Lease cut (``_due``)
        limits = (
            {} if fate.grow_only else {LIMITS_KEY: json.dumps({"app": {"memory": fate.memory}})}
        )
        annotations = {REC_KEY: json.dumps({"app": {"memory": fate.memory}}), **limits}
        store.patch(store.rtype(w.kind), w.namespace, w.name,
                    {"metadata": {"annotations": annotations}}, MERGE)  # fmt: skip
        w.actions.append("applied")

    def _annotate(self, w: Workload, value: str) -> None:
        store = self.api.store
        store.patch(store.rtype(w.kind), w.namespace, w.name,
                    {"metadata": {"annotations": {CONTROL_ANNOTATION: value}}}, MERGE)  # fmt: skip
        w.actions.append(value)
        w.controls.append(time.time())

    def _pause_due(self, w: Workload, mode: str | None) -> bool:
        """Whether the moment ``w``'s fate pauses it in has come (its first turn's)."""
        if w.fate.paused_in == "rollingBack":  # once its paced rollback has a pod down
            return mode == "rollingBack" and any(
                not any(c.get("type") == "Ready" and c.get("status") == "True"
                        for c in (p.get("status") or {}).get("conditions") or [])
                for p in self._pods(w)
            )  # fmt: skip
        return mode == w.fate.paused_in

    def _pause(self, w: Workload) -> None:
        """Pause the owner from now until 5 s after the step it holds would have ended (its
        window, its backoff; a batch's restart) (RFC 3339, to the second, rounded down: the
        pause ends no later than that step's earliest end), or until the script lifts it
        (``paused-infinite``)."""
        infinite, now = w.fate.name == "paused-infinite", time.time()
        step, said = {
            "monitoring": (self.window, "owner paused through its verdict"),
            "backingOff": (self.backoff, "owner paused through its backoff's end"),
            "rollingBack": ("3s", "owner paused mid-rollback, in place"),
        }[str(w.fate.paused_in)]
        until = int(now + parse_duration(step).total_seconds() + 5)
        stamp = "infinite" if infinite else kube_time(datetime.fromtimestamp(until, UTC))
        self._annotate_pause(w, {PAUSE_UNTIL_ANNOTATION: stamp, PAUSE_REASON_ANNOTATION: "soak"})
        w.paused = (now, math.inf if infinite else float(until))
        w.actions.append("paused")
        self.faults["owner paused without an end, until lifted" if infinite else said] += 1

    def _told(self, w: Workload, reason: str) -> bool:
        """Whether the engine has told of ``reason`` (an Event) on ``w``'s owner."""
        return any(
            e.get("reason") == reason and (e.get("involvedObject") or {}).get("name") == w.name
            for e in self.api.store.items("Event", w.namespace)
        )

    def _budget(self, w: Workload, max_unavailable: int) -> None:
        """The disruption budget over ``w``'s pods: created allowing none, then loosened."""
        store, name = self.api.store, f"{w.name}-budget"
        if max_unavailable == 0:
            store.create(
                {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                 "metadata": {"name": name, "namespace": w.namespace},
                 "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": w.name}}}}
            )  # fmt: skip
            w.actions.append("budget")
            self.faults["disruption budget allowing nothing through a rollback"] += 1
        else:
            store.patch(store.rtype("PodDisruptionBudget"), w.namespace, name,
                        {"spec": {"maxUnavailable": max_unavailable}}, MERGE)  # fmt: skip
            w.actions.append("budget loosened")

    def _lift_pause(self, w: Workload) -> None:
        """Lift an ``infinite`` pause once the engine's RollbackPaused Event says it held."""
        if self._told(w, EventReason.PAUSED):
            self._annotate_pause(w, {PAUSE_UNTIL_ANNOTATION: None, PAUSE_REASON_ANNOTATION: None})
            assert w.paused is not None
            w.paused = (w.paused[0], time.time())
            w.actions.append("lifted")

    def _annotate_pause(self, w: Workload, annotations: dict[str, str | None]) -> None:
        store = self.api.store
        store.patch(store.rtype(w.kind), w.namespace, w.name,
                    {"metadata": {"annotations": annotations}}, MERGE)  # fmt: skip

    def _fail_pod_lists(self, w: Workload) -> None:
        """503 to the workers' pod LISTs in ``w``'s namespace from now (its window's start) to
        10 s past the window's end: its verdict's sample exhausts its local tries."""
        burst = self.api.inject(Fault(status=503, method="GET", times=None, agent=WORKER_AGENT,
                                      path=rf"^/api/v1/namespaces/{w.namespace}/pods$"))  # fmt: skip
        lasting = parse_duration(self.window).total_seconds() + 10

        def over() -> None:
            with self.api._lock:
                self.api.faults[:] = [f for f in self.api.faults if f is not burst]

        asyncio.get_running_loop().call_later(lasting, over)
        w.actions.append("503 burst")
        self.faults["pod LISTs failing through a verdict (503 burst)"] += 1

    def _shares(self) -> list[list[Workload]]:
        """The ``in_cut`` fates' work, dealt to the Lease cut's moments (``CUT_WORK``)."""
        work = [w for w in self.workloads if w.fate.in_cut]
        return [work[i :: len(CUT_WORK)] for i in range(len(CUT_WORK))]

    def _due(self, workloads: list[Workload]) -> None:
        """Their scripted act is due now: the ``late`` ones applied, the ``cancel-in-cut`` ones
        annotated (now if monitoring, else by ``step`` as they get there)."""
        for w in workloads:
            self.due.add(w.index)
            if w.fate.name == "late" and "applied" not in w.actions:
                self._apply(w)
                self.faults["workloads applied inside the Lease cut"] += 1
            elif (
                w.fate.name == "cancel-in-cut"
                and "cancel" not in w.actions
                and (self._state(w) or {}).get("mode") == "monitoring"
            ):
                self._annotate(w, "cancel")
                self.faults["cancels annotated inside the Lease cut"] += 1

    def _delete_pods(self, w: Workload) -> None:
        store = self.api.store
        for pod in self._pods(w):
            with contextlib.suppress(Exception):  # gone meanwhile
                store.delete(store.rtype("Pod"), w.namespace, pod["metadata"]["name"])
        w.actions.append("pods deleted")

    def _pods(self, w: Workload) -> list[Obj]:
        return [
            p for p in self.api.store.items("Pod", w.namespace)
            if (p["metadata"].get("labels") or {}).get("app") == w.name
        ]  # fmt: skip

    def step(self, w: Workload) -> None:
        """Carry out what ``w``'s script says now, from what the cluster shows."""
        state, fate, done = self._state(w), w.fate.name, set(w.actions)
        mode, turn = (state or {}).get("mode"), (state or {}).get("turn")
        store = self.api.store
        if fate == "unschedulable" and "applied" in done and "pods deleted" not in done:
            self._delete_pods(w)  # replacements are admitted with the recommendation: Pending
        elif fate == "owner-deleted" and mode == "monitoring" and "deleted" not in done:
            store.delete(store.rtype(w.kind), w.namespace, w.name)
            w.actions.append("deleted")
        # From rollingBack on: the backoff reads the policy afresh at its end, so acting this
        # early counts the same, and a backingOff recorded late (its rollback carried across a
        # worker kill) can be over before the script's next round sees it.
        elif fate in ("policy-changed", "policy-deleted") and turn == 1 and mode in ACTED_IN:
            if fate == "policy-changed" and "changed" not in done:
                patch = {"spec": {"backoff": {"maxAttempts": 1}}}
                store.patch(store.rtype("RollbackPolicy"), w.namespace, w.name, patch, MERGE)
                w.actions.append("changed")
            elif fate == "policy-deleted" and "policy deleted" not in done:
                store.delete(store.rtype("RollbackPolicy"), w.namespace, w.name)
                w.actions.append("policy deleted")
        elif w.fate.paused_in and turn == 1 and "paused" not in done and self._pause_due(w, mode):
            self._pause(w)
        elif fate == "paused-infinite" and "paused" in done and "lifted" not in done:
            self._lift_pause(w)
        elif w.fate.budget and mode == "monitoring" and "budget" not in done:
            self._budget(w, 0)
        elif (
            "budget" in done and "budget loosened" not in done and self._told(w, EventReason.PACED)
        ):
            self._budget(w, 1)
        elif fate in ("cancel", "reopen") and mode == "monitoring" and "cancel" not in done:
            self._annotate(w, "cancel")
        elif (
            fate == "cancel-in-cut"
            and mode == "monitoring"
            and "cancel" not in done
            and w.index in self.due
        ):
            self._annotate(w, "cancel")  # (at its moment itself when monitoring by then)
        elif fate == "flaky-verdict" and mode == "monitoring" and "503 burst" not in done:
            self._fail_pod_lists(w)
        elif fate == "reopen" and mode == "cancelled" and "reopen" not in done:
            self._annotate(w, "reopen")

    def settled(self, w: Workload) -> bool:
        """Whether ``w`` has reached the kind of end its script gives (not yet whether right)."""
        state, fate = self._state(w), w.fate
        if fate.name == "owner-deleted":
            return "deleted" in w.actions
        if fate.protected:  # its pods run the cut: the engine has seen what it must leave alone
            return bool(self._pods(w)) and all(
                (r.get("requests") or {}).get("memory") == fate.memory
                for p in self._pods(w) for r in running_resources(p).values()
            )  # fmt: skip
        if fate.mode is None:
            return "policy deleted" in w.actions and state is None
        if state is None:
            return False
        if fate.name == "reopen":
            return "reopen" in w.actions and state["mode"] == "monitoring"
        final = ("monitoringSucceeded", "failedPermanent", "cancelled", "aborted")
        return bool(state["mode"] == fate.mode or state["mode"] in final)

    # --- faults ---------------------------------------------------------------------------------

    def _api_faults(self, on: bool) -> None:
        """About 10% of the engine's requests answered badly, 409 to patches, slow answers."""
        if not on:  # its own faults only (a burst or a partition ends by itself)
            mine = {id(fault) for _, fault in self.api_faults}
            with self.api._lock:
                self.api.faults[:] = [f for f in self.api.faults if id(f) not in mine]
            return
        for kind, fault in (
            ("503", Fault(status=503, times=None, probability=0.04)),
            ("500", Fault(status=500, times=None, probability=0.02)),
            ("429", Fault(status=429, times=None, probability=0.02)),
            ("timeout", Fault(status=None, times=None, probability=0.01, delay=KUBE_TIMEOUT + 1)),
            ("409 on patch", Fault(status=409, method="PATCH", times=None, probability=0.05)),
            ("slow", Fault(status=None, times=None, probability=0.03, delay=0.5)),
        ):
            self.api_faults.append((kind, fault))
            self.api.inject(fault)

    async def _leader(self) -> Child | None:
        """The intake that leads now: it holds the Lease and renewed it in the last 3 s (not a
        dead holder whose Lease has yet to expire); None when none does within 30 s."""
        store = self.api.store
        for _ in range(60):
            with contextlib.suppress(Exception):
                lease = store.get(store.rtype("Lease"), "default", "rightsizing-rollback-intake")
                spec = lease.get("spec") or {}
                renewed = parse_kube_time(spec.get("renewTime"))
                child = self.children.get(spec.get("holderIdentity") or "")
                fresh = renewed is not None and time.time() - renewed.timestamp() < 3
                if child is not None and fresh:
                    return child
            await asyncio.sleep(0.5)
        return None

    async def _faults(self, length: float) -> None:
        """The schedule, spread over ``length`` seconds."""
        at = {
            0.10: "api faults on",
            0.20: "kill worker-a",
            0.35: "kill leading intake",
            0.42: "cut the leader off its Lease",
            0.50: "restart temporal",
            0.65: "kill worker-b",
            0.80: "kill leading intake",
            1.00: "api faults off",
        }
        began, cuts = time.monotonic(), 0
        for fraction, what in sorted(at.items()):
            while time.monotonic() - began < fraction * length:
                await asyncio.sleep(0.5)
                if time.monotonic() - began > (cuts + 1) * length / 6:
                    cuts += 1
                    self.api.store.drop_watches()
                    self.faults["watch streams cut"] += 1
                for child in self.children.values():
                    child.sample_rss()
            await self._fault(what)

    async def _fault(self, what: str) -> None:
        if what == "api faults on":
            self._api_faults(True)
        elif what == "api faults off":
            self._api_faults(False)
        elif what.startswith("kill worker"):
            child = self.children[what.removeprefix("kill ")]
            child.kill()
            self.faults["worker SIGKILL"] += 1
            await asyncio.sleep(3)
            child.start()
        elif what == "kill leading intake":
            leader = await self._leader()
            if leader is not None:
                leader.kill()
                self.faults["leading intake SIGKILL"] += 1
                await asyncio.sleep(18)  # past the Lease (15 s): the other intake takes over
                leader.start()
        elif what == "cut the leader off its Lease":
            # Alive and able to write everything else, it cannot renew: its renewals hang, past
            # the Lease's expiry (``INTAKE_KUBE_TIMEOUT``), so its elector cannot step down in
            # time; the fence alone must keep it from acting once the other intake may lead.
            shares = self._shares()
            leader = await self._leader()
            if leader is None:  # said, so a test can require the cut; its work is done anyway
                self.faults["Lease cut skipped: no leader"] += 1
                self._due([w for share in shares for w in share])
                return
            partition = self.api.inject(
                Fault(status=None, path="/leases/", times=None, delay=INTAKE_KUBE_TIMEOUT + 2,
                      agent=f"{INTAKE_AGENT}/{leader.name}")
            )  # fmt: skip
            self.faults["leader cut off its Lease (20s)"] += 1
            began = time.monotonic()
            for at, share in zip(CUT_WORK, shares, strict=True):  # each share due at its moment
                await asyncio.sleep(max(0.0, at - (time.monotonic() - began)))
                self._due(share)
            await asyncio.sleep(20 - CUT_WORK[-1])
            with self.api._lock:
                self.api.faults.remove(partition)
        elif what == "restart temporal" and self.restarts_temporal:
            await asyncio.to_thread(self.temporal.stop)
            self.faults["Temporal restart"] += 1
            await asyncio.sleep(3)
            await asyncio.to_thread(self.temporal.start)

    # --- the run --------------------------------------------------------------------------------

    async def run(self, deadline: float) -> SoakResult:
        began = time.monotonic()
        self.build()
        self.api.start()
        self.sim.start()
        if self.owns_temporal:
            await asyncio.to_thread(self.temporal.start)
        self._engine()
        # Connected once the faults are over (one of them restarts Temporal).
        client: Client | None = None
        spread = min(30.0, 0.03 * len(self.workloads) + 5)
        fault_window = spread + 40.0
        faults = asyncio.create_task(self._faults(fault_window))
        applied = 0
        still_since: float | None = None
        settled, said = False, time.monotonic()
        while time.monotonic() - began < deadline:
            elapsed = time.monotonic() - began
            while applied < len(self.workloads) and elapsed >= applied * spread / len(
                self.workloads
            ):
                self._apply(self.workloads[applied])
                applied += 1
            for w in self.workloads[:applied]:
                self.step(w)
            waiting = [w for w in self.workloads if not self.settled(w)]
            if time.monotonic() - said > 10:
                said = time.monotonic()
                sample = [(w.ref, (self._state(w) or {}).get("mode"), w.actions) for w in waiting]
                done = len(self.workloads) - len(waiting)
                print(f"soak: {elapsed:.0f}s, {done}/{len(self.workloads)} at their end;"
                      f" waiting for e.g. {sample[:3]}", file=sys.stderr, flush=True)  # fmt: skip
            if faults.done() and not waiting:
                last = max((t for s in self.timeline.states.values() for t, _ in s), default=0.0)
                still_since = still_since or time.monotonic()
                client = client or await self._connect()
                if (
                    time.time() - last > 5
                    and time.monotonic() - still_since > 3
                    and not await self._notifying(client)
                ):
                    settled = True
                    break
            else:
                still_since = None
            await asyncio.sleep(0.5)
        if not faults.done():
            faults.cancel()
            self._api_faults(False)
        for child in self.children.values():
            child.sample_rss()
        client = client or await self._connect()
        try:
            return await self._verdict(client, time.monotonic() - began, settled)
        finally:
            for child in self.children.values():
                child.stop()
            if self.owns_temporal:
                await asyncio.to_thread(self.temporal.stop)
            self.receiver.shutdown()
            self.sim.stop()
            self.api.stop()

    async def _connect(self) -> Client:
        return await TemporalConfig.at(self.temporal.address, self.queue).connect()

    async def _notifying(self, client: Client) -> int:
        """This cluster's notifications still being sent: a receiver that timed out is tried
        again (``workflows.notify``), so the story has not settled until each has ended."""
        query = (
            f'WorkflowType = "{NOTIFY_WORKFLOW}" AND ExecutionStatus = "Running"'
            f' AND RollbackCluster = "{self.cluster}"'
        )
        return (await client.count_workflows(query)).count

    # --- the oracle -----------------------------------------------------------------------------

    def _wrong_end(self, w: Workload) -> str | None:
        state, fate = self._state(w), w.fate
        if fate.name == "owner-deleted":
            return None if self._owner(w) is None else "owner still there"
        if fate.protected:
            states = [s for _, s in self.timeline.states.get(w.ref, [])]
            if any(states) or self.timeline.events.get(w.ref):
                return "a state or an Event in a protected namespace"
        elif fate.mode is None:
            if state is not None:
                return f"state {state.get('mode')}, expected cleared"
            if "RollbackStateCleared" not in self.timeline.events.get(w.ref, []):
                return "cleared without its RollbackStateCleared Event"
        else:
            if state is None:
                return f"no state, expected {fate.mode}"
            have = (state.get("mode"), state.get("turn"), state.get("failureReason"))
            want = (fate.mode, fate.turn, fate.reason)
            also = (fate.mode, fate.turn, fate.in_place_reason) if self.in_place else None
            if have not in (want, also):
                return f"{have}, expected {want}"
        memory = sorted(str((r.get("requests") or {}).get("memory"))
                        for p in self._pods(w) for r in running_resources(p).values())  # fmt: skip
        if fate.name == "partial-above":
            want_memory = sorted([GROWN] * (fate.fits or 0) + [MANIFEST])
        elif fate.pods is None:
            want_memory = []
        else:
            want_memory = [fate.pods] * fate.replicas
        return None if memory == want_memory else f"pods {memory}, expected {want_memory}"

    async def _verdict(self, client: Client, wall: float, settled: bool) -> SoakResult:
        examples: dict[str, list[str]] = defaultdict(list)
        counts: Counter[str] = Counter()

        def bad(kind: str, what: str) -> None:
            counts[kind] += 1
            if len(examples[kind]) < 5:
                examples[kind].append(what)

        runs: dict[str, set[str]] = defaultdict(set)  # workflow ID -> its runs' statuses
        async for wf in client.list_workflows(
            f'WorkflowType = "{WORKFLOW_NAME}" AND RollbackCluster = "{self.cluster}"'
        ):
            runs[wf.id].add(wf.status.name if wf.status else "UNKNOWN")
        outcomes: Counter[str] = Counter()
        for w in self.workloads:
            outcomes[(self._state(w) or {}).get("mode") or "no state"] += 1
        self._ends(bad, runs)
        self._rollbacks(bad)
        self._notifications(bad)
        self._writes(bad)
        self._paused(bad)
        self._protected(bad)
        restarting = self._unavailable(bad) if self.in_place else 0
        await self._signals(client, bad)
        await self._crossed(client, bad)
        relists = sum(
            1 for r in self.api.journal
            if r.agent.startswith(INTAKE_AGENT) and r.verb == "list"
        )  # fmt: skip
        faults = self.faults + Counter(
            {kind: fault.hits for kind, fault in self.api_faults if fault.hits}
        )
        if restarting:
            faults["pods taken down by the engine's in-place resizes (checked)"] = restarting
        fallbacks = sum(  # each logged by the workflow (``RollbackWorkflow._activity``)
            child.log.read_text(errors="replace").count("kept failing locally")
            for name, child in self.children.items() if name.startswith("worker")
        )  # fmt: skip
        if fallbacks:
            faults["local activities gone on as regular ones (fallback)"] = fallbacks
        names = (*INVARIANTS, *(("moreUnavailable",) if self.in_place else ()))
        return SoakResult(
            len(self.workloads),
            {n: counts[n] for n in names},
            dict(examples),
            faults,
            outcomes,
            relists,
            sum(1 for _, holder in self.timeline.holders[1:] if holder),
            {n: c.peak_rss_mib for n, c in self.children.items()} | {"soak": peak_rss(os.getpid())},
            wall,
            settled,
            cluster=self.cluster,
            fates=len({w.fate.name for w in self.workloads}),
        )

    def _ends(self, bad: Any, runs: dict[str, set[str]]) -> None:
        """``wrongEnd``, and ``lostOrStuck`` from Temporal's runs of this cluster (``runs``: each
        workflow ID's runs' statuses, closed ones too) against the scripted fates and the owners'
        final states: a fate the engine must act on that never had a run; a run still going
        whose fate ends; none going for a fate that does not; an owner left in a mode that waits
        for a next step (monitoring, rollingBack, backingOff) with no run to take it."""
        for w in self.workloads:
            wrong = self._wrong_end(w)
            if wrong:
                bad("wrongEnd", f"{w.ref} ({w.fate.name}): {wrong}; actions {w.actions}")
            statuses = runs.get(self._id(w), set())
            going = "RUNNING" in statuses
            mode = (self._state(w) or {}).get("mode")
            lost = (
                "never started" if not statuses and not w.fate.protected
                else "still running" if going and w.fate.terminal
                else "not running" if not going and not w.fate.terminal
                else f"left {mode} with no run to go on" if mode in WAITING and not going
                else None
            )  # fmt: skip
            if lost:
                bad("lostOrStuck", f"{w.ref} ({w.fate.name}): {lost}")

    def _rollbacks(self, bad: Any) -> None:
        """``doubleRollback``: a turn that entered ``rollingBack`` twice, or a rollback published
        (the rollback annotations written onto an owner that had none) twice in one turn, or
        while its state was not ``rollingBack`` (the previous turn's written again)."""
        for ref, states in self.timeline.states.items():
            # Entered: from another mode or turn (the same state recorded again, as after a
            # worker killed while its decision's record was not yet in the history, is not).
            modes = [((s or {}).get("mode"), (s or {}).get("turn")) for _, s in states]
            entered = Counter(
                turn for i, (mode, turn) in enumerate(modes)
                if mode == "rollingBack" and (i == 0 or modes[i - 1] != (mode, turn))
            )  # fmt: skip
            for turn, times in entered.items():
                if times > 1:
                    bad("doubleRollback", f"{ref}: rollingBack {times} times in turn {turn}")
        for ref, published in self.timeline.rollbacks.items():
            for (mode, turn), times in Counter((m, t) for _, m, t in published).items():
                if mode != "rollingBack":
                    bad("doubleRollback", f"{ref}: a rollback published in {mode} turn {turn}")
                elif times > 1:
                    bad(
                        "doubleRollback",
                        f"{ref}: a rollback published {times} times in turn {turn}",
                    )

    def _paused(self, bad: Any) -> None:
        acted = self._acting_writes()
        for w in self.workloads:
            if w.paused is None:
                continue
            start, until = w.paused
            for at, what in acted.get(w.ref, []):
                if start + GATE_GRACE <= at < until:
                    bad("actedWhilePaused", f"{w.ref}: {what} {until - at:.1f}s"
                        " before its pause ended")  # fmt: skip

    def _acting_writes(self) -> dict[str, list[tuple[float, str]]]:
        """Every write of a worker that changes what runs, by owner, from the emulator's
        journal: a rollback annotation published or cleared on the owner (the keys a PATCH
        carries), a pod resized (its owner from the pods the timeline saw)."""
        kinds = {"deployments": "Deployment", "statefulsets": "StatefulSet"}
        pod_owner = {
            (owner.split("/", 1)[0], pod): owner
            for owner, pods in self.timeline.pods.items()
            for pod in pods
        }
        acted: dict[str, list[tuple[float, str]]] = defaultdict(list)
        for r in self._worker_patches():
            parts = r.path.strip("/").split("/")  # apis/apps/v1/namespaces/NS/KINDS/NAME
            if (pod := _resized_pod(r)) is not None:
                owner = pod_owner.get(pod)
                if owner is not None:
                    acted[owner].append((r.at, f"pod {pod[1]} resized"))
            elif len(parts) == 7 and parts[5] in kinds and ROLLBACK_KEYS & set(r.annotations):
                owner = f"{parts[4]}/{kinds[parts[5]]}/{parts[6]}"
                acted[owner].append((r.at, "rollback annotation written (published or cleared)"))
        return acted

    def _worker_patches(self) -> list[Request]:
        """The workers' PATCHes the API server took, in the emulator's journal's order."""
        return [
            r for r in list(self.api.journal)
            if r.agent.startswith(WORKER_AGENT) and r.method == "PATCH" and r.status < 300
        ]  # fmt: skip

    def _protected(self, bad: Any) -> None:
        """Engine writes into the protected namespace, but to our own policies (whose status
        says the namespace is protected)."""
        for r in list(self.api.journal):
            engine = r.agent.startswith((WORKER_AGENT, INTAKE_AGENT))
            writes = r.method in ("POST", "PUT", "PATCH", "DELETE")
            ours = r.path.startswith(f"/apis/{API_GROUP}/")
            if engine and writes and not ours and f"/namespaces/{PROTECTED_NS}/" in r.path:
                bad("actedInProtected", f"{r.agent} {r.method} {r.path}")

    def _unavailable(self, bad: Any) -> int:
        """``moreUnavailable``: each time a worker's resize takes a pod down (it lands on a Ready
        pod, which goes not Ready within ``RESTART_WITHIN``: a rollback's or a re-apply's), the
        owner's pods not Ready as it goes down never outnumber the tighter of its
        ``maxUnavailable`` and the disruption budget over its pods then. Counted: this pod, the
        others the engine took down and not yet Ready again, and any down for a cause of its
        own (an OOM kill, the applier's restart) since ``LISTED_BEFORE`` before the write (the
        batch's LIST saw it). A pod resized twice before it went down (a retry whose first
        answer was lost) is down once. Returns how many take-downs were checked."""
        resized: dict[tuple[str, str], list[float]] = defaultdict(list)
        for r in self._worker_patches():
            if (where := _resized_pod(r)) is not None:
                resized[where].append(r.at)
        checked = 0
        for owner, pods in self.timeline.pods.items():
            namespace = owner.split("/", 1)[0]
            downs: dict[tuple[str, float], float] = {}  # (pod, went down) -> the write's time
            for pod, changes in pods.items():
                for at in sorted(resized.get((namespace, pod), [])):
                    ready_then = next((r for t, r in reversed(changes) if t <= at), None)
                    down = next((t for t, r in changes if t >= at and r is False), None)
                    if ready_then and down is not None and down - at < RESTART_WITHIN:
                        downs.setdefault((pod, down), at)
            taken = {(pod, down): _back_at(pods[pod], down) for pod, down in downs}
            for (pod, down), at in sorted(downs.items(), key=lambda item: item[0][1]):
                checked += 1
                engine = {p for (p, d), up in taken.items() if d <= down < up}
                own = {p for p, changes in pods.items()
                       if _down_since(changes, down) <= at - LISTED_BEFORE}  # fmt: skip
                budget = self.timeline.budget_at(owner, at)
                allowed = MAX_UNAVAILABLE if budget is None else min(MAX_UNAVAILABLE, budget)
                if len(engine | own | {pod}) > allowed:
                    said = "" if budget is None else f" (its budget's maxUnavailable {budget})"
                    bad("moreUnavailable", f"{owner}: {pod} taken down at +{down - at:.1f}s after"
                        f" its resize with {sorted((engine | own) - {pod})} not Ready:"
                        f" {allowed} allowed{said}")  # fmt: skip
        return checked

    def _id(self, w: Workload) -> str:
        return f"rollback/{self.cluster}/{w.ref}"

    async def _crossed(self, client: Client, bad: Any) -> None:
        """No run crosses clusters: every run named for this cluster carries its cluster's
        search attribute and ran on its task queue, and its workers refused nothing (a refusal
        is a run of another cluster reaching them: ``activities.clusters``)."""
        prefix = f"rollback/{self.cluster}/"
        async for wf in client.list_workflows(f'WorkflowType = "{WORKFLOW_NAME}"'):
            attrs = {p.key.name: p.value for p in wf.typed_search_attributes}
            ours_by_id = wf.id.startswith(prefix)
            ours_by_attribute = attrs.get("RollbackCluster") == self.cluster
            if ours_by_id != ours_by_attribute or (ours_by_id and wf.task_queue != self.queue):
                bad(
                    "crossedClusters", f"{wf.id}: {attrs.get('RollbackCluster')} on {wf.task_queue}"
                )
        for name, child in self.children.items():
            if name.startswith("worker") and "ForeignClusterError" in child.log.read_text():
                bad("crossedClusters", f"{self.cluster} {name} refused another cluster's run")

    def _notifications(self, bad: Any) -> None:
        keys: dict[tuple[str, str, int], set[str]] = defaultdict(set)
        for key, body in Receiver.received:
            if body.get("cluster") != self.cluster:
                continue  # another cluster's, on the same receiver
            owner = body.get("owner") or {}
            ref = f"{owner.get('namespace')}/{owner.get('kind')}/{owner.get('name')}"
            keys[(ref, str(body.get("transition")), int(body.get("turn") or 0))].add(key)
        for ref, states in self.timeline.states.items():
            seen = {(s["mode"], s["turn"]) for _, s in states if s and s["mode"] in NOTABLE}
            for mode, turn in seen:
                got = keys.get((ref, mode, turn), set())
                if not got:
                    bad("notNotified", f"{ref}: {mode} turn {turn}")
                elif len(got) > 1:
                    bad("notifiedTwice", f"{ref}: {mode} turn {turn}: {len(got)} keys")

    def _writes(self, bad: Any) -> None:
        for r in list(self.api.journal):
            if not r.agent.startswith(INTAKE_AGENT) or r.method not in (
                "POST",
                "PUT",
                "PATCH",
                "DELETE",
            ):
                continue
            if "/leases" in r.path:
                continue  # campaigning for the Lease is every candidate's right
            who = r.agent.split("/", 1)[1]
            holder = self.timeline.holder_at(r.at)
            if holder != who:
                bad("nonLeaderWrites", f"{who} {r.method} {r.path} while {holder!r} led")

    async def _signals(self, client: Client, bad: Any) -> None:
        """``nonLeaderSignals``: a signal, a start or a control Update from an intake while the
        Lease named another holder. A signal or a start is in the history when the server got
        it. An Update is there when a worker accepted it, which may be long after it was sent
        (the server keeps it while no worker can take it: a worker killed, Temporal restarted):
        one counts when its intake held the Lease at no time from its control's annotation to
        its acceptance."""
        intakes = {"intake-a", "intake-b"}
        for w in self.workloads:
            async for run in client.list_workflows(f'WorkflowId = "{self._id(w)}"'):
                handle = client.get_workflow_handle(self._id(w), run_id=run.run_id)
                async for event in handle.fetch_history_events():
                    who, update = _sender(event)
                    if who not in intakes:
                        continue
                    at = event.event_time.ToDatetime().timestamp()
                    since = max((t for t in w.controls if t <= at), default=at) if update else at
                    if not self.timeline.held_by(who, since, at):
                        holder = self.timeline.holder_at(at)
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


async def soak(
    count: int, deadline: float = 900.0, seed: int = 1, in_place: bool = False
) -> SoakResult:
    """One cluster's soak; ``in_place``: its engine actuates in place (``moreUnavailable``)."""
    Receiver.received = []
    # A client that gave up on a slow answer (an injected timeout) hangs up: expected here.
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)
    with tempfile.TemporaryDirectory(prefix="rollback-soak-") as tmp:
        result = await Soak(count, Path(tmp), seed, in_place=in_place).run(deadline)
        if not result.passed:  # the processes' logs, and Temporal's histories, outlive the run
            result.logs = tempfile.mkdtemp(prefix="rollback-soak-logs-")
            for log_file in Path(tmp).glob("*.log"):
                shutil.copy(log_file, result.logs)
            # `rollbackctl dev-server --data-dir <logs>/temporal` serves them again to read
            shutil.copytree(Path(tmp) / "temporal", Path(result.logs) / "temporal")
        return result


async def soak_fleet(count: int, clusters: int = 2, deadline: float = 900.0) -> list[SoakResult]:
    """The soak in ``clusters`` clusters at once, ``count`` workloads each with the same names,
    on one Temporal (restarted by the first cluster's script): each cluster's oracle, plus
    ``crossedClusters``. Every second cluster actuates in place (``moreUnavailable``)."""
    Receiver.received = []
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)
    with tempfile.TemporaryDirectory(prefix="rollback-soak-fleet-") as tmp:
        server = DevServer(
            Path(tmp) / "temporal", free_port(), headless=True, log_path=Path(tmp) / "temporal.log"
        )
        await asyncio.to_thread(server.start)
        try:
            soaks = [
                Soak(count, Path(tmp), seed=i + 1, cluster=f"soak-{i}", temporal=server,
                     restarts_temporal=i == 0, in_place=i % 2 == 1)
                for i in range(clusters)
            ]  # fmt: skip
            results = list(await asyncio.gather(*(s.run(deadline) for s in soaks)))
        finally:
            await asyncio.to_thread(server.stop)
        if not all(r.passed for r in results):
            logs = tempfile.mkdtemp(prefix="rollback-soak-fleet-logs-")
            for log_file in Path(tmp).glob("*.log"):
                shutil.copy(log_file, logs)
            for r in results:
                r.logs = logs
        return results


def _resized_pod(request: Request) -> tuple[str, str] | None:
    """(namespace, pod) of a ``pods/resize`` request, None for any other path."""
    parts = request.path.strip("/").split("/")  # api/v1/namespaces/NS/pods/NAME/resize
    if len(parts) == 7 and parts[4] == "pods" and parts[6] == "resize":
        return parts[3], parts[5]
    return None


def _back_at(changes: list[tuple[float, bool | None]], down: float) -> float:
    """When a pod down at ``down`` was Ready again, or went (inf: neither yet)."""
    return next((t for t, r in changes if t > down and r is not False), math.inf)


def _down_since(changes: list[tuple[float, bool | None]], when: float) -> float:
    """Since when a pod has been not Ready at ``when`` (created so, or gone down); inf when it
    is Ready or gone then."""
    last = next(((t, r) for t, r in reversed(changes) if t <= when), None)
    return last[0] if last is not None and last[1] is False else math.inf


def report(result: SoakResult) -> list[str]:
    """The soak's lines for bench/RESULTS.md."""
    lines = [
        f"  cluster {result.cluster}: {result.workloads} workloads, {result.fates} scripted fates,"
        " 2 workers + 2 intakes"
        f" (leader-elected), wall time {result.wall:.0f}s"
        + ("" if result.settled else " (NOT SETTLED: the story did not reach its end in time)"),
        "  | invariant (must be 0) | count |",
        "  |---|---|",
        *(
            f"  | {name} | {n}{'' if n == 0 else ' NOT MET'} |"
            for name, n in result.invariants.items()
        ),
        "  faults injected: "
        + ", ".join(f"{kind} {n}" for kind, n in sorted(result.faults.items())),
        "  workloads by outcome: "
        + ", ".join(f"{mode} {n}" for mode, n in sorted(result.outcomes.items())),
        f"  intake relists (LISTs by the intakes): {result.relists}; the Lease changed hands"
        f" {result.leaders} time(s)",
        "  peak RSS (MiB): "
        + ", ".join(f"{name} {mib:.0f}" for name, mib in sorted(result.rss.items())),
    ]
    for kind, found in result.examples.items():
        lines += [f"  e.g. {kind}: {e}" for e in found]
    if result.logs:
        lines.append(f"  logs: {result.logs}")
    return lines


def main() -> int:
    """``python -m bench.soak [N] [--in-place]``: one soak, its report, exit 1 unless every
    invariant is 0."""
    args = [a for a in sys.argv[1:] if a != "--in-place"]
    count = int(args[0]) if args else 1000
    result = asyncio.run(soak(count, in_place="--in-place" in sys.argv[1:]))
    print("\n".join(report(result)))
    return 0 if result.passed else 1


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(main())
