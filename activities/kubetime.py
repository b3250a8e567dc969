"""Kubernetes timestamps: the RFC 3339 strings of ``metav1.Time`` and back."""

from __future__ import annotations

from datetime import UTC, datetime


def kube_time(at: datetime) -> str:
    """``at`` as ``metav1.Time`` serialises it (second precision, rounded down, ``Z``)."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def kube_now() -> str:
    """Now, as ``metav1.Time`` serialises it."""
    return kube_time(datetime.now(UTC))


def parse_kube_time(value: str | None) -> datetime | None:
    """An RFC 3339 timestamp from the API (``...Z`` or an offset); ``None`` when absent."""
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))
