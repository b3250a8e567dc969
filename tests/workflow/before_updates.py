"""A RollbackWorkflow as built before the control Updates, for the fallback test: its signals and
its ``status`` query only. A module of its own because the workflow sandbox re-imports the module
that defines a workflow."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from workflows.contract import Mode
    from workflows.machine import RollbackState, initial_state
    from workflows.rollback import (
        WORKFLOW_NAME,
        CancelSignal,
        RollbackInput,
        RollbackResult,
    )


@workflow.defn(name=WORKFLOW_NAME)
class RollbackWorkflowBeforeUpdates:
    def __init__(self) -> None:
        self._state: RollbackState | None = None
        self._reason: str | None = None

    @workflow.run
    async def run(self, input: RollbackInput) -> RollbackResult:
        self._state = initial_state(input.owner, input.recommendation)
        await workflow.wait_condition(lambda: self._reason is not None)
        return RollbackResult(
            owner=input.owner,
            mode=Mode.CANCELLED,
            turn=1,
            fingerprint=self._state.fingerprint,
            message=self._reason,
        )

    @workflow.signal
    def cancel(self, signal: CancelSignal) -> None:
        self._reason = signal.reason

    @workflow.query
    def status(self) -> RollbackState | None:
        return self._state
