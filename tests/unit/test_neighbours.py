"""The verdict beside an HPA and during a release (``workflows.neighbours``, ``workflows.machine``):
the autoscaler check's rules; the cohort following an HPA's scale-in; a release never judged as
the cut (no rollback, no turn), the verdict waiting for its rollout and a fresh window after."""

from __future__ import annotations

from datetime import timedelta

import pytest

from activities.neighbours import RESTARTED_AT, rolled_out, template_of
from cli import ops
from tests.unit.test_machine import OWNER, REC, T0, policy, stored
from workflows.activity_api import CohortSample, LoadOwnerResult, PolicySettings
from workflows.contract import EventReason, FailureReason, Mode, Obj, WorkloadKind
from workflows.machine import (
    TRANSITIONS,
    AttemptStarted,
    Record,
    RollbackState,
    Sampled,
    decide,
    health_due,
    initial_state,
)
from workflows.neighbours import autoscaler_check, release_recheck, release_seen
from workflows.policy import AutoscalerCheck, EarlyVerdict, HealthChecks, QueryCheck
from workflows.state import Autoscaler, OwnerState, Template

HPA = Autoscaler(name="api", desired=4, min=2, max=10)
V1 = Template(fingerprint="aaaa", images={"app": "shop/api:1.0"})
V2 = Template(fingerprint="bbbb", images={"app": "shop/api:2.0"})
WINDOW_END = T0 + timedelta(minutes=5)


def checked(growth: int | None = 50, at_max: bool = True, queries: bool = False) -> PolicySettings:
    check = AutoscalerCheck(max_growth_percent=growth, fail_at_max=at_max)
    prometheus = [QueryCheck(name="errors", promql="up", healthy_when="<", threshold=1.0)]
    checks = HealthChecks(autoscaler=check, queries=prometheus if queries else [])
    return policy().model_copy(update={"health_checks": checks})


def opened(
    p: PolicySettings | None = None, hpa: Autoscaler | None = HPA, template: Template = V1
) -> RollbackState:
    loaded = LoadOwnerResult(
        exists=True,
        state=stored(Mode.MONITORING_SUCCEEDED, fingerprint="old"),
        policy=p or checked(),
        desired=4,
        template=template,
        autoscaler=hpa,
    )
    state = decide(initial_state(OWNER, REC), AttemptStarted(T0, loaded)).state
    assert state.mode is Mode.MONITORING and state.autoscaler == hpa and state.template == template
    return state


def seen(
    healthy: int,
    desired: int = 4,
    hpa: Autoscaler | None = None,
    template: Template = V1,
    rolled_out: bool = True,
    **failing: int,
) -> CohortSample:
    return CohortSample(
        desired=desired,
        pods=max(desired, healthy),
        adopted=max(desired, healthy),
        adopted_healthy=healthy,
        failing={FailureReason(k): v for k, v in failing.items()},
        unhealthy={FailureReason(k): v for k, v in failing.items()},
        template=template,
        rolled_out=rolled_out,
        autoscaler=hpa,
    )


@pytest.mark.parametrize(
    ("before", "after", "passed", "said"),
    [
        pytest.param(HPA, HPA, True, "HPA api: 4 -> 4 desired replicas (min 2, max 10)",
                     id="unchanged"),
        pytest.param(HPA, HPA.model_copy(update={"desired": 6}), True,
                     "HPA api: 4 -> 6 desired replicas (min 2, max 10)", id="grown-50-percent"),
        pytest.param(HPA, HPA.model_copy(update={"desired": 7}), False,
                     "HPA api: 4 -> 7 desired replicas (min 2, max 10): grown 75%, more than 50%",
                     id="grown-75-percent"),
        pytest.param(HPA.model_copy(update={"max": 5}), HPA.model_copy(update={"desired": 5,
                     "max": 5}), False, "HPA api: 4 -> 5 desired replicas (min 2, max 5): pinned"
                     " at its maxReplicas: it can no longer absorb a peak", id="pinned"),
        pytest.param(HPA.model_copy(update={"desired": 10}), HPA.model_copy(update={"desired":
                     10}), True, "HPA api: 10 -> 10 desired replicas (min 2, max 10); at its"
                     " maximum when the window opened already: the pin is not judged",
                     id="pinned-before"),
        pytest.param(None, HPA.model_copy(update={"desired": 10}), False, "HPA api: 10 desired"
                     " replicas (min 2, max 10); not read when the window opened: only the pin"
                     " is judged: pinned at its maxReplicas: it can no longer absorb a peak",
                     id="no-open-reading"),
    ],
)  # fmt: skip
def test_the_autoscaler_check(
    before: Autoscaler | None, after: Autoscaler, passed: bool, said: str
) -> None:
    result = autoscaler_check(AutoscalerCheck(max_growth_percent=50), before, after)
    assert (result.passed, result.message, result.reason) == (
        passed,
        said,
        FailureReason.AUTOSCALER_SCALED_OUT,
    )


@pytest.mark.parametrize("kept", [True, False])
def test_a_resumed_window_judges_against_the_baselines_it_opened_with(kept: bool) -> None:
    """A worker died after its run recorded the window (1,000-workload soak: the run that
    resumed it read the HPA the peak had pinned already, and the pods it had added, as its
    baselines, and the cut passed): the stored state keeps the window's baselines, and the
    resumed window judges the pin and the cohort against them. A state without them (written
    before a baseline was known) is read afresh, as before."""
    state = opened(checked(growth=None))
    written = state.owner_state()
    assert written.window is not None and written.window.autoscaler == HPA
    assert OwnerState.model_validate_json(written.to_json()) == written  # the annotation's JSON
    pinned = HPA.model_copy(update={"desired": 10})
    loaded = LoadOwnerResult(
        exists=True, state=written if kept else written.model_copy(update={"window": None}),
        policy=checked(growth=None), desired=10, template=V1, autoscaler=pinned,
    )  # fmt: skip
    later = T0 + timedelta(minutes=1)
    resumed = decide(initial_state(OWNER, REC), AttemptStarted(later, loaded)).state
    assert resumed.mode is Mode.MONITORING
    assert (resumed.baseline, resumed.autoscaler) == ((4, HPA) if kept else (10, pinned))
    end = later + timedelta(minutes=5)
    verdict = decide(resumed, Sampled(end, seen(4, desired=10, hpa=pinned)))
    if kept:  # 4 of the 4 it opened with, healthy; the HPA pinned since: rolled back for it
        assert verdict.state.failure_reason is FailureReason.AUTOSCALER_SCALED_OUT
    else:  # 4 of 10 healthy: the pods the HPA added raised the cohort
        assert verdict.state.failure_reason is FailureReason.ADOPTION_THRESHOLD_NOT_MET


def test_no_hpa_is_not_applicable_and_passes() -> None:
    result = autoscaler_check(AutoscalerCheck(), HPA, None)
    assert result.passed and not result.applicable
    assert (
        result.message == "autoscaler: not applicable: no HorizontalPodAutoscaler scales the owner"
    )


def test_an_hpa_driven_to_its_maximum_rolls_the_cut_back_without_prometheus() -> None:
    state = opened(checked(growth=None))
    pinned = HPA.model_copy(update={"desired": 10})
    assert not health_due(state, seen(4, hpa=pinned), WINDOW_END)  # nothing asks Prometheus
    verdict = decide(state, Sampled(WINDOW_END, seen(4, desired=10, hpa=pinned)))
    assert verdict.state.mode is Mode.ROLLING_BACK
    assert verdict.state.failure_reason is FailureReason.AUTOSCALER_SCALED_OUT
    assert verdict.state.problem is not None and (
        "health check autoscaler failed: HPA api: 4 -> 10 desired replicas (min 2, max 10):"
        " pinned at its maxReplicas" in verdict.state.problem
    )
    health = verdict.state.last_health
    assert health is not None and health.checks[0].value == 10 and health.checks[0].baseline == 4


def test_an_hpa_left_where_it_was_passes_and_prometheus_is_asked_after_it() -> None:
    state = opened(checked(queries=True))
    assert health_due(state, seen(4, hpa=HPA), WINDOW_END)
    pinned = HPA.model_copy(update={"desired": 10})
    assert not health_due(state, seen(4, hpa=pinned), WINDOW_END)  # it fails already
    verdict = decide(state, Sampled(WINDOW_END, seen(4, hpa=HPA)))
    assert verdict.state.mode is Mode.MONITORING_SUCCEEDED
    (record,) = [e for e in verdict.effects if isinstance(e, Record)]
    assert "health checks passed: HPA api: 4 -> 4 desired replicas" in record.message


def test_the_cohort_follows_an_hpa_s_scale_in() -> None:
    """Baseline 4 at 80% wants 4; the HPA scaled to 2 during the window: 2 of 2 pass. Without
    an HPA the same scale-down fails (the spec's baseline: pods that never came up)."""
    hpa = HPA.model_copy(update={"desired": 2})
    verdict = decide(opened(), Sampled(WINDOW_END, seen(2, desired=2, hpa=hpa)))
    assert verdict.state.mode is Mode.MONITORING_SUCCEEDED
    record = verdict.effects[0]
    assert isinstance(record, Record)
    assert "2/2 pods adopted and healthy, 2 required (HPA api scaled the cohort in from 4)" in (
        record.message
    )
    alone = decide(opened(policy(), hpa=None), Sampled(WINDOW_END, seen(2, desired=2)))
    assert alone.state.mode is Mode.ROLLING_BACK


def test_a_bad_release_is_never_judged_as_the_cut() -> None:
    """A release ships during the window and its pods crash: the verdict does not roll the cut
    back; it says what it saw once, looks again (10 s, then 20 s) while the release rolls out,
    and once it has (here a fixed release), a fresh window of the same turn judges the cut."""
    state = opened(policy())
    crashing = seen(0, template=V2, rolled_out=False, crashLoopBackOff=4)
    waiting = decide(state, Sampled(WINDOW_END, crashing))
    assert waiting.state.mode is Mode.MONITORING and waiting.state.turn == 1
    (record,) = waiting.effects
    assert isinstance(record, Record) and record.event_reason is EventReason.RELEASE_SEEN
    assert record.identity == "release" and not record.warning
    assert "its pod template changed (app shop/api:1.0 -> shop/api:2.0)" in record.message
    assert waiting.state.window_ends_at == WINDOW_END + timedelta(seconds=10)
    again = decide(waiting.state, Sampled(WINDOW_END + timedelta(seconds=10), crashing))
    assert again.effects == [] and again.state.mode is Mode.MONITORING
    assert again.state.window_ends_at == WINDOW_END + timedelta(seconds=30)
    fixed = Template(fingerprint="cccc", images={"app": "shop/api:2.1"})
    done = WINDOW_END + timedelta(seconds=30)
    fresh = decide(again.state, Sampled(done, seen(4, template=fixed)))
    assert fresh.state.mode is Mode.MONITORING and fresh.state.turn == 1
    assert fresh.state.transitions == again.state.transitions + 1
    assert (fresh.state.window_started_at, fresh.state.template) == (done, fixed)
    assert fresh.state.release is None and fresh.state.baseline == 4
    (started,) = fresh.effects
    assert isinstance(started, Record) and started.event_reason is EventReason.MONITORING_STARTED
    assert started.message.startswith(
        "After a release rolled out (now app shop/api:2.1): restarted monitoring of"
    )
    judged = decide(fresh.state, Sampled(done + timedelta(minutes=5), seen(4, template=fixed)))
    assert judged.state.mode is Mode.MONITORING_SUCCEEDED


def test_a_good_release_under_a_cut_that_ooms_is_not_waited_for() -> None:
    """A release ships while a memory cut OOM-kills every pod: its new pods are admitted with
    the cut and killed too, so it can never roll out. An OOM kill under the cut's limit is the
    cut's whatever the image: the window's end rolls the cut back, telling the release once;
    it does not wait for a rollout the cut prevents (before: looking again for ever)."""
    state = opened(policy())
    killed = seen(0, template=V2, rolled_out=False, oomKilled=4)
    verdict = decide(state, Sampled(WINDOW_END, killed))
    assert (verdict.state.mode, verdict.state.failure_reason) == (
        Mode.ROLLING_BACK, FailureReason.OOM_KILLED
    )  # fmt: skip
    reasons = [e.event_reason for e in verdict.effects if isinstance(e, Record)]
    assert reasons == [EventReason.RELEASE_SEEN, EventReason.ROLLING_BACK_STARTED]


def test_a_release_that_never_rolls_out_is_waited_for_only_up_to_its_bound() -> None:
    """A release whose own image crash-loops (not a failure only the cut causes) is waited for,
    looking again, but for at most a monitoring period, 10 minutes at least: then a Warning
    says the bound decided, and the window's end judges the workload as it is."""
    state = opened(policy())
    crashing = seen(0, template=V2, rolled_out=False, crashLoopBackOff=4)
    at = WINDOW_END
    look = decide(state, Sampled(at, crashing))
    assert look.state.release_since == at
    while look.state.mode is Mode.MONITORING and at < WINDOW_END + timedelta(hours=1):
        assert look.state.window_ends_at is not None
        at = look.state.window_ends_at
        look = decide(look.state, Sampled(at, crashing))
    assert at == WINDOW_END + timedelta(minutes=10)  # the bound, not a look past it
    assert look.state.mode is Mode.ROLLING_BACK
    told = [e for e in look.effects if isinstance(e, Record)]
    assert told[0].event_reason is EventReason.RELEASE_SEEN and told[0].warning
    assert "did not roll out within 10m" in told[0].message


def test_describe_says_what_a_release_waits_for_and_until_when_at_most() -> None:
    crashing = seen(0, template=V2, rolled_out=False, crashLoopBackOff=4)
    waiting = decide(opened(policy()), Sampled(WINDOW_END, crashing)).state
    shown = ops.describe_text("test", OWNER, "Running", waiting).splitlines()
    look, bound = WINDOW_END + timedelta(seconds=10), WINDOW_END + timedelta(minutes=10)
    assert (
        "Release:      its pod template changed (app shop/api:1.0 -> shop/api:2.0): not judged as"
        f" the cut; the verdict waits for it to roll out, looking again at {look.isoformat()},"
        f" at most until {bound.isoformat()}"
    ) in shown


def test_a_release_seen_by_an_early_verdict_decides_nothing_early() -> None:
    early = policy().model_copy(update={"early_verdict": EarlyVerdict()})
    state = opened(early)
    crashing = seen(0, template=V2, rolled_out=False, crashLoopBackOff=4)
    look = decide(state, Sampled(T0 + timedelta(seconds=30), crashing))
    assert look.state.mode is Mode.MONITORING and look.state.early_since is None
    assert look.state.next_sample_at == WINDOW_END
    (record,) = look.effects
    assert isinstance(record, Record) and record.event_reason is EventReason.RELEASE_SEEN
    confirm = decide(look.state, Sampled(T0 + timedelta(seconds=40), crashing))
    assert confirm.effects == [] and confirm.state.mode is Mode.MONITORING


def test_a_restart_or_the_same_template_is_no_release() -> None:
    assert release_seen(V1, V1) is None
    assert release_seen(None, V2) is None and release_seen(V1, None) is None
    env = Template(fingerprint="dddd", images=V1.images)
    assert release_seen(V1, env) == "its pod template changed (not its images)"


def test_a_release_is_looked_at_again_doubling_to_five_minutes() -> None:
    assert [release_recheck(n).total_seconds() for n in range(7)] == [
        10, 20, 40, 80, 160, 300, 300,
    ]  # fmt: skip


def test_the_release_s_fresh_window_is_a_drawn_transition() -> None:
    assert (Mode.MONITORING, "a release rolled out (a fresh window)", Mode.MONITORING) in (
        TRANSITIONS
    )


def _deployment(image: str = "shop/api:1", memory: str = "1Gi", **annotations: str) -> Obj:
    return {
        "metadata": {"name": "api", "generation": 2},
        "spec": {
            "replicas": 3,
            "template": {
                "metadata": {"labels": {"app": "api"}, "annotations": annotations},
                "spec": {"containers": [
                    {"name": "app", "image": image, "resources": {"requests": {"memory": memory}}}
                ]},
            },
        },
        "status": {"observedGeneration": 2, "replicas": 3, "updatedReplicas": 3,
                   "availableReplicas": 3},
    }  # fmt: skip


def test_a_template_s_fingerprint_leaves_out_resources_and_restarts() -> None:
    before = template_of(WorkloadKind.DEPLOYMENT, _deployment())
    assert before is not None and before.images == {"app": "shop/api:1"}
    resized = _deployment(memory="768Mi", **{RESTARTED_AT: "2026-12-07T01:00:00Z"})
    assert template_of(WorkloadKind.DEPLOYMENT, resized) == before
    applier = _deployment(**{"rightsizing.kubex.ai/last-applied": "x"})
    assert template_of(WorkloadKind.DEPLOYMENT, applier) == before
    released = template_of(WorkloadKind.DEPLOYMENT, _deployment(image="shop/api:2"))
    assert released is not None and released.fingerprint != before.fingerprint
    assert template_of(WorkloadKind.JOB, _deployment()) is None  # a Job has no releases


@pytest.mark.parametrize(
    ("status", "done"),
    [
        pytest.param({}, True, id="complete"),
        pytest.param({"observedGeneration": 1}, False, id="not-seen-yet"),
        pytest.param({"updatedReplicas": 2}, False, id="not-all-updated"),
        pytest.param({"replicas": 4}, False, id="an-old-pod-left"),
        pytest.param({"availableReplicas": 1}, False, id="crashing"),
    ],
)
def test_a_deployment_has_rolled_out_as_kubectl_rollout_status_says(
    status: dict[str, int], done: bool
) -> None:
    owner = _deployment()
    owner["status"] |= status
    assert rolled_out(WorkloadKind.DEPLOYMENT, owner) is done


def test_other_kinds_roll_out_by_their_own_status() -> None:
    sts = {"metadata": {"generation": 1}, "spec": {"replicas": 2},
           "status": {"observedGeneration": 1, "updatedReplicas": 2, "readyReplicas": 2,
                      "currentRevision": "a", "updateRevision": "b"}}  # fmt: skip
    assert rolled_out(WorkloadKind.STATEFUL_SET, sts) is False  # pods of an old revision left
    sts["status"]["currentRevision"] = "b"
    assert rolled_out(WorkloadKind.STATEFUL_SET, sts) is True
    ds = {"metadata": {"generation": 1}, "spec": {},
          "status": {"observedGeneration": 1, "desiredNumberScheduled": 3,
                     "updatedNumberScheduled": 3, "numberAvailable": 2}}  # fmt: skip
    assert rolled_out(WorkloadKind.DAEMON_SET, ds) is False
    assert rolled_out(WorkloadKind.CRON_JOB, ds) is None
