"""The health checks against a real Prometheus (Debian's) scraping the simulated cluster's
kubelets (their cAdvisor metrics, through the emulator's API server proxy), asked through the
``check_health`` activity over the real client: a CPU cut that throttles and a memory cut at 97%
of its limit fail, a roomy cut passes, a query of one's own is judged; the cohort's pods are
read by their exact names (``api`` never reads ``api-gateway``'s); a check no container can have
data for (no limit) is not applicable and passes, saying so; relative bounds judge against the
baseline before the cut; the queries are asked at once, a slow one failing within its timeout;
and no data, a refused query or no Prometheus at all is an error, never a pass."""

from __future__ import annotations

import copy
import dataclasses
import json
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import CoreV1Api, CustomObjectsApi

from activities.health import QUERY_TIMEOUT, Prometheus, PrometheusError
from activities.kubernetes import KubernetesActivities
from sim.apiserver import KubeEmulator, free_port
from sim.cluster import Behaviour, SimulatedCluster
from sim.prometheus import SCRAPE_INTERVAL, LocalPrometheus
from worker.kube import api_client
from workflows.activity_api import CheckResult, HealthInput, OwnerRef
from workflows.contract import Actuation, FailureReason, WorkloadKind
from workflows.fingerprint import Recommendation
from workflows.machine import baseline_at, initial_state
from workflows.policy import HealthChecks

NS = "shop"
WINDOW = timedelta(seconds=8)
CHECKS = HealthChecks.model_validate(
    {"cpuThrottling": {"maxPercent": 25}, "memoryHeadroom": {"maxPercent": 90}}
)


def deployment(name: str, cpu: str, memory: str, limits: bool = True, **extra: Any) -> dict:  # type: ignore[type-arg]
    resources: dict[str, Any] = {"requests": {"cpu": cpu, "memory": memory}}
    if limits:
        resources["limits"] = {"cpu": cpu, "memory": memory}
    containers = [{"name": "app", "image": "x", "resources": resources}, *extra.get("more", [])]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": containers},
            },
        },
    }  # fmt: skip


@dataclass
class Scraped:
    prometheus: str  # its URL
    acts: KubernetesActivities  # the activities, over the real client, asking it
    changed_at: datetime  # web's latency doubled here (the window's start: the cut)
    end: datetime  # a window after it
    cadvisor: Callable[[str], str]  # what a node's kubelet serves Prometheus


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scraped]:
    """A cut that throttles (800m used, 500m allowed) and runs at 97% of its memory ("cut"),
    one with room to spare ("roomy"), ``api`` roomy beside ``api-gateway`` throttled, one with
    requests and no limits, one whose sidecar has no limit, and ``web`` whose latency doubles
    at the cut, scraped every second for a window before and after."""
    with KubeEmulator() as api, api_client(url=api.url) as client:
        api.store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        allocatable = {"cpu": "64", "memory": "128Gi", "pods": "110"}
        node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-1"}}
        api.store.create({**node, "status": {"allocatable": allocatable}})
        sim = SimulatedCluster(api.store)
        app = Behaviour(cpu="800m", working_set="497Mi", startup=0.0)
        sidecar = {"name": "log", "image": "x", "resources": {"requests": {"memory": "64Mi"}}}
        sim.add(deployment("cut", "500m", "512Mi"), {"app": app})
        sim.add(deployment("roomy", "2", "1Gi"), {"app": app})
        sim.add(deployment("api", "2", "1Gi"), {"app": app})
        sim.add(deployment("api-gateway", "500m", "512Mi"), {"app": app})
        sim.add(deployment("nolimits", "500m", "512Mi", limits=False), {"app": app})
        sim.add(deployment("mixed", "500m", "1Gi", more=[sidecar]), {"app": app})
        web = Behaviour(cpu="100m", working_set="100Mi", startup=0.0, latency="50ms")
        sim.add(deployment("web", "1", "1Gi"), {"app": web})
        api.cadvisor = sim.cadvisor
        sim.start()
        workdir = Path(tmp_path_factory.mktemp("prometheus"))
        prometheus = LocalPrometheus.of_kubelets(workdir, api.url, ["node-1"]).wait_ready()
        acts = KubernetesActivities(
            CoreV1Api(client),
            CustomObjectsApi(client),
            Actuation.ANNOTATIONS,
            "test",
            prometheus=Prometheus(prometheus.url),
        )
        try:
            _wait_for_window(prometheus.url)
            changed_at = datetime.now(UTC)
            sim.behave(("Deployment", NS, "web"), "app", latency="100ms")
            time.sleep(WINDOW.total_seconds() + 5)  # a window of scrapes after, and a few more
            yield Scraped(prometheus.url, acts, changed_at, datetime.now(UTC), sim.cadvisor)
        finally:
            prometheus.stop()
            sim.stop()


def _wait_for_window(url: str) -> None:
    """Until every throttled or roomy container has a window's worth of scrapes."""
    deadline = time.monotonic() + 60
    expr = f"count(increase(container_cpu_cfs_periods_total[{int(WINDOW.total_seconds())}s]) > 50)"
    query = urllib.parse.urlencode({"query": expr})
    while True:
        with urllib.request.urlopen(f"{url}/api/v1/query?{query}", timeout=5) as response:
            result = json.loads(response.read())["data"]["result"]
        if result and float(result[0]["value"][1]) >= 12:  # 6 CPU-limited workloads x 2 pods
            return
        assert time.monotonic() < deadline, "Prometheus never had a window of samples"
        time.sleep(0.5)


def ask(
    scraped: Scraped,
    owner: str,
    checks: HealthChecks = CHECKS,
    end: datetime | None = None,
    baseline_at: datetime | None = None,
) -> list[CheckResult]:
    end = end or scraped.end
    request = HealthInput(
        cluster="test",
        owner=OwnerRef(namespace=NS, kind=WorkloadKind.DEPLOYMENT, name=owner),
        checks=checks,
        window_started_at=end - WINDOW,
        window_ends_at=end,
        baseline_at=baseline_at,
    )
    return scraped.acts.check_health(request).checks


def test_a_cut_that_throttles_and_leaves_no_memory_headroom_fails_both(
    scraped: Scraped,
) -> None:
    cpu, memory = ask(scraped, "cut")
    assert (cpu.name, cpu.reason, cpu.passed) == (
        "cpuThrottling",
        FailureReason.CPU_THROTTLED,
        False,
    )
    assert cpu.value is not None and 30 < cpu.value < 45  # 1 - 500m/800m = 37.5%
    assert "app: CPU throttled" in cpu.message and "> 25%" in cpu.message
    assert (memory.reason, memory.passed) == (FailureReason.MEMORY_HEADROOM_LOW, False)
    assert memory.value == pytest.approx(100 * 497 / 512, abs=0.1)  # 97.1%


def test_a_cut_with_room_to_spare_passes(scraped: Scraped) -> None:
    cpu, memory = ask(scraped, "roomy")
    assert cpu.passed and cpu.value == 0
    assert memory.passed and memory.value == pytest.approx(100 * 497 / 1024, abs=0.1)


def test_a_query_of_ones_own_is_judged_against_its_threshold(
    scraped: Scraped,
) -> None:
    throttled = (
        'sum(rate(container_cpu_cfs_throttled_periods_total{namespace="$namespace",'
        'pod=~"$pods"}[$window]))'
    )
    checks = HealthChecks.model_validate(
        {"queries": [{"name": "throttling-rate", "promql": throttled, "healthyWhen": "<",
                      "threshold": 1}]}
    )  # fmt: skip
    (cut,) = ask(scraped, "cut", checks)
    (roomy,) = ask(scraped, "roomy", checks)
    assert (cut.reason, cut.passed) == (FailureReason.HEALTH_CHECK_FAILED, False)
    assert cut.value is not None and cut.value > 1  # throttled periods per second, both pods
    assert "throttling-rate:" in cut.message and "is not < 1" in cut.message
    assert roomy.passed and roomy.value == 0


def asking(scraped: Scraped, url: str) -> Scraped:
    """``scraped`` with its activities asking the Prometheus at ``url``."""
    acts = copy.copy(scraped.acts)
    acts.prometheus = Prometheus(url)
    return dataclasses.replace(scraped, acts=acts)


def test_no_data_a_refused_query_or_no_prometheus_is_an_error_never_a_pass(
    scraped: Scraped,
) -> None:
    long_ago = scraped.changed_at - timedelta(hours=1)  # before Prometheus scraped anything
    with pytest.raises(PrometheusError, match="no data for shop/Deployment/cut"):
        ask(scraped, "cut", end=long_ago)
    bad = HealthChecks.model_validate(  # parses, but Prometheus refuses it (a bad regex)
        {"queries": [{"name": "q", "promql": 'label_replace(up, "a", "b", "c", "(")',
                      "healthyWhen": "<", "threshold": 1}]}
    )  # fmt: skip
    with pytest.raises(PrometheusError, match="q: Prometheus refused the query"):
        ask(scraped, "cut", bad)
    with pytest.raises(PrometheusError, match="unreachable"):
        ask(asking(scraped, "http://127.0.0.1:9"), "cut")


def test_a_workload_is_read_by_its_pods_exact_names_never_a_prefix(scraped: Scraped) -> None:
    """``api`` has room; ``api-gateway``, whose pods' names begin with ``api-``, is throttled:
    a name-prefix selector (``api-.+``) would read both and fail ``api``."""
    cpu, _ = ask(scraped, "api")
    assert cpu.passed and cpu.value == 0, cpu
    gateway, _ = ask(scraped, "api-gateway")
    assert not gateway.passed and gateway.value is not None and gateway.value > 30


def test_a_check_no_container_can_have_data_for_is_not_applicable_and_passes(
    scraped: Scraped,
) -> None:
    """No CPU limit: cAdvisor exports no CFS series (it needs a quota); no memory limit: no
    headroom to lose. Neither waits for data that cannot come."""
    cpu, memory = ask(scraped, "nolimits")
    assert (cpu.passed, cpu.applicable, memory.passed, memory.applicable) == (
        True,
        False,
        True,
        False,
    )
    assert "not applicable: no container has a CPU limit" in cpu.message
    assert "not applicable: no container has a memory limit" in memory.message
    cpu, memory = ask(scraped, "mixed")  # app limited and throttled, its log sidecar not
    assert not cpu.passed and cpu.applicable
    assert "app: CPU throttled" in cpu.message and "(not applicable to log)" in cpu.message


def test_relative_bounds_judge_against_the_baseline_before_the_cut(scraped: Scraped) -> None:
    """``cut`` was throttled (37.5%) before and after: over an absolute 25% it fails, but a
    memory-only cut did not raise it, so within 10 points of its baseline it passes. ``web``'s
    latency doubled at the cut: 50% worse than its baseline fails ``maxIncreasePercent``."""
    points = HealthChecks.model_validate({"cpuThrottling": {"maxIncreasePoints": 10}})
    (cpu,) = ask(scraped, "cut", points, baseline_at=scraped.end - WINDOW)
    assert cpu.passed, cpu
    assert cpu.baseline is not None and 30 < cpu.baseline < 45  # throttled before the cut too
    assert "baseline" in cpu.message
    latency = HealthChecks.model_validate(
        {"queries": [{"name": "p99", "healthyWhen": "<", "maxIncreasePercent": 50,
                      "promql": 'max(app_request_latency_seconds{namespace="$namespace",'
                                ' pod=~"$pods"})'}]}
    )  # fmt: skip
    # A scrape in flight as the latency changed is stamped with its start, just before the
    # change, yet carries the new value: the activity ends the baseline a scrape interval (its
    # Prometheus's, read from it: 1s here) before the time it is given.
    (slower,) = ask(scraped, "web", latency, baseline_at=scraped.changed_at)
    assert not slower.passed, slower
    assert (slower.value, slower.baseline) == (pytest.approx(0.1), pytest.approx(0.05))
    assert "more than 50% above its baseline 0.05" in slower.message
    assert scraped.acts.prometheus is not None
    assert scraped.acts.prometheus.scrape_interval() == timedelta(seconds=SCRAPE_INTERVAL)
    # Baselined at a window that opened under the cut (what a reopen's own start would be),
    # the doubled latency would look like no change: why the baseline is the turn's first.
    (hidden,) = ask(scraped, "web", latency)
    assert hidden.passed and hidden.baseline == pytest.approx(0.1), hidden


def test_a_baseline_ends_before_the_cut_however_late_the_window_opened(scraped: Scraped) -> None:
    """The cut lands (``web``'s latency doubles), and its window opens later: the run's start
    (signal-with-start, its first read) takes seconds, more under load, and Prometheus scrapes
    meanwhile. For 20 such delays, the baseline the run computes (``machine.baseline_at``, from
    when the intake saw the cut adopted) ends before the cut: every verdict finds the latency
    50% worse. Before, it ended at the window's start, and those scrapes made the doubled
    latency its own baseline (a fitting verdict in 3 runs of 4, measured)."""
    latency = HealthChecks.model_validate(
        {"queries": [{"name": "p99", "healthyWhen": "<", "maxIncreasePercent": 30,
                      "promql": 'max(app_request_latency_seconds{namespace="$namespace",'
                                ' pod=~"$pods"})'}]}
    )  # fmt: skip
    for step in range(1, 21):
        opened = scraped.changed_at + timedelta(seconds=0.2 * step)
        state = initial_state(OwnerRef(namespace=NS, kind=WorkloadKind.DEPLOYMENT, name="web"),
                              Recommendation(requests={"app": {"cpu": "1"}}))  # fmt: skip
        state = state.model_copy(
            update={"window_started_at": opened, "adopted_at": scraped.changed_at}
        )
        (result,) = ask(
            scraped, "web", latency, end=opened + WINDOW, baseline_at=baseline_at(state)
        )
        assert not result.passed and result.baseline == pytest.approx(0.05), (step, result)
        assert "more than 30% above its baseline 0.05" in result.message


def test_the_scrape_interval_is_read_once_it_answers_not_fixed_while_unreachable() -> None:
    """Unreachable at the first verdict: Prometheus's default for now, and asked again; once it
    answers, its own ``global.scrape_interval`` (here 15s), kept."""
    port = free_port()
    prometheus = Prometheus(f"http://127.0.0.1:{port}")
    assert prometheus.scrape_interval() == timedelta(minutes=1)  # nothing listens yet
    answered: list[str] = []

    class Config(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            answered.append(self.path)
            body = json.dumps(
                {"status": "success", "data": {"yaml": "global:\n  scrape_interval: 15s\n"}}
            )
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Config)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert prometheus.scrape_interval() == timedelta(seconds=15)
        assert prometheus.scrape_interval() == timedelta(seconds=15)
        assert answered == ["/api/v1/status/config"]  # read once it answered, then kept
    finally:
        server.shutdown()


class SlowPrometheus(ThreadingHTTPServer):
    """A stand-in for Prometheus (our boundary) that holds each query until ``together`` are
    in flight at once, or ``delay`` seconds passed, counting how many it holds at once: asked
    all at once, they are answered together however slowly the machine starts the client's
    threads; asked one by one, each waits out ``delay``."""

    def __init__(self, delay: float, together: int | None = None) -> None:
        self.delay, self.together, self.inflight, self.most = delay, together, 0, 0
        self.arrived = threading.Condition()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with server.arrived:
                    server.inflight += 1
                    server.most = max(server.most, server.inflight)
                    server.arrived.notify_all()
                    server.arrived.wait_for(
                        lambda: server.together is not None and server.most >= server.together,
                        timeout=server.delay,
                    )
                with server.arrived:
                    server.inflight -= 1
                body = {"status": "success", "data": {"resultType": "vector", "result": [
                    {"metric": {"container": "app"}, "value": [0, "0.01"]}]}}  # fmt: skip
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


def test_the_queries_are_asked_at_once_and_a_slow_one_fails_within_its_timeout(
    scraped: Scraped,
) -> None:
    every = HealthChecks.model_validate(
        {"cpuThrottling": {"maxPercent": 25, "maxIncreasePoints": 10},
         "memoryHeadroom": {"maxPercent": 90, "maxIncreasePoints": 10},
         "queries": [{"name": f"q{i}", "healthyWhen": "<", "threshold": 1,
                      "maxIncreasePercent": 50, "promql": 'max(up{namespace="$namespace"})'}
                     for i in range(4)]}
    )  # fmt: skip
    slow = SlowPrometheus(delay=5.0, together=12)
    try:
        checks = ask(asking(scraped, slow.url), "cut", every)
        assert len(checks) == 6 and all(c.passed for c in checks)
        assert slow.most == 12  # 6 checks, each at the window's end and at its baseline: at once
    finally:
        slow.shutdown()
    stuck = SlowPrometheus(delay=QUERY_TIMEOUT + 5)
    try:
        fast = asking(scraped, stuck.url)
        fast.acts.prometheus = Prometheus(stuck.url, timeout=1.0)
        with pytest.raises(PrometheusError, match=r"cpuThrottling: Prometheus at .* unreachable"):
            ask(fast, "cut")
    finally:
        stuck.shutdown()


def test_the_simulated_kubelet_exports_cadvisors_series_under_cadvisors_conditions(
    scraped: Scraped,
) -> None:
    """cAdvisor's collector gives the CFS series the condition ``Cpu.Quota != 0`` (a CPU limit)
    and reports an unlimited memory limit as 0 (``specMemoryValue``)."""
    lines = scraped.cadvisor("node-1").splitlines()

    def series(metric: str, workload: str) -> list[str]:
        return [x for x in lines if x.startswith(metric + "{") and f'pod="{workload}-' in x]

    assert series("container_cpu_cfs_periods_total", "cut")  # limited: exported
    assert not series("container_cpu_cfs_periods_total", "nolimits")
    assert not series("container_cpu_cfs_throttled_periods_total", "nolimits")
    memory = series("container_spec_memory_limit_bytes", "nolimits")
    assert memory and all(x.endswith(" 0") for x in memory)
    assert series("container_memory_working_set_bytes", "nolimits")  # usage is always there
