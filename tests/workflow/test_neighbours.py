"""The verdict beside an HPA and during a release, on the real Temporal server (the fake cluster
reports the owner's HPA and pod template as the real reads do): an HPA pinned at its maximum
rolls the cut back without asking Prometheus; a release seen at the verdict opens a fresh window
of the same turn instead of a rollback, its Event said once. Histories recorded for replay."""

from __future__ import annotations

import asyncio

from temporalio.client import Client

from cli import ops
from tests import CLUSTER
from tests.workflow.fake_cluster import FakeCluster
from tests.workflow.helpers import check_replay, new_owner, rec, settings
from tests.workflow.test_rollback_workflow import client, cluster, task_queue  # noqa: F401
from worker.temporal import observe
from workflows.activity_api import CHECK_HEALTH, rollback_id
from workflows.contract import EventReason, FailureReason, Mode, RollbackTarget
from workflows.policy import HealthChecks
from workflows.rollback import RollbackWorkflow
from workflows.state import Autoscaler, Template

FITS = rec("768Mi")  # adopted and healthy as the fake cluster judges it
HPA = Autoscaler(name="api", desired=5, min=2, max=10)


async def test_an_hpa_pinned_at_its_maximum_rolls_the_cut_back_without_prometheus(
    client: Client,  # noqa: F811
    cluster: FakeCluster,  # noqa: F811
    task_queue: str,  # noqa: F811
) -> None:
    checks = HealthChecks.model_validate({"autoscaler": {"failAtMax": True}})
    policy = settings(target=RollbackTarget.MANIFEST, max_attempts=1)
    ref, owner = new_owner(cluster, policy.model_copy(update={"health_checks": checks}))
    owner.apply(FITS)
    owner.hpa = HPA
    handle = await observe(client, CLUSTER, task_queue, ref, FITS)
    while owner.state is None or owner.state.mode is not Mode.MONITORING:
        await asyncio.sleep(0.05)
    owner.hpa = HPA.model_copy(update={"desired": 10})  # the cut's utilisation drove it out
    result = await handle.result()
    assert (result.mode, result.failure_reason) == (
        Mode.FAILED_PERMANENT,
        FailureReason.AUTOSCALER_SCALED_OUT,
    )
    assert CHECK_HEALTH not in cluster.calls  # no Prometheus asked
    state = await handle.query(RollbackWorkflow.status)
    assert state is not None
    shown = ops.describe_text(CLUSTER, ref, "Completed", state).splitlines()
    assert "Autoscaler:   HPA api: 5 desired (min 2, max 10) when the window opened" in shown
    assert (
        "Health:       autoscaler FAILED: HPA api: 5 -> 10 desired replicas (min 2, max 10):"
        " pinned at its maxReplicas: it can no longer absorb a peak (bound not pinned at"
        " maxReplicas)"
    ) in shown
    await check_replay(client, rollback_id(CLUSTER, ref), "autoscaler-pinned")


async def test_a_release_at_the_verdict_opens_a_fresh_window_of_the_same_turn(
    client: Client,  # noqa: F811
    cluster: FakeCluster,  # noqa: F811
    task_queue: str,  # noqa: F811
) -> None:
    """The template changes during the window and its pods crash-loop (the image's, not an
    OOM kill the cut would cause): no rollback; once rolled out (here already, at the verdict),
    a fresh window judges the cut on the new release, which passes."""
    ref, owner = new_owner(cluster, settings(window=1.5), working_set="512Mi")
    owner.template = Template(fingerprint="v1", images={"app": "shop/api:1"})
    owner.apply(FITS)
    handle = await observe(client, CLUSTER, task_queue, ref, FITS)
    while owner.state is None or owner.state.mode is not Mode.MONITORING:
        await asyncio.sleep(0.05)
    owner.template = Template(fingerprint="v2", images={"app": "shop/api:2"})
    owner.crashing = True  # the release's pods crash whatever their resources
    while EventReason.RELEASE_SEEN not in owner.event_reasons():
        await asyncio.sleep(0.05)
    owner.crashing = False  # the fixed release
    result = await handle.result()
    assert (result.mode, result.turn) == (Mode.MONITORING_SUCCEEDED, 1)
    assert owner.event_reasons() == [
        EventReason.MONITORING_STARTED,
        EventReason.RELEASE_SEEN,
        EventReason.MONITORING_STARTED,
        EventReason.MONITORING_SUCCEEDED,
    ]
    seen = [m for r, m, _ in owner.events.values() if r == EventReason.RELEASE_SEEN]
    assert "its pod template changed (app shop/api:1 -> shop/api:2)" in seen[0]
    await check_replay(client, rollback_id(CLUSTER, ref), "release-fresh-window")
