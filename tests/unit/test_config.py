"""One typed configuration per process (``worker.config``): flags over environment over
defaults, the Temporal connection through ``temporalio.envconfig`` (variables and TOML
profiles), and one clear error per bad value."""

from __future__ import annotations

import argparse
from datetime import timedelta
from pathlib import Path

import pytest

from cli.main import build_parser
from worker.config import IntakeConfig, TemporalConfig, WorkerConfig
from worker.flags import (
    ConfigError,
    add_intake_flags,
    add_kube_flags,
    add_temporal_flags,
    add_worker_flags,
)
from workflows.contract import Actuation


def args(*argv: str, cluster: str | None = "eu-west-1") -> argparse.Namespace:
    """The processes' flags; ``cluster``: the --cluster they are given (None: none)."""
    parser = argparse.ArgumentParser()
    add_temporal_flags(parser)
    add_kube_flags(parser)
    add_worker_flags(parser)
    add_intake_flags(parser)
    return parser.parse_args([*([f"--cluster={cluster}"] if cluster else []), *argv])


def test_defaults_without_flags_or_environment() -> None:
    worker = WorkerConfig.from_args(args(), env={})
    assert worker.temporal.address == "localhost:7233"
    assert worker.cluster == "eu-west-1"
    assert worker.temporal.task_queue == "rightsizing-rollback-eu-west-1"  # one per cluster
    assert worker.actuation is Actuation.ANNOTATIONS
    assert worker.max_cached_workflows == 1_000
    assert worker.kube.timeout == 10.0 and worker.kube.simulated
    intake = IntakeConfig.from_args(args(), env={})
    assert intake.lease_namespace == "default"


def test_the_cluster_is_required_and_a_dns_label() -> None:
    """A fleet's clusters share one Temporal: a worker or intake that does not know its cluster
    would start and act on runs named for no cluster, so it does not start."""
    for config in (WorkerConfig, IntakeConfig):
        with pytest.raises(ConfigError, match="--cluster is required"):
            config.from_args(args(cluster=None), {})
    from_env = IntakeConfig.from_args(args(cluster=None), {"ROLLBACK_CLUSTER": "us-east"})
    assert from_env.cluster == "us-east"
    assert from_env.temporal.task_queue == "rightsizing-rollback-us-east"
    for bad in ("EU_West", "-east", "a" * 64, "eu.west"):
        with pytest.raises(ConfigError, match=r"--cluster: .* is not a cluster name: a DNS label"):
            WorkerConfig.from_args(args(cluster=bad), {})
    # rollbackctl get/describe look at the whole fleet: there the cluster is a filter.
    assert TemporalConfig.from_args(args(cluster=None), {}).cluster is None


def test_environment_then_flags() -> None:
    env = {
        "TEMPORAL_ADDRESS": "temporal:7233",
        "TEMPORAL_NAMESPACE": "prod",
        "ROLLBACK_TASK_QUEUE": "q",
        "ROLLBACK_ACTUATION": "in-place",
        "ROLLBACK_KUBE_TIMEOUT": "3",
        "ROLLBACK_MAX_CACHED_WORKFLOWS": "500",
        "POD_NAMESPACE": "rollback-system",
        "POD_NAME": "intake-0",
        "KUBECONFIG": "/etc/kube/config",
    }
    worker = WorkerConfig.from_args(args(), env)
    assert (worker.temporal.address, worker.temporal.profile.namespace) == ("temporal:7233", "prod")
    assert worker.temporal.task_queue == "q" and worker.actuation is Actuation.IN_PLACE
    assert (worker.kube.timeout, worker.max_cached_workflows) == (3.0, 500)
    assert not worker.kube.simulated
    intake = IntakeConfig.from_args(args(), env)
    assert (intake.lease_namespace, intake.identity) == ("rollback-system", "intake-0")
    flagged = WorkerConfig.from_args(
        args("--address", "other:1", "--task-queue", "q2", "--actuation", "annotations"), env
    )
    assert flagged.temporal.address == "other:1" and flagged.temporal.task_queue == "q2"
    assert flagged.actuation is Actuation.ANNOTATIONS


def test_envconfig_profile_file(tmp_path: Path) -> None:
    """The same TOML profiles as the ``temporal`` CLI, selected with --profile."""
    toml = tmp_path / "temporal.toml"
    toml.write_text(
        '[profile.staging]\naddress = "staging.example:7233"\nnamespace = "staging"\n'
        'api_key = "secret"\n'
    )
    env = {"TEMPORAL_CONFIG_FILE": str(toml)}
    config = WorkerConfig.from_args(args("--profile", "staging"), env).temporal
    connect = config.profile.to_client_connect_config()
    assert (config.address, connect.get("namespace")) == ("staging.example:7233", "staging")
    assert connect.get("api_key") == "secret" and connect.get("tls") is True


def test_mtls_files_from_flags(tmp_path: Path) -> None:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_text("cert")
    key.write_text("key")
    config = WorkerConfig.from_args(args("--tls-cert", str(cert), "--tls-key", str(key)), {})
    tls = config.temporal.profile.tls
    assert tls is not None and tls.client_cert == cert and tls.client_private_key == key


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        pytest.param(["--tls-cert", "/x"], {}, "--tls-cert and --tls-key", id="cert-without-key"),
        pytest.param(["--tls-ca", "/missing/ca.pem"], {}, "does not exist", id="missing-ca"),
        pytest.param([], {"ROLLBACK_ACTUATION": "sideways"}, "--actuation", id="bad-actuation"),
        pytest.param(["--kube-timeout", "soon"], {}, "--kube-timeout", id="bad-timeout"),
        pytest.param(["--kube-timeout", "0"], {}, "positive", id="zero-timeout"),
        pytest.param(["--max-cached-workflows", "0"], {}, "at least 1", id="no-cache"),
        pytest.param(
            ["--profile", "nope"],
            {"TEMPORAL_CONFIG_FILE": "/missing.toml"},
            "Temporal configuration",
            id="missing-profile-file",
        ),
    ],
)
def test_bad_values_are_one_clear_error(argv: list[str], env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        WorkerConfig.from_args(args(*argv), env)


def test_reads_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEMPORAL_ADDRESS", "from-env:7233")
    monkeypatch.setenv("ROLLBACK_TASK_QUEUE", "env-queue")
    config = WorkerConfig.from_args(args())  # os.environ, as the processes use it
    assert (config.temporal.address, config.temporal.task_queue) == ("from-env:7233", "env-queue")


def test_api_key_from_a_mounted_file(tmp_path: Path) -> None:
    key = tmp_path / "api-key"
    key.write_text("s3cr3t-key\n")
    config = WorkerConfig.from_args(args(), {"TEMPORAL_API_KEY_FILE": str(key)})
    connect = config.temporal.profile.to_client_connect_config()
    assert connect.get("api_key") == "s3cr3t-key" and connect.get("tls") is True
    flagged = WorkerConfig.from_args(args("--api-key-file", str(key)), {})
    assert flagged.temporal.profile.api_key == "s3cr3t-key"


@pytest.mark.parametrize(
    ("argv", "content", "message"),
    [
        pytest.param(["--api-key", "x"], "k", "not both", id="both"),
        pytest.param([], "  \n", "is empty", id="empty"),
    ],
)
def test_bad_api_key_files(tmp_path: Path, argv: list[str], content: str, message: str) -> None:
    key = tmp_path / "api-key"
    key.write_text(content)
    with pytest.raises(ConfigError, match=message):
        WorkerConfig.from_args(args(*argv, "--api-key-file", str(key)), {})
    with pytest.raises(ConfigError, match="FileNotFoundError"):
        WorkerConfig.from_args(args("--api-key-file", str(tmp_path / "missing")), {})


def test_worker_versioning_settings() -> None:
    assert WorkerConfig.from_args(args(), {}).deployment is None  # unversioned by default
    on = WorkerConfig.from_args(args(), {"ROLLBACK_WORKER_VERSIONING": "on"}).deployment
    assert on is not None and on.deployment_name == "rightsizing-rollback"
    assert on.build_id  # the package version
    flagged = WorkerConfig.from_args(
        args("--worker-versioning", "on", "--deployment-name", "rb", "--build-id", "1.2.3"), {}
    ).deployment
    assert flagged is not None and (flagged.deployment_name, flagged.build_id) == ("rb", "1.2.3")
    with pytest.raises(ConfigError, match="--build-id"):
        WorkerConfig.from_args(args("--worker-versioning", "on", "--build-id", "a b"), {})
    with pytest.raises(ConfigError, match="--worker-versioning"):
        WorkerConfig.from_args(args(), {"ROLLBACK_WORKER_VERSIONING": "maybe"})


def test_protected_namespaces_default_to_kubex_and_are_a_setting_of_both_processes() -> None:
    for config in (WorkerConfig, IntakeConfig):
        assert config.from_args(args(), {}).kube.protection.patterns == (
            "kube-*",
            "openshift-*",
            "gmp-*",
        )
        env = {"ROLLBACK_PROTECTED_NAMESPACES": "kube-system,platform-*"}
        assert config.from_args(args(), env).kube.protection.patterns == (
            "kube-system",
            "platform-*",
        )
        flagged = config.from_args(args("--protected-namespaces", ""), env)
        assert flagged.kube.protection.patterns == ()  # the flag wins: none protected
    with pytest.raises(ConfigError, match="--protected-namespaces: 'kube_system' is not a"):
        WorkerConfig.from_args(args("--protected-namespaces", "kube_system"), {})


def test_min_ready_duration_defaults_to_kubex_s_and_is_a_go_duration() -> None:
    assert WorkerConfig.from_args(args(), {}).min_ready == timedelta(seconds=10)
    env = {"ROLLBACK_MIN_READY_DURATION": "30s"}
    assert WorkerConfig.from_args(args(), env).min_ready == timedelta(seconds=30)
    flagged = WorkerConfig.from_args(args("--min-ready-duration", "0s"), env)
    assert flagged.min_ready == timedelta(0)  # the flag wins: Ready is enough
    with pytest.raises(ConfigError, match="--min-ready-duration: invalid duration 'soon'"):
        WorkerConfig.from_args(args("--min-ready-duration", "soon"), {})


def test_the_prometheus_url_is_none_by_default_and_an_http_url_else() -> None:
    assert WorkerConfig.from_args(args(), {}).prometheus_url is None
    env = {"ROLLBACK_PROMETHEUS_URL": "http://prometheus.monitoring:9090"}
    assert WorkerConfig.from_args(args(), env).prometheus_url == env["ROLLBACK_PROMETHEUS_URL"]
    flagged = WorkerConfig.from_args(args("--prometheus-url", "https://p:9090"), env)
    assert flagged.prometheus_url == "https://p:9090"  # the flag wins
    with pytest.raises(
        ConfigError, match="--prometheus-url: <15 characters, not a URL: not shown> is not an http"
    ):
        WorkerConfig.from_args(args("--prometheus-url", "prometheus:9090"), {})


def test_the_temporal_budget_is_off_by_default_and_a_rate_of_one_or_more() -> None:
    assert IntakeConfig.from_args(args(), {}).temporal_budget is None
    env = {"ROLLBACK_TEMPORAL_BUDGET": "200"}
    assert IntakeConfig.from_args(args(), env).temporal_budget == 200.0
    assert IntakeConfig.from_args(args("--temporal-budget", "50.5"), env).temporal_budget == 50.5
    for bad in ("0", "0.5", "-3", "fast", "inf", "nan"):
        with pytest.raises(ConfigError, match=f"--temporal-budget: '{bad}' is not a number"):
            IntakeConfig.from_args(args("--temporal-budget", bad), {})


def test_the_storm_breaker_is_off_by_default_and_refused_by_name_when_malformed() -> None:
    assert IntakeConfig.from_args(args(), {}).storm_breaker is None
    env = {"ROLLBACK_STORM_BREAKER": "50%/10m"}
    assert str(IntakeConfig.from_args(args(), env).storm_breaker) == "50%/10m/10"
    flagged = IntakeConfig.from_args(args("--storm-breaker", "30%/1h/20"), env)
    assert str(flagged.storm_breaker) == "30%/1h/20"  # the flag wins
    with pytest.raises(ConfigError, match="--storm-breaker: 'half' is not SHARE%/WINDOW"):
        IntakeConfig.from_args(args("--storm-breaker", "half"), {})


def test_namespace_is_the_kubernetes_one_as_in_kubectl() -> None:
    """`rollbackctl get --namespace shop` filters Kubernetes namespace shop; it used to name the
    Temporal namespace and fail with "Namespace shop is not found"."""
    parsed = build_parser().parse_args(
        ["get", "--namespace", "shop", "--temporal-namespace", "prod"]
    )
    assert parsed.namespace_filter == "shop"
    assert TemporalConfig.from_args(parsed, {}).profile.namespace == "prod"
    assert build_parser().parse_args(["get", "-n", "shop"]).namespace_filter == "shop"
