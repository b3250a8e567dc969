"""Every error an activity can raise, classified: transient (Temporal retries it with backoff,
within the attempt's retry budget) or permanent (a non-retryable ``ApplicationError`` whose type
is a ``workflows.activity_api.PermanentError``; the workflow ends the attempt ``aborted`` with
the matching failure reason and a Warning Event). docs/concepts/activities.md, "Errors", lists the
classes.

Each ``@activity.defn`` method runs its body under ``classified()``; the helpers below it raise
plain exceptions and need not know about Temporal.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit, urlunsplit

from kubernetes.client.exceptions import ApiException
from temporalio import activity
from temporalio.exceptions import ApplicationError, CancelledError
from urllib3.exceptions import HTTPError

from workflows.activity_api import PermanentError
from workflows.fingerprint import MalformedRecommendationError

log = logging.getLogger(__name__)

# What the API server answers when the request itself is wrong for this object: a retry gets the
# same answer (a webhook's denial, an annotation over the size limit, an invalid patch).
PERMANENT_STATUSES = frozenset({400, 403, 405, 406, 413, 415, 422})


def redact_url(url: str) -> str:
    """``url`` as an error, a log line or an Event may print it: its scheme, host, port and path;
    a user and password, a query and a fragment (where tokens go) shown as ``***``. Text that is
    not a URL with a scheme and a host is not shown at all: it may be a token itself."""
    parts = urlsplit(url)
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        port = ":***"
    if not parts.scheme or not parts.hostname:
        return f"<{len(url)} characters, not a URL: not shown>"
    name = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname  # IPv6
    host = ("***@" if parts.username or parts.password else "") + name + port
    return urlunsplit(
        (
            parts.scheme,
            host,
            parts.path,
            "***" if parts.query else "",
            "***" if parts.fragment else "",
        )
    )


class InvalidOwnerError(ValueError):
    """The owner object cannot be judged: no ``spec.selector``, a ``spec.replicas`` that is not a
    number, a pod template without containers where one is needed."""


class TransientError(Exception):
    """Worth another try: Temporal retries the activity (a receiver that answered 5xx, ...)."""


class ConflictError(TransientError):
    """The owner kept changing under us; transient: Temporal retries the activity."""


# The admission plugins' messages for resources a namespace does not allow: ResourceQuota's
# ("exceeded quota: q, requested: ...", "failed quota: q: must specify limits.memory") and
# LimitRanger's ("maximum memory usage per Container is 1Gi, but limit is 2Gi", "minimum ...",
# "memory max limit to request ratio per Container is 2, but provided ratio is 4.000000").
REFUSED_RESOURCES = re.compile(
    r"exceeded quota: |failed quota: |(?:maximum|minimum) \S+ usage per (?:Container|Pod) is"
    r"|max limit to request ratio per (?:Container|Pod)"
)


def refused_resources(exc: ApiException) -> bool:
    """Whether the API server refused a write (403 or 422) for a ResourceQuota or LimitRange."""
    return exc.status in (403, 422) and REFUSED_RESOURCES.search(exc.body or "") is not None


def classify(exc: Exception) -> Exception:
    """The exception to raise for ``exc``: itself when transient, else a non-retryable
    ``ApplicationError`` of the right ``PermanentError`` type."""
    kind: PermanentError | None = None
    if isinstance(exc, (ApplicationError, CancelledError)):
        return exc  # already Temporal's, or its cancel (raised in the thread): as it is
    if isinstance(exc, MalformedRecommendationError):
        kind = PermanentError.MALFORMED_RECOMMENDATION
    elif isinstance(exc, InvalidOwnerError):
        kind = PermanentError.INVALID_OWNER
    elif isinstance(exc, ApiException):
        if exc.status not in PERMANENT_STATUSES:
            return exc  # 5xx, 429, 401, 409, 404 on a sub-read: worth another try
        kind = (
            PermanentError.RESOURCES_REFUSED
            if refused_resources(exc)
            else PermanentError.API_REJECTED
        )
    elif isinstance(exc, (HTTPError, OSError, TransientError)):
        return exc  # timeouts, refused or dropped connections, a busy owner, a busy receiver
    else:
        kind = PermanentError.UNEXPECTED
        where = activity.info().workflow_id if activity.in_activity() else "outside an activity"
        log.error("%s: unexpected error, ending the attempt", where, exc_info=exc)
    return ApplicationError(_summary(exc), type=kind.value, non_retryable=True)


def _summary(exc: Exception) -> str:
    if isinstance(exc, ApiException):
        return f"{exc.status} {exc.reason}: {_api_message(exc.body or '')[:500]}".strip()
    return (str(exc) or type(exc).__name__)[:500]


def _api_message(body: str) -> str:
    """The message of the API server's ``Status`` body, else the body as it came."""
    try:
        status = json.loads(body)
    except ValueError:
        return body
    message = status.get("message") if isinstance(status, dict) else None
    return message if isinstance(message, str) and message else body


@contextmanager
def classified() -> Iterator[None]:
    """Run an activity's body; re-raise what it raises as ``classify`` says."""
    try:
        yield
    except Exception as exc:
        converted = classify(exc)
        if converted is exc:
            raise  # transient: as it was (``raise exc from exc`` would make a cause cycle)
        raise converted from exc


def first_line(exc: BaseException, limit: int = 300) -> str:
    """An error as one line for a message or an Event: its first line, else its type."""
    return (str(exc).splitlines() or [type(exc).__name__])[0][:limit]
