"""The custom queries' rules (workflows.promql): where a variable may stand, the bounds checked
before parsing, the linear walk and tenancy decided on the query as it will run. Against real
Prometheus over generated queries: tests/activity/test_tenancy.py."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tests.unit.test_health_models import namespaced
from workflows.policy import RollbackPolicy
from workflows.promql import (
    PROMQL_DEPTH_MAX,
    PROMQL_OPERATORS_MAX,
    check_bounds,
    nodes,
    parse,
    unconfined_selectors,
    valid_promql,
)

OURS = 'x{namespace="$namespace"}'


@pytest.mark.parametrize(
    ("promql", "said"),
    [
        # The leaks found by reading: each passed the check before (it parsed only with the
        # variable replaced, so the check saw nothing to judge).
        pytest.param('max(y{namespace="billing"}) or $namespace', "$namespace at column 32",
                     id="or-a-bare-variable"),
        pytest.param(f"sum by ($namespace) ({OURS})", "$namespace at column 9", id="grouped-by"),
        pytest.param('x{namespace="billing", $namespace!="x"}', "$namespace at column 24",
                     id="as-a-label-name"),
        pytest.param(f"{OURS} and on($namespace) {OURS}", "$namespace at column 34",
                     id="as-a-matching-label"),
        pytest.param(f"{OURS}[$owner]", "$owner at column 27", id="owner-as-a-range"),
        pytest.param(f"rate({OURS}[5m]) * $window", "$window at column 39",
                     id="window-as-a-number"),
        pytest.param(f"{OURS} + $nothing", "$nothing at column 29", id="not-a-variable"),
        pytest.param(f"info({OURS})", "info() reads series beyond its selectors", id="info"),
        pytest.param('x{namespace="$namespace-b"}', 'x names namespace="$namespace-b"',
                     id="a-longer-name"),
        pytest.param('x{namespace=~"$namespace"}', 'x names namespace=~"$namespace"',
                     id="a-pattern-of-it"),
    ],
)  # fmt: skip
def test_a_query_that_could_read_another_namespace_is_refused(promql: str, said: str) -> None:
    found = unconfined_selectors(promql, "shop")
    assert found and said in "; ".join(found), found
    with pytest.raises(ValidationError) as caught:
        RollbackPolicy.model_validate(namespaced(promql))
    assert said in str(caught.value)


@pytest.mark.parametrize(
    "promql",
    [
        f"{OURS}[$window]",
        f"rate({OURS}[ $window ])",
        f"max_over_time(rate({OURS}[1m])[$window:15s])",
        f"max_over_time(rate({OURS}[1m])[5m:$window])",
        f"{OURS} offset $window",
        f"sum by (namespace) ({OURS})",
        'label_replace(x{namespace="$namespace"}, "a", "$1", "b", "(.*)")',  # $1 is a string's
        "x{namespace='$namespace', pod=~'$pods', owner=`$owner`}",
        'x{namespace="$namespace", note="a \\" quote and $namespace"}',
        f"{OURS} > 1e-3 and {OURS} != -2E+5",
    ],
)
def test_a_variable_where_a_value_goes_is_taken(promql: str) -> None:
    assert unconfined_selectors(promql, "shop") == []
    RollbackPolicy.model_validate(namespaced(promql))


def test_a_query_within_its_bounds_is_taken_and_one_past_them_is_refused() -> None:
    depth = PROMQL_DEPTH_MAX - 1  # the selector's braces are the last bracket
    valid_promql("(" * depth + OURS + ")" * depth)
    with pytest.raises(ValueError, match=f"nests more than {PROMQL_DEPTH_MAX} brackets deep"):
        valid_promql("(" * (depth + 1) + OURS + ")" * (depth + 1))
    valid_promql(" + ".join([OURS] * (PROMQL_OPERATORS_MAX + 1)))
    with pytest.raises(ValueError, match=f"has 65 operators; at most {PROMQL_OPERATORS_MAX}"):
        valid_promql(" and ".join([OURS] * (PROMQL_OPERATORS_MAX + 2)))


@pytest.mark.parametrize(
    ("promql", "operators"),
    [
        pytest.param("-" * 4000 + "x", 4000, id="a-unary-run"),  # 4 s in the parser
        pytest.param("x" + " + x" * 2000, 2000, id="a-binary-chain"),  # 1.7 s
        pytest.param(" or ".join(["x"] * 800), 799, id="set-operators"),
        pytest.param(f"{OURS} >= 1 == bool 2 != 3 <= 4", 4 + 60, id="two-character-ones"),
    ],
)
def test_operators_are_counted_before_parsing(promql: str, operators: int) -> None:
    if operators <= PROMQL_OPERATORS_MAX:
        check_bounds(promql + " + x" * 60)
        with pytest.raises(ValueError, match=f"has {operators + 1} operators"):
            check_bounds(promql + " + x" * 61)
        return
    with pytest.raises(ValueError, match=f"has {operators} operators"):
        check_bounds(promql)


def test_what_a_selector_or_a_string_holds_counts_as_no_operator() -> None:
    matchers = ", ".join(f'l{i}!="a-b+c"' for i in range(200))
    check_bounds(f'x{{{matchers}}}[5m:1m] + "((((-----"')


def test_the_walk_meets_every_node_once() -> None:
    tree = parse(f"sum(rate({OURS}[5m])) / on() -max_over_time(count({OURS} offset 1m)[5m:])")
    kinds = sorted(type(n).__name__ for n in nodes(tree))
    assert kinds == sorted(
        ["BinaryExpr", "AggregateExpr", "Call", "MatrixSelector", "VectorSelector", "UnaryExpr",
         "Call", "SubqueryExpr", "AggregateExpr", "VectorSelector"]
    )  # fmt: skip
