"""What a run costs the Temporal server, read from its history: events by kind, and billable
actions by Temporal Cloud's published rules (https://docs.temporal.io/cloud/actions), as the
table below applies them. An estimate from the history, which the docs say is how Event
History supports estimates; the billing itself is Temporal Cloud's."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

LOCAL_ACTIVITY_MARKER = "core_local_activity"  # the marker the SDK records for each local activity

# (history event, actions, how it is counted)
RULES = (
    ("WorkflowExecutionStarted", 1, "a start, or a signal-with-start with its signal"),
    ("WorkflowExecutionSignaled", 1, "each signal, but the one a signal-with-start carried"),
    ("ActivityTaskScheduled", 1, "each scheduled activity (a retry is not a new one here)"),
    ("MarkerRecorded (local activity)", 1, "all local activities of one workflow task together"),
    ("TimerStarted", 1, "each timer"),
    ("UpsertWorkflowSearchAttributes", 1, "each upsert command"),
    ("StartChildWorkflowExecutionInitiated", 1, "each child workflow started"),
    ("WorkflowExecutionContinuedAsNew", 1, "the next run's start"),
)


def _is_local_activity(event: Any) -> bool:
    return bool(
        event.HasField("marker_recorded_event_attributes")
        and event.marker_recorded_event_attributes.marker_name == LOCAL_ACTIVITY_MARKER
    )


def billable(events: Sequence[Any]) -> Iterator[tuple[Any, int]]:
    """Each event of one run with the billable actions it counts for (``RULES``): the local
    activities of one workflow task count once, at the first of their markers."""
    tasks_with_local: set[int] = set()
    last_task = 0
    for e in events:
        if e.HasField("workflow_task_completed_event_attributes"):
            last_task = e.event_id
            yield e, 0
        elif _is_local_activity(e):
            yield e, 0 if last_task in tasks_with_local else 1
            tasks_with_local.add(last_task)
        elif e.HasField("workflow_execution_signaled_event_attributes"):
            yield e, 0 if e.event_id == 2 else 1  # right after the start: signal-with-start
        elif any(
            e.HasField(f)
            for f in (
                "workflow_execution_started_event_attributes",
                "activity_task_scheduled_event_attributes",
                "timer_started_event_attributes",
                "upsert_workflow_search_attributes_event_attributes",
                "start_child_workflow_execution_initiated_event_attributes",
                "workflow_execution_continued_as_new_event_attributes",
            )
        ):
            yield e, 1
        else:
            yield e, 0


def shape(events: Sequence[Any]) -> dict[str, int]:
    """Events, activities, local activities, timers, signals and billable actions of one run."""
    return {
        "events": len(events),
        "activities": sum(e.HasField("activity_task_scheduled_event_attributes") for e in events),
        "local": sum(_is_local_activity(e) for e in events),
        "timers": sum(e.HasField("timer_started_event_attributes") for e in events),
        "signals": sum(e.HasField("workflow_execution_signaled_event_attributes") for e in events),
        "actions": sum(n for _, n in billable(events)),
    }


def total(shapes: Sequence[dict[str, int]]) -> dict[str, int]:
    keys = shapes[0].keys() if shapes else ()
    return {k: sum(s[k] for s in shapes) for k in keys}
