"""What the benchmarks run: instant in-memory activities, and a floor workflow that performs the
same timers and no-op activities as a successful RollbackWorkflow run, without its logic."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from temporalio import activity, workflow

from workflows.activity_api import (
    LOAD_OWNER,
    REAPPLY_RECOMMENDATION,
    RECORD_TRANSITION,
    RESOLVE_POLICY,
    ROLL_BACK,
    SAMPLE_COHORT,
    ActuationResult,
    CohortQuery,
    CohortSample,
    LoadOwnerInput,
    LoadOwnerResult,
    PolicySettings,
    ReapplyInput,
    RecordTransitionInput,
    RecordTransitionResult,
    ResolvePolicyInput,
    ResolvePolicyResult,
    RollBackInput,
    SampleCohortInput,
)
from workflows.contract import RollbackTarget, recommendation_key
from workflows.fingerprint import Recommendation
from workflows.policy import Backoff
from workflows.state import PolicyRef

# 1 ms: over before the window's timer would start, in both workflows alike (the timer is the
# server's, the same for both; what P1 compares is the engine's work around it).
WINDOW = timedelta(milliseconds=1)
POLICY = PolicySettings(
    ref=PolicyRef(kind="RollbackPolicy", namespace="bench", name="p"),
    monitoring_period=WINDOW,
    rollback_target=RollbackTarget.LAST_SUCCESSFUL,
    adoption_threshold_percent=80,
    backoff=Backoff(time_period=timedelta(seconds=1), multiply_by_turn=1, max_attempts=1),
)


class InstantCluster:
    """Every activity answers at once: a healthy cohort of 5 that adopted the recommendation,
    under a policy whose window is ``window``."""

    recommendation = Recommendation(
        requests_key=recommendation_key("static"),
        requests={"app": {"memory": "512Mi"}},
    )

    def __init__(self, window: timedelta = WINDOW) -> None:
        self.policy = POLICY.model_copy(update={"monitoring_period": window})

    @activity.defn(name=LOAD_OWNER)
    async def load_owner(self, input: LoadOwnerInput) -> LoadOwnerResult:
        return LoadOwnerResult(exists=True, policy=self.policy, desired=5)

    @activity.defn(name=RESOLVE_POLICY)
    async def resolve_policy(self, input: ResolvePolicyInput) -> ResolvePolicyResult:
        return ResolvePolicyResult(policy=self.policy)

    @activity.defn(name=SAMPLE_COHORT)
    async def sample_cohort(self, input: SampleCohortInput) -> CohortSample:
        return CohortSample(
            desired=5,
            pods=5,
            adopted=5,
            adopted_healthy=5,
            cohort=CohortQuery(label_selector="app=x"),
            observed_at=datetime.now(UTC),
        )

    @activity.defn(name=RECORD_TRANSITION)
    async def record_transition(self, input: RecordTransitionInput) -> RecordTransitionResult:
        # Outlast the window: a local activity's completion moves the workflow's clock, so the
        # window that opened before this record is over when it returns, and the run never
        # starts a timer (without it, whether 1 ms had passed varied run to run). Latency the
        # rollback pays and the floor does not: the ratio errs against the engine.
        await asyncio.sleep(2 * WINDOW.total_seconds())
        return RecordTransitionResult(state_written=True)

    @activity.defn(name=ROLL_BACK)
    async def roll_back(self, input: RollBackInput) -> ActuationResult:
        return ActuationResult()

    @activity.defn(name=REAPPLY_RECOMMENDATION)
    async def reapply_recommendation(self, input: ReapplyInput) -> ActuationResult:
        return ActuationResult()

    @activity.defn(name="noop")
    async def noop(self, n: int) -> int:
        return n


@workflow.defn(name="FloorWorkflow")
class FloorWorkflow:
    """``activities`` no-op activities and ``timers`` timers over ``window`` seconds in all,
    interleaved like a window."""

    @workflow.run
    async def run(self, shape: tuple[int, int, float]) -> int:
        activities, timers, window = shape
        done = 0
        for i in range(max(activities, timers)):
            if i < activities:
                done += await workflow.execute_activity(
                    "noop", i, start_to_close_timeout=timedelta(seconds=20), result_type=int
                )
            if i < timers:
                await asyncio.sleep(window / max(timers, 1))
        return done
