"""``rollbackctl policy validate|explain``: policy files in, one readable answer out.

Works on files only (no cluster, no Temporal). ``explain`` prints which policy applies to a
workload manifest, every other candidate with why it lost or did not match, and the backoff
schedule, as text or JSON (docs/concepts/policies.md, "Policies").
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from cli.policyfiles import load_documents, load_policies
from worker.config import protection_from
from worker.flags import ConfigError
from workflows.backoff import backoff_schedule
from workflows.durations import format_duration
from workflows.selection import Resolution, WorkloadRef, resolve
from workflows.state import PolicyRef


def cmd_policy_validate(args: argparse.Namespace) -> int:
    policies, problems = load_policies(args.files)
    for problem in problems:
        print(problem)
    if problems:
        return 1
    print(f"{len(policies)} polic{'y' if len(policies) == 1 else 'ies'} valid")
    return 0


def explain_json(workload: WorkloadRef, resolution: Resolution) -> dict[str, Any]:
    winner = resolution.policy
    return {
        "workload": {
            "kind": workload.kind.value,
            "namespace": workload.namespace,
            "name": workload.name,
        },
        "policy": PolicyRef.of(winner).model_dump() if winner else None,
        "protected": resolution.protected,
        "candidates": [
            {**PolicyRef.of(c.policy).model_dump(), "matched": c.matched, "reason": c.reason}
            for c in resolution.candidates
        ],
        "backoffSchedule": (
            [format_duration(w) for w in backoff_schedule(winner.spec.backoff)] if winner else []
        ),
    }


def explain_text(workload: WorkloadRef, resolution: Resolution) -> str:
    labels = ", ".join(f"{k}={v}" for k, v in sorted(workload.labels.items())) or "none"
    lines = [f"Workload:  {workload.kind} {workload.namespace}/{workload.name} (labels: {labels})"]
    winner = resolution.policy
    if resolution.protected is not None:
        lines.append(
            f"Policy:    none: {resolution.protected} (--protected-namespaces);"
            " the workload is retained (no monitoring, rollback or retry)"
        )
    elif winner is None:
        lines.append(
            "Policy:    none matches: the workload is retained (no monitoring, rollback or retry)"
        )
    else:
        spec = winner.spec
        lines.append(
            f"Policy:    {PolicyRef.of(winner)} (weight {spec.weight},"
            f" rollbackTarget {spec.rollback_target},"
            f" monitoringPeriod {format_duration(spec.monitoring_period)},"
            f" adoptionThresholdPercent {spec.adoption_threshold_percent})"
        )
    lines.append("")
    lines.append(
        "Candidates, in precedence order:" if resolution.candidates else "Candidates: none given"
    )
    for c in resolution.candidates:
        mark = "*" if c.policy is winner else ("~" if c.matched else "-")
        lines.append(f"  {mark} {PolicyRef.of(c.policy)}: {c.reason}")
    if winner is not None:
        b = winner.spec.backoff
        lines.append("")
        lines.append(
            f"Backoff schedule (timePeriod {format_duration(b.time_period)} x multiplyByTurn"
            f" {b.multiply_by_turn} x turn, maxAttempts {b.max_attempts}):"
        )
        for turn, wait in enumerate(backoff_schedule(b), start=1):
            tail = "  -> failedPermanent when this wait ends" if turn == b.max_attempts else ""
            lines.append(f"  turn {turn}: {format_duration(wait)}{tail}")
    return "\n".join(lines)


def cmd_policy_explain(args: argparse.Namespace) -> int:
    policies, problems = load_policies(args.policies)
    docs, doc_problems = load_documents(args.workload)
    problems += doc_problems
    if not problems and len(docs) != 1:
        print(f"{args.workload}: expected exactly one workload document, found {len(docs)}")
        return 1
    workload = None
    if not problems:
        try:
            workload = WorkloadRef.from_manifest(docs[0][1], namespace=args.namespace)
        except ValueError as exc:
            print(f"{args.workload}: {exc}")
            return 1
    for problem in problems:
        print(problem)
    if problems or workload is None:
        return 1
    try:
        protection = protection_from(args, os.environ)
    except ConfigError as exc:
        print(f"error: {exc}")
        return 1
    resolution = resolve(policies, workload, protection)
    if args.output == "json":
        print(json.dumps(explain_json(workload, resolution), indent=2))
    else:
        print(explain_text(workload, resolution))
    return 0
