"""The early verdict decides only what the window's end would (``workflows.machine._early``), as
a property over generated cohorts: a window's baseline, its threshold, its opening read (does
the cut raise a request?), then a crossing sample and a confirming one, each a cohort of pods
healthy, not adopted, NotReady, OOM-killed, crash-looping, Pending, or resize-infeasible, with
their restart counts, the HPA having added pods or not, some pods recovered, replaced, restarted
or crashed again between the two. Whenever the machine rolls back early on the confirming
sample, the window's end, decided by the same machine on that same sample, rolls back too.

``ROLLBACK_COHORT_EXAMPLES`` sets how many (CI: 2,000; bench/RESULTS.md records 10,000)."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.test_machine import T0, early_policy, monitoring
from workflows.activity_api import Certain, CohortSample
from workflows.contract import CERTAIN_REASONS, FailureReason, Mode
from workflows.machine import Sampled, decide

EXAMPLES = int(os.environ.get("ROLLBACK_COHORT_EXAMPLES", "2000"))
CONFIRM = timedelta(seconds=5)
HEALTHY, UNADOPTED = "healthy", "unadopted"
STATES = st.sampled_from(
    [HEALTHY, HEALTHY, UNADOPTED, FailureReason.NOT_READY, FailureReason.OOM_KILLED,
     FailureReason.CRASH_LOOP_BACK_OFF, FailureReason.UNSCHEDULABLE,
     FailureReason.RESIZE_INFEASIBLE]
)  # fmt: skip

Pod = tuple[str, object, int]  # name, state, restarts
# What became of a pod between the crossing sample and the confirming one.
CHANGES = ["same", "crashed again", "crashed again", "restarted", "recovered", "replaced", "gone"]


def cohort(pods: list[Pod], desired: int) -> CohortSample:
    """The sample the activity would make of ``pods`` (``activities.cohort.Tally``)."""
    reasons: Counter[FailureReason] = Counter()
    certain: dict[str, Certain] = {}
    for name, state, restarts in pods:
        if isinstance(state, FailureReason):
            reasons[state] += 1
            if state in CERTAIN_REASONS:
                certain[name] = Certain(reason=state, restarts=restarts)
    healthy = sum(state == HEALTHY for _, state, _ in pods)
    unadopted = sum(state == UNADOPTED for _, state, _ in pods)
    return CohortSample(
        desired=desired, pods=len(pods), adopted=len(pods) - unadopted,
        adopted_healthy=healthy, unhealthy=dict(reasons),
        failing={r: n for r, n in reasons.items() if r in CERTAIN_REASONS},
        certain=certain, message=f"{len(certain)} failing",
    )  # fmt: skip


@st.composite
def windows(draw: st.DrawFn) -> tuple[int, int, bool | None, list[Pod], list[Pod], int]:
    baseline = draw(st.integers(1, 12))
    percent = draw(st.sampled_from([1, 50, 60, 80, 90, 100]))
    raises = draw(st.sampled_from([True, False, None]))
    added = draw(st.integers(0, 6))  # an HPA's scale-out (or a surge) during the window
    first = [(f"p{i}", draw(STATES), draw(st.integers(0, 3))) for i in range(baseline + added)]
    second: list[Pod] = []
    for name, state, restarts in first:
        change = draw(st.sampled_from(CHANGES))
        if change == "same":
            second.append((name, state, restarts))
        elif change == "crashed again":  # the kubelet's next restart failed as the last did
            second.append((name, state, restarts + draw(st.integers(1, 2))))
        elif change == "restarted":  # the kubelet restarted it; it failed otherwise, or not
            second.append((name, draw(STATES), restarts + draw(st.integers(1, 2))))
        elif change == "recovered":
            second.append((name, HEALTHY, restarts + 1))
        elif change == "replaced":
            second.append((f"{name}-new", draw(STATES), 0))
    second += [(f"n{i}", draw(STATES), 0) for i in range(draw(st.integers(0, 3)))]
    desired = baseline + added + draw(st.integers(-2, 2))
    return baseline, percent, raises, first, second, max(desired, 0)


@pytest.fixture(scope="module")
def tally() -> Iterator[Counter[str]]:
    counts: Counter[str] = Counter()
    yield counts
    print(f"\nearly verdict: {counts['early']} of {counts['generated']} generated windows decided"
          " early, each one the window's end decided the same")  # fmt: skip
    if counts["generated"] >= EXAMPLES:  # the generator must reach the decision, or it says little
        assert counts["early"] >= counts["generated"] // 20, counts


@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(window=windows())
def test_an_early_rollback_is_one_the_windows_end_would_make_on_the_same_pods(
    window: tuple[int, int, bool | None, list[Pod], list[Pod], int], tally: Counter[str]
) -> None:
    baseline, percent, raises, first, second, desired = window
    tally["generated"] += 1
    policy = early_policy(CONFIRM).model_copy(update={"adoption_threshold_percent": percent})
    opening = CohortSample(desired=baseline, pods=baseline, adopted=baseline,
                           adopted_healthy=baseline, raises_requests=raises)  # fmt: skip
    opened = decide(monitoring(policy), Sampled(T0, opening)).state
    assert opened.baseline == baseline
    t1 = T0 + timedelta(seconds=30)
    crossing = decide(opened, Sampled(t1, cohort(first, desired))).state
    confirming = cohort(second, desired)
    early = decide(crossing, Sampled(t1 + CONFIRM, confirming)).state
    if early.mode is Mode.MONITORING:
        return  # not decided early: nothing to hold it to
    assert early.mode is Mode.ROLLING_BACK, early.mode
    tally["early"] += 1
    assert crossing.window_ends_at is not None
    end = decide(crossing, Sampled(crossing.window_ends_at, confirming)).state
    assert end.mode is Mode.ROLLING_BACK, (early.failure_message, end.mode)
