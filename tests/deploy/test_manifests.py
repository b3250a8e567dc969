"""Every kustomization in deploy/ renders, and every object validates against the Kubernetes
schemas offline (kubernetes-validate); the workloads keep the security settings we promise."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from tests.conftest import ROOT
from tests.deploy.kustomize import render
from worker.flags import MAX_CACHED_WORKFLOWS
from worker.runner import worker_memory_mib
from workflows.contract import SEARCH_ATTRIBUTE_TYPES

DEPLOY = ROOT / "deploy"
# Every kustomization that can be applied (components only in the overlays that use them).
KUSTOMIZATIONS = sorted(
    p.parent for p in DEPLOY.rglob("kustomization.yaml") if "kind: Component" not in p.read_text()
)
K8S_VERSION = "1.34"
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}


@pytest.mark.parametrize(
    "directory", KUSTOMIZATIONS, ids=[str(p.relative_to(DEPLOY)) or "." for p in KUSTOMIZATIONS]
)
def test_renders_and_validates(directory: Path) -> None:
    objects = render(directory)
    assert objects
    for obj in objects:
        # A namespaced object without a namespace lands wherever kubectl's context points.
        assert obj["kind"] in CLUSTER_SCOPED or obj["metadata"].get("namespace"), obj["metadata"]
        if obj["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # the Prometheus Operator's kinds: checked below and with promtool
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_monitoring_scrapes_both_processes_and_ships_the_dashboard() -> None:
    objects = render(DEPLOY / "overlays" / "monitoring")
    (monitor,) = _by_kind(objects, "ServiceMonitor")
    (service,) = [
        s for s in _by_kind(objects, "Service") if s["metadata"]["name"] == "rollback-metrics"
    ]
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    selected = [
        d["metadata"]["name"]
        for d in _by_kind(objects, "Deployment")
        if service["spec"]["selector"].items()
        <= d["spec"]["template"]["metadata"]["labels"].items()
        and any(
            p["name"] == "metrics"
            for c in d["spec"]["template"]["spec"]["containers"]
            for p in c.get("ports", [])
        )
    ]
    assert sorted(selected) == ["rollback-intake", "rollback-worker"]
    (rule,) = _by_kind(objects, "PrometheusRule")
    assert rule["spec"]["groups"][0]["rules"]
    dashboard = next(
        c for c in _by_kind(objects, "ConfigMap") if "dashboard.json" in c.get("data", {})
    )
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["dashboard.json"])["panels"]
    # Not in the default install: the Operator's kinds need its CRDs.
    assert not _by_kind(render(DEPLOY / "overlays" / "annotations"), "ServiceMonitor")


def _by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def test_workloads_are_hardened() -> None:
    objects = render(DEPLOY / "overlays" / "temporal-dev")
    for deployment in _by_kind(objects, "Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, deployment["metadata"]["name"]
        for container in pod["containers"]:
            ctx = container["securityContext"]
            assert (
                ctx["readOnlyRootFilesystem"] is True and ctx["allowPrivilegeEscalation"] is False
            )
            assert ctx["capabilities"]["drop"] == ["ALL"]
            assert container["resources"]["requests"] and container["resources"]["limits"]
            assert container.get("readinessProbe")
    names = {o["metadata"]["name"] for o in _by_kind(objects, "PodDisruptionBudget")}
    assert names == {"rollback-worker", "rollback-intake"}


def test_no_rbac_wildcards() -> None:
    for directory in KUSTOMIZATIONS:
        for role in (o for o in render(directory) if o["kind"] in ("ClusterRole", "Role")):
            for rule in role["rules"]:
                for field in ("apiGroups", "resources", "verbs"):
                    assert "*" not in rule[field], (role["metadata"]["name"], rule)


def test_resize_only_in_the_in_place_overlay() -> None:
    def grants(directory: Path) -> set[str]:
        return {
            r
            for o in render(directory)
            if o["kind"] == "ClusterRole"
            for rule in o["rules"]
            for r in rule["resources"]
        }

    assert "pods/resize" not in grants(DEPLOY / "overlays" / "annotations")
    assert "pods/resize" in grants(DEPLOY / "overlays" / "in-place")
    config = next(o for o in render(DEPLOY / "overlays" / "in-place") if o["kind"] == "ConfigMap")
    assert config["data"]["ROLLBACK_ACTUATION"] == "in-place"
    assert config["data"]["TEMPORAL_ADDRESS"]  # the patch merged, it did not replace


def test_default_kustomization_is_the_annotations_mode() -> None:
    kinds = {(o["kind"], o["metadata"]["name"]) for o in render(DEPLOY)}
    assert ("CustomResourceDefinition", "rollbackpolicies.rightsizing.kubex.ai") in kinds
    assert ("Deployment", "rollback-worker") in kinds and ("Deployment", "rollback-intake") in kinds


def test_probes_ask_the_processes_not_the_metrics_endpoint() -> None:
    """/metrics answered 200 even when the intake's informers were stuck (README, Probes)."""
    objects = render(DEPLOY)
    config = next(o for o in objects if o["kind"] == "ConfigMap")
    assert config["data"]["ROLLBACK_HEALTH_ADDRESS"].endswith(":8080")
    for deployment in _by_kind(objects, "Deployment"):
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports["health"] == 8080
        assert container["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "health"}
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}


def test_versioned_overlay_names_the_worker_after_its_build() -> None:
    objects = render(DEPLOY / "overlays" / "versioned")
    config = next(o for o in objects if o["kind"] == "ConfigMap")
    assert config["data"]["ROLLBACK_WORKER_VERSIONING"] == "on"
    (worker,) = [
        d for d in _by_kind(objects, "Deployment") if d["metadata"]["name"].startswith("rollback-w")
    ]
    build = next(
        e["value"]
        for e in worker["spec"]["template"]["spec"]["containers"][0]["env"]
        if e["name"] == "ROLLBACK_BUILD_ID"
    )
    assert worker["metadata"]["name"] == "rollback-worker-" + build.replace(".", "-")
    assert worker["spec"]["selector"]["matchLabels"]["app.kubernetes.io/version"] == build
    assert worker["spec"]["template"]["spec"]["containers"][0]["image"].endswith(":" + build)


def _mib(quantity: str) -> float:
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024}
    return float(quantity[:-2]) * units[quantity[-2:]]


def test_the_worker_memory_limit_fits_its_cache() -> None:
    """The shipped cache size, memory request and limit agree with the measured cost of a cached
    workflow (worker.runner, from bench/RESULTS.md): a full cache fits with headroom, and the
    limit is not so loose that it hides a leak."""
    objects = render(DEPLOY / "base")
    (config,) = [
        c for c in _by_kind(objects, "ConfigMap") if c["metadata"]["name"] == "rightsizing-rollback"
    ]
    cached = int(config["data"]["ROLLBACK_MAX_CACHED_WORKFLOWS"])
    assert cached == MAX_CACHED_WORKFLOWS
    (worker,) = (
        d for d in _by_kind(objects, "Deployment") if d["metadata"]["name"] == "rollback-worker"
    )
    resources = worker["spec"]["template"]["spec"]["containers"][0]["resources"]
    expected = worker_memory_mib(cached)
    assert _mib(resources["requests"]["memory"]) >= expected
    assert 1.5 * expected <= _mib(resources["limits"]["memory"]) <= 3 * expected


def test_the_trial_temporal_registers_every_search_attribute() -> None:
    """A run that upserts an unregistered search attribute fails its workflow task: the trial
    dev server (kustomize and the chart read the same file) registers each the workflow uses,
    and the page on running Temporal yourself names each."""
    objects = render(DEPLOY / "overlays" / "temporal-dev")
    (temporal,) = [
        d for d in _by_kind(objects, "Deployment") if d["metadata"]["name"] == "temporal-dev"
    ]
    args = temporal["spec"]["template"]["spec"]["containers"][0]["args"]
    registered = {args[i + 1] for i, arg in enumerate(args) if arg == "--search-attribute"}
    assert registered == {f"{name}={kind}" for name, kind in SEARCH_ATTRIBUTE_TYPES.items()}
    page = (ROOT / "docs" / "operating" / "temporal.md").read_text()
    assert [name for name in SEARCH_ATTRIBUTE_TYPES if name not in page] == []
