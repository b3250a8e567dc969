"""Operations against Temporal for ``rollbackctl get|describe|cancel|reopen``.

One Temporal may serve a fleet (docs/operating/fleet.md): a workload is named
``[CLUSTER/]NAMESPACE/KIND/NAME``, and without a cluster the one that has runs of it is found
(``locate``); two that both have it are named in the error. ``get`` lists the newest run of
every owner's workflow in every cluster (or one) through the search attributes the workflow
upserts; ``describe`` asks a run for its ``status`` (queries work on closed runs too,
a worker replays them); ``cancel`` signals a running workflow; ``reopen`` signal-with-starts,
so it also reopens an owner whose run has ended.

The workflow samples the cohort only when the window ends, so ``describe`` reads the live cohort
itself when it can reach the cluster (``live_cohort``: one owner GET and one pod LIST, judged by
the same code as the final sample).
"""

from __future__ import annotations

import asyncio
import difflib
from collections import Counter
from collections.abc import Awaitable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes.client import ApiClient, CoreV1Api, CustomObjectsApi
from kubernetes.client.exceptions import ApiException
from temporalio.client import (
    Client,
    WorkflowExecution,
    WorkflowExecutionStatus,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.converter import decode_search_attributes
from temporalio.service import RPCError, RPCStatusCode

from activities.cohort import actual_resources
from activities.kubernetes import KubernetesActivities, cohort_sample
from activities.owners import OWNER_KINDS, desired_replicas, manifest_resources
from worker import temporal as control
from workflows.activity_api import (
    CohortSample,
    OwnerRef,
    SampleCohortInput,
    parse_rollback_id,
    rollback_id,
)
from workflows.contract import Mode, Obj, SearchAttribute, WorkloadKind, check_cluster
from workflows.machine import RollbackState, release_wait
from workflows.pause import Pause
from workflows.rollback import WORKFLOW_NAME
from workflows.state import HISTORY_LIMIT, ResourceSnapshot

READ_BACK_SECONDS = 10.0
ANSWER = timedelta(seconds=30)  # how long a control waits for a worker to answer its Update


class OpsError(Exception):
    """A user-facing failure: printed as one line, exit status 1."""


class NoAttemptError(OpsError):
    """Temporal has no attempt of the workload (``presence`` tells whether the cluster has it)."""


def presence(kube: ApiClient, owner: OwnerRef) -> str:
    """Whether the cluster has ``owner``: a misspelt name and a workload never resized read the
    same to Temporal. Names the nearest one in its namespace when it is not there."""
    kind = OWNER_KINDS[owner.kind]
    api = CustomObjectsApi(kube)
    coordinates = (kind.group, kind.version, owner.namespace, kind.plural)
    try:
        api.get_namespaced_custom_object(*coordinates, owner.name)
    except ApiException as exc:
        if exc.status != 404:
            raise
    else:
        return (
            f"{owner} exists in the cluster: no recommendation reached it yet, or no policy"
            " matches it (`rollbackctl describe rbp -n NAMESPACE` shows what each matches)"
        )
    listed: Any = api.list_namespaced_custom_object(*coordinates)
    names = [item["metadata"]["name"] for item in listed.get("items") or []]
    near = difflib.get_close_matches(owner.name, names, n=1)
    hint = f": did you mean {owner.namespace}/{owner.kind}/{near[0]}?" if near else ""
    return f"no {owner.kind} {owner.name} in namespace {owner.namespace} of the cluster{hint}"


# kubectl's short names of the kinds (``kubectl api-resources``), and Argo Rollouts' ``ro``.
SHORT_NAMES = {
    "deploy": WorkloadKind.DEPLOYMENT,
    "sts": WorkloadKind.STATEFUL_SET,
    "ds": WorkloadKind.DAEMON_SET,
    "cj": WorkloadKind.CRON_JOB,
    "ro": WorkloadKind.ROLLOUT,
}
# Every way a kind is written, as kubectl takes it: its name in any case, its plural, its
# short name.
KIND_NAMES = (
    {k.value.lower(): k for k in WorkloadKind}
    | {OWNER_KINDS[k].plural: k for k in WorkloadKind}
    | SHORT_NAMES
)


def kind_of(text: str) -> WorkloadKind:
    """``Deployment``, ``deployment``, ``deployments`` or ``deploy``, as kubectl reads them."""
    found = KIND_NAMES.get(text.lower())
    if found is None:
        kinds = ", ".join(k.value for k in WorkloadKind)
        raise OpsError(
            f"unknown kind {text!r}: one of {kinds} (any case, or plural),"
            f" or a short name: {', '.join(SHORT_NAMES)}"
        )
    return found


def parse_owner(text: str, cluster: str | None = None) -> tuple[str | None, OwnerRef]:
    """``[CLUSTER/]NAMESPACE/KIND/NAME`` (the kind as in the workflow ID, e.g.
    ``eu-west/shop/Deployment/api``, or as kubectl takes it: ``shop/deploy/api``) and
    ``cluster`` (``--cluster``): (the cluster, if named, the owner)."""
    parts = text.split("/")
    if len(parts) not in (3, 4) or not all(parts):
        raise OpsError(f"expected [CLUSTER/]NAMESPACE/KIND/NAME, got {text!r}")
    if len(parts) == 4:
        named = parts.pop(0)
        if cluster is not None and named != cluster:
            raise OpsError(f"{text} names cluster {named}, --cluster says {cluster}")
        cluster = named
    if cluster is not None:
        try:
            check_cluster(cluster)
        except ValueError as exc:
            raise OpsError(str(exc)) from None
    return cluster, OwnerRef(namespace=parts[0], kind=kind_of(parts[1]), name=parts[2])


async def locate(client: Client, cluster: str | None, owner: OwnerRef) -> str:
    """The cluster of ``owner``: as named, else the one cluster with runs of it."""
    if cluster is not None:
        return cluster
    query = list_query(owner.namespace) + (
        f" AND {SearchAttribute.WORKLOAD} = {control.quote(owner.workload)}"
    )
    found: list[str] = sorted({r.cluster async for r in _rows(client, query)})
    if len(found) == 1:
        return found[0]
    if not found:
        raise NoAttemptError(
            f"no rollback attempt recorded for {owner} in any cluster"
            " (`rollbackctl get` lists the workloads that have one)"
        )
    raise OpsError(
        f"{owner} has attempts in clusters {', '.join(found)}: name one"
        f" ({found[0]}/{owner} or --cluster {found[0]})"
    )


def list_query(
    namespace: str | None = None,
    mode: str | None = None,
    policy: str | None = None,
    cluster: str | None = None,
) -> str:
    clauses = [f"WorkflowType = {control.quote(WORKFLOW_NAME)}"]
    for attribute, value in (
        (SearchAttribute.CLUSTER, cluster),
        (SearchAttribute.NAMESPACE, namespace),
        (SearchAttribute.MODE, mode),
        (SearchAttribute.POLICY, policy),
    ):
        if value:
            clauses.append(f"{attribute} = {control.quote(value)}")
    return " AND ".join(clauses)


@dataclass
class Row:
    workflow_id: str
    cluster: str
    namespace: str
    workload: str
    mode: str
    turn: int | None
    policy: str
    fingerprint: str
    status: str  # the run's status, ``Held`` for a running one a pause holds
    started: datetime
    held: str = ""  # what a pause holds and why (``RollbackHeld``), while it does

    @property
    def resource_name(self) -> str:
        """As ``kubectl get -o name`` names the workload: ``deployment.apps/api``."""
        kind, name = self.workload.split("/", 1)
        where = OWNER_KINDS[WorkloadKind(kind)]
        return f"{kind.lower()}.{where.group}/{name}" if where.group else f"{kind.lower()}/{name}"

    def as_json(self) -> dict[str, Any]:
        return {
            "workflowId": self.workflow_id,
            "cluster": self.cluster,
            "namespace": self.namespace,
            "workload": self.workload,
            "mode": self.mode,
            "turn": self.turn,
            "policy": self.policy,
            "fingerprint": self.fingerprint,
            "status": self.status,
            "started": self.started.isoformat(),
            "held": self.held or None,
        }


def _row(wf: WorkflowExecution) -> Row:
    attrs: dict[str, Any] = {pair.key.name: pair.value for pair in wf.typed_search_attributes}
    status = wf.status.name.title() if wf.status else "Unknown"
    held = str(attrs.get(SearchAttribute.HELD) or "")
    if held and wf.status is WorkflowExecutionStatus.RUNNING:
        status = "Held"
    parsed = parse_rollback_id(wf.id)
    return Row(
        workflow_id=wf.id,
        # "" for a 0.1 run (no cluster segment in its ID): shown as such, drained on upgrade
        cluster=str(attrs.get(SearchAttribute.CLUSTER, parsed[0] if parsed else "")),
        namespace=str(attrs.get(SearchAttribute.NAMESPACE, "")),
        workload=str(attrs.get(SearchAttribute.WORKLOAD, "")),
        mode=str(attrs.get(SearchAttribute.MODE, "")),
        turn=attrs.get(SearchAttribute.TURN),
        policy=str(attrs.get(SearchAttribute.POLICY, "")),
        fingerprint=str(attrs.get(SearchAttribute.FINGERPRINT, "")),
        status=status,
        started=wf.start_time,
        held=held,
    )


async def _rows(client: Client, query: str) -> Any:
    async for wf in client.list_workflows(query):
        yield _row(wf)


async def get(
    client: Client,
    namespace: str | None = None,
    mode: str | None = None,
    policy: str | None = None,
    cluster: str | None = None,
    held: bool = False,
) -> list[Row]:
    """The newest run of each owner in each cluster (or ``cluster``'s only); ``mode`` filters
    on that run's mode, ``policy`` on runs under that policy (``RollbackPolicy/ns/name``),
    ``held`` on running attempts a pause holds."""
    newest: dict[str, WorkflowExecution] = {}
    async for wf in client.list_workflows(list_query(namespace, policy=policy, cluster=cluster)):
        if wf.id not in newest or wf.start_time > newest[wf.id].start_time:
            newest[wf.id] = wf
    rows = [_row(wf) for wf in newest.values()]
    if mode:
        rows = [r for r in rows if r.mode == mode]
    if held:
        rows = [r for r in rows if r.status == "Held"]
    return sorted(rows, key=lambda r: (r.cluster, r.namespace, r.workload))


def owners_listed(
    api: ApiClient, namespace: str | None, selector: str | None = None
) -> Iterator[tuple[WorkloadKind, Obj]]:
    """Every workload of the nine kinds in ``namespace`` (or the cluster) that ``selector``
    selects (None: all), as the API server lists them: one LIST per kind it serves."""
    custom = CustomObjectsApi(api)
    query: dict[str, Any] = {} if selector is None else {"label_selector": selector}
    for kind, where in OWNER_KINDS.items():
        coordinates = (where.group, where.version)
        listed: Any
        try:
            if namespace:
                listed = custom.list_namespaced_custom_object(
                    *coordinates, namespace, where.plural, **query
                )
            else:
                listed = custom.list_cluster_custom_object(*coordinates, where.plural, **query)
        except ApiException as exc:
            if exc.status == 404:
                continue  # a kind the cluster does not serve: none of it
            raise
        for obj in listed.get("items") or []:
            yield kind, obj


def labelled(api: ApiClient, namespace: str | None, selector: str) -> set[tuple[str, str]]:
    """The workloads (namespace, ``Kind/name``) whose labels ``selector`` selects."""
    return {
        (obj["metadata"]["namespace"], f"{kind.value}/{obj['metadata']['name']}")
        for kind, obj in owners_listed(api, namespace, selector)
    }


async def describe(
    client: Client, cluster: str, owner: OwnerRef
) -> tuple[str, RollbackState | None, Pause | None]:
    """The newest run's status and state, and the pause it is held by, if any."""
    try:
        status, state = await control.newest_run(client, cluster, owner)
    except RPCError as exc:
        if exc.status is RPCStatusCode.NOT_FOUND:
            raise NoAttemptError(
                f"no rollback attempt recorded for {owner} in cluster {cluster}"
                " (`rollbackctl get` lists the workloads that have one)"
            ) from None
        raise OpsError(f"{rollback_id(cluster, owner)}: {exc.message}") from exc
    running = status is WorkflowExecutionStatus.RUNNING
    pause = await control.held(client, cluster, owner) if running else None
    return (status.name.title() if status else "Unknown"), state, pause


async def cancel(client: Client, cluster: str, owner: OwnerRef, reason: str) -> RollbackState:
    """Cancel the running attempt: the state it was taken in, or an error saying why not."""
    sent = control.cancel(client, cluster, owner, reason, rpc_timeout=ANSWER)
    return await _control(cluster, owner, "cancel", sent)


async def reopen(client: Client, cluster: str, task_queue: str, owner: OwnerRef) -> RollbackState:
    """Reopen monitoring and read the state back: the new window, or an error saying why
    nothing happened."""
    workflow_id = rollback_id(cluster, owner)
    sent = control.reopen(client, cluster, task_queue, owner, rpc_timeout=ANSWER)
    state = await _control(cluster, owner, "reopen", sent)
    deadline = asyncio.get_running_loop().time() + READ_BACK_SECONDS
    while asyncio.get_running_loop().time() < deadline:
        _, now, _ = await describe(client, cluster, owner)
        opened = now.window_started_at if now is not None else None
        if now is not None and opened is not None and opened != state.window_started_at:
            return now
        await asyncio.sleep(0.2)
    raise OpsError(
        f"reopen sent to {workflow_id}, but no new window opened within"
        f" {READ_BACK_SECONDS:.0f}s: is a worker polling the task queue {task_queue}?"
    )


async def _control(
    cluster: str, owner: OwnerRef, what: str, sent: Awaitable[RollbackState]
) -> RollbackState:
    """A control's answer from the workflow, its refusal and a worker that did not answer in
    ``ANSWER`` as ``OpsError``."""
    workflow_id = rollback_id(cluster, owner)
    try:
        return await sent
    except (control.ControlRefusedError, TimeoutError) as exc:
        raise OpsError(str(exc)) from None
    except WorkflowUpdateRPCTimeoutOrCancelledError:
        raise OpsError(
            f"{workflow_id}: no worker answered the {what} within"
            f" {ANSWER.total_seconds():.0f}s (is one polling the cluster's task queue?); it may"
            " still be taken once one does: `rollbackctl describe` shows"
        ) from None
    except RPCError as exc:
        raise OpsError(f"{workflow_id}: {exc.message}") from exc


async def unnamed_running(client: Client) -> list[Row]:
    """The running attempts started before clusters had names (0.1: an ID without a cluster),
    which a 1.0 worker refuses to act for: an upgrade waits until there are none
    (docs/operating/upgrade.md, "From 0.1 to 1.0")."""
    query = f"{list_query()} AND ExecutionStatus = 'Running'"
    rows = [r async for r in _rows(client, query) if not r.cluster]
    return sorted(rows, key=lambda r: r.workflow_id)


async def tracked(client: Client, policy: str, cluster: str | None = None) -> list[Row]:
    """The workloads whose current attempt runs under ``policy`` (``RollbackPolicy/ns/name``)
    in ``cluster`` (a policy lives in one cluster; None: every cluster's of that name):
    running, or ended ``failedPermanent`` with no newer run under another policy."""
    rows = [r for r in await get(client, policy=policy, cluster=cluster) if r.status == "Running"]
    for r in await get(client, mode=Mode.FAILED_PERMANENT, policy=policy, cluster=cluster):
        latest = await client.get_workflow_handle(r.workflow_id).describe()
        if latest.start_time == r.started:
            rows.append(r)
    return sorted(rows, key=lambda r: (r.cluster, r.namespace, r.workload))


async def recorded_transitions(
    client: Client, cluster: str, owner: OwnerRef
) -> tuple[list[tuple[datetime, str, int]], list[tuple[datetime, str]]]:
    """Every transition the owner's workflow recorded, from the histories of all its runs (the
    search attributes each run starts with and each transition upserts, with the event's time;
    a run continued as new starts showing what the last one did, counted once), and the
    activity attempts that failed, with what failed."""
    transitions: list[tuple[datetime, str, int]] = []
    failures: list[tuple[datetime, str]] = []
    workflow_id = rollback_id(cluster, owner)
    async for run in client.list_workflows(f"WorkflowId = {control.quote(workflow_id)}"):
        handle = client.get_workflow_handle(workflow_id, run_id=run.run_id)
        turn = 0  # an upsert carries what changed only: the turn shown stays until it does
        async for event in handle.fetch_history_events():
            at = event.event_time.ToDatetime(tzinfo=UTC)
            if event.HasField("workflow_execution_started_event_attributes"):
                shown = event.workflow_execution_started_event_attributes.search_attributes
            elif event.HasField("upsert_workflow_search_attributes_event_attributes"):
                shown = event.upsert_workflow_search_attributes_event_attributes.search_attributes
            else:
                if event.HasField("activity_task_failed_event_attributes"):
                    failure = event.activity_task_failed_event_attributes.failure
                    failures.append((at, failure.message))
                continue
            attrs = decode_search_attributes(shown)
            shown_turn = (attrs.get(SearchAttribute.TURN) or [turn])[0]
            turn = shown_turn if isinstance(shown_turn, int) else turn
            mode = attrs.get(SearchAttribute.MODE)
            if mode:
                transitions.append((at, str(mode[0]), turn))
    transitions.sort()
    once = [t for i, t in enumerate(transitions) if i == 0 or t[1:] != transitions[i - 1][1:]]
    return once, sorted(failures)


async def earlier_transitions(
    client: Client, cluster: str, owner: OwnerRef, state: RollbackState
) -> list[tuple[datetime, str, int]]:
    """The transitions recorded before those ``state.history`` keeps (it keeps the newest
    ``HISTORY_LIMIT``; earlier attempts are in earlier runs). Reads the runs' histories only
    when there may be some: more than one run, or a full history. The recorded ones end with
    the kept ones, in order (their times differ: a run's first state is shown from its start,
    before the run decides it); when they do not (a run moved on between the two reads), none
    is claimed."""
    if len(state.history) < HISTORY_LIMIT:
        count = await client.count_workflows(
            f"WorkflowId = {control.quote(rollback_id(cluster, owner))}"
        )
        if count.count <= 1:
            return []
    transitions, _ = await recorded_transitions(client, cluster, owner)
    # As recorded, a transition to the mode and turn already shown is not one (no upsert).
    entries = [(e.mode.value, e.turn) for e in state.history]
    kept = [e for i, e in enumerate(entries) if i == 0 or e != entries[i - 1]]
    shown = [(mode, turn) for _, mode, turn in transitions]
    if len(shown) < len(kept) or shown[len(shown) - len(kept) :] != kept:
        return []
    return transitions[: len(shown) - len(kept)]


def table(rows: list[Row], wide: bool = False, header: bool = True) -> str:
    """The workloads as ``get`` prints them; ``wide`` adds when the run started, its ID and
    what a pause holds."""
    names: tuple[str, ...] = ("CLUSTER", "NAMESPACE", "WORKLOAD", "MODE", "TURN", "POLICY")
    names += (
        ("FINGERPRINT", "STATUS", "STARTED", "WORKFLOW ID", "HELD")
        if wide
        else ("FINGERPRINT", "STATUS")
    )
    body = [
        (
            r.cluster or "(0.1)",
            r.namespace,
            r.workload,
            r.mode,
            "" if r.turn is None else str(r.turn),
            r.policy,
            r.fingerprint,
            r.status,
            *((r.started.strftime("%Y-%m-%dT%H:%M:%SZ"), r.workflow_id, r.held) if wide else ()),
        )
        for r in rows
    ]
    return columns(names, body, header)


def columns(header: tuple[str, ...], body: Sequence[tuple[str, ...]], headed: bool = True) -> str:
    """Left-aligned columns two spaces apart, as kubectl prints them (``headed``: under their
    names; without, as ``get -w`` prints the rows after the first, the widths still theirs)."""
    widths = [max(len(str(x)) for x in col) for col in zip(header, *body, strict=False)]
    return "\n".join(
        "  ".join(str(v).ljust(w) for v, w in zip(line, widths, strict=True)).rstrip()
        for line in ((header, *body) if headed else body)
    )


@dataclass
class LiveCohort:
    """The cohort as it is now. While a window is open it is judged as the verdict will judge
    it (health since the window opened); after that, health since the last transition, so a
    pod that OOMKilled before the rollback does not count as OOMKilled now."""

    sample: CohortSample
    since: datetime
    for_verdict: bool
    running: dict[str, int]  # resources as running -> how many pods
    template: str = ""  # the owner's pod template's resources ("": none read)

    def as_json(self) -> dict[str, Any]:
        return {
            **self.sample.model_dump(mode="json", by_alias=True),
            "healthSince": self.since.isoformat(),
            "judgedAsVerdict": self.for_verdict,
            "running": self.running,
        }

    def text(self, state: RollbackState) -> str:
        if self.for_verdict:
            return f"{_tally(self.sample, state)} (judged as the verdict will judge it)"
        sample = self.sample
        if not sample.exists:
            return "the workload no longer exists"
        on = "; ".join(f"{n} on {res or 'no resources set'}" for res, n in self.running.items())
        problems = sample.message or "all healthy"
        return (
            f"{sample.pods} pods ({on}); {problems} since {self.since.isoformat()};"
            f" {sample.adopted} running recommendation {state.fingerprint}"
        )


def live_cohort(kube: ApiClient, cluster: str, state: RollbackState) -> LiveCohort:
    """One owner GET and one pod LIST, judged by the same code as the final sample."""
    window_open = state.mode is Mode.MONITORING and state.window_started_at is not None
    since = state.window_started_at if window_open else state.last_transition_time
    assert since is not None
    lookup = KubernetesActivities(CoreV1Api(kube), CustomObjectsApi(kube)).lookup
    owner = state.owner
    obj = lookup.get(owner)
    if obj is None:
        gone = CohortSample(exists=False, pods=0, adopted=0, adopted_healthy=0)
        return LiveCohort(gone, since, window_open, {})
    query = lookup.cohort_query(owner, obj)
    pods = lookup.pods(owner.namespace, query)
    request = SampleCohortInput(
        cluster=cluster, owner=owner, recommendation=state.recommendation, window_started_at=since
    )
    desired = desired_replicas(owner.kind, obj)
    sample = cohort_sample(owner, pods, request, desired, query, carried=window_open)
    running = Counter(ResourceSnapshot.of(*actual_resources(p)).describe() for p in pods)
    manifest = manifest_resources(owner.kind, obj)
    template = ResourceSnapshot.of(*manifest).describe() if manifest else ""
    return LiveCohort(sample, since, window_open, dict(running.most_common()), template)


def _tally(sample: CohortSample, state: RollbackState) -> str:
    of = state.baseline if state.baseline is not None else sample.desired
    return (
        f"{sample.adopted_healthy}/{of} adopted and healthy (required {state.required}),"
        f" {sample.pods} pods; {sample.message or 'no problems'}"
    )


def _release_line(state: RollbackState, look: datetime) -> str:
    """What the verdict waits for while a release rolls out, and until when at most."""
    bound = ""
    if state.release_since is not None and state.policy is not None:
        bound = f", at most until {(state.release_since + release_wait(state.policy)).isoformat()}"
    return (
        f"Release:      {state.release}: not judged as the cut; the verdict waits for it to"
        f" roll out, looking again at {look.isoformat()}{bound}"
    )


def describe_text(
    cluster: str,
    owner: OwnerRef,
    status: str,
    state: RollbackState | None,
    cohort: LiveCohort | str | None = None,
    held: Pause | None = None,
    earlier: list[tuple[datetime, str, int]] | None = None,
    every: bool = False,
) -> str:
    """``cohort``: the live cohort, or why it could not be read (None: not asked for);
    ``held``: the pause the run waits on; ``earlier``: the transitions recorded before the
    state's history (``earlier_transitions``), listed with ``every``, else counted."""
    workflow_id = rollback_id(cluster, owner)
    if state is None and status == "Running":
        return f"{workflow_id}: {status}, no state yet"
    if state is None:
        return f"{workflow_id}: {status} before a worker ran it: no state recorded"
    lines = [
        f"Workload:     {owner}",
        f"Cluster:      {cluster}",
        f"Workflow:     {workflow_id} ({status})",
        f"Mode:         {state.mode} (turn {state.turn})",
        f"Policy:       {state.policy.ref if state.policy else '-'}",
        f"Fingerprint:  {state.fingerprint}",
    ]
    if held is not None:
        lines.append(f"Held:         {held.describe()}; nothing is written until it ends")
    if state.failure_reason:
        lines.append(f"Failure:      {state.failure_reason}: {state.failure_message or ''}")
    # Deadlines of the mode the workload is in only: none after a cancel or a verdict.
    if state.mode is Mode.MONITORING and state.window_ends_at and state.release is not None:
        lines.append(_release_line(state, state.window_ends_at))
    elif state.mode is Mode.MONITORING and state.window_ends_at:
        lines.append(f"Window ends:  {state.window_ends_at.isoformat()}")
    if state.mode is Mode.BACKING_OFF and state.backoff_ends_at:
        lines.append(f"Backoff ends: {state.backoff_ends_at.isoformat()}")
    if state.baseline is not None:
        lines.append(f"Baseline:     {state.baseline} pods, {state.required} required")
    if state.autoscaler is not None:
        lines.append(f"Autoscaler:   {state.autoscaler.describe()} when the window opened")
    sample = state.last_sample
    if sample is not None:  # what was true when it was taken: the verdict, once there is one
        verdict = state.mode is not Mode.MONITORING
        at = f" (at {sample.observed_at.isoformat()})" if sample.observed_at else ""
        label = "At verdict:  " if verdict else "Last sample: "
        lines.append(f"{label} {_tally(sample, state)}{at}")
    health = state.last_health
    if health is not None and health.unavailable is not None:
        fallback = f"; {health.fallback}" if health.fallback else ""
        lines.append(f"Health:       not judged: {health.unavailable}{fallback}")
    for check in health.checks if health is not None else []:
        if not check.applicable:
            lines.append(f"Health:       {check.message}")  # "<name>: not applicable: why"
            continue
        judged = "passed" if check.passed else "FAILED"
        lines.append(f"Health:       {check.name} {judged}: {check.message} (bound {check.bound})")
    if isinstance(cohort, LiveCohort):
        lines.append(f"Cohort now:   {cohort.text(state)}")
        if cohort.template and any(r != cohort.template for r in cohort.running):
            lines.append(
                f"Template:     {cohort.template} (the pods run what an annotation applier set:"
                " it resizes pods at admission and in place, and leaves the template as it was)"
            )
    elif cohort is not None:
        lines.append(f"Cohort now:   {cohort}")
    lines.append("History:")
    if earlier and every:
        lines += [f"  {at.isoformat()}  {mode} turn {turn}" for at, mode, turn in earlier]
    elif earlier:
        more = f"rollbackctl describe {owner} --all"
        lines.append(f"  ... {len(earlier)} earlier (every transition: {more})")
    for entry in state.history:
        reason = f" ({entry.failure_reason})" if entry.failure_reason else ""
        lines.append(f"  {entry.time.isoformat()}  {entry.mode} turn {entry.turn}{reason}")
    return "\n".join(lines)
