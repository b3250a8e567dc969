"""Recommendations read from annotations, and their fingerprint.

A recommendation is what an applier publishes for a pod: a requests and/or a limits annotation,
each a JSON object ``container -> resource -> quantity``, under a *physical* key: fixed
(``static.rightsizing.kubex.ai/desired-resource-requests``) or policy-owned and hashed
(``static.rightsizing.kubex.ai/h3f9c...-desired-resource-requests``).

The fingerprint is a stable hash over the physical key(s) and the canonical values. Quantities
are canonicalised (``250m`` == ``0.25``, ``1Gi`` == ``1024Mi``), so re-serialising the same
values keeps the fingerprint; moving the same values to another key changes it (the spec: a key
conversion is a new recommendation and restarts monitoring, no state migrates).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from workflows.contract import (
    RECOMMENDATION_SUFFIX_LIMITS,
    RECOMMENDATION_SUFFIX_REQUESTS,
    ROLLBACK_SOURCE,
)
from workflows.quantities import canonical_quantity

Resources = dict[str, dict[str, str]]
"""container name -> resource name (cpu, memory, ...) -> quantity string."""

_KEY = re.compile(
    r"^(?P<source>[a-z0-9]([-a-z0-9]*[a-z0-9])?)\.rightsizing\.kubex\.ai/"
    r"(?:h(?P<digest>[0-9a-z]+)-)?"
    rf"(?P<which>{RECOMMENDATION_SUFFIX_REQUESTS}|{RECOMMENDATION_SUFFIX_LIMITS})$"
)
FINGERPRINT_LENGTH = 16


class MalformedRecommendationError(ValueError):
    """An annotation value is not a JSON object of container -> resource -> quantity."""


class Recommendation(BaseModel):
    """One recommendation as published: its physical keys and its values."""

    model_config = ConfigDict(frozen=True)

    requests_key: str | None = None
    limits_key: str | None = None
    requests: Resources = Field(default_factory=dict)
    limits: Resources = Field(default_factory=dict)

    @property
    def fingerprint(self) -> str:
        return fingerprint(self)

    def canonical(self) -> dict[str, Any]:
        return {
            "requests": {"key": self.requests_key, "values": canonical_resources(self.requests)},
            "limits": {"key": self.limits_key, "values": canonical_resources(self.limits)},
        }

    def equals_resources(self, requests: Resources, limits: Resources) -> bool:
        """True when actual container resources carry every recommended quantity (canonically).

        Resources the recommendation does not name are not compared: an applier that only
        recommends memory leaves CPU alone.
        """
        return _covers(requests, self.requests) and _covers(limits, self.limits)


def _covers(actual: Resources, wanted: Resources) -> bool:
    for container, resources in wanted.items():
        have = actual.get(container, {})
        for name, quantity in resources.items():
            if name not in have or canonical_quantity(have[name]) != canonical_quantity(quantity):
                return False
    return True


def canonical_resources(values: Resources) -> dict[str, dict[str, str]]:
    return {
        c: {r: canonical_quantity(q) for r, q in sorted(res.items())}
        for c, res in sorted(values.items())
    }


def fingerprint(rec: Recommendation) -> str:
    """First 16 hex digits of SHA-256 over the canonical JSON of keys and values."""
    blob = json.dumps(rec.canonical(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:FINGERPRINT_LENGTH]


def parse_resources(key: str, raw: str) -> Resources:
    """Decode one annotation value; raises ``MalformedRecommendationError`` with the key and why."""
    try:
        value = json.loads(raw)
    except (TypeError, json.JSONDecodeError) as exc:
        raise MalformedRecommendationError(f"{key}: not valid JSON ({exc})") from exc
    if not isinstance(value, dict):
        raise MalformedRecommendationError(f"{key}: expected a JSON object of containers")
    out: Resources = {}
    for container, resources in value.items():
        if not isinstance(resources, dict) or not resources:
            raise MalformedRecommendationError(
                f"{key}: container {container!r} must map resource names to quantities"
            )
        out[container] = {}
        for name, quantity in resources.items():
            try:
                canonical_quantity(quantity)
            except ValueError as exc:
                raise MalformedRecommendationError(f"{key}: {container}.{name}: {exc}") from exc
            out[container][name] = str(quantity)
    return out


def is_recommendation_key(key: str) -> bool:
    """An applier's recommendation annotation, fixed or hashed (not our rollback one)."""
    match = _KEY.match(key)
    return match is not None and match["source"] != ROLLBACK_SOURCE


def recommendations_from_annotations(annotations: dict[str, str]) -> list[Recommendation]:
    """Every recommendation among ``annotations``, grouped by source and digest.

    The rollback recommendation (``rollbackpolicy.rightsizing.kubex.ai/...``) is ours, not an
    applier's, and is skipped. Ordered by physical key so the result is deterministic.
    """
    groups: dict[tuple[str, str | None], dict[str, Any]] = {}
    for key in sorted(annotations):
        if not is_recommendation_key(key):
            continue
        match = _KEY.match(key)
        assert match is not None
        group = groups.setdefault((match["source"], match["digest"]), {})
        which = "requests" if match["which"] == RECOMMENDATION_SUFFIX_REQUESTS else "limits"
        group[f"{which}_key"] = key
        group[which] = parse_resources(key, annotations[key])
    return [Recommendation(**g) for _, g in sorted(groups.items(), key=lambda kv: str(kv[0]))]
