"""Kubernetes objects as the API serves them, for activity tests against the emulator."""

from __future__ import annotations

import copy
import json
import threading
import time
from typing import Any

from activities.cohort import is_ready
from workflows.contract import Obj
from workflows.fingerprint import Recommendation
from workflows.quantities import parse_quantity

NS = "shop"
REC_KEY = "static.rightsizing.kubex.ai/desired-resource-requests"


def template(labels: dict[str, str], memory: str = "1Gi") -> Obj:
    return {
        "metadata": {"labels": labels},
        "spec": {
            "containers": [
                {
                    "name": "app",
                    "image": "app:1",
                    "resources": {
                        "requests": {"memory": memory, "cpu": "500m"},
                        "limits": {"memory": memory},
                    },
                }
            ]
        },
    }


def owner(
    kind: str, name: str = "web", replicas: int = 3, labels: dict[str, str] | None = None
) -> Obj:
    """A workload of ``kind`` selecting pods labelled ``app=<name>``."""
    selector = {"matchLabels": {"app": name}}
    meta = {"name": name, "namespace": NS, "labels": labels or {"team": "shop"}}
    api = {
        "Deployment": "apps/v1",
        "StatefulSet": "apps/v1",
        "DaemonSet": "apps/v1",
        "Job": "batch/v1",
        "CronJob": "batch/v1",
        "Rollout": "argoproj.io/v1alpha1",
        "AnalysisRun": "argoproj.io/v1alpha1",
        "Model": "kubeai.org/v1",
        "StrimziPodSet": "core.strimzi.io/v1beta2",
    }[kind]
    obj: Obj = {"apiVersion": api, "kind": kind, "metadata": meta}
    tpl = template({"app": name})
    match kind:
        case "Deployment" | "StatefulSet" | "Rollout":
            obj["spec"] = {"replicas": replicas, "selector": selector, "template": tpl}
        case "DaemonSet":
            obj["spec"] = {"selector": selector, "template": tpl}
            obj["status"] = {"desiredNumberScheduled": replicas}
        case "Job":
            obj["spec"] = {"parallelism": replicas, "selector": selector, "template": tpl}
        case "CronJob":
            obj["spec"] = {
                "schedule": "* * * * *",
                "jobTemplate": {"spec": {"parallelism": replicas, "template": tpl}},
            }
        case "AnalysisRun":
            obj["spec"] = {
                "metrics": [{"name": "test", "provider": {"job": {"spec": {"template": tpl}}}}]
            }
        case "Model":
            obj["spec"] = {"replicas": replicas, "url": "hf://x", "features": ["TextGeneration"]}
        case "StrimziPodSet":
            obj["spec"] = {
                "selector": selector,
                "pods": [{"metadata": {"name": f"{name}-{i}"}, **tpl} for i in range(replicas)],
            }
    return obj


def controlled_by(obj: Obj) -> Obj:
    """The controller ``ownerReference`` that points at ``obj`` (as stored: with its uid)."""
    meta = obj["metadata"]
    return {"kind": obj["kind"], "name": meta["name"], "uid": meta["uid"], "controller": True}


def pod(
    name: str,
    labels: dict[str, str],
    memory: str = "1Gi",
    rec: Recommendation | None = None,
    reported: str | None = None,
    ready: bool = True,
    phase: str = "Running",
    node: str = "node-1",
    owner_ref: Obj | None = None,
    container_state: Obj | None = None,
    last_state: Obj | None = None,
    conditions: list[Obj] | None = None,
    annotations: dict[str, str] | None = None,
) -> Obj:
    anns = dict(annotations or {})
    if rec is not None:
        anns[rec.requests_key or REC_KEY] = json.dumps(rec.requests)
    status: Obj = {
        "phase": phase,
        "conditions": conditions
        if conditions is not None
        else [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Ready", "status": "True" if ready else "False"},
        ],
        "containerStatuses": [
            {
                "name": "app",
                "ready": ready,
                "restartCount": 0,
                "state": container_state or {"running": {"startedAt": "2026-01-01T00:00:00Z"}},
                "lastState": last_state or {},
                **(
                    {
                        "resources": {
                            "requests": {"memory": reported, "cpu": "500m"},
                            "limits": {"memory": reported},
                        }
                    }
                    if reported
                    else {}
                ),
            }
        ],
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": labels,
            "annotations": anns,
            "ownerReferences": [owner_ref] if owner_ref else [],
        },
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "app",
                    "image": "app:1",
                    "resources": {
                        "requests": {"memory": memory, "cpu": "500m"},
                        "limits": {"memory": memory},
                    },
                }
            ],
        },
        "status": status,
    }


def node(name: str = "node-1", cpu: str = "4", memory: str = "8Gi") -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name},
        "status": {"allocatable": {"cpu": cpu, "memory": memory, "pods": "110"}},
    }


def policy(kind: str = "RollbackPolicy", name: str = "p", **spec: Any) -> Obj:
    body: Obj = {
        "apiVersion": "rightsizing.kubex.ai/v1alpha1",
        "kind": kind,
        "metadata": {"name": name, **({"namespace": NS} if kind == "RollbackPolicy" else {})},
        "spec": {
            "monitoringPeriod": "2s",
            "rollbackTarget": "lastSuccessful",
            "adoptionThresholdPercent": 80,
            "backoff": {"timePeriod": "1s", "multiplyByTurn": 1, "maxAttempts": 2},
        },
    }
    body["spec"].update(spec)
    return body


class RestartingKubelet:
    """What a kubelet does when a resize restarts a container (``RestartContainer``): the pod
    goes not Ready, its container restarts (its count goes up) with the new resources, and it is
    Ready again ``restart`` seconds later; unless its memory request is below ``oom_below``:
    then it is OOMKilled and stays down (restarted again). Records the most pods not Ready at
    once."""

    def __init__(self, store: Any, restart: float = 0.2, oom_below: str | None = None) -> None:
        self.store, self.restart = store, restart
        self.oom_below = parse_quantity(oom_below) if oom_below else None
        self.most_not_ready = 0
        self._lock = threading.Lock()
        self._specs: dict[str, Obj] = {  # pod -> its container's resources, as last seen
            p["metadata"]["name"]: copy.deepcopy(p["spec"]["containers"][0]["resources"])
            for p in store.items("Pod", NS)
        }
        store.listeners.append(self._seen)

    def _seen(self, kind: str, rtype: Any, obj: Obj) -> None:
        if rtype.kind != "Pod" or kind == "DELETED":
            return
        pods = list(self.store.items("Pod", obj["metadata"].get("namespace")))
        down = sum(1 for p in pods if not is_ready(p))
        name = obj["metadata"]["name"]
        spec = copy.deepcopy(obj["spec"]["containers"][0]["resources"])
        with self._lock:
            self.most_not_ready = max(self.most_not_ready, down)
            before = self._specs.get(name)
            self._specs[name] = spec
        if kind == "MODIFIED" and before is not None and before != spec:  # a resize
            threading.Thread(target=self._restart, args=(name,)).start()

    def _restart(self, name: str) -> None:
        rtype = self.store.rtype("Pod")
        pod = self.store.get(rtype, NS, name)
        status = pod["status"]
        cs = status["containerStatuses"][0]
        cs |= {"resources": pod["spec"]["containers"][0]["resources"], "ready": False}
        cs["restartCount"] = cs.get("restartCount", 0) + 1
        status["conditions"] = [{"type": "Ready", "status": "False"}]
        self.store.patch(rtype, NS, name, {"status": status}, MERGE, "status")
        time.sleep(self.restart)
        memory = parse_quantity(cs["resources"]["requests"]["memory"])
        if self.oom_below is not None and memory < self.oom_below:
            cs["restartCount"] += 1
            cs["lastState"] = {"terminated": {"reason": "OOMKilled", "exitCode": 137}}
            self.store.patch(rtype, NS, name, {"status": status}, MERGE, "status")
            return
        cs["ready"] = True
        status["conditions"] = [{"type": "Ready", "status": "True"}]
        self.store.patch(rtype, NS, name, {"status": status}, MERGE, "status")


MERGE = "application/merge-patch+json"
