"""RollbackWorkflow on the real Temporal dev server, with short real durations.

The cluster side is ``FakeCluster`` (our own activity boundary); every scenario also replays the
histories it produced, so a non-deterministic change fails here before it reaches the recorded
histories of ``test_replay.py``.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import ClassVar

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.converter import decode_search_attributes
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import (
    StartActivityInput,
    StartChildWorkflowInput,
    UnsandboxedWorkflowRunner,
    Worker,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
    WorkflowOutboundInterceptor,
)
from temporalio.workflow import ActivityHandle, ChildWorkflowHandle

from activities.clusters import ClusterGuard
from cli import ops
from tests import CLUSTER
from tests.workflow.before_updates import RollbackWorkflowBeforeUpdates
from tests.workflow.fake_cluster import FakeCluster
from tests.workflow.helpers import (
    HASHED_KEY,
    check_replay,
    new_owner,
    rec,
    running_worker,
    settings,
    wait_for,
)
from worker import temporal as control
from worker.runner import build_worker
from worker.temporal import observe
from workflows.activity_api import LOAD_OWNER, ROLL_BACK, OwnerRef, rollback_id
from workflows.contract import EventReason, FailureReason, Mode, RollbackTarget
from workflows.machine import RollbackState
from workflows.notify import Severity
from workflows.pause import Pause, PauseScope
from workflows.policy import EarlyVerdict
from workflows.rollback import (
    CancelSignal,
    ReopenSignal,
    ResumeSignal,
    RollbackInput,
    RollbackWorkflow,
    SuspectSignal,
)
from workflows.state import OwnerState, ResourceSnapshot
from workflows.wake import Trigger

OOM = rec("256Mi")  # below the fake app's 512Mi working set
FITS = rec("768Mi")
PREVIOUS = ResourceSnapshot.of({"app": {"memory": "900Mi"}}, {})


def succeeded_before(fingerprint: str = "previous0000000") -> str:
    """A stored state from an earlier success, so lastSuccessful has something to restore."""
    return OwnerState(
        mode=Mode.MONITORING_SUCCEEDED,
        active_recommendation_fingerprint=fingerprint,
        turn=1,
        last_successful_state=PREVIOUS,
        last_transition_time=datetime(2026, 1, 1).astimezone(),
    ).to_json()


@pytest.fixture
def cluster() -> FakeCluster:
    return FakeCluster()


@pytest.fixture
def task_queue() -> str:
    return f"tq-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def client(
    temporal_env: WorkflowEnvironment, cluster: FakeCluster, task_queue: str
) -> AsyncIterator[Client]:
    async with running_worker(temporal_env.client, task_queue, cluster):
        yield temporal_env.client


async def wait_until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "condition never held"
        await asyncio.sleep(0.05)


async def listed(
    client: Client, ref: OwnerRef, check: Callable[[ops.Row], bool], timeout: float = 10.0
) -> ops.Row:
    """The owner's row as ``rollbackctl get`` lists it, once it passes ``check`` (the list
    comes from visibility, which lags the workflow a little)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        rows = await ops.get(client, cluster=CLUSTER)
        row = next((r for r in rows if r.workflow_id == rollback_id(CLUSTER, ref)), None)
        if row is not None and check(row):
            return row
        assert asyncio.get_running_loop().time() < deadline, f"never listed so: {row}"
        await asyncio.sleep(0.1)


def span(state: OwnerState, from_mode: Mode, to_mode: Mode, turn: int) -> timedelta:
    """Workflow time between two recorded transitions of one turn."""
    times = {(h.mode, h.turn): h.time for h in state.history}
    return times[(to_mode, turn)] - times[(from_mode, turn)]


async def test_success_records_last_successful(
    client: Client, cluster: FakeCluster, task_queue: str
) -> None:
    """Started as the intake starts it (its turn and policy set with the start), a successful
    attempt upserts its search attributes once: for its verdict."""
    policy = settings()
    ref, owner = new_owner(cluster, policy)
    owner.apply(FITS)
    handle = await observe(client, CLUSTER, task_queue, ref, FITS, turn=1, policy=policy)
    result = await handle.result()

    assert (result.mode, result.turn, result.failure_reason) == (Mode.MONITORING_SUCCEEDED, 1, None)
    upserts = [
        decode_search_attributes(
            e.upsert_workflow_search_attributes_event_attributes.search_attributes
        )
        for e in (await handle.fetch_history()).events
        if e.HasField("upsert_workflow_search_attributes_event_attributes")
    ]
    assert upserts == [{"RollbackMode": ["monitoringSucceeded"]}]
    state = owner.state
    assert state is not None and state.last_successful_state == ResourceSnapshot.of(
        FITS.requests, {}
    )
    assert owner.event_reasons() == [
        EventReason.MONITORING_STARTED,
        EventReason.MONITORING_SUCCEEDED,
    ]
    assert span(state, Mode.MONITORING, Mode.MONITORING_SUCCEEDED, 1) >= timedelta(seconds=2)
    assert ("rollback", RollbackTarget.LAST_SUCCESSFUL) not in owner.journal
    # Its policy was carried from the start into the first read (``success`` is the same story
    # recorded before the policy was carried: its start has none, its first read resolves it).
    await check_replay(client, rollback_id(CLUSTER, ref), "success-carried-policy")


async def test_oom_two_turns_then_failed_permanent(
    client: Client, cluster: FakeCluster, task_queue: str
) -> None:
    ref, owner = new_owner(
        cluster, settings(backoff=1.0, multiply=1, max_attempts=2), state_json=succeeded_before()
    )
    owner.apply(OOM)
    first = await (await observe(client, CLUSTER, task_queue, ref, OOM)).result()
    assert (first.mode, first.turn, first.failure_reason) == (
        Mode.BACKED_OFF,
        1,
        FailureReason.OOM_KILLED,
    )
    # backedOff re-applied the recommendation; the intake sees it adopted again -> turn 2.
    assert all(p.recommendation == OOM for p in owner.pods)
    second = await (await observe(client, CLUSTER, task_queue, ref, OOM)).result()
    assert (second.mode, second.turn, second.failure_reason) == (
        Mode.FAILED_PERMANENT,
        2,
        FailureReason.OOM_KILLED,
    )

    state = owner.state
    assert state is not None and state.mode is Mode.FAILED_PERMANENT
    # Backoff waits against the formula: timePeriod 1s * multiplyByTurn 1 * turn.
    for turn, expected in ((1, timedelta(seconds=1)), (2, timedelta(seconds=2))):
        waited = span(
            state, Mode.BACKING_OFF, Mode.BACKED_OFF if turn == 1 else Mode.FAILED_PERMANENT, turn
        )
        assert expected <= waited < expected + timedelta(seconds=1.5), (turn, waited)
    assert owner.event_reasons() == [
        EventReason.MONITORING_STARTED,
        EventReason.ROLLING_BACK_STARTED,
        EventReason.BACKOFF_TURN_COMPLETED,
        EventReason.MONITORING_STARTED,
        EventReason.ROLLING_BACK_STARTED,
        EventReason.BACKOFF_EXHAUSTED,
    ]
    rollbacks = [e for e in owner.journal if e[0] == "rollback"]
    assert rollbacks == [("rollback", RollbackTarget.LAST_SUCCESSFUL)] * 2
    assert owner.rollback_annotation is None  # cleared when the turn completed
    assert all(
        p.requests["app"]["memory"] == "900Mi" for p in owner.pods
    )  # lastSuccessful restored
    message = next(m for r, m, _ in owner.events.values() if r == EventReason.ROLLING_BACK_STARTED)
    assert "5/5 pods OOMKilled (app)" in message and OOM.fingerprint in message
    # One notification per transition that matters, each with its own idempotency key.
    await wait_until(lambda: len(cluster.notified) == 3)
    notified = [(n.transition, n.turn, n.severity) for n in cluster.notified]
    assert sorted(notified) == sorted(
        [
            (Mode.ROLLING_BACK, 1, Severity.WARNING),
            (Mode.ROLLING_BACK, 2, Severity.WARNING),
            (Mode.FAILED_PERMANENT, 2, Severity.CRITICAL),
        ]
    )
    assert len({n.key for n in cluster.notified}) == 3
    assert all(n.reason is FailureReason.OOM_KILLED for n in cluster.notified)
    assert await check_replay(client, rollback_id(CLUSTER, ref), "notified-oom-two-turns") == 2
    # The notifications are listed under the owner, readably, and a filter on it finds them.
    query = (
        f'RollbackCluster = "{CLUSTER}" AND RollbackWorkload = "{ref.workload}"'
        f' AND RollbackNamespace = "{ref.namespace}" AND WorkflowType = "NotifyWorkflow"'
    )
    children: list[str] = []
    for _ in range(100):  # visibility lags a little behind the starts
        children = [wf.id async for wf in client.list_workflows(query)]
        if len(children) == 3:
            break
        await asyncio.sleep(0.1)
    prefix = f"notify/{CLUSTER}/{ref.namespace}/{ref.kind}/{ref.name}/"
    assert sorted(c.removeprefix(prefix).rsplit("/", 1)[0] for c in children) == [
        "failedPermanent/turn-2",
        "rollingBack/turn-1",
        "rollingBack/turn-2",
    ], children
    # A later sighting of the same recommendation wakes nothing: the run it starts ends at once
    # in failedPermanent, and notifies nothing (it used to notify failedPermanent again).
    again = await observe(client, CLUSTER, task_queue, ref, OOM)
    assert (await again.result()).mode is Mode.FAILED_PERMANENT
    events = [e async for e in again.fetch_history_events()]
    assert not any(e.HasField("start_child_workflow_execution_initiated_event_attributes")
                   for e in events)  # fmt: skip
    assert len(cluster.notified) == 3
    assert await check_replay(client, rollback_id(CLUSTER, ref), "wakes-nothing-after-failed") == 3


async def test_reopen_retries_a_failed_permanent_workload(
    client: Client, cluster: FakeCluster, task_queue: str
) -> None:
    """What an operator does about a failed workload once its cause is fixed: ``reopen``
    (``rollbackctl reopen`` or the control annotation) retries it from turn 1, the
    recommendation re-applied over the rolled-back resources."""
    ref, owner = new_owner(
        cluster, settings(backoff=0.5, multiply=1, max_attempts=1), state_json=succeeded_before()
    )
    owner.apply(OOM)
    failed = await (await observe(client, CLUSTER, task_queue, ref, OOM)).result()
    assert (failed.mode, failed.turn) == (Mode.FAILED_PERMANENT, 1)
    assert all(p.requests["app"]["memory"] == "900Mi" for p in owner.pods)  # rolled back

    before = await control.reopen(client, CLUSTER, task_queue, ref)  # refuses nothing now
    assert before.mode is Mode.FAILED_PERMANENT
    handle = client.get_workflow_handle_for(RollbackWorkflow.run, rollback_id(CLUSTER, ref))
    retried = await wait_for(handle, lambda s: s.mode is Mode.MONITORING)
    assert retried.turn == 1 and retried.failure_reason is None
    assert ("reapply", OOM.fingerprint) in owner.journal
    assert all(p.recommendation == OOM for p in owner.pods)  # the recommendation is back
    again = await handle.result()  # the fake app still OOMs on it: failed again, one turn
    assert (again.mode, again.turn) == (Mode.FAILED_PERMANENT, 1)
    assert owner.event_reasons().count(EventReason.MONITORING_STARTED) == 2
    assert (
        await check_replay(client, rollback_id(CLUSTER, ref), "retry-after-failed-permanent") == 2
    )


async def test_observe_only_decides_the_same_and_writes_no_rollback(
    client: Client, cluster: FakeCluster, task_queue: str
) -> None:
    ref, owner = new_owner(
        cluster,
        settings(backoff=1.0, max_attempts=1, observe_only=True),
        state_json=succeeded_before(),
    )
    owner.apply(OOM)
    result = await (await observe(client, CLUSTER, task_queue, ref, OOM)).result()
    assert (result.mode, result.failure_reason) == (Mode.FAILED_PERMANENT, FailureReason.OOM_KILLED)
    assert owner.event_reasons() == [
        EventReason.MONITORING_STARTED,
        EventReason.ROLLING_BACK_STARTED,
        EventReason.BACKOFF_EXHAUSTED,
    ]
    message = next(m for r, m, _ in owner.events.values() if r == EventReason.ROLLING_BACK_STARTED)
    assert "would roll back to lastSuccessful (app: requests memory=900Mi)" in message
    assert not [e for e in owner.journal if e[0] in ("rollback", "reapply")]  # no activity ran
    assert owner.rollback_annotation is None
    assert all(p.recommendation == OOM for p in owner.pods)  # nothing resized
    await check_replay(client, rollback_id(CLUSTER, ref), "observe-only")


async def test_adoption_below_threshold_rolls_back_to_manifest(
    client: Client, cluster: FakeCluster, task_queue: str
) -> None:
    ref, owner = new_owner(cluster, settings(target=RollbackTarget.MANIFEST, max_attempts=1))
    for pod in owner.pods[:2]:
        pod.ignores_resize = True  # 3 of 5 adopt: 60% < 80%
    owner.apply(FITS)
    result = await (await observe(client, CLUSTER, task_queue, ref, FITS)).result()
    assert (result.mode, result.failure_reason) == (
        Mode.FAILED_PERMANENT,
        FailureReason.ADOPTION_THRESHOLD_NOT_MET,
    )
    assert ("rollback", RollbackTarget.MANIFEST) in owner.journal
    assert all(p.requests["app"]["memory"] == "1Gi" for p in owner.pods)
    await check_replay(client, rollback_id(CLUSTER, ref), "below-threshold-manifest")


async def test_four_of_five_at_eighty_percent_passes(
    client: Client, cluster: FakeCluster, task_queue: str
) -> None:
    ref, owner = new_owner(cluster, settings())
    owner.pods[0].ignores_resize = True
    owner.apply(FITS)
    result = await (await observe(client, CLUSTER, task_queue, ref, FITS)).result()
    assert result.mode is Mode.MONITORING_SUCCEEDED


@pytest.mark.parametrize(
    ("target", "memory"),
    [(RollbackTarget.MANIFEST, "1Gi"), (RollbackTarget.LAST_SUCCESSFUL, "900Mi")],
)
async def test_rollback_target(
    client: Client, cluster: FakeCluster, task_queue: str, target: RollbackTarget, memory: str
) -> None:
    ref, owner = new_owner(
        cluster, settings(target=target, max_attempts=1), state_json=succeeded_before()
    )
    owner.apply(OOM)
    await (await observe(client, CLUSTER, task_queue, ref, OOM)).result()
    assert {p.requests["app"]["memory"] for p in owner.pods} == {memory}


async def test_last_successful_unavailable(
    client: Client, cluster: FakeCluster, task_queue: str
) -> None:
    ref, owner = new_owner(cluster, settings())
    owner.apply(OOM)
    result = await (await observe(client, CLUSTER, task_queue, ref, OOM)).result()
    assert (result.mode, result.failure_reason) == (
        Mode.FAILED_PERMANENT,
        FailureReason.ROLLBACK_RECOMMENDATION_UNAVAILABLE,
    )
    assert owner.event_reasons()[-1] == EventReason.RECOMMENDATION_UNAVAILABLE
    assert cluster.calls.get("roll_back", 0) == 0
    await check_replay(client, rollback_id(CLUSTER, ref), "last-successful-unavailable")


async def test_cancel_and_reopen_signals(
    client: Client, cluster: FakeCluster, task_queue: str
) -> None:
    ref, owner = new_owner(cluster, settings(window=30))
    owner.apply(OOM)
    handle = await observe(client, CLUSTER, task_queue, ref, OOM)
    first = await wait_for(handle, lambda s: s.mode is Mode.MONITORING and s.baseline is not None)
    # The baseline came with the owner read; nothing is sampled until the window ends.
    assert first.baseline == 5 and first.last_sample is None and first.samples_taken == 0
    assert first.next_sample_at == first.window_ends_at
    await asyncio.sleep(0.3)
    await handle.signal(RollbackWorkflow.reopen, ReopenSignal())
    reopened = await wait_for(handle, lambda s: s.transitions > first.transitions)
    assert reopened.window_ends_at is not None and first.window_ends_at is not None
    assert reopened.window_ends_at > first.window_ends_at
    await handle.signal(RollbackWorkflow.cancel, CancelSignal(reason="maintenance"))
    result = await handle.result()
    assert result.mode is Mode.CANCELLED
    assert owner.state is not None and owner.state.mode is Mode.CANCELLED
    assert all(p.recommendation == OOM for p in owner.pods)  # resources left as they were
    assert cluster.calls.get("roll_back", 0) == 0
    assert owner.event_reasons() == [
        EventReason.MONITORING_STARTED,
        EventReason.MONITORING_STARTED,
        EventReason.MONITORING_CANCELLED,
    ]
    await check_replay(client, rollback_id(CLUSTER, ref), "cancel-reopen")


async def test_cancel_and_reopen_as_updates_are_judged_by_the_workflow_and_answered(
    client: Client, cluster: FakeCluster, task_queue: str
) -> None:
    """``rollbackctl`` and the intake control through Updates: the workflow judges each with
    the function that judges the signals, and the caller gets its answer. A reopen the policy
    disables is refused with the reason, and changes nothing; a taken reopen opens a fresh
    window; a cancel is taken; then, nothing running, a cancel is refused."""
    ref, owner = new_owner(cluster, settings(window=30))
    owner.apply(OOM)
    handle = await observe(client, CLUSTER, task_queue, ref, OOM)
    first = await wait_for(handle, lambda s: s.mode is Mode.MONITORING and s.baseline is not None)
    taken = await control.reopen(client, CLUSTER, task_queue, ref, update_id="reopen-1")
    assert (taken.mode, taken.window_ends_at) == (Mode.MONITORING, first.window_ends_at)
    reopened = await wait_for(handle, lambda s: s.transitions > first.transitions)
    assert reopened.window_ends_at is not None and first.window_ends_at is not None
    assert reopened.window_ends_at > first.window_ends_at
    # The same request again (a retried Update ID) is answered once: no second window.
    again = await control.reopen(client, CLUSTER, task_queue, ref, update_id="reopen-1")
    assert again == taken
    cancelled_in = await control.cancel(client, CLUSTER, ref, "maintenance")
    assert cancelled_in.mode is Mode.MONITORING
    assert (await handle.result()).mode is Mode.CANCELLED
    with pytest.raises(control.ControlRefusedError, match="nothing to cancel"):
        await control.cancel(client, CLUSTER, ref, "again")
    assert owner.event_reasons() == [
        EventReason.MONITORING_STARTED,
        EventReason.MONITORING_STARTED,
        EventReason.MONITORING_CANCELLED,
    ]
    await check_replay(client, rollback_id(CLUSTER, ref), "control-updates")

    disabled_ref, disabled = new_owner(cluster, settings(window=30, reopen=False))
    disabled.apply(FITS)
    held = await observe(client, CLUSTER, task_queue, disabled_ref, FITS)
    await wait_for(held, lambda s: s.baseline is not None)
    with pytest.raises(control.ControlRefusedError) as refused:
        await control.reopen(client, CLUSTER, task_queue, disabled_ref)
    assert str(refused.value) == (
        f"{disabled_ref} cannot be reopened (monitoring): reopen disabled by the policy"
        " (enableMonitoringReopen: false)"
    )
    await control.cancel(client, CLUSTER, disabled_ref, "done")
    await held.result()
    assert disabled.event_reasons() == [
        EventReason.MONITORING_STARTED,
        EventReason.MONITORING_CANCELLED,
    ]


async def test_a_run_built_before_the_updates_gets_the_control_as_its_signal(
    client: Client, cluster: FakeCluster
) -> None:
    """An attempt pinned to a build from before the control Updates (Worker Versioning keeps it
    there until it ends) answers an Update with "no handler": the control goes as its signal,
    which that build judges by itself, and the caller gets the state it was sent in."""
    queue = f"before-updates-{uuid.uuid4().hex[:6]}"
    ref, owner = new_owner(cluster, settings(window=30))
    owner.apply(FITS)
    workflows = [RollbackWorkflowBeforeUpdates]
    async with build_worker(client, queue, cluster, ClusterGuard(CLUSTER), workflows=workflows):
        handle = await observe(client, CLUSTER, queue, ref, FITS)
        await wait_for(handle, lambda s: s.fingerprint == FITS.fingerprint)
        sent_in = await control.cancel(client, CLUSTER, ref, "maintenance")
        assert sent_in.mode is Mode.MONITORING
        result = await handle.result()
    assert (result.mode, result.message) == (Mode.CANCELLED, "maintenance")


async def test_reopen_ignored_when_disabled(
    client: Client, cluster: FakeCluster, task_queue: str
) -> None:
    ref, owner = new_owner(cluster, settings(window=30, reopen=False))
    owner.apply(FITS)
    handle = await observe(client, CLUSTER, task_queue, ref, FITS)
    first = await wait_for(handle, lambda s: s.baseline is not None)
    await handle.signal(RollbackWorkflow.reopen, ReopenSignal())
    await handle.signal(RollbackWorkflow.cancel, CancelSignal())
    await handle.result()
    assert owner.event_reasons() == [
        EventReason.MONITORING_STARTED,
        EventReason.MONITORING_CANCELLED,
    ]
    assert owner.state is not None and owner.state.history[0].time == first.window_started_at


@pytest.mark.parametrize("enabled", [True, False], ids=["reopen-enabled", "reopen-disabled"])
async def test_replacement_pod_reopens_a_succeeded_turn(
    client: Client, cluster: FakeCluster, task_queue: str, enabled: bool
) -> None:
    ref, owner = new_owner(cluster, settings(reopen=enabled))
    owner.apply(FITS)
    await (await observe(client, CLUSTER, task_queue, ref, FITS)).result()
    succeeded_at = owner.state.last_transition_time if owner.state else None
    assert succeeded_at is not None
    # A duplicate event about an old pod reopens nothing.
    old = await (
        await observe(
            client,
            CLUSTER,
            task_queue,
            ref,
            FITS,
            pod_created_at=succeeded_at - timedelta(seconds=5),
        )
    ).result()
    assert old.mode is Mode.MONITORING_SUCCEEDED
    # A replacement pod created after the success reopens monitoring, when enabled.
    newer = await observe(
        client,
        CLUSTER,
        task_queue,
        ref,
        FITS,
        pod="pod-new",
        pod_created_at=succeeded_at + timedelta(seconds=1),
    )
    result = await newer.result()
    assert result.mode is Mode.MONITORING_SUCCEEDED
    expected = 4 if enabled else 2
    assert len(owner.event_reasons()) == expected


async def test_new_fingerprint_supersedes_even_with_equal_values(
    client: Client, cluster: FakeCluster, task_queue: str
) -> None:
    ref, owner = new_owner(cluster, settings(window=3))
    owner.apply(FITS)
    handle = await observe(client, CLUSTER, task_queue, ref, FITS)
    await wait_for(handle, lambda s: s.baseline is not None)
    moved = rec("768Mi", key=HASHED_KEY)  # same values under the hashed key: a new recommendation
    assert moved.fingerprint != FITS.fingerprint
    owner.apply(moved)
    await observe(client, CLUSTER, task_queue, ref, moved)
    result = await client.get_workflow_handle_for(
        RollbackWorkflow.run, rollback_id(CLUSTER, ref)
    ).result()
    assert (result.mode, result.fingerprint, result.turn) == (
        Mode.MONITORING_SUCCEEDED,
        moved.fingerprint,
        1,
    )
    state = owner.state
    assert state is not None
    assert [(h.mode, h.fingerprint) for h in state.history] == [
        (Mode.MONITORING, FITS.fingerprint),
        (Mode.SUPERSEDED, FITS.fingerprint),
        (Mode.MONITORING, moved.fingerprint),
        (Mode.MONITORING_SUCCEEDED, moved.fingerprint),
    ]
    await check_replay(client, rollback_id(CLUSTER, ref), "supersede-key-change")


async def test_owner_deleted_mid_window_ends_cleanly(
    client: Client, cluster: FakeCluster, task_queue: str
) -> None:
    ref, owner = new_owner(cluster, settings(window=4))
    owner.apply(FITS)
    handle = await observe(client, CLUSTER, task_queue, ref, FITS)
    await wait_for(handle, lambda s: s.baseline is not None)
    owner.exists = False
    result = await handle.result()
    assert (result.mode, result.failure_reason) == (Mode.CLEARED, FailureReason.OWNER_GONE)


async def test_no_policy_retains(client: Client, cluster: FakeCluster, task_queue: str) -> None:
    ref, owner = new_owner(cluster, None)
    owner.apply(FITS)
    result = await (await observe(client, CLUSTER, task_queue, ref, FITS)).result()
    assert result.mode is Mode.CLEARED and owner.state_json is None and owner.events == {}


async def test_long_window_continues_as_new(
    client: Client, cluster: FakeCluster, task_queue: str
) -> None:
    ref, owner = new_owner(cluster, settings(window=3))
    owner.apply(FITS)
    handle = await client.start_workflow(
        RollbackWorkflow.run,
        RollbackInput(cluster=CLUSTER, owner=ref, recommendation=FITS, max_history_events=10),
        id=rollback_id(CLUSTER, ref),
        task_queue=task_queue,
    )
    result = await handle.result()
    assert result.mode is Mode.MONITORING_SUCCEEDED
    # One window, several runs: the state (baseline, window end) was carried across.
    assert owner.event_reasons() == [
        EventReason.MONITORING_STARTED,
        EventReason.MONITORING_SUCCEEDED,
    ]
    assert await check_replay(client, rollback_id(CLUSTER, ref), "continue-as-new") >= 2


@pytest.mark.parametrize(
    "stop_in", [Mode.MONITORING, Mode.BACKING_OFF], ids=["mid-window", "mid-backoff"]
)
async def test_worker_restart(
    temporal_env: WorkflowEnvironment,
    cluster: FakeCluster,
    task_queue: str,
    stop_in: Mode,
) -> None:
    """The worker goes away mid-window or mid-backoff; timers fire without it; a new one ends."""
    client = temporal_env.client
    ref, owner = new_owner(
        cluster, settings(window=2, backoff=2, max_attempts=1), state_json=succeeded_before()
    )
    owner.apply(OOM)
    async with running_worker(client, task_queue, cluster):
        handle = await observe(client, CLUSTER, task_queue, ref, OOM)
        await wait_for(handle, lambda s: s.mode is stop_in)
    await asyncio.sleep(2.5)  # the durable timer expires while no worker runs
    async with running_worker(client, task_queue, cluster):
        # Bounded: a replay that fails (nondeterminism) retries its task for ever.
        result = await asyncio.wait_for(handle.result(), 60)
    assert (result.mode, result.failure_reason) == (Mode.FAILED_PERMANENT, FailureReason.OOM_KILLED)
    assert [e for e in owner.journal if e[0] == "rollback"] == [
        ("rollback", RollbackTarget.LAST_SUCCESSFUL)
    ]
    assert owner.event_reasons().count(EventReason.ROLLING_BACK_STARTED) == 1
    await check_replay(client, rollback_id(CLUSTER, ref), f"worker-restart-{stop_in}")


class _LosesATask(ClusterGuard):
    """A worker that dies once in a rollback run's task: after the run recorded its transition
    on the owner (a local activity: the write is done) and before the task completed with the
    command that came next (``lose`` names it: a child's ID, an activity's name). The task
    fails; the server gives it to a worker again, which runs it from the run's last completed
    task, its local activities included. ``meanwhile`` is what changes in between."""

    lose: ClassVar[Callable[[str], bool]] = staticmethod(lambda what: False)
    meanwhile: ClassVar[Callable[[], None]] = staticmethod(lambda: None)
    lost: ClassVar[list[str]] = []  # the command whose task was lost

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor]:
        return _LoseATask

    @classmethod
    def worker(
        cls,
        client: Client,
        task_queue: str,
        cluster: FakeCluster,
        lose: Callable[[str], bool],
        meanwhile: Callable[[], None] = lambda: None,
    ) -> Worker:
        cls.lose, cls.meanwhile, cls.lost = staticmethod(lose), staticmethod(meanwhile), []
        return build_worker(
            client,
            task_queue,
            cluster,
            cls(CLUSTER),
            workflow_runner=UnsandboxedWorkflowRunner(),  # the interceptor keeps what it lost
        )

    @classmethod
    def dies_before(cls, what: str) -> None:
        if not cls.lost and cls.lose(what):
            cls.lost.append(what)
            cls.meanwhile()
            raise RuntimeError("the worker died before its task completed")


class _LoseATask(WorkflowInboundInterceptor):
    def init(self, outbound: WorkflowOutboundInterceptor) -> None:
        super().init(_LoseOutbound(outbound))


class _LoseOutbound(WorkflowOutboundInterceptor):
    async def start_child_workflow(self, input: StartChildWorkflowInput) -> ChildWorkflowHandle:
        _LosesATask.dies_before(input.id)
        return await super().start_child_workflow(input)

    def start_activity(self, input: StartActivityInput) -> ActivityHandle:
        _LosesATask.dies_before(input.activity)
        return super().start_activity(input)


async def test_a_transition_recorded_by_a_lost_task_is_still_notified(
    temporal_env: WorkflowEnvironment, cluster: FakeCluster, task_queue: str
) -> None:
    """A run's first task records ``cancelled`` and its worker dies before the task completes
    (1,000-workload soak, run 10: notNotified 3). Run again, the task reads back the state this
    run recorded, which wakes nothing: the run still notifies that transition, once, under the
    key the lost task would have used."""
    client = temporal_env.client
    ref, owner = new_owner(cluster, settings())
    owner.apply(FITS)
    handle = await observe(client, CLUSTER, task_queue, ref, FITS)  # no worker yet: both
    # The cancel signal (the product's contract, answered by no one): with no worker up yet,
    # it reaches the run's first task with its start.
    await handle.signal(RollbackWorkflow.cancel, CancelSignal(reason="maintenance"))
    async with _LosesATask.worker(client, task_queue, cluster, lambda what: "notify/" in what):
        result = await handle.result()
        assert len(_LosesATask.lost) == 1 and "/cancelled/turn-1/" in _LosesATask.lost[0]
        # the child the lost task was to start: started by the run before it ended, or not at all
        await client.get_workflow_handle(_LosesATask.lost[0]).result()
    assert result.mode is Mode.CANCELLED
    assert [s for s, _ in owner.journal].count("state") == 2  # monitoring, cancelled: once each
    assert [(n.transition, n.turn) for n in cluster.notified] == [(Mode.CANCELLED, 1)]
    assert _LosesATask.lost[0].endswith(cluster.notified[0].key[:12])  # the lost task's child
    await check_replay(client, rollback_id(CLUSTER, ref), "lost-task-after-record")


async def test_a_control_update_acts_only_once_its_acceptance_is_in_the_history(
    temporal_env: WorkflowEnvironment, cluster: FakeCluster, task_queue: str
) -> None:
    """A cancel Update is decided and ``cancelled`` recorded on the owner (a local activity)
    only in a task after the one whose completion puts the Update's acceptance in the history:
    a task lost with the acceptance in it (its worker killed, Temporal restarted, as in the
    1,000-workload soak) then leaves no record on the owner that the run forgot (the owner said
    cancelled, the run went on monitoring, nothing was notified). Here the deciding task is
    lost too: run again, it takes the cancel again, and the caller gets its answer."""
    client = temporal_env.client
    ref, owner = new_owner(cluster, settings(window=30))
    owner.apply(FITS)
    lose = lambda what: "/cancelled/" in what  # noqa: E731 - the notify child of cancelled
    async with _LosesATask.worker(client, task_queue, cluster, lose):
        handle = await observe(client, CLUSTER, task_queue, ref, FITS)
        await wait_for(handle, lambda s: s.baseline is not None)
        taken_in = await control.cancel(client, CLUSTER, ref, "maintenance")
        result = await handle.result()
        assert len(_LosesATask.lost) == 1  # the deciding task was lost once
        for _ in range(200):  # the notification's child runs on its own
            if cluster.notified:
                break
            await asyncio.sleep(0.05)
    assert (taken_in.mode, result.mode) == (Mode.MONITORING, Mode.CANCELLED)
    assert [(n.transition, n.turn) for n in cluster.notified] == [(Mode.CANCELLED, 1)]
    events = [e async for e in handle.fetch_history_events()]
    update = "workflow_execution_update_accepted_event_attributes"
    accepted = next(e.event_id for e in events if e.HasField(update))
    recorded = [e.event_id for e in events if e.HasField("marker_recorded_event_attributes")]
    completed = [e.event_id for e in events
                 if e.HasField("workflow_task_completed_event_attributes")]  # fmt: skip
    cancelled_record = recorded[-1]  # the run's last record: cancelled
    assert any(accepted < c < cancelled_record for c in completed), (accepted, completed)


async def test_a_verdict_decided_again_after_its_task_was_lost_has_its_own_event(
    temporal_env: WorkflowEnvironment, cluster: FakeCluster, task_queue: str
) -> None:
    """The verdict's task records ``rollingBack`` (OOM) and its worker dies before the rollback
    is scheduled; in between, the app's working set falls, and the task, run again, samples a
    healthy cohort and decides success. The owner keeps both Events: the lost task's, and the
    success's, which used to take the lost one's name and was never emitted."""
    client = temporal_env.client
    ref, owner = new_owner(
        cluster, settings(target=RollbackTarget.MANIFEST, window=1, max_attempts=1)
    )
    owner.apply(OOM)

    def recovers() -> None:
        owner.working_set = "128Mi"  # the 256Mi pods no longer OOM

    async with _LosesATask.worker(client, task_queue, cluster, ROLL_BACK.__eq__, recovers):
        result = await (await observe(client, CLUSTER, task_queue, ref, OOM)).result()
    assert _LosesATask.lost == [ROLL_BACK]
    assert result.mode is Mode.MONITORING_SUCCEEDED
    assert [what for what, _ in owner.journal if what in ("state", "rollback")] == ["state"] * 3
    assert owner.event_reasons() == [
        EventReason.MONITORING_STARTED,
        EventReason.ROLLING_BACK_STARTED,
        EventReason.MONITORING_SUCCEEDED,
    ]
    await check_replay(client, rollback_id(CLUSTER, ref), "lost-verdict-decided-again")


async def signal_handled(handle: WorkflowHandle) -> None:  # type: ignore[type-arg]
    """Until the run has taken its newest signal in: a workflow task completed after it."""
    deadline = asyncio.get_running_loop().time() + 10
    while True:
        kinds = [e.event_type for e in (await handle.fetch_history()).events]
        signalled = [
            i for i, k in enumerate(kinds) if k == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
        ]
        done = [i for i, k in enumerate(kinds) if k == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED]
        if signalled and done and done[-1] > signalled[-1]:
            return
        assert asyncio.get_running_loop().time() < deadline, kinds
        await asyncio.sleep(0.05)


async def test_a_resume_that_comes_while_the_held_read_answers_is_not_lost(
    client: Client, cluster: FakeCluster, task_queue: str
) -> None:
    """The pause is lifted, and ``resume`` sent, right after the rollback read it and before
    its answer reached the run (1,000-workload soak, run 6: a verdict held 10 minutes): the
    run counts the resume from its read, so it looks again at once and rolls back."""
    ref, owner = new_owner(cluster, settings(target=RollbackTarget.MANIFEST, max_attempts=1))
    owner.paused = Pause(scope=PauseScope.NAMESPACE, name="shop", reason="incident 4711")
    owner.gates[ROLL_BACK] = answer = asyncio.Event()  # its first read only
    owner.apply(OOM)
    handle = await observe(client, CLUSTER, task_queue, ref, OOM)
    await wait_until(lambda: ("held", "rollback") in owner.journal)  # read: paused
    owner.paused = None  # lifted
    await handle.signal(RollbackWorkflow.resume, ResumeSignal())
    await signal_handled(handle)
    answer.set()  # the read's answer (paused) reaches the run only now
    result = await asyncio.wait_for(handle.result(), 20)  # not PAUSE_RECHECK (10 min) on
    assert (result.mode, result.failure_reason) == (Mode.FAILED_PERMANENT, FailureReason.OOM_KILLED)
    assert [what for what, _ in owner.journal if what in ("held", "rollback")] == [
        "held",
        "rollback",
    ]
    await check_replay(client, rollback_id(CLUSTER, ref), "resume-during-held-read")


async def test_a_reopen_while_the_newest_run_decides_its_start_is_not_refused(
    client: Client, cluster: FakeCluster, task_queue: str
) -> None:
    """A sighting's run is still reading the owner when a reopen comes (1,000-workload soak,
    run 6: the reopen was refused as "no recorded state" and lost): the Update waits for the
    run to decide its start, then the workflow judges it and takes it."""
    ref, owner = new_owner(cluster, settings())
    owner.apply(FITS)
    await (await observe(client, CLUSTER, task_queue, ref, FITS)).result()
    owner.gates[LOAD_OWNER] = answer = asyncio.Event()
    sighting = await observe(client, CLUSTER, task_queue, ref, FITS)  # wakes nothing, once read
    reopening = asyncio.create_task(control.reopen(client, CLUSTER, task_queue, ref))
    await _update_accepted(client, rollback_id(CLUSTER, ref))  # accepted, then waits
    assert not reopening.done()  # for the start's decision: not refused
    answer.set()
    before = await reopening
    assert before.mode is Mode.MONITORING_SUCCEEDED  # the sighting's start: it woke nothing
    # The reopen goes on in the next run (the run-end rule takes it): one fresh window.
    assert (await sighting.result()).mode is Mode.MONITORING_SUCCEEDED
    assert owner.event_reasons().count(EventReason.MONITORING_STARTED) == 2  # reopened once


async def test_a_reopen_whose_fallback_meets_a_run_started_under_it_goes_back_to_the_update(
    client: Client, cluster: FakeCluster, task_queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reopen's Update finds no run running (the last one ended), and a sighting's run
    starts before the fallback reads the newest run, which has no state yet (1,000-workload
    soak, run 29: refused for good as "no recorded state"). The new run is the one to judge
    the reopen: it gets the Update, waits to decide its start, and takes it."""
    ref, owner = new_owner(cluster, settings())
    owner.apply(FITS)
    await (await observe(client, CLUSTER, task_queue, ref, FITS)).result()
    owner.gates[LOAD_OWNER] = answer = asyncio.Event()
    real, sightings = control._update, []

    async def ended_then_started(*args: object, **kwargs: object) -> RollbackState:
        try:
            return await real(*args, **kwargs)  # type: ignore[arg-type]
        except RPCError:
            if not sightings:  # the intake's start lands between the Update and the fallback
                sightings.append(await observe(client, CLUSTER, task_queue, ref, FITS))
            raise

    real_read, reads = control.state_of, []

    async def read_then_decide(*args: object) -> tuple[bool, RollbackState | None]:
        reads.append(await real_read(*args))  # type: ignore[arg-type]
        answer.set()  # the run decides its start once the fallback has read it
        return reads[-1]

    monkeypatch.setattr(control, "_update", ended_then_started)
    monkeypatch.setattr(control, "state_of", read_then_decide)
    before = await control.reopen(client, CLUSTER, task_queue, ref)
    # The race: a run running, its state not loaded yet. The Update again then (or, the run
    # having ended by then, the fallback once more: it woke nothing) takes the reopen.
    assert reads[0] == (True, None)
    assert before.mode is Mode.MONITORING_SUCCEEDED
    assert (await sightings[0].result()).mode is Mode.MONITORING_SUCCEEDED
    newest = client.get_workflow_handle_for(RollbackWorkflow.run, rollback_id(CLUSTER, ref))
    assert (await newest.result()).mode is Mode.MONITORING_SUCCEEDED
    assert owner.event_reasons().count(EventReason.MONITORING_STARTED) == 2  # reopened once


async def _update_accepted(client: Client, workflow_id: str) -> None:
    """Until the run has accepted an Update (its validator passed: the history says so). A
    local activity in flight holds the run's task open: the Update is taken at the task's
    next heartbeat (within the 10 s task timeout)."""
    handle = client.get_workflow_handle(workflow_id)
    for _ in range(600):
        async for event in handle.fetch_history_events():
            if event.HasField("workflow_execution_update_accepted_event_attributes"):
                return
        await asyncio.sleep(0.05)
    raise AssertionError("the reopen Update was never accepted")


async def test_describe_counts_the_transitions_its_state_no_longer_keeps_and_lists_them_all(
    client: Client, cluster: FakeCluster, task_queue: str
) -> None:
    """Started as the intake starts an attempt (its first state shown from the start, before
    the run decides it) and reopened four times, the owner's state keeps all 10 transitions:
    none earlier. Once more, 12: ``describe`` says how many came before what it shows, and
    ``--all`` lists them, from the runs' histories, oldest first, each transition once."""
    policy = settings(window=0.3)
    ref, owner = new_owner(cluster, policy)
    owner.apply(FITS)
    await (await observe(client, CLUSTER, task_queue, ref, FITS, turn=1, policy=policy)).result()
    status, state, _ = await ops.describe(client, CLUSTER, ref)
    assert state is not None
    assert await ops.earlier_transitions(client, CLUSTER, ref, state) == []
    handle = client.get_workflow_handle_for(RollbackWorkflow.run, rollback_id(CLUSTER, ref))
    for _ in range(4):
        await control.reopen(client, CLUSTER, task_queue, ref)
        await handle.result()
    status, state, _ = await ops.describe(client, CLUSTER, ref)
    assert state is not None and len(state.history) == 10
    assert await ops.earlier_transitions(client, CLUSTER, ref, state) == []
    await control.reopen(client, CLUSTER, task_queue, ref)
    await handle.result()
    status, state, _ = await ops.describe(client, CLUSTER, ref)
    assert state is not None and len(state.history) == 10
    earlier = await ops.earlier_transitions(client, CLUSTER, ref, state)
    recorded, _ = await ops.recorded_transitions(client, CLUSTER, ref)
    assert earlier == recorded[:2] and len(recorded) == 12
    assert [(mode, turn) for _, mode, turn in earlier] == [
        ("monitoring", 1),
        ("monitoringSucceeded", 1),
    ]
    text = ops.describe_text(CLUSTER, ref, status, state, earlier=earlier).splitlines()
    assert f"  ... 2 earlier (every transition: rollbackctl describe {ref} --all)" in text
    every = ops.describe_text(CLUSTER, ref, status, state, earlier=earlier, every=True)
    history = every.split("History:\n")[1].splitlines()
    assert len(history) == 12 and "..." not in every
    assert history[0] == f"  {earlier[0][0].isoformat()}  monitoring turn 1"


async def test_explicit_reopen_via_signal_with_start(
    client: Client, cluster: FakeCluster, task_queue: str
) -> None:
    ref, owner = new_owner(cluster, settings())
    owner.apply(FITS)
    await (await observe(client, CLUSTER, task_queue, ref, FITS)).result()
    result = await (
        await observe(client, CLUSTER, task_queue, ref, FITS, trigger=Trigger.REOPEN)
    ).result()
    assert result.mode is Mode.MONITORING_SUCCEEDED
    assert owner.event_reasons().count(EventReason.MONITORING_STARTED) == 2


async def test_a_retrys_re_apply_held_past_its_window_is_judged_on_a_fresh_window(
    client: Client, cluster: FakeCluster, task_queue: str
) -> None:
    """A failed workload retried while its namespace is paused: the re-apply is held, longer
    than the window. Once the pause lifts, the re-apply lands and the window opens then (a
    third RollbackMonitoringStarted says so), so the verdict is taken on what the pods do after
    it, not on evidence from before the pause (the app, fixed meanwhile, fits the cut now)."""
    ref, owner = new_owner(
        cluster, settings(window=1.0, backoff=0.5, multiply=1, max_attempts=1),
        state_json=succeeded_before(),
    )  # fmt: skip
    owner.apply(OOM)
    failed = await (await observe(client, CLUSTER, task_queue, ref, OOM)).result()
    assert failed.mode is Mode.FAILED_PERMANENT
    owner.paused = Pause(scope=PauseScope.NAMESPACE, name="shop", reason="incident")
    await control.reopen(client, CLUSTER, task_queue, ref)
    handle = client.get_workflow_handle_for(RollbackWorkflow.run, rollback_id(CLUSTER, ref))
    await wait_until(lambda: ("held", "reapply") in owner.journal)
    held = await wait_for(handle, lambda s: s.mode is Mode.MONITORING)
    assert held.window_ends_at is not None
    ends = held.window_ends_at
    await wait_until(lambda: datetime.now(UTC) > ends, timeout=10)
    owner.paused, owner.working_set = None, "100Mi"  # lifted; the app no longer outgrows the cut
    await handle.signal(RollbackWorkflow.resume, ResumeSignal())
    result = await handle.result()
    assert result.mode is Mode.MONITORING_SUCCEEDED
    started = [m for r, m, _ in owner.events.values() if r == EventReason.MONITORING_STARTED]
    assert len(started) == 3 and started[-1].startswith("Re-applied, then monitoring")


async def test_a_paused_rollback_holds_and_goes_ahead_on_resume(
    client: Client, cluster: FakeCluster, task_queue: str
) -> None:
    """The rollback finds a pause in force and writes nothing; the run holds (the ``held``
    query says on what) until ``resume``, then rolls back once."""
    ref, owner = new_owner(cluster, settings(target=RollbackTarget.MANIFEST, max_attempts=1))
    owner.paused = Pause(scope=PauseScope.NAMESPACE, name="shop", reason="incident 4711")
    owner.apply(OOM)
    handle = await observe(client, CLUSTER, task_queue, ref, OOM)
    await wait_until(lambda: ("held", "rollback") in owner.journal)
    assert await handle.query(RollbackWorkflow.held) == owner.paused
    assert not any(what == "rollback" for what, _ in owner.journal)
    status, state, held = await ops.describe(client, CLUSTER, ref)
    assert (
        "Held:         paused by namespace shop until the annotation is removed: incident 4711;"
        " nothing is written until it ends"
    ) in ops.describe_text(CLUSTER, ref, status, state, held=held).splitlines()
    row = await listed(client, ref, lambda r: r.status == "Held")  # get, get --held, the UI
    assert row.held == (
        "rollback: paused by namespace shop until the annotation is removed: incident 4711"
    )
    assert row in await ops.get(client, cluster=CLUSTER, held=True)
    owner.paused = None
    await handle.signal(RollbackWorkflow.resume, ResumeSignal())
    result = await handle.result()
    assert (result.mode, result.failure_reason) == (Mode.FAILED_PERMANENT, FailureReason.OOM_KILLED)
    assert [what for what, _ in owner.journal if what in ("held", "rollback")] == [
        "held",
        "rollback",
    ]
    assert await handle.query(RollbackWorkflow.held) is None
    row = await listed(client, ref, lambda r: r.status == "Completed")
    assert row.held == "" and row not in await ops.get(client, cluster=CLUSTER, held=True)
    await check_replay(client, rollback_id(CLUSTER, ref), "paused-rollback")


async def test_a_cancel_is_taken_at_once_while_the_rollback_is_held(
    client: Client, cluster: FakeCluster, task_queue: str
) -> None:
    """A cancel that arrives while a pause holds the rollback ends the attempt then, with the
    meaning it has when nothing holds: cancelled, and no rollback written (1.0 held the cancel
    until the pause lifted, rolled back, then took it)."""
    ref, owner = new_owner(cluster, settings(target=RollbackTarget.MANIFEST, max_attempts=1))
    owner.paused = Pause(scope=PauseScope.NAMESPACE, name="shop", reason="incident 4711")
    owner.apply(OOM)
    handle = await observe(client, CLUSTER, task_queue, ref, OOM)
    await wait_until(lambda: ("held", "rollback") in owner.journal)
    await handle.signal(RollbackWorkflow.cancel, CancelSignal(reason="incident: stand down"))
    result = await handle.result()  # the pause still holds: the cancel did not wait for it
    assert result.mode is Mode.CANCELLED
    assert not any(what == "rollback" for what, _ in owner.journal)
    assert owner.rollback_annotation is None
    cancelled = [m for r, m, _ in owner.events.values() if r == EventReason.MONITORING_CANCELLED]
    assert len(cancelled) == 1 and "cancelled in mode rollingBack" in cancelled[0]
    await check_replay(client, rollback_id(CLUSTER, ref), "cancel-while-rollback-held")


async def test_an_early_verdict_rolls_back_a_certain_failure_long_before_the_windows_end(
    client: Client, cluster: FakeCluster, task_queue: str
) -> None:
    """A 1-hour window under an early verdict (confirmation 1 s): the intake's ``suspect`` for an
    OOM-killed pod makes the run sample, confirm a second later, and roll back then, with the
    same reason as the window's end would give; the run ends in seconds, not an hour."""
    early = EarlyVerdict(confirmation_period=timedelta(seconds=1))
    policy = settings(window=3600.0, target=RollbackTarget.MANIFEST, max_attempts=1).model_copy(
        update={"early_verdict": early}
    )
    ref, owner = new_owner(cluster, policy)
    owner.apply(OOM)
    handle = await observe(client, CLUSTER, task_queue, ref, OOM, turn=1, policy=policy)
    await wait_for(handle, lambda s: s.mode is Mode.MONITORING and s.baseline is not None)
    await handle.signal(RollbackWorkflow.suspect, SuspectSignal(pod="web-0"))
    result = await asyncio.wait_for(handle.result(), 60)
    assert (result.mode, result.failure_reason) == (Mode.FAILED_PERMANENT, FailureReason.OOM_KILLED)
    assert cluster.calls.get("roll_back") == 1
    assert cluster.calls.get("sample_cohort") == 2  # the suspicion's, the confirmation's
    events = list(owner.events.values())
    assert [reason for reason, _, _ in events[:2]] == [
        EventReason.MONITORING_STARTED,
        EventReason.ROLLING_BACK_STARTED,
    ]
    assert "decided early (5/5 pods failing for certain" in events[1][1]
    await check_replay(client, rollback_id(CLUSTER, ref), "early-verdict")
