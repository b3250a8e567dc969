"""``rollbackctl run``: the combined worker + intake process, against a kubeconfig and simulated."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from sim.apiserver import KubeEmulator, free_port
from tests.activity.builders import NS, owner, pod, policy
from tests.deploy.kustomize import kubectl
from workflows.contract import ROLLBACK_STATE_ANNOTATION
from workflows.fingerprint import Recommendation

REC = Recommendation(
    requests_key="static.rightsizing.kubex.ai/desired-resource-requests",
    requests={"app": {"memory": "512Mi"}},
)


def _wait(check, timeout: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return False


def test_run_against_a_kubeconfig(tmp_path: Path) -> None:
    with KubeEmulator() as api:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "sim",
                    "clusters": [{"name": "sim", "cluster": {"server": api.url}}],
                    "users": [{"name": "sim", "user": {}}],
                    "contexts": [{"name": "sim", "context": {"cluster": "sim", "user": "sim"}}],
                }
            )
        )
        api.store.create(policy(monitoringPeriod="2s"))
        dep = api.store.create(owner("Deployment", replicas=1))
        port, metrics_port = free_port(), free_port()
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "cli.main",
                "--log-format",
                "json",
                "run",
                "--cluster",
                "test",
                "--kubeconfig",
                str(kubeconfig),
                "--data-dir",
                str(tmp_path / "data"),
                "--port",
                str(port),
                "--lease-namespace",
                "default",
                "--metrics-address",
                f"127.0.0.1:{metrics_port}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            ref = {
                "kind": "Deployment",
                "name": "web",
                "uid": dep["metadata"]["uid"],
                "controller": True,
            }
            rs = api.store.create(
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "metadata": {"name": "web-1", "namespace": NS, "ownerReferences": [ref]},
                    "spec": {"selector": {"matchLabels": {"app": "web"}}},
                }
            )
            assert _wait(lambda: api.store.watching("Pod") == 1, 30), (
                "the intake never watched pods"
            )
            api.store.create(
                pod(
                    "web-a",
                    {"app": "web"},
                    memory="512Mi",
                    rec=REC,
                    owner_ref={
                        "kind": "ReplicaSet",
                        "name": "web-1",
                        "uid": rs["metadata"]["uid"],
                        "controller": True,
                    },
                )
            )

            def state() -> dict | None:  # type: ignore[type-arg]
                obj = api.store.get(api.store.rtype("Deployment"), NS, "web")
                raw = (obj["metadata"].get("annotations") or {}).get(ROLLBACK_STATE_ANNOTATION)
                return json.loads(raw) if raw else None

            assert _wait(lambda: (state() or {}).get("mode") == "monitoringSucceeded", 30)
            lease = api.store.get(
                api.store.rtype("Lease"), "default", "rightsizing-rollback-intake"
            )
            assert lease["spec"]["holderIdentity"]
            url = f"http://127.0.0.1:{metrics_port}/metrics"
            with urllib.request.urlopen(url, timeout=5) as response:
                metrics = response.read().decode()
            assert 'rollback_transitions{mode="monitoringSucceeded"' in metrics, metrics[-3000:]
            assert 'rollback_kube_requests{code="200",method="GET"' in metrics
            assert "rollback_sample_latency" in metrics
            assert "temporal_workflow_task" in metrics  # the SDK's own, same endpoint
        finally:
            process.send_signal(signal.SIGTERM)
            output = process.communicate(timeout=60)[0].decode()
        assert process.returncode == 0, output[-3000:]
        assert "cluster from your kubeconfig" in output
        lines = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
        about = [x for x in lines if x.get("fingerprint") == REC.fingerprint]
        assert about, output[-2000:]
        assert all(x["owner"] == "shop/Deployment/web" and x["workflow_id"] for x in about)


def test_run_without_a_cluster_plays_the_demo(tmp_path: Path) -> None:
    port = free_port()
    stderr = (tmp_path / "stderr").open("w")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cli.main",
            "run",
            "--data-dir",
            str(tmp_path),
            "--port",
            str(port),
        ],
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        env={k: v for k, v in {**os.environ, "PYTHONUNBUFFERED": "1"}.items() if k != "KUBECONFIG"},
    )
    lines: list[str] = []
    try:
        assert process.stdout is not None
        deadline = time.monotonic() + 60
        for line in process.stdout:
            lines.append(line)
            if "-> rollingBack" in line or time.monotonic() > deadline:
                break
        # The banner's kubectl line works as printed: the real kubectl sees the demo's workload.
        kubeconfig = tmp_path.resolve() / "kubeconfig"
        assert f"kubectl: export KUBECONFIG={kubeconfig}" in "".join(lines)
        seen = subprocess.run(
            [kubectl(), "get", "deploy", "-A", "-o", "name"],
            env={**os.environ, "KUBECONFIG": str(kubeconfig)},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert seen.returncode == 0, seen.stderr
        assert "deployment.apps/" in seen.stdout
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=60)
    text = "".join(lines)
    assert f"Web UI http://127.0.0.1:{port + 1000}" in text
    assert "simulated cluster" in text and "-> rollingBack turn 1 (oomKilled)" in text
    # The console shows the timeline only; the engine's log lines go to a file.
    stderr.close()
    assert " INFO " not in (tmp_path / "stderr").read_text()
    assert (
        " INFO sim worker.intake.watching: intake started"
        in (tmp_path / "rollback.log").read_text()
    )


def _children(pid: int) -> set[int]:
    """Direct children of ``pid`` (Linux /proc)."""
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        found |= {int(c) for c in (task / "children").read_text().split()}
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_sigkill_of_run_leaves_no_orphans(tmp_path: Path) -> None:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "run", "--data-dir", str(tmp_path), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={k: v for k, v in {**os.environ, "PYTHONUNBUFFERED": "1"}.items() if k != "KUBECONFIG"},
    )
    assert process.stdout is not None
    for line in process.stdout:
        if "is running" in line:
            break
    children = _children(process.pid)
    assert len(children) >= 1  # the Temporal dev server (the worker and intake run in-process)
    process.kill()  # SIGKILL: no handler runs, nothing is stopped gracefully
    process.wait()
    assert _wait(lambda: not any(_alive(c) for c in children), 20), [
        Path(f"/proc/{c}/cmdline").read_text() for c in children if _alive(c)
    ]


def test_a_restart_starts_a_fresh_demo(tmp_path: Path) -> None:
    """The simulated cluster does not outlive a run, so neither does its Temporal history: the
    second start does not pile the demo on the first one's runs, and keeps that history aside."""
    port = free_port()
    command = [sys.executable, "-m", "cli.main", "run", "--data-dir", str(tmp_path)]
    env = {k: v for k, v in {**os.environ, "PYTHONUNBUFFERED": "1"}.items() if k != "KUBECONFIG"}
    for start in (1, 2):
        process = subprocess.Popen(
            [*command, "--port", str(port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        assert process.stdout is not None
        seen = []
        for line in process.stdout:
            seen.append(line)
            if "is running" in line:
                break
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=60)
        fresh = [line for line in seen if "A fresh demo" in line]
        if start == 1:
            assert not fresh
        else:
            assert fresh and str(tmp_path / "temporal.previous") in fresh[0]
            assert (tmp_path / "temporal.previous" / "temporal.sqlite").exists()
            assert (tmp_path / "temporal" / "temporal.sqlite").exists()


def test_the_fleet_demo_as_printed(tmp_path: Path) -> None:
    """``rollbackctl run --play fleet``: two simulated clusters with the same workload on one
    Temporal, each ending in its own mode; the banner's commands work as printed, from the
    directory it runs in, and the kubeconfig has a context per cluster."""
    port = free_port()
    env = {k: v for k, v in {**os.environ, "PYTHONUNBUFFERED": "1"}.items() if k != "KUBECONFIG"}
    process = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "run", "--play", "fleet", "--port", str(port)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    lines: list[str] = []
    try:
        assert process.stdout is not None
        deadline = time.monotonic() + 90
        ends = {"us-east/shop/Deployment/api  -> monitoringSucceeded",
                "eu-west/shop/Deployment/api  -> failedPermanent"}  # fmt: skip
        for line in process.stdout:
            lines.append(line)
            if all(e in "".join(lines) for e in ends) or time.monotonic() > deadline:
                break
        text = "".join(lines)
        assert all(e in text for e in ends), text
        assert "clusters us-east, eu-west on one Temporal" in text
        look = next(line for line in lines if line.startswith("Look with: "))
        get, describe = (shlex.split(c) for c in look.removeprefix("Look with: ").split("   |   "))

        def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False
            )

        listed = run(get)
        assert listed.returncode == 0, listed.stderr
        rows = [line.split() for line in listed.stdout.splitlines()[1:]]
        assert sorted((r[0], r[3]) for r in rows) == [
            ("eu-west", "failedPermanent"),
            ("us-east", "monitoringSucceeded"),
        ], listed.stdout
        described = run(describe)
        assert described.returncode == 0 and "Cluster:      us-east" in described.stdout
        assert "Mode:         monitoringSucceeded" in described.stdout
        ambiguous = run([*describe[:-1], "shop/Deployment/api"])
        assert ambiguous.returncode == 1 and "in clusters eu-west, us-east" in ambiguous.stderr
        exported = next(line for line in lines if line.startswith("kubectl: export KUBECONFIG="))
        kubeconfig = exported.split("=", 1)[1].split()[0]
        for cluster in ("us-east", "eu-west"):
            seen = subprocess.run(
                [kubectl(), "--context", cluster, "get", "events", "-n", "shop", "-o", "name"],
                env={**env, "KUBECONFIG": kubeconfig},
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert seen.returncode == 0 and "event/" in seen.stdout, seen.stderr
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=60)
