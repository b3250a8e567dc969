"""The scenario expectation language: what a story must end with, per owner.

Checked by ``check`` against facts the scenario runner reads off the cluster (``Facts``), so the
language is tested without a cluster (``tests/unit/test_expect.py``)::

    expect:
      shop/Deployment/api:
        mode: failedPermanent                 # null: no rollback state at all
        turn: 2
        failureReason: [oomKilled, crashLoopBackOff]   # one value, or alternatives
        modes: [monitoring, rollingBack, backingOff, failedPermanent]  # null: state cleared
        policy: {kind: RollbackPolicy, namespace: shop, name: p}       # or just the name
        fingerprint: 1f0f06687fee0df3
        lastSuccessful: {app: {requests: {memory: 768Mi}}}
        annotations: {absent: [rollbackpolicy.rightsizing.kubex.ai/desired-resource-requests]}
        events: [{reason: RollbackRollingBackStarted, count: 2, message: OOMKilled}]
        pods: [{container: app, requests: {memory: 768Mi}, count: 3}]  # count: how many pods
        memory: {app: 768Mi}                  # shorthand: every pod's memory request
        timing: [{from: backingOff, to: backedOff, turn: 1, lasts: 1, tolerance: 1}]  # seconds
        stillFor: 3                           # no transition in the last 3 s
        maxUnavailable: 1                     # pods not Ready at once, from rollingBack on
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from workflows.contract import EventReason, FailureReason, Mode, Obj


class Model(BaseModel):
    # A field's docstring is its description in the JSON Schema and the reference page.
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_attribute_docstrings=True,
    )


class PolicyExpect(Model):
    """The policy the rollback state names."""

    kind: str | None = None
    """RollbackPolicy or ClusterRollbackPolicy; none: either."""
    namespace: str | None = None
    """Its namespace (a RollbackPolicy's)."""
    name: str
    """Its name."""


class EventExpect(Model):
    """Events of one reason on the owner."""

    reason: EventReason
    """The Event's reason."""
    count: int | None = Field(default=None, ge=0)
    """Exactly this many (0: none); none: at least one."""
    message: str | None = None
    """A substring of every counted Event's message."""


class AnnotationsExpect(Model):
    """Annotation keys on the owner at the end."""

    present: list[str] = Field(default_factory=list)
    """Keys that must be there."""
    absent: list[str] = Field(default_factory=list)
    """Keys that must not."""


class PodsExpect(Model):
    """Pods whose container ``container`` runs with these resources (as reported)."""

    container: str
    """The container."""
    requests: dict[str, str] = Field(default_factory=dict)
    """Resource -> quantity its requests must equal."""
    limits: dict[str, str] = Field(default_factory=dict)
    """Resource -> quantity its limits must equal."""
    count: int | None = Field(default=None, ge=0)
    """Exactly this many pods; none: every pod."""


class TimingExpect(Model):
    """How long the owner stayed in ``from`` (of ``turn``) before ``to``: ``lasts`` ±
    ``tolerance`` seconds, e.g. the backoff of turn 2 lasts 4 s ± 1 s."""

    from_: Mode = Field(alias="from")
    """The mode it stayed in."""
    to: Mode | None = None
    """The mode it left for; none: whatever came next."""
    turn: int | None = None
    """Of this turn; none: the first time it was in ``from``."""
    lasts: float = Field(ge=0)
    """Seconds it stayed."""
    tolerance: float = Field(default=1.0, ge=0)
    """Seconds either way."""


class Expectation(Model):
    """What must be true of one owner at the end of the story."""

    mode: Mode | None = None
    """Its rollback state's mode; null: no rollback state at all (retained, or cleared)."""
    turn: int | None = None
    """The state's turn."""
    failure_reason: FailureReason | list[FailureReason] | None = None
    """The state's failure reason, or one of these."""
    modes: list[Mode | None] | None = None
    """Every transition, in order, exactly (null where the state was cleared)."""
    memory: dict[str, str] | None = None
    """Container -> the memory request every pod ends with."""
    policy: str | PolicyExpect | None = None
    """The policy the state names: its name, or its fields."""
    fingerprint: str | None = None
    """The recommendation's fingerprint in the state."""
    last_successful: dict[str, Any] | None = None
    """Container -> ``{requests, limits}`` recorded as the last successful state."""
    annotations: AnnotationsExpect | None = None
    """Annotation keys present and absent on the owner."""
    events: list[EventExpect] = Field(default_factory=list)
    """Events on the owner, by reason."""
    pods: list[PodsExpect] = Field(default_factory=list)
    """Pods by the resources their containers run with."""
    timing: list[TimingExpect] = Field(default_factory=list)
    """How long it stayed in a mode."""
    still_for: float | None = Field(default=None, ge=0)
    """No transition in the last this many seconds: the story holds still that long before it
    can pass ("nothing further happens"), whatever the scenario's settle."""
    max_unavailable: int | None = Field(default=None, ge=0)
    """The most pods not Ready at once, from the first rollingBack on: a rollback in place that
    restarts containers is paced by the workload's maxUnavailable."""


@dataclass
class Facts:
    """What the cluster shows of one owner at the end of a story."""

    state: Obj | None
    modes: list[str | None]  # every transition recorded, None where the state was cleared
    annotations: dict[str, str] = field(default_factory=dict)
    events: list[Obj] = field(default_factory=list)  # {reason, message}
    pods: dict[str, Obj] = field(default_factory=dict)  # pod -> container -> resources
    transitions: list[Obj] = field(default_factory=list)  # {t, mode, turn}, t in seconds
    not_ready: list[tuple[float, int]] = field(default_factory=list)  # (t, pods not Ready)
    now: float = 0.0  # seconds since the story started


def check(ref: str, want: Expectation, facts: Facts) -> list[str]:
    """Every way ``facts`` miss ``want``, one line each (empty: met)."""
    state = facts.state or {}
    mode = state.get("mode") if facts.state else None
    if mode != want.mode:
        return [f"{ref}: mode {mode}, expected {want.mode}"]
    found: list[str] = []

    def differs(name: str, have: Any, expected: Any) -> None:
        if expected is not None and have != expected:
            found.append(f"{ref}: {name} {have}, expected {expected}")

    differs("turn", state.get("turn"), want.turn)
    if want.failure_reason is not None:
        allowed = (
            [want.failure_reason] if isinstance(want.failure_reason, str) else want.failure_reason
        )
        if state.get("failureReason") not in allowed:
            found.append(
                f"{ref}: failureReason {state.get('failureReason')}, expected one of {allowed}"
            )
    differs("transitions", facts.modes, want.modes)
    differs("fingerprint", state.get("activeRecommendationFingerprint"), want.fingerprint)
    if want.policy is not None:
        expected = (
            want.policy if isinstance(want.policy, PolicyExpect) else PolicyExpect(name=want.policy)
        )
        have = state.get("policy") or {}
        for key in ("kind", "namespace", "name"):
            if getattr(expected, key) is not None and have.get(key) != getattr(expected, key):
                found.append(
                    f"{ref}: policy {have}, expected {expected.model_dump(exclude_none=True)}"
                )
                break
    if want.last_successful is not None:
        have_ls = (state.get("lastSuccessfulState") or {}).get("containers")
        differs("lastSuccessfulState", have_ls, want.last_successful)
    if want.annotations is not None:
        for key in want.annotations.present:
            if key not in facts.annotations:
                found.append(f"{ref}: annotation {key} absent, expected present")
        for key in want.annotations.absent:
            if key in facts.annotations:
                found.append(f"{ref}: annotation {key} present, expected absent")
    found += _events(ref, want, facts) + _pods(ref, want, facts)
    for timing in want.timing:
        found += _timing(ref, timing, facts.transitions)
    if want.max_unavailable is not None:
        since = next((t["t"] for t in facts.transitions if t["mode"] == "rollingBack"), None)
        if since is None:
            found.append(f"{ref}: never rolled back, no rollback to measure maxUnavailable on")
        else:
            at_start = [n for t, n in facts.not_ready if t < since][-1:]  # as it began
            most = max(at_start + [n for t, n in facts.not_ready if t >= since], default=0)
            if most > want.max_unavailable:
                found.append(
                    f"{ref}: {most} pods not Ready at once after rollingBack, expected at most"
                    f" {want.max_unavailable}"
                )
    if want.still_for is not None:
        last = max((t["t"] for t in facts.transitions), default=0.0)
        if facts.now - last < want.still_for:
            found.append(
                f"{ref}: a transition {facts.now - last:.1f}s ago, expected none for"
                f" {want.still_for:g}s"
            )
    if want.memory is not None:
        for pod, containers in facts.pods.items():
            for container, memory in want.memory.items():
                have = (containers.get(container) or {}).get("requests", {}).get("memory")
                if have != memory:
                    found.append(f"{ref}: pod {pod} {container} memory {have}, expected {memory}")
    return found


def _fits(resources: Obj, want: PodsExpect) -> bool:
    for kind, values in (("requests", want.requests), ("limits", want.limits)):
        have = resources.get(kind) or {}
        if any(have.get(name) != value for name, value in values.items()):
            return False
    return True


def _events(ref: str, want: Expectation, facts: Facts) -> list[str]:
    found: list[str] = []
    for event in want.events:
        matching = [e for e in facts.events if e.get("reason") == event.reason]
        count = len(matching)
        if (event.count is None and count == 0) or (
            event.count is not None and count != event.count
        ):
            wanted = "at least 1" if event.count is None else str(event.count)
            found.append(f"{ref}: {count} {event.reason} Event(s), expected {wanted}")
        elif event.message is not None:
            for e in matching:
                if event.message not in (e.get("message") or ""):
                    found.append(
                        f"{ref}: {event.reason} Event {e.get('message')!r} lacks {event.message!r}"
                    )
    return found


def _pods(ref: str, want: Expectation, facts: Facts) -> list[str]:
    found: list[str] = []
    for pods in want.pods:
        fitting = [
            name
            for name, containers in facts.pods.items()
            if _fits(containers.get(pods.container) or {}, pods)
        ]
        expected_count = len(facts.pods) if pods.count is None else pods.count
        if len(fitting) != expected_count or (pods.count is None and not facts.pods):
            what = {k: v for k, v in (("requests", pods.requests), ("limits", pods.limits)) if v}
            found.append(
                f"{ref}: {len(fitting)} of {len(facts.pods)} pods run {pods.container} with {what},"
                f" expected {'all' if pods.count is None else pods.count}"
            )
    return found


def _timing(ref: str, want: TimingExpect, transitions: list[Obj]) -> list[str]:
    span = f"{want.from_}{f' (turn {want.turn})' if want.turn else ''} -> {want.to or 'next'}"
    for i, entry in enumerate(transitions):
        if entry["mode"] != want.from_ or (want.turn is not None and entry["turn"] != want.turn):
            continue
        later = [t for t in transitions[i + 1 :] if want.to is None or t["mode"] == want.to]
        if not later:
            break
        lasted = later[0]["t"] - entry["t"]
        if abs(lasted - want.lasts) > want.tolerance:
            expected = f"{want.lasts:g}s ± {want.tolerance:g}s"
            return [f"{ref}: {span} lasted {lasted:.2f}s, expected {expected}"]
        return []
    return [f"{ref}: no {span} in the timeline"]
