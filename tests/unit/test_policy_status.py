"""What a policy's status says (``workflows.policy_status``): counts, conditions, the last error,
and that it changes only when something it reports changed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import jsonschema

from cli.crds import STATUS_SCHEMA
from tests.conftest import policy_doc
from workflows.contract import FailureReason, Mode, WorkloadKind
from workflows.policy import POLICY_KINDS, AnyPolicy
from workflows.policy_status import (
    HEALTH,
    MATCHED,
    PAUSED,
    READY,
    WAITING,
    PolicyStatus,
    Tally,
    Workload,
    invalid_status,
    status_of,
    tally,
)
from workflows.selection import PolicyIndex, WorkloadRef
from workflows.state import OwnerState, PolicyRef

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
NS = "team"


def policy(name: str = "p", weight: int = 0, **spec: object) -> AnyPolicy:
    doc = policy_doc("RollbackPolicy", name, weight=weight, **spec)
    doc["metadata"]["generation"] = 3
    return POLICY_KINDS["RollbackPolicy"].model_validate(doc)


def workload(name: str, mode: Mode | None = None, at: datetime = T0, under: str = "p") -> Workload:
    state = None
    if mode is not None:
        reason = FailureReason.OOM_KILLED if mode is not Mode.MONITORING else None
        state = OwnerState(
            mode=mode,
            active_recommendation_fingerprint="f",
            turn=1,
            failure_reason=reason,
            failure_message="2/2 pods OOMKilled (app)" if reason else None,
            policy=PolicyRef(kind="RollbackPolicy", namespace=NS, name=under),
            last_transition_time=at,
        )
    return Workload(WorkloadRef(WorkloadKind.DEPLOYMENT, NS, name, {"app": name}), state)


def index(*policies: AnyPolicy) -> PolicyIndex:
    found = PolicyIndex()
    for p in policies:
        found.upsert(p)
    return found


def conditions(status: PolicyStatus) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in status.conditions}


def test_counts_follow_the_modes_recorded_under_the_policy() -> None:
    p = policy()
    counts = tally(
        index(p),
        [
            workload("a", Mode.MONITORING),
            workload("b", Mode.BACKING_OFF),
            workload("c", Mode.FAILED_PERMANENT),
            workload("d", Mode.MONITORING_SUCCEEDED),
            workload("e"),
            workload("f", Mode.MONITORING, under="other"),  # another policy's attempt
        ],
    )
    status = status_of(p, counts["RollbackPolicy/team/p"], None, T0)
    assert (status.active_tracked_workloads, status.failed_workloads) == (2, 1)
    assert status.observed_generation == 3
    assert conditions(status) == {
        READY: ("True", "Valid"),
        MATCHED: ("True", "Matched"),
        PAUSED: ("False", "NoneHeld"),
    }
    assert "applies to 6 workload(s)" in status.conditions[1].message
    jsonschema.validate(status.body(), STATUS_SCHEMA)  # what the CRD accepts


def test_no_match_and_shadowed_are_conditions() -> None:
    lonely = policy(scope={"labelSelector": {"matchLabels": {"app": "nothing"}}})
    assert conditions(status_of(lonely, None, None, T0)) == {
        READY: ("True", "Valid"),
        MATCHED: ("False", "NoMatchingWorkloads"),
        PAUSED: ("False", "NoneHeld"),
    }
    heavy, light = policy("heavy", weight=10), policy("light", weight=1)
    counts = tally(index(heavy, light), [workload("a"), workload("b")])
    shadowed = status_of(light, counts["RollbackPolicy/team/light"], None, T0)
    assert conditions(shadowed)[READY] == ("False", "Shadowed")
    assert conditions(shadowed)[MATCHED] == ("False", "Shadowed")
    assert "RollbackPolicy/team/heavy" in shadowed.conditions[0].message
    assert conditions(status_of(heavy, counts["RollbackPolicy/team/heavy"], None, T0))[READY] == (
        "True",
        "Valid",
    )


def test_invalid_policy_says_why() -> None:
    status = invalid_status("spec.weight: must be >= 0", 2, None, None, T0)
    assert conditions(status) == {READY: ("False", "Invalid"), MATCHED: ("False", "Invalid")}
    assert status.last_error_summary == "invalid: spec.weight: must be >= 0"
    jsonschema.validate(status.body(), STATUS_SCHEMA)


def test_the_newest_problem_is_kept_until_a_newer_one() -> None:
    p = policy()
    first = status_of(
        p, tally(index(p), [workload("a", Mode.BACKING_OFF)])["RollbackPolicy/team/p"], None, T0
    )
    assert first.last_error_summary is not None
    assert first.last_error_summary.startswith("2026-01-01T12:00:00Z team/Deployment/a")
    assert "backingOff (oomKilled): 2/2 pods OOMKilled (app)" in first.last_error_summary
    # The workload succeeds next: the last problem stays.
    healed = tally(index(p), [workload("a", Mode.MONITORING_SUCCEEDED)])
    assert status_of(p, healed["RollbackPolicy/team/p"], first, T0).last_error_summary == (
        first.last_error_summary
    )
    # An older problem elsewhere does not replace it; a newer one does.
    older = tally(index(p), [workload("b", Mode.BACKING_OFF, at=T0 - timedelta(minutes=5))])
    assert status_of(p, older["RollbackPolicy/team/p"], first, T0).last_error_summary == (
        first.last_error_summary
    )
    newer = tally(index(p), [workload("c", Mode.FAILED_PERMANENT, at=T0 + timedelta(minutes=5))])
    summary = status_of(p, newer["RollbackPolicy/team/p"], first, T0).last_error_summary
    assert summary is not None and "team/Deployment/c: failedPermanent" in summary


def test_nothing_changed_means_an_equal_status() -> None:
    p = policy()
    counts = tally(index(p), [workload("a", Mode.MONITORING)])["RollbackPolicy/team/p"]
    first = status_of(p, counts, None, T0)
    stored = PolicyStatus.read(first.body())  # as read back from the API server
    later = status_of(p, counts, stored, T0 + timedelta(minutes=10))
    assert later == stored  # no write: conditions keep their lastTransitionTime
    moved = status_of(p, Tally(selected=1, applies=1), stored, T0 + timedelta(minutes=10))
    assert moved != stored and moved.active_tracked_workloads == 0
    assert moved.conditions[0].last_transition_time == T0  # Ready did not change


def test_a_foreign_status_is_not_ours() -> None:
    assert PolicyStatus.read({"conditions": [{"type": "Ready"}]}) is None
    assert PolicyStatus.read(None) is None
    assert PolicyStatus.read({}) is None


def test_a_scope_reaching_protected_namespaces_says_so() -> None:
    broad = POLICY_KINDS["ClusterRollbackPolicy"].model_validate(
        policy_doc("ClusterRollbackPolicy", "broad")
    )
    name = "ClusterRollbackPolicy/broad"

    def at(namespace: str) -> Workload:
        return Workload(WorkloadRef(WorkloadKind.DEPLOYMENT, namespace, "w", {}), None)

    both = tally(index(broad), [at("shop"), at("kube-system"), at("gmp-system")])
    status = status_of(broad, both[name], None, T0)
    assert conditions(status)[MATCHED] == ("True", "Matched")
    assert status.conditions[1].message == (
        "applies to 1 workload(s); leaves alone those in protected namespaces"
        " (gmp-system, kube-system)"
    )
    only = tally(index(broad), [at("kube-system")])
    status = status_of(broad, only[name], None, T0)
    assert conditions(status)[MATCHED] == ("False", "ProtectedNamespaces")
    assert "(kube-system), where no policy applies" in status.conditions[1].message
    jsonschema.validate(status.body(), STATUS_SCHEMA)


def test_attempts_held_by_a_pause_are_a_condition() -> None:
    p = policy()
    held = [
        Workload(workload(name, Mode.MONITORING).ref, workload(name, Mode.MONITORING).state, True)
        for name in ("a", "b")
    ]
    counts = tally(index(p), [*held, workload("c", Mode.MONITORING)])
    status = status_of(p, counts["RollbackPolicy/team/p"], None, T0)
    assert conditions(status)[PAUSED] == ("True", "Held")
    assert status.conditions[2].message == (
        "2 tracked workload(s) held by a pause (rightsizing.kubex.ai/pause-until):"
        " team/Deployment/a, team/Deployment/b"
    )
    jsonschema.validate(status.body(), STATUS_SCHEMA)


def test_a_policy_with_health_checks_says_whether_they_can_be_asked() -> None:
    checked = policy(healthChecks={"cpuThrottling": {"maxPercent": 25}})
    asked = status_of(checked, Tally(), None, T0, prometheus=True).condition(HEALTH)
    assert asked is not None and (asked.status, asked.reason) == ("True", "PrometheusConfigured")
    unasked = status_of(checked, Tally(), None, T0, prometheus=False).condition(HEALTH)
    assert unasked is not None and (unasked.status, unasked.reason) == ("False", "NoPrometheus")
    assert "decided on adoption alone, at once" in unasked.message
    failing = policy(
        healthChecks={"cpuThrottling": {"maxPercent": 25}, "onPrometheusError": "fail"}
    )
    said = status_of(failing, Tally(), None, T0, prometheus=False).condition(HEALTH)
    assert said is not None and "failed (onPrometheusError: fail)" in said.message
    plain = status_of(policy(), Tally(), None, T0, prometheus=False)
    assert plain.condition(HEALTH) is None  # no checks, nothing to say
    jsonschema.validate(status_of(checked, Tally(), None, T0, False).body(), STATUS_SCHEMA)


def test_adoptions_waiting_for_the_temporal_budget_are_a_condition_where_there_is_one() -> None:
    p = policy()
    waiting = ["team/Deployment/b", "team/Deployment/a", "team/Deployment/d", "team/Deployment/c"]
    said = status_of(p, Tally(), None, T0, budget=200.0, waiting=waiting).condition(WAITING)
    assert said is not None and (said.status, said.reason) == ("True", "Budget")
    assert said.message == (
        "4 adoption(s) wait for their turn under the engine's Temporal budget (200 actions/s):"
        " team/Deployment/a, team/Deployment/b, team/Deployment/c, ..."
    )
    none = status_of(p, Tally(), None, T0, budget=200.0).condition(WAITING)
    assert none is not None and (none.status, none.reason) == ("False", "NoneWaiting")
    assert status_of(p, Tally(), None, T0).condition(WAITING) is None  # no budget, no condition
    jsonschema.validate(
        status_of(p, Tally(), None, T0, budget=2.5, waiting=waiting).body(), STATUS_SCHEMA
    )
