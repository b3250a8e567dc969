"""One typed configuration per process, bound to flags and environment and validated here.

``rollbackctl worker``, ``rollbackctl intake`` and ``rollbackctl run`` (and ``python -m worker``)
build their settings with ``WorkerConfig.from_args`` / ``IntakeConfig.from_args`` and hand the
result to ``worker.process``; nothing else reads ``os.environ`` for these settings. A flag
overrides its environment variable, which overrides the default. A bad value raises
``ConfigError`` with one line that names the flag.

The Temporal connection is ``temporalio.envconfig``'s: the same ``TEMPORAL_*`` variables and
TOML profiles as the ``temporal`` CLI (``TEMPORAL_PROFILE``, ``TEMPORAL_CONFIG_FILE``), with our
flags on top.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib.metadata
import logging
import math
import os
import re
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml
from kubernetes.client import ApiClient
from pydantic import ValidationError
from temporalio.client import Client
from temporalio.common import WorkerDeploymentVersion
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.envconfig import ClientConfigProfile, ClientConfigTLS
from temporalio.runtime import Runtime
from temporalio.service import RetryConfig

from activities.errors import redact_url
from activities.notify import NotificationConfig
from worker import telemetry
from worker.flags import (
    DEFAULT_ADDRESS,
    DEFAULT_DEPLOYMENT_NAME,
    DEFAULT_READ_TIMEOUT,
    MAX_CACHED_WORKFLOWS,
    ConfigError,
)
from worker.kube import api_client
from workflows.breaker import StormBreaker
from workflows.contract import (
    DEFAULT_ENGINE_NAMESPACE,
    DEFAULT_MIN_READY,
    TASK_QUEUE,
    Actuation,
    check_cluster,
    task_queue_for,
)
from workflows.durations import parse_duration_or_zero
from workflows.policy import field_errors
from workflows.selection import PROTECTED, Protection

log = logging.getLogger(__name__)

CONNECT_PATIENCE_SECONDS = 300.0


def _env(env: Mapping[str, str], name: str) -> str | None:
    return env.get(name) or None


# --- Temporal -------------------------------------------------------------------------------


def cluster_from(args: argparse.Namespace, env: Mapping[str, str], required: bool) -> str | None:
    """``--cluster`` / ``ROLLBACK_CLUSTER``, checked as a DNS label; required by the worker and
    the intake (a fleet's clusters share one Temporal: a process must know which it is)."""
    raw = getattr(args, "cluster", None) or _env(env, "ROLLBACK_CLUSTER")
    if raw is None:
        if required:
            raise ConfigError(
                "--cluster is required (or ROLLBACK_CLUSTER): the name of the cluster this"
                " process serves, a DNS label such as eu-west-1 (docs/operating/fleet.md)"
            )
        return None
    try:
        return check_cluster(raw)
    except ValueError as exc:
        raise ConfigError(f"--cluster: {exc}") from None


@dataclass(frozen=True)
class TemporalConfig:
    """Where Temporal is and how to reach it (an envconfig profile), and our place in it: the
    cluster this process serves (None: ``rollbackctl`` looking at the whole fleet) and its task
    queue."""

    profile: ClientConfigProfile = field(default_factory=ClientConfigProfile)
    task_queue: str = TASK_QUEUE
    cluster: str | None = None

    @classmethod
    def at(
        cls, address: str, task_queue: str | None = None, cluster: str | None = None
    ) -> TemporalConfig:
        """A plain, unauthenticated server (the embedded dev server, tests)."""
        queue = task_queue or (task_queue_for(cluster) if cluster else TASK_QUEUE)
        return cls(ClientConfigProfile(address=address), queue, cluster)

    @classmethod
    def from_args(
        cls,
        args: argparse.Namespace,
        env: Mapping[str, str] = os.environ,
        cluster_required: bool = False,
    ) -> TemporalConfig:
        try:
            profile = ClientConfigProfile.load(
                profile=getattr(args, "profile", None), override_env_vars=dict(env)
            )
        except Exception as exc:  # the SDK's loader reports TOML and file errors alike
            raise ConfigError(f"Temporal configuration: {exc}") from exc
        if bool(args.tls_cert) != bool(args.tls_key):
            raise ConfigError("--tls-cert and --tls-key must be given together")
        tls = profile.tls
        if args.tls_cert or args.tls_ca or args.tls:
            base = tls or ClientConfigTLS()
            tls = dataclasses.replace(
                base,
                client_cert=Path(args.tls_cert) if args.tls_cert else base.client_cert,
                client_private_key=Path(args.tls_key) if args.tls_key else base.client_private_key,
                server_root_ca_cert=Path(args.tls_ca) if args.tls_ca else base.server_root_ca_cert,
            )
        profile = dataclasses.replace(
            profile,
            address=args.address or profile.address,
            namespace=args.namespace or profile.namespace,
            api_key=_api_key(args, env) or profile.api_key,
            tls=tls,
        )
        for path in _tls_files(tls):
            if not path.is_file():
                raise ConfigError(f"TLS file {path} does not exist")
        cluster = cluster_from(args, env, cluster_required)
        default_queue = task_queue_for(cluster) if cluster else TASK_QUEUE
        task_queue = args.task_queue or _env(env, "ROLLBACK_TASK_QUEUE") or default_queue
        return cls(profile, task_queue, cluster)

    @property
    def address(self) -> str:
        return self.profile.address or DEFAULT_ADDRESS

    async def connect(
        self, runtime: Runtime | None = None, identity: str | None = None, retries: bool = True
    ) -> Client:
        """A client; ``identity`` is recorded with each signal it sends (the intake's is its
        leader-election identity, so a workflow's history says which intake woke it). Without
        ``retries``, a call that fails is not tried again by the SDK (the intake's: its own
        retries are fenced, and a signal must not land after its leader's term)."""
        options = self.profile.to_client_connect_config()
        options["target_host"] = self.address
        named: dict[str, Any] = {"identity": identity} if identity else {}
        if not retries:  # (max_retries=0 would mean no bound on them, but the elapsed time)
            named["retry_config"] = RetryConfig(max_retries=1, max_elapsed_time_millis=0)
        return await Client.connect(
            **options, **named, data_converter=pydantic_data_converter, runtime=runtime
        )

    async def connect_patiently(
        self,
        runtime: Runtime | None = None,
        within: float = CONNECT_PATIENCE_SECONDS,
        identity: str | None = None,
        retries: bool = True,
    ) -> Client:
        """``connect``, retried with backoff for ``within`` seconds: a worker or intake that
        starts while the Temporal frontend restarts waits for it instead of crash-looping."""
        deadline, delay = time.monotonic() + within, 0.5
        while True:
            try:
                return await self.connect(runtime, identity, retries)
            except RuntimeError as exc:  # the SDK's "Failed client connect: ..."
                if time.monotonic() + delay > deadline:
                    raise
                log.warning("Temporal at %s: %s; retrying in %.1fs", self.address, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)


def _api_key(args: argparse.Namespace, env: Mapping[str, str]) -> str | None:
    """``--api-key-file`` / ``TEMPORAL_API_KEY_FILE`` (a mounted Secret: nothing in the
    environment or the process list), else ``--api-key`` (``TEMPORAL_API_KEY`` is read by
    envconfig)."""
    path = getattr(args, "api_key_file", None) or _env(env, "TEMPORAL_API_KEY_FILE")
    if path is None:
        return getattr(args, "api_key", None)
    if getattr(args, "api_key", None):
        raise ConfigError("give --api-key or --api-key-file, not both")
    try:
        key = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--api-key-file {path}: {exc.__class__.__name__}") from None
    if not key:
        raise ConfigError(f"--api-key-file {path} is empty")
    return key


def _tls_files(tls: ClientConfigTLS | None) -> list[Path]:
    if tls is None:
        return []
    sources = (tls.client_cert, tls.client_private_key, tls.server_root_ca_cert)
    return [s for s in sources if isinstance(s, Path)]


# --- Kubernetes and telemetry ---------------------------------------------------------------


@dataclass(frozen=True)
class KubeConfig:
    """How to reach the API server (``worker.kube`` says in which order), where the process
    serves its metrics and health endpoints, and the namespaces it keeps out of (protected: no
    policy applies there)."""

    kubeconfig: str | None = None
    url: str | None = None
    timeout: float = DEFAULT_READ_TIMEOUT
    context: str | None = None  # the kubeconfig's context (default: its current-context)
    metrics_address: str | None = None
    health_address: str | None = None  # /livez and /readyz (worker.health)
    protection: Protection = PROTECTED
    # The engine's own namespace (its pods', POD_NAMESPACE): where its kill switch is read.
    engine_namespace: str = DEFAULT_ENGINE_NAMESPACE

    @classmethod
    def from_args(cls, args: argparse.Namespace, env: Mapping[str, str] = os.environ) -> KubeConfig:
        raw = args.kube_timeout or _env(env, "ROLLBACK_KUBE_TIMEOUT")
        try:
            timeout = float(raw) if raw is not None else DEFAULT_READ_TIMEOUT
        except ValueError:
            raise ConfigError(f"--kube-timeout: {raw!r} is not a number of seconds") from None
        if timeout <= 0:
            raise ConfigError(f"--kube-timeout must be positive, got {timeout}")
        return cls(
            kubeconfig=args.kubeconfig or _env(env, "KUBECONFIG"),
            url=args.kube_url,
            timeout=timeout,
            context=getattr(args, "context", None),
            metrics_address=args.metrics_address or _env(env, "ROLLBACK_METRICS_ADDRESS"),
            health_address=args.health_address or _env(env, "ROLLBACK_HEALTH_ADDRESS"),
            protection=protection_from(args, env),
            engine_namespace=_env(env, "POD_NAMESPACE") or DEFAULT_ENGINE_NAMESPACE,
        )

    @property
    def simulated(self) -> bool:
        """No cluster named anywhere: ``rollbackctl run`` starts the simulated one."""
        return not (self.kubeconfig or self.url)

    def runtime(self, cluster: str | None = None) -> Runtime | None:
        return telemetry.runtime(self.metrics_address, cluster)

    def client(self, runtime: Runtime | None = None, user_agent: str | None = None) -> ApiClient:
        try:
            return api_client(
                self.kubeconfig,
                self.url,
                telemetry.meter(runtime),
                self.timeout,
                user_agent,
                self.context,
            )
        except Exception as exc:  # kubeconfig loaders raise several kinds
            raise ConfigError(f"Kubernetes configuration: {exc}") from exc


def protection_from(args: argparse.Namespace, env: Mapping[str, str]) -> Protection:
    """``--protected-namespaces`` / ``ROLLBACK_PROTECTED_NAMESPACES`` (set but empty: none)."""
    raw = getattr(args, "protected_namespaces", None)
    if raw is None:
        raw = env.get("ROLLBACK_PROTECTED_NAMESPACES")
    if raw is None:
        return PROTECTED
    try:
        return Protection.parse(raw)
    except ValueError as exc:
        raise ConfigError(f"--protected-namespaces: {exc}") from None


# --- the processes --------------------------------------------------------------------------


def package_version() -> str:
    """The installed package's version: the default build ID of a versioned worker."""
    try:
        return importlib.metadata.version("rightsizing-rollback")
    except importlib.metadata.PackageNotFoundError:
        return "dev"


class _OneCluster:
    """A process's configuration: it serves one cluster, named (``--cluster``)."""

    temporal: TemporalConfig

    def __post_init__(self) -> None:
        if self.temporal.cluster is None:
            raise ConfigError("a worker or intake serves one cluster: name it (--cluster)")

    @property
    def cluster(self) -> str:
        assert self.temporal.cluster is not None  # __post_init__
        return self.temporal.cluster


@dataclass(frozen=True)
class WorkerConfig(_OneCluster):
    temporal: TemporalConfig
    kube: KubeConfig
    actuation: Actuation = Actuation.ANNOTATIONS
    max_cached_workflows: int = MAX_CACHED_WORKFLOWS
    # Worker Versioning (docs/operating/upgrade.md, "Worker versioning"): None runs unversioned.
    deployment: WorkerDeploymentVersion | None = None
    notifications: NotificationConfig = field(default_factory=NotificationConfig)
    # The worker's own Pod (POD_NAMESPACE, POD_NAME from the downward API): where it tells of a
    # run it refused (``activities.clusters``); None outside a cluster.
    pod: tuple[str, str] | None = None
    # How long a pod must have been Ready to count at the verdict (Kubex's minReadyDuration).
    min_ready: timedelta = DEFAULT_MIN_READY
    # The Prometheus HTTP API the policies' health checks ask (None: none; such a check then
    # meets its policy's onPrometheusError).
    prometheus_url: str | None = None

    @classmethod
    def from_args(
        cls, args: argparse.Namespace, env: Mapping[str, str] = os.environ
    ) -> WorkerConfig:
        actuation = args.actuation or _env(env, "ROLLBACK_ACTUATION") or Actuation.ANNOTATIONS
        try:
            parsed = Actuation(actuation)
        except ValueError:
            choices = ", ".join(a.value for a in Actuation)
            raise ConfigError(f"--actuation: {actuation!r} is not one of {choices}") from None
        cached = args.max_cached_workflows or _env(env, "ROLLBACK_MAX_CACHED_WORKFLOWS")
        try:
            max_cached = int(cached) if cached is not None else MAX_CACHED_WORKFLOWS
        except ValueError:
            raise ConfigError(f"--max-cached-workflows: {cached!r} is not a number") from None
        if max_cached < 1:
            raise ConfigError(f"--max-cached-workflows must be at least 1, got {max_cached}")
        return cls(
            TemporalConfig.from_args(args, env, cluster_required=True),
            KubeConfig.from_args(args, env),
            parsed,
            max_cached,
            _deployment(args, env),
            _notifications(args, env),
            _own_pod(env),
            _min_ready(args, env),
            parse_prometheus_url(args, env),
        )


def parse_prometheus_url(args: argparse.Namespace, env: Mapping[str, str]) -> str | None:
    raw = getattr(args, "prometheus_url", None) or _env(env, "ROLLBACK_PROMETHEUS_URL")
    if raw is not None and not re.match(r"^https?://[^/\s]+", raw):
        raise ConfigError(f"--prometheus-url: {redact_url(raw)} is not an http(s) URL")
    return raw


def _min_ready(args: argparse.Namespace, env: Mapping[str, str]) -> timedelta:
    raw = getattr(args, "min_ready_duration", None) or _env(env, "ROLLBACK_MIN_READY_DURATION")
    if raw is None:
        return DEFAULT_MIN_READY
    try:
        return parse_duration_or_zero(raw)
    except ValueError as exc:
        raise ConfigError(f"--min-ready-duration: {exc}") from None


def _own_pod(env: Mapping[str, str]) -> tuple[str, str] | None:
    namespace, name = _env(env, "POD_NAMESPACE"), _env(env, "POD_NAME")
    return (namespace, name) if namespace and name else None


def _notifications(args: argparse.Namespace, env: Mapping[str, str]) -> NotificationConfig:
    path = getattr(args, "notifications", None) or _env(env, "ROLLBACK_NOTIFICATIONS")
    try:
        return NotificationConfig.load(path)
    except OSError as exc:
        raise ConfigError(f"--notifications: cannot read {path}: {exc.strerror}") from None
    except ValidationError as exc:  # field paths and reasons, never the input (a receiver's URL)
        raise ConfigError(f"--notifications: {path}: {field_errors(exc)}") from None
    except (ValueError, yaml.YAMLError) as exc:
        first = str(exc).splitlines()
        raise ConfigError(f"--notifications: {path}: {' '.join(first[:3])}") from None


def _deployment(args: argparse.Namespace, env: Mapping[str, str]) -> WorkerDeploymentVersion | None:
    raw = args.worker_versioning or _env(env, "ROLLBACK_WORKER_VERSIONING") or "off"
    if raw.lower() not in ("on", "off", "true", "false"):
        raise ConfigError(f"--worker-versioning: {raw!r} is not on or off")
    if raw.lower() in ("off", "false"):
        return None
    name = args.deployment_name or _env(env, "ROLLBACK_DEPLOYMENT_NAME") or DEFAULT_DEPLOYMENT_NAME
    build = args.build_id or _env(env, "ROLLBACK_BUILD_ID") or package_version()
    for flag, value in (("--deployment-name", name), ("--build-id", build)):
        if not re.fullmatch(r"[A-Za-z0-9][-A-Za-z0-9_.]{0,254}", value):
            raise ConfigError(f"{flag}: {value!r}: letters, digits, '-', '_', '.' only")
    return WorkerDeploymentVersion(deployment_name=name, build_id=build)


INTAKE_AGENT = "rightsizing-rollback-intake"
WORKER_AGENT = "rightsizing-rollback-worker"


def default_identity() -> str:
    """The leader-election identity when POD_NAME is not set: host and process."""
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class IntakeConfig(_OneCluster):
    temporal: TemporalConfig
    kube: KubeConfig
    lease_namespace: str = "default"
    identity: str = field(default_factory=default_identity)
    # The worker's Prometheus, as the intake is told it: a policy with health checks says in
    # its status whether its checks can be asked (``workflows.policy_status``).
    prometheus_url: str | None = None
    # Billable actions a second the intake may spend (``worker.intake.budget``); None: unpaced.
    temporal_budget: float | None = None
    storm_breaker: StormBreaker | None = None  # ``workflows.breaker``; None: none

    @classmethod
    def from_args(
        cls, args: argparse.Namespace, env: Mapping[str, str] = os.environ
    ) -> IntakeConfig:
        return cls(
            TemporalConfig.from_args(args, env, cluster_required=True),
            KubeConfig.from_args(args, env),
            lease_namespace=args.lease_namespace or _env(env, "POD_NAMESPACE") or "default",
            identity=args.identity or _env(env, "POD_NAME") or default_identity(),
            prometheus_url=parse_prometheus_url(args, env),
            temporal_budget=_budget(args, env),
            storm_breaker=_storm_breaker(args, env),
        )


def _storm_breaker(args: argparse.Namespace, env: Mapping[str, str]) -> StormBreaker | None:
    raw = getattr(args, "storm_breaker", None) or _env(env, "ROLLBACK_STORM_BREAKER")
    try:
        return StormBreaker.parse(raw) if raw else None
    except ValueError as exc:
        raise ConfigError(f"--storm-breaker: {exc}") from None


def _budget(args: argparse.Namespace, env: Mapping[str, str]) -> float | None:
    raw = getattr(args, "temporal_budget", None) or _env(env, "ROLLBACK_TEMPORAL_BUDGET")
    if raw is None:
        return None
    try:
        rate = float(raw)
    except ValueError:
        rate = math.nan
    if not (math.isfinite(rate) and rate >= 1):
        raise ConfigError(
            f"--temporal-budget: {raw!r} is not a number of actions a second (1 or more)"
        )
    return rate
