"""Health checks from Prometheus at a window's end: the ``check_health`` activity's work.

Called by ``activities.kubernetes`` (the ``check_health`` activity) with the cohort as the
verdict's LIST found it (``Cohort.of``). Each check is one instant query at the window's end
(``time=`` the end, so a retried activity asks the same question), and one more over the same
length of time before the cut when a bound is relative to the baseline (``baseline_at``: the
turn's first window's start, so a reopened window's baseline is not time already under the cut).
All of an activity's queries are asked at once, each within ``QUERY_TIMEOUT``:

- ``cpuThrottling``: per container with a CPU limit, throttled CFS periods over periods during
  the window (cAdvisor's ``container_cpu_cfs_throttled_periods_total`` /
  ``container_cpu_cfs_periods_total``, which exist only under a CPU quota);
- ``memoryHeadroom``: per container with a memory limit, the highest working set over the limit
  during the window (``container_memory_working_set_bytes`` /
  ``container_spec_memory_limit_bytes``, which cAdvisor reports as 0 without a limit);
- ``queries``: the policy's own PromQL, ``$namespace``, ``$owner``, ``$pods`` and ``$window``
  replaced; its highest value (the lowest, when healthy means above a bound) is judged.

The workload's series are its cohort's pods' by their exact names (``pod=~"a|b"``, Prometheus
anchors a regular expression), never a name prefix: ``api``'s checks never read ``api-gateway``.
A built-in check that no container of the cohort can have data for (no CPU limit, no memory
limit) is not applicable: it passes and says so, and never waits for data that cannot come.
Prometheus unreachable, a query it refuses, or an applicable check with no data at the window's
end raise ``PrometheusError``: an empty answer is never a pass. The workflow retries within its
budget and then does what the policy says (``onPrometheusError``, bounded by ``maxHold``).
"""

from __future__ import annotations

import json
import logging
import math
import operator
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta

import urllib3
import yaml

from activities.cohort import actual_resources
from activities.errors import TransientError, redact_url
from workflows.activity_api import CheckResult, HealthInput, HealthResult
from workflows.contract import FailureReason, Obj
from workflows.durations import format_duration, parse_duration
from workflows.policy import (
    QUERIES_MAX,
    CpuThrottlingCheck,
    HealthChecks,
    MemoryHeadroomCheck,
    QueryCheck,
)
from workflows.promql import fill_promql
from workflows.quantities import positive

# Seconds one query may take. They are asked at once, so an activity takes about one query's
# time whatever their number (at most 2 + 2 x QUERIES_MAX), within its 20 s start-to-close.
QUERY_TIMEOUT = 10.0
log = logging.getLogger(__name__)
MOST_QUERIES = 2 * (2 + QUERIES_MAX)  # each check at the window's end and at its baseline
DEFAULT_SCRAPE_INTERVAL = timedelta(minutes=1)  # Prometheus's own default


class PrometheusError(TransientError):
    """Prometheus could not answer a check: unreachable, a refused query, or no data (worth
    another try within the workflow's budget)."""


class Prometheus:
    """The HTTP API's instant query (``/api/v1/query``), through one connection pool."""

    def __init__(self, url: str, timeout: float = QUERY_TIMEOUT) -> None:
        self.url = url.rstrip("/")
        self.shown = redact_url(self.url)  # what an error or an Event prints of it
        self.http = urllib3.PoolManager(
            timeout=urllib3.Timeout(total=timeout), retries=urllib3.Retry(0), maxsize=MOST_QUERIES
        )
        self._scrape_interval: timedelta | None = None

    def scrape_interval(self) -> timedelta:
        """How often it scrapes: its configuration's ``global.scrape_interval``, read once
        (``/api/v1/status/config``); Prometheus's default (1m) where that is not served (a
        Thanos or Mimir front) or does not say. A baseline ends this much before the cut."""
        if self._scrape_interval is not None:
            return self._scrape_interval
        try:
            response = self.http.request("GET", f"{self.url}/api/v1/status/config")
        except urllib3.exceptions.HTTPError:
            return DEFAULT_SCRAPE_INTERVAL  # unreachable now: asked again next time, not kept
        self._scrape_interval = DEFAULT_SCRAPE_INTERVAL  # what it answered is kept
        try:
            config = yaml.safe_load(json.loads(response.data)["data"]["yaml"]) or {}
            said = (config.get("global") or {}).get("scrape_interval")
            if said:
                self._scrape_interval = parse_duration(str(said))
        except (ValueError, KeyError, TypeError, yaml.YAMLError):
            log.info("%s: no scrape interval read, taking Prometheus's default", self.shown)
        return self._scrape_interval

    def query(self, expr: str, at: datetime) -> list[tuple[dict[str, str], float]]:
        """The series ``expr`` returns at ``at``: (labels, value) each. POSTed as a form, as the
        HTTP API allows: a large cohort's exact pod names would not fit a URL."""
        try:
            response = self.http.request_encode_body(
                "POST",
                f"{self.url}/api/v1/query",
                fields={"query": expr, "time": str(at.timestamp())},
                encode_multipart=False,
            )
        except urllib3.exceptions.HTTPError as exc:
            why = str(getattr(exc, "reason", None) or exc).split("): ", 1)[-1]  # not the URL
            raise PrometheusError(f"Prometheus at {self.shown} unreachable: {why}") from None
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


@dataclass(frozen=True)
class Cohort:
    """The pods a verdict's checks read, by name, and the containers each built-in check
    applies to (those whose running resources carry the limit its series need)."""

    pods: tuple[str, ...]
    containers: frozenset[str]
    cpu_limited: frozenset[str]
    memory_limited: frozenset[str]

    @classmethod
    def of(cls, pods: Iterable[Obj]) -> Cohort:
        names: list[str] = []
        containers: set[str] = set()
        cpu: set[str] = set()
        memory: set[str] = set()
        for pod in pods:
            names.append(pod["metadata"]["name"])
            containers.update(c["name"] for c in pod.get("spec", {}).get("containers") or [])
            for container, limits in actual_resources(pod)[1].items():
                if positive(limits.get("cpu")):
                    cpu.add(container)
                if positive(limits.get("memory")):
                    memory.add(container)
        return cls(tuple(sorted(names)), frozenset(containers), frozenset(cpu), frozenset(memory))


def exactly(names: Iterable[str]) -> str:
    """A regular expression matching exactly ``names``, as written inside a PromQL string:
    Prometheus anchors it, and a name's ``.`` (the only one of its characters special to a
    regular expression) is escaped, its backslash doubled for the string."""
    return "|".join(name.replace(".", "\\\\.") for name in names)


def _selector(namespace: str, cohort: Cohort, containers: Iterable[str]) -> str:
    return (
        f'namespace="{namespace}",pod=~"{exactly(cohort.pods)}",'
        f'container=~"{exactly(sorted(containers))}"'
    )


def cpu_throttling_query(
    namespace: str, cohort: Cohort, containers: Iterable[str], window: timedelta
) -> str:
    sel, w = _selector(namespace, cohort, containers), format_duration(window)
    return (
        f"max by (container) (increase(container_cpu_cfs_throttled_periods_total{{{sel}}}[{w}])"
        f" / increase(container_cpu_cfs_periods_total{{{sel}}}[{w}]))"
    )


def memory_headroom_query(
    namespace: str, cohort: Cohort, containers: Iterable[str], window: timedelta
) -> str:
    sel, w = _selector(namespace, cohort, containers), format_duration(window)
    return (
        f"max by (container) (max_over_time(container_memory_working_set_bytes{{{sel}}}[{w}])"
        f" / (max_over_time(container_spec_memory_limit_bytes{{{sel}}}[{w}]) > 0))"
    )


def custom_query(
    check: QueryCheck, namespace: str, owner: str, cohort: Cohort, window: timedelta
) -> str:
    values = {
        "$namespace": namespace,
        "$owner": owner,
        "$pods": exactly(cohort.pods),
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
    left_out: tuple[str, ...] = (),
) -> CheckResult:
    """Each container's percent against the bounds; the worst one decides. ``left_out``: the
    cohort's containers the check does not apply to, named in its message."""
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
    notes = []
    if max_increase is not None and baseline is None:
        notes.append("no baseline: no series before the cut, maxIncreasePoints not judged")
    if left_out:
        notes.append(f"not applicable to {', '.join(left_out)}")
    said = worst[2] if worst else f"{shown}, within {' and '.join(bounds)}"
    return CheckResult(
        name=name,
        reason=reason,
        value=round(100 * highest, 3),
        baseline=None if baseline is None else round(100 * baseline, 3),
        bound=" and ".join(bounds),
        passed=worst is None,
        message=said + "".join(f" ({n})" for n in notes),
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
        message=(
            f"{check.name}: {'; '.join(problems)}"
            if problems
            else f"{check.name}: {value:g}"
            + (f", within {' and '.join(bounds)}" if bounds else "")
            + (f" {base:g}" if base is not None and check.max_increase_percent is not None else "")
        )
        + (
            " (no baseline: no data before the cut, maxIncreasePercent not judged)"
            if check.max_increase_percent is not None and base is None
            else ""
        ),
    )


def not_applicable(name: str, reason: FailureReason, why: str) -> CheckResult:
    """A check no container of the cohort can have data for: it passes, and says why."""
    return CheckResult(
        name=name, reason=reason, passed=True, applicable=False, message=f"{name}: {why}"
    )


@dataclass(frozen=True)
class BuiltIn:
    """A built-in check: its name and failure, what its percent is of, its bounds in the
    policy, the containers it applies to, its query, and why a cohort without such a container
    has no data for it."""

    name: str
    reason: FailureReason
    what: str
    bounds: Callable[[HealthChecks], CpuThrottlingCheck | MemoryHeadroomCheck | None]
    applies_to: Callable[[Cohort], frozenset[str]]
    query: Callable[[str, Cohort, Iterable[str], timedelta], str]
    not_applicable: str


BUILT_IN = (
    BuiltIn("cpuThrottling", FailureReason.CPU_THROTTLED, "CPU throttled",
            lambda c: c.cpu_throttling, lambda c: c.cpu_limited, cpu_throttling_query,
            "not applicable: no container has a CPU limit (CFS throttling exists only under a"
            " CPU quota)"),
    BuiltIn("memoryHeadroom", FailureReason.MEMORY_HEADROOM_LOW, "memory used",
            lambda c: c.memory_headroom, lambda c: c.memory_limited, memory_headroom_query,
            "not applicable: no container has a memory limit (no headroom to lose)"),
)  # fmt: skip


Ask = tuple[str, bool, str, datetime]  # (check, at the window's end?, query, time)
Planned = tuple[BuiltIn, CpuThrottlingCheck | MemoryHeadroomCheck, frozenset[str]]


def check_health(prometheus: Prometheus, request: HealthInput, cohort: Cohort) -> HealthResult:
    """Every check of ``request.checks`` at the window's end, over ``cohort``'s pods; raises
    ``PrometheusError``."""
    asks, built_in, results = _plan(request, cohort, prometheus.scrape_interval())
    answers = _ask_all(prometheus, asks)
    for name, at_end, _, _ in asks:
        if at_end and not answers[(name, True)]:
            raise PrometheusError(f"{name}: no data for {request.owner} at the window's end")
    for check, bounds, containers in built_in:
        name = check.name
        now = _per_container(answers[(name, True)])
        if not now:
            raise PrometheusError(f"{name}: only NaN for {request.owner} at the window's end")
        before = _per_container(answers[(name, False)]) if (name, False) in answers else None
        results[name] = _percent_check(
            name,
            check.reason,
            check.what,
            now,
            before,
            bounds.max_percent,
            bounds.max_increase_points,
            tuple(sorted(cohort.containers - containers)),
        )
    for query in request.checks.queries:
        values = [v for _, v in answers[(query.name, True)] if not math.isnan(v)]
        if not values:
            raise PrometheusError(f"{query.name}: only NaN at the window's end")
        base = None
        if (query.name, False) in answers:
            base = [v for _, v in answers[(query.name, False)] if not math.isnan(v)] or None
        results[query.name] = _custom_check(query, values, base)
    order = [b.name for b in BUILT_IN] + [q.name for q in request.checks.queries]
    return HealthResult(
        checks=[results[name] for name in order if name in results], queries=len(asks)
    )


def _plan(
    request: HealthInput, cohort: Cohort, scrape: timedelta
) -> tuple[list[Ask], list[Planned], dict[str, CheckResult]]:
    """Every query to ask (at the window's end, and at the baseline's for a bound relative to
    it: ending a ``scrape`` interval before the cut, as a scrape in flight as it lands carries
    its value), the built-in checks that apply, and the results known without asking (a
    built-in check no container can have data for passes as not applicable)."""
    checks: HealthChecks = request.checks
    ns, owner = request.owner.namespace, request.owner.name
    end = request.window_ends_at
    window = end - request.window_started_at
    baseline_end = (request.baseline_at or request.window_started_at) - scrape
    asks: list[Ask] = []
    built_in: list[Planned] = []
    results: dict[str, CheckResult] = {}
    for check in BUILT_IN:
        bounds = check.bounds(checks)
        if bounds is None:
            continue
        containers = check.applies_to(cohort)
        if not containers:
            results[check.name] = not_applicable(check.name, check.reason, check.not_applicable)
            continue
        expr = check.query(ns, cohort, containers, window)
        asks.append((check.name, True, expr, end))
        if bounds.max_increase_points is not None:
            asks.append((check.name, False, expr, baseline_end))
        built_in.append((check, bounds, containers))
    for query in checks.queries:
        expr = custom_query(query, ns, owner, cohort, window)
        asks.append((query.name, True, expr, end))
        if query.max_increase_percent is not None:
            asks.append((query.name, False, expr, baseline_end))
    return asks, built_in, results


def _ask_all(
    prometheus: Prometheus, asks: list[Ask]
) -> dict[tuple[str, bool], list[tuple[dict[str, str], float]]]:
    """Every query at once (each within the client's timeout): the first error raises, naming
    its check."""
    if not asks:
        return {}

    def one(ask: tuple[str, bool, str, datetime]) -> list[tuple[dict[str, str], float]]:
        name, _, expr, at = ask
        try:
            return prometheus.query(expr, at)
        except PrometheusError as exc:
            raise PrometheusError(f"{name}: {exc}") from None

    with ThreadPoolExecutor(max_workers=len(asks), thread_name_prefix="prometheus") as pool:
        found = list(pool.map(one, asks))
    return {(name, at_end): f for (name, at_end, _, _), f in zip(asks, found, strict=True)}
