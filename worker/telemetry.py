"""Metrics and logs for the processes.

Metrics: one Prometheus endpoint (``--metrics-address``, ``ROLLBACK_METRICS_ADDRESS``, default
off on a laptop, ``0.0.0.0:9464`` in the manifests) served by the Temporal SDK's runtime, so the
SDK's own metrics (workflow and activity task latencies, polls, failures) and ours share it;
docs/operating/scale.md, "Metrics and logs", lists ours with their labels (build info,
transitions, attempts,
rollbacks, time to verdict, sample latency, notifications, Kubernetes requests, owners by policy
and mode, the oldest transition per mode, intake leadership, workflows by mode, bad objects).

Every metric carries the process's ``cluster`` label (a global tag of the SDK's runtime), and
every log line its ``cluster`` (``name_cluster``): a fleet's processes share one Prometheus, one
log store and one Temporal (docs/operating/fleet.md).

Logs: ``--log-format json`` (``ROLLBACK_LOG_FORMAT``) writes one JSON object per line with the
cluster, and the owner, fingerprint and workflow ID whenever the line is about one.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from temporalio.common import MetricMeter
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

TEXT_FORMAT = "%(asctime)s %(levelname)s %(cluster)s %(name)s: %(message)s"
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


def runtime(metrics_address: str | None, cluster: str | None = None) -> Runtime | None:
    """A Temporal runtime exporting Prometheus metrics, each labelled with ``cluster``, or None
    for the default runtime."""
    if not metrics_address:
        return None
    tags = {"cluster": cluster} if cluster else {}
    return Runtime(
        telemetry=TelemetryConfig(
            metrics=PrometheusConfig(bind_address=metrics_address), global_tags=tags
        )
    )


class _ClusterFilter(logging.Filter):
    """Names the process's cluster on every record (``-`` before it is known)."""

    cluster = "-"

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "cluster"):
            record.cluster = self.cluster
        return True


_CLUSTER = _ClusterFilter()


def name_cluster(cluster: str) -> None:
    """From now on, every log line of this process names ``cluster``."""
    _CLUSTER.cluster = cluster


def meter(rt: Runtime | None) -> MetricMeter:
    return rt.metric_meter if rt is not None else MetricMeter.noop


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key in _STANDARD:
                continue
            if key in ("temporal_workflow", "temporal_activity") and isinstance(value, dict):
                line["workflow_id"] = value.get("workflow_id")
                line["run_id"] = value.get("run_id")
            else:
                line[key] = (
                    value if isinstance(value, str | int | float | bool | None) else str(value)
                )
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line)


def configure_logging(fmt: str | None = None, level: int = logging.INFO) -> None:
    """Text or JSON lines on stderr; ``None`` reads ``ROLLBACK_LOG_FORMAT`` (default text)."""
    fmt = fmt or os.environ.get("ROLLBACK_LOG_FORMAT") or "text"
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_CLUSTER)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def console_quiet(log_file: Path) -> None:
    """For a person watching a timeline (``rollbackctl run`` on the simulated cluster): the
    console gets warnings and errors only, and every line goes to ``log_file`` as well."""
    root = logging.getLogger()
    for handler in root.handlers:
        handler.setLevel(logging.WARNING)
    to_file = logging.FileHandler(log_file)
    to_file.addFilter(_CLUSTER)
    formatter = root.handlers[0].formatter if root.handlers else None
    to_file.setFormatter(formatter or logging.Formatter(TEXT_FORMAT))
    root.addHandler(to_file)
