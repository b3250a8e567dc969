"""A fleet on one Temporal: a worker acts for its own cluster only (``activities.clusters``).

Real Temporal dev server, the real Kubernetes activities over HTTP against the emulator. The
mistake modelled: another cluster's run (or a 0.1 run, named for no cluster) reaches this
cluster's worker through a shared task queue. It must end ``aborted`` (``foreignCluster``)
without one request to the owner, with a Warning Event on the worker's own Pod saying why.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from kubernetes.client import CoreV1Api
from temporalio.testing import WorkflowEnvironment

from activities.clusters import ClusterGuard
from sim.apiserver import KubeEmulator
from tests.activity.builders import NS, owner, pod, policy
from worker.kube import activities_for, api_client
from worker.runner import build_worker
from worker.temporal import observe
from workflows.activity_api import OwnerRef, rollback_id
from workflows.contract import Actuation, EventReason, FailureReason, Mode, WorkloadKind
from workflows.fingerprint import Recommendation
from workflows.rollback import RollbackInput, RollbackWorkflow

REC = Recommendation(
    requests_key="static.rightsizing.kubex.ai/desired-resource-requests",
    requests={"app": {"memory": "512Mi"}},
)
WORKER_POD = ("rollback-system", "worker-0")


@pytest.fixture
def api() -> Iterator[KubeEmulator]:
    with KubeEmulator() as emulator:
        emulator.store.create(owner("Deployment", replicas=2))
        emulator.store.create(policy(monitoringPeriod="1s"))
        for i in range(2):
            emulator.store.create(pod(f"web-{i}", {"app": "web"}, memory="512Mi", rec=REC))
        yield emulator


def refusals(api: KubeEmulator) -> list[str]:
    items, _ = api.store.list_objects(api.store.rtype("Event"), WORKER_POD[0])
    return [
        e["message"]
        for e in items
        if e["reason"] == EventReason.FOREIGN_RUN_REFUSED
        and e["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "namespace": WORKER_POD[0],
                                    "name": WORKER_POD[1]}
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("run_cluster", "why"),
    [
        pytest.param("eu-west", "it belongs to cluster eu-west", id="another-cluster"),
        pytest.param("", "started before clusters had names (0.1)", id="no-cluster"),
    ],
)
async def test_a_worker_refuses_a_run_of_another_cluster(
    temporal_env: WorkflowEnvironment, api: KubeEmulator, run_cluster: str, why: str
) -> None:
    queue = f"shared-{uuid.uuid4().hex[:6]}"  # the mistake: both clusters' runs on one queue
    client = api_client(url=api.url)
    acts = activities_for(client, Actuation.IN_PLACE)
    guard = ClusterGuard("us-east", CoreV1Api(client), WORKER_POD)
    ref = OwnerRef(namespace=NS, kind=WorkloadKind.DEPLOYMENT, name="web")
    api.clear_journal()
    async with build_worker(temporal_env.client, queue, acts, guard):
        result = await temporal_env.client.execute_workflow(
            RollbackWorkflow.run,
            RollbackInput(cluster=run_cluster, owner=ref, recommendation=REC),
            id=f"{rollback_id(run_cluster, ref)}-{queue}",
            task_queue=queue,
        )
    assert (result.mode, result.failure_reason) == (Mode.ABORTED, FailureReason.FOREIGN_CLUSTER)
    assert result.message is not None and why in result.message
    # Nothing of the owner's namespace was read or written: only the refusal's Event, told
    # once for the run however many of its activities were refused (the abort's record too).
    assert {(r.method, r.path) for r in api.journal} == {
        ("POST", f"/api/v1/namespaces/{WORKER_POD[0]}/events")
    }
    told = refusals(api)
    assert len(told) == 1 and why in told[0] and "us-east" in told[0], told


async def test_the_same_workload_in_two_clusters_is_two_runs(
    temporal_env: WorkflowEnvironment, api: KubeEmulator
) -> None:
    """Two clusters, one Temporal, the same owner name: two workflows, each on its cluster's
    queue, each acting through its own worker; neither run is the other's."""
    ref = OwnerRef(namespace=NS, kind=WorkloadKind.DEPLOYMENT, name="web")
    client = api_client(url=api.url)
    with KubeEmulator() as other:
        other.store.create(owner("Deployment", replicas=2))
        other.store.create(policy(monitoringPeriod="1s"))
        for i in range(2):  # the other cluster's pods never adopt: its attempt fails
            other.store.create(pod(f"web-{i}", {"app": "web"}, memory="1Gi", rec=REC))
        clusters = {"us-east": (api, client), "eu-west": (other, api_client(url=other.url))}
        workers = [
            build_worker(
                temporal_env.client,
                f"rightsizing-rollback-{name}-{uuid.uuid4().hex[:4]}",
                activities_for(kube, Actuation.ANNOTATIONS),
                ClusterGuard(name),
            )
            for name, (_, kube) in clusters.items()
        ]
        async with workers[0], workers[1]:
            handles = [
                await observe(temporal_env.client, name, w.task_queue, ref, REC)
                for name, w in zip(clusters, workers, strict=True)
            ]
            results = [await h.result() for h in handles]
        assert [h.id for h in handles] == [
            "rollback/us-east/shop/Deployment/web",
            "rollback/eu-west/shop/Deployment/web",
        ]
        assert results[0].mode is Mode.MONITORING_SUCCEEDED
        assert results[1].mode is Mode.FAILED_PERMANENT  # nothing it could roll back to
        for name, handle, worker in zip(clusters, handles, workers, strict=True):
            described = await handle.describe()
            assert described.task_queue == worker.task_queue
            attrs = {p.key.name: p.value for p in described.typed_search_attributes}
            assert attrs["RollbackCluster"] == name
        # Each cluster's owner carries its own cluster's verdict.
        modes = {
            name: emulator.store.get(emulator.store.rtype("Deployment"), NS, "web")["metadata"][
                "annotations"
            ]["rightsizing.kubex.ai/rollback-state"]
            for name, (emulator, _) in clusters.items()
        }
        assert '"monitoringSucceeded"' in modes["us-east"], modes
        assert '"failedPermanent"' in modes["eu-west"], modes
