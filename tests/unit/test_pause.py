"""Which pause annotation decides and whether it holds now (``workflows.pause``), as Kubex: the
pod's own, else its owner's, else its namespace's."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from workflows.contract import (
    AUTOMATION_ANNOTATION,
    AUTOMATION_REASON_ANNOTATION,
    PAUSE_REASON_ANNOTATION,
    PAUSE_UNTIL_ANNOTATION,
)
from workflows.pause import Pause, PauseScope, automation_off, effective_pause

NOW = datetime(2026, 12, 5, 10, 0, tzinfo=UTC)
LATER, EARLIER = "2026-12-05T11:00:00Z", "2026-12-05T09:00:00Z"


def until(value: str | None, reason: str | None = None) -> dict[str, str] | None:
    if value is None:
        return None
    return {PAUSE_UNTIL_ANNOTATION: value} | ({PAUSE_REASON_ANNOTATION: reason} if reason else {})


def held(
    pods: list[str | None], owner: str | None = None, namespace: str | None = None
) -> tuple[PauseScope, str] | None:
    found = effective_pause(
        [(f"web-{i}", until(p)) for i, p in enumerate(pods)],
        ("shop/Deployment/web", until(owner)),
        ("shop", until(namespace)),
        NOW,
    )
    return None if found is None else (found.scope, found.name)


@pytest.mark.parametrize(
    ("pods", "owner", "namespace", "want"),
    [
        pytest.param([None, None], None, None, None, id="nothing"),
        pytest.param([None], None, "infinite", (PauseScope.NAMESPACE, "shop"), id="namespace"),
        pytest.param([None], LATER, None, (PauseScope.OWNER, "shop/Deployment/web"), id="owner"),
        pytest.param([None, "infinite"], None, None, (PauseScope.POD, "web-1"), id="one-pod"),
        pytest.param([None], EARLIER, None, None, id="owner-expired"),
        # The most specific level that carries the key decides, even when its time is past.
        pytest.param([None], EARLIER, "infinite", None, id="owner-expired-over-namespace"),
        pytest.param([EARLIER], "infinite", None, None, id="pod-expired-over-owner"),
        pytest.param(
            [EARLIER, None], "infinite", None, (PauseScope.OWNER, "shop/Deployment/web"),
            id="another-pod-inherits",
        ),
        pytest.param([], None, "infinite", (PauseScope.NAMESPACE, "shop"), id="no-pods"),
        pytest.param([None], "Infinite ", None, (PauseScope.OWNER, "shop/Deployment/web"),
                     id="case-and-space"),
    ],
)  # fmt: skip
def test_which_level_decides(
    pods: list[str | None],
    owner: str | None,
    namespace: str | None,
    want: tuple[PauseScope, str] | None,
) -> None:
    assert held(pods, owner, namespace) == want


def test_what_a_pause_says() -> None:
    timed = effective_pause([], ("o", until(LATER, "incident 4711")), ("shop", None), NOW)
    assert timed == Pause(
        scope=PauseScope.OWNER,
        name="o",
        until=datetime(2026, 12, 5, 11, 0, tzinfo=UTC),
        reason="incident 4711",
    )
    assert timed.describe() == "paused by owner o until 2026-12-05T11:00:00Z: incident 4711"
    forever = effective_pause([], ("o", None), ("shop", until("infinite")), NOW)
    assert forever is not None and forever.until is None
    assert forever.describe() == "paused by namespace shop until the annotation is removed"


@pytest.mark.parametrize("value", ["tomorrow", "2026-12-05T11:00:00", "", "42"])
def test_an_unreadable_value_holds_until_fixed(value: str) -> None:
    found = effective_pause([("web-0", until(value))], ("o", None), ("shop", None), NOW)
    assert found is not None and found.until is None and found.problem is not None
    assert "is neither infinite nor an RFC 3339 time" in found.describe()


def test_the_kill_switch_reads_enabled_disabled_or_holds_until_fixed() -> None:
    def switch(**annotations: str) -> Pause | None:
        return automation_off(("rightsizing-rollback", annotations))

    assert switch() is None
    assert switch(**{AUTOMATION_ANNOTATION: "enabled"}) is None
    assert switch(**{AUTOMATION_ANNOTATION: " Enabled "}) is None
    off = switch(**{AUTOMATION_ANNOTATION: "disabled", AUTOMATION_REASON_ANNOTATION: "INC-7"})
    assert off == Pause(scope=PauseScope.CLUSTER, name="rightsizing-rollback", reason="INC-7")
    assert off.describe() == (
        "automation disabled by rightsizing.kubex.ai/automation on namespace"
        " rightsizing-rollback until it is enabled: INC-7"
    )
    typo = switch(**{AUTOMATION_ANNOTATION: "false"})
    assert typo is not None and typo.problem == "'false' is neither enabled nor disabled"
    assert typo.describe() == (
        "automation stopped until rightsizing.kubex.ai/automation on namespace"
        " rightsizing-rollback is fixed ('false' is neither enabled nor disabled)"
    )
