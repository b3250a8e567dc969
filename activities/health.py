"""Health checks from Prometheus at a window's end: the ``check_health`` activity's work.

Each check is one instant query at the window's end (``time=`` the end, so a retried activity
asks the same question), and one more at its start when a bound is relative to the baseline
(the same query over the same length of time before the resize):

- ``cpuThrottling``: per container, throttled CFS periods over periods during the window
  (cAdvisor's ``container_cpu_cfs_throttled_periods_total`` / ``container_cpu_cfs_periods_total``);
- ``memoryHeadroom``: per container, the highest working set over the memory limit during the
  window (``container_memory_working_set_bytes`` / ``container_spec_memory_limit_bytes``;
  containers without a limit have no headroom to lose and are left out);
- ``queries``: the policy's own PromQL, ``$namespace``, ``$owner``, ``$pods`` and ``$window``
  replaced; its highest value (the lowest, when healthy means above a bound) is judged.

The workload's series are its pods': ``pod=~"<owner>-.+"`` in its namespace (the names its
controllers give), so the baseline, before a rollout replaced them, is the same workload's too.
Prometheus unreachable, a query it refuses, or a check with no data at the window's end raise
``PrometheusError``: an empty answer is never a pass. The workflow retries within its budget and
then does what the policy says (``onPrometheusError``).
"""

from __future__ import annotations

import json
import math
import operator
import re
from datetime import datetime, timedelta
from urllib.parse import urlencode

import urllib3

from activities.errors import TransientError
from workflows.activity_api import CheckResult, HealthInput, HealthResult
from workflows.contract import FailureReason
from workflows.durations import format_duration
from workflows.policy import HealthChecks, QueryCheck, fill_promql

QUERY_TIMEOUT = 10.0  # seconds, per query


class PrometheusError(TransientError):
    """Prometheus could not answer a check: unreachable, a refused query, or no data (worth
    another try within the workflow's budget)."""


class Prometheus:
    """The HTTP API's instant query (``/api/v1/query``), through one connection pool."""

    def __init__(self, url: str, timeout: float = QUERY_TIMEOUT) -> None:
        self.url = url.rstrip("/")
        self.http = urllib3.PoolManager(
            timeout=urllib3.Timeout(total=timeout), retries=urllib3.Retry(0)
        )

    def query(self, expr: str, at: datetime) -> list[tuple[dict[str, str], float]]:
        """The series ``expr`` returns at ``at``: (labels, value) each."""
        url = f"{self.url}/api/v1/query?{urlencode({'query': expr, 'time': at.timestamp()})}"
        try:
            response = self.http.request("GET", url)
        except urllib3.exceptions.HTTPError as exc:
            why = str(getattr(exc, "reason", None) or exc).split("): ", 1)[-1]  # not the URL
            raise PrometheusError(f"Prometheus at {self.url} unreachable: {why}") from None
        try:
            body = json.loads(response.data)
        except ValueError:
            raise PrometheusError(f"Prometheus answered {response.status}, not JSON") from None
        if body.get("status") != "success":
            raise PrometheusError(f"Prometheus refused the query: {body.get('error', body)}")
        data = body["data"]
        kind = data.get("resultType")
        if kind == "scalar":
            return [({}, float(data["result"][1]))]
        if kind != "vector":
            raise PrometheusError(f"the query returns a {kind}: a check needs an instant vector")
        return [(s.get("metric") or {}, float(s["value"][1])) for s in data["result"]]


def _pods(owner: str) -> str:
    """The workload's pods' names, as a regular expression (its controllers name them so)."""
    return f"{re.escape(owner)}-.+"


def _selector(namespace: str, owner: str) -> str:
    return f'namespace="{namespace}",pod=~"{_pods(owner)}",container!=""'


def cpu_throttling_query(namespace: str, owner: str, window: timedelta) -> str:
    sel, w = _selector(namespace, owner), format_duration(window)
    return (
        f"max by (container) (increase(container_cpu_cfs_throttled_periods_total{{{sel}}}[{w}])"
        f" / increase(container_cpu_cfs_periods_total{{{sel}}}[{w}]))"
    )


def memory_headroom_query(namespace: str, owner: str, window: timedelta) -> str:
    sel, w = _selector(namespace, owner), format_duration(window)
    return (
        f"max by (container) (max_over_time(container_memory_working_set_bytes{{{sel}}}[{w}])"
        f" / (max_over_time(container_spec_memory_limit_bytes{{{sel}}}[{w}]) > 0))"
    )


def custom_query(check: QueryCheck, namespace: str, owner: str, window: timedelta) -> str:
    values = {
        "$namespace": namespace,
        "$owner": owner,
        "$pods": _pods(owner),
        "$window": format_duration(window),
    }
    return fill_promql(check.promql, values)


def _per_container(found: list[tuple[dict[str, str], float]]) -> dict[str, float]:
    return {labels.get("container", ""): value for labels, value in found if not math.isnan(value)}


def _percent_check(
    name: str,
    reason: FailureReason,
    what: str,
    now: dict[str, float],
    before: dict[str, float] | None,
    max_percent: int | None,
    max_increase: int | None,
) -> CheckResult:
    """Each container's percent against the bounds; the worst one decides."""
    worst: tuple[float, str, str] | None = None  # (how far over, container, why)
    for container, ratio in sorted(now.items()):
        percent = 100 * ratio
        if max_percent is not None and percent > max_percent:
            over = percent - max_percent
            why = f"{container}: {what} {percent:.1f}% > {max_percent}%"
            worst = max(worst or (over, container, why), (over, container, why))
        base = (before or {}).get(container)
        if max_increase is not None and base is not None:
            rise = percent - 100 * base
            if rise > max_increase:
                over = rise - max_increase
                why = (
                    f"{container}: {what} {percent:.1f}%, {rise:.1f} points over its baseline"
                    f" {100 * base:.1f}% (at most {max_increase})"
                )
                worst = max(worst or (over, container, why), (over, container, why))
    highest = max(now.values())
    baseline = max(before.values()) if before else None
    bounds = []
    if max_percent is not None:
        bounds.append(f"<= {max_percent}%")
    if max_increase is not None:
        bounds.append(f"<= baseline + {max_increase} points")
    shown = f"{what} {100 * highest:.1f}%" + (
        f" (baseline {100 * baseline:.1f}%)" if baseline is not None else ""
    )
    return CheckResult(
        name=name,
        reason=reason,
        value=round(100 * highest, 3),
        baseline=None if baseline is None else round(100 * baseline, 3),
        bound=" and ".join(bounds),
        passed=worst is None,
        message=worst[2] if worst else f"{shown}, within {' and '.join(bounds)}",
    )


HEALTHY = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}


def _worse(op: str, value: float, bound: float) -> bool:
    return not HEALTHY[op](value, bound)


def _custom_check(check: QueryCheck, now: list[float], before: list[float] | None) -> CheckResult:
    low_is_bad = check.healthy_when in (">", ">=")
    value = min(now) if low_is_bad else max(now)
    base = (min(before) if low_is_bad else max(before)) if before else None
    problems, bounds = [], []
    if check.threshold is not None:
        bounds.append(f"{check.healthy_when} {check.threshold:g}")
        if _worse(check.healthy_when, value, check.threshold):
            problems.append(f"{value:g} is not {check.healthy_when} {check.threshold:g}")
    if check.max_increase_percent is not None and base is not None:
        factor = check.max_increase_percent / 100
        limit = base * (1 - factor) if low_is_bad else base * (1 + factor)
        direction = "below" if low_is_bad else "above"
        bounds.append(f"at most {check.max_increase_percent}% {direction} its baseline")
        if (value < limit) if low_is_bad else (value > limit):
            problems.append(
                f"{value:g} is more than {check.max_increase_percent}% {direction} its baseline"
                f" {base:g}"
            )
    return CheckResult(
        name=check.name,
        reason=FailureReason.HEALTH_CHECK_FAILED,
        value=value,
        baseline=base,
        bound=" and ".join(bounds),
        passed=not problems,
        message=f"{check.name}: {'; '.join(problems)}"
        if problems
        else f"{check.name}: {value:g}, within {' and '.join(bounds)}",
    )


def check_health(prometheus: Prometheus, request: HealthInput) -> HealthResult:
    """Every check of ``request.checks`` at the window's end; raises ``PrometheusError``."""
    checks: HealthChecks = request.checks
    ns, owner = request.owner.namespace, request.owner.name
    end, start = request.window_ends_at, request.window_started_at
    window = end - start
    results: list[CheckResult] = []
    asked = 0

    def ask(name: str, expr: str, at: datetime) -> list[tuple[dict[str, str], float]]:
        nonlocal asked
        asked += 1
        found = prometheus.query(expr, at)
        if at == end and not found:
            raise PrometheusError(f"{name}: no data for {request.owner} at the window's end")
        return found

    for name, reason, what, bounds, build in (
        ("cpuThrottling", FailureReason.CPU_THROTTLED, "CPU throttled", checks.cpu_throttling,
         cpu_throttling_query),
        ("memoryHeadroom", FailureReason.MEMORY_HEADROOM_LOW, "memory used", checks.memory_headroom,
         memory_headroom_query),
    ):  # fmt: skip
        if bounds is None:
            continue
        expr = build(ns, owner, window)
        now = _per_container(ask(name, expr, end))
        if not now:
            raise PrometheusError(f"{name}: only NaN for {request.owner} at the window's end")
        before = None
        if bounds.max_increase_points is not None:
            before = _per_container(ask(name, expr, start))
        results.append(
            _percent_check(
                name, reason, what, now, before, bounds.max_percent, bounds.max_increase_points
            )
        )
    for query in checks.queries:
        expr = custom_query(query, ns, owner, window)
        values = [v for _, v in ask(query.name, expr, end) if not math.isnan(v)]
        if not values:
            raise PrometheusError(f"{query.name}: only NaN at the window's end")
        base = None
        if query.max_increase_percent is not None:
            base = [v for _, v in ask(query.name, expr, start) if not math.isnan(v)] or None
        results.append(_custom_check(query, values, base))
    return HealthResult(checks=results, queries=asked)
