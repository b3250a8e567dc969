"""One table of good and bad policy documents, checked against both the models and the CRDs."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import policy_doc


def _with(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    node = doc
    *parents, last = path.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return doc


def _ns_selector(operator: str, values: list[str]) -> dict[str, Any]:
    return {"namespaceSelector": {"operator": operator, "values": values}}


RP, CRP = "RollbackPolicy", "ClusterRollbackPolicy"

# (document, expected field path of the first problem or None when valid)
CASES: list[Any] = [
    pytest.param(policy_doc(RP), None, id="minimal-namespaced"),
    pytest.param(policy_doc(CRP), None, id="minimal-cluster"),
    pytest.param(policy_doc(RP, weight=0, enableMonitoringReopen=False), None, id="weight-zero"),
    pytest.param(policy_doc(RP, monitoringPeriod="1h30m"), None, id="compound-duration"),
    pytest.param(policy_doc(RP, monitoringPeriod="2s"), None, id="short-duration"),
    pytest.param(policy_doc(RP, adoptionThresholdPercent=1), None, id="threshold-1"),
    pytest.param(policy_doc(RP, adoptionThresholdPercent=100), None, id="threshold-100"),
    pytest.param(policy_doc(RP, rollbackTarget="manifest"), None, id="target-manifest"),
    pytest.param(
        policy_doc(RP, scope={"workloadTypes": ["StrimziPodSet"]}), None, id="strimzi-named"
    ),
    pytest.param(policy_doc(RP, scope={}), None, id="empty-scope"),
    pytest.param(
        policy_doc(
            RP,
            scope={
                "labelSelector": {
                    "matchExpressions": [
                        {"key": "tier", "operator": "Exists"},
                        {"key": "legacy", "operator": "DoesNotExist", "values": []},
                        {"key": "env", "operator": "NotIn", "values": ["dev"]},
                    ]
                }
            },
        ),
        None,
        id="all-operators",
    ),
    pytest.param(
        policy_doc(CRP, scope=_ns_selector("In", ["prod-*", "staging"])), None, id="wildcards"
    ),
    pytest.param(policy_doc(CRP, scope=_ns_selector("NotIn", ["*-sandbox"])), None, id="notin"),
    # --- bad documents ---
    pytest.param(
        policy_doc(RP, monitoringPeriod=None), "spec.monitoringPeriod", id="missing-period"
    ),
    pytest.param(policy_doc(RP, rollbackTarget=None), "spec.rollbackTarget", id="missing-target"),
    pytest.param(policy_doc(RP, backoff=None), "spec.backoff", id="missing-backoff"),
    pytest.param(
        policy_doc(RP, backoff={"timePeriod": "1m", "multiplyByTurn": 2}),
        "spec.backoff.maxAttempts",
        id="missing-max-attempts",
    ),
    pytest.param(
        policy_doc(RP, monitoringPeriod="0s"), "spec.monitoringPeriod", id="zero-duration"
    ),
    pytest.param(policy_doc(RP, monitoringPeriod="-5m"), "spec.monitoringPeriod", id="negative"),
    pytest.param(policy_doc(RP, monitoringPeriod="5"), "spec.monitoringPeriod", id="no-unit"),
    pytest.param(policy_doc(RP, monitoringPeriod="soon"), "spec.monitoringPeriod", id="garbage"),
    pytest.param(policy_doc(RP, monitoringPeriod=300), "spec.monitoringPeriod", id="number"),
    pytest.param(
        _with(policy_doc(RP), "spec.backoff.timePeriod", "0m"),
        "spec.backoff.timePeriod",
        id="zero-backoff",
    ),
    pytest.param(policy_doc(RP, rollbackTarget="previous"), "spec.rollbackTarget", id="bad-target"),
    pytest.param(
        policy_doc(RP, adoptionThresholdPercent=0),
        "spec.adoptionThresholdPercent",
        id="threshold-0",
    ),
    pytest.param(
        policy_doc(RP, adoptionThresholdPercent=101),
        "spec.adoptionThresholdPercent",
        id="threshold-101",
    ),
    pytest.param(
        _with(policy_doc(RP), "spec.backoff.maxAttempts", 0), "spec.backoff.maxAttempts", id="max-0"
    ),
    pytest.param(
        _with(policy_doc(RP), "spec.backoff.multiplyByTurn", 0),
        "spec.backoff.multiplyByTurn",
        id="multiply-0",
    ),
    pytest.param(policy_doc(RP, weight="high"), "spec.weight", id="weight-string"),
    pytest.param(policy_doc(RP, weight=2**31), "spec.weight", id="weight-overflow"),
    pytest.param(policy_doc(RP, weight=-1), "spec.weight", id="weight-negative"),
    pytest.param(
        policy_doc(RP, enableMonitoringReopen="maybe"), "spec.enableMonitoringReopen", id="bool"
    ),
    pytest.param(
        policy_doc(RP, monitoringPeriodd="5m"), "spec.monitoringPeriodd", id="unknown-field"
    ),
    pytest.param(
        _with(policy_doc(RP), "spec.backoff.jitter", True),
        "spec.backoff.jitter",
        id="unknown-nested",
    ),
    pytest.param(
        policy_doc(RP, scope={"workloadTypes": ["Pod"]}),
        "spec.scope.workloadTypes[0]",
        id="bad-kind",
    ),
    pytest.param(
        policy_doc(RP, scope={"workloadTypes": []}), "spec.scope.workloadTypes", id="no-kinds"
    ),
    pytest.param(
        policy_doc(RP, scope={"workloadTypes": ["Job", "Job"]}),
        "spec.scope.workloadTypes",
        id="duplicate-kinds",
    ),
    pytest.param(
        policy_doc(RP, scope=_ns_selector("In", ["prod"])),
        "spec.scope.namespaceSelector",
        id="namespace-selector-on-namespaced",
    ),
    pytest.param(
        policy_doc(CRP, scope=_ns_selector("Like", ["prod"])),
        "spec.scope.namespaceSelector.operator",
        id="ns-operator",
    ),
    pytest.param(
        policy_doc(CRP, scope=_ns_selector("In", [])),
        "spec.scope.namespaceSelector.values",
        id="ns-empty",
    ),
    pytest.param(
        policy_doc(CRP, scope=_ns_selector("In", ["Prod_*"])),
        "spec.scope.namespaceSelector.values[0]",
        id="ns-bad-pattern",
    ),
    pytest.param(
        policy_doc(
            RP, scope={"labelSelector": {"matchExpressions": [{"key": "t", "operator": "In"}]}}
        ),
        "spec.scope.labelSelector.matchExpressions[0]",
        id="in-without-values",
    ),
    pytest.param(
        policy_doc(
            RP,
            scope={
                "labelSelector": {
                    "matchExpressions": [{"key": "t", "operator": "Exists", "values": ["x"]}]
                }
            },
        ),
        "spec.scope.labelSelector.matchExpressions[0]",
        id="exists-with-values",
    ),
    pytest.param(
        policy_doc(
            RP,
            scope={
                "labelSelector": {
                    "matchExpressions": [{"key": "t", "operator": "Gt", "values": ["1"]}]
                }
            },
        ),
        "spec.scope.labelSelector.matchExpressions[0].operator",
        id="bad-operator",
    ),
    pytest.param(
        policy_doc(RP, scope={"labelSelector": {"matchLabels": {"a": 1}}}),
        "spec.scope.labelSelector.matchLabels.a",
        id="label-value-not-string",
    ),
    pytest.param(
        {k: v for k, v in policy_doc(RP).items() if k != "spec"}, "spec", id="missing-spec"
    ),
    # --- no coercion: the models are as strict as the schema's types --------------------------
    pytest.param(policy_doc(RP, weight="10"), "spec.weight", id="weight-numeric-string"),
    pytest.param(policy_doc(RP, weight=True), "spec.weight", id="weight-bool"),
    pytest.param(
        policy_doc(RP, adoptionThresholdPercent="80"),
        "spec.adoptionThresholdPercent",
        id="threshold-string",
    ),
    pytest.param(
        policy_doc(RP, enableMonitoringReopen="no"), "spec.enableMonitoringReopen", id="bool-no"
    ),
    pytest.param(
        _with(policy_doc(RP), "spec.backoff.maxAttempts", 2.0),
        "spec.backoff.maxAttempts",
        id="float-attempts",
    ),
    # --- names and labels as Kubernetes validates them ----------------------------------------
    pytest.param(_with(policy_doc(RP), "metadata.name", "Bad_Name"), "metadata.name", id="name"),
    pytest.param(_with(policy_doc(RP), "metadata.name", "a" * 254), "metadata.name", id="long"),
    pytest.param(
        _with(policy_doc(RP), "metadata.name", "team.example-1"), None, id="name-subdomain"
    ),
    pytest.param(
        policy_doc(RP, scope={"labelSelector": {"matchLabels": {"": "x"}}}),
        'spec.scope.labelSelector.matchLabels[""] (key)',
        id="empty-label-key",
    ),
    pytest.param(
        policy_doc(RP, scope={"labelSelector": {"matchLabels": {"my key": "x"}}}),
        'spec.scope.labelSelector.matchLabels["my key"] (key)',
        id="spaced-label-key",
    ),
    pytest.param(
        policy_doc(RP, scope={"labelSelector": {"matchLabels": {"app": "two words"}}}),
        "spec.scope.labelSelector.matchLabels.app",
        id="spaced-label-value",
    ),
    pytest.param(
        policy_doc(
            RP,
            scope={"labelSelector": {"matchLabels": {"app.kubernetes.io/part-of": "", "a": "b"}}},
        ),
        None,
        id="prefixed-key-empty-value",
    ),
    pytest.param(
        policy_doc(
            RP,
            scope={
                "labelSelector": {"matchExpressions": [{"key": "bad key", "operator": "Exists"}]}
            },
        ),
        "spec.scope.labelSelector.matchExpressions[0].key",
        id="spaced-expression-key",
    ),
    pytest.param(
        policy_doc(
            RP,
            scope={
                "labelSelector": {
                    "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a b"]}]
                }
            },
        ),
        "spec.scope.labelSelector.matchExpressions[0].values[0]",
        id="spaced-expression-value",
    ),
    # --- bounds the engine and Temporal can schedule ------------------------------------------
    pytest.param(policy_doc(RP, monitoringPeriod="8760h"), None, id="period-a-year"),
    pytest.param(
        policy_doc(RP, monitoringPeriod="8761h"), "spec.monitoringPeriod", id="period-over-a-year"
    ),
    pytest.param(
        policy_doc(RP, monitoringPeriod="87600000h"), "spec.monitoringPeriod", id="period-huge"
    ),
    pytest.param(
        policy_doc(RP, monitoringPeriod="100000000000h"),
        "spec.monitoringPeriod",
        id="period-overflow",
    ),
    pytest.param(
        policy_doc(RP, monitoringPeriod="9" * 400 + "h"),
        "spec.monitoringPeriod",
        id="period-400-digits",
    ),
    pytest.param(
        policy_doc(RP, backoff={"timePeriod": "1h", "multiplyByTurn": 24, "maxAttempts": 365}),
        None,
        id="longest-wait-a-year",
    ),
    pytest.param(
        policy_doc(RP, backoff={"timePeriod": "1h", "multiplyByTurn": 25, "maxAttempts": 365}),
        "spec.backoff",
        id="longest-wait-over-a-year",
    ),
    # Fractions count: a rule on whole seconds let 31.9s x 1000 x 1000 (8861h) through.
    pytest.param(
        policy_doc(
            RP, backoff={"timePeriod": "31.9s", "multiplyByTurn": 1000, "maxAttempts": 1000}
        ),
        "spec.backoff",
        id="longest-wait-over-a-year-by-a-fraction",
    ),
    pytest.param(
        policy_doc(
            RP, backoff={"timePeriod": "31.536s", "multiplyByTurn": 1000, "maxAttempts": 1000}
        ),
        None,
        id="longest-wait-exactly-a-year-with-a-fraction",
    ),
    pytest.param(
        policy_doc(
            RP, backoff={"timePeriod": "31.536001s", "multiplyByTurn": 1000, "maxAttempts": 1000}
        ),
        "spec.backoff",
        id="longest-wait-a-year-and-a-microsecond-per-turn",
    ),
    pytest.param(
        policy_doc(
            RP, backoff={"timePeriod": "1.5ms", "multiplyByTurn": 1000, "maxAttempts": 1000}
        ),
        None,
        id="sub-millisecond-fraction",
    ),
    pytest.param(
        policy_doc(
            RP, backoff={"timePeriod": "27000000h", "multiplyByTurn": 1000, "maxAttempts": 3}
        ),
        "spec.backoff.timePeriod",
        id="backoff-overflow",
    ),
    # Health checks from Prometheus: an optional field beyond Kubex's.
    pytest.param(
        policy_doc(RP, healthChecks={"cpuThrottling": {"maxPercent": 25}}), None, id="hc-cpu"
    ),
    pytest.param(
        policy_doc(
            CRP,
            healthChecks={
                "memoryHeadroom": {"maxPercent": 90, "maxIncreasePoints": 10},
                "queries": [
                    {"name": "p99", "healthyWhen": "<", "threshold": 0.25,
                     "promql": 'histogram_quantile(0.99, sum by (le) (rate('
                               'http_request_duration_seconds_bucket{namespace="$namespace",'
                               'pod=~"$pods"}[$window])))'},
                    {"name": "errors", "healthyWhen": "<=", "maxIncreasePercent": 50,
                     "promql": 'sum(rate(http_errors_total{pod=~"$pods"}[$window]))'},
                ],
                "onPrometheusError": "fail",
            },
        ),
        None,
        id="hc-all",
    ),
    pytest.param(policy_doc(RP, healthChecks={}), "spec.healthChecks", id="hc-none-named"),
    pytest.param(
        policy_doc(RP, healthChecks={"cpuThrottling": {}}),
        "spec.healthChecks.cpuThrottling",
        id="hc-cpu-no-bound",
    ),
    pytest.param(
        policy_doc(RP, healthChecks={"memoryHeadroom": {"maxPercent": 101}}),
        "spec.healthChecks.memoryHeadroom.maxPercent",
        id="hc-percent-over-100",
    ),
    pytest.param(
        policy_doc(
            RP, healthChecks={"queries": [{"name": "q", "promql": "up", "healthyWhen": "<"}]}
        ),
        "spec.healthChecks.queries[0]",
        id="hc-query-no-bound",
    ),
    pytest.param(
        policy_doc(RP, healthChecks={"queries": [
            {"name": "q", "promql": "up", "healthyWhen": "==", "threshold": 1}]}),
        "spec.healthChecks.queries[0].healthyWhen",
        id="hc-query-bad-comparison",
    ),
    pytest.param(
        policy_doc(RP, healthChecks={"queries": [
            {"name": "q", "promql": "up", "healthyWhen": "<", "threshold": 1},
            {"name": "q", "promql": "up", "healthyWhen": "<", "threshold": 2}]}),
        "spec.healthChecks.queries",
        id="hc-query-names-repeat",
    ),
    pytest.param(
        policy_doc(
            RP, healthChecks={"onPrometheusError": "ignore", "cpuThrottling": {"maxPercent": 5}}
        ),
        "spec.healthChecks.onPrometheusError",
        id="hc-bad-error-choice",
    ),
]  # fmt: skip
