"""Label selectors, namespace patterns and policy precedence, including the spec's examples."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.conftest import EXAMPLES, policy_doc
from workflows.contract import WorkloadKind
from workflows.policy import POLICY_KINDS, AnyPolicy, LabelSelector, NamespaceSelector
from workflows.selection import PolicyIndex, Protection, WorkloadRef, resolve
from workflows.state import PolicyRef


def load(name: str) -> AnyPolicy:
    doc = yaml.safe_load((EXAMPLES / name).read_text())
    return POLICY_KINDS[doc["kind"]].model_validate(doc)


def build(
    doc: dict[str, Any], created: str | None = None, namespace: str | None = None
) -> AnyPolicy:
    if created:
        doc["metadata"]["creationTimestamp"] = created
    if namespace:
        doc["metadata"]["namespace"] = namespace
    return POLICY_KINDS[doc["kind"]].model_validate(doc)


STOREFRONT = {"app.kubernetes.io/part-of": "storefront", "tier": "api", "rollback-enabled": "true"}


def workload(kind: str = "Deployment", namespace: str = "production", **labels: str) -> WorkloadRef:
    return WorkloadRef(WorkloadKind(kind), namespace, "w", labels or dict(STOREFRONT))


SPEC_SELECTOR = LabelSelector.model_validate(
    {
        "matchLabels": {"app.kubernetes.io/part-of": "storefront"},
        "matchExpressions": [{"key": "tier", "operator": "In", "values": ["api", "worker"]}],
    }
)


@pytest.mark.parametrize(
    ("labels", "matches"),
    [
        pytest.param({"app.kubernetes.io/part-of": "storefront", "tier": "api"}, True, id="api"),
        pytest.param(
            {"app.kubernetes.io/part-of": "storefront", "tier": "worker"}, True, id="worker"
        ),
        pytest.param({"app.kubernetes.io/part-of": "storefront", "tier": "db"}, False, id="db"),
        pytest.param({"app.kubernetes.io/part-of": "storefront"}, False, id="no-tier"),
        pytest.param({"tier": "api"}, False, id="no-part-of"),
    ],
)
def test_spec_label_selector(labels: dict[str, str], matches: bool) -> None:
    assert SPEC_SELECTOR.matches(labels) is matches


@pytest.mark.parametrize(
    ("operator", "values", "labels", "matches"),
    [
        ("NotIn", ["dev"], {}, True),
        ("NotIn", ["dev"], {"k": "dev"}, False),
        ("NotIn", ["dev"], {"k": "prod"}, True),
        ("Exists", [], {"k": ""}, True),
        ("Exists", [], {}, False),
        ("DoesNotExist", [], {}, True),
        ("DoesNotExist", [], {"k": "x"}, False),
    ],
)
def test_expression_operators(
    operator: str, values: list[str], labels: dict[str, str], matches: bool
) -> None:
    selector = LabelSelector.model_validate(
        {"matchExpressions": [{"key": "k", "operator": operator, "values": values}]}
    )
    assert selector.matches(labels) is matches


def test_empty_selector_matches_everything() -> None:
    assert LabelSelector().matches({}) and LabelSelector().matches({"a": "b"})


@pytest.mark.parametrize(
    ("values", "namespace", "hit"),
    [
        pytest.param(["prod-*", "staging"], "prod-eu", True, id="prefix-wildcard"),
        pytest.param(["prod-*", "staging"], "prod-", True, id="wildcard-matches-empty"),
        pytest.param(["prod-*", "staging"], "staging", True, id="exact"),
        pytest.param(["prod-*", "staging"], "staging-2", False, id="exact-is-anchored"),
        pytest.param(["prod-*", "staging"], "preprod-eu", False, id="anchored-start"),
        pytest.param(["prod-*", "staging"], "production", False, id="dash-is-literal"),
        pytest.param(["*-sandbox"], "team-a-sandbox", True, id="suffix-wildcard"),
        pytest.param(["a*b*c"], "axxbyyc", True, id="several-wildcards"),
        pytest.param(["*"], "anything", True, id="star-alone"),
    ],
)
def test_namespace_patterns(values: list[str], namespace: str, hit: bool) -> None:
    assert NamespaceSelector(operator="In", values=values).matches(namespace) is hit
    assert NamespaceSelector(operator="NotIn", values=values).matches(namespace) is not hit


def test_spec_examples_select_as_documented() -> None:
    namespaced = load("production-rollback.yaml")
    cluster = load("production-cluster-rollback.yaml")
    both = [cluster, namespaced]

    in_production = resolve(both, workload(namespace="production"))
    assert in_production.policy is namespaced

    in_prod_eu = resolve(both, workload(namespace="prod-eu"))
    assert in_prod_eu.policy is cluster
    assert "namespaced to 'production'" in in_prod_eu.candidates[0].reason

    opted_out = resolve(both, workload(namespace="prod-eu", tier="api"))
    assert opted_out.policy is None
    assert all(not c.matched for c in opted_out.candidates)

    cronjob_in_staging = resolve(both, workload("CronJob", namespace="staging"))
    assert cronjob_in_staging.policy is cluster
    job = resolve(both, workload("Job", namespace="staging"))
    assert job.policy is None
    assert "workload type Job not in workloadTypes" in job.candidates[1].reason


def test_namespaced_beats_cluster_whatever_the_weight() -> None:
    heavy_cluster = build(policy_doc("ClusterRollbackPolicy", "heavy", weight=1000))
    light_local = build(policy_doc("RollbackPolicy", "light", weight=0), namespace="production")
    result = resolve([heavy_cluster, light_local], workload())
    assert result.policy is light_local
    lost = next(c for c in result.candidates if c.policy is heavy_cluster)
    assert lost.matched and "takes precedence over cluster policies" in lost.reason


@pytest.mark.parametrize(
    ("a", "b", "winner", "why"),
    [
        pytest.param(
            (10, "2026-01-01T00:00:00Z", "b"),
            (5, "2025-01-01T00:00:00Z", "a"),
            "b",
            "weight 5 < 10",
            id="higher-weight-wins",
        ),
        pytest.param(
            (5, "2026-01-01T00:00:00Z", "a"),
            (5, "2025-01-01T00:00:00Z", "b"),
            "b",
            "is older",
            id="equal-weight-older-wins",
        ),
        pytest.param(
            (5, "2025-01-01T00:00:00Z", "b"),
            (5, "2025-01-01T00:00:00Z", "a"),
            "a",
            "sorts first",
            id="equal-weight-and-age-name-wins",
        ),
    ],
)
def test_weight_then_age_then_name(
    a: tuple[int, str, str], b: tuple[int, str, str], winner: str, why: str
) -> None:
    policies = [
        build(policy_doc("ClusterRollbackPolicy", name, weight=weight), created=created)
        for weight, created, name in (a, b)
    ]
    result = resolve(policies, workload())
    assert result.policy is not None and result.policy.metadata.name == winner
    loser = next(c for c in result.candidates if c.policy is not result.policy)
    assert loser.matched and why in loser.reason


def test_no_policy_retains() -> None:
    assert resolve([], workload()).policy is None


def test_policy_ids() -> None:
    assert (
        str(PolicyRef.of(load("production-rollback.yaml")))
        == "RollbackPolicy/production/production-rollback"
    )
    assert (
        str(PolicyRef.of(load("production-cluster-rollback.yaml")))
        == "ClusterRollbackPolicy/production-cluster-rollback"
    )
    unset = load("production-rollback.yaml").model_copy(
        update={
            "metadata": load("production-rollback.yaml").metadata.model_copy(
                update={"namespace": None}
            )
        }
    )
    # A namespaced policy applied without a namespace lives in `default`, everywhere it is named.
    assert str(PolicyRef.of(unset)) == "RollbackPolicy/default/production-rollback"


@pytest.mark.parametrize(
    ("manifest", "error"),
    [
        ({"kind": "Pod", "metadata": {"name": "x"}}, "not a workload kind"),
        ({"kind": "Deployment", "metadata": {}}, "metadata.name is required"),
        (
            {"kind": "Deployment", "metadata": {"name": "x", "labels": ["a"]}},
            "labels must be a mapping",
        ),
    ],
)
def test_bad_workload_manifests(manifest: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        WorkloadRef.from_manifest(manifest)


def test_policy_index_matches_a_linear_resolve() -> None:
    policies = [
        load("production-rollback.yaml"),
        load("production-cluster-rollback.yaml"),
        build(policy_doc("ClusterRollbackPolicy", "all", weight=0)),
        build(policy_doc("RollbackPolicy", "elsewhere"), namespace="other"),
    ]
    index = PolicyIndex()
    for p in policies:
        index.upsert(p)
    assert len(index) == 4
    for ns in ("production", "prod-eu", "staging", "other", "dev"):
        for labels in (STOREFRONT, {"tier": "api"}):
            w = workload(namespace=ns, **labels)
            assert index.resolve(w).policy is resolve(policies, w).policy, (ns, labels)
            assert index.policy_of(w) is resolve(policies, w).policy, (ns, labels)
    assert all(c.metadata.name != "elsewhere" for c in index.candidates("production"))
    index.remove("ClusterRollbackPolicy", None, "all")
    assert index.resolve(workload(namespace="dev")).policy is None
    assert index.policy_of(workload(namespace="dev")) is None  # not remembered past a change
    index.forget_namespace("production")
    assert index.resolve(workload(namespace="production")).policy is None
    assert index.policy_of(workload(namespace="production")) is None


# --- protected namespaces ----------------------------------------------------------------------

BROAD = {"namespaceSelector": {"operator": "NotIn", "values": ["dev-*"]}}


@pytest.mark.parametrize(
    ("namespace", "pattern"),
    [
        pytest.param("kube-system", "kube-*", id="kube-system"),
        pytest.param("openshift-monitoring", "openshift-*", id="openshift"),
        pytest.param("gmp-public", "gmp-*", id="gmp"),
        pytest.param("shop", None, id="not-protected"),
        pytest.param("kube", None, id="no-dash"),
    ],
)
def test_kubex_default_patterns_protect_namespaces_from_a_broad_policy(
    namespace: str, pattern: str | None
) -> None:
    broad = build(policy_doc("ClusterRollbackPolicy", "broad", scope=BROAD))
    found = resolve([broad], workload(namespace=namespace))
    if pattern is None:
        assert found.policy is broad and found.protected is None
        return
    assert found.policy is None
    assert (
        found.protected
        == f"namespace {namespace!r} is protected ({pattern}): no policy applies there"
    )
    assert [(c.matched, c.reason) for c in found.candidates] == [(False, found.protected)]


def test_protection_is_a_setting_and_the_index_keeps_it() -> None:
    broad = build(policy_doc("ClusterRollbackPolicy", "broad", scope=BROAD))
    mine = Protection.parse(" platform-* , kube-system")
    assert mine.patterns == ("platform-*", "kube-system")
    index = PolicyIndex(mine)
    index.upsert(broad)
    assert index.resolve(workload(namespace="platform-a")).policy is None
    assert index.resolve(workload(namespace="kube-public")).policy is broad  # not in this list
    assert resolve([broad], workload(namespace="kube-system"), Protection.parse("")).policy is broad


def test_the_policies_told_of_cluster_wide_acts_leave_out_protected_namespaces() -> None:
    """The storm breaker's Event goes on each policy but those in a protected namespace, where
    the engine writes nothing but their status."""
    index = PolicyIndex()
    broad = build(policy_doc("ClusterRollbackPolicy", "broad", scope=BROAD))
    team = build(policy_doc("RollbackPolicy", "team"))
    system = policy_doc("RollbackPolicy", "system")
    system["metadata"]["namespace"] = "kube-system"
    for policy in (broad, team, build(system)):
        index.upsert(policy)
    assert len(index.all()) == 3
    assert [p.metadata.name for p in index.told()] == ["broad", "team"]


@pytest.mark.parametrize("bad", ["Kube-*", "kube_system", "-kube", "a" * 64])
def test_a_bad_protected_pattern_is_refused_with_the_rule(bad: str) -> None:
    with pytest.raises(ValueError, match="is not a namespace name or pattern"):
        Protection.parse(f"kube-*,{bad}")
