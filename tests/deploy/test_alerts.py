"""The alert rules of ``deploy/components/monitoring`` under the real ``promtool`` (Debian's
``prometheus`` package): ``check rules``, and ``test rules`` with a case where each alert fires
and one where it does not."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT

RULE = ROOT / "deploy" / "components" / "monitoring" / "prometheusrule.yaml"
QUEUE = 'task_queue="rightsizing-rollback-eu"'
EU = 'cluster="eu"'  # every series carries its process's cluster; alerts fire per cluster


def groups() -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = yaml.safe_load(RULE.read_text())["spec"]["groups"]
    return groups


def alerts() -> list[str]:
    return [r["alert"] for g in groups() for r in g["rules"] if "alert" in r]


def promtool() -> str:
    found = shutil.which("promtool")
    assert found, "promtool not installed: apt-get install prometheus (.ci/run does)"
    return found


@pytest.fixture
def rules_file(tmp_path: Path) -> Path:
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": groups()}))
    return path


def test_promtool_checks_the_rules(rules_file: Path) -> None:
    out = subprocess.run(
        [promtool(), "check", "rules", str(rules_file)], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in out.stdout


def case(
    series: dict[str, str], at: str, alert: str, firing: list[dict[str, str]], summary: str = ""
) -> dict[str, Any]:
    """A promtool test: ``firing`` lists the labels each expected alert has (empty: quiet)."""
    rule = next(r for g in groups() for r in g["rules"] if r.get("alert") == alert)
    annotations = {"summary": summary, "description": rule["annotations"]["description"]}
    return {
        "interval": "1m",
        "input_series": [{"series": k, "values": v} for k, v in series.items()],
        "alert_rule_test": [
            {
                "eval_time": at,
                "alertname": alert,
                "exp_alerts": [
                    {"exp_labels": labels, "exp_annotations": annotations} for labels in firing
                ],
            }
        ],
    }


ENDED = 'rollback_attempts{{cluster="eu",outcome="aborted",reason="{}"}}'
OWNERS = 'rollback_owner_workloads{{cluster="eu",mode="{}",policy="RollbackPolicy/shop/p"}}'
FAILED = OWNERS.format("failedPermanent")
MONITORING = OWNERS.format("monitoring")
SINCE = 'rollback_mode_since_timestamp_seconds{cluster="eu",mode="rollingBack"}'
LEADER = 'rollback_intake_leader{{cluster="{}",pod="{}"}}'
POLLERS = f'temporal_num_pollers{{{EU},poller_type="workflow_task",{QUEUE}}}'
US_POLLERS = POLLERS.replace('"eu"', '"us"').replace('-eu"', '-us"')
INTAKE = 'rollback_build_info{{cluster="{}",component="intake",version="1.0.0"}}'
REQUESTS = 'rollback_kube_requests{{cluster="eu",code="{}"}}'
ROLLBACKS = 'rollback_rollbacks{cluster="eu",reason="oomKilled"}'
NOTIFIED = 'rollback_notifications{{cluster="eu",outcome="{}",receiver="oncall"}}'
BREAKER = 'rollback_storm_breaker_tripped{{cluster="eu",instance="{}"}}'


# Each alert: a case where it fires (with the labels it fires with) and one where it does not.
CASES = {
    "RollbackWorkloadsFailedPermanent": [
        case(
            {FAILED: "0 1 1"},
            "2m",
            "RollbackWorkloadsFailedPermanent",
            [{"severity": "warning", "policy": "RollbackPolicy/shop/p", "cluster": "eu"}],
            "1 workload(s) under RollbackPolicy/shop/p in eu failed permanently",
        ),
        case({MONITORING: "3 3 3", FAILED: "1 0 0"}, "2m", "RollbackWorkloadsFailedPermanent", []),
    ],
    "RollbackRateHigh": [
        case(
            {ROLLBACKS: "0+1x60"},
            "50m",
            "RollbackRateHigh",
            [{"severity": "warning", "cluster": "eu"}],
            "60 rollbacks per hour in eu",
        ),
        case({ROLLBACKS: "0+0.1x60"}, "50m", "RollbackRateHigh", []),  # 6 per hour
    ],
    "RollbackStuckRollingBack": [
        # In rollingBack since t=1s (the gauge holds that transition's time): at 20m, stuck.
        case(
            {SINCE: "1x30"},
            "20m",
            "RollbackStuckRollingBack",
            [{"severity": "warning", "cluster": "eu"}],
            "A workload in eu has been rollingBack for more than 15 minutes",
        ),
        case({SINCE: "0x30"}, "20m", "RollbackStuckRollingBack", []),  # 0: none rolling back
    ],
    "RollbackNoIntakeLeader": [
        case(  # eu's two intakes lead nothing; us has its leader
            {
                LEADER.format("eu", "a"): "0x10",
                LEADER.format("eu", "b"): "0x10",
                LEADER.format("us", "a"): "1x10",
            },
            "5m",
            "RollbackNoIntakeLeader",
            [{"severity": "critical", "cluster": "eu"}],
            "No rollback intake holds the lease in eu",
        ),
        case(  # no intake reports at all
            {"up": "1x10"},
            "5m",
            "RollbackNoIntakeLeader",
            [{"severity": "critical"}],
            "No rollback intake holds the lease",
        ),
        case(
            {LEADER.format("eu", "a"): "1x10", LEADER.format("eu", "b"): "0x10"},
            "5m",
            "RollbackNoIntakeLeader",
            [],
        ),
    ],
    "RollbackNoWorkerPolling": [
        case(
            {"up": "1x10"},  # no poller series at all
            "8m",
            "RollbackNoWorkerPolling",
            [{"severity": "critical"}],
            "No rollback worker polls the task queue",
        ),
        case(  # us's intake runs, its workers poll nothing; eu's do
            {POLLERS: "2x10", INTAKE.format("eu"): "1x10", INTAKE.format("us"): "1x10"},
            "8m",
            "RollbackNoWorkerPolling",
            [{"severity": "critical", "cluster": "us"}],
            "No rollback worker polls the task queue of us",
        ),
        case(
            {POLLERS: "2x10", US_POLLERS: "1x10", INTAKE.format("us"): "1x10"},
            "8m",
            "RollbackNoWorkerPolling",
            [],
        ),
    ],
    "RollbackKubeApiErrors": [
        case(
            {REQUESTS.format("200"): "0+10x30", REQUESTS.format("503"): "0+2x30"},
            "25m",
            "RollbackKubeApiErrors",
            [{"severity": "warning", "cluster": "eu"}],
            "16.67% of Kubernetes API requests fail in eu",
        ),
        case(
            {REQUESTS.format("200"): "0+100x30", REQUESTS.format("503"): "0+1x30"},  # 1%
            "25m",
            "RollbackKubeApiErrors",
            [],
        ),
    ],
    "RollbackRestoreRefused": [
        case(
            {ENDED.format("resourcesRefused"): "_x5 1x10"},
            "8m",
            "RollbackRestoreRefused",
            [{"severity": "critical", "cluster": "eu"}],
            "1 restore(s) in eu refused by a ResourceQuota or LimitRange",
        ),
        case(  # other endings, and a refusal over 30 minutes ago
            {ENDED.format("resourcesRefused"): "1x60", ENDED.format("oomKilled"): "0+1x60"},
            "50m",
            "RollbackRestoreRefused",
            [],
        ),
    ],
    "RollbackStormBreakerTripped": [
        case(  # the leader tripped it; its standby never set the gauge
            {BREAKER.format("a"): "0x5 1x10", BREAKER.format("b"): "_x15"},
            "8m",
            "RollbackStormBreakerTripped",
            [{"severity": "critical", "cluster": "eu"}],
            "The storm breaker stops re-applies in eu",
        ),
        case({BREAKER.format("a"): "0x10 1x5 0x10"}, "20m", "RollbackStormBreakerTripped", []),
    ],
    "RollbackNotificationsFailing": [
        # A series that appears with its first failure: counted from zero.
        case(
            {NOTIFIED.format("failed"): "_x5 1x10"},
            "8m",
            "RollbackNotificationsFailing",
            [{"severity": "warning", "receiver": "oncall", "cluster": "eu"}],
            "Notifications to oncall from eu are not delivered",
        ),
        case(
            {NOTIFIED.format("failed"): "1x60", NOTIFIED.format("sent"): "0+1x60"},
            "50m",  # the last failure was over 30 minutes ago
            "RollbackNotificationsFailing",
            [],
        ),
    ],
}


def test_every_alert_has_firing_and_quiet_cases() -> None:
    assert set(CASES) == set(alerts())
    for name, cases in CASES.items():
        fired = [bool(c["alert_rule_test"][0]["exp_alerts"]) for c in cases]
        assert False in fired and True in fired, name


def test_promtool_unit_tests_of_every_alert(rules_file: Path, tmp_path: Path) -> None:
    tests = tmp_path / "tests.yaml"
    tests.write_text(
        yaml.safe_dump(
            {
                "rule_files": [str(rules_file)],
                "evaluation_interval": "1m",
                "tests": [c for cases in CASES.values() for c in cases],
            }
        )
    )
    out = subprocess.run(
        [promtool(), "test", "rules", str(tests)], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout
