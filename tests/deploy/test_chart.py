"""The Helm chart (charts/rightsizing-rollback) with the real helm (``make helm``): it lints
strictly, renders for its defaults and each example values file into objects that validate
against the Kubernetes 1.33 schemas, refuses a typo'd value by name, packages, and agrees object
for object with the kustomize tree (deploy/) on every setting both offer."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from activities.notify import NotificationConfig, Receiver
from cli.localrun import write_kubeconfig
from sim.apiserver import KubeEmulator, free_port
from sim.prometheus import LocalPrometheus
from tests.conftest import ROOT
from tests.deploy.kustomize import render
from tests.deploy.test_rbac import denied
from workflows.contract import DEFAULT_MIN_READY, Actuation
from workflows.durations import DURATION_PATTERN, parse_duration
from workflows.policy import POLICY_KINDS
from workflows.selection import PROTECTED, Protection

CHART = ROOT / "charts" / "rightsizing-rollback"
APP_VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
EXAMPLES = sorted((CHART / "examples").glob("*.yaml"))
NAMESPACE = "rightsizing-rollback"  # the kustomize base's namespace
K8S_VERSION = "1.33"
# Labels Helm's conventions add to each object's metadata and pod template; kustomize has no
# release to name (and no chart version).
HELM_LABELS = (
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/component",
    "helm.sh/chart",
)
# Each example values file and the kustomize overlay that chooses the same.
SAME_AS_OVERLAY = {
    None: "annotations",
    "in-place.yaml": "in-place",
    "monitoring.yaml": "monitoring",
    "temporal-cloud.yaml": "temporal-cloud",
    "temporal-mtls.yaml": "temporal-mtls",
    "temporal-dev.yaml": "temporal-dev",
    "versioned.yaml": "versioned",
}


def helm() -> str:
    beside = Path(sys.executable).parent / "helm"
    found = str(beside) if beside.exists() else shutil.which("helm")
    assert found, "helm not installed: `make helm` puts helm v4 into .venv/bin"
    return found


# The one value an install must give (the chart refuses to render without it).
CLUSTER = "eu-west-1"


def run_helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm(), *args], capture_output=True, text=True, timeout=120, check=False)


def settings(objects: list[dict[str, Any]]) -> dict[str, str]:
    """The data of the ``rightsizing-rollback`` ConfigMap: what both processes read."""
    (config,) = [
        o for o in objects
        if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "rightsizing-rollback"
    ]  # fmt: skip
    return dict(config["data"])


def template(*values: Path, sets: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    args = ["template", "rr", str(CHART), "--namespace", NAMESPACE, "--include-crds"]
    args += ["--set", f"cluster={CLUSTER}"]
    for path in values:
        args += ["--values", str(path)]
    for s in sets:
        args += ["--set", s]
    out = run_helm(*args)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def test_lints_strictly() -> None:
    out = run_helm("lint", "--strict", str(CHART), "--set", f"cluster={CLUSTER}")
    assert out.returncode == 0, out.stdout + out.stderr
    for example in EXAMPLES:
        out = run_helm(
            "lint", "--strict", str(CHART), "--values", str(example), "--set", f"cluster={CLUSTER}"
        )
        assert out.returncode == 0, (example.name, out.stdout + out.stderr)


def test_the_cluster_is_required_and_a_dns_label() -> None:
    """A fleet's clusters share one Temporal: an install that does not name its cluster is
    refused at install, saying what to set; so is a name that is no DNS label."""
    out = run_helm("template", "rr", str(CHART))
    assert out.returncode != 0 and "cluster is required" in out.stderr, out.stderr
    out = run_helm("template", "rr", str(CHART), "--set", "cluster=EU_West")
    assert out.returncode != 0 and "cluster" in out.stderr and "pattern" in out.stderr, out.stderr
    data = settings(template())
    assert data["ROLLBACK_CLUSTER"] == CLUSTER
    assert "ROLLBACK_TASK_QUEUE" not in data  # one per cluster, from its name


def test_protected_namespaces_are_kubex_s_defaults_and_a_value(tmp_path: Path) -> None:
    """The chart, kustomize and the processes protect the same namespaces by default; a value
    replaces them, and the schema refuses what the processes would."""

    def protected(objects: list[dict[str, Any]]) -> Protection:
        return Protection.parse(settings(objects)["ROLLBACK_PROTECTED_NAMESPACES"])

    assert protected(template()) == PROTECTED
    assert protected(render(ROOT / "deploy" / "base")) == PROTECTED
    mine = template(sets=("protectedNamespacePatterns={kube-system,platform-*}",))
    assert protected(mine).patterns == ("kube-system", "platform-*")
    none = tmp_path / "none.yaml"
    none.write_text("protectedNamespacePatterns: []\n")
    assert protected(template(none)).patterns == ()
    out = run_helm(
        "template", "rr", str(CHART), "--set", f"cluster={CLUSTER}",
        "--set", "protectedNamespacePatterns={Kube_System}",
    )  # fmt: skip
    assert out.returncode != 0 and "protectedNamespacePatterns" in out.stderr, out.stderr


def test_the_dev_server_is_placed_pulled_and_fenced_as_the_engine() -> None:
    def dev(*sets: str) -> list[dict[str, Any]]:
        return template(sets=("temporal.dev.enabled=true", *sets))

    def policies(objects: list[dict[str, Any]]) -> set[str]:
        return {o["metadata"]["name"] for o in objects if o["kind"] == "NetworkPolicy"}

    assert "temporal-dev" in policies(dev())
    assert policies(dev("networkPolicy.enabled=false")) == set()
    placed = dev(
        "imagePullSecrets[0].name=mirror",
        "nodeSelector.pool=system",
        "tolerations[0].key=dedicated",
        "tolerations[0].operator=Exists",
        "temporal.dev.image=mirror.example/temporalio/temporal:1.9.1",
    )
    pods = {
        o["metadata"]["name"]: o["spec"]["template"]["spec"]
        for o in placed
        if o["kind"] == "Deployment"
    }
    for name in ("temporal-dev", "rollback-worker", "rollback-intake"):
        assert pods[name]["imagePullSecrets"] == [{"name": "mirror"}], name
        assert pods[name]["nodeSelector"] == {"pool": "system"}, name
        assert pods[name]["tolerations"] == [{"key": "dedicated", "operator": "Exists"}], name
    assert pods["temporal-dev"]["containers"][0]["image"] == (
        "mirror.example/temporalio/temporal:1.9.1"
    )


def test_a_settings_change_rolls_the_pods_and_one_replica_blocks_no_drain() -> None:
    """The pods read their settings at start: a change rolls them (a checksum of the rendered
    ConfigMaps on each pod template); a budget one replica cannot meet is not rendered."""

    def checksums(objects: list[dict[str, Any]]) -> dict[str, str]:
        return {
            o["metadata"]["name"]: o["spec"]["template"]["metadata"]["annotations"][
                "checksum/config"
            ]
            for o in objects
            if o["kind"] == "Deployment"
        }

    before = checksums(template())
    assert set(before) == {"rollback-worker", "rollback-intake"}
    assert checksums(template()) == before  # the same settings: nothing rolls
    for change in ("temporal.address=temporal.other:7233", "notifications.uiUrl=https://t.example"):
        after = checksums(template(sets=(change,)))
        assert all(after[name] != before[name] for name in before), change

    def budgets(*sets: str) -> set[str]:
        objects = template(sets=sets)
        return {o["metadata"]["name"] for o in objects if o["kind"] == "PodDisruptionBudget"}

    assert budgets() == {"rollback-worker", "rollback-intake"}
    assert budgets("worker.replicas=1", "intake.replicas=1") == set()
    assert budgets("worker.replicas=1") == {"rollback-intake"}


def test_min_ready_duration_is_kubex_s_default_and_a_duration() -> None:
    def setting(objects: list[dict[str, Any]]) -> str:
        return str(settings(objects)["ROLLBACK_MIN_READY_DURATION"])

    assert parse_duration(setting(template())) == DEFAULT_MIN_READY
    assert parse_duration(setting(render(ROOT / "deploy" / "base"))) == DEFAULT_MIN_READY
    assert setting(template(sets=("minReadyDuration=0s",))) == "0s"
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["properties"]["minReadyDuration"]["pattern"].endswith(DURATION_PATTERN)
    out = run_helm(
        "template",
        "rr",
        str(CHART),
        "--set",
        f"cluster={CLUSTER}",
        "--set",
        "minReadyDuration=soon",
    )
    assert out.returncode != 0 and "minReadyDuration" in out.stderr, out.stderr


@pytest.mark.parametrize("values", [None, *EXAMPLES], ids=["defaults", *(p.stem for p in EXAMPLES)])
def test_renders_objects_valid_for_kubernetes(values: Path | None) -> None:
    objects = template(*([values] if values else []))
    assert {"Deployment", "ClusterRole", "CustomResourceDefinition"} <= {o["kind"] for o in objects}
    for obj in objects:
        if obj["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # the Prometheus Operator's kinds: compared with kustomize's below
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    for config in (o for o in objects if o["kind"] == "ConfigMap"):
        if "notifications.yaml" in config["data"]:  # what the worker loads at start
            NotificationConfig.model_validate(yaml.safe_load(config["data"]["notifications.yaml"]))


def _comparable(obj: dict[str, Any]) -> dict[str, Any]:
    """An object without Helm's own labels and its settings checksum (a restart on
    ``helm upgrade``; kustomize users restart with ``kubectl rollout restart``), with its
    notification file parsed (its comments differ)."""
    obj = json.loads(json.dumps(obj))
    template = (obj.get("spec") or {}).get("template") or {}
    for meta in (obj["metadata"], template.get("metadata") or {}):
        labels = meta.get("labels", {})
        for label in HELM_LABELS:  # (the selectors, which both must have, are compared)
            labels.pop(label, None)
        if "labels" in meta and not labels:
            del meta["labels"]  # the CRDs: Helm's labels only
    (template.get("metadata") or {}).get("annotations", {}).pop("checksum/config", None)
    # The chart's CRDs outlive an uninstall (crds.keep); kustomize's are applied by hand.
    annotations = obj["metadata"].get("annotations", {})
    annotations.pop("helm.sh/resource-policy", None)
    if not annotations:
        obj["metadata"].pop("annotations", None)
    data = obj.get("data", {})
    if "notifications.yaml" in data:
        data["notifications.yaml"] = yaml.safe_load(data["notifications.yaml"])
    return obj


def _installed(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The objects an install creates: not the ``helm test`` hooks (``helm test`` creates them)."""
    return [o for o in objects if "helm.sh/hook" not in (o["metadata"].get("annotations") or {})]


def _by_identity(objects: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """The installed objects by kind and name (kustomize has no ``helm test``)."""
    return {(o["kind"], o["metadata"]["name"]): _comparable(o) for o in _installed(objects)}


@pytest.mark.parametrize("example", SAME_AS_OVERLAY, ids=lambda e: SAME_AS_OVERLAY[e])
def test_chart_and_kustomize_agree_object_for_object(example: str | None) -> None:
    chart = _by_identity(template(*([CHART / "examples" / example] if example else [])))
    kustomize = _by_identity(render(ROOT / "deploy" / "overlays" / SAME_AS_OVERLAY[example]))
    # The one value kustomize leaves to the installer (empty: the processes refuse to start).
    config = kustomize[("ConfigMap", "rightsizing-rollback")]["data"]
    assert config["ROLLBACK_CLUSTER"] == ""
    config["ROLLBACK_CLUSTER"] = CLUSTER
    # Helm installs into the release's namespace (`--create-namespace`); it does not own it.
    kustomize.pop(("Namespace", NAMESPACE))
    assert sorted(chart) == sorted(kustomize)
    for identity, obj in kustomize.items():
        assert chart[identity] == obj, (identity, _differences(chart[identity], obj))


def _differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Where two parsed objects differ, as paths with both values."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [
            d
            for k in sorted(a.keys() | b.keys(), key=str)
            for d in _differences(a.get(k), b.get(k), f"{path}.{k}")
        ]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [
            d
            for i, (x, y) in enumerate(zip(a, b, strict=True))
            for d in _differences(x, y, f"{path}[{i}]")
        ]
    return [] if a == b else [f"{path}: chart {a!r}, kustomize {b!r}"]


def test_a_typo_is_refused_by_name() -> None:
    out = run_helm("template", "rr", str(CHART), "--set", "worker.replicaz=3")
    assert out.returncode != 0
    assert "replicaz" in out.stderr and "additional properties" in out.stderr.lower(), out.stderr
    out = run_helm("template", "rr", str(CHART), "--set", "actuation=inplace")
    assert out.returncode != 0 and "actuation" in out.stderr, out.stderr


def test_schema_is_strict_and_as_the_flags_are() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())

    def objects(node: Any, path: str) -> list[tuple[str, dict[str, Any]]]:
        found = []
        if isinstance(node, dict):
            if "properties" in node:
                found.append((path, node))
            for key, value in node.items():
                found += objects(value, f"{path}.{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                found += objects(value, f"{path}[{i}]")
        return found

    for path, node in objects(schema, "$"):
        assert node.get("additionalProperties") is False, path
    props = schema["properties"]
    assert props["actuation"]["enum"] == [a.value for a in Actuation]
    receiver = props["notifications"]["properties"]["receivers"]["items"]["properties"]
    assert sorted(receiver) == sorted(f.alias or name for name, f in Receiver.model_fields.items())


def test_versioning_gives_one_worker_deployment_per_build() -> None:
    objects = template(
        CHART / "examples" / "versioned.yaml", sets=("workerVersioning.builds={1.0.0,1.1.0}",)
    )
    workers = {
        o["metadata"]["name"]: o
        for o in objects
        if o["kind"] == "Deployment" and o["metadata"]["name"].startswith("rollback-worker")
    }
    assert sorted(workers) == ["rollback-worker-1-0-0", "rollback-worker-1-1-0"]
    for build, deployment in (
        ("1.0.0", workers["rollback-worker-1-0-0"]),
        ("1.1.0", workers["rollback-worker-1-1-0"]),
    ):
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        assert container["image"].endswith(f":{build}")
        assert {"name": "ROLLBACK_BUILD_ID", "value": build} in container["env"]


def test_one_version_everywhere() -> None:
    """The package, the chart and its appVersion, the image tags, the versioned overlay's
    build ID, the chart's versioned example, the CHANGELOG's newest entry, the upgrade page and
    the kubectl plugin's krew manifest and launcher tell one version."""
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == chart["version"] == version
    for manifest in ("worker.yaml", "intake.yaml"):
        assert (
            f"ghcr.io/rightsizing/rollback:{version}"
            in (ROOT / "deploy" / "base" / manifest).read_text()
        )
    versioned = ROOT / "deploy" / "overlays" / "versioned"
    assert f"newTag: {version}" in (versioned / "kustomization.yaml").read_text()
    assert (
        f'{{name: ROLLBACK_BUILD_ID, value: "{version}"}}' in (versioned / "build.yaml").read_text()
    )
    example = yaml.safe_load((CHART / "examples" / "versioned.yaml").read_text())
    assert example["workerVersioning"]["builds"] == [version]
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert re.findall(r"^## \[([^\]]+)\]", changelog, re.M)[0] == version
    assert (
        f"This repository builds {version}"
        in (ROOT / "docs" / "operating" / "upgrade.md").read_text()
    )
    krew = ROOT / "deploy" / "krew"
    plugin = yaml.safe_load((krew / "rollback.yaml").read_text())["spec"]
    assert plugin["version"] == f"v{version}"
    for text in (plugin["caveats"], (krew / "kubectl-rollback").read_text()):
        assert f"rightsizing-rollback=={version}" in text


def test_packages_with_the_linked_files_inside(tmp_path: Path) -> None:
    out = run_helm("package", str(CHART), "--destination", str(tmp_path))
    assert out.returncode == 0, out.stderr
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    archive = tmp_path / f"{chart['name']}-{chart['version']}.tgz"
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
        crd = tar.extractfile(f"{chart['name']}/files/rollbackpolicies.yaml")
        assert crd is not None
        assert crd.read() == (ROOT / "deploy" / "crds" / "rollbackpolicies.yaml").read_bytes()
    assert f"{chart['name']}/values.schema.json" in names
    assert not any("/examples/" in n for n in names)  # .helmignore: documentation only


def _install_page_helm_commands() -> list[str]:
    """Each ``helm install`` command of the README and the install page, continuation lines
    joined."""
    pages = (ROOT / "README.md", ROOT / "docs" / "operating" / "install.md")
    text = "".join(p.read_text() for p in pages).replace("\\\n", " ")
    return [line.strip() for line in text.splitlines() if line.startswith("helm install ")]


def test_the_install_page_helm_commands_install_as_printed() -> None:
    """As printed, with ``--dry-run=client`` (no cluster here runs Helm's release storage): the
    chart path, the namespace and the values files resolve from a clone's root, and the NOTES
    print the commands that show it working."""
    commands = _install_page_helm_commands()
    assert len(commands) >= 3
    for command in commands:
        argv = shlex.split(command)
        out = subprocess.run(
            [helm(), *argv[1:], "--dry-run=client"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env={**os.environ, "KUBECONFIG": os.devnull},
        )
        assert out.returncode == 0, (command, out.stderr)
        notes = out.stdout.split("NOTES:", 1)[1]
        assert "kubectl -n rightsizing-rollback rollout status deployment/rollback-intake" in notes
        # The policy it prints to apply is one the CRD and the models accept.
        # (at the start of its lines, so that a copied heredoc ends where it should)
        doc = yaml.safe_load(notes.split("<<'EOF'\n", 1)[1].split("\nEOF\n", 1)[0])
        POLICY_KINDS[doc["kind"]].model_validate(doc)  # as strict as the CRD schema


API_SERVER = {"ipBlock": {"cidr": "10.0.0.1/32"}}
TEMPORAL = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "temporal"}}}
POLICED = ("rollback-worker", "rollback-intake", "rollback-connection-test")


def _one(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def _pod(objects: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return dict(_one(objects, "Deployment", name)["spec"]["template"])


# Each key a platform team sets without forking the chart: its value, where it must land (each
# ``Kind/name:path`` of the rendered objects, ``-1`` the last of a list) and what must be there.
POD = "spec.template.spec"
BOTH = ("Deployment/rollback-worker", "Deployment/rollback-intake")
SPREAD = {
    "maxSkew": 1,
    "topologyKey": "kubernetes.io/hostname",
    "whenUnsatisfiable": "ScheduleAnyway",
    "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "rollback-worker"}},
}
AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["system"]}]}
            ]
        }
    }
}
DIGEST = "sha256:" + "a" * 64
ENV = {"name": "TEMPORAL_PROFILE", "value": "prod"}
VOLUME, MOUNT = {"name": "ca", "configMap": {"name": "ca"}}, {"name": "ca", "mountPath": "/etc/ca"}
DNS = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
    "podSelector": {"matchLabels": {"k8s-app": "coredns"}},
}
OVERRIDES: list[tuple[str, Any, list[str], Any]] = [
    ("worker.affinity", AFFINITY, [f"{BOTH[0]}:{POD}.affinity"], AFFINITY),
    ("intake.affinity", AFFINITY, [f"{BOTH[1]}:{POD}.affinity"], AFFINITY),
    ("worker.topologySpreadConstraints", [SPREAD],
     [f"{BOTH[0]}:{POD}.topologySpreadConstraints"], [SPREAD]),
    ("priorityClassName", "critical", [f"{d}:{POD}.priorityClassName" for d in BOTH], "critical"),
    ("podAnnotations", {"team": "a"},
     [f"{d}:spec.template.metadata.annotations.team" for d in BOTH], "a"),
    ("podLabels", {"team": "a"}, [f"{d}:spec.template.metadata.labels.team" for d in BOTH], "a"),
    ("podSecurityContext", {"runAsUser": 20000},
     [f"{d}:{POD}.securityContext.runAsUser" for d in BOTH], 20000),
    ("securityContext", {"runAsUser": 20000},
     [f"{d}:{POD}.containers.0.securityContext.runAsUser" for d in BOTH],
     20000),
    ("extraEnv", [ENV], [f"{d}:{POD}.containers.0.env.-1" for d in BOTH], ENV),
    ("extraEnvFrom", [{"secretRef": {"name": "proxy"}}],
     [f"{d}:{POD}.containers.0.envFrom.-1" for d in BOTH], {"secretRef": {"name": "proxy"}}),
    ("extraVolumes", [VOLUME], [f"{d}:{POD}.volumes.-1" for d in BOTH], VOLUME),
    ("extraVolumeMounts", [MOUNT], [f"{d}:{POD}.containers.0.volumeMounts.-1" for d in BOTH],
     MOUNT),
    ("worker.serviceAccount.annotations", {"iam.gke.io/gcp-service-account": "r@p.iam"},
     ["ServiceAccount/rollback-worker:metadata.annotations.iam.gke.io/gcp-service-account"],
     "r@p.iam"),
    ("image.registry", "mirror.example.com", [f"{d}:{POD}.containers.0.image" for d in BOTH],
     f"mirror.example.com/ghcr.io/rightsizing/rollback:{APP_VERSION}"),
    ("image.digest", DIGEST, [f"{d}:{POD}.containers.0.image" for d in BOTH],
     f"ghcr.io/rightsizing/rollback@{DIGEST}"),
    ("monitoring", {"serviceMonitor": {"enabled": True, "labels": {"release": "kps"}}},
     ["ServiceMonitor/rightsizing-rollback:metadata.labels.release"], "kps"),
    ("monitoring", {"prometheusRule": {"enabled": True, "labels": {"release": "kps"}}},
     ["PrometheusRule/rightsizing-rollback:metadata.labels.release"], "kps"),
    ("monitoring", {"dashboard": {"enabled": True, "labels": {"grafana_dashboard": "1", "t": "a"}}},
     ["ConfigMap/rightsizing-rollback-dashboard:metadata.labels.t"], "a"),
    ("networkPolicy.dns", DNS,
     [f"NetworkPolicy/{n}:spec.egress.0.to.0" for n in ("rollback-worker", "rollback-intake")],
     DNS),
    ("networkPolicy.egress", {"apiServer": [API_SERVER]},
     [f"NetworkPolicy/{n}:spec.egress.1.to.0" for n in POLICED], API_SERVER),
    ("networkPolicy.egress", {"temporal": [TEMPORAL]},
     [f"NetworkPolicy/{n}:spec.egress.2.to.0" for n in POLICED], TEMPORAL),
]  # fmt: skip


def test_each_egress_names_its_destinations_when_given(tmp_path: Path) -> None:
    """With networkPolicy.egress, Prometheus's and the receivers' rules name theirs too, and
    the install's notes say which rules stay open to any destination."""
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({
        "prometheus": {"url": "http://prometheus.monitoring:9090"},
        "notifications": {"receivers": [{"name": "chat", "urlEnv": "CHAT_URL"},
                                        {"name": "pager", "url": "https://pager.example:8443/x"}]},
        "networkPolicy": {"egress": {"apiServer": [API_SERVER], "prometheus": [TEMPORAL]}},
    }))  # fmt: skip
    objects = template(values)
    for name in ("rollback-worker", "rollback-intake"):
        egress = _one(objects, "NetworkPolicy", name)["spec"]["egress"]
        assert egress[3] == {"to": [TEMPORAL], "ports": [{"port": 9090, "protocol": "TCP"}]}
        assert egress[4] == {"ports": [{"port": 443, "protocol": "TCP"},  # urlEnv: HTTPS
                                       {"port": 8443, "protocol": "TCP"}]}  # fmt: skip
    notes = run_helm("install", "rr", str(CHART), "--dry-run=client", "--namespace", NAMESPACE,
                     "--set", f"cluster={CLUSTER}", "--values", str(values))  # fmt: skip
    assert notes.returncode == 0, notes.stderr
    assert "open to any destination on their ports: receivers, temporal;" in notes.stdout


def _at(objects: list[dict[str, Any]], where: str) -> Any:
    """``Kind/name:a.b.0.c`` of the rendered objects (a key with dots, such as an annotation's,
    is the rest of the path once no shorter key matches)."""
    identity, path = where.split(":", 1)
    kind, name = identity.split("/", 1)
    found: Any = _one(objects, kind, name)
    steps = path.split(".")
    while steps:
        if isinstance(found, list):
            found, steps = found[int(steps[0])], steps[1:]
            continue
        for n in range(1, len(steps) + 1):
            key = ".".join(steps[:n])
            if key in found:
                found, steps = found[key], steps[n:]
                break
        else:
            raise KeyError(f"{where}: no {steps[0]!r}")
    return found


@pytest.mark.parametrize(
    ("key", "value", "where", "want"), OVERRIDES, ids=[o[0] for o in OVERRIDES]
)
def test_each_key_lands_where_it_should_and_renders_valid_objects(
    tmp_path: Path, key: str, value: Any, where: list[str], want: Any
) -> None:
    values = tmp_path / "values.yaml"
    tree: Any = value
    for part in reversed(key.split(".")):
        tree = {part: tree}
    values.write_text(yaml.safe_dump(tree))
    objects = template(values)
    for place in where:
        assert _at(objects, place) == want, place
    for obj in objects:
        if not obj["apiVersion"].startswith("monitoring.coreos.com/"):
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_identity_and_rbac_can_come_from_elsewhere() -> None:
    """A cloud's workload identity: existing ServiceAccounts, named, bound to the chart's roles;
    or no RBAC at all (the platform grants it)."""
    objects = template(
        sets=(
            "worker.serviceAccount.create=false",
            "worker.serviceAccount.name=rollback-worker-wi",
            "intake.serviceAccount.name=rollback-intake-wi",
        )
    )
    accounts = {o["metadata"]["name"] for o in _installed(objects) if o["kind"] == "ServiceAccount"}
    assert accounts == {"rollback-intake-wi"}
    assert _pod(objects, "rollback-worker")["spec"]["serviceAccountName"] == "rollback-worker-wi"
    assert _pod(objects, "rollback-intake")["spec"]["serviceAccountName"] == "rollback-intake-wi"
    binding = _one(objects, "ClusterRoleBinding", "rightsizing-rollback-worker")
    assert binding["subjects"][0]["name"] == "rollback-worker-wi"
    bare = template(sets=("rbac.create=false",))
    rbac = {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
    assert not [o for o in bare if o["kind"] in rbac]
    assert {o["metadata"]["name"] for o in _installed(bare) if o["kind"] == "ServiceAccount"} == {
        "rollback-worker",
        "rollback-intake",
    }


def test_crds_are_templates_kept_on_uninstall() -> None:
    """``helm upgrade`` updates the CRDs (they are templates, one source with deploy/crds); an
    uninstall leaves them, and every policy, unless crds.keep is false; crds.install=false
    leaves them to you."""
    crds = [o for o in template() if o["kind"] == "CustomResourceDefinition"]
    assert sorted(o["metadata"]["name"] for o in crds) == [
        "clusterrollbackpolicies.rightsizing.kubex.ai",
        "rollbackpolicies.rightsizing.kubex.ai",
    ]
    for crd in crds:
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        assert crd["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
        source = yaml.safe_load(
            (ROOT / "deploy" / "crds" / f"{crd['spec']['names']['plural']}.yaml").read_text()
        )
        assert crd["spec"] == source["spec"]
    unkept = [
        o for o in template(sets=("crds.keep=false",)) if o["kind"] == "CustomResourceDefinition"
    ]
    assert unkept and all("annotations" not in o["metadata"] for o in unkept)
    assert not [
        o for o in template(sets=("crds.install=false",)) if o["kind"] == "CustomResourceDefinition"
    ]


def test_standard_labels_on_every_object() -> None:
    for obj in template(CHART / "examples" / "monitoring.yaml"):
        labels = obj["metadata"]["labels"]
        for label in ("app.kubernetes.io/managed-by", "app.kubernetes.io/instance",
                      "app.kubernetes.io/version", "helm.sh/chart"):  # fmt: skip
            assert label in labels, (obj["kind"], obj["metadata"]["name"], label)
    objects = template()
    for name, component in (("rollback-worker", "worker"), ("rollback-intake", "intake")):
        labels = _pod(objects, name)["metadata"]["labels"]
        assert labels["app.kubernetes.io/component"] == component
        assert labels["app.kubernetes.io/instance"] == "rr"


# The previous chart version's workload selectors, rendered for its defaults and each example:
# `git archive b949ee9 charts deploy | tar -x -C /tmp/prev`, then `helm template` of
# /tmp/prev/charts/rightsizing-rollback (what produced the file). On the next version bump,
# record this version's.
PREVIOUS = ROOT / "tests" / "deploy" / "chart-0.1.0-selectors.json"


def test_an_upgrade_from_the_previous_version_changes_no_selector() -> None:
    """A Deployment's selector is immutable: ``helm upgrade`` from 0.1.0 must render every
    workload it had with the same selector (and keep its name), or the upgrade fails."""
    previous = json.loads(PREVIOUS.read_text())
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["version"] != "0.1.0"  # a new version, upgraded from the recorded one
    for values, selectors in previous.items():
        files = [] if values == "defaults" else [CHART / "examples" / values]
        # A versioned install keeps its builds across the upgrade (the new build's Deployment
        # is added beside them): the example's, as 0.1.0 shipped it.
        kept = ("workerVersioning.builds={0.1.0}",) if values == "versioned.yaml" else ()
        objects = template(*files, sets=kept)
        for identity, selector in selectors.items():
            kind, name = identity.split("/", 1)
            assert _one(objects, kind, name)["spec"]["selector"] == selector, (values, identity)


async def test_helm_test_checks_kubernetes_then_temporal_as_the_install_runs(
    temporal_env: Any, tmp_path: Path
) -> None:
    """``helm test``'s Pod: each container's command, run as rendered with the install's
    settings (its ConfigMap as the environment, ``$(VAR)`` expanded as the kubelet does): both
    pass against a reachable API server and Temporal; with Temporal gone, the second fails. It
    runs as its own ServiceAccount, whose rules allow every request it made and no more than
    listing the policies (not the intake's, which may patch every workload)."""
    objects = template()
    (pod,) = [o for o in objects if o["kind"] == "Pod"]
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert pod["spec"]["serviceAccountName"] == "rollback-test"
    (role,) = [o for o in objects if o["kind"] == "ClusterRole"
               and o["metadata"]["name"] == "rightsizing-rollback-test"]  # fmt: skip
    assert {v for r in role["rules"] for v in r["verbs"]} == {"list"}
    steps = [*pod["spec"]["initContainers"], *pod["spec"]["containers"]]
    assert [c["name"] for c in steps] == ["kubernetes-api", "temporal"]
    address = temporal_env.client.service_client.config.target_host

    def run(container: dict[str, Any], temporal: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, **settings(objects), "TEMPORAL_ADDRESS": temporal}
        env["KUBECONFIG"] = str(write_kubeconfig(tmp_path / "kubeconfig", api.url))
        args = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in container["args"]]
        return subprocess.run(
            [sys.executable, "-m", "cli.main", *args],
            capture_output=True, text=True, timeout=60, check=False, env=env, cwd=ROOT,
        )  # fmt: skip

    with KubeEmulator() as api:
        for container in steps:
            done = await asyncio.to_thread(run, container, address)
            assert done.returncode == 0, (container["name"], done.stderr)
        assert api.journal and denied(api.journal, role["rules"]) == set()
        gone = await asyncio.to_thread(run, steps[1], f"127.0.0.1:{free_port()}")
    assert gone.returncode == 1 and "cannot reach Temporal" in gone.stderr, gone.stderr


def test_chart_metadata_points_at_the_project() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    urls = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]
    assert chart["home"] == urls["Homepage"] and chart["sources"] == [urls["Source"]]
    assert chart["maintainers"] and chart["icon"].startswith(urls["Source"].replace(
        "https://github.com/", "https://raw.githubusercontent.com/"))  # fmt: skip
    assert (ROOT / chart["icon"].split("/main/", 1)[1]).exists()  # the icon is in the repository


def test_prometheus_url_opens_its_port_and_helm_test_asks_it(tmp_path: Path) -> None:
    """With prometheus.url (and receivers given by url), both processes' NetworkPolicies let
    them reach those ports, and ``helm test`` gains a step that asks Prometheus a query: run as
    rendered, it passes against a real Prometheus and fails, saying why, against none."""
    prometheus = LocalPrometheus(tmp_path / "prometheus", []).wait_ready()
    try:
        url = prometheus.url  # http://127.0.0.1:<port>
        objects = template(
            sets=(
                f"prometheus.url={url}",
                "notifications.receivers[0].name=ops",
                "notifications.receivers[0].type=webhook",
                "notifications.receivers[0].url=http://hooks.ops:8081/rollback",
                "notifications.receivers[1].name=chat",
                "notifications.receivers[1].type=slack",
                "notifications.receivers[1].urlEnv=SLACK_URL",  # a secret: extraEgressPorts
            )
        )
        port = int(url.rsplit(":", 1)[1])
        for name in ("rollback-worker", "rollback-intake"):
            egress = _one(objects, "NetworkPolicy", name)["spec"]["egress"]
            opened = {p["port"] for rule in egress for p in rule.get("ports", [])}
            assert {port, 8081} <= opened, (name, egress)
        (pod,) = [o for o in objects if o["kind"] == "Pod"]
        steps = {c["name"]: c for c in [*pod["spec"]["initContainers"], *pod["spec"]["containers"]]}
        step = steps["prometheus"]

        def run(env_url: str) -> subprocess.CompletedProcess[str]:
            env = {**os.environ, **settings(objects), "ROLLBACK_PROMETHEUS_URL": env_url}
            return subprocess.run(
                [sys.executable, "-m", "cli.main", *step["args"]],
                capture_output=True, text=True, timeout=60, check=False, env=env, cwd=ROOT,
            )  # fmt: skip

        answered = run(settings(objects)["ROLLBACK_PROMETHEUS_URL"])
        assert answered.returncode == 0 and "answers" in answered.stdout, answered.stderr
    finally:
        prometheus.stop()
    gone = run(url)  # stopped now
    assert gone.returncode == 1 and "unreachable" in gone.stderr, gone.stderr
    plain = template()
    (pod,) = [o for o in plain if o["kind"] == "Pod"]
    assert "prometheus" not in [c["name"] for c in pod["spec"]["initContainers"]]


def test_the_intake_may_annotate_its_own_namespace_and_no_other() -> None:
    """The storm breaker's one write outside the workloads: the release's namespace only."""
    out = run_helm(
        "template", "rr", str(CHART), "--namespace", "ops", "--set", f"cluster={CLUSTER}"
    )
    assert out.returncode == 0, out.stderr
    name = "rightsizing-rollback-intake"
    intake = next(
        d for d in yaml.safe_load_all(out.stdout)
        if d and d["kind"] == "ClusterRole" and d["metadata"]["name"] == name
    )  # fmt: skip
    on_namespaces = [r for r in intake["rules"] if "namespaces" in r["resources"]]
    assert {"patch"} == {v for r in on_namespaces if "resourceNames" in r for v in r["verbs"]}
    assert all(r["resourceNames"] == ["ops"] for r in on_namespaces if "patch" in r["verbs"])
