"""Judging pods: has each adopted the active recommendation, and is it healthy?

Pure functions over pod dicts as the API serves them; ``sample_cohort`` feeds them one LIST.

A pod has *adopted* when it carries the recommendation (same fingerprint among its annotations)
and its actual container resources equal it: ``status.containerStatuses[].resources`` where the
kubelet reports them, the pod spec otherwise.

A pod is *not counted* for one reason, checked in this order (the first that applies):

    Failed        phase Failed (a Succeeded Job pod is healthy)
    OOMKilled     a container was OOMKilled during this window (its last termination, or now),
                  or has not been ready since an older one (backing off in CrashLoopBackOff
                  or starting again: the kubelet's restart backoff grows to 5 minutes, longer
                  than many windows)
    CrashLoopBackOff
    Unschedulable PodScheduled=False with reason Unschedulable
    NotReady      Ready is not True (a Pending pod without another reason, a failing probe),
                  or Ready for less than the minimum ready duration (Kubex's
                  ``minReadyDuration``, 10 s by default): a pod that turned Ready a moment
                  before the verdict has not shown it stays up
    resize        PodResizePending Infeasible/Deferred, PodResizeInProgress Error (the pod is
                  fine, the resize is not happening)

Restarts for other causes that recovered before the sample do not count: the spec allows
transient restarts to recover within the window. An OOM kill on the new resources is not
transient: it is what a rollback protects against, so it counts for the rest of the window.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from activities.kubetime import parse_kube_time
from activities.owners import JOB_NAME_LABEL, resources_of
from workflows.activity_api import Certain, CohortQuery
from workflows.contract import CERTAIN_REASONS, DEFAULT_MIN_READY, FailureReason, Obj
from workflows.durations import format_duration
from workflows.fingerprint import Recommendation, Resources, recommendations_from_annotations
from workflows.quantities import parse_quantity

REASON_LABELS = {
    FailureReason.FAILED: "Failed",
    FailureReason.OOM_KILLED: "OOMKilled",
    FailureReason.CRASH_LOOP_BACK_OFF: "CrashLoopBackOff",
    FailureReason.UNSCHEDULABLE: "Unschedulable",
    FailureReason.NOT_READY: "NotReady",
    FailureReason.RESIZE_INFEASIBLE: "resize Infeasible",
    FailureReason.RESIZE_DEFERRED: "resize Deferred",
    FailureReason.RESIZE_ERROR: "resize Error",
}


@dataclass(frozen=True)
class PodVerdict:
    name: str
    adopted: bool
    reason: FailureReason | None  # None: healthy
    containers: tuple[str, ...] = ()  # the containers the reason is about
    ready_too_recently: bool = False  # NotReady only because Ready for less than the minimum
    failing: bool = False  # for certain, now (``CERTAIN_REASONS``): what the early verdict counts
    restarts: int = 0  # the kubelet's restarts of the containers the reason is about
    exited_at: datetime | None = None  # when they last exited (``restarts``)
    down: bool = False  # they are not running now (waiting or terminated)

    @property
    def counts(self) -> bool:
        return self.adopted and self.reason is None


def actual_resources(pod: Obj) -> tuple[Resources, Resources]:
    """Container resources as running: the kubelet's report where present, else the spec."""
    requests, limits = resources_of(list(pod.get("spec", {}).get("containers") or []))
    for status in pod.get("status", {}).get("containerStatuses") or []:
        reported = status.get("resources")
        if reported:
            name = status["name"]
            if "requests" in reported:
                requests[name] = {k: str(v) for k, v in reported["requests"].items()}
            if "limits" in reported:
                limits[name] = {k: str(v) for k, v in reported["limits"].items()}
    return requests, limits


def memory_text(resources: Mapping[str, Obj]) -> str:
    """``a,b``: each container's memory (its limit, else its request), in the order given
    (container -> its ``{requests, limits}``)."""
    return ",".join(
        str((r.get("limits") or {}).get("memory") or (r.get("requests") or {}).get("memory"))
        for r in resources.values()
    )


def carries(pod: Obj, recommendation: Recommendation) -> bool:
    """Whether the pod's annotations hold this recommendation (raises on malformed ones)."""
    annotations = pod.get("metadata", {}).get("annotations") or {}
    wanted = recommendation.fingerprint
    return any(r.fingerprint == wanted for r in recommendations_from_annotations(annotations))


def _condition(pod: Obj, kind: str) -> Obj | None:
    return next(
        (c for c in pod.get("status", {}).get("conditions") or [] if c.get("type") == kind), None
    )


def health(
    pod: Obj, since: datetime, ready_by: datetime | None = None, carried: bool = True
) -> tuple[FailureReason | None, tuple[str, ...]]:
    """Why the pod is unhealthy (with the containers concerned), or ``(None, ())``; a pod
    Ready only since after ``ready_by`` is ``NotReady`` (``ready_too_recently`` tells it).
    ``carried``: an OOM kill before ``since`` counts while its container has not been ready
    since (a window judging a cut: its restart backoff can outlast a short window); without,
    only a kill since ``since`` is one (the cohort now, after a rollback: its pods back off
    from a kill at the size before, ``CrashLoopBackOff``)."""
    status = pod.get("status") or {}
    phase = status.get("phase")
    if phase == "Succeeded":
        return None, ()
    if phase == "Failed":
        return FailureReason.FAILED, ()
    statuses = status.get("containerStatuses") or []
    # The kubelet's times have whole seconds: a kill in the window's first second counts.
    since = since.replace(microsecond=0)
    oom, crash = [], []
    for cs in statuses:
        now = cs.get("state") or {}
        last = (cs.get("lastState") or {}).get("terminated") or {}
        finished = parse_kube_time(last.get("finishedAt"))
        backing_off = (now.get("waiting") or {}).get("reason") == "CrashLoopBackOff"
        unrecovered = backing_off or not cs.get("ready", False)
        if (now.get("terminated") or {}).get("reason") == "OOMKilled" or (
            last.get("reason") == "OOMKilled"
            and ((carried and unrecovered) or (finished is not None and finished >= since))
        ):
            oom.append(cs["name"])
        elif backing_off:
            crash.append(cs["name"])
    if oom:
        return FailureReason.OOM_KILLED, tuple(oom)
    if crash:
        return FailureReason.CRASH_LOOP_BACK_OFF, tuple(crash)
    scheduled = _condition(pod, "PodScheduled")
    if (
        scheduled
        and scheduled.get("status") == "False"
        and scheduled.get("reason") == "Unschedulable"
    ):
        return FailureReason.UNSCHEDULABLE, ()
    if not is_ready(pod) or ready_too_recently(pod, ready_by):
        return FailureReason.NOT_READY, ()
    return None, ()


def is_ready(pod: Obj) -> bool:
    """Whether the pod's Ready condition is True (it serves: available)."""
    ready = _condition(pod, "Ready")
    return bool(ready and ready.get("status") == "True")


def ready_too_recently(pod: Obj, ready_by: datetime | None) -> bool:
    """Whether the pod turned Ready after ``ready_by`` (its Ready condition's transition time;
    a pod that does not say when counts as Ready long enough)."""
    if ready_by is None or not is_ready(pod):
        return False
    ready = _condition(pod, "Ready") or {}
    since = parse_kube_time(ready.get("lastTransitionTime"))
    return since is not None and since > ready_by


def pod_state(pod: Obj) -> str:
    """A pod's state in a word, for pictures: Running (and ready), NotReady, CrashLoopBackOff,
    Pending, Succeeded, Failed."""
    status = pod.get("status") or {}
    for cs in status.get("containerStatuses") or []:
        if ((cs.get("state") or {}).get("waiting") or {}).get("reason") == "CrashLoopBackOff":
            return "CrashLoopBackOff"
    phase = str(status.get("phase") or "Pending")
    if phase != "Running":
        return phase
    return "Running" if is_ready(pod) else "NotReady"


def resize_blocked(pod: Obj) -> FailureReason | None:
    pending = _condition(pod, "PodResizePending")
    if pending and pending.get("status") == "True":
        if pending.get("reason") == "Infeasible":
            return FailureReason.RESIZE_INFEASIBLE
        return FailureReason.RESIZE_DEFERRED
    legacy = (pod.get("status") or {}).get("resize")  # before Kubernetes 1.33
    if legacy in ("Infeasible", "Deferred"):
        return (
            FailureReason.RESIZE_INFEASIBLE
            if legacy == "Infeasible"
            else FailureReason.RESIZE_DEFERRED
        )
    progress = _condition(pod, "PodResizeInProgress")
    if progress and progress.get("reason") == "Error":
        return FailureReason.RESIZE_ERROR
    return None


def judge(
    pod: Obj,
    recommendation: Recommendation,
    since: datetime,
    ready_by: datetime | None = None,
    carried: bool = True,
) -> PodVerdict:
    """``since``: the window's start (an OOM kill since then counts; ``carried``: see
    ``health``); ``ready_by``: the latest a pod may have turned Ready to count (the sample's
    time less the minimum ready duration)."""
    name = pod["metadata"]["name"]
    has = carries(pod, recommendation)
    adopted = has and recommendation.equals_resources(*actual_resources(pod))
    reason, containers = health(pod, since, ready_by, carried)
    if reason is None and not adopted:
        reason = resize_blocked(pod)
    # NotReady while Ready: only because it turned Ready too recently (``health``).
    recent = reason is FailureReason.NOT_READY and is_ready(pod)
    failing = failing_for_certain(pod, reason)
    restarted, exited, down = restarts(pod, containers)
    return PodVerdict(name, adopted, reason, containers, recent, failing, restarted, exited, down)


def restarts(pod: Obj, containers: tuple[str, ...]) -> tuple[int, datetime | None, bool]:
    """The kubelet's restarts of ``containers`` (their ``restartCount``s, summed), when they last
    exited, and whether they are down now (not running): what the early verdict confirms a
    crash on (``machine.confirmed``)."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    mine = [cs for cs in statuses if cs.get("name") in containers]
    exits = [
        parse_kube_time(((cs.get(where) or {}).get("terminated") or {}).get("finishedAt"))
        for cs in mine
        for where in ("state", "lastState")
    ]
    latest = max((e for e in exits if e is not None), default=None)
    down = any("running" not in (cs.get("state") or {}) for cs in mine)
    return sum(int(cs.get("restartCount") or 0) for cs in mine), latest, down


def failing_for_certain(pod: Obj, reason: FailureReason | None) -> bool:
    """Whether the pod, unhealthy for ``reason``, fails for certain now (what the early verdict
    counts and the intake signals on): an OOM kill or a crash loop it has recovered from (Ready
    again) is no certain failure now; a resize the node can never take is one, Ready or not."""
    if reason is FailureReason.RESIZE_INFEASIBLE:
        return True
    return reason in CERTAIN_REASONS and not is_ready(pod)


def raises_requests(recommendation: Recommendation, manifest: Resources | None) -> bool | None:
    """Whether ``recommendation`` asks a container for more than the owner's template requests
    (``manifest``; None: the kind has no template to compare with): only such a cut can leave
    a pod without a node to run on."""
    if manifest is None:
        return None
    try:
        return any(
            name not in manifest.get(container, {})
            or parse_quantity(quantity) > parse_quantity(manifest[container][name])
            for container, resources in recommendation.requests.items()
            for name, quantity in resources.items()
        )
    except ValueError:  # a template quantity that does not parse: not known
        return None


def in_cohort(pod: Obj, query: CohortQuery) -> bool:
    """Client-side narrowing the label selector cannot express (CronJob's Job names)."""
    if query.job_name_pattern is None:
        return True
    job = (pod["metadata"].get("labels") or {}).get(JOB_NAME_LABEL, "")
    return re.match(query.job_name_pattern, job) is not None


@dataclass
class Tally:
    pods: int = 0
    adopted: int = 0
    adopted_healthy: int = 0
    reasons: Counter[FailureReason] = field(default_factory=Counter)
    containers: dict[FailureReason, set[str]] = field(default_factory=dict)
    ready_too_recently: int = 0  # of the NotReady: Ready, for less than the minimum
    failing: Counter[FailureReason] = field(default_factory=Counter)  # for certain, now
    certain: dict[str, Certain] = field(default_factory=dict)  # the same, by pod
    min_ready: timedelta = DEFAULT_MIN_READY  # named in the message

    def add(self, verdict: PodVerdict) -> None:
        self.pods += 1
        self.adopted += verdict.adopted
        self.adopted_healthy += verdict.counts
        self.ready_too_recently += verdict.ready_too_recently
        if verdict.reason is not None:
            self.reasons[verdict.reason] += 1
            self.failing[verdict.reason] += verdict.failing
            self.containers.setdefault(verdict.reason, set()).update(verdict.containers)
            if verdict.failing:
                self.certain[verdict.name] = Certain(
                    reason=verdict.reason, restarts=verdict.restarts,
                    exited_at=verdict.exited_at, down=verdict.down,
                )  # fmt: skip

    def message(self) -> str:
        """``2/5 pods OOMKilled (app); 1/5 pods Unschedulable``, most frequent first; NotReady
        says how many of them were Ready, but too recently: ``2/5 pods NotReady (1 Ready for
        less than 10s)``."""
        parts = []
        for reason, count in self.reasons.most_common():
            names = sorted(self.containers.get(reason) or ())
            suffix = f" ({', '.join(names)})" if names else ""
            if reason is FailureReason.NOT_READY and self.ready_too_recently:
                suffix = (
                    f" ({self.ready_too_recently} Ready for less than"
                    f" {format_duration(self.min_ready)})"
                )
            parts.append(f"{count}/{self.pods} pods {REASON_LABELS[reason]}{suffix}")
        return "; ".join(parts)
