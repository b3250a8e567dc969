"""The soak's workloads: each with a scripted fate and so a known end (``FATES``), dealt
round-robin over namespaces, owner kinds and policy kinds (``plan``); the policies and owners
the world is built of; the few reads of a workload's owner, state and pods the script and the
oracle share."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from typing import Any

from sim.apiserver import Store
from workflows.contract import ROLLBACK_STATE_ANNOTATION, Obj, recommendation_key

MERGE = "application/merge-patch+json"
REC_KEY = recommendation_key("static")
LIMITS_KEY = recommendation_key("static", limits=True)
MANIFEST, HEALTHY, OOM, GROWN, HUGE = "512Mi", "384Mi", "256Mi", "1Gi", "200Ti"
MAX_UNAVAILABLE = 1  # every owner's rolling-update maxUnavailable (what in-place paces by)
PROTECTED_NS = "kube-soak"  # protected by the default patterns (kube-*), named by a policy
# An HPA's fates: 2 to 4 replicas at 60% of 100m requested, the real scale-up policies (2 to 4
# in one sync: a peak seen late in a window still pins it by its end); each pod uses 25m until
# its window opens, then 50m (a peak): 100% of a 50m cut (pinned at 4), 56% of a 90m one (left
# at 2, within the HPA's 10% tolerance).
HPA_CPU, HPA_IDLE, HPA_PEAK, HPA_MIN, HPA_MAX = "100m", "25m", "50m", 2, 4
BAD_IMAGE, FIXED_IMAGE = "soak/app:bad", "soak/app:2"  # a release's: crashes at start; its fix


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
    # first backoff begins, once its first rollback has taken a pod down (in place), or right
    # after its backoff end's read of the owner (``gate``).
    paused_in: str | None = None
    in_place_only: bool = False  # dealt only where the engine actuates in place
    budget: bool = False  # a disruption budget that allows nothing while it rolls back
    early: bool = False  # under soak-early: a 1-hour window, decided early (``earlyVerdict``)
    # Another reason this end may be given anywhere: an early verdict decides within seconds of
    # its window's start, when a pod crash-looping since before it (a turn-2 pod that never
    # left the cut) shows CrashLoopBackOff with no OOM kill in this window yet.
    reason_too: str | None = None
    cpu: str | None = None  # the recommendation's CPU request too (an HPA's fates)
    hpa: bool = False  # an HPA scales it (its pod count is the HPA's; its policy checks it)
    release: bool = False  # a bad release ships as its window opens; fixed once seen
    good_release: bool = False  # a good one ships in its first window (an OOM cut's)


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
    # The same with automation off: the script switches the kill switch off, then deletes the
    # policy; the clear, which lets the cut run again, is held until the script switches it
    # on (once RollbackPaused says it held), then ends as policy-deleted's.
    Fate(name="policy-deleted-off", memory=OOM, mode=None, pods=OOM, own_policy=True),
    # Paused (without an end) right after its first backoff end's gate LISTed its pods (the
    # owner read just before), before the record that clears its rollback: that write, its own
    # last check, is held until the script lifts the pause (once RollbackPaused says it held);
    # then as oom's.
    _as_oom(name="paused-at-gate", paused_in="gate", own_policy=True),
    # Its window is an hour; its OOMs are certain failures, so each turn is decided early (the
    # intake's suspect, a confirmation, the rollback) and it ends as oom's, in seconds.
    _as_oom(name="early-oom", early=True, reason_too="crashLoopBackOff"),
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
    # Under an HPA, a CPU cut that leaves no room for the peak its window sees: the HPA scales
    # it out to its maximum, and the autoscaler check rolls it back; one turn (its own policy).
    Fate(
        name="hpa-pinned",
        memory=MANIFEST,
        cpu="50m",
        mode="failedPermanent",
        turn=1,
        reason="autoscalerScaledOut",
        replicas=HPA_MIN,
        own_policy=True,
        max_attempts=1,
        hpa=True,
    ),
    # The same HPA and peak, a cut with room for it: the HPA stays, the cut succeeds.
    Fate(
        name="hpa-steady",
        memory=MANIFEST,
        cpu="90m",
        mode="monitoringSucceeded",
        turn=1,
        replicas=HPA_MIN,
        own_policy=True,
        hpa=True,
    ),
    # A cut that fits, and a bad release (its pods crash) as its window opens: the verdict waits
    # for the release, the script ships the fix once RollbackReleaseSeen says it was seen, and a
    # fresh window passes the cut: never rolled back, turn 1.
    Fate(
        name="release",
        memory=HEALTHY,
        mode="monitoringSucceeded",
        turn=1,
        pods=HEALTHY,
        own_policy=True,
        release=True,
    ),
    # An OOM cut, and a good release (a new image that runs) in its first window: the release
    # excuses nothing the cut causes: its OOM kills are judged at the window's end, and it ends
    # as oom's (before, a release excused the cut's OOM for as long as it rolled out, which the
    # cut's own OOM kills kept it from doing).
    _as_oom(name="release-under-oom", good_release=True),
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

    def owner(self, store: Store) -> Obj | None:
        try:
            return store.get(store.rtype(self.kind), self.namespace, self.name)
        except Exception:
            return None

    def state(self, store: Store) -> Obj | None:
        """Its owner's rollback state, parsed (None: no owner, or no state)."""
        annotations = ((self.owner(store) or {}).get("metadata") or {}).get("annotations") or {}
        raw = annotations.get(ROLLBACK_STATE_ANNOTATION)
        return json.loads(raw) if raw else None

    def pods(self, store: Store) -> list[Obj]:
        return [
            p for p in store.items("Pod", self.namespace)
            if (p["metadata"].get("labels") or {}).get("app") == self.name
        ]  # fmt: skip


def policy_doc(
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


def checks(w: Workload) -> Obj:
    """What its own policy checks beyond adoption: an HPA's fates, the HPA."""
    return {"healthChecks": {"autoscaler": {"failAtMax": True}}} if w.fate.hpa else {}


def hpa_doc(w: Workload) -> Obj:
    """The HPA of an HPA's fate: CPU at 60% of requests, the real default behaviour."""
    cpu = {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 60}}
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": w.name, "namespace": w.namespace},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": w.kind, "name": w.name},
            "minReplicas": HPA_MIN,
            "maxReplicas": HPA_MAX,
            "metrics": [{"type": "Resource", "resource": cpu}],
        },
    }


def manifest(w: Workload, in_place: bool = False) -> Obj:
    """The owner; ``in_place``: its memory resizes restart the container, paced by
    ``MAX_UNAVAILABLE``."""
    selector = {"pool": f"part-{w.name}" if w.fate.fits else "main"}
    labels = {"app": w.name, "policy": "own" if w.fate.own_policy else w.policy_kind}
    if w.fate.long_window:
        labels["policy"] = "long"
    if w.fate.early:
        labels["policy"] = "early"
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
                            "requests": {
                                "cpu": HPA_CPU if w.fate.hpa else "10m",
                                "memory": MANIFEST,
                            },
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
