"""A deliberately incompatible RollbackWorkflow, for the Worker Versioning test: every run starts
with a timer v1 never wrote, so replaying a v1 history on it fails. A module of its own because
the workflow sandbox re-imports the module that defines a workflow."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from workflows.rollback import WORKFLOW_NAME, RollbackInput, RollbackResult, RollbackWorkflow

V2_MARKER = "v2: a timer v1 never had"


@workflow.defn(name=WORKFLOW_NAME)
class RollbackWorkflowV2(RollbackWorkflow):
    @workflow.run
    async def run(self, input: RollbackInput) -> RollbackResult:
        await workflow.sleep(timedelta(milliseconds=10), summary=V2_MARKER)
        return await super().run(input)
