"""``rollbackctl get policies`` and ``rollbackctl describe policy``: the policies as the cluster
holds them, with the status the intake writes (docs/concepts/status-and-control.md, "Policy
status").

The table has the CRDs' own printer columns (``cli.crds.PRINTER_COLUMNS``), so it reads like
``kubectl get rbp,crbp``; ``describe`` adds the conditions, the last error and the workloads
whose current attempt runs under the policy (from Temporal's visibility, one query).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes.client import ApiClient, CustomObjectsApi
from kubernetes.client.exceptions import ApiException

from cli.crds import PRINTER_COLUMNS
from cli.ops import OpsError, Row, columns
from workflows.contract import API_GROUP, API_VERSION, POLICY_ALIASES, Obj
from workflows.jsonpath import age, jsonpath
from workflows.policy_status import PolicyStatus

KINDS = {"RollbackPolicy": "rollbackpolicies", "ClusterRollbackPolicy": "clusterrollbackpolicies"}
ALIASES = POLICY_ALIASES
SHOWN = [c for c in PRINTER_COLUMNS if not c.get("priority")]


@dataclass
class PolicyRow:
    kind: str
    namespace: str | None
    name: str
    values: dict[str, str]  # printer column name -> text
    doc: Obj

    @property
    def resource_name(self) -> str:
        """As ``kubectl get -o name`` names the policy."""
        return f"{self.kind.lower()}.{API_GROUP}/{self.name}"

    def as_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "namespace": self.namespace,
            "name": self.name,
            "spec": self.doc.get("spec", {}),
            "status": self.doc.get("status", {}),
        }


def _cell(doc: Obj, column: dict[str, Any], now: datetime) -> str:
    value = jsonpath(doc, column["jsonPath"])
    if column["type"] == "date":
        return age(value, now)
    return "<none>" if value is None else str(value)


def list_policies(kube: ApiClient, namespace: str | None = None) -> list[PolicyRow]:
    """Namespaced policies (of ``namespace``, or all) and every cluster policy."""
    custom, now = CustomObjectsApi(kube), datetime.now(UTC)
    rows = []
    for kind, plural in KINDS.items():
        try:
            if kind == "RollbackPolicy" and namespace:
                listed: Any = custom.list_namespaced_custom_object(
                    API_GROUP, API_VERSION, namespace, plural
                )
            else:
                listed = custom.list_cluster_custom_object(API_GROUP, API_VERSION, plural)
        except ApiException as exc:
            raise OpsError(f"listing {plural}: {exc.status} {exc.reason}") from None
        for doc in listed.get("items", []):
            meta = doc["metadata"]
            values = {c["name"]: _cell(doc, c, now) for c in PRINTER_COLUMNS}
            rows.append(PolicyRow(kind, meta.get("namespace"), meta["name"], values, doc))
    return sorted(rows, key=lambda r: (r.kind != "RollbackPolicy", r.namespace or "", r.name))


def table(rows: list[PolicyRow], wide: bool = False, header: bool = True) -> str:
    """The policies with the CRDs' printer columns (``wide``: the priority ones too)."""
    shown = PRINTER_COLUMNS if wide else SHOWN
    names = ("KIND", "NAMESPACE", "NAME", *(c["name"].upper() for c in shown))
    body = [
        (r.kind, r.namespace or "", r.name, *(r.values[c["name"]] for c in shown)) for r in rows
    ]
    return columns(names, body, header)


def find(rows: list[PolicyRow], kind: str, namespace: str | None, name: str) -> PolicyRow:
    for r in rows:
        if (
            r.kind == kind
            and r.name == name
            and (kind != "RollbackPolicy" or r.namespace == namespace)
        ):
            return r
    where = f"{namespace}/" if kind == "RollbackPolicy" else ""
    raise OpsError(f"{kind} {where}{name} not found")


def ref_text(row: PolicyRow) -> str:
    """The policy as the workflow's ``RollbackPolicy`` search attribute names it."""
    return "/".join(p for p in (row.kind, row.namespace, row.name) if p)


def describe_text(row: PolicyRow, tracked: list[Row]) -> str:
    spec, status = row.doc.get("spec", {}), PolicyStatus.read(row.doc.get("status"))
    backoff = spec.get("backoff", {})
    annotations = row.doc["metadata"].get("annotations") or {}
    lines = [
        f"Policy:       {ref_text(row)}",
        f"Spec:         rollbackTarget {spec.get('rollbackTarget')}, monitoringPeriod"
        f" {spec.get('monitoringPeriod')}, adoptionThresholdPercent"
        f" {spec.get('adoptionThresholdPercent')}, weight {spec.get('weight', 0)}",
        f"Backoff:      timePeriod {backoff.get('timePeriod')} x multiplyByTurn"
        f" {backoff.get('multiplyByTurn')} x turn, maxAttempts {backoff.get('maxAttempts')}",
    ]
    observe = [f"{k}: {v}" for k, v in annotations.items() if k.endswith("/observe-only")]
    if observe:
        lines.append(f"Annotations:  {', '.join(observe)}")
    if status is None:
        lines.append("Status:       not written yet (is the intake running?)")
    else:
        lines += [
            f"Generation:   observed {status.observed_generation},"
            f" current {row.doc['metadata'].get('generation')}",
            f"Active:       {status.active_tracked_workloads}",
            f"Failed:       {status.failed_workloads}",
            f"Last error:   {status.last_error_summary or '-'}",
            "Conditions:",
            *(
                f"  {c.type}={c.status} ({c.reason}) since {c.last_transition_time.isoformat()}:"
                f" {c.message}"
                for c in status.conditions
            ),
        ]
    lines.append("Tracked workloads:" if tracked else "Tracked workloads: none")
    lines += [f"  {r.namespace}/{r.workload}  {r.mode} turn {r.turn}" for r in tracked]
    return "\n".join(lines)
