"""What the benchmarks share: the recommendation, the workload and policy objects they create on
the emulator, a scratch dev server, process figures, and how a figure is printed (``say``) with
its target (``met``)."""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.memory import memory_mib
from sim.apiserver import KubeEmulator, free_port
from sim.devserver import DevServer
from workflows.contract import Obj, recommendation_key
from workflows.fingerprint import Recommendation

KEY = recommendation_key("static")
REC = Recommendation(requests_key=KEY, requests={"app": {"memory": "512Mi"}})
Lines = list[str]
RESULT_WAITERS = 200


def met(reached: bool) -> str:
    """What a figure's target line adds: nothing when reached, NOT MET when missed."""
    return "" if reached else ": NOT MET"


def p50_p99(values: list[float]) -> tuple[float, float]:
    """The median and the 99th percentile (the value at 99% of the sorted list); NaN for none."""
    if not values:
        return float("nan"), float("nan")
    ordered = sorted(values)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def say(lines: Lines, text: str = "") -> None:
    print(text, flush=True)
    lines.append(text)


@contextmanager
def scratch_server() -> Iterator[DevServer]:
    """A throwaway dev server: SQLite in a temporary directory, a free port, no UI."""
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "log"
        with DevServer(Path(tmp), free_port(), headless=True, log_path=log) as server:
            yield server


READY = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
OOM = {
    "phase": "Running",
    "conditions": [{"type": "Ready", "status": "False"}],
    "containerStatuses": [{"name": "app", "state": {"terminated": {"reason": "OOMKilled"}}}],
}


def make_workload(
    api: KubeEmulator,
    ns: str,
    name: str,
    pods: int,
    status: Obj | None,
    adopted: bool = True,
    kind: str = "Deployment",
    node: Callable[[int], str] | None = None,
) -> list[Obj]:
    """A Deployment and its ReplicaSet (or a StatefulSet owning its pods) and ``pods`` pods
    carrying REC (on their resources when ``adopted``), pod ``p`` on ``node(p)`` when given;
    returns the pods."""
    owner = api.store.create(
        {
            "apiVersion": "apps/v1",
            "kind": kind,
            "metadata": {"name": name, "namespace": ns},
            "spec": {
                "replicas": pods,
                "selector": {"matchLabels": {"app": name}},
                "template": {"spec": {"containers": [{"name": "app"}]}},
            },
        }
    )
    parent = owner
    if kind == "Deployment":
        parent = api.store.create(
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "metadata": {
                    "name": f"{name}-rs",
                    "namespace": ns,
                    "ownerReferences": [
                        {
                            "kind": "Deployment",
                            "name": name,
                            "uid": owner["metadata"]["uid"],
                            "controller": True,
                        }
                    ],
                },
            }
        )
    ref = {
        "kind": parent["kind"],
        "name": parent["metadata"]["name"],
        "uid": parent["metadata"]["uid"],
        "controller": True,
    }
    memory = "512Mi" if adopted else "1Gi"
    return [
        api.store.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"{name}-{p}",
                    "namespace": ns,
                    "labels": {"app": name},
                    "annotations": {KEY: json.dumps(REC.requests)},
                    "ownerReferences": [ref],
                },
                "spec": {
                    **({"nodeName": node(p)} if node else {}),
                    "containers": [{"name": "app", "resources": {"requests": {"memory": memory}}}],
                },
                "status": status or READY,
            }
        )
        for p in range(pods)
    ]


def policy_doc(name: str, window: str, namespace: str | None = None, max_attempts: int = 1) -> Obj:
    meta: Obj = {"name": name} | ({"namespace": namespace} if namespace else {})
    return {
        "apiVersion": "rightsizing.kubex.ai/v1alpha1",
        "kind": "RollbackPolicy" if namespace else "ClusterRollbackPolicy",
        "metadata": meta,
        "spec": {
            "monitoringPeriod": window,
            "rollbackTarget": "manifest",
            "adoptionThresholdPercent": 100,
            "backoff": {"timePeriod": "1s", "multiplyByTurn": 1, "maxAttempts": max_attempts},
        },
    }


def proc_stats(pid: int) -> tuple[float, float]:
    """(peak RSS MiB, CPU seconds) of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return memory_mib(pid, "VmHWM"), (int(fields[11]) + int(fields[12])) / ticks


def oom(workload: int) -> bool:
    """One P3 workload in ten has OOMKilled pods: it rolls back and fails permanently."""
    return workload % 10 == 9
