"""The policy models: defaults, every constraint of the spec, and error paths."""

from datetime import timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from tests.conftest import policy_doc
from tests.unit.policy_table import CASES
from workflows.contract import DEFAULT_WORKLOAD_TYPES, RollbackTarget, WorkloadKind
from workflows.policy import POLICY_KINDS, ClusterRollbackPolicy, RollbackPolicy, field_path


def validate(doc: dict[str, Any]) -> RollbackPolicy | ClusterRollbackPolicy:
    return POLICY_KINDS[doc["kind"]].model_validate(doc)


def test_defaults_follow_the_spec() -> None:
    policy = RollbackPolicy.model_validate(policy_doc())
    assert policy.spec.weight == 0
    assert policy.spec.enable_monitoring_reopen is True
    assert policy.spec.scope.label_selector is None
    assert tuple(policy.spec.scope.workload_types) == DEFAULT_WORKLOAD_TYPES
    assert WorkloadKind.STRIMZI_POD_SET not in policy.spec.scope.workload_types
    assert len(policy.spec.scope.workload_types) == 8
    assert policy.spec.monitoring_period == timedelta(minutes=5)
    assert policy.spec.rollback_target is RollbackTarget.LAST_SUCCESSFUL


def test_round_trip_keeps_go_durations() -> None:
    policy = RollbackPolicy.model_validate(policy_doc(monitoringPeriod="1h30m"))
    dumped = policy.model_dump(by_alias=True, mode="json")
    assert dumped["spec"]["monitoringPeriod"] == "1h30m"
    assert RollbackPolicy.model_validate(dumped) == policy


@pytest.mark.parametrize(("doc", "bad_path"), CASES)
def test_models_accept_and_reject(doc: dict[str, Any], bad_path: str | None) -> None:
    if bad_path is None:
        validate(doc)
        return
    with pytest.raises(ValidationError) as info:
        validate(doc)
    paths = [field_path(e["loc"]) for e in info.value.errors()]
    assert bad_path in paths, paths


def test_metadata_from_the_server_is_tolerated() -> None:
    doc = policy_doc()
    doc["metadata"].update(uid="abc", resourceVersion="7", creationTimestamp="2026-01-02T03:04:05Z")
    doc["status"] = {"observedGeneration": 1}
    policy = RollbackPolicy.model_validate(doc)
    assert policy.metadata.creation_timestamp is not None
    assert policy.metadata.creation_timestamp.year == 2026


def test_kind_must_match_model() -> None:
    with pytest.raises(ValidationError, match="kind"):
        RollbackPolicy.model_validate(policy_doc("ClusterRollbackPolicy"))
