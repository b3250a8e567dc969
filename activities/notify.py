"""Sending notifications (``workflows.notify``): receivers, payloads, the two activities.

Receivers come from the worker's configuration (``--notifications FILE``, env
``ROLLBACK_NOTIFICATIONS``; in ``deploy/`` a ConfigMap, with URLs from a Secret through env
vars)::

    uiUrl: https://temporal.example.com      # links to the workflow in the Temporal UI
    receivers:
      - name: oncall
        type: webhook                        # generic JSON; or slack (incoming webhook)
        urlEnv: ONCALL_WEBHOOK_URL           # or url: https://...
        minSeverity: warning                 # info | warning | critical (default warning)
        namespaces: ["prod-*"]               # optional, * matches any run of characters
        labelSelector: {matchLabels: {tier: api}}   # optional, on the owner's labels
        timeoutSeconds: 5

Every POST carries ``Idempotency-Key: <key>``, the same for every send of one transition.
A 2xx is delivered; 408, 429 and 5xx, a timeout or a refused connection are retried by Temporal;
any other answer, or the last attempt failing, is reported (log line, metric
``rollback_notifications{receiver,outcome}``, Warning Event ``RollbackNotificationFailed`` on the
owner) and the send ends.
"""

from __future__ import annotations

import json
import logging
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote, urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel
from temporalio import activity

from activities.errors import TransientError, redact_url
from activities.lookup import OwnerLookup
from activities.writes import OwnerWriter
from workflows.contract import EventReason
from workflows.notify import (
    IDEMPOTENCY_HEADER,
    Notification,
    ReportInput,
    RouteResult,
    SendInput,
    SendResult,
    Severity,
)
from workflows.policy import LabelSelector, glob_match

log = logging.getLogger(__name__)
RETRIED_STATUSES = frozenset({408, 429}) | frozenset(range(500, 600))


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class Receiver(_Model):
    name: str = Field(min_length=1)
    type: Literal["webhook", "slack"] = "webhook"
    url: str | None = None
    url_env: str | None = None
    min_severity: Severity = Severity.WARNING
    namespaces: list[str] = Field(default_factory=list)
    label_selector: LabelSelector | None = None
    timeout_seconds: float = Field(default=5.0, gt=0, le=10)

    @model_validator(mode="after")
    def _one_url(self) -> Receiver:
        if (self.url is None) == (self.url_env is None):
            raise ValueError("give exactly one of url and urlEnv")
        if self.url is not None:
            check_url(self.url)  # refused when the file is loaded, not at the first send
        elif self.url_env is not None and self.url_env in os.environ:
            check_url(os.environ[self.url_env], f"${self.url_env}")
        return self

    def target(self) -> str:
        if self.url is not None:
            return self.url
        assert self.url_env is not None
        value = os.environ.get(self.url_env)
        if not value:
            raise BadReceiverError(f"receiver {self.name}: ${self.url_env} is not set")
        return check_url(value, f"${self.url_env}")

    def wants(self, n: Notification, labels: dict[str, str] | None) -> bool:
        if n.severity.rank < self.min_severity.rank:
            return False
        if self.namespaces and not any(glob_match(p, n.owner.namespace) for p in self.namespaces):
            return False
        return self.label_selector is None or self.label_selector.matches(labels or {})


class NotificationConfig(_Model):
    ui_url: str | None = None
    receivers: list[Receiver] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique_names(self) -> NotificationConfig:
        names = [r.name for r in self.receivers]
        if len(set(names)) != len(names):
            raise ValueError("receiver names must be unique")
        return self

    @classmethod
    def load(cls, path: str | Path | None) -> NotificationConfig:
        if not path:
            return cls()
        return cls.model_validate(yaml.safe_load(Path(path).read_text()) or {})


class BadReceiverError(ValueError):
    """A receiver that cannot be sent to as configured: reported at once, never retried."""


def check_url(url: str, what: str = "url") -> str:
    """``url`` when it is an absolute http(s) URL with a host; else ``BadReceiverError``."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        shown = redact_url(url)
        raise BadReceiverError(f"{what}: {shown} is not an http:// or https:// URL with a host")
    return url


class NotificationError(TransientError):
    """A send that failed; retried unless it is the last attempt."""


def workflow_url(ui_url: str | None, namespace: str, n: Notification) -> str | None:
    if not ui_url:
        return None
    return (
        f"{ui_url.rstrip('/')}/namespaces/{quote(namespace, safe='')}/workflows/"
        f"{quote(n.workflow_id, safe='')}/{n.run_id}/history"
    )


def webhook_payload(n: Notification, url: str | None) -> dict[str, Any]:
    body = n.model_dump(mode="json", by_alias=True, exclude_none=True)
    return body | ({"workflowUrl": url} if url else {})


_ICONS = {Severity.INFO: ":information_source:", Severity.WARNING: ":warning:"}


def slack_payload(n: Notification, url: str | None) -> dict[str, Any]:
    """An incoming-webhook message: one line a person reads in a channel, then the detail."""
    icon = _ICONS.get(n.severity, ":rotating_light:")
    reason = f" ({n.reason})" if n.reason else ""
    link = f" <{url}|workflow>" if url else ""
    where = f"{n.cluster}/" if n.cluster else ""
    text = (
        f"{icon} *{where}{n.owner}* {n.transition}{reason}, turn {n.turn}"
        f" under {n.policy or 'no policy'}{link}\n>{n.message}"
    )
    return {"text": text}


class Notifier:
    """What the two notification activities do (``activities.kubernetes`` declares them)."""

    def __init__(
        self,
        config: NotificationConfig,
        lookup: OwnerLookup,
        writer: OwnerWriter,
    ) -> None:
        self.config, self.lookup, self.writer = config, lookup, writer
        self.receivers = {r.name: r for r in config.receivers}

    def route(self, n: Notification) -> RouteResult:
        labels = None
        if any(r.label_selector is not None for r in self.config.receivers):
            obj = self.lookup.get(n.owner)
            labels = ((obj or {}).get("metadata") or {}).get("labels") or {}
        return RouteResult(receivers=[r.name for r in self.config.receivers if r.wants(n, labels)])

    def send(self, input: SendInput) -> SendResult:
        receiver, n = self.receivers.get(input.receiver), input.notification
        if receiver is None:  # configuration changed since the route: nothing to send to
            return SendResult(receiver=input.receiver, delivered=False, detail="no such receiver")
        info = activity.info()
        url = workflow_url(self.config.ui_url, info.workflow_namespace or "default", n)
        payload = (slack_payload if receiver.type == "slack" else webhook_payload)(n, url)
        try:
            status = self._post(receiver, n.key, payload)
        except BadReceiverError as exc:  # asking again will not help
            return self._failed(receiver, n, str(exc))
        except NotificationError as exc:
            if info.attempt < input.attempts:
                self._count(receiver.name, "retried")
                raise
            return self._failed(receiver, n, f"{exc} after {info.attempt} attempts")
        if status // 100 == 2:
            self._count(receiver.name, "sent")
            log.info("notified %s of %s %s (HTTP %d)", receiver.name, n.owner, n.transition, status)
            return SendResult(receiver=receiver.name, delivered=True, detail=f"HTTP {status}")
        return self._failed(receiver, n, f"HTTP {status}, not retried")

    def _post(self, receiver: Receiver, key: str, payload: dict[str, Any]) -> int:
        """POST ``payload``: the status of a final answer; raises what is worth retrying."""
        request = urllib.request.Request(
            receiver.target(),
            data=json.dumps(payload).encode(),
            method="POST",
            headers={
                "Content-Type": "application/json",
                IDEMPOTENCY_HEADER: key,
                "User-Agent": "rightsizing-rollback",
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=receiver.timeout_seconds) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            if exc.code in RETRIED_STATUSES:
                raise NotificationError(f"receiver {receiver.name}: HTTP {exc.code}") from None
            return exc.code
        except (urllib.error.URLError, OSError) as exc:  # refused, unreachable, timed out
            raise NotificationError(f"receiver {receiver.name}: {exc}") from None

    def report(self, input: ReportInput) -> None:
        """A failure the send could not report itself (its last attempt timed out; the routing
        failed): the same log line, metric and Event as ``_failed``."""
        self._failed(input.receiver, input.notification, input.detail)

    def _failed(self, receiver: Receiver | str, n: Notification, why: str) -> SendResult:
        name = receiver if isinstance(receiver, str) else receiver.name
        self._count(name, "failed")
        log.warning("notification of %s %s to %s failed: %s", n.owner, n.transition, name, why)
        message = f"notification of {n.transition} (turn {n.turn}) to {name} failed: {why}"
        try:
            self.writer.event(
                n.owner, None, f"{n.key}/{name}/failed",
                EventReason.NOTIFICATION_FAILED.value, message, "Warning",
            )  # fmt: skip
        except Exception as exc:  # the report must not turn into a retry loop of its own
            log.warning("%s: reporting the failed notification failed: %s", n.owner, exc)
        return SendResult(receiver=name, delivered=False, detail=why)

    @staticmethod
    def _count(receiver: str, outcome: str) -> None:
        activity.metric_meter().create_counter(
            "rollback_notifications", "notification sends by receiver and outcome"
        ).add(1, {"receiver": receiver, "outcome": outcome})
