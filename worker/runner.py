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
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from activities.clusters import ClusterGuard
from worker.flags import MAX_CACHED_WORKFLOWS
from workflows.notify import NotifyWorkflow
from workflows.rollback import RollbackWorkflow


def activity_methods(implementation: object) -> list[Callable[..., Any]]:
    """The bound methods of ``implementation`` decorated with ``@activity.defn``."""
    return [
        member
        for _, member in inspect.getmembers(implementation, inspect.ismethod)
        if hasattr(member, "__temporal_activity_definition")
    ]


# The sandbox still guards each run (restricted calls, isolated globals), but our ``workflows``
# package is imported once and shared instead of re-imported per run: it is deterministic by
# construction (no I/O, no clock, no randomness; import-linter and the replay tests hold it
# there), and re-importing it, pydantic models and all, cost most of a cached workflow's memory
# (bench/RESULTS.md, "Memory"). ``promql_parser`` (a compiled parser the policy models check
# queries with, which keeps no state) is shared too.
SANDBOXED = SandboxedWorkflowRunner(
    restrictions=SandboxRestrictions.default.with_passthrough_modules("workflows", "promql_parser")
)

# Workflows kept in memory between tasks. A monitoring window waits on one timer and wakes once
# when it ends, so a window needs no cached workflow: past this many, the least recently used is
# evicted and replays its short history (about 20 events) when its timer fires. Sizing
# (docs/operating/scale.md, "Scale"): memory ~ WORKER_BASE_MIB + CACHED_WORKFLOW_KIB per cached
# workflow, a margin over bench/RESULTS.md's measures ("Memory": 99 KiB each; "P3").
WORKER_BASE_MIB = 160
CACHED_WORKFLOW_KIB = 110


def worker_memory_mib(cached_workflows: int) -> float:
    """The worker's expected resident memory with a full cache of ``cached_workflows``."""
    return WORKER_BASE_MIB + cached_workflows * CACHED_WORKFLOW_KIB / 1024


def build_worker(
    client: Client,
    task_queue: str,
    activities: object,
    guard: ClusterGuard,
    max_cached_workflows: int = MAX_CACHED_WORKFLOWS,
    deployment: WorkerDeploymentVersion | None = None,
    workflows: Sequence[type] = (RollbackWorkflow, NotifyWorkflow),
    **options: Any,
) -> Worker:
    """The worker of one cluster (``guard`` refuses any other's activities); with
    ``deployment``, a version of a Worker Deployment whose workflows are pinned to it
    (docs/operating/upgrade.md, "Worker versioning")."""
    methods = activity_methods(activities)
    sync = any(not inspect.iscoroutinefunction(m) for m in methods)
    return Worker(
        client,
        task_queue=task_queue,
        workflows=list(workflows),
        activities=methods,
        activity_executor=ThreadPoolExecutor(max_workers=16) if sync else None,
        interceptors=[guard],
        graceful_shutdown_timeout=timedelta(seconds=20),
        max_cached_workflows=max_cached_workflows,
        workflow_runner=options.pop("workflow_runner", SANDBOXED),
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
