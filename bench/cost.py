"""The cost of one attempt: a successful attempt per window length (at once on one dev server,
the real workflow and activities against the emulator), history events, activities, timers and
Kubernetes requests by verb, the same for every window; a successful and an OOM attempt on
the local-activity path and the regular one side by side, with billable actions
(``bench.actions``); and the Prometheus queries of an attempt with health checks."""

from __future__ import annotations

import asyncio
import json
import tempfile
import uuid
from collections import Counter
from pathlib import Path

from activities.clusters import ClusterGuard
from bench import CLUSTER, actions
from bench.harness import (
    OOM,
    READY,
    REC,
    Lines,
    make_workload,
    met,
    policy_doc,
    say,
    scratch_server,
)
from bench.regular import RegularActivitiesWorkflow
from sim.apiserver import KubeEmulator
from sim.scenario import SCENARIOS, Scenario, World, play
from worker.config import TemporalConfig
from worker.intake.budget import ATTEMPT_ACTIONS
from worker.kube import activities_for, api_client
from worker.runner import build_worker
from worker.temporal import observe
from workflows.activity_api import CHECK_HEALTH, OwnerRef, PolicySettings, rollback_id
from workflows.contract import Actuation, Mode, Obj, WorkloadKind
from workflows.notify import NotifyWorkflow
from workflows.policy import HealthChecks, RollbackPolicy
from workflows.rollback import RollbackWorkflow


def resolved(doc: Obj) -> PolicySettings:
    """The policy an attempt here runs under, as the intake resolves and carries it when it
    starts one."""
    return PolicySettings.of(RollbackPolicy.model_validate(doc))


async def attempt_cost(windows: list[str], lines: Lines) -> None:
    """One successful attempt per window length, all at once on one dev server: the real workflow
    and the real activities against the emulator, which counts every request by verb."""
    with KubeEmulator() as api, scratch_server() as server:
        client = await TemporalConfig.at(server.address).connect()
        queue = f"bench-cost-{uuid.uuid4().hex[:6]}"
        refs, policies = [], []
        for i, window in enumerate(windows):
            ns = f"cost{i}"
            doc = policy_doc("p", window, ns)
            api.store.create(doc)
            make_workload(api, ns, "web", 3, READY)
            refs.append(OwnerRef(namespace=ns, kind=WorkloadKind.DEPLOYMENT, name="web"))
            policies.append(resolved(doc))
        acts = activities_for(api_client(url=api.url), Actuation.ANNOTATIONS)
        async with build_worker(client, queue, acts, ClusterGuard(CLUSTER)):
            handles = [
                await observe(client, CLUSTER, queue, ref, REC, turn=1, policy=policy)
                for ref, policy in zip(refs, policies, strict=True)
            ]
            results = await asyncio.gather(*(h.result() for h in handles))
        assert all(r.mode is Mode.MONITORING_SUCCEEDED for r in results), results
        rows = []
        for window, ref, handle in zip(windows, refs, handles, strict=True):
            shape = actions.shape((await handle.fetch_history()).events)
            mine = api.requests(None, f"/namespaces/{ref.namespace}/")
            verbs = Counter(
                f"{r.verb} {r.path.split('/namespaces/', 1)[1].split('/')[1]}" for r in mine
            )
            rows.append((window, shape, verbs))
        cluster_lists = len(api.requests("list", "/clusterrollbackpolicies$"))
    for window, shape, verbs in rows:
        requests = ", ".join(f"{n} {what}" for what, n in sorted(verbs.items()))
        say(
            lines,
            f"  {window:>4} window: {shape['events']} history events, {shape['activities']} activities,"
            f" {shape['local']} local activities, {shape['timers']} timer, {shape['signals']} signal,"
            f" {shape['actions']} billable actions; Kubernetes: {sum(verbs.values())}"
            f" requests ({requests}) + {cluster_lists // len(rows)} LIST of cluster policies",
        )
    first = rows[0]
    same = all(r[1] == first[1] and r[2] == first[2] for r in rows)
    pod_lists = first[2].get("list pods", 0)
    say(
        lines,
        f"  the same for every window: {'yes' if same else 'NO'}; pod LISTs {pod_lists}"
        f" (target <= 2{met(pod_lists <= 2)}), history events {first[1]['events']}"
        f" (target <= 40{met(first[1]['events'] <= 40)})",
    )
    assert same, rows
    # The intake's Temporal budget charges each start this much (worker.intake.budget).
    assert first[1]["actions"] == ATTEMPT_ACTIONS, (first[1], ATTEMPT_ACTIONS)


PATHS = {"local activities": RollbackWorkflow, "regular activities": RegularActivitiesWorkflow}


async def attempt_paths(lines: Lines) -> None:
    """The same attempts on both paths side by side, one dev server: a successful one, and an OOM
    one failing permanently after two turns (two runs: the second starts when the pods are seen
    again after the backoff, as the intake does). Billable actions by ``bench.actions.RULES``."""
    with KubeEmulator() as api, scratch_server() as server:
        client = await TemporalConfig.at(server.address).connect()
        acts = activities_for(api_client(url=api.url), Actuation.ANNOTATIONS)
        costs: dict[tuple[str, str], dict[str, int]] = {}
        for i, (path, workflow_class) in enumerate(PATHS.items()):
            queue = f"bench-paths-{i}-{uuid.uuid4().hex[:6]}"
            async with build_worker(
                client,
                queue,
                acts,
                ClusterGuard(CLUSTER),
                workflows=[workflow_class, NotifyWorkflow],
            ):
                for fate, status, turns in (("success", READY, 1), ("oom", OOM, 2)):
                    ns = f"{fate}-{i}"
                    doc = policy_doc("p", "1s", ns, max_attempts=turns)
                    api.store.create(doc)
                    make_workload(api, ns, "web", 3, status)
                    ref = OwnerRef(namespace=ns, kind=WorkloadKind.DEPLOYMENT, name="web")
                    shapes = []
                    policy = resolved(doc)
                    for turn in range(1, turns + 1):
                        # As the intake starts it: with the turn and policy it opens.
                        handle = await observe(
                            client, CLUSTER, queue, ref, REC, turn=turn, policy=policy
                        )
                        await handle.result()
                        shapes.append(actions.shape((await handle.fetch_history()).events))
                    costs[path, fate] = actions.total(shapes)
                    end = (await handle.result()).mode
                    want = Mode.MONITORING_SUCCEEDED if fate == "success" else Mode.FAILED_PERMANENT
                    assert end is want, (path, fate, end)
    for (path, fate), c in costs.items():
        say(
            lines,
            f"  {fate:>7}, {path}: {c['events']} history events, {c['activities']} activities,"
            f" {c['local']} local activities, {c['timers']} timers, {c['signals']} signals,"
            f" {c['actions']} billable actions",
        )
    for fate in ("success", "oom"):
        before, after = costs["regular activities", fate], costs["local activities", fate]
        assert before["activities"] == after["activities"] + after["local"], (fate, costs)
        say(
            lines,
            f"  {fate}: events {before['events']} -> {after['events']}, billable actions"
            f" {before['actions']} -> {after['actions']} (same effects: {before['activities']}"
            " activities on the old path)",
        )
    ok = costs["local activities", "success"]
    say(
        lines,
        f"  a successful attempt: {ok['events']} history events (target <= 20"
        f"{met(ok['events'] <= 20)}), {ok['actions']} billable actions (target <= 5"
        f"{met(ok['actions'] <= 5)})",
    )
    say(lines, "  billable actions counted per history event (Temporal Cloud's rules):")
    for event, n, how in actions.RULES:
        say(lines, f"    {event}: {n} ({how})")


async def health_cost(lines: Lines) -> None:
    """What health checks cost an attempt: the shipped ``health-checks`` story (a real
    Prometheus scraping the simulated kubelets), each attempt's Prometheus queries read from
    its ``check_health`` result in its history, with its history events."""
    scenario = Scenario.load(SCENARIOS / "health-checks.yaml")
    with tempfile.TemporaryDirectory(prefix="bench-health-") as tmp:
        world = World(scenario, lambda line: None, Path(tmp))
        try:
            await world.start()
            await play(world)
            while world.problems():  # every attempt at its end
                await asyncio.sleep(0.2)
            client = await TemporalConfig.at(world.temporal.address).connect()
            rows = []
            for key in scenario.expect:
                ns, kind, name = key.split("/")
                owner = OwnerRef(namespace=ns, kind=WorkloadKind(kind), name=name)
                handle = client.get_workflow_handle(rollback_id(scenario.cluster, owner))
                history = (await handle.fetch_history()).events
                checking = {  # the scheduled check_health activities, by their event
                    e.event_id
                    for e in history
                    if e.activity_task_scheduled_event_attributes.activity_type.name == CHECK_HEALTH
                }
                asked = [
                    json.loads(done.result.payloads[0].data)
                    for e in history
                    if e.HasField("activity_task_completed_event_attributes")
                    and (done := e.activity_task_completed_event_attributes).scheduled_event_id
                    in checking
                ]
                rows.append((key, *_checks(scenario, ns), len(asked), len(history), asked))
        finally:
            await world.stop()
    for key, names, expected, calls, events, asked in rows:
        queries = sum(a["queries"] for a in asked)
        say(
            lines,
            f"  {key} ({', '.join(names)}): check_health {calls} time(s), {queries} Prometheus"
            f" queries per attempt (target {expected}: one per check at the window's end, one"
            f" more per bound on the baseline{met(queries == expected)}); {events} history events",
        )


def _checks(scenario: Scenario, namespace: str) -> tuple[list[str], int]:
    """The checks of the story's policy in ``namespace``, and the queries they need."""
    spec = next(p["spec"] for p in scenario.policies if p["metadata"].get("namespace") == namespace)
    checks = HealthChecks.model_validate(spec["healthChecks"])
    builtin = [("cpuThrottling", checks.cpu_throttling), ("memoryHeadroom", checks.memory_headroom)]
    names = [name for name, bounds in builtin if bounds is not None]
    expected = sum(1 + (bounds.max_increase_points is not None) for _, bounds in builtin if bounds)
    names += [q.name for q in checks.queries]
    expected += sum(1 + (q.max_increase_percent is not None) for q in checks.queries)
    return names, expected
