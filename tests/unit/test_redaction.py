"""No URL is printed whole: a receiver's or Prometheus's URL may carry a token (a Slack webhook's
path, ``user:pass@``, ``?token=``), and the errors they meet reach logs, Events and statuses."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from pathlib import Path

import pytest

from activities.errors import redact_url
from activities.health import Prometheus, PrometheusError
from sim.apiserver import free_port
from worker.config import ConfigError, _notifications, parse_prometheus_url

SECRET = "pa55w0rd"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://prom:9090", "http://prom:9090"),
        (f"https://user:{SECRET}@prom:9090/x?token={SECRET}#{SECRET}", "https://***@prom:9090/x?***#***"),
        ("http://[::1]:9090/api", "http://[::1]:9090/api"),
        (f"hooks.slack.com/services/T0/B0/{SECRET}", "<39 characters, not a URL: not shown>"),
        (SECRET, "<8 characters, not a URL: not shown>"),
        (f"https://h:{SECRET}/", "https://h:***/"),
    ],
)  # fmt: skip
def test_a_url_is_shown_without_what_may_be_a_secret(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_a_receiver_that_is_not_a_url_is_refused_without_printing_it(tmp_path: Path) -> None:
    path = tmp_path / "notifications.yaml"
    path.write_text(f"receivers:\n- name: r\n  url: hooks.slack.com/services/T0/B0/{SECRET}\n")
    with pytest.raises(ConfigError) as caught:
        _notifications(argparse.Namespace(notifications=str(path)), {})
    assert "receivers[0]: url: <" in str(caught.value) and SECRET not in str(caught.value)


def test_a_prometheus_url_is_refused_or_unreachable_without_its_credentials() -> None:
    with pytest.raises(ConfigError) as refused:
        parse_prometheus_url(argparse.Namespace(prometheus_url=f"prom:{SECRET}"), {})
    assert SECRET not in str(refused.value)
    url = f"http://admin:{SECRET}@127.0.0.1:{free_port()}/?token={SECRET}"  # nothing listens
    with pytest.raises(PrometheusError) as unreachable:
        Prometheus(url).query("vector(1)", datetime.now(UTC))
    said = str(unreachable.value)  # the health check's Event and status print this
    assert said.startswith("Prometheus at http://***@127.0.0.1:") and SECRET not in said
