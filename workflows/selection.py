"""Which policy, if any, applies to a workload, and why.

Precedence (docs/concepts/policies.md, "Which policy applies"): a namespaced ``RollbackPolicy`` in
the workload's
namespace beats any ``ClusterRollbackPolicy`` (the team that owns the namespace decides). Among
policies of one kind, the higher ``weight`` wins, then the older ``creationTimestamp``, then the
name (a stable tie-break when timestamps are missing or equal). No match: the workload is
retained, nothing is monitored.

Protected namespaces (``Protection``, Kubex's ``protectedNamespacePatterns``, default ``kube-*``,
``openshift-*``, ``gmp-*``) come before all of it: no policy applies there, however broad its
selector, and every candidate says so.

``resolve`` returns the winner together with every candidate and the reason it matched, lost or
did not match, which ``rollbackctl policy explain`` prints as is.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from workflows.contract import DEFAULT_PROTECTED_NAMESPACES, WorkloadKind
from workflows.policy import (
    NAMESPACE_PATTERN,
    AnyPolicy,
    ClusterRollbackPolicy,
    RollbackPolicy,
    glob_match,
)
from workflows.state import PolicyRef


@dataclass(frozen=True)
class Protection:
    """Namespaces no policy applies in, as Kubex's ``protectedNamespacePatterns``: names or
    patterns where ``*`` matches any run of characters. ``Protection(())`` protects none."""

    patterns: tuple[str, ...] = DEFAULT_PROTECTED_NAMESPACES

    @classmethod
    def parse(cls, text: str) -> Protection:
        """``kube-*,openshift-*`` (comma-separated; empty: none), each checked as a pattern."""
        patterns = tuple(p.strip() for p in text.split(",") if p.strip())
        for p in patterns:
            if len(p) > 63 or not re.fullmatch(NAMESPACE_PATTERN, p):
                raise ValueError(
                    f"{p!r} is not a namespace name or pattern (lower-case letters, digits,"
                    " '-' and '*', at most 63 characters)"
                )
        return cls(patterns)

    def pattern_for(self, namespace: str) -> str | None:
        """The first pattern that protects ``namespace``, or None."""
        return next((p for p in self.patterns if glob_match(p, namespace)), None)

    def reason(self, namespace: str) -> str | None:
        pattern = self.pattern_for(namespace)
        if pattern is None:
            return None
        return f"namespace {namespace!r} is protected ({pattern}): no policy applies there"


PROTECTED = Protection()


@dataclass(frozen=True)
class WorkloadRef:
    """The owner a policy is matched against: its kind, namespace, name and labels."""

    kind: WorkloadKind
    namespace: str
    name: str
    labels: dict[str, str]

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.kind}/{self.name}"

    @classmethod
    def from_manifest(cls, manifest: dict[str, Any], namespace: str | None = None) -> WorkloadRef:
        """Read kind, namespace (``default`` when unset, as kubectl does) and labels."""
        if not isinstance(manifest, dict):
            raise ValueError("a workload manifest must be a mapping")
        try:
            kind = WorkloadKind(str(manifest.get("kind")))
        except ValueError:
            known = ", ".join(k.value for k in WorkloadKind)
            raise ValueError(
                f"kind {manifest.get('kind')!r} is not a workload kind ({known})"
            ) from None
        meta = manifest.get("metadata") or {}
        if not isinstance(meta, dict) or not meta.get("name"):
            raise ValueError("metadata.name is required")
        labels = meta.get("labels") or {}
        if not isinstance(labels, dict):
            raise ValueError("metadata.labels must be a mapping")
        return cls(
            kind=kind,
            namespace=namespace or meta.get("namespace") or "default",
            name=str(meta["name"]),
            labels={str(k): str(v) for k, v in labels.items()},
        )


def mismatch(policy: AnyPolicy, workload: WorkloadRef) -> str | None:
    """Why ``policy`` does not select ``workload``, or ``None`` when it does."""
    scope = policy.spec.scope
    if isinstance(policy, RollbackPolicy):
        policy_ns = policy.metadata.namespace or "default"
        if policy_ns != workload.namespace:
            return f"namespaced to {policy_ns!r}, workload is in {workload.namespace!r}"
    else:
        selector = policy.spec.scope.namespace_selector
        if selector is not None and not selector.matches(workload.namespace):
            patterns = ", ".join(selector.values)
            return f"namespace {workload.namespace!r} is not {selector.operator} [{patterns}]"
    if workload.kind not in scope.workload_types:
        kinds = ", ".join(scope.workload_types)
        return f"workload type {workload.kind} not in workloadTypes [{kinds}]"
    if scope.label_selector is not None:
        unmet = scope.label_selector.unmet(workload.labels)
        if unmet:
            return "labelSelector not satisfied: " + "; ".join(unmet)
    return None


def precedence_key(policy: AnyPolicy) -> tuple[int, int, float, str]:
    """Sort key: smallest wins. Namespaced first, then higher weight, older, name."""
    created = policy.metadata.creation_timestamp
    age_key = created.timestamp() if created is not None else float("inf")
    kind_rank = 0 if isinstance(policy, RollbackPolicy) else 1
    return (kind_rank, -policy.spec.weight, age_key, policy.metadata.name)


def _lost_because(loser: AnyPolicy, winner: AnyPolicy) -> str:
    winner_id = PolicyRef.of(winner)
    if isinstance(winner, RollbackPolicy) and isinstance(loser, ClusterRollbackPolicy):
        return f"matches, but namespaced {winner_id} takes precedence over cluster policies"
    if loser.spec.weight != winner.spec.weight:
        return f"matches, but weight {loser.spec.weight} < {winner.spec.weight} of {winner_id}"
    lc, wc = loser.metadata.creation_timestamp, winner.metadata.creation_timestamp
    if lc != wc:
        return (
            f"matches with equal weight {loser.spec.weight}, but {winner_id} is older"
            f" ({wc.isoformat() if wc else 'unknown'} vs {lc.isoformat() if lc else 'unknown'})"
        )
    return f"matches with equal weight and age, but {winner_id} sorts first by name"


@dataclass(frozen=True)
class Candidate:
    policy: AnyPolicy
    matched: bool
    reason: str


@dataclass(frozen=True)
class Resolution:
    policy: AnyPolicy | None
    candidates: list[Candidate]
    protected: str | None = None  # why none applies: the workload's namespace is protected


def resolve(
    policies: Iterable[AnyPolicy], workload: WorkloadRef, protection: Protection = PROTECTED
) -> Resolution:
    """The winning policy for ``workload`` (or ``None``: retain) and every candidate's story."""
    ordered = sorted(policies, key=precedence_key)
    protected = protection.reason(workload.namespace)
    if protected is not None:
        return Resolution(None, [Candidate(p, False, protected) for p in ordered], protected)
    reasons = {id(p): mismatch(p, workload) for p in ordered}
    winner = next((p for p in ordered if reasons[id(p)] is None), None)
    candidates = []
    for p in ordered:
        reason = reasons[id(p)]
        if reason is not None:
            candidates.append(Candidate(p, matched=False, reason=reason))
        elif p is winner:
            candidates.append(Candidate(p, matched=True, reason="selected: highest precedence"))
        else:
            assert winner is not None
            candidates.append(Candidate(p, matched=True, reason=_lost_because(p, winner)))
    return Resolution(policy=winner, candidates=candidates)


class PolicyIndex:
    """Policies by namespace, so resolving a workload never scans every policy.

    A workload in namespace ``ns`` is matched against the namespaced policies of ``ns`` and the
    cluster policies whose namespace selector admits ``ns`` (cached per namespace, recomputed
    when a cluster policy changes). Upserts and removals come from the intake's watches.
    """

    def __init__(self, protection: Protection = PROTECTED) -> None:
        self.protection = protection
        self._namespaced: dict[str, dict[str, RollbackPolicy]] = {}
        self._cluster: dict[str, ClusterRollbackPolicy] = {}
        self._cluster_for: dict[str, list[ClusterRollbackPolicy]] = {}
        # The winner per workload and labels, until a policy changes: every pod event of a
        # workload asks (``policy_of``), policies change rarely.
        self._won: dict[tuple[str, frozenset[tuple[str, str]]], AnyPolicy | None] = {}

    def __len__(self) -> int:
        return len(self._cluster) + sum(len(p) for p in self._namespaced.values())

    def all(self) -> list[AnyPolicy]:
        """Every policy it holds, cluster policies first."""
        return [
            *self._cluster.values(),
            *(p for ns in self._namespaced.values() for p in ns.values()),
        ]

    def told(self) -> list[AnyPolicy]:
        """The policies the engine tells of what it does cluster-wide (an Event on each): all
        but those in a protected namespace, where it writes nothing but their status (which
        says the namespace is protected)."""
        protected = self.protection.pattern_for
        return [
            p for p in self.all() if not (p.metadata.namespace and protected(p.metadata.namespace))
        ]

    def upsert(self, policy: AnyPolicy) -> None:
        self._won.clear()
        if isinstance(policy, RollbackPolicy):
            namespace = policy.metadata.namespace or "default"
            self._namespaced.setdefault(namespace, {})[policy.metadata.name] = policy
        else:
            self._cluster[policy.metadata.name] = policy
            self._cluster_for.clear()

    def remove(self, kind: str, namespace: str | None, name: str) -> None:
        self._won.clear()
        if kind == "RollbackPolicy":
            self._namespaced.get(namespace or "default", {}).pop(name, None)
        elif self._cluster.pop(name, None) is not None:
            self._cluster_for.clear()

    def forget_namespace(self, namespace: str) -> None:
        self._won.clear()
        self._namespaced.pop(namespace, None)
        self._cluster_for.pop(namespace, None)

    def candidates(self, namespace: str) -> list[AnyPolicy]:
        if namespace not in self._cluster_for:
            self._cluster_for[namespace] = [
                p
                for p in self._cluster.values()
                if p.spec.scope.namespace_selector is None
                or p.spec.scope.namespace_selector.matches(namespace)
            ]
        namespaced: list[AnyPolicy] = list(self._namespaced.get(namespace, {}).values())
        return namespaced + list(self._cluster_for[namespace])

    def resolve(self, workload: WorkloadRef) -> Resolution:
        return resolve(self.candidates(workload.namespace), workload, self.protection)

    def policy_of(self, workload: WorkloadRef) -> AnyPolicy | None:
        """The policy that applies to ``workload`` (``resolve``'s winner), remembered until a
        policy or a namespace changes."""
        key = (workload.key, frozenset(workload.labels.items()))
        if key not in self._won:
            self._won[key] = self.resolve(workload).policy
        return self._won[key]
