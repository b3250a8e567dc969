"""``python -m bench.memory RUNNER N ADDRESS``: the memory one cached workflow costs a worker.

Run in a fresh process per runner (RSS is not given back to the system, so variants measured in
one process would blur): start a worker, warm it up with one workflow, then start N rollback
workflows whose window is an hour, wait until every one is waiting on its window's timer (all in
the worker's cache), and print one JSON line: RSS before and after, and the difference per
workflow. RUNNER is how the worker runs workflow code:

- ``sandboxed``: the SDK's default sandbox, which re-imports each workflow's module per run;
- ``passthrough``: the sandbox, with our deterministic ``workflows`` package passed through
  (imported once, shared by every run; what ``worker.runner`` ships);
- ``unsandboxed``: no sandbox at all (for comparison only).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from datetime import timedelta
from pathlib import Path

from temporalio.worker import UnsandboxedWorkflowRunner, WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from activities.clusters import ClusterGuard
from bench import CLUSTER
from bench.workloads import InstantCluster
from worker.config import TemporalConfig
from worker.runner import SANDBOXED, build_worker
from workflows.activity_api import OwnerRef, rollback_id
from workflows.contract import Mode, WorkloadKind
from workflows.rollback import RollbackInput, RollbackWorkflow

RUNNERS: dict[str, WorkflowRunner] = {
    "sandboxed": SandboxedWorkflowRunner(),
    "passthrough": SANDBOXED,
    "unsandboxed": UnsandboxedWorkflowRunner(),
}


def memory_mib(pid: int | str = "self", field: str = "VmRSS") -> float:
    """A memory field of /proc/PID/status in MiB: VmRSS now, VmHWM the peak."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def measure(runner: str, n: int, address: str) -> dict[str, float]:
    client = await TemporalConfig.at(address).connect()
    queue = f"memory-{runner}-{uuid.uuid4().hex[:6]}"
    cluster = InstantCluster(window=timedelta(hours=1))

    async def start(name: str) -> None:
        owner = OwnerRef(namespace="bench", kind=WorkloadKind.DEPLOYMENT, name=name)
        await client.start_workflow(
            RollbackWorkflow.run,
            RollbackInput(cluster=CLUSTER, owner=owner, recommendation=cluster.recommendation),
            id=f"{rollback_id(CLUSTER, owner)}-{queue}",
            task_queue=queue,
        )

    async def waiting(count: int) -> None:
        query = f'TaskQueue = "{queue}" AND RollbackMode = "{Mode.MONITORING}"'
        while (await client.count_workflows(query)).count < count:
            await asyncio.sleep(0.5)
        await asyncio.sleep(3)  # the last ones' timers are started in the same task

    async with build_worker(
        client, queue, cluster, ClusterGuard(CLUSTER), 10 * n, workflow_runner=RUNNERS[runner]
    ):
        await start("warm-up")
        await waiting(1)
        before = memory_mib()
        limit = asyncio.Semaphore(100)

        async def bounded(i: int) -> None:
            async with limit:
                await start(f"w{i}")

        await asyncio.gather(*(bounded(i) for i in range(n)))
        await waiting(n + 1)
        after = memory_mib()
    return {"before": before, "after": after, "kib_per_workflow": (after - before) * 1024 / n}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(measure(sys.argv[1], int(sys.argv[2]), sys.argv[3]))), flush=True)
    # The figure is out. Leave without interpreter finalization, which the SDK's native threads
    # can race (1 in 4 runs here aborted with "PyGILState_Release ... finalizing").
    os._exit(0)
