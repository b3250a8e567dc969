"""``python -m bench --only detect [--detect N]``: how fast a certain failure is rolled back under
an early verdict, and how fast the restore is Ready (issue #47's measure).

N Deployments of two pods on the simulated cluster, the real worker and intake, the real
Temporal dev server, under one policy: a 1-hour window, ``earlyVerdict`` (confirmation
``CONFIRMATION``), 80% (both pods), the manifest as the target. Each workload adopts a cut
that fits, then, at a random moment between ``CRASH_FROM`` and ``CRASH_TO`` seconds, its app
outgrows it (a ``behave`` step: its working set past the cut's limit) and is OOM-killed.
Measured per workload from what the cluster shows (a listener on the emulator's store, stamped
as each change lands):

- crossing: the first pod status change after which the pods failing for certain
  (``activities.cohort.failing_for_certain``, the rule the run applies) lose the window;
- rollback: the rollback recommendation published on the owner;
- restored: every pod Ready on the manifest's memory again.

Printed: crossing -> rollback and crossing -> restored, p50/p99/max, against the target (p99
under 5 s to the rollback); the attempts' history events and billable actions (each history
read after the run); and, in the same table, what the window's end (Kubex's behaviour) and
Flagger's defaults would give for the same crossings (arithmetic, stated).
"""

from __future__ import annotations

import asyncio
import random
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from activities.cohort import failing_for_certain, health, is_ready
from bench import actions
from bench.harness import Lines, met, p50_p99, say
from sim.scenario import Scenario, World, play
from worker.config import TemporalConfig
from workflows.activity_api import OwnerRef, rollback_id
from workflows.contract import ROLLBACK_REQUESTS_ANNOTATION, Obj, WorkloadKind
from workflows.machine import required_adopters

NS = "detect"
REPLICAS, THRESHOLD = 2, 80  # both pods required: one failing for certain loses the window
EPOCH = datetime(2000, 1, 1, tzinfo=UTC)  # an OOM kill at any time counts (none before the crash)
CONFIRMATION = "2s"
WINDOW_SECONDS = 3600
CUT_AT = 1.0  # seconds after the start: every workload adopts its cut
CRASH_FROM, CRASH_TO = 8.0, 30.0  # when a workload's app outgrows its cut, after the cut
TARGET_P99 = 5.0  # seconds from the crossing to the rollback published
# Flagger's defaults: an analysis every 60 s, rolled back after 5 failed checks.
FLAGGER_INTERVAL, FLAGGER_THRESHOLD = 60, 5


def _deployment(name: str) -> Obj:
    template = {
        "metadata": {"labels": {"app": name}},
        "spec": {"containers": [{"name": "app", "image": "x", "resources": {
            "requests": {"cpu": "10m", "memory": "1Gi"}, "limits": {"memory": "1Gi"}}}]},
    }  # fmt: skip
    return {
        "manifest": {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "namespace": NS, "labels": {"app": name}},
            "spec": {
                "replicas": REPLICAS,
                "selector": {"matchLabels": {"app": name}},
                "template": template,
            },
        },
        "behaviour": {"app": {"workingSet": "300Mi", "startup": 0.3}},
    }


def scenario(count: int, seed: int) -> tuple[Scenario, dict[str, float]]:
    """The story, and when each workload's app outgrows its cut (seconds after the start)."""
    rng = random.Random(seed)
    names = [f"w{i:03d}" for i in range(count)]
    crash = {n: CUT_AT + rng.uniform(CRASH_FROM, CRASH_TO) for n in names}
    cut = {"app": {"memory": "512Mi"}}
    policy = {
        "apiVersion": "rightsizing.kubex.ai/v1alpha1",
        "kind": "RollbackPolicy",
        "metadata": {"name": "detect", "namespace": NS},
        "spec": {"monitoringPeriod": "1h", "rollbackTarget": "manifest",
                 "adoptionThresholdPercent": THRESHOLD,
                 "earlyVerdict": {"confirmationPeriod": CONFIRMATION},
                 "backoff": {"timePeriod": "1s", "multiplyByTurn": 1, "maxAttempts": 1}},
    }  # fmt: skip
    steps: list[dict[str, Any]] = [
        {
            "at": CUT_AT,
            "apply": {"workload": f"{NS}/Deployment/{n}", "requests": cut, "limits": cut},
        }
        for n in names
    ]
    steps += [
        {"at": at, "behave": {"workload": f"{NS}/Deployment/{n}", "container": "app",
                              "workingSet": "700Mi"}}
        for n, at in crash.items()
    ]  # fmt: skip
    story = {
        "name": "detect",
        "timeout": 600,
        "nodes": [{"name": "node-1", "cpu": "64", "memory": "512Gi"}],
        "workloads": [_deployment(n) for n in names],
        "policies": [policy],
        "steps": steps,
    }
    return Scenario.model_validate(story), crash


class Clock:
    """When each owner crossed the line, had its rollback published and its restore Ready."""

    def __init__(self, names: list[str]) -> None:
        self.names = set(names)
        self.pods: dict[str, dict[str, Obj]] = {n: {} for n in names}
        self.crossed: dict[str, float] = {}
        self.published: dict[str, float] = {}
        self.restored: dict[str, float] = {}

    def __call__(self, kind: str, rtype: Any, obj: Obj) -> None:
        now = time.monotonic()
        meta = obj.get("metadata") or {}
        if meta.get("namespace") != NS:
            return
        if rtype.kind == "Deployment" and meta.get("name") in self.names:
            name = meta["name"]
            if ROLLBACK_REQUESTS_ANNOTATION in (meta.get("annotations") or {}):
                self.published.setdefault(name, now)
        elif rtype.kind == "Pod":
            name = str((meta.get("labels") or {}).get("app"))
            if name not in self.names:
                return
            pods = self.pods[name]
            if kind == "DELETED":
                pods.pop(meta["name"], None)
            else:
                pods[meta["name"]] = obj
            self._pods_changed(name, now)

    def _pods_changed(self, name: str, now: float) -> None:
        pods = list(self.pods[name].values())
        if name not in self.crossed:
            failing = sum(1 for p in pods if failing_for_certain(p, health(p, EPOCH)[0]))
            if failing > REPLICAS - required_adopters(REPLICAS, THRESHOLD):  # the window is lost
                self.crossed[name] = now
        elif name in self.published and name not in self.restored:
            memory = {_memory(p) for p in pods}
            if len(pods) == REPLICAS and all(is_ready(p) for p in pods) and memory == {"1Gi"}:
                self.restored[name] = now


def _memory(pod: Obj) -> str | None:
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    return ((containers[0].get("resources") or {}).get("requests") or {}).get("memory")


def _quantiles(values: list[float]) -> tuple[float, float, float]:
    return (*p50_p99(values), max(values))


async def detect(count: int, lines: Lines, seed: int = 1) -> None:
    story, crash = scenario(count, seed)
    clock = Clock(list(crash))
    with tempfile.TemporaryDirectory(prefix="bench-detect-") as tmp:
        world = World(story, lambda line: None, Path(tmp))
        world.api.store.listeners.append(clock)
        began = time.monotonic()
        try:
            await world.start()
            await play(world)
            while len(clock.restored) < count and time.monotonic() - began < story.timeout:
                await asyncio.sleep(0.5)
            client = await TemporalConfig.at(world.temporal.address).connect()
            shapes = []
            for name in sorted(clock.published)[:10]:
                ref = OwnerRef(namespace=NS, kind=WorkloadKind.DEPLOYMENT, name=name)
                handle = client.get_workflow_handle(rollback_id(story.cluster, ref))
                shapes.append(actions.shape((await handle.fetch_history()).events))
        finally:
            await world.stop()
    to_rollback = [clock.published[n] - clock.crossed[n] for n in clock.published
                   if n in clock.crossed]  # fmt: skip
    to_ready = [clock.restored[n] - clock.crossed[n] for n in clock.restored if n in clock.crossed]
    say(lines, f"  {count} Deployments (2 pods each) on 1-hour windows, earlyVerdict (confirmation"
        f" {CONFIRMATION}), each app outgrowing its cut {CRASH_FROM:.0f}-{CRASH_TO:.0f} s after"
        f" it: {len(clock.crossed)} crossed, {len(clock.published)} rolled back,"
        f" {len(clock.restored)} restored Ready")  # fmt: skip
    if not to_rollback:
        say(lines, "  nothing rolled back: NOT MET")
        return
    p50, p99, most = _quantiles(to_rollback)
    say(lines, "  | from the crossing to | p50 (s) | p99 (s) | max (s) |")
    say(lines, "  |---|---|---|---|")
    say(lines, f"  | the rollback published (early verdict) | {p50:.1f} | {p99:.1f} | {most:.1f} |")
    if to_ready:
        r50, r99, rmax = _quantiles(to_ready)
        say(lines, f"  | the restore Ready (early verdict) | {r50:.1f} | {r99:.1f} | {rmax:.1f} |")
    # The same crossings, decided at the window's end (each crossed about this long after its
    # window opened, with the cut), and by Flagger's default analysis.
    ends = [WINDOW_SECONDS - (crash[n] - CUT_AT) for n in clock.crossed]
    e50, e99, emax = _quantiles(ends)
    say(
        lines,
        f"  | the window's end (Kubex's behaviour, 1h) | {e50:.0f} | {e99:.0f} | {emax:.0f} |",
    )
    flagger = FLAGGER_INTERVAL * FLAGGER_THRESHOLD
    say(lines, f"  | Flagger's defaults ({FLAGGER_THRESHOLD} failed checks, {FLAGGER_INTERVAL} s"
        f" apart: arithmetic) | {flagger - FLAGGER_INTERVAL / 2:.0f} | {flagger:.0f} |"
        f" {flagger:.0f} |")  # fmt: skip
    say(lines, f"  target: p99 from the crossing to the rollback <= {TARGET_P99:.0f} s"
        f"{met(p99 <= TARGET_P99)}")  # fmt: skip
    if shapes:
        events = sorted(s["events"] for s in shapes)
        billable = sorted(s["actions"] for s in shapes)
        say(lines, f"  each attempt (ended failedPermanent, read from {len(shapes)} histories):"
            f" {events[0]}-{events[-1]} history events, {billable[0]}-{billable[-1]} billable"
            " actions")  # fmt: skip
