"""Kubernetes/Go duration strings (``90s``, ``5m``, ``1h30m``, ``2s``) <-> ``timedelta``.

Policies carry durations the way Kubernetes users write them: Go's ``time.ParseDuration``
syntax without a sign, in units of h, m, s and ms. Zero, negative and malformed durations are
rejected: a zero monitoring window or backoff would make the policy meaningless.
``DURATION_PATTERN`` is the same check as a regular expression, used verbatim by the CRD
schema so that the API server and the models agree.
"""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal
from typing import Annotated

from pydantic import BeforeValidator, PlainSerializer, WithJsonSchema

_UNIT = r"(?:ms|s|m|h)"  # sub-millisecond units are meaningless for timers
_ANY = rf"[0-9]+(?:\.[0-9]+)?{_UNIT}"
_NONZERO = rf"(?:[0-9]*[1-9][0-9]*(?:\.[0-9]+)?|[0-9]+\.[0-9]*[1-9][0-9]*){_UNIT}"
# At least one component with a non-zero digit: "0s" and "0m0s" fail, "0m30s" passes.
# RE2-compatible (no look-ahead), so the Kubernetes API server accepts it in a CRD.
DURATION_PATTERN = rf"^(?:{_ANY})*{_NONZERO}(?:{_ANY})*$"

_COMPONENT = re.compile(rf"([0-9]+(?:\.[0-9]+)?)({_UNIT})")
_SECONDS_PER_UNIT = {
    "ms": Decimal("1e-3"),
    "s": Decimal(1),
    "m": Decimal(60),
    "h": Decimal(3600),
}
_FULL = re.compile(DURATION_PATTERN)

MAX_DURATION_LENGTH = 32
MAX_DURATION = timedelta(hours=8760)
"""A year: the longest monitoring window, backoff base or single backoff wait a policy may ask
for. Longer ones are rejected up front (by the models and by the CRD's CEL rules alike) instead
of overflowing dates deep in the engine."""
MAX_DURATION_TEXT = "8760h"


def parse_duration_or_zero(text: str) -> timedelta:
    """``parse_duration``, and ``0`` / ``0s`` (a setting that can be off)."""
    return timedelta(0) if text.strip() in ("0", "0s") else parse_duration(text)


def parse_duration(text: str) -> timedelta:
    """Parse a positive Go duration. ``parse_duration("1h30m") == timedelta(minutes=90)``."""
    if not isinstance(text, str):
        raise ValueError(f"expected a duration string such as '5m', got {type(text).__name__}")
    if len(text) > MAX_DURATION_LENGTH:
        raise ValueError(f"invalid duration {text[:MAX_DURATION_LENGTH]!r}...: too long")
    if not _FULL.match(text):
        raise ValueError(
            f"invalid duration {text!r}: expected a positive Go duration such as 90s, 5m, 1h30m"
        )
    seconds = sum(
        (Decimal(n) * _SECONDS_PER_UNIT[u] for n, u in _COMPONENT.findall(text)), Decimal(0)
    )
    if seconds > Decimal(MAX_DURATION.total_seconds()):
        raise ValueError(f"duration {text!r} is longer than {MAX_DURATION_TEXT} (a year)")
    return timedelta(seconds=float(seconds))


def format_duration(value: timedelta) -> str:
    """Shortest Go-style rendering: 90s -> ``1m30s``, 7200s -> ``2h``, 0.5s -> ``500ms``."""
    micros = round(value.total_seconds() * 1_000_000)
    if micros <= 0:
        return "0s"
    seconds, micros = divmod(micros, 1_000_000)
    hours, seconds = divmod(seconds, 3600)
    minutes, seconds = divmod(seconds, 60)
    parts = [f"{hours}h" if hours else "", f"{minutes}m" if minutes else ""]
    if micros:
        if seconds:
            parts.append(f"{Decimal(seconds) + Decimal(micros) / 1_000_000}s")
        else:
            parts.append(f"{Decimal(micros) / 1000}ms")
    elif seconds:
        parts.append(f"{seconds}s")
    return "".join(parts)


def _coerce(value: object) -> object:
    return value if isinstance(value, timedelta) else parse_duration(value)  # type: ignore[arg-type]


Duration = Annotated[
    timedelta,
    BeforeValidator(_coerce),
    PlainSerializer(format_duration, return_type=str),
    WithJsonSchema(
        {"type": "string", "pattern": DURATION_PATTERN, "maxLength": MAX_DURATION_LENGTH}
    ),
]
"""A positive duration field up to a year: validated from Go syntax, serialised back to it."""
