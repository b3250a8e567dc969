"""``python -m bench.floor_worker ADDRESS TASK_QUEUE``: the floor workflow (``bench.workloads``)
on a worker process of its own, set up as the shipped worker is (its cache of workflows, its
sandbox with our modules passed through), for P3's floor run (``bench.p3``)."""

from __future__ import annotations

import asyncio
import sys
from datetime import timedelta

from temporalio.worker import Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from bench.workloads import FloorWorkflow, InstantCluster
from worker.config import TemporalConfig
from worker.flags import MAX_CACHED_WORKFLOWS
from worker.process import stop_on_signals


async def main(address: str, task_queue: str) -> None:
    client = await TemporalConfig.at(address).connect()
    stop = stop_on_signals()
    async with Worker(
        client,
        task_queue=task_queue,
        workflows=[FloorWorkflow],
        activities=[InstantCluster().noop],
        max_cached_workflows=MAX_CACHED_WORKFLOWS,
        graceful_shutdown_timeout=timedelta(seconds=20),
        workflow_runner=SandboxedWorkflowRunner(
            restrictions=SandboxRestrictions.default.with_passthrough_modules("workflows", "bench")
        ),
    ):
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:3]))
