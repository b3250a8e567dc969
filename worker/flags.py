"""The flags of the engine's processes and of ``rollbackctl``: defined here, with the defaults
their help shows, so that a parser is built (and ``--help`` answers) without importing the
Temporal SDK, the Kubernetes client or the models. ``worker.config`` turns the parsed flags
into each process's configuration."""

from __future__ import annotations

import argparse

from workflows.contract import (
    DEFAULT_MIN_READY,
    DEFAULT_PROTECTED_NAMESPACES,
    TASK_QUEUE,
    Actuation,
)

DEFAULT_ADDRESS = "localhost:7233"
DEFAULT_READ_TIMEOUT = 10.0  # seconds to wait for an API server answer
DEFAULT_DEPLOYMENT_NAME = "rightsizing-rollback"
# Seconds ``rollbackctl versions set-current`` and ``ramp`` wait by default for a routing change
# to reach the version's task queues (``--wait``): the server applies it asynchronously, task
# queue by task queue and partition by partition, which takes longer on a busy server.
ROUTING_WAIT = 120.0
MAX_CACHED_WORKFLOWS = 1_000


class ConfigError(ValueError):
    """A setting that cannot be used; the message names the flag and the value."""


CLUSTER_HELP = (
    "this cluster's name, a DNS label such as eu-west-1 (ROLLBACK_CLUSTER): in every workflow"
    " ID, search attribute, metric, log line and notification; the default task queue is"
    f" {TASK_QUEUE}-<cluster> (docs/operating/fleet.md)"
)


def add_temporal_flags(parser: argparse.ArgumentParser, cluster_help: str = CLUSTER_HELP) -> None:
    parser.add_argument("--cluster", help=cluster_help)
    group = parser.add_argument_group(
        "Temporal connection (flags override TEMPORAL_* variables and the envconfig profile)"
    )
    group.add_argument("--address", help=f"host:port (TEMPORAL_ADDRESS, default {DEFAULT_ADDRESS})")
    # -n/--namespace is the Kubernetes namespace wherever a command takes one, as in kubectl.
    group.add_argument(
        "--temporal-namespace", dest="namespace", help="Temporal namespace (TEMPORAL_NAMESPACE)"
    )
    group.add_argument(
        "--profile", help="envconfig profile (TEMPORAL_PROFILE; file: TEMPORAL_CONFIG_FILE)"
    )
    group.add_argument(
        "--task-queue",
        help=f"task queue (ROLLBACK_TASK_QUEUE, default {TASK_QUEUE}-<cluster>)",
    )
    group.add_argument(
        "--api-key-file",
        help="file holding the API key, e.g. a mounted Secret (TEMPORAL_API_KEY_FILE; preferred)",
    )
    group.add_argument(
        "--api-key", help="API key, e.g. Temporal Cloud (TEMPORAL_API_KEY; visible in ps)"
    )
    group.add_argument("--tls", action="store_true", help="use TLS without a client cert")
    group.add_argument(
        "--tls-cert", help="client certificate for mTLS (TEMPORAL_TLS_CLIENT_CERT_PATH)"
    )
    group.add_argument("--tls-key", help="client key for mTLS (TEMPORAL_TLS_CLIENT_KEY_PATH)")
    group.add_argument("--tls-ca", help="server CA certificate (TEMPORAL_TLS_SERVER_CA_CERT_PATH)")


PROTECTED_HELP = (
    "comma-separated namespaces or patterns (* any run of characters) where no policy applies,"
    " as Kubex's protectedNamespacePatterns; empty: none (ROLLBACK_PROTECTED_NAMESPACES,"
    f" default {','.join(DEFAULT_PROTECTED_NAMESPACES)})"
)


def add_kube_flags(parser: argparse.ArgumentParser, serving: bool = True) -> None:
    """The API server flags; ``serving``: the metrics and health endpoints too (processes)."""
    group = parser.add_argument_group("Kubernetes")
    group.add_argument(
        "--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, in-cluster, ~/.kube/config)"
    )
    group.add_argument("--context", help="the kubeconfig context to use (default: its current)")
    group.add_argument("--kube-url", help="plain-HTTP API server URL (the simulated cluster)")
    group.add_argument(
        "--kube-timeout",
        help="seconds to wait for an API server answer before the call fails"
        f" (ROLLBACK_KUBE_TIMEOUT, default {DEFAULT_READ_TIMEOUT})",
    )
    if not serving:
        parser.set_defaults(metrics_address=None, health_address=None, protected_namespaces=None)
        return
    group.add_argument("--protected-namespaces", metavar="PATTERNS", help=PROTECTED_HELP)
    parser.add_argument(
        "--metrics-address",
        help="serve Prometheus /metrics on host:port, e.g. 0.0.0.0:9464 (ROLLBACK_METRICS_ADDRESS)",
    )
    parser.add_argument(
        "--health-address",
        help="serve /livez and /readyz on host:port, e.g. 0.0.0.0:8080 (ROLLBACK_HEALTH_ADDRESS)",
    )


def add_worker_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("worker")
    group.add_argument(
        "--actuation",
        choices=[a.value for a in Actuation],
        help="annotations: publish rollback recommendations for an applier;"
        " in-place: also resize pods (ROLLBACK_ACTUATION, default annotations)",
    )
    group.add_argument(
        "--worker-versioning",
        choices=["on", "off"],
        help="join a Temporal Worker Deployment; workflows pinned to the version they started on"
        " (ROLLBACK_WORKER_VERSIONING, default off)",
    )
    group.add_argument(
        "--deployment-name",
        help=f"Worker Deployment (ROLLBACK_DEPLOYMENT_NAME, default {DEFAULT_DEPLOYMENT_NAME})",
    )
    group.add_argument(
        "--build-id",
        help="this worker's build ID (ROLLBACK_BUILD_ID, default the package version)",
    )
    group.add_argument(
        "--max-cached-workflows",
        help="workflows kept in memory between tasks (about 110 KiB each; a waiting window needs"
        f" none) (ROLLBACK_MAX_CACHED_WORKFLOWS, default {MAX_CACHED_WORKFLOWS})",
    )
    group.add_argument(
        "--min-ready-duration",
        metavar="DURATION",
        help="how long a pod must have been Ready to count at the verdict, e.g. 30s; 0s: Ready"
        " is enough (ROLLBACK_MIN_READY_DURATION, default"
        f" {DEFAULT_MIN_READY.seconds}s, as Kubex's minReadyDuration)",
    )
    add_prometheus_flag(group)
    group.add_argument(
        "--notifications",
        metavar="FILE",
        help="notification receivers, YAML (ROLLBACK_NOTIFICATIONS; default none; the docs'"
        " operating/notifications-and-alerts.md)",
    )


def add_prometheus_flag(group: argparse._ActionsContainer) -> None:
    """``--prometheus-url``: the worker asks it; the intake says in each policy's status
    whether there is one (``rollbackctl intake`` takes it alone, ``run`` once for both)."""
    group.add_argument(
        "--prometheus-url",
        metavar="URL",
        help="the Prometheus the policies' health checks ask, e.g. http://prometheus:9090"
        " (ROLLBACK_PROMETHEUS_URL; default none: a policy's health checks are not run, its"
        " verdicts decided on adoption alone, or failed under onPrometheusError: fail)",
    )


def add_intake_flags(parser: argparse.ArgumentParser, prometheus: bool = False) -> None:
    group = parser.add_argument_group("intake")
    if prometheus:
        add_prometheus_flag(group)
    group.add_argument(
        "--temporal-budget",
        metavar="ACTIONS_PER_SECOND",
        help="the billable Temporal actions a second this cluster's intake may spend starting"
        " and signalling attempts, paced (ROLLBACK_TEMPORAL_BUDGET; default none: no pacing)",
    )
    group.add_argument(
        "--storm-breaker",
        metavar="SHARE%/WINDOW[/MIN]",
        help="stop re-applies cluster-wide when more than SHARE percent of at least MIN"
        " (default 10) verdicts within WINDOW rolled back, e.g. 50%%/10m, until an operator"
        " resets it (ROLLBACK_STORM_BREAKER; default none)",
    )
    group.add_argument(
        "--lease-namespace", help="namespace of the leader-election Lease (POD_NAMESPACE)"
    )
    group.add_argument(
        "--identity", help="leader-election identity (default: POD_NAME or host-pid)"
    )
