"""P2: Kubernetes API requests per cohort sample, and writes per transition, counted at the
emulator, vs a naive baseline that GETs every pod."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime

from kubernetes.client import CoreV1Api, CustomObjectsApi

from activities.kubernetes import KubernetesActivities
from bench import CLUSTER
from bench.harness import (
    KEY,
    REC,
    Lines,
    say,
)
from sim.apiserver import KubeEmulator
from sim.scenario import SCENARIOS, Scenario, run_scenario
from worker.kube import api_client
from workflows.activity_api import OwnerRef, SampleCohortInput
from workflows.contract import Actuation, WorkloadKind


def api_cost(owners: int, pods: int, samples: int, lines: Lines) -> None:
    with KubeEmulator() as api:
        acts = KubernetesActivities(
            CoreV1Api(api_client(url=api.url)),
            CustomObjectsApi(api_client(url=api.url)),
            Actuation.ANNOTATIONS,
        )
        refs = []
        for o in range(owners):
            name = f"w{o}"
            api.store.create(
                {
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "metadata": {"name": name, "namespace": "bench"},
                    "spec": {
                        "replicas": pods,
                        "selector": {"matchLabels": {"app": name}},
                        "template": {"spec": {"containers": [{"name": "app"}]}},
                    },
                }
            )
            for p in range(pods):
                api.store.create(
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "metadata": {
                            "name": f"{name}-{p}",
                            "namespace": "bench",
                            "labels": {"app": name},
                            "annotations": {KEY: json.dumps(REC.requests)},
                        },
                        "spec": {
                            "containers": [
                                {"name": "app", "resources": {"requests": {"memory": "512Mi"}}}
                            ]
                        },
                        "status": {
                            "phase": "Running",
                            "conditions": [{"type": "Ready", "status": "True"}],
                        },
                    }
                )
            refs.append(OwnerRef(namespace="bench", kind=WorkloadKind.DEPLOYMENT, name=name))
        start = datetime.now(UTC)
        api.clear_journal()
        began = time.monotonic()
        for ref in refs:
            cohort = None
            for _ in range(samples):
                result = acts.sample_cohort(
                    SampleCohortInput(
                        cluster=CLUSTER,
                        owner=ref,
                        recommendation=REC,
                        window_started_at=start,
                        cohort=cohort,
                    )
                )
                cohort = result.cohort
                assert result.adopted_healthy == pods
        carried_time = time.monotonic() - began
        carried = len(api.journal)
        api.clear_journal()
        began = time.monotonic()
        for ref in refs:  # a window's sample: the owner read, then its pods listed
            for _ in range(samples):
                acts.sample_cohort(
                    SampleCohortInput(
                        cluster=CLUSTER, owner=ref, recommendation=REC, window_started_at=start
                    )
                )
        ours_time = time.monotonic() - began
        ours = len(api.journal)
        lists = len(api.requests("list"))
        api.clear_journal()
        began = time.monotonic()
        core = CoreV1Api(api_client(url=api.url))
        for ref in refs:  # the naive way: read the owner, then GET every pod by name
            for _ in range(samples):
                CustomObjectsApi(core.api_client).get_namespaced_custom_object(
                    "apps", "v1", "bench", "deployments", ref.name
                )
                for p in range(pods):
                    core.read_namespaced_pod(f"{ref.name}-{p}", "bench", _preload_content=False)
        naive_time = time.monotonic() - began
        naive = len(api.journal)
        n = owners * samples
        say(lines, f"  {owners} owners x {pods} pods x {samples} samples:")
        say(
            lines,
            f"    a window's sample: {ours / n:.2f} requests ({(ours - lists) / n:.0f} GET of the"
            f" owner, {lists / n:.0f} LIST of pods), {ours_time / n * 1000:.2f} ms",
        )
        say(
            lines,
            f"    {samples} samples with the cohort query carried after the first (a reopened"
            f" window): {carried / n:.2f} requests a sample, {carried_time / n * 1000:.2f} ms",
        )
        say(
            lines,
            f"    naive: {naive / n:.2f} requests per sample (1 GET owner + {pods} GET pod),"
            f" {naive_time / n * 1000:.2f} ms per sample",
        )
        say(
            lines,
            f"    ratio: {naive / ours:.1f}x fewer requests, {naive_time / ours_time:.1f}x less time",
        )


def writes_per_transition(lines: Lines) -> None:
    """From a whole simulated story (oom-rollback): writes at the API server per transition."""
    scenario = Scenario.load(SCENARIOS / "oom-rollback.yaml")
    report = asyncio.run(run_scenario(scenario, on_line=lambda _: None))
    journal = report.requests
    owner_writes = [
        r for r in journal if r.verb in ("patch", "update") and "/deployments/" in r.path
    ]
    events = [r for r in journal if r.verb == "create" and r.path.endswith("/events")]
    transitions = len(report.transitions)
    say(
        lines,
        f"  oom-rollback story: {transitions} transitions, {len(owner_writes)} owner writes,"
        f" {len(events)} Events: {len(owner_writes) / transitions:.2f} owner writes per transition"
        f" (state, plus the rollback annotations when they change), and no write without a transition",
    )
