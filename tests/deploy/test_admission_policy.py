"""The least-privilege ValidatingAdmissionPolicy (deploy/components/least-privilege), evaluated
as the API server evaluates one: its match condition, its variables in order, then every
validation, each a CEL expression run by a real CEL evaluator (cel-python) on the request's
``object`` and ``oldObject``. What the worker and the intake write passes; anything else they
might write on a workload (its spec, labels, another annotation, the recommendation itself,
owner references) is refused; another user's writes are not judged. Until the tests run on a
real control plane, this is the policy's proof."""

from __future__ import annotations

import copy
from typing import Any

import celpy
import kubernetes_validate
import pytest
import yaml

from activities.owners import OWNER_KINDS
from tests.conftest import ROOT
from tests.deploy.test_chart import K8S_VERSION, NAMESPACE, template
from workflows.contract import (
    CONTROL_ANNOTATION,
    ROLLBACK_LIMITS_ANNOTATION,
    ROLLBACK_REQUESTS_ANNOTATION,
    ROLLBACK_STATE_ANNOTATION,
)

POLICY_FILE = ROOT / "deploy" / "components" / "least-privilege" / "admission-policy.yaml"
POLICY = next(d for d in yaml.safe_load_all(POLICY_FILE.read_text())
              if d["kind"] == "ValidatingAdmissionPolicy")  # fmt: skip
WORKER = "system:serviceaccount:rightsizing-rollback:rollback-worker"
INTAKE = "system:serviceaccount:rightsizing-rollback:rollback-intake"
CEL = celpy.Environment()


def _run(expression: str, activation: dict[str, Any]) -> Any:
    return CEL.program(CEL.compile(expression)).evaluate(activation)


def refusal(user: str, old: dict[str, Any], new: dict[str, Any]) -> str | None:
    """Why the policy refuses ``user``'s update of ``old`` into ``new``: the message of the
    first validation that is false; None when admitted, or not judged (not the engine). An
    expression that errs raises here: the cases below must be judged, not crash."""
    spec = POLICY["spec"]
    activation: dict[str, Any] = {
        "request": celpy.json_to_cel({"userInfo": {"username": user}}),
        "object": celpy.json_to_cel(new),
        "oldObject": celpy.json_to_cel(old),
    }
    if not all(_true(_run(c["expression"], activation)) for c in spec["matchConditions"]):
        return None
    known: dict[Any, Any] = {}
    for variable in spec["variables"]:  # each sees those before it, as on the server
        activation["variables"] = celpy.celtypes.MapType(known)
        known[celpy.celtypes.StringType(variable["name"])] = _run(
            variable["expression"], activation
        )
    activation["variables"] = celpy.celtypes.MapType(known)
    for validation in spec["validations"]:
        if not _true(_run(validation["expression"], activation)):
            return str(validation["message"])
    return None


def _true(value: Any) -> bool:
    if isinstance(value, Exception):
        raise value
    return value is True or (isinstance(value, celpy.celtypes.BoolType) and bool(value))


def deployment(**annotations: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "api", "namespace": "shop", "labels": {"app": "api"},
            "annotations": {"deployment.kubernetes.io/revision": "3", **annotations},
            "ownerReferences": [],
        },
        "spec": {"replicas": 3, "template": {"spec": {"containers": [
            {"name": "app", "resources": {"requests": {"memory": "512Mi"}}}]}}},
    }  # fmt: skip


def changed(obj: dict[str, Any], *path: str, to: Any) -> dict[str, Any]:
    new = copy.deepcopy(obj)
    where = new
    for key in path[:-1]:
        where = where.setdefault(key, {})
    if to is None:
        where.pop(path[-1], None)
    else:
        where[path[-1]] = to
    return new


STATE = '{"mode": "backingOff"}'
PUBLISHED = '{"app": {"memory": "768Mi"}}'
NOTES = ("metadata", "annotations")
CUT = "static.rightsizing.kubex.ai/desired-resource-requests"
REVISION = "deployment.kubernetes.io/revision"
CONTROLLER = "system:serviceaccount:kube-system:deployment-controller"
BEFORE = deployment()
RECORDED = changed(BEFORE, *NOTES, ROLLBACK_STATE_ANNOTATION, to=STATE)
HALF = changed(BEFORE, *NOTES, ROLLBACK_REQUESTS_ANNOTATION, to=PUBLISHED)
ROLLED_BACK = changed(HALF, *NOTES, ROLLBACK_LIMITS_ANNOTATION, to=PUBLISHED)


@pytest.mark.parametrize(
    ("user", "old", "new"),
    [
        pytest.param(WORKER, BEFORE, RECORDED, id="a-state-recorded"),
        pytest.param(WORKER, BEFORE, ROLLED_BACK, id="a-rollback-published"),
        pytest.param(WORKER, ROLLED_BACK, BEFORE, id="a-rollback-cleared"),
        pytest.param(INTAKE, deployment(**{CONTROL_ANNOTATION: "cancel"}), BEFORE,
                     id="a-control-removed"),
        pytest.param(CONTROLLER, BEFORE, changed(BEFORE, "spec", "replicas", to=5),
                     id="another-user-is-not-judged"),
    ],
)  # fmt: skip
def test_what_the_engine_writes_is_admitted(
    user: str, old: dict[str, Any], new: dict[str, Any]
) -> None:
    assert refusal(user, old, new) is None


@pytest.mark.parametrize(
    ("new", "why"),
    [
        pytest.param(changed(BEFORE, "spec", "template", "spec", "containers",
                             to=[{"name": "app", "image": "evil"}]), "spec", id="the-template"),
        pytest.param(changed(BEFORE, "spec", "replicas", to=0), "spec", id="the-replicas"),
        pytest.param(changed(BEFORE, "metadata", "labels", "app", to="b"), "labels", id="a-label"),
        pytest.param(changed(BEFORE, "metadata", "labels", to=None), "labels", id="no-labels"),
        pytest.param(changed(BEFORE, *NOTES, CUT, to=PUBLISHED), "annotations", id="a-cut"),
        pytest.param(changed(BEFORE, *NOTES, REVISION, to=None), "annotations",
                     id="another-annotation-removed"),
        pytest.param(changed(BEFORE, *NOTES, REVISION, to="9"), "annotations",
                     id="another-annotation-changed"),
        pytest.param(changed(BEFORE, "metadata", "ownerReferences", to=[{"kind": "X"}]),
                     "owner references", id="an-owner-reference"),
        pytest.param(changed(BEFORE, "metadata", "finalizers", to=["hold"]), "owner references",
                     id="a-finalizer"),
    ],
)  # fmt: skip
def test_anything_else_the_engine_might_write_is_refused(new: dict[str, Any], why: str) -> None:
    for user in (WORKER, INTAKE):
        said = refusal(user, BEFORE, new)
        assert said is not None and why in said, (user, said)


def test_it_names_the_contracts_annotations_and_every_workload_kind() -> None:
    """The keys it lets through are the contract's (one name, one place), and it judges every
    kind the engine may patch, and pods."""
    ours = _run(POLICY["spec"]["variables"][0]["expression"], {})
    assert set(ours) == {ROLLBACK_STATE_ANNOTATION, ROLLBACK_REQUESTS_ANNOTATION,
                         ROLLBACK_LIMITS_ANNOTATION, CONTROL_ANNOTATION}  # fmt: skip
    judged = {(g, r) for rule in POLICY["spec"]["matchConstraints"]["resourceRules"]
              for g in rule["apiGroups"] for r in rule["resources"]}  # fmt: skip
    assert {(k.group, k.plural) for k in OWNER_KINDS.values()} | {("", "pods")} <= judged
    assert all(rule["operations"] == ["UPDATE"]
               for rule in POLICY["spec"]["matchConstraints"]["resourceRules"])  # fmt: skip


def test_the_chart_installs_the_same_policy_for_its_release() -> None:
    """``admissionPolicy.enabled``: the component's two objects, valid for Kubernetes, naming
    the release's namespace and ServiceAccounts; the rest of the policy as the component's. Off
    by default (it needs Kubernetes 1.30)."""
    assert not [o for o in template() if o["kind"].startswith("ValidatingAdmissionPolicy")]
    objects = template(sets=("admissionPolicy.enabled=true", "worker.serviceAccount.name=w"))
    rendered = {o["kind"]: o for o in objects if o["kind"].startswith("ValidatingAdmission")}
    component = {d["kind"]: d for d in yaml.safe_load_all(POLICY_FILE.read_text())}
    assert rendered.keys() == component.keys()
    for obj in rendered.values():
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    condition = rendered["ValidatingAdmissionPolicy"]["spec"]["matchConditions"][0]["expression"]
    assert f"system:serviceaccount:{NAMESPACE}:w" in condition
    assert f"system:serviceaccount:{NAMESPACE}:rollback-intake" in condition
    binding = rendered["ValidatingAdmissionPolicyBinding"]
    assert binding["spec"] == component["ValidatingAdmissionPolicyBinding"]["spec"]
    same = {**rendered["ValidatingAdmissionPolicy"]["spec"], "matchConditions": None}
    assert same == {**POLICY["spec"], "matchConditions": None}
