"""The Temporal worker process: registers ``RollbackWorkflow`` and an activity implementation.

Graceful shutdown on SIGTERM/SIGINT: the worker stops polling, lets running activities finish
(up to ``graceful_shutdown_timeout``) and exits; workflows are durable and continue on any other
worker, or on this one when it comes back.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import signal
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from temporalio.client import Client
from temporalio.worker import Worker

from workflows.rollback import RollbackWorkflow

log = logging.getLogger(__name__)


def activity_methods(implementation: object) -> list[Callable[..., Any]]:
    """The bound methods of ``implementation`` decorated with ``@activity.defn``."""
    return [
        member
        for _, member in inspect.getmembers(implementation, inspect.ismethod)
        if hasattr(member, "__temporal_activity_definition")
    ]


def build_worker(client: Client, task_queue: str, activities: object, **options: Any) -> Worker:
    methods = activity_methods(activities)
    sync = any(not inspect.iscoroutinefunction(m) for m in methods)
    return Worker(
        client,
        task_queue=task_queue,
        workflows=[RollbackWorkflow],
        activities=methods,
        activity_executor=ThreadPoolExecutor(max_workers=16) if sync else None,
        graceful_shutdown_timeout=timedelta(seconds=20),
        **options,
    )


async def run_until_signalled(worker: Worker) -> None:
    """Run ``worker`` until SIGTERM or SIGINT, then shut it down gracefully."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with worker:
        log.info("worker polling task queue %s", worker.task_queue)
        await stop.wait()
        log.info("shutting down: finishing running activities")
