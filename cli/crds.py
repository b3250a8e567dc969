"""The CustomResourceDefinitions of both policy kinds, built from the same constants as the models.

``deploy/crds/*.yaml`` are generated from here (``rollbackctl crds --write deploy/crds``) and a
test fails when they drift. Single-sourcing the duration and namespace patterns, the enums and
the defaults is what keeps the API server and ``workflows.policy`` rejecting the same documents.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import BaseModel

from workflows.contract import (
    API_GROUP,
    API_VERSION,
    DEFAULT_WORKLOAD_TYPES,
    RollbackTarget,
    WorkloadKind,
)
from workflows.durations import (
    DURATION_PATTERN,
    MAX_DURATION,
    MAX_DURATION_LENGTH,
    MAX_DURATION_TEXT,
    format_duration,
)
from workflows.policy import (
    COMPARISONS,
    DEFAULT_CONFIRMATION,
    DEFAULT_MAX_HOLD,
    DNS_LABEL_PATTERN,
    DNS_SUBDOMAIN_PATTERN,
    INT32_MAX,
    LABEL_KEY_MAX,
    LABEL_KEY_PATTERN,
    LABEL_VALUE_MAX,
    LABEL_VALUE_PATTERN,
    MAX_LABELS,
    NAMESPACE_PATTERN,
    QUERIES_MAX,
    WEIGHT_MIN,
    ClusterRollbackPolicy,
    ClusterRollbackPolicySpec,
    RollbackPolicy,
    RollbackPolicySpec,
)
from workflows.policy_status import READY, SUMMARY_MAX
from workflows.promql import PROMQL_MAX

Schema = dict[str, Any]


# CEL rules (x-kubernetes-validations) for what a structural schema cannot say: bounds on
# durations and on the longest backoff wait, label keys of a map, the object's name. The tests
# evaluate these very expressions with a CEL interpreter against the shared policy table.
DURATION_RULE = f"duration(self) <= duration('{MAX_DURATION_TEXT}')"
# The longest wait, t x k (k = multiplyByTurn x maxAttempts) <= L, exactly: CEL cannot multiply
# a duration, so t is split into whole milliseconds T (getMilliseconds) and the rest f (< 1ms).
# T*k > L fails; (T+1)*k <= L passes; in between, f*k <= L - T*k decides, compared in ns.
_T = "duration(self.timePeriod).getMilliseconds()"
_K = "(self.multiplyByTurn * self.maxAttempts)"
_L = int(MAX_DURATION.total_seconds() * 1000)
BACKOFF_RULE = (
    f"{_T} * {_K} <= {_L} && ({_T} * {_K} + {_K} <= {_L}"
    f" || duration(self.timePeriod) - duration(string({_T}) + 'ms')"
    f" <= duration(string(({_L} - {_T} * {_K}) * 1000000 / {_K}) + 'ns'))"
)


def _cel_string(text: str) -> str:
    """A CEL string literal: backslashes doubled (``\\.`` is no escape sequence in CEL)."""
    return "'" + text.replace("\\", "\\\\") + "'"


LABEL_KEYS_RULE = (
    f"self.all(k, size(k) <= {LABEL_KEY_MAX} && k.matches({_cel_string(LABEL_KEY_PATTERN)}))"
)
NAME_RULE = (
    "size(self.metadata.name) <= 253"
    f" && self.metadata.name.matches({_cel_string(DNS_SUBDOMAIN_PATTERN)})"
)


def _rule(rule: str, message: str) -> list[Schema]:
    return [{"rule": rule, "message": message}]


def _duration() -> Schema:
    return {
        "type": "string",
        "pattern": DURATION_PATTERN,
        "maxLength": MAX_DURATION_LENGTH,
        "x-kubernetes-validations": _rule(DURATION_RULE, f"must be at most {MAX_DURATION_TEXT}"),
    }


def _bounds() -> Schema:
    percent = {"type": "integer", "minimum": 1, "maximum": 100}
    return {
        "type": "object",
        "properties": {"maxPercent": percent, "maxIncreasePoints": percent},
        "x-kubernetes-validations": _rule(
            "has(self.maxPercent) || has(self.maxIncreasePoints)",
            "set maxPercent, maxIncreasePoints or both",
        ),
    }


def _health_checks() -> Schema:
    """``spec.healthChecks``: what a structural schema and CEL can say (a query's PromQL is
    parsed by the models: CEL cannot parse it)."""
    query = {
        "type": "object",
        "required": ["name", "promql", "healthyWhen"],
        "properties": {
            "name": {"type": "string", "pattern": DNS_LABEL_PATTERN, "maxLength": 63},
            "promql": {"type": "string", "minLength": 1, "maxLength": PROMQL_MAX},
            "healthyWhen": {"type": "string", "enum": list(COMPARISONS)},
            "threshold": {"type": "number"},
            "maxIncreasePercent": {"type": "integer", "minimum": 1, "maximum": 100_000},
        },
        "x-kubernetes-validations": _rule(
            "has(self.threshold) || has(self.maxIncreasePercent)",
            "set threshold, maxIncreasePercent or both",
        ),
    }
    return {
        "type": "object",
        "properties": {
            "cpuThrottling": _bounds(),
            "memoryHeadroom": _bounds(),
            "queries": {
                "type": "array",
                "maxItems": QUERIES_MAX,
                "items": query,
                "x-kubernetes-validations": _rule(
                    "self.all(q, self.exists_one(r, r.name == q.name))",
                    "query names must not repeat",
                ),
            },
            "autoscaler": {
                "type": "object",
                "properties": {
                    "maxGrowthPercent": {"type": "integer", "minimum": 1, "maximum": 10_000},
                    "failAtMax": {"type": "boolean", "default": True},
                },
                "x-kubernetes-validations": _rule(
                    "has(self.maxGrowthPercent) || !has(self.failAtMax) || self.failAtMax",
                    "set maxGrowthPercent, or leave failAtMax true",
                ),
            },
            "onPrometheusError": {
                "type": "string",
                "enum": ["hold", "pass", "fail"],
                "default": "hold",
            },
            "maxHold": _duration() | {"default": format_duration(DEFAULT_MAX_HOLD)},
        },
        "x-kubernetes-validations": _rule(
            "has(self.cpuThrottling) || has(self.memoryHeadroom)"
            " || (has(self.queries) && size(self.queries) > 0) || has(self.autoscaler)",
            "name at least one check: cpuThrottling, memoryHeadroom, queries or autoscaler",
        ),
    }


def _label_value() -> Schema:
    return {"type": "string", "pattern": LABEL_VALUE_PATTERN, "maxLength": LABEL_VALUE_MAX}


def _label_selector() -> Schema:
    return {
        "type": "object",
        "properties": {
            "matchLabels": {
                "type": "object",
                "maxProperties": MAX_LABELS,
                "additionalProperties": _label_value(),
                "x-kubernetes-validations": _rule(
                    LABEL_KEYS_RULE, "keys must be label keys ([prefix/]name)"
                ),
            },
            "matchExpressions": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["key", "operator"],
                    "properties": {
                        "key": {
                            "type": "string",
                            "pattern": LABEL_KEY_PATTERN,
                            "maxLength": LABEL_KEY_MAX,
                        },
                        "operator": {
                            "type": "string",
                            "enum": ["In", "NotIn", "Exists", "DoesNotExist"],
                        },
                        "values": {"type": "array", "items": _label_value()},
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
            "minItems": 1,
            "x-kubernetes-list-type": "set",
            "items": {"type": "string", "enum": [k.value for k in WorkloadKind]},
            "default": [k.value for k in DEFAULT_WORKLOAD_TYPES],
        },
    }
    if cluster:
        properties["namespaceSelector"] = {
            "type": "object",
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
    schema: Schema = {
        "type": "object",
        "required": ["monitoringPeriod", "rollbackTarget", "adoptionThresholdPercent", "backoff"],
        "properties": {
            "scope": _scope(cluster),
            "monitoringPeriod": _duration(),
            "rollbackTarget": {"type": "string", "enum": [t.value for t in RollbackTarget]},
            "adoptionThresholdPercent": {"type": "integer", "minimum": 1, "maximum": 100},
            "backoff": {
                "type": "object",
                "required": ["timePeriod", "multiplyByTurn", "maxAttempts"],
                "properties": {
                    "timePeriod": _duration(),
                    "multiplyByTurn": {"type": "integer", "minimum": 1, "maximum": 1000},
                    "maxAttempts": {"type": "integer", "minimum": 1, "maximum": 1000},
                },
                "x-kubernetes-validations": _rule(
                    BACKOFF_RULE,
                    "the longest wait, timePeriod x multiplyByTurn x maxAttempts, must be at most"
                    f" {MAX_DURATION_TEXT}",
                ),
            },
            "weight": {
                "type": "integer",
                "format": "int32",
                "minimum": WEIGHT_MIN,
                "maximum": INT32_MAX,
                "default": 0,
            },
            "enableMonitoringReopen": {"type": "boolean", "default": True},
            "healthChecks": _health_checks(),
            "earlyVerdict": {
                "type": "object",
                "properties": {
                    "confirmationPeriod": _duration()
                    | {"default": format_duration(DEFAULT_CONFIRMATION)}
                },
            },
        },
    }
    return described(schema, ClusterRollbackPolicySpec if cluster else RollbackPolicySpec)


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation holds (``X | None``, ``list[X]``, ``Annotated``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models_in(arg)]


def described(schema: Schema, model: type[BaseModel]) -> Schema:
    """Each property's description from its model field (the words live once, in
    ``workflows.policy``), recursively, so ``kubectl explain rbp.spec.backoff`` explains."""
    if model.__doc__ and "description" not in schema:
        schema["description"] = " ".join(model.__doc__.split("\n\n")[0].split())
    properties = schema.get("properties") or {}
    for name, field in model.model_fields.items():
        key = field.alias or name
        if key not in properties:
            continue
        # Its own copy: pydantic may hand two fields of one type the same dict, and one field's
        # words would become the other's (and a YAML anchor between them).
        prop = properties[key] = copy.deepcopy(properties[key])
        if field.description:
            prop["description"] = field.description
        for inner in _models_in(field.annotation):
            described(prop["items"] if prop.get("type") == "array" else prop, inner)
    return schema


_COUNT = {"type": "integer", "format": "int32", "minimum": 0}

# The status the engine writes (``workflows.policy_status``), field names as the reference engine's.
STATUS_SCHEMA: Schema = {
    "type": "object",
    "description": "What the engine observed of this policy; written by the leading intake.",
    "properties": {
        "observedGeneration": {
            "type": "integer",
            "format": "int64",
            "minimum": 0,
            "description": "The spec generation this status describes.",
        },
        "activeTrackedWorkloads": _COUNT
        | {"description": "Workloads in monitoring, rollingBack or backingOff under this policy."},
        "failedWorkloads": _COUNT
        | {"description": "Workloads in failedPermanent under this policy."},
        "lastErrorSummary": {
            "type": "string",
            "maxLength": SUMMARY_MAX,
            "description": "The newest problem seen: a rollback's reason and workload, or why"
            " the policy is ignored.",
        },
        "conditions": {
            "type": "array",
            "description": "Ready: the policy is valid and not shadowed by another;"
            " WorkloadsMatched: it applies to at least one workload.",
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
            "items": {  # metav1.Condition, as Kubernetes declares and describes it
                "type": "object",
                "description": "Condition contains details for one aspect of the current state"
                " of this API Resource.",
                "required": ["type", "status", "lastTransitionTime", "reason", "message"],
                "properties": {
                    "type": {
                        "type": "string",
                        "maxLength": 316,
                        "description": "type of condition in CamelCase.",
                    },
                    "status": {
                        "type": "string",
                        "enum": ["True", "False", "Unknown"],
                        "description": "status of the condition, one of True, False, Unknown.",
                    },
                    "observedGeneration": {
                        "type": "integer",
                        "format": "int64",
                        "minimum": 0,
                        "description": "the .metadata.generation that the condition was set"
                        " based upon.",
                    },
                    "lastTransitionTime": {
                        "type": "string",
                        "format": "date-time",
                        "description": "the last time the condition transitioned from one"
                        " status to another.",
                    },
                    "reason": {
                        "type": "string",
                        "minLength": 1,
                        "maxLength": 1024,
                        "pattern": "^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
                        "description": "a programmatic identifier indicating the reason for"
                        " the condition's last transition.",
                    },
                    "message": {
                        "type": "string",
                        "maxLength": 32768,
                        "description": "a human readable message indicating details about the"
                        " transition.",
                    },
                },
            },
        },
    },
}

# What an operator scans for; ``rollbackctl get policies`` prints the same columns.
PRINTER_COLUMNS: list[Schema] = [
    {
        "name": "Ready",
        "type": "string",
        "jsonPath": f'.status.conditions[?(@.type=="{READY}")].status',
    },
    {"name": "Active", "type": "integer", "jsonPath": ".status.activeTrackedWorkloads"},
    {"name": "Failed", "type": "integer", "jsonPath": ".status.failedWorkloads"},
    {"name": "Weight", "type": "integer", "jsonPath": ".spec.weight"},
    {"name": "Target", "type": "string", "jsonPath": ".spec.rollbackTarget", "priority": 1},
    {"name": "Monitoring", "type": "string", "jsonPath": ".spec.monitoringPeriod", "priority": 1},
    {
        "name": "Threshold",
        "type": "integer",
        "jsonPath": ".spec.adoptionThresholdPercent",
        "priority": 1,
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


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
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "required": ["spec"],
                            "x-kubernetes-validations": _rule(
                                NAME_RULE, "metadata.name must be a DNS-1123 subdomain"
                            ),
                            "description": (
                                ClusterRollbackPolicy if cluster else RollbackPolicy
                            ).__doc__,
                            "properties": {
                                "apiVersion": {
                                    "type": "string",
                                    "description": "APIVersion defines the versioned schema of"
                                    " this representation of an object.",
                                },
                                "kind": {
                                    "type": "string",
                                    "description": "Kind is a string value representing the"
                                    " REST resource this object represents.",
                                },
                                "metadata": {
                                    "type": "object",
                                    "description": "Standard object's metadata.",
                                },
                                "spec": spec_schema(cluster),
                                "status": STATUS_SCHEMA,
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
