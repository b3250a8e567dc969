"""The health checks against a real Prometheus (Debian's) scraping the simulated cluster's
kubelets (their cAdvisor metrics, through the emulator's API server proxy): a CPU cut that
throttles and a memory cut at 97% of its limit fail, a roomy cut passes, a query of one's own
is judged, and no data, a refused query or no Prometheus at all is an error, never a pass."""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from activities.health import Prometheus, PrometheusError, check_health
from sim.apiserver import KubeEmulator
from sim.cluster import Behaviour, SimulatedCluster
from sim.prometheus import LocalPrometheus
from workflows.activity_api import HealthInput, OwnerRef
from workflows.contract import FailureReason, WorkloadKind
from workflows.policy import HealthChecks

NS = "shop"
WINDOW = timedelta(seconds=8)
CHECKS = HealthChecks.model_validate(
    {"cpuThrottling": {"maxPercent": 25}, "memoryHeadroom": {"maxPercent": 90}}
)


def deployment(name: str, cpu: str, memory: str) -> dict:  # type: ignore[type-arg]
    resources = {
        "requests": {"cpu": cpu, "memory": memory},
        "limits": {"cpu": cpu, "memory": memory},
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "app", "image": "x", "resources": resources}]},
            },
        },
    }  # fmt: skip


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, datetime]]:
    """A cut that throttles (800m used, 500m allowed) and runs at 97% of its memory ("cut"),
    one with room to spare ("roomy"), scraped every second for a window: Prometheus's URL and
    the window's end."""
    with KubeEmulator() as api:
        api.store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        allocatable = {"cpu": "16", "memory": "64Gi", "pods": "110"}
        node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-1"}}
        api.store.create({**node, "status": {"allocatable": allocatable}})
        sim = SimulatedCluster(api.store)
        app = Behaviour(cpu="800m", working_set="497Mi", startup=0.0)
        sim.add(deployment("cut", "500m", "512Mi"), {"app": app})
        sim.add(deployment("roomy", "2", "1Gi"), {"app": app})
        api.cadvisor = sim.cadvisor
        sim.start()
        workdir = Path(tmp_path_factory.mktemp("prometheus"))
        prometheus = LocalPrometheus.of_kubelets(workdir, api.url, ["node-1"]).wait_ready()
        try:
            deadline = time.monotonic() + 60
            while not _has_window(prometheus.url):
                assert time.monotonic() < deadline, "Prometheus never had a window of samples"
                time.sleep(0.5)
            yield prometheus.url, datetime.now(UTC)
        finally:
            prometheus.stop()
            sim.stop()


def _has_window(url: str) -> bool:
    """Every container has a window's worth of scrapes (the periods grew over it)."""
    expr = f"count(increase(container_cpu_cfs_periods_total[{int(WINDOW.total_seconds())}s]) > 50)"
    query = urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(f"{url}/api/v1/query?{query}", timeout=5) as response:
        result = json.loads(response.read())["data"]["result"]
    return bool(result) and float(result[0]["value"][1]) >= 4


def ask(url: str, owner: str, end: datetime, checks: HealthChecks = CHECKS) -> list:  # type: ignore[type-arg]
    request = HealthInput(
        cluster="test",
        owner=OwnerRef(namespace=NS, kind=WorkloadKind.DEPLOYMENT, name=owner),
        checks=checks,
        window_started_at=end - WINDOW,
        window_ends_at=end,
    )
    return check_health(Prometheus(url), request).checks


def test_a_cut_that_throttles_and_leaves_no_memory_headroom_fails_both(
    scraped: tuple[str, datetime],
) -> None:
    url, end = scraped
    cpu, memory = ask(url, "cut", end)
    assert (cpu.name, cpu.reason, cpu.passed) == (
        "cpuThrottling",
        FailureReason.CPU_THROTTLED,
        False,
    )
    assert cpu.value is not None and 30 < cpu.value < 45  # 1 - 500m/800m = 37.5%
    assert "app: CPU throttled" in cpu.message and "> 25%" in cpu.message
    assert (memory.reason, memory.passed) == (FailureReason.MEMORY_HEADROOM_LOW, False)
    assert memory.value == pytest.approx(100 * 497 / 512, abs=0.1)  # 97.1%


def test_a_cut_with_room_to_spare_passes(scraped: tuple[str, datetime]) -> None:
    url, end = scraped
    cpu, memory = ask(url, "roomy", end)
    assert cpu.passed and cpu.value == 0
    assert memory.passed and memory.value == pytest.approx(100 * 497 / 1024, abs=0.1)


def test_a_query_of_ones_own_is_judged_against_its_threshold(
    scraped: tuple[str, datetime],
) -> None:
    url, end = scraped
    throttled = (
        'sum(rate(container_cpu_cfs_throttled_periods_total{namespace="$namespace",'
        'pod=~"$pods"}[$window]))'
    )
    checks = HealthChecks.model_validate(
        {"queries": [{"name": "throttling-rate", "promql": throttled, "healthyWhen": "<",
                      "threshold": 1}]}
    )  # fmt: skip
    (cut,) = ask(url, "cut", end, checks)
    (roomy,) = ask(url, "roomy", end, checks)
    assert (cut.reason, cut.passed) == (FailureReason.HEALTH_CHECK_FAILED, False)
    assert cut.value is not None and cut.value > 1  # throttled periods per second, both pods
    assert "throttling-rate:" in cut.message and "is not < 1" in cut.message
    assert roomy.passed and roomy.value == 0


def test_no_data_a_refused_query_or_no_prometheus_is_an_error_never_a_pass(
    scraped: tuple[str, datetime],
) -> None:
    url, end = scraped
    with pytest.raises(PrometheusError, match="no data for shop/Deployment/ghost"):
        ask(url, "ghost", end)
    bad = HealthChecks.model_validate(  # parses, but Prometheus refuses it (a bad regex)
        {"queries": [{"name": "q", "promql": 'label_replace(up, "a", "b", "c", "(")',
                      "healthyWhen": "<", "threshold": 1}]}
    )  # fmt: skip
    with pytest.raises(PrometheusError, match="refused the query"):
        ask(url, "cut", end, bad)
    with pytest.raises(PrometheusError, match="unreachable"):
        ask("http://127.0.0.1:9", "cut", end)
