"""Kubernetes API clients for the worker and the intake: kubeconfig, in-cluster, or a URL.

Resolution order: ``--kube-url`` (the simulated cluster, plain HTTP), ``--kubeconfig`` (or
``$KUBECONFIG``), the in-cluster service account, then ``~/.kube/config``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from kubernetes import config as _kube_config
from kubernetes.client import ApiClient, Configuration, CoreV1Api, CustomObjectsApi
from temporalio.common import MetricMeter

from activities.kubernetes import Actuation, KubernetesActivities
from worker.telemetry import InstrumentedApiClient

kube_config: Any = _kube_config  # the config loaders are untyped


def api_client(
    kubeconfig: str | None = None, url: str | None = None, metric_meter: MetricMeter | None = None
) -> ApiClient:
    configuration = Configuration()
    path = kubeconfig or os.environ.get("KUBECONFIG")
    default = Path.home() / ".kube" / "config"
    if url:
        configuration.host = url
    elif path:
        kube_config.load_kube_config(config_file=path, client_configuration=configuration)
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        kube_config.load_incluster_config(client_configuration=configuration)
    elif default.exists():
        kube_config.load_kube_config(config_file=str(default), client_configuration=configuration)
    else:
        raise RuntimeError(
            "no Kubernetes configuration: pass --kubeconfig, set KUBECONFIG, or run in a cluster"
        )
    return InstrumentedApiClient(configuration, metric_meter or MetricMeter.noop)


def activities_for(client: ApiClient, actuation: Actuation) -> KubernetesActivities:
    return KubernetesActivities(CoreV1Api(client), CustomObjectsApi(client), actuation)
