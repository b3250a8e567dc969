"""The CRD schemas and the models accept and reject the same documents.

The CRD's OpenAPI v3 schema is checked with ``jsonschema``, the way the API server applies it
under strict field validation (``kubectl apply`` defaults to ``--validate=strict``): a property
that the schema does not declare is an error, and ``x-kubernetes-list-type: set`` means unique
items. The CEL rules (``x-kubernetes-validations``) are evaluated by a CEL interpreter
(``cel-python``), the rule text exactly as the API server gets it; a rule that errors (a
duration that overflows) rejects the document, as on the server. Also: the committed YAML is
exactly what ``cli.crds`` generates, and the schema is
structural (no types or defaults inside ``oneOf``; every object declares its properties).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterator
from typing import Any

import celpy
import jsonschema
import pytest
import yaml

from cli import crds
from cli.crds import CRDS
from tests.conftest import ROOT
from tests.unit.policy_table import CASES
from workflows.contract import DEFAULT_WORKLOAD_TYPES
from workflows.durations import DURATION_PATTERN
from workflows.policy import ClusterRollbackPolicySpec, RollbackPolicySpec

CEL = celpy.Environment()


@functools.cache
def _cel_program(rule: str) -> Any:
    return CEL.program(CEL.compile(rule))


def _cel(validator: Any, rules: list[dict[str, str]], instance: Any, schema: Any) -> Any:
    """The ``x-kubernetes-validations`` keyword: every rule must evaluate to true."""
    for rule in rules:
        try:
            ok = _cel_program(rule["rule"]).evaluate({"self": celpy.json_to_cel(instance)})
        except Exception as exc:  # evaluation errors reject the object, as on the server
            ok = exc
        if ok is not True and not (isinstance(ok, celpy.celtypes.BoolType) and bool(ok)):
            yield jsonschema.ValidationError(f"{rule['message']} ({rule['rule']}: {ok})")


Validator = jsonschema.validators.extend(
    jsonschema.Draft7Validator, {"x-kubernetes-validations": _cel}
)


def _as_server(schema: Any) -> Any:
    """Translate the Kubernetes extensions into plain JSON Schema, recursively (the CEL rules
    stay, for ``_cel``)."""
    if isinstance(schema, list):
        return [_as_server(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {
        k: v if k == "x-kubernetes-validations" else _as_server(v)
        for k, v in schema.items()
        if not k.startswith("x-kubernetes") or k == "x-kubernetes-validations"
    }
    if schema.get("x-kubernetes-list-type") == "set":
        out["uniqueItems"] = True
    if (
        "properties" in schema
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
        and "type" in schema  # a oneOf branch only narrows the outer object
    ):
        out["additionalProperties"] = False
    return out


def _load(filename: str) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((ROOT / "deploy" / "crds" / filename).read_text())
    return document


SCHEMAS = {
    "RollbackPolicy": _load("rollbackpolicies.yaml"),
    "ClusterRollbackPolicy": _load("clusterrollbackpolicies.yaml"),
}


def _openapi(kind: str) -> dict[str, Any]:
    schema: dict[str, Any] = SCHEMAS[kind]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def _apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """Defaulting as the API server does it, so defaulted documents are validated too."""
    if not isinstance(value, dict) or "properties" not in schema:
        return value
    for name, sub in schema["properties"].items():
        if name not in value and "default" in sub:
            value[name] = copy.deepcopy(sub["default"])
        if name in value:
            value[name] = _apply_defaults(sub, value[name])
    return value


def crd_errors(doc: dict[str, Any]) -> list[str]:
    schema = _openapi(doc["kind"])
    defaulted = _apply_defaults(schema, copy.deepcopy(doc))
    validator = Validator(_as_server(schema))
    return [".".join(str(p) for p in e.absolute_path) for e in validator.iter_errors(defaulted)]


@pytest.mark.parametrize(("doc", "bad_path"), CASES)
def test_crd_agrees_with_models(doc: dict[str, Any], bad_path: str | None) -> None:
    errors = crd_errors(doc)
    if bad_path is None:
        assert errors == []
    else:
        assert errors, f"CRD schema accepted a document the models reject at {bad_path}"


def test_committed_crds_are_generated() -> None:
    for filename, document in crds.CRDS.items():
        committed = (ROOT / "deploy" / "crds" / filename).read_text()
        assert committed == crds.render(document), (
            f"run: rollbackctl crds --write deploy/crds ({filename})"
        )


def test_crd_carries_defaults_patterns_and_columns() -> None:
    spec = _openapi("ClusterRollbackPolicy")["properties"]["spec"]
    assert spec["properties"]["monitoringPeriod"]["pattern"] == DURATION_PATTERN
    assert spec["properties"]["weight"]["default"] == 0
    assert spec["properties"]["enableMonitoringReopen"]["default"] is True
    scope = spec["properties"]["scope"]["properties"]
    assert scope["workloadTypes"]["default"] == [k.value for k in DEFAULT_WORKLOAD_TYPES]
    version = SCHEMAS["RollbackPolicy"]["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["Weight"] == ".spec.weight"
    assert columns["Target"] == ".spec.rollbackTarget"
    assert columns["Monitoring"] == ".spec.monitoringPeriod"
    assert columns["Age"] == ".metadata.creationTimestamp"
    assert SCHEMAS["RollbackPolicy"]["spec"]["names"]["shortNames"] == ["rbp"]
    assert SCHEMAS["ClusterRollbackPolicy"]["spec"]["scope"] == "Cluster"


def _walk(schema: Any, inside_junctor: bool = False) -> list[str]:
    problems = []
    if isinstance(schema, dict):
        if inside_junctor and (
            {"type", "default", "description", "additionalProperties"} & schema.keys()
        ):
            problems.append(f"type/default inside oneOf: {schema}")
        if not inside_junctor and schema.get("type") == "object":
            declared = {
                "properties",
                "additionalProperties",
                "x-kubernetes-preserve-unknown-fields",
            }
            if not declared & schema.keys() and schema is not None:
                problems.append("object without properties")
        for key, value in schema.items():
            if key in ("oneOf", "anyOf", "allOf", "not"):
                for branch in value if isinstance(value, list) else [value]:
                    problems += _walk(branch, True)
            elif key in ("properties",):
                for sub in value.values():
                    problems += _walk(sub, inside_junctor)
            elif key in ("items", "additionalProperties"):
                problems += _walk(value, inside_junctor)
    return problems


@pytest.mark.parametrize("kind", sorted(SCHEMAS))
def test_schema_is_structural(kind: str) -> None:
    spec = _openapi(kind)["properties"]["spec"]
    assert _walk(spec) == []


def _properties(schema: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    for name, prop in (schema.get("properties") or {}).items():
        yield f"{path}.{name}", prop
        yield from _properties(prop, f"{path}.{name}")
        if isinstance(prop.get("items"), dict):
            yield from _properties(prop["items"], f"{path}.{name}[]")


@pytest.mark.parametrize("filename", sorted(CRDS))
def test_every_crd_field_has_a_description_from_the_models(filename: str) -> None:
    """``kubectl explain rbp.spec.backoff`` explains every field, on any cluster: the words
    come from the models' field docs (``cli.crds.described``)."""
    schema = CRDS[filename]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    missing = [p for p, prop in _properties(schema) if not prop.get("description")]
    assert missing == []
    crd = dict(_properties(schema["properties"]["spec"], "spec"))
    model = ClusterRollbackPolicySpec if filename.startswith("cluster") else RollbackPolicySpec
    described = dict(_model_descriptions(model))
    assert described["spec.backoff.maxAttempts"]  # the walk reaches nested fields
    wrong = {
        p: (crd[p]["description"], d) for p, d in described.items() if crd[p]["description"] != d
    }
    assert wrong == {}  # each field its own words: maxPercent was once maxIncreasePoints's
    assert "&id" not in (ROOT / "deploy" / "crds" / filename).read_text()  # no YAML anchors


def _model_descriptions(model: Any, path: str = "spec") -> Iterator[tuple[str, str]]:
    """Each field's description from the models, by its path as ``_properties`` names it."""
    for name, info in model.model_fields.items():
        wire = f"{path}.{info.alias or name}"
        if info.description:
            yield wire, info.description
        for inner in crds._models_in(info.annotation):
            yield from _model_descriptions(
                inner, f"{wire}[]" if _is_list(info.annotation) else wire
            )


def _model_paths(model: Any, path: str = "") -> Iterator[str]:
    """Every field a model accepts, by its wire name, nested models' fields within."""
    for name, info in model.model_fields.items():
        wire = f"{path}.{info.alias or name}"
        yield wire
        for inner in crds._models_in(info.annotation):
            yield from _model_paths(inner, f"{wire}[]" if _is_list(info.annotation) else wire)


def _is_list(annotation: Any) -> bool:
    return "list[" in str(annotation)


@pytest.mark.parametrize("filename", sorted(CRDS))
def test_the_crd_has_every_field_the_models_accept(filename: str) -> None:
    """A field the models accept but the CRD's structural schema does not name is pruned by the
    API server, silently: the policy as applied would not be the policy as written."""
    schema = CRDS[filename]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    spec = schema["properties"]["spec"]
    kind = CRDS[filename]["spec"]["names"]["kind"]
    model = (
        crds.ClusterRollbackPolicySpec if kind == "ClusterRollbackPolicy" else RollbackPolicySpec
    )
    named = {p for p, _ in _properties(spec)}
    assert sorted(set(_model_paths(model)) - named) == []
