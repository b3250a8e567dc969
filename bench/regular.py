"""The cost benchmark's baseline: ``RollbackWorkflow`` with every activity a regular one (what
the local activities save), under the same name on a task queue of its own. A module
of its own because the workflow sandbox re-imports the module that defines a workflow."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from workflows.rollback import WORKFLOW_NAME, RollbackInput, RollbackResult, RollbackWorkflow


@workflow.defn(name=WORKFLOW_NAME)
class RegularActivitiesWorkflow(RollbackWorkflow):
    local_activities = False

    @workflow.run
    async def run(self, input: RollbackInput) -> RollbackResult:
        return await super().run(input)
