"""What ``rollbackctl describe`` prints follows the mode the workload is in now."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from cli.ops import describe_text
from tests import CLUSTER
from tests.unit.test_machine import OWNER, REC, policy
from workflows.contract import Mode
from workflows.machine import RollbackState

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def state(mode: Mode) -> RollbackState:
    return RollbackState(
        owner=OWNER,
        recommendation=REC,
        fingerprint=REC.fingerprint,
        mode=mode,
        policy=policy(),
        window_ends_at=T0 + timedelta(minutes=5),
        backoff_ends_at=T0 + timedelta(minutes=9),
        last_transition_time=T0,
    )


def test_deadlines_only_in_their_modes() -> None:
    monitoring = describe_text(CLUSTER, OWNER, "Running", state(Mode.MONITORING))
    assert "Window ends:" in monitoring and "Backoff ends:" not in monitoring
    backing_off = describe_text(CLUSTER, OWNER, "Running", state(Mode.BACKING_OFF))
    assert "Backoff ends:" in backing_off and "Window ends:" not in backing_off
    cancelled = describe_text(CLUSTER, OWNER, "Completed", state(Mode.CANCELLED))
    assert "Backoff ends:" not in cancelled and "Window ends:" not in cancelled
