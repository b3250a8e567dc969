"""A real Prometheus (Debian's ``prometheus``) scraping the real worker and intake while a
rollback story plays on the simulated cluster: every alert expression and every dashboard query
parses, the alert rules load and evaluate without error, and the metrics they read have series.
"""

from __future__ import annotations

import contextlib
import json
import re
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from sim.apiserver import free_port
from sim.prometheus import LocalPrometheus
from sim.scenario import DEFAULT_CLUSTER, Apply, Scenario, Step, World
from tests.conftest import ROOT
from tests.e2e.test_policy_status import OOMS, deployment, rollback_policy, state, until
from workflows.contract import TASK_QUEUE

MONITORING = ROOT / "deploy" / "components" / "monitoring"
METRIC = re.compile(r"\b((?:rollback|temporal)_[a-z_]+)\b")


def alert_rules() -> list[dict[str, Any]]:
    spec = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())["spec"]
    return [r for g in spec["groups"] for r in g["rules"]]


def dashboard_queries() -> list[str]:
    dashboard = json.loads((MONITORING / "dashboard.json").read_text())
    return [
        # Grafana's variables, as Grafana fills them (the cluster picked: the scenario's)
        t["expr"].replace("$__rate_interval", "1m").replace("$cluster", DEFAULT_CLUSTER)
        for panel in dashboard["panels"]
        for t in panel["targets"]
    ]


class Prometheus(LocalPrometheus):
    """Scraping the engine's own metrics endpoints, with the chart's alert rules."""

    def __init__(self, workdir: Path, targets: list[str], rules: Path) -> None:
        scrape = [{"job_name": "rollback", "static_configs": [{"targets": targets}]}]
        super().__init__(workdir, scrape, [rules])

    def query(self, expr: str) -> list[Any]:
        answer = self.get("/api/v1/query", query=expr)
        assert answer["status"] == "success", (expr, answer)
        result: list[Any] = answer["data"]["result"]
        return result


@pytest.fixture
async def receiver() -> AsyncIterator[str]:
    async def ok(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(status=200)

    app = web.Application()
    app.router.add_post("/", ok)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield f"http://127.0.0.1:{port}/"
    await runner.cleanup()


async def test_alerts_and_dashboard_read_what_the_engine_exports(
    receiver: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    scenario = Scenario.model_validate(
        {
            "name": "prometheus",
            "workloads": [deployment("shop")],
            "policies": [rollback_policy("shop")],
        }
    )
    with tempfile.TemporaryDirectory(prefix="rollback-prometheus-") as tmp:
        workdir = Path(tmp)
        notifications = workdir / "notifications.yaml"
        notifications.write_text(yaml.safe_dump({"receivers": [{"name": "hook", "url": receiver}]}))
        monkeypatch.setenv("ROLLBACK_NOTIFICATIONS", str(notifications))
        rules = workdir / "rules.yaml"
        groups = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())["spec"]["groups"]
        rules.write_text(yaml.safe_dump({"groups": groups}))
        endpoints = (f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}")
        world = World(
            scenario, lambda line: None, workdir, task_queue=TASK_QUEUE, metrics=endpoints
        )
        prometheus = Prometheus(workdir, list(endpoints), rules)
        try:
            await world.start()
            await until(prometheus.ready, 60)
            await world.run_step(
                Step(apply=Apply(workload="shop/Deployment/api", requests=OOMS, limits=OOMS))
            )
            await until(lambda: state(world, "shop").get("mode") == "failedPermanent", 60)
            # The intake's status pass and a few scrapes after the story.
            await until(lambda: prometheus.query('rollback_notifications{outcome="sent"}'), 60)
            await until(
                lambda: prometheus.query('rollback_owner_workloads{mode="failedPermanent"} > 0')
            )

            def missing() -> list[str]:
                """What the rules and the dashboard read that has no series yet (a scrape after
                the story brings them: waited for, not slept on)."""
                exported = {s["metric"]["__name__"] for s in prometheus.query('{__name__=~".+"}')}
                gaps = [
                    f"{rule['alert']} reads {name}, which has no series"
                    for rule in alert_rules()
                    for name in set(METRIC.findall(rule["expr"]))
                    if name not in exported
                ]
                return gaps + [
                    f"dashboard query returns nothing: {expr}"
                    for expr in dashboard_queries()
                    if not prometheus.query(expr)
                ]

            with contextlib.suppress(TimeoutError):
                await until(lambda: not missing(), 30)
            assert missing() == []
            up = prometheus.query("up")
            assert sorted(s["value"][1] for s in up) == ["1", "1"], up  # both scraped
            # Every series of ours and of the SDK names the cluster its process serves.
            unnamed = prometheus.query(
                f'{{__name__=~"(rollback|temporal)_.+", cluster!="{DEFAULT_CLUSTER}"}}'
            )
            assert unnamed == [], [s["metric"] for s in unnamed][:5]
            for rule in alert_rules():
                prometheus.query(rule["expr"])  # parses and evaluates
            # The rule group loaded and evaluated cleanly; this story fires exactly the one alert
            # it should (a workload failed permanently), not the ones about a broken engine.
            loaded = prometheus.get("/api/v1/rules")["data"]["groups"]
            evaluated = [r for g in loaded for r in g["rules"]]
            assert len(evaluated) == len(alert_rules())
            assert all(r["health"] == "ok" for r in evaluated), evaluated
            firing = await until(
                lambda: {r["name"] for r in evaluated_rules(prometheus) if r["state"] != "inactive"}
            )
            assert firing == {"RollbackWorkloadsFailedPermanent"}
        finally:
            prometheus.stop()
            await world.stop()


def evaluated_rules(prometheus: Prometheus) -> list[dict[str, Any]]:
    groups = prometheus.get("/api/v1/rules")["data"]["groups"]
    return [r for g in groups for r in g["rules"]]
