"""The simulated HPA controller scales as kube-controller-manager's does (``sim.autoscaler``), read
through the real client as the engine reads it (``OwnerLookup.autoscaler``): CPU utilisation of
the Ready pods' requests against the target, the 10% tolerance, the scale-up rate policies
(4 pods or 100% per 15 s, the larger), ``maxReplicas`` with ``TooManyReplicas``, the 300 s
scale-down stabilisation, a missing CPU request, and an HPA of KEDA's left to its own metrics."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from kubernetes.client import ApiClient, AutoscalingV2Api, CoreV1Api, CustomObjectsApi

from activities.kubernetes import KubernetesActivities
from activities.lookup import OwnerLookup
from sim.apiserver import KubeEmulator
from sim.autoscaler import AutoscalerController
from workflows.activity_api import CohortSample, OwnerRef, SampleCohortInput
from workflows.contract import Obj, WorkloadKind, recommendation_key
from workflows.fingerprint import Recommendation
from workflows.state import Autoscaler

NS = "shop"
WEB = OwnerRef(namespace=NS, kind=WorkloadKind.DEPLOYMENT, name="web")


class World:
    """A Deployment with ``ready`` Ready pods each requesting ``request`` CPU and using
    ``used``, and the HPA controller driven on a clock of our own."""

    def __init__(self, api: KubeEmulator, client: ApiClient, ready: int, request: str | None):
        self.api, self.client, self.used = api, client, Decimal("0.4")
        self.events: list[tuple[str, str]] = []
        self.controller = AutoscalerController(
            api.store,
            lambda pod: self.used,
            lambda _, reason, message, __: self.events.append((reason, message)),
        )
        api.store.create(
            {"apiVersion": "apps/v1", "kind": "Deployment",
             "metadata": {"name": "web", "namespace": NS},
             "spec": {"replicas": ready, "selector": {"matchLabels": {"app": "web"}}}}
        )  # fmt: skip
        resources = {"requests": {"cpu": request}} if request else {}
        for i in range(ready):
            api.store.create(
                {"apiVersion": "v1", "kind": "Pod",
                 "metadata": {"name": f"web-{i}", "namespace": NS, "labels": {"app": "web"}},
                 "spec": {"containers": [
                     {"name": "app", "image": "web:1", "resources": resources}]},
                 "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
            )  # fmt: skip

    def hpa(self, maximum: int = 10, metrics: list[Obj] | None = None, **spec: Any) -> None:
        cpu = {"type": "Resource", "resource": {"name": "cpu", "target": {
            "type": "Utilization", "averageUtilization": 60}}}  # fmt: skip
        self.api.store.create(
            {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
             "metadata": {"name": "web", "namespace": NS},
             "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                         "name": "web"},
                      "minReplicas": 2, "maxReplicas": maximum, "metrics": metrics or [cpu],
                      **spec}}
        )  # fmt: skip

    def sync(self, at: float) -> Any:
        self.controller.step(at)
        return AutoscalingV2Api(self.client).read_namespaced_horizontal_pod_autoscaler("web", NS)

    def replicas(self) -> int:
        return int(
            self.api.store.get(self.api.store.rtype("Deployment"), NS, "web")["spec"]["replicas"]
        )

    def reading(self) -> Autoscaler | None:
        return OwnerLookup(CoreV1Api(self.client), CustomObjectsApi(self.client)).autoscaler(WEB)


def test_a_cpu_cut_drives_the_hpa_out_at_its_rate_to_its_maximum(
    api: KubeEmulator, client: ApiClient
) -> None:
    """400m used of 1 CPU requested: 40%, under the 60% target; cut to 500m, 80%: a third over,
    so ceil(4 x 80/60) = 6 pods; with the usage per pod unchanged (the load does not spread in
    this world) it goes on out, 4 pods or 100% per 15 s, to its maximum, and says so."""
    world = World(api, client, ready=4, request="500m")
    world.hpa(maximum=7)
    hpa = world.sync(0.0)
    assert (hpa.status.current_replicas, hpa.status.desired_replicas) == (4, 6)
    assert hpa.status.current_metrics[0].resource.current.average_utilization == 80
    assert world.replicas() == 6
    assert world.events == [
        ("SuccessfulRescale",
         "New size: 6; reason: cpu resource utilization (percentage of request) above target"),
    ]  # fmt: skip
    hpa = world.sync(1.0)  # 4 Ready pods still at 80%: 6 again, within the rate (4 -> 8 in 15 s)
    assert hpa.status.desired_replicas == 6
    world.used = Decimal("1.0")  # 200%: ceil(4 x 200/60) = 14, beyond the maximum of 7
    hpa = world.sync(2.0)
    assert (hpa.status.desired_replicas, world.replicas()) == (7, 7)
    limited = {c.type: c for c in hpa.status.conditions}["ScalingLimited"]
    assert (limited.status, limited.reason) == ("True", "TooManyReplicas")
    assert world.reading() == Autoscaler(name="web", desired=7, min=2, max=7)


def test_the_scale_up_rate_policies_bound_a_leap(api: KubeEmulator, client: ApiClient) -> None:
    """From 2 pods at 600% of their requests: ceil(2 x 600/60) = 20, but 15 s allow 2 + 4 pods
    or 2 x 2 (the larger: 6); 15 s later, from 6, 12."""
    world = World(api, client, ready=2, request="100m")
    world.used = Decimal("0.6")
    world.hpa(maximum=30)
    assert world.sync(0.0).status.desired_replicas == 6
    assert world.sync(5.0).status.desired_replicas == 6  # the same period: no more
    assert world.sync(16.0).status.desired_replicas == 12


def test_within_the_tolerance_and_down_within_the_stabilisation_nothing_moves(
    api: KubeEmulator, client: ApiClient
) -> None:
    """57% of a 60% target is within the 10% tolerance; 20% wants 2 pods, but the highest
    proposal of the last 300 s (the default scale-down stabilisation) holds until it is older."""
    world = World(api, client, ready=4, request="700m")
    world.hpa()
    assert world.sync(0.0).status.desired_replicas == 4  # 400m / 700m = 57%
    world.used = Decimal("0.14")  # 20%: ceil(4 x 20/60) = 2
    assert world.sync(10.0).status.desired_replicas == 4  # the proposal of 0 s (4) holds
    assert world.sync(301.0).status.desired_replicas == 2
    assert world.replicas() == 2


def test_a_pod_without_a_cpu_request_stops_the_metric(api: KubeEmulator, client: ApiClient) -> None:
    world = World(api, client, ready=2, request=None)
    world.hpa()
    hpa = world.sync(0.0)
    active = {c.type: c for c in hpa.status.conditions}["ScalingActive"]
    assert (active.status, active.reason) == ("False", "FailedGetResourceMetric")
    assert active.message == "missing request for cpu in container app of web-0"
    assert world.replicas() == 2


@pytest.mark.parametrize("kind", ["External", "Object"])
def test_an_hpa_of_other_metrics_is_read_as_it_stands(
    api: KubeEmulator, client: ApiClient, kind: str
) -> None:
    """KEDA's HPAs (external metrics) are HPAs to the engine: their desired replicas follow the
    target here, nothing computes them."""
    world = World(api, client, ready=3, request="500m")
    world.hpa(metrics=[{"type": kind}])
    assert world.sync(0.0).status.desired_replicas == 3
    assert world.reading() == Autoscaler(name="web", desired=3, min=2, max=10)


def test_an_owner_no_hpa_scales_reads_none(api: KubeEmulator, client: ApiClient) -> None:
    world = World(api, client, ready=1, request="500m")
    assert world.reading() is None


def test_the_verdict_s_sample_reads_the_hpa_where_the_cohort_shrank(
    api: KubeEmulator, client: ApiClient
) -> None:
    """The final sample reads the owner's HPA when its desired replicas fell below the
    window's baseline (an HPA's scale-in is then not a failure), or when the policy has the
    autoscaler check; otherwise it spends no LIST on it."""
    world = World(api, client, ready=2, request="700m")  # 57%: the HPA keeps 2
    world.hpa()
    world.sync(0.0)
    acts = KubernetesActivities(CoreV1Api(client), CustomObjectsApi(client))
    rec = Recommendation(
        requests_key=recommendation_key("static"), requests={"app": {"cpu": "500m"}}
    )

    def final(**more: Any) -> CohortSample:
        started = datetime.now(UTC)
        return acts.sample_cohort(
            SampleCohortInput(cluster="test", owner=WEB, recommendation=rec,
                              window_started_at=started, final=True, **more)
        )  # fmt: skip

    hpas = len(api.requests("list", "/horizontalpodautoscalers"))
    assert final(baseline=2).autoscaler is None  # as many as the baseline: not read
    assert len(api.requests("list", "/horizontalpodautoscalers")) == hpas
    shrunk = final(baseline=4)
    assert shrunk.autoscaler == Autoscaler(name="web", desired=2, min=2, max=10)
    assert shrunk.desired == 2
    assert final(baseline=2, autoscaler=True).autoscaler is not None  # the check asks for it
