"""The health checks' models refuse what Prometheus would: a query that does not parse is
refused with its field path, why, and where when a bracket is the problem."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from tests.conftest import policy_doc
from workflows.policy import HealthChecks, RollbackPolicy


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
