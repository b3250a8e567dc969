"""The soak's story: the world built (``Soak.build``), the engine started, the fault schedule
run, every workload's script played from what the cluster shows (``step``) until each has
reached the kind of end its fate gives (``settled``) and the story has gone quiet, then the
oracle's verdict (``bench.soak.invariants``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import shutil
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from temporalio.client import Client

from activities.kubetime import kube_time, parse_kube_time
from bench import CLUSTER
from bench.soak import invariants
from bench.soak.fates import (
    BAD_IMAGE,
    FATES,
    FIXED_IMAGE,
    HPA_IDLE,
    HPA_PEAK,
    LIMITS_KEY,
    MERGE,
    PROTECTED_NS,
    REC_KEY,
    Workload,
    checks,
    hpa_doc,
    manifest,
    plan,
    policy_doc,
)
from bench.soak.faults import CUT_WORK, FaultSchedule, KillSwitch
from bench.soak.invariants import INVARIANTS, Evidence, Timeline
from bench.soak.supervisor import Child, Receiver, peak_rss, start_engine
from sim.apiserver import Fault, KubeEmulator, Request, free_port
from sim.cluster import Behaviour, SimulatedCluster
from sim.devserver import DevServer
from sim.scenario import running_resources
from worker.config import INTAKE_AGENT, WORKER_AGENT, TemporalConfig
from workflows.contract import (
    CONTROL_ANNOTATION,
    DEFAULT_ENGINE_NAMESPACE,
    PAUSE_REASON_ANNOTATION,
    PAUSE_UNTIL_ANNOTATION,
    STORM_BREAKER_ANNOTATION,
    EventReason,
    Obj,
)
from workflows.durations import parse_duration
from workflows.notify import NOTIFY_WORKFLOW
from workflows.pause import breaker_reset, cluster_hold
from workflows.rollback import WORKFLOW_NAME

WORKING_SET = "300Mi"
EARLY_CONFIRM = "2s"  # the early-oom fate's confirmation period
ACTED_IN = ("rollingBack", "backingOff")  # when the policy-changed/-deleted fates act (turn 1)
# The operator resets the storm breaker once it has held a backoff's end (its RollbackPaused
# Event), or this long after it tripped when no backoff ends meanwhile.
BREAKER_HOLD = 20.0


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
        self.switch = KillSwitch(self.api)
        # policy-deleted-off's: when it switched off, and the holds it had been told of then
        self.switched_off: dict[int, tuple[float, int]] = {}
        self.bursts: dict[int, tuple[Fault, float]] = {}  # flaky-verdict's, and its window's end
        self._log_read: dict[str, int] = {}  # bytes of each worker's log read (``_fallbacks``)
        self._fallen: list[str] = []  # the fallback lines read so far
        self.children: dict[str, Child] = {}
        self.due: set[int] = set()  # workloads whose in-cut act is due (``_due``)
        # The intakes' storm breaker: more than half of a quarter of the workloads' verdicts
        # rolled back within a minute (most fates roll back: it trips on each wave of them).
        self.storm_breaker = f"50%/1m/{max(10, count // 4)}"
        # When the operator saw the breaker trip, and how many holds it had told of before.
        self._tripped_seen: tuple[float, int] | None = None

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
            policy_doc("ClusterRollbackPolicy", "soak-cluster", None,
                    {"namespaceSelector": {"operator": "In", "values": ["soak-*", PROTECTED_NS]},
                     "labelSelector": {"matchLabels": {"policy": "ClusterRollbackPolicy"}}},
                    self.window, self.backoff)
        )  # fmt: skip
        store.create(  # the early-oom fates': an hour's window, decided early
            policy_doc("ClusterRollbackPolicy", "soak-early", None,
                       {"namespaceSelector": {"operator": "In", "values": ["soak-*"]},
                        "labelSelector": {"matchLabels": {"policy": "early"}}},
                       "1h", self.backoff, earlyVerdict={"confirmationPeriod": EARLY_CONFIRM})
        )  # fmt: skip
        for ns in sorted({w.namespace for w in self.workloads}):
            store.create(
                policy_doc("RollbackPolicy", "soak-ns", ns,
                        {"labelSelector": {"matchLabels": {"policy": "RollbackPolicy"}}},
                        self.window, self.backoff)
            )  # fmt: skip
            store.create(
                policy_doc("RollbackPolicy", "soak-long", ns,
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
                    policy_doc("RollbackPolicy", w.name, w.namespace,
                            {"labelSelector": {"matchLabels": {"app": w.name}}},
                            self.window, self._own_backoff(w), w.fate.max_attempts, **checks(w))
                )  # fmt: skip
            if w.fate.hpa:
                store.create(hpa_doc(w))
            own = {"app": Behaviour(WORKING_SET, startup=0.3, cpu=HPA_IDLE if w.fate.hpa else None,
                                    bad_images=(BAD_IMAGE,))}  # fmt: skip
            self.sim.add(
                manifest(w, self.in_place), own if w.fate.hpa or w.fate.release else behaviour
            )

    def _own_backoff(self, w: Workload) -> str:
        """The backoff of a fate's own policy: the soak's, for the neighbours' fates (an HPA's,
        a release's); the others (the fates that act mid-backoff: policy changed or deleted)
        get one the script's polling cannot miss however slowly it goes round."""
        return self.backoff if w.fate.hpa or w.fate.release else self.acted_backoff

    # --- the script -----------------------------------------------------------------------------

    def _apply(self, w: Workload) -> None:
        store, fate = self.api.store, w.fate
        if fate.name == "late" and w.index not in self.due:
            return  # applied by the Lease cut (``_due``)
        limits = (
            {} if fate.grow_only else {LIMITS_KEY: json.dumps({"app": {"memory": fate.memory}})}
        )
        cpu = {"cpu": fate.cpu} if fate.cpu else {}
        annotations = {REC_KEY: json.dumps({"app": {"memory": fate.memory, **cpu}}), **limits}
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
                for p in w.pods(self.api.store)
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

    def _told(self, w: Workload, reason: str, saying: str = "") -> bool:
        """Whether the engine has told of ``reason`` (an Event) on ``w``'s owner, ``saying``
        that if given."""
        return self._tellings(w, reason, saying) > 0

    def _tellings(self, w: Workload, reason: str, saying: str = "") -> int:
        """How many Events of ``reason`` (``saying`` that, if given) are on ``w``'s owner."""
        return sum(
            1
            for e in self.api.store.items("Event", w.namespace)
            if e.get("reason") == reason
            and (e.get("involvedObject") or {}).get("name") == w.name
            and saying in (e.get("message") or "")
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
        """Lift an ``infinite`` pause once the engine's RollbackPaused Event says it held (that
        pause: another hold's Event, the kill switch's or the breaker's, says nothing of it)."""
        if self._told(w, EventReason.PAUSED, f"paused by owner {w.ref} "):
            self._annotate_pause(w, {PAUSE_UNTIL_ANNOTATION: None, PAUSE_REASON_ANNOTATION: None})
            assert w.paused is not None
            w.paused = (w.paused[0], time.time())
            w.actions.append("lifted")

    def _pause_at_gate(self, w: Workload) -> None:
        """Pause ``w``'s owner, without an end, right after a worker's LIST of its pods is
        answered: its backoff end's gate, which read the owner just before; the write that
        follows (the record that clears its rollback) must read its gate again. Not while the
        kill switch or the breaker is on: the gate would hold the step itself, and its next
        try read the pause first."""
        fault = Fault(
            status=None,
            method="GET",
            path=f"/api/v1/namespaces/{w.namespace}/pods$",
            query=f"(^|&)labelSelector=app={w.name}(&|$)",
            agent=WORKER_AGENT,
            times=None,
        )

        def pause(_: Request) -> None:
            store = self.api.store
            engine = store.get(store.rtype("Namespace"), None, DEFAULT_ENGINE_NAMESPACE)
            if fault.times == 0 or cluster_hold(
                (DEFAULT_ENGINE_NAMESPACE, engine["metadata"].get("annotations"))
            ):
                return
            fault.times = 0
            self._annotate_pause(w, {PAUSE_UNTIL_ANNOTATION: "infinite",
                                     PAUSE_REASON_ANNOTATION: "soak"})  # fmt: skip
            w.paused = (time.time(), math.inf)
            w.actions.append("paused")
            self.faults["owner paused between a step's read and its write"] += 1

        fault.after = pause
        self.api.inject(fault)
        w.actions.append("armed")

    @staticmethod
    def _ends_within(state: Obj | None, seconds: float) -> bool:
        """Whether the step ``state`` waits on (its backoff) ends within ``seconds``."""
        ends = parse_kube_time((state or {}).get("expiryAt"))
        return ends is not None and ends.timestamp() - time.time() < seconds

    def _switch_on_once_held(self, w: Workload) -> None:
        """Switch automation on again once the engine told it held ``w``'s clear (a
        RollbackPaused Event since it was switched off: an earlier hold's says nothing of it),
        or 10 s after it was switched off."""
        since, before = self.switched_off[w.index]
        told = self._tellings(w, EventReason.PAUSED, "automation disabled") > before
        if told or time.time() - since > 10.0:
            self.switch.on()
            w.actions.append("on")
            self.faults[
                "a deleted policy's clear held by the kill switch (RollbackPaused)"
                if told
                else "a deleted policy's clear not told held (automation on again)"
            ] += 1

    def _annotate_pause(self, w: Workload, annotations: dict[str, str | None]) -> None:
        store = self.api.store
        store.patch(store.rtype(w.kind), w.namespace, w.name,
                    {"metadata": {"annotations": annotations}}, MERGE)  # fmt: skip

    def _fail_pod_lists(self, w: Workload) -> None:
        """503 to the workers' pod LISTs in ``w``'s namespace from now (its window's start)
        until its verdict's sample has exhausted its local tries (a worker logs it going on as
        a regular activity), or a minute past the window's end: however late the verdict
        comes (a worker killed, the machine busy), it meets the burst."""
        burst = self.api.inject(Fault(status=503, method="GET", times=None, agent=WORKER_AGENT,
                                      path=rf"^/api/v1/namespaces/{w.namespace}/pods$"))  # fmt: skip
        self.bursts[w.index] = (burst, time.time() + parse_duration(self.window).total_seconds())
        w.actions.append("503 burst")
        self.faults["pod LISTs failing through a verdict (503 burst)"] += 1

    def _end_burst_once_fallen_back(self, w: Workload) -> None:
        burst, window_ends = self.bursts[w.index]
        said = f"{w.ref}: sample_cohort kept failing locally"
        if any(said in line for line in self._fallbacks()) or time.time() > window_ends + 60:
            with self.api._lock:
                self.api.faults[:] = [f for f in self.api.faults if f is not burst]
            w.actions.append("burst over")

    def _fallbacks(self) -> list[str]:
        """The workers' log lines so far that say a local activity went on as a regular one,
        each log read from where the last look stopped (appended to across restarts)."""
        for name, child in self.children.items():
            if not name.startswith("worker") or not child.log.exists():
                continue
            with child.log.open("rb") as log:
                log.seek(self._log_read.get(name, 0))
                new = log.read()
            whole = new[: new.rfind(b"\n") + 1]  # a line still being written: next time
            self._log_read[name] = self._log_read.get(name, 0) + len(whole)
            text = whole.decode(errors="replace")
            self._fallen.extend(
                line for line in text.splitlines() if "kept failing locally" in line
            )
        return self._fallen

    def _due(self, workloads: Sequence[Workload]) -> None:
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
                and (w.state(self.api.store) or {}).get("mode") == "monitoring"
            ):
                self._annotate(w, "cancel")
                self.faults["cancels annotated inside the Lease cut"] += 1

    def _delete_pods(self, w: Workload) -> None:
        store = self.api.store
        for pod in w.pods(self.api.store):
            with contextlib.suppress(Exception):  # gone meanwhile
                store.delete(store.rtype("Pod"), w.namespace, pod["metadata"]["name"])
        w.actions.append("pods deleted")

    def step(self, w: Workload) -> None:
        """Carry out what ``w``'s script says now, from what the cluster shows."""
        state, fate, done = w.state(self.api.store), w.fate.name, set(w.actions)
        mode, turn = (state or {}).get("mode"), (state or {}).get("turn")
        store = self.api.store
        if fate == "unschedulable" and "applied" in done and "pods deleted" not in done:
            self._delete_pods(w)  # replacements are admitted with the recommendation: Pending
        elif fate == "owner-deleted" and mode == "monitoring" and "deleted" not in done:
            store.delete(store.rtype(w.kind), w.namespace, w.name)
            w.actions.append("deleted")
        # Switched off seconds before its backoff ends: the switch holds that end briefly, not
        # every other fate's work for a whole backoff.
        elif (
            fate == "policy-deleted-off"
            and turn == 1
            and mode == "backingOff"
            and ("policy deleted" not in done and self._ends_within(state, 5.0))
        ):
            self.switch.off()
            held = self._tellings(w, EventReason.PAUSED, "automation disabled")
            self.switched_off[w.index] = (time.time(), held)
            store.delete(store.rtype("RollbackPolicy"), w.namespace, w.name)
            w.actions.append("policy deleted")
        elif fate == "policy-deleted-off" and "policy deleted" in done and "on" not in done:
            self._switch_on_once_held(w)
        elif (
            w.fate.paused_in == "gate"
            and turn == 1
            and mode == "backingOff"
            and ("armed" not in done)
        ):
            self._pause_at_gate(w)
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
        elif (
            fate in ("paused-infinite", "paused-at-gate")
            and "paused" in done
            and ("lifted" not in done)
        ):
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
        elif "503 burst" in done and "burst over" not in done:
            self._end_burst_once_fallen_back(w)
        elif fate == "flaky-verdict" and mode == "monitoring" and "503 burst" not in done:
            self._fail_pod_lists(w)
        elif fate == "reopen" and mode == "cancelled" and "reopen" not in done:
            self._annotate(w, "reopen")
        elif w.fate.hpa and mode == "monitoring" and "peak" not in done:
            self.sim.behave((w.kind, w.namespace, w.name), "app", cpu=HPA_PEAK)
            w.actions.append("peak")
            self.faults["a peak under an HPA through a CPU cut's window"] += 1
        elif (
            w.fate.good_release and turn == 1 and mode == "monitoring" and ("released" not in done)
        ):
            self._release(w, FIXED_IMAGE, "released")
            self.faults["a good release shipped in an OOM cut's window"] += 1
        elif w.fate.release and mode == "monitoring" and "released" not in done:
            self._release(w, BAD_IMAGE, "released")
            self.faults["a bad release shipped in a cut's window"] += 1
        elif "released" in done and "fixed" not in done and self._told(w, EventReason.RELEASE_SEEN):
            self._release(w, FIXED_IMAGE, "fixed")

    def _release(self, w: Workload, image: str, said: str) -> None:
        """A new image in ``w``'s pod template (its controller rolls the pods over)."""
        store = self.api.store
        (container,) = manifest(w, self.in_place)["spec"]["template"]["spec"]["containers"]
        template = {"spec": {"containers": [{**container, "image": image}]}}
        store.patch(store.rtype(w.kind), w.namespace, w.name,
                    {"spec": {"template": template}}, MERGE)  # fmt: skip
        w.actions.append(said)

    def settled(self, w: Workload) -> bool:
        """Whether ``w`` has reached the kind of end its script gives (not yet whether right)."""
        state, fate = w.state(self.api.store), w.fate
        if fate.name == "owner-deleted":
            return "deleted" in w.actions
        if fate.protected:  # its pods run the cut: the engine has seen what it must leave alone
            return bool(w.pods(self.api.store)) and all(
                (r.get("requests") or {}).get("memory") == fate.memory
                for p in w.pods(self.api.store) for r in running_resources(p).values()
            )  # fmt: skip
        if fate.mode is None:
            return "policy deleted" in w.actions and state is None
        if state is None:
            return False
        if fate.name == "reopen":
            return "reopen" in w.actions and state["mode"] == "monitoring"
        final = ("monitoringSucceeded", "failedPermanent", "cancelled", "aborted")
        return bool(state["mode"] == fate.mode or state["mode"] in final)

    # --- the run --------------------------------------------------------------------------------

    async def run(self, deadline: float) -> SoakResult:
        began = time.monotonic()
        self.build()
        self.api.start()
        self.sim.start()
        if self.owns_temporal:
            await asyncio.to_thread(self.temporal.start)
        self.children, self.receiver = start_engine(
            self.workdir, self.cluster, self.temporal.address, self.api.url, self.queue,
            self.in_place, self.storm_breaker,
        )  # fmt: skip
        # The ``in_cut`` fates' work, dealt to the Lease cut's moments.
        cut = [w for w in self.workloads if w.fate.in_cut]
        shares = [cut[i :: len(CUT_WORK)] for i in range(len(CUT_WORK))]
        temporal = self.temporal if self.restarts_temporal else None
        schedule = FaultSchedule(
            self.api, self.children, temporal, shares, self._due, self.faults, self.switch
        )
        # Connected once the faults are over (one of them restarts Temporal).
        client: Client | None = None
        spread = min(30.0, 0.03 * len(self.workloads) + 5)
        faults = asyncio.create_task(schedule.run(spread + 40.0))
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
            self._reset_breaker()
            waiting = [w for w in self.workloads if not self.settled(w)]
            if time.monotonic() - said > 10:
                said = time.monotonic()
                sample = [
                    (w.ref, (w.state(self.api.store) or {}).get("mode"), w.actions) for w in waiting
                ]
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
            schedule.api_faults_on(False)
        for child in self.children.values():
            child.sample_rss()
        client = client or await self._connect()
        try:
            return await self._verdict(client, schedule, time.monotonic() - began, settled)
        finally:
            for child in self.children.values():
                child.stop()
            if self.owns_temporal:  # its history goes with the soak's temporary directory
                await asyncio.to_thread(self.temporal.stop, False)
            self.receiver.shutdown()
            self.sim.stop()
            self.api.stop()

    def _reset_breaker(self) -> None:
        """The operator: the storm breaker reset, as ``kubectl rollback breaker reset`` resets
        it, once it has held a backoff's end (or ``BREAKER_HOLD`` seconds after it tripped);
        the backoffs' ends it held then go on."""
        store = self.api.store
        namespace = store.get(store.rtype("Namespace"), None, DEFAULT_ENGINE_NAMESPACE)
        if STORM_BREAKER_ANNOTATION not in (namespace["metadata"].get("annotations") or {}):
            self._tripped_seen = None
            return
        if self._tripped_seen is None:
            self._tripped_seen = (time.monotonic(), self._breaker_holds())
            return
        since, holds = self._tripped_seen
        if self._breaker_holds() > holds or time.monotonic() - since >= BREAKER_HOLD:
            body = {"metadata": {"annotations": breaker_reset(datetime.now(UTC))}}
            store.patch(store.rtype("Namespace"), None, DEFAULT_ENGINE_NAMESPACE, body, MERGE)
            self.faults["storm breaker tripped, reset by the operator"] += 1
            self._tripped_seen = None

    def _breaker_holds(self) -> int:
        """The backoffs' ends the storm breaker has held (its RollbackPaused Events, counted)."""
        return sum(
            int(e.get("count") or 1) for e in self.api.store.items("Event")
            if e.get("reason") == EventReason.PAUSED and "storm breaker" in e.get("message", "")
        )  # fmt: skip

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

    async def _verdict(
        self, client: Client, schedule: FaultSchedule, wall: float, settled: bool
    ) -> SoakResult:
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
        store = self.api.store
        outcomes = Counter((w.state(store) or {}).get("mode") or "no state" for w in self.workloads)
        workers = [c for name, c in self.children.items() if name.startswith("worker")]
        ev = Evidence(
            self.cluster, self.queue, self.workloads, self.timeline, list(self.api.journal),
            store, list(Receiver.received), [c.log for c in workers],
        )  # fmt: skip
        invariants.ends(ev, bad, runs, lambda w: invariants.wrong_end(ev, w, self.in_place))
        invariants.double_rollback(ev, bad)
        invariants.notifications(ev, bad)
        invariants.non_leader_writes(ev, bad)
        invariants.acted_while_paused(ev, bad)
        invariants.acted_in_protected(ev, bad)
        invariants.reapplied_while_off(ev, bad)
        invariants.reapplied_while_tripped(ev, bad)
        restarting = invariants.more_unavailable(ev, bad) if self.in_place else 0
        await invariants.non_leader_signals(ev, client, bad)
        await invariants.crossed_clusters(ev, client, bad)
        relists = sum(
            1 for r in ev.journal if r.agent.startswith(INTAKE_AGENT) and r.verb == "list"
        )  # fmt: skip
        faults = schedule.injected()
        if restarting:
            faults["pods taken down by the engine's in-place resizes (checked)"] = restarting
        recreated = sum(1 for r in ev.worker_writes("DELETE") if invariants.deleted_pod(r))
        if recreated:
            faults["pods a restore recreated (not Ready: CrashLoopBackOff, no room)"] = recreated
        told = {
            (e["involvedObject"].get("namespace"), e["involvedObject"]["name"])
            for e in store.items("Event") if e.get("reason") == EventReason.STORM_BREAKER_TRIPPED
        }  # fmt: skip
        if told:
            faults["policies told the storm breaker tripped (their Event)"] = len(told)
        held = self._breaker_holds()
        if held:
            faults["backoffs' ends the storm breaker held (RollbackPaused)"] = held
        # each logged by the workflow (``RollbackWorkflow._activity``)
        fallbacks = len(self._fallbacks())
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
