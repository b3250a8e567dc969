"""The Temporal worker: ``RollbackWorkflow`` and an activity implementation on one task queue.

On shutdown the worker stops polling and lets running activities finish (up to
``graceful_shutdown_timeout``); workflows are durable and continue on any other worker, or on
this one when it comes back.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from temporalio.client import Client
from temporalio.common import VersioningBehavior, WorkerDeploymentVersion
from temporalio.worker import Worker, WorkerDeploymentConfig

from workflows.rollback import RollbackWorkflow


def activity_methods(implementation: object) -> list[Callable[..., Any]]:
    """The bound methods of ``implementation`` decorated with ``@activity.defn``."""
    return [
        member
        for _, member in inspect.getmembers(implementation, inspect.ismethod)
        if hasattr(member, "__temporal_activity_definition")
    ]


# Workflows kept in memory between tasks. Sized for thousands of concurrently monitored
# workloads: a workflow evicted from the cache replays its whole history on its next sample
# (the SDK's default is 1,000; see bench/RESULTS.md, P3).
MAX_CACHED_WORKFLOWS = 10_000


def build_worker(
    client: Client,
    task_queue: str,
    activities: object,
    max_cached_workflows: int = MAX_CACHED_WORKFLOWS,
    deployment: WorkerDeploymentVersion | None = None,
    workflows: Sequence[type] = (RollbackWorkflow,),
    **options: Any,
) -> Worker:
    """The worker; with ``deployment``, a version of a Worker Deployment whose workflows are
    pinned to it (README, "Worker versioning")."""
    methods = activity_methods(activities)
    sync = any(not inspect.iscoroutinefunction(m) for m in methods)
    return Worker(
        client,
        task_queue=task_queue,
        workflows=list(workflows),
        activities=methods,
        activity_executor=ThreadPoolExecutor(max_workers=16) if sync else None,
        graceful_shutdown_timeout=timedelta(seconds=20),
        max_cached_workflows=max_cached_workflows,
        deployment_config=(
            WorkerDeploymentConfig(
                version=deployment,
                use_worker_versioning=True,
                default_versioning_behavior=VersioningBehavior.PINNED,
            )
            if deployment is not None
            else None
        ),
        **options,
    )
