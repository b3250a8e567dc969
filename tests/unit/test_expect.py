"""The scenario expectation language (``sim.expect``), its JSON Schema, ``simulate --validate``,
pods found by ownerReferences, and the failure report a person reads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml
from kubernetes.client import CoreV1Api, CustomObjectsApi

from activities.lookup import OwnerLookup
from sim.apiserver import KubeEmulator
from sim.expect import Expectation, Facts, check
from sim.scenario import (
    SCENARIOS,
    SCHEMA,
    STEP_KINDS,
    Report,
    Scenario,
    Step,
    owned_pods,
    scenario_schema,
)
from tests.conftest import ROOT
from worker.kube import api_client

REF = "shop/Deployment/api"
FAILED = {
    "mode": "failedPermanent",
    "turn": 2,
    "failureReason": "oomKilled",
    "activeRecommendationFingerprint": "1f0f06687fee0df3",
    "policy": {"kind": "RollbackPolicy", "namespace": "shop", "name": "p"},
    "lastSuccessfulState": {"containers": {"app": {"requests": {"memory": "768Mi"}}}},
}
ROLLBACK = "rollbackpolicy.rightsizing.kubex.ai/desired-resource-requests"


def facts(**changes: object) -> Facts:
    base = Facts(
        state=FAILED,
        modes=["monitoring", "rollingBack", "backingOff", "failedPermanent"],
        annotations={"rightsizing.kubex.ai/rollback-state": "{}"},
        events=[
            {"reason": "RollbackRollingBackStarted", "message": "3/3 pods OOMKilled (app)"},
            {"reason": "RollbackRollingBackStarted", "message": "3/3 pods OOMKilled (app)"},
            {"reason": "RollbackBackoffExhausted", "message": "failed permanently"},
        ],
        pods={
            "api-a": {"app": {"requests": {"memory": "768Mi", "cpu": "500m"}}},
            "api-b": {"app": {"requests": {"memory": "768Mi", "cpu": "500m"}}},
            "api-c": {"app": {"requests": {"memory": "256Mi", "cpu": "500m"}}},
        },
    )
    for key, value in changes.items():
        setattr(base, key, value)
    return base


def problems(expect: dict[str, object], found: Facts | None = None) -> list[str]:
    return check(REF, Expectation.model_validate(expect), found or facts())


def test_events_by_reason_count_and_message() -> None:
    assert problems({"mode": "failedPermanent", "events": [
        {"reason": "RollbackRollingBackStarted", "count": 2, "message": "OOMKilled"},
        {"reason": "RollbackBackoffExhausted"},
    ]}) == []  # fmt: skip
    assert problems({"mode": "failedPermanent", "events": [
        {"reason": "RollbackRollingBackStarted", "count": 1}]}) == [
        f"{REF}: 2 RollbackRollingBackStarted Event(s), expected 1"
    ]  # fmt: skip
    wrong = problems({"mode": "failedPermanent", "events": [
        {"reason": "RollbackRollingBackStarted", "message": "CrashLoop"}]})  # fmt: skip
    assert len(wrong) == 2 and "lacks 'CrashLoop'" in wrong[0]
    assert problems({"mode": "failedPermanent", "events": [{"reason": "RollbackStateCleared"}]})


def test_owner_annotations_present_and_absent() -> None:
    ok = {"present": ["rightsizing.kubex.ai/rollback-state"], "absent": [ROLLBACK]}
    assert problems({"mode": "failedPermanent", "annotations": ok}) == []
    found = facts(annotations={ROLLBACK: "{}"})
    assert problems({"mode": "failedPermanent", "annotations": ok}, found) == [
        f"{REF}: annotation rightsizing.kubex.ai/rollback-state absent, expected present",
        f"{REF}: annotation {ROLLBACK} present, expected absent",
    ]


def test_pods_by_resource_kind_and_count() -> None:
    assert problems({"mode": "failedPermanent", "pods": [
        {"container": "app", "requests": {"memory": "768Mi"}, "count": 2},
        {"container": "app", "requests": {"cpu": "500m"}},
    ]}) == []  # fmt: skip
    assert problems({"mode": "failedPermanent", "pods": [
        {"container": "app", "requests": {"memory": "768Mi"}}]}) == [
        f"{REF}: 2 of 3 pods run app with {{'requests': {{'memory': '768Mi'}}}}, expected all"
    ]  # fmt: skip
    assert problems({"mode": "failedPermanent", "pods": [
        {"container": "app", "limits": {"memory": "768Mi"}, "count": 1}]})  # fmt: skip


def test_alternatives_policy_fingerprint_and_last_successful() -> None:
    good = {
        "mode": "failedPermanent",
        "failureReason": ["crashLoopBackOff", "oomKilled"],
        "policy": {"kind": "RollbackPolicy", "namespace": "shop", "name": "p"},
        "fingerprint": "1f0f06687fee0df3",
        "lastSuccessful": {"app": {"requests": {"memory": "768Mi"}}},
    }
    assert problems(good) == []
    assert problems({**good, "failureReason": ["notReady"]})
    cluster_policy = {"kind": "ClusterRollbackPolicy", "name": "p"}  # same name, other kind
    assert problems({**good, "policy": cluster_policy})
    assert problems({**good, "policy": "p"}) == []  # the short form: the name only
    assert problems({**good, "fingerprint": "0000000000000000"})
    assert problems({**good, "lastSuccessful": {"app": {"requests": {"memory": "1Gi"}}}})


def test_a_sequence_can_end_with_the_state_cleared() -> None:
    cleared = facts(state=None, modes=["monitoring", "backingOff", None])
    assert problems({"mode": None, "modes": ["monitoring", "backingOff", None]}, cleared) == []
    assert problems({"mode": None, "modes": ["monitoring", "backingOff"]}, cleared)


def test_the_new_fields_are_refused_by_a_typo() -> None:
    with pytest.raises(ValueError, match="evnts"):
        Expectation.model_validate({"evnts": []})


def test_the_json_schema_is_published_and_validates_every_shipped_scenario() -> None:
    assert json.loads(SCHEMA.read_text()) == scenario_schema(), (
        "regenerate: python -c 'import json; from sim.scenario import *;"
        " SCHEMA.write_text(json.dumps(scenario_schema(), indent=2) + chr(10))'"
    )
    schema = json.loads(SCHEMA.read_text())
    for path in sorted(SCENARIOS.glob("*.yaml")):
        jsonschema.validate(yaml.safe_load(path.read_text()), schema)
    bad = {"name": "x", "expect": {REF: {"events": [{"count": 1}]}}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


def test_simulate_validate_checks_without_running(tmp_path: Path) -> None:
    def validate(path: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "cli.main", "simulate", "--validate", str(path)],
            cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip

    good = validate(SCENARIOS / "oom-rollback.yaml")
    assert good.returncode == 0 and "valid scenario oom-rollback" in good.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"name": "x", "expect": {REF: {"modes": ["monitoring", 3]}}}))
    out = validate(bad)
    assert out.returncode == 1
    assert f"{bad}: expect.{REF}.modes.1: Input should be 'monitoring'" in out.stderr
    bad.write_text(yaml.safe_dump({"name": "x", "expect": {REF: {"mode": "failed"}}}))
    out = validate(bad)
    assert out.returncode == 1 and f"{bad}: expect.{REF}.mode: Input should be" in out.stderr


def test_pods_belong_to_their_owner_by_owner_references_not_by_name() -> None:
    """``api`` must not collect ``api2``'s pods (the name-prefix bug)."""
    with KubeEmulator() as api:
        for name in ("api", "api2"):
            dep = api.store.create({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": name, "namespace": "shop"}, "spec": {},
            })  # fmt: skip
            ref = {"kind": "Deployment", "name": name, "uid": dep["metadata"]["uid"],
                   "controller": True}  # fmt: skip
            rs = api.store.create({
                "apiVersion": "apps/v1", "kind": "ReplicaSet",
                "metadata": {"name": f"{name}-rs", "namespace": "shop", "ownerReferences": [ref]},
            })  # fmt: skip
            rs_ref = {"kind": "ReplicaSet", "name": f"{name}-rs", "uid": rs["metadata"]["uid"],
                      "controller": True}  # fmt: skip
            api.store.create({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"{name}-0", "namespace": "shop", "ownerReferences": [rs_ref]},
                "spec": {"containers": [{"name": "app"}]},
            })  # fmt: skip
        client = api_client(url=api.url)
        lookup = OwnerLookup(CoreV1Api(client), CustomObjectsApi(client))
        names = [p["metadata"]["name"] for p in owned_pods(api.store, lookup, REF)]
        assert names == ["api-0"]


def test_a_failure_reads_first_problem_timeline_and_logs() -> None:
    report = Report(
        "oom",
        transitions=[
            {"t": 2.0, "owner": REF, "mode": "monitoring", "turn": 1, "failureReason": None}
        ],
        events=[{"t": 4.1, "owner": REF, "reason": "RollbackRollingBackStarted", "message": "OOM"}],
        problems=[f"{REF}: mode rollingBack, expected monitoringSucceeded", "other/Job/x: turn 1"],
        logs="/tmp/rollback-oom-logs-x",
    )
    assert report.explain() == [
        f"First failed: {REF}: mode rollingBack, expected monitoringSucceeded",
        "  also: other/Job/x: turn 1",
        f"Timeline of {REF}:",
        "     2.00s  -> monitoring turn 1",
        "     4.10s  event RollbackRollingBackStarted: OOM",
        "Full logs: /tmp/rollback-oom-logs-x",
    ]
    assert len("\n".join(report.explain())) < 1000  # no wall of worker log
    assert Scenario.model_validate({"name": "x"}).expect == {}


def test_timing_with_a_tolerance() -> None:
    timeline = [
        {"t": 1.0, "mode": "monitoring", "turn": 1},
        {"t": 3.0, "mode": "rollingBack", "turn": 1},
        {"t": 3.1, "mode": "backingOff", "turn": 1},
        {"t": 4.2, "mode": "backedOff", "turn": 1},
        {"t": 5.0, "mode": "monitoring", "turn": 2},
        {"t": 7.0, "mode": "rollingBack", "turn": 2},
        {"t": 7.1, "mode": "backingOff", "turn": 2},
        {"t": 9.3, "mode": "failedPermanent", "turn": 2},
    ]
    found = facts(transitions=timeline)
    turn_two = {
        "from": "backingOff",
        "to": "failedPermanent",
        "turn": 2,
        "lasts": 2,
        "tolerance": 0.5,
    }
    assert problems({"mode": "failedPermanent", "timing": [turn_two]}, found) == []
    too_long = {**turn_two, "lasts": 4}
    assert problems({"mode": "failedPermanent", "timing": [too_long]}, found) == [
        f"{REF}: backingOff (turn 2) -> failedPermanent lasted 2.20s, expected 4s ± 0.5s"
    ]
    turn_one = {"from": "backingOff", "turn": 1, "lasts": 1}  # to: whatever came next
    assert problems({"mode": "failedPermanent", "timing": [turn_one]}, found) == []
    assert problems({"mode": "failedPermanent", "timing": [{"from": "superseded", "lasts": 1}]})


def test_still_for_means_no_recent_transition() -> None:
    timeline = [{"t": 9.3, "mode": "failedPermanent", "turn": 2}]
    assert (
        problems({"mode": "failedPermanent", "stillFor": 2}, facts(transitions=timeline, now=12.0))
        == []
    )
    assert problems(
        {"mode": "failedPermanent", "stillFor": 5}, facts(transitions=timeline, now=12.0)
    ) == [f"{REF}: a transition 2.7s ago, expected none for 5s"]


def test_relative_steps_name_their_trigger() -> None:
    step = {"when": {"owner": REF, "mode": "backingOff"}, "delay": "1s", "scale": {"workload": REF}}
    scenario = Scenario.model_validate({"name": "x", "steps": [step]})
    assert scenario.steps[0].when is not None and scenario.steps[0].delay == 1.0
    with pytest.raises(ValueError, match="no step has that name"):
        Scenario.model_validate({"name": "x", "steps": [{"after": "nope"}]})
    with pytest.raises(ValueError, match="one trigger"):
        Scenario.model_validate(
            {"name": "x", "steps": [{"name": "a"}, {"after": "a", "when": step["when"]}]}
        )


def test_policies_take_policies_and_objects_take_the_rest() -> None:
    config = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "c", "namespace": "shop"},
    }
    with pytest.raises(ValueError, match="use objects or applyObject"):
        Scenario.model_validate({"name": "x", "policies": [config]})
    with pytest.raises(ValueError, match="use objects or applyObject"):
        Scenario.model_validate({"name": "x", "steps": [{"applyPolicy": config}]})
    fine = Scenario.model_validate(
        {"name": "x", "objects": [config], "steps": [{"applyObject": config}]}
    )
    assert fine.objects == [config] and fine.steps[0].apply_object == config


@pytest.mark.parametrize(
    "expect",
    [
        pytest.param({"mode": "failed"}, id="mode"),
        pytest.param({"modes": ["monitoring", "rolledBack"]}, id="modes"),
        pytest.param({"failureReason": "oom"}, id="failure-reason"),
        pytest.param({"events": [{"reason": "RollbackStarted"}]}, id="event-reason"),
        pytest.param({"timing": [{"from": "backoff", "lasts": 1}]}, id="timing"),
    ],
)
def test_a_mode_reason_or_event_the_engine_never_writes_is_refused(
    expect: dict[str, object],
) -> None:
    """An expectation that can never be met is a typo: refused when the file is read, not
    discovered when the run times out."""
    with pytest.raises(ValueError, match="Input should be"):
        Expectation.model_validate(expect)


def test_a_policy_the_engine_would_ignore_is_refused_with_its_field() -> None:
    """The engine ignores an invalid policy (one log line): a scenario holding one would run
    against other policies than the file says, so the scenario itself is refused."""
    doc = yaml.safe_load((SCENARIOS / "oom-rollback.yaml").read_text())
    doc["policies"][0]["spec"]["adoptionThresholdPercent"] = 150
    with pytest.raises(ValueError, match=r"RollbackPolicy shop-rollback is invalid: spec\."):
        Scenario.model_validate(doc)
    step = {"at": 1, "applyPolicy": {**doc["policies"][0], "metadata": {"name": "late"}}}
    doc = yaml.safe_load((SCENARIOS / "oom-rollback.yaml").read_text())
    doc["steps"].append(step)
    doc["steps"][-1]["applyPolicy"]["spec"] = {"monitoringPeriod": "2s"}
    with pytest.raises(ValueError, match="RollbackPolicy late is invalid"):
        Scenario.model_validate(doc)


def test_every_step_action_has_one_step_kind() -> None:
    """The scenario player carries out each action a ``Step`` may carry, through its table of
    step kinds (``sim.scenario.STEP_KINDS``); an action added to the schema without one fails."""
    timing = {"at", "name", "when", "after", "delay"}
    actions = set(Step.model_fields) - timing
    kinds = [name for name, _ in STEP_KINDS]
    assert sorted(kinds) == sorted(actions) and len(kinds) == len(set(kinds))
