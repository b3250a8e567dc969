"""The health checks' models refuse what Prometheus would: a query that does not parse is
refused with its field path, why, and where when a bracket is the problem."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from tests.conftest import policy_doc
from workflows.policy import ClusterRollbackPolicy, HealthChecks, RollbackPolicy


def query(promql: str) -> dict[str, Any]:
    return {"queries": [{"name": "q", "promql": promql, "healthyWhen": "<", "threshold": 1}]}


@pytest.mark.parametrize(
    ("promql", "said"),
    [
        (
            "sum by (le (rate(x[$window]))",
            "unclosed left parenthesis (at column 8: '(' is never closed)",
        ),
        ("rate(x[5m]))", "(at column 12: ')' closes nothing)"),
        ("rate(up)", "expected type matrix in call to function 'rate', got vector"),
        ("x +* y", "invalid promql query (valid up to column 1)"),
        ("rate(x[$window]) >", "invalid promql query (valid up to column 16)"),
        ("nosuchfunction(up)", "unknown function with name 'nosuchfunction'"),
    ],
)
def test_a_query_that_does_not_parse_is_refused_with_its_path_and_why(
    promql: str, said: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        RollbackPolicy.model_validate(policy_doc(healthChecks=query(promql)))
    (error,) = caught.value.errors()
    assert ".".join(map(str, error["loc"])) == "spec.healthChecks.queries.0.promql"
    assert said in error["msg"]


def test_the_variables_are_filled_in_before_parsing() -> None:
    promql = 'sum(rate(x{namespace="$namespace", pod=~"$pods", owner="$owner"}[$window]))'
    checks = HealthChecks.model_validate(query(promql))
    assert checks.queries[0].promql == promql  # kept as written: filled when it runs


def namespaced(promql: str, namespace: str | None = "shop") -> dict[str, Any]:
    doc = policy_doc(healthChecks=query(promql))
    if namespace is None:
        doc["metadata"].pop("namespace", None)
    else:
        doc["metadata"]["namespace"] = namespace
    return doc


@pytest.mark.parametrize(
    ("promql", "said"),
    [
        pytest.param('sum(rate(x{pod=~"$pods"}[$window]))',
                     'x has no namespace="$namespace" matcher', id="no-matcher"),
        pytest.param('max(x{namespace="billing"})', 'x names namespace="billing"', id="another"),
        pytest.param('max(x{namespace=~".+"})', 'x names namespace=~".+"', id="a-pattern"),
        pytest.param('max(x{namespace!="shop"})', 'x names namespace!="shop"', id="not-equal"),
        pytest.param('x{namespace="$namespace"} / on() y', 'y has no namespace', id="one-of-two"),
        pytest.param('x{namespace="$namespace" or pod="a"}', "x has no namespace",
                     id="an-or-branch"),
        pytest.param('count_over_time(x[5m:1m])', "x has no namespace", id="in-a-subquery"),
        pytest.param('{__name__="x"}', "a selector has no namespace", id="nameless"),
    ],
)  # fmt: skip
def test_a_namespaced_policys_query_that_may_read_another_namespace_is_refused(
    promql: str, said: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        RollbackPolicy.model_validate(namespaced(promql))
    (error,) = caught.value.errors()
    assert (
        "spec.healthChecks.queries[0].promql: a RollbackPolicy reads only its own" in (error["msg"])
    )
    assert said in error["msg"]


@pytest.mark.parametrize(
    "promql",
    [
        'sum(rate(x{namespace="$namespace", pod=~"$pods"}[$window]))',
        'max(x{namespace="shop"})',  # its own, written out
        'max(x{namespace="$namespace", namespace!="kube-system"})',  # a further matcher narrows
        'x{namespace="$namespace" or namespace="$namespace", pod="a"}',
        "vector(1)",  # no selector reads nothing
    ],
)
def test_a_namespaced_policys_confined_query_is_taken(promql: str) -> None:
    RollbackPolicy.model_validate(namespaced(promql))


def test_a_cluster_policys_queries_stay_free() -> None:
    doc = policy_doc(healthChecks=query('max(x{namespace="billing"})'))
    doc["kind"] = "ClusterRollbackPolicy"
    doc["metadata"].pop("namespace", None)
    ClusterRollbackPolicy.model_validate(doc)


def test_a_namespaced_policy_without_its_namespace_takes_only_the_variable() -> None:
    RollbackPolicy.model_validate(namespaced('max(x{namespace="$namespace"})', None))
    with pytest.raises(ValidationError, match='names namespace="shop"'):
        RollbackPolicy.model_validate(namespaced('max(x{namespace="shop"})', None))
