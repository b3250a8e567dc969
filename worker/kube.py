"""Kubernetes API clients for the worker and the intake: kubeconfig, in-cluster, or a URL.

Resolution order: ``--kube-url`` (the simulated cluster, plain HTTP), ``--kubeconfig`` (or
``$KUBECONFIG``), the in-cluster service account, then ``~/.kube/config``.

Every client built here:
- gives each call a timeout (connect, read) unless the call sets its own, so a hung API server
  fails the call instead of the activity's whole start-to-close budget;
- retries inside the call, up to 3 times with a short backoff, what is safe to repeat blindly:
  429 on any verb (the server did not process it; its Retry-After is honoured, as client-go
  does) and 5xx on reads. A write that failed otherwise, and any timed-out call, surfaces to the
  caller, which knows whether repeating it is safe (the activities' write retries, then
  Temporal's; the informer's handler retries);
- counts each call by method and status code (``rollback_kube_requests``).
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import Any

from kubernetes import config as _kube_config
from kubernetes.client import ApiClient, Configuration, CoreV1Api, CustomObjectsApi
from temporalio.common import MetricMeter
from urllib3.util.retry import Retry

from activities.health import Prometheus
from activities.kubernetes import KubernetesActivities
from activities.notify import NotificationConfig
from activities.writes import GATED_WRITE
from worker.flags import DEFAULT_READ_TIMEOUT
from workflows.contract import DEFAULT_ENGINE_NAMESPACE, Actuation
from workflows.selection import PROTECTED, Protection

kube_config: Any = _kube_config  # the config loaders are untyped

CONNECT_TIMEOUT = 5.0


class UnprocessedRetry(Retry):
    """urllib3's Retry, also for 429 on writes: a throttled request was never processed. Not
    for a gated write (``activities.writes.GATED_WRITE``): resent a Retry-After later, it would
    land past the gate it read before (a kill switch set meanwhile); its writer tries again."""

    def is_retry(self, method: str, status_code: int, has_retry_after: bool = False) -> bool:
        if status_code == 429 and self.total:
            return method in (self.allowed_methods or ()) or not GATED_WRITE.get()
        return super().is_retry(method, status_code, has_retry_after)


RETRIES = UnprocessedRetry(
    total=4,
    connect=2,
    read=False,  # a timed-out call raises ReadTimeoutError at once: the caller decides
    status=3,
    status_forcelist=(429, 500, 502, 503, 504),
    allowed_methods=frozenset({"GET", "HEAD"}),
    backoff_factor=0.1,
    backoff_max=2.0,
    respect_retry_after_header=True,
    raise_on_status=False,  # the last answer becomes an ApiException, as without retries
)


class KubeApiClient(ApiClient):
    """The official ``ApiClient`` with a default timeout per call and a count of each call."""

    def __init__(
        self, configuration: Configuration, metric_meter: MetricMeter, read_timeout: float
    ) -> None:
        super().__init__(configuration)
        self.timeout = (CONNECT_TIMEOUT, read_timeout)
        self._requests = metric_meter.create_counter(
            "rollback_kube_requests", "Kubernetes API requests by method and status code"
        )

    def call_api(
        self,
        method: Any,
        url: Any,
        header_params: Any = None,
        body: Any = None,
        post_params: Any = None,
        _request_timeout: Any = None,
    ) -> Any:
        try:
            response = super().call_api(
                method, url, header_params, body, post_params, _request_timeout or self.timeout
            )
        except Exception as exc:
            self._requests.add(
                1, {"method": str(method), "code": str(getattr(exc, "status", "error"))}
            )
            raise
        self._requests.add(1, {"method": str(method), "code": str(getattr(response, "status", 0))})
        return response


CONNECTION_POOL_SIZE = 32


def api_client(
    kubeconfig: str | None = None,
    url: str | None = None,
    metric_meter: MetricMeter | None = None,
    read_timeout: float = DEFAULT_READ_TIMEOUT,
    user_agent: str | None = None,
    context: str | None = None,
) -> ApiClient:
    """A client; ``user_agent`` names the component to the API server (its audit log, and the
    emulator's journal: ``rightsizing-rollback-intake/<identity>``)."""
    configuration = Configuration()
    path = kubeconfig or os.environ.get("KUBECONFIG")
    default = Path.home() / ".kube" / "config"
    if url:
        configuration.host = url
    elif path:
        kube_config.load_kube_config(
            config_file=path, context=context, client_configuration=configuration
        )
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        kube_config.load_incluster_config(client_configuration=configuration)
    elif default.exists():
        kube_config.load_kube_config(
            config_file=str(default), context=context, client_configuration=configuration
        )
    else:
        raise RuntimeError(
            "no Kubernetes configuration: pass --kubeconfig, set KUBECONFIG, or run in a cluster"
        )
    configuration.retries = RETRIES
    # The intake holds a watch open per informer (14) and the worker runs many activities at
    # once: more connections than the client's default (5 per core) are kept for reuse.
    configuration.connection_pool_maxsize = CONNECTION_POOL_SIZE
    client = KubeApiClient(configuration, metric_meter or MetricMeter.noop, read_timeout)
    if user_agent:
        client.user_agent = user_agent
    return client


def activities_for(
    client: ApiClient,
    actuation: Actuation,
    notifications: NotificationConfig | None = None,
    protection: Protection = PROTECTED,
    min_ready: timedelta = timedelta(0),
    prometheus_url: str | None = None,
    engine_namespace: str = DEFAULT_ENGINE_NAMESPACE,
) -> KubernetesActivities:
    return KubernetesActivities(
        CoreV1Api(client),
        CustomObjectsApi(client),
        actuation,
        notifications=notifications,
        protection=protection,
        min_ready=min_ready,
        prometheus=Prometheus(prometheus_url) if prometheus_url else None,
        engine_namespace=engine_namespace,
    )
