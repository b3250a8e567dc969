"""What kubectl asks an API server before anything else, answered for the emulator's types.

- Discovery: ``/api`` (APIVersions), ``/apis`` (APIGroupList), ``/api/v1`` and
  ``/apis/<group>/<version>`` (APIResourceList: names, kinds, verbs, short names, categories,
  subresources), so ``kubectl api-resources``, ``get``, ``describe``, ``apply`` and ``delete``
  resolve ``rbp``, ``deploy`` or ``events`` as on a real cluster. The aggregated form
  (``apidiscovery.k8s.io/v2``) is not served: kubectl falls back to these.
- OpenAPI v3 (``/openapi/v3`` and one document per group version): each kind's PATCH operation
  with the ``fieldValidation`` parameter, which is how kubectl learns that the server validates
  fields itself (``kubectl apply`` then sends ``fieldValidation=Strict`` instead of validating
  client-side), and the schema of each custom resource from its stored CRD (``kubectl explain
  rbp.spec.backoff``). The built-in kinds' schemas are not served.
- Table output (``Accept: application/json;as=Table;g=meta.k8s.io;v=v1``), for lists, single
  objects and watch events: the built-in kinds' columns as Kubernetes prints them
  (``sim.columns``: ``kubectl get pods`` shows READY, STATUS, RESTARTS, ``get events`` LAST SEEN,
  TYPE, REASON, OBJECT, MESSAGE); a custom resource's printer columns from its stored
  CustomResourceDefinition (``kubectl apply -k deploy/crds``), so ``kubectl get rbp`` shows
  READY, ACTIVE, FAILED as on a cluster and ``-o wide`` adds the priority columns; else Name and
  Age.
- The CRD schema's defaults on every stored policy (``weight: 0``, ``enableMonitoringReopen:
  true``, ``scope.workloadTypes``), as an API server fills them in.
- Validation of the policy kinds on every write, by the same models the engine uses (they accept
  and reject what the CRD schema does: ``tests/unit/test_crd_schema.py``), answered as a real API
  server answers: 422 ``Invalid`` with one cause per field path.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from sim.columns import AGE, BUILT_IN, NAME, Column
from workflows.contract import DEFAULT_WORKLOAD_TYPES, Obj
from workflows.jsonpath import age, jsonpath
from workflows.policy import POLICY_KINDS

VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]
SHORT_NAMES = {
    "pods": ["po"],
    "events": ["ev"],
    "namespaces": ["ns"],
    "nodes": ["no"],
    "configmaps": ["cm"],
    "resourcequotas": ["quota"],
    "limitranges": ["limits"],
    "deployments": ["deploy"],
    "replicasets": ["rs"],
    "statefulsets": ["sts"],
    "daemonsets": ["ds"],
    "cronjobs": ["cj"],
    "rollouts": ["ro"],
    "rollbackpolicies": ["rbp"],
    "clusterrollbackpolicies": ["crbp"],
}
CATEGORIES = {"rollbackpolicies": ["rightsizing"], "clusterrollbackpolicies": ["rightsizing"]}


def api_versions() -> Obj:
    return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}


def api_groups(types: list[Any]) -> Obj:
    groups: dict[str, list[str]] = {}
    for t in types:
        if t.group:
            versions = groups.setdefault(t.group, [])
            if t.version not in versions:
                versions.append(t.version)
    return {
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [
            {
                "name": name,
                "versions": [{"groupVersion": f"{name}/{v}", "version": v} for v in versions],
                "preferredVersion": {
                    "groupVersion": f"{name}/{versions[0]}",
                    "version": versions[0],
                },
            }
            for name, versions in groups.items()
        ],
    }


def resource_list(types: list[Any], group: str, version: str) -> Obj | None:
    """The APIResourceList of one group version (None: not served)."""
    served = [t for t in types if t.group == group and t.version == version]
    if not served:
        return None
    resources: list[Obj] = []
    for t in served:
        resources.append(
            {
                "name": t.plural,
                "singularName": t.kind.lower(),
                "namespaced": t.namespaced,
                "kind": t.kind,
                "verbs": VERBS,
                "shortNames": SHORT_NAMES.get(t.plural, []),
                "categories": CATEGORIES.get(t.plural, []),
            }
        )
        if t.status_subresource:
            resources.append(
                {
                    "name": f"{t.plural}/status",
                    "singularName": "",
                    "namespaced": t.namespaced,
                    "kind": t.kind,
                    "verbs": ["get", "patch", "update"],
                }
            )
        if t.plural == "pods":
            resources.append(
                {
                    "name": "pods/resize",
                    "singularName": "",
                    "namespaced": True,
                    "kind": "Pod",
                    "verbs": ["get", "patch", "update"],
                }
            )
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/{version}" if group else version,
        "resources": resources,
    }


def _prefix(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


def openapi_root(types: list[Any]) -> Obj:
    versions = {(t.group, t.version) for t in types}
    return {
        "paths": {
            _prefix(g, v): {"serverRelativeURL": f"/openapi/v3/{_prefix(g, v)}?hash=emulator"}
            for g, v in sorted(versions)
        }
    }


def openapi_document(
    types: list[Any], group: str, version: str, crds: list[Obj] | None = None
) -> Obj | None:
    served = [t for t in types if t.group == group and t.version == version]
    if not served:
        return None
    schemas: Obj = {}
    for crd in crds or []:  # a custom resource's schema, from its stored CRD (kubectl explain)
        spec = crd.get("spec") or {}
        if spec.get("group") != group:
            continue
        for v in spec.get("versions") or []:
            schema = (v.get("schema") or {}).get("openAPIV3Schema")
            if v.get("name") == version and schema:
                kind = (spec.get("names") or {}).get("kind")
                name = ".".join([*reversed(group.split(".")), version, str(kind)])
                gvk = {"group": group, "version": version, "kind": kind}
                schemas[name] = schema | {"x-kubernetes-group-version-kind": [gvk]}
    paths: Obj = {}
    for t in served:
        scope = "namespaces/{namespace}/" if t.namespaced else ""
        paths[f"/{_prefix(group, version)}/{scope}{t.plural}/{{name}}"] = {
            "patch": {
                "x-kubernetes-group-version-kind": {
                    "group": group,
                    "version": version,
                    "kind": t.kind,
                },
                "x-kubernetes-action": "patch",
                "parameters": [
                    {"name": "fieldValidation", "in": "query", "schema": {"type": "string"}},
                    {"name": "fieldManager", "in": "query", "schema": {"type": "string"}},
                ],
                "responses": {"200": {"description": "OK"}},
            }
        }
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes (emulator)", "version": "v1.34.0"},
        "paths": paths,
        "components": {"schemas": schemas},
    }


def default_policy(obj: Obj) -> None:
    """Fill in what the policy CRDs default (``cli.crds``), in place; other kinds untouched."""
    spec = obj.get("spec")
    if obj.get("kind") not in POLICY_KINDS or not isinstance(spec, dict):
        return
    spec.setdefault("weight", 0)
    spec.setdefault("enableMonitoringReopen", True)
    scope = spec.setdefault("scope", {})
    if isinstance(scope, dict):
        scope.setdefault("workloadTypes", [k.value for k in DEFAULT_WORKLOAD_TYPES])


# What the API server fills in for a workload's rollout (apps/v1 defaulting), so the cluster's
# objects read as a real one's (``kubectl describe deploy``: ``StrategyType: RollingUpdate``).
_ROLLOUT_DEFAULTS: dict[str, tuple[str, Obj]] = {
    "Deployment": ("strategy", {"maxUnavailable": "25%", "maxSurge": "25%"}),
    "StatefulSet": ("updateStrategy", {"partition": 0}),
    "DaemonSet": ("updateStrategy", {"maxUnavailable": 1, "maxSurge": 0}),
}


def default_workload(obj: Obj) -> None:
    """Fill in a workload's rollout strategy as the API server does, in place: the type
    ``RollingUpdate`` and, for that type, the rolling update's fields left out."""
    spec = obj.get("spec")
    if obj.get("kind") not in _ROLLOUT_DEFAULTS or not isinstance(spec, dict):
        return
    field, rolling = _ROLLOUT_DEFAULTS[str(obj["kind"])]
    strategy = spec.setdefault(field, {})
    if not isinstance(strategy, dict):
        return
    strategy.setdefault("type", "RollingUpdate")
    if strategy["type"] == "RollingUpdate" and isinstance(
        strategy.setdefault("rollingUpdate", {}), dict
    ):
        for key, value in rolling.items():
            strategy["rollingUpdate"].setdefault(key, value)


def invalid_policy(obj: Obj) -> Obj | None:
    """The 422 Status a real API server with our CRD returns for ``obj``, or None when valid."""
    model = POLICY_KINDS.get(str(obj.get("kind")))
    if model is None:
        return None
    try:
        model.model_validate(obj)
    except ValidationError as exc:
        causes = []
        for error in exc.errors():
            field = ".".join(str(p) for p in error["loc"] if not str(p).startswith("function-"))
            value = error.get("input")
            shown = value if isinstance(value, str | int | float | bool) else "object"
            causes.append(
                {
                    "reason": "FieldValueInvalid",
                    "message": f"Invalid value: {json.dumps(shown)}: {error['msg']}",
                    "field": field,
                }
            )
        name = (obj.get("metadata") or {}).get("name", "")
        summary = "; ".join(f"{c['field']}: {c['message']}" for c in causes)
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": f'{obj["kind"]}.rightsizing.kubex.ai "{name}" is invalid: {summary}',
            "reason": "Invalid",
            "details": {
                "name": name,
                "group": "rightsizing.kubex.ai",
                "kind": obj["kind"],
                "causes": causes,
            },
            "code": 422,
        }
    return None


def wants_table(accept: str) -> bool:
    return "as=Table" in accept


def _crd_column(column: Obj) -> Column:
    path, is_date = column["jsonPath"], column["type"] == "date"

    def cell(obj: Obj, now: datetime) -> Any:
        value = jsonpath(obj, path)
        return age(value, now) if is_date else value

    return Column(
        column["name"],
        column["type"],
        cell,
        column.get("priority", 0),
        column.get("description", ""),
    )


def printer_columns(crds: list[Obj], group: str, version: str, plural: str) -> list[Column]:
    """A kind's columns: a built-in kind's as Kubernetes prints it (``sim.columns``), a custom
    resource's from its CRD's printer columns, else Name and Age."""
    if (group, plural) in BUILT_IN:
        return BUILT_IN[(group, plural)]
    for crd in crds:
        spec = crd.get("spec") or {}
        if spec.get("group") != group or (spec.get("names") or {}).get("plural") != plural:
            continue
        for v in spec.get("versions") or []:
            if v.get("name") == version and v.get("additionalPrinterColumns"):
                return [NAME, *(_crd_column(c) for c in v["additionalPrinterColumns"])]
    return [NAME, AGE]


def table(objects: list[Obj], columns: list[Column], resource_version: str) -> Obj:
    now = datetime.now(UTC)
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": [c.definition() for c in columns],
        "rows": [
            {
                "cells": [c.cell(o, now) for c in columns],
                "object": {
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": o["metadata"],
                },
            }
            for o in objects
        ],
    }
