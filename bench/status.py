"""Policy status writes while workloads adopt at once under a few policies (real worker and
intake): writes per transition, the most writes of one policy in any 2 s; and one status pass
over many owners and policies."""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes.client import CoreV1Api, CustomObjectsApi

from bench import CLUSTER
from bench.harness import (
    OOM,
    READY,
    Lines,
    make_workload,
    oom,
    policy_doc,
    say,
    scratch_server,
)
from sim.apiserver import KubeEmulator
from sim.scenario import WorkerProcess
from worker.config import TemporalConfig
from worker.intake import Intake
from worker.kube import api_client
from workflows.contract import Mode, Obj, WorkloadKind
from workflows.policy import ClusterRollbackPolicy, RollbackPolicy
from workflows.policy_status import Workload, status_of, tally
from workflows.selection import PolicyIndex, WorkloadRef
from workflows.state import OwnerState, PolicyRef


async def status_writes(workloads: int, policies: int, lines: Lines) -> None:
    """Policy status writes during a burst: every workload adopts at once under ``policies``
    namespaced policies (one in ten OOMs: rollback, then failedPermanent), the real worker and
    intake; status writes counted at the emulator against the transitions they summarise."""
    with scratch_server() as server, tempfile.TemporaryDirectory() as tmp, KubeEmulator() as api:
        writes: list[tuple[float, str]] = []

        def on_write(kind: str, rtype: Any, obj: Obj) -> None:
            if rtype.kind == "RollbackPolicy" and kind == "MODIFIED":
                writes.append((time.monotonic(), obj["metadata"]["namespace"]))

        api.store.listeners.append(on_write)
        for p in range(policies):
            api.store.create(policy_doc("policy", "2s", f"ns{p}"))
        queue = "bench-status"
        worker = WorkerProcess(
            server.address, queue, api.url, "annotations", Path(tmp) / "w.log", cluster=CLUSTER
        )
        worker.start()
        client = await TemporalConfig.at(server.address).connect()
        kube = api_client(url=api.url)
        intake = Intake(
            CoreV1Api(kube),
            CustomObjectsApi(kube),
            client,
            CLUSTER,
            queue,
            asyncio.get_running_loop(),
        )
        await asyncio.to_thread(intake.start)
        await asyncio.sleep(3)  # the first statuses (nothing matched yet) are written
        writes.clear()
        began = time.monotonic()
        for w in range(workloads):
            make_workload(api, f"ns{w % policies}", f"w{w}", 2, OOM if oom(w) else READY)
        names = [(f"ns{w % policies}", f"w{w}") for w in range(workloads)]

        def states() -> list[Obj]:
            found = []
            for ns, name in names:
                meta = api.store.get(api.store.rtype("Deployment"), ns, name)["metadata"]
                raw = (meta.get("annotations") or {}).get("rightsizing.kubex.ai/rollback-state")
                found.append(json.loads(raw) if raw else {})
            return found

        while time.monotonic() - began < 300:
            if all(Mode(s["mode"]).terminal for s in states() if s) and all(states()):
                break
            await asyncio.sleep(1)
        await asyncio.sleep(2 * intake.status.period + 1)  # the last status is written
        final = states()
        transitions = sum(len(s.get("history", [])) for s in final)
        statuses = [
            api.store.get(api.store.rtype("RollbackPolicy"), f"ns{p}", "policy")["status"]
            for p in range(policies)
        ]
        failed = sum(s.get("failedWorkloads", 0) for s in statuses)
        active = sum(s.get("activeTrackedWorkloads", 0) for s in statuses)
        passes = intake.status.passes
        await asyncio.to_thread(intake.stop)
        worker.stop()
        busiest = max(
            (sum(1 for t2, n2 in writes if n2 == n and t <= t2 < t + 2.0) for t, n in writes),
            default=0,
        )
        expected_failed = sum(oom(w) for w in range(workloads))
        assert (failed, active) == (expected_failed, 0), (failed, active, expected_failed)
        say(
            lines,
            f"  {workloads} workloads adopting at once under {policies} policies: {transitions}"
            f" transitions, {len(writes)} status writes = {len(writes) / transitions:.3f} per"
            f" transition ({transitions / max(len(writes), 1):.1f}x fewer than a write per"
            f" transition); at most {busiest} write(s) of one policy in any 2 s;"
            f" {passes} recomputations in all",
        )
        say(
            lines,
            f"    final statuses right: failedWorkloads sum {failed} = the {expected_failed} OOM"
            " workloads, activeTrackedWorkloads 0",
        )


def status_pass(owners: int, policies: int, lines: Lines) -> None:
    """One status recomputation (``workflows.policy_status``) over a large cluster: its cost is
    what the intake's leader spends at most once per period while anything changes."""
    index = PolicyIndex()
    for p in range(policies):
        index.upsert(RollbackPolicy.model_validate(policy_doc(f"p{p}", "5m", f"ns{p % 20}")))
    index.upsert(ClusterRollbackPolicy.model_validate(policy_doc("all", "5m")))
    now = datetime.now(UTC)
    workloads = [
        Workload(
            WorkloadRef(WorkloadKind.DEPLOYMENT, f"ns{w % 20}", f"w{w}", {"app": f"w{w}"}),
            OwnerState(
                mode=Mode.FAILED_PERMANENT if oom(w) else Mode.MONITORING,
                active_recommendation_fingerprint="f",
                turn=1,
                policy=PolicyRef(kind="ClusterRollbackPolicy", name="all"),
                last_transition_time=now,
            ),
        )
        for w in range(owners)
    ]
    began = time.perf_counter()
    counts = tally(index, workloads)
    for policy in index.candidates("ns0"):
        status_of(policy, counts.get(str(PolicyRef.of(policy))), None, now)
    took = time.perf_counter() - began
    say(
        lines,
        f"  one recomputation over {owners} owners x {policies + 1} policies (20 namespaces):"
        f" {took * 1000:.0f} ms ({took / owners * 1e6:.1f} us per owner)",
    )
