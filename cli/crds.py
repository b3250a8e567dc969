"""The CustomResourceDefinitions of both policy kinds, built from the same constants as the models.

``deploy/crds/*.yaml`` are generated from here (``rollbackctl crds --write deploy/crds``) and a
test fails when they drift. Single-sourcing the duration and namespace patterns, the enums and
the defaults is what keeps the API server and ``workflows.policy`` rejecting the same documents.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from workflows.contract import (
    API_GROUP,
    API_VERSION,
    DEFAULT_WORKLOAD_TYPES,
    RollbackTarget,
    WorkloadKind,
)
from workflows.durations import DURATION_PATTERN
from workflows.policy import INT32_MAX, INT32_MIN, NAMESPACE_PATTERN

Schema = dict[str, Any]


def _duration(description: str) -> Schema:
    return {"type": "string", "pattern": DURATION_PATTERN, "description": description}


def _label_selector() -> Schema:
    return {
        "type": "object",
        "description": "Kubernetes label selector over the workload's labels.",
        "properties": {
            "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
            "matchExpressions": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["key", "operator"],
                    "properties": {
                        "key": {"type": "string", "minLength": 1},
                        "operator": {
                            "type": "string",
                            "enum": ["In", "NotIn", "Exists", "DoesNotExist"],
                        },
                        "values": {"type": "array", "items": {"type": "string"}},
                    },
                    # In/NotIn need values; Exists/DoesNotExist take none.
                    "oneOf": [
                        {
                            "required": ["values"],
                            "properties": {
                                "operator": {"enum": ["In", "NotIn"]},
                                "values": {"minItems": 1},
                            },
                        },
                        {
                            "properties": {
                                "operator": {"enum": ["Exists", "DoesNotExist"]},
                                "values": {"maxItems": 0},
                            },
                        },
                    ],
                },
            },
        },
    }


def _scope(cluster: bool) -> Schema:
    properties: Schema = {
        "labelSelector": _label_selector(),
        "workloadTypes": {
            "type": "array",
            "description": "Workload kinds in scope (default: all but StrimziPodSet).",
            "minItems": 1,
            "x-kubernetes-list-type": "set",
            "items": {"type": "string", "enum": [k.value for k in WorkloadKind]},
            "default": [k.value for k in DEFAULT_WORKLOAD_TYPES],
        },
    }
    if cluster:
        properties["namespaceSelector"] = {
            "type": "object",
            "description": 'Namespace names or patterns ("prod-*") to include or exclude.',
            "required": ["operator", "values"],
            "properties": {
                "operator": {"type": "string", "enum": ["In", "NotIn"]},
                "values": {
                    "type": "array",
                    "minItems": 1,
                    "items": {"type": "string", "pattern": NAMESPACE_PATTERN, "maxLength": 63},
                },
            },
        }
    return {"type": "object", "default": {}, "properties": properties}


def spec_schema(cluster: bool) -> Schema:
    return {
        "type": "object",
        "required": ["monitoringPeriod", "rollbackTarget", "adoptionThresholdPercent", "backoff"],
        "properties": {
            "scope": _scope(cluster),
            "monitoringPeriod": _duration("How long a resize attempt is observed, e.g. 5m."),
            "rollbackTarget": {"type": "string", "enum": [t.value for t in RollbackTarget]},
            "adoptionThresholdPercent": {"type": "integer", "minimum": 1, "maximum": 100},
            "backoff": {
                "type": "object",
                "required": ["timePeriod", "multiplyByTurn", "maxAttempts"],
                "properties": {
                    "timePeriod": _duration("Base duration of a rollback turn, e.g. 1m."),
                    "multiplyByTurn": {"type": "integer", "minimum": 1, "maximum": 1000},
                    "maxAttempts": {"type": "integer", "minimum": 1, "maximum": 1000},
                },
            },
            "weight": {
                "type": "integer",
                "format": "int32",
                "minimum": INT32_MIN,
                "maximum": INT32_MAX,
                "default": 0,
            },
            "enableMonitoringReopen": {"type": "boolean", "default": True},
        },
    }


def crd(kind: str, plural: str, short_name: str, cluster: bool) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{API_GROUP}"},
        "spec": {
            "group": API_GROUP,
            "scope": "Cluster" if cluster else "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": [short_name],
                "categories": ["rightsizing"],
            },
            "versions": [
                {
                    "name": API_VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": "Weight", "type": "integer", "jsonPath": ".spec.weight"},
                        {"name": "Target", "type": "string", "jsonPath": ".spec.rollbackTarget"},
                        {
                            "name": "Monitoring",
                            "type": "string",
                            "jsonPath": ".spec.monitoringPeriod",
                        },
                        {
                            "name": "Threshold",
                            "type": "integer",
                            "jsonPath": ".spec.adoptionThresholdPercent",
                            "priority": 1,
                        },
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec_schema(cluster),
                                "status": {
                                    "type": "object",
                                    "x-kubernetes-preserve-unknown-fields": True,
                                },
                            },
                        }
                    },
                }
            ],
        },
    }


CRDS = {
    "rollbackpolicies.yaml": crd("RollbackPolicy", "rollbackpolicies", "rbp", cluster=False),
    "clusterrollbackpolicies.yaml": crd(
        "ClusterRollbackPolicy", "clusterrollbackpolicies", "crbp", cluster=True
    ),
}

_HEADER = "# Generated by `rollbackctl crds --write deploy/crds`; do not edit by hand.\n"


def render(document: dict[str, Any]) -> str:
    return _HEADER + yaml.safe_dump(document, sort_keys=False, allow_unicode=True, width=100)


def write(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for filename, document in CRDS.items():
        path = directory / filename
        path.write_text(render(document), encoding="utf-8")
        paths.append(path)
    return paths
