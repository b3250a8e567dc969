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

from activities.kubernetes import Actuation, KubernetesActivities

kube_config: Any = _kube_config  # the config loaders are untyped


def api_client(kubeconfig: str | None = None, url: str | None = None) -> ApiClient:
    if url:
        configuration = Configuration()
        configuration.host = url
        return ApiClient(configuration)
    path = kubeconfig or os.environ.get("KUBECONFIG")
    if path:
        client: ApiClient = kube_config.new_client_from_config(config_file=path)
        return client
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        configuration = Configuration()
        kube_config.load_incluster_config(client_configuration=configuration)
        return ApiClient(configuration)
    default = Path.home() / ".kube" / "config"
    if default.exists():
        client = kube_config.new_client_from_config(config_file=str(default))
        return client
    raise RuntimeError(
        "no Kubernetes configuration: pass --kubeconfig, set KUBECONFIG, or run in a cluster"
    )


def activities_for(client: ApiClient, actuation: Actuation) -> KubernetesActivities:
    return KubernetesActivities(CoreV1Api(client), CustomObjectsApi(client), actuation)
