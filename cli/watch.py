"""``get -w``: each change as the cluster's watches tell it, not a look again on a timer.

The workloads: the owners' rollback-state annotation, which every transition writes, through the
intake's own workload informers (``worker.workloads``: one LIST and WATCH per kind, a kind the
cluster does not serve left out), each change printed as a row the moment the watch shows it.
The policies: their informers wake a fresh read of the policies' rows (their status is computed
from what they match), and the rows that changed are printed.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from functools import partial
from typing import TypeVar

from kubernetes.client import ApiClient, CoreV1Api, CustomObjectsApi

from activities.lookup import read_state
from cli.ops import Row
from worker.informer import Informer, Informers
from worker.workloads import WorkloadCache
from workflows.activity_api import OwnerRef, rollback_id
from workflows.contract import API_GROUP, API_VERSION, GROUP_VERSION, Obj

T = TypeVar("T")


def row_of(cluster: str | None, owner: OwnerRef, obj: Obj) -> Row | None:
    """The row ``get`` prints for an owner, from its state annotation (None: it has none)."""
    state, _ = read_state(obj)
    if state is None:
        return None
    return Row(
        workflow_id=rollback_id(cluster, owner) if cluster else "",
        cluster=cluster or "",
        namespace=owner.namespace,
        workload=owner.workload,
        mode=state.mode.value,
        turn=state.turn,
        policy=str(state.policy) if state.policy else "",
        fingerprint=state.active_recommendation_fingerprint,
        status="Completed" if state.mode.terminal else "Running",
        started=state.last_transition_time,
    )


async def _stream(informers: list[Informer], queue: asyncio.Queue[T]) -> AsyncIterator[T]:
    """The informers run; what their handlers put on ``queue`` is yielded, until the caller
    stops."""
    running = Informers()
    try:
        for informer in informers:
            running.launch(informer)
        while True:
            yield await queue.get()
    finally:
        await asyncio.to_thread(running.end)


async def owner_rows(
    api: ApiClient, cluster: str | None, namespace: str | None, selector: str | None = None
) -> AsyncIterator[Row]:
    """A row each time an owner's rollback state changes (in ``namespace``, or any): a
    transition, not the owner's other changes (its status, its scale)."""
    loop, queue = asyncio.get_running_loop(), asyncio.Queue[Row]()
    shown: dict[str, tuple[object, ...]] = {}  # owner -> its state as last seen
    lock = threading.Lock()

    def on_owner(event: str, owner: OwnerRef, obj: Obj) -> None:
        if event == "DELETED" or namespace not in (None, owner.namespace):
            return
        row = row_of(cluster, owner, obj)
        if row is None:
            return
        seen = (row.mode, row.turn, row.fingerprint, row.started)
        with lock:  # the kinds' informers run in threads of their own
            if shown.get(f"{owner}") == seen:
                return
            shown[f"{owner}"] = seen
        # What a kind's first LIST shows seeds ``shown`` (get printed it); after it, a change.
        if cache.owners[owner.kind].synced.is_set():
            loop.call_soon_threadsafe(queue.put_nowait, row)

    cache = WorkloadCache(CoreV1Api(api), CustomObjectsApi(api), on_owner, label_selector=selector)
    async for row in _stream(list(cache.owners.values()), queue):
        yield row


async def policy_changes(api: ApiClient) -> AsyncIterator[None]:
    """Once each time a policy of either kind changes (its spec, its status)."""
    custom = CustomObjectsApi(api)
    loop, queue = asyncio.get_running_loop(), asyncio.Queue[None]()
    informers = []
    for plural, kind in (("rollbackpolicies", "RollbackPolicy"),
                         ("clusterrollbackpolicies", "ClusterRollbackPolicy")):  # fmt: skip
        listing = partial(custom.list_cluster_custom_object, API_GROUP, API_VERSION, plural)
        informer = Informer(plural, listing, lambda *_: None, type_meta=(GROUP_VERSION, kind))

        def changed(*_: object, of: Informer = informer) -> None:
            if of.synced.is_set():  # its first LIST is what get printed
                loop.call_soon_threadsafe(queue.put_nowait, None)

        informer.handler = changed
        informers.append(informer)
    async for tick in _stream(informers, queue):
        yield tick
