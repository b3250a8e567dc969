"""What each ``rollbackctl`` command does (``cli.main`` parses the command line and imports
this module only to run one): ``crds``, ``worker``, ``intake``, the operations on workflows
(``get|describe|cancel|reopen``, through ``cli.ops``), ``versions`` and ``upgrade-check``.
Each handler returns the process exit status; user errors are printed as one line each, never
as a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import re
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import yaml
from kubernetes.client import ApiClient, CoreV1Api, CustomObjectsApi
from temporalio.client import Client
from temporalio.common import WorkerDeploymentVersion
from temporalio.service import RPCError

from activities.errors import first_line, redact_url
from activities.health import Prometheus, PrometheusError
from activities.lookup import OwnerLookup, read_state
from cli import crds, history, localrun, ops, pausing, podhistory, policies, watch
from cli import report as story
from cli.ops import OpsError
from worker import versioning
from worker.config import (
    IntakeConfig,
    KubeConfig,
    TemporalConfig,
    WorkerConfig,
    parse_prometheus_url,
)
from worker.flags import DEFAULT_DEPLOYMENT_NAME, ConfigError
from worker.process import run
from workflows.activity_api import OwnerRef, rollback_id
from workflows.contract import task_queue_for
from workflows.machine import RollbackState
from workflows.pause import Pause, PauseScope

Handler = Callable[[argparse.Namespace], int]
T = TypeVar("T")


def cmd_crds(args: argparse.Namespace) -> int:
    if args.write:
        for path in crds.write(Path(args.write)):
            print(f"wrote {path}")
    else:
        print("---\n".join(crds.render(doc) for doc in crds.CRDS.values()), end="")
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    run(worker=WorkerConfig.from_args(args))
    return 0


def cmd_intake(args: argparse.Namespace) -> int:
    run(intake=IntakeConfig.from_args(args))
    return 0


def _temporal(args: argparse.Namespace) -> TemporalConfig:
    """The Temporal to talk to: as configured, else the one of a ``rollbackctl run`` live in
    this directory (``cli.localrun``), else the default address."""
    config = TemporalConfig.from_args(args)
    run = localrun.find()
    if config.profile.address is not None or run is None:
        return config
    queue = config.task_queue if args.task_queue else run.task_queue
    return dataclasses.replace(
        config, profile=dataclasses.replace(config.profile, address=run.temporal), task_queue=queue
    )


def _ops(
    args: argparse.Namespace, action: Callable[[Client, TemporalConfig], Awaitable[int]]
) -> int:
    config = _temporal(args)

    async def main() -> int:
        try:
            client = await config.connect()
        except RuntimeError as exc:  # the SDK's "Failed client connect: ..."
            raise OpsError(
                f"cannot reach Temporal at {config.address} ({connect_problem(exc)}): is"
                " `make run` (rollbackctl run) running here? Otherwise give --address or"
                " TEMPORAL_ADDRESS"
            ) from None
        return await action(client, config)

    try:
        return asyncio.run(main())
    except OpsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def connect_problem(exc: Exception) -> str:
    """The SDK's connect error in a few words: its innermost message (``Connection refused``)
    rather than the transport's nested debug text."""
    text = str(exc)
    found: list[str] = re.findall(r'message: "([^"]+)"', text)
    if found:
        return found[-1].lower()
    return first_line(exc).removeprefix("Failed client connect: ")[:160]


def _cluster(args: argparse.Namespace) -> KubeConfig | None:
    """The cluster as configured, else the simulated one of a ``rollbackctl run`` live in this
    directory, else None."""
    kube = KubeConfig.from_args(args)
    if not kube.simulated:
        return kube
    run = localrun.find()
    if run is None or run.kubeconfig is None:
        return None
    return dataclasses.replace(kube, kubeconfig=run.kubeconfig)


def _kube_of(args: argparse.Namespace, cluster: str | None) -> KubeConfig | None:
    """The cluster's API server: ``_cluster``'s, in the kubeconfig context named after
    ``cluster`` when there is one and no ``--context`` is given (a fleet's kubeconfig, as
    ``rollbackctl run`` writes for a simulated fleet, holds one context per cluster)."""
    kube = _cluster(args)
    if kube is None or kube.context or cluster is None:
        return kube
    if cluster in localrun.contexts(kube.kubeconfig):
        return dataclasses.replace(kube, context=cluster)
    return kube


def _policy_cluster(args: argparse.Namespace) -> str | None:
    """The cluster a command reads in (``describe rbp``'s policies, ``get -w``'s watches, a
    pause): ``--cluster`` where the command takes it, else the live run's."""
    run = localrun.find()
    return getattr(args, "cluster", None) or (run.cluster if run is not None else None)


def _queue_of(args: argparse.Namespace, config: TemporalConfig, cluster: str) -> str:
    """The task queue a reopen starts a new run on: as given, else the live run's when it is
    that cluster's, else the cluster's default."""
    if args.task_queue or os.environ.get("ROLLBACK_TASK_QUEUE"):
        return config.task_queue
    run = localrun.find()
    if run is not None and run.cluster == cluster:
        return run.task_queue
    return task_queue_for(cluster)


def _kube(args: argparse.Namespace, needs: str) -> KubeConfig:
    """The cluster the command reads or writes (``_kube_of``), or an error saying what
    ``needs`` it."""
    kube = _kube_of(args, _policy_cluster(args))
    if kube is None:
        raise OpsError(
            f"{needs} in the cluster: give --kubeconfig, $KUBECONFIG or --kube-url"
            " (or run this where `make run` is running)"
        )
    return kube


def _asking(kube: KubeConfig, ask: Callable[[ApiClient], T], failing: str = "") -> T:
    """``ask`` of the cluster; what keeps it from answering (unreachable, TLS, credentials, a
    request it refuses) in one line, not a traceback."""
    try:
        return ask(kube.client())
    except OpsError:
        raise
    except Exception as exc:
        raise OpsError(
            f"{failing or 'cannot reach Kubernetes'}: {_unreachable(kube, exc)}"
        ) from None


def _unreachable(kube: KubeConfig | None, exc: Exception) -> str:
    """Why the cluster could not be read, with a hint when it is a simulated one that died."""
    hint = ""
    if kube is not None and localrun.names_simulated_cluster(kube.kubeconfig):
        hint = (
            "; this kubeconfig names the simulated cluster of a rollbackctl run: is it"
            " still running?"
        )
    return f"{first_line(exc)}{hint}"


def _list_policies(args: argparse.Namespace) -> list[policies.PolicyRow]:
    rows = _asking(
        _kube(args, "policies live"), lambda api: policies.list_policies(api, args.namespace_filter)
    )
    kind = policies.ALIASES.get(args.resource)
    return [r for r in rows if kind is None or r.kind == kind]


def _print_rows(args: argparse.Namespace, rows: list[Any], render: Callable[..., str]) -> None:
    if args.output == "name":  # kubectl's: the objects, deployment.apps/api
        for row in rows:
            print(row.resource_name)
    elif args.output == "json":
        print(json.dumps([r.as_json() for r in rows], indent=2))
    elif args.output == "yaml":
        print(yaml.safe_dump([r.as_json() for r in rows], sort_keys=False), end="")
    elif rows:
        print(render(rows, wide=args.output == "wide"))
    else:
        what = {"workloads": "rollback workflows", "pauses": "pauses"}.get(args.resource)
        print(f"No {what or 'rollback policies'} found.")


def _key(row: Any) -> str:
    return json.dumps(row.as_json(), sort_keys=True, default=str)


def cmd_get(args: argparse.Namespace) -> int:
    if args.all_namespaces and args.namespace_filter:
        print("error: -A and -n cannot be used together", file=sys.stderr)
        return 2
    if args.resource != "workloads":
        given = [
            flag
            for flag, on in (("--mode", args.mode), ("--held", args.held), ("-l", args.selector))
            if on
        ]
        if given:
            print(f"error: {given[0]} filters workloads, not {args.resource}", file=sys.stderr)
            return 2
        if args.resource == "pauses":
            return _get_pauses(args)

        async def look_policies(_: Client | None = None) -> list[Any]:
            return await asyncio.to_thread(_list_policies, args)

        return _get(args, look_policies, policies.table, needs_temporal=False)

    async def look_workloads(client: Client | None) -> list[Any]:
        assert client is not None
        rows = await ops.get(
            client, args.namespace_filter, args.mode, cluster=args.cluster, held=args.held
        )
        if args.selector is None:
            return rows
        selected = await asyncio.to_thread(_labelled, args)
        return [r for r in rows if (r.namespace, r.workload) in selected]

    return _get(args, look_workloads, ops.table, needs_temporal=True)


def _labelled(args: argparse.Namespace) -> set[tuple[str, str]]:
    """``get -l``: the workloads the selector selects, from the cluster."""
    return _asking(
        _kube(args, "-l selects by the workloads' labels"),
        lambda api: ops.labelled(api, args.namespace_filter, args.selector),
        f"cannot select by {args.selector!r}",
    )


def _get_pauses(args: argparse.Namespace) -> int:
    """``get pauses``: every pause annotation in the namespace (or the cluster), in force or not."""
    if args.watch:
        print("error: get pauses -w: not watched; get pauses looks once", file=sys.stderr)
        return 2
    try:
        rows = _asking(
            _kube(args, "pauses live"),
            lambda api: pausing.pauses(api, args.namespace_filter, datetime.now(UTC)),
        )
    except OpsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    _print_rows(args, rows, pausing.pauses_table)
    return 0


def _get(
    args: argparse.Namespace,
    look: Callable[[Client | None], Awaitable[list[Any]]],
    render: Callable[..., str],
    needs_temporal: bool,
) -> int:
    """``get``, and with ``-w`` each change after it as the cluster's watches tell it
    (``cli.watch``: a transition of a workload, a policy's change), until Ctrl-C."""
    cluster = _policy_cluster(args)
    kube = _kube_of(args, cluster) if args.watch else None
    if args.watch and args.held:
        print("error: --held cannot be watched: a hold is Temporal's, not in the cluster's"
              " watches (rollbackctl get --held looks once)", file=sys.stderr)  # fmt: skip
        return 2
    if args.watch and kube is None:
        print(
            "error: get -w follows the cluster's watches: give --kubeconfig, $KUBECONFIG or"
            " --kube-url (or run it where `make run` is running)",
            file=sys.stderr,
        )
        return 2

    async def changes(client: Client | None) -> AsyncIterator[list[Any]]:
        assert kube is not None
        api = kube.client()
        if needs_temporal:  # workloads: each transition, as its state annotation shows it
            async for row in watch.owner_rows(api, cluster, args.namespace_filter, args.selector):
                if not args.mode or row.mode == args.mode:
                    yield [row]
        else:
            async for _ in watch.policy_changes(api):
                yield await look(client)

    async def action(client: Client | None, _: TemporalConfig | None = None) -> int:
        rows = await look(client)
        _print_rows(args, rows, render)
        if not args.watch:
            return 0
        seen, headed = {_key(r) for r in rows}, bool(rows)
        async for batch in changes(client):
            changed = [r for r in batch if _key(r) not in seen]
            seen |= {_key(r) for r in changed}
            if changed and args.output in ("table", "wide"):
                print(render(changed, wide=args.output == "wide", header=not headed), flush=True)
                headed = True
            elif changed:
                _print_rows(args, changed, render)
                sys.stdout.flush()
        return 0

    try:
        if needs_temporal:
            return _ops(args, action)
        return asyncio.run(action(None))
    except OpsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0


def cmd_describe(args: argparse.Namespace) -> int:
    if len(args.target) == 2 or args.target[0] in policies.ALIASES or args.target[0] == "policy":
        return _describe_policy(args)

    async def action(client: Client, _: TemporalConfig) -> int:
        try:
            cluster, owner = await _owner(args, client, args.target[0])
            status, state, held = await ops.describe(client, cluster, owner)
        except ops.NoAttemptError as exc:
            raise ops.NoAttemptError(
                f"{exc}; {await asyncio.to_thread(_presence, args, exc)}"
            ) from None
        cohort = None
        if state is not None:
            cohort = await asyncio.to_thread(_live_cohort, args, cluster, state)
        if args.report:
            await _write_report(args, client, cluster, owner, state)
        earlier = await ops.earlier_transitions(client, cluster, owner, state) if state else []
        if args.output == "json":
            body = state.model_dump(mode="json", by_alias=True) if state else None
            doc: dict[str, Any] = {
                "workflowId": rollback_id(cluster, owner),
                "cluster": cluster,
                "status": status,
                "held": held.model_dump(mode="json", by_alias=True) if held else None,
                "state": body,
            }
            if isinstance(cohort, ops.LiveCohort):
                doc["cohort"] = cohort.as_json()
            if args.every:  # the transitions before the state's own history
                doc["earlierHistory"] = [
                    {"time": at.isoformat(), "mode": mode, "turn": turn}
                    for at, mode, turn in earlier
                ]
            print(json.dumps(doc, indent=2))
        else:
            print(
                ops.describe_text(cluster, owner, status, state, cohort, held, earlier, args.every)
            )
        return 0

    return _ops(args, action)


async def _owner(args: argparse.Namespace, client: Client, text: str) -> tuple[str, OwnerRef]:
    """The workload ``[CLUSTER/]NAMESPACE/KIND/NAME`` and its cluster: as named (or
    ``--cluster``), else the live run's, else the one cluster with attempts of it."""
    cluster, owner = ops.parse_owner(text, args.cluster)
    run = localrun.find()
    if cluster is None and run is not None:
        cluster = run.cluster  # None when it plays a fleet
    return await ops.locate(client, cluster, owner), owner


async def _write_report(
    args: argparse.Namespace,
    client: Client,
    cluster: str,
    owner: OwnerRef,
    state: RollbackState | None,
) -> None:
    """``describe OWNER --report FILE.html``: the workload's story as a page (``cli.report``),
    from its workflow's recorded transitions and the cluster's history of its pods
    (``cli.podhistory``)."""
    transitions, failures = await ops.recorded_transitions(client, cluster, owner)
    kube, note, history = _kube_of(args, cluster), "", None
    if kube is None:
        note = "Events and pods not shown: no cluster given (--kubeconfig, $KUBECONFIG)."
    else:
        try:
            history = await asyncio.to_thread(podhistory.read, kube.client(), owner)
        except Exception as exc:  # the workflow's story is still worth a page
            note = f"Events and pods not shown: {_unreachable(kube, exc)}"
    policy = str(state.policy.ref) if state is not None and state.policy else ""
    page = story.render(
        story.from_live(str(owner), policy, transitions, failures, history, datetime.now(UTC), note)
    )
    Path(args.report).write_text(page, encoding="utf-8")
    print(f"wrote {args.report}", file=sys.stderr)


def _describe_policy(args: argparse.Namespace) -> int:
    """``describe rbp [NS/]NAME``, ``describe crbp NAME``, ``describe policy [NS/]NAME``."""
    for flag, given in (("--all", args.every), ("--report", args.report)):
        if given:  # a workload's, not a policy's
            print(f"error: {flag} describes a workload, not a policy", file=sys.stderr)
            return 2
    if len(args.target) != 2:
        print("error: expected: describe rbp|crbp|policy [NAMESPACE/]NAME", file=sys.stderr)
        return 1
    alias, name = args.target
    namespace, _, name = name.rpartition("/")
    namespace = namespace or args.namespace_filter or "default"
    kind = policies.ALIASES.get(alias)
    if kind is None and alias != "policy":
        print(f"error: unknown resource {alias!r}: rbp, crbp or policy", file=sys.stderr)
        return 1
    args.resource = alias

    async def action(client: Client, _: TemporalConfig) -> int:
        rows = await asyncio.to_thread(_list_policies, args)
        found = [r for r in rows if r.name == name and (r.namespace in (None, namespace))]
        if kind is None and len(found) == 1:
            row = found[0]
        else:
            row = policies.find(found, kind or "RollbackPolicy", namespace, name)
        tracked = await ops.tracked(client, policies.ref_text(row), _policy_cluster(args))
        if args.output == "json":
            doc = row.as_json() | {"tracked": [r.as_json() for r in tracked]}
            print(json.dumps(doc, indent=2))
        else:
            print(policies.describe_text(row, tracked))
        return 0

    args.namespace_filter = None if kind == "ClusterRollbackPolicy" else namespace
    return _ops(args, action)


def _presence(args: argparse.Namespace, missing: ops.NoAttemptError) -> str:
    """Whether the cluster has the workload describe found no attempt of (``ops.presence``)."""
    cluster, owner = ops.parse_owner(args.target[0], args.cluster)
    run = localrun.find()
    kube = _kube_of(args, cluster or (run.cluster if run is not None else None))
    if kube is None:
        return "the cluster was not asked whether it has it (no cluster given)"
    try:
        return ops.presence(kube.client(), owner)
    except Exception as exc:  # unreachable, forbidden, ...: the Temporal answer stands
        return f"the cluster could not be asked whether it has it: {_unreachable(kube, exc)}"


def _live_cohort(
    args: argparse.Namespace, cluster: str, state: RollbackState
) -> ops.LiveCohort | str:
    kube = _kube_of(args, cluster)
    if kube is None:
        return "not read (no cluster given: --kubeconfig, $KUBECONFIG or --kube-url)"
    try:
        return ops.live_cohort(kube.client(), cluster, state)
    except Exception as exc:  # unreachable, forbidden, ...: describe still shows the workflow
        return f"unreadable: {_unreachable(kube, exc)}"


def cmd_cancel(args: argparse.Namespace) -> int:
    async def action(client: Client, _: TemporalConfig) -> int:
        cluster, owner = await _owner(args, client, args.owner)
        state = await ops.cancel(client, cluster, owner, args.reason)
        print(f"{rollback_id(cluster, owner)}: cancel taken in {state.mode}, turn {state.turn}")
        return 0

    return _ops(args, action)


def cmd_reopen(args: argparse.Namespace) -> int:
    async def action(client: Client, config: TemporalConfig) -> int:
        cluster, owner = await _owner(args, client, args.owner)
        state = await ops.reopen(client, cluster, _queue_of(args, config, cluster), owner)
        ends = state.window_ends_at.isoformat() if state.window_ends_at else "?"
        print(f"{rollback_id(cluster, owner)}: reopened, turn {state.turn}; the window ends {ends}")
        return 0

    return _ops(args, action)


def cmd_history(args: argparse.Namespace) -> int:
    """A workload's attempts, newest first (``cli.history``): from Temporal, else, when it does
    not answer, from the owner's state annotation in the cluster."""
    config = _temporal(args)

    async def main() -> int:
        try:
            client = await config.connect()
        except RuntimeError as exc:  # the SDK's "Failed client connect: ..."
            away = f"Temporal at {config.address} unreachable: {connect_problem(exc)}"
            return await asyncio.to_thread(_history_from_cluster, args, away)
        cluster, owner = await _owner(args, client, args.owner)
        lines = await history.from_temporal(client, cluster, owner)
        source = f"Temporal, every run of {rollback_id(cluster, owner)}"
        print(history.render(owner, lines, source))
        return 0

    try:
        return asyncio.run(main())
    except OpsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def _history_from_cluster(args: argparse.Namespace, away: str) -> int:
    cluster, owner = ops.parse_owner(args.owner, args.cluster)
    kube = _kube_of(args, cluster)
    if kube is None:
        raise OpsError(f"{away}; and no cluster to read the state annotation from (--kubeconfig)")
    api = kube.client()
    try:
        obj = OwnerLookup(CoreV1Api(api), CustomObjectsApi(api)).get(owner)
    except Exception as exc:  # unreachable, TLS, credentials: one line, not a traceback
        raise OpsError(f"{away}; and cannot reach Kubernetes: {_unreachable(kube, exc)}") from None
    state, problem = read_state(obj) if obj is not None else (None, f"no {owner} in the cluster")
    if state is None:
        raise OpsError(f"{away}; and {problem or f'{owner} carries no rollback state'}")
    source = f"the owner's state annotation, its newest transitions ({away})"
    print(history.render(owner, history.from_state(state), source))
    return 0


def cmd_pause(args: argparse.Namespace) -> int:
    """Write Kubex's pause on a namespace, workload or pod; list the running attempts it covers."""
    return _pause_or_resume(args, pause=True)


def cmd_resume(args: argparse.Namespace) -> int:
    """Remove the pause: what it held goes ahead once the intake's watch sees it go."""
    return _pause_or_resume(args, pause=False)


def _pause_or_resume(args: argparse.Namespace, pause: bool) -> int:
    try:
        kube = _kube(args, "a pause is written")
        namespace = args.namespace_filter or localrun.context_namespace(
            kube.kubeconfig, kube.context
        )
        target = pausing.parse_target(args.target, namespace)
        until = pausing.until_value(args.until, datetime.now(UTC)) if pause else ""
        annotations = pausing.pause_annotations(until, args.reason) if pause else pausing.RESUME

        def write(api: ApiClient) -> OwnerRef | None:
            written = pausing.annotate(api, target, annotations)
            return pausing.target_owner(api, target, written) if pause else None

        owner = _asking(kube, write)
    except OpsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if not pause:
        print(f"{target} resumed: what its pause held goes ahead within seconds")
        return 0
    print(f"{target} paused until {until}" + (f": {args.reason}" if args.reason else ""))
    print(asyncio.run(_covered(args, target, owner)))
    return 0


def cmd_automation(args: argparse.Namespace) -> int:
    """Switch the engine's automation on or off for the cluster, or say which it is."""
    off = None if args.state is None else args.state == "off"
    if args.reason and not off:
        print("error: --reason goes with off (why automation is off)", file=sys.stderr)
        return 2
    try:
        kube = _kube(args, "the kill switch is read or written")

        def switch(api: ApiClient) -> tuple[str, Pause | None]:
            namespace = args.engine_namespace or pausing.engine_namespace(api)
            return namespace, pausing.automation(api, namespace, off, args.reason)

        namespace, now = _asking(kube, switch)
    except OpsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if now is None:
        print(
            f"automation on (namespace {namespace}): attempts start as pods adopt"
            " recommendations, backoffs end and re-apply their cuts"
        )
        return 0
    print(
        f"{now.describe()}: no new attempt starts and nothing brings a cut back (a backoff's"
        " end, a re-apply); verdicts and rollbacks in flight go on"
    )
    return 0


def cmd_breaker(args: argparse.Namespace) -> int:
    """Say whether the storm breaker stops re-applies, or reset it."""
    reset = args.action == "reset"
    try:
        kube = _kube(args, "the storm breaker is read or reset")

        def ask(api: ApiClient) -> tuple[str, Pause | None, str | None]:
            namespace = args.engine_namespace or pausing.engine_namespace(api)
            return namespace, *pausing.breaker(api, namespace, reset)

        namespace, held, since = _asking(kube, ask)
    except OpsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if held is not None:
        print(f"storm breaker tripped at {since}: {held.describe()}")
    elif reset:
        print(f"storm breaker reset (namespace {namespace}): re-applies go on within seconds,"
              " verdicts counted from now")  # fmt: skip
    else:
        print(f"storm breaker not tripped (namespace {namespace}): re-applies go on")
    return 0


async def _covered(args: argparse.Namespace, target: pausing.Target, owner: OwnerRef | None) -> str:
    """The running attempts the pause covers, as one line (Temporal is only asked: a pause
    written stands whether it answers or not)."""
    config = _temporal(args)
    try:
        client = await config.connect()
        scope = target.name if target.scope is PauseScope.NAMESPACE else target.namespace
        rows = await ops.get(client, scope, cluster=_policy_cluster(args))  # this cluster's
    except Exception as exc:  # the SDK's connect and RPC errors alike
        problem = connect_problem(exc)
        return f"Running attempts not listed: cannot reach Temporal at {config.address} ({problem})"
    covered = pausing.covered(rows, target, owner)
    if not covered:
        return "It covers no running attempt now; one that starts is held where it first acts."
    listed = ", ".join(f"{r.namespace}/{r.workload} ({r.mode}, turn {r.turn})" for r in covered)
    return f"It holds {len(covered)} running attempt(s), each where it next acts: {listed}"


def cmd_versions(args: argparse.Namespace) -> int:
    """List the engine's Worker Deployment versions, or move new attempts between them."""

    async def action(client: Client, _: TemporalConfig) -> int:
        name = args.deployment_name or DEFAULT_DEPLOYMENT_NAME
        try:
            if args.action in ("set-current", "ramp"):
                version = WorkerDeploymentVersion(name, args.build_id)
                within = args.wait
                if args.action == "set-current":
                    done = await versioning.set_current(client, version, within)
                    said = f"{name}: {args.build_id} is current; new attempts start on it"
                else:
                    done = await versioning.ramp(client, version, args.percent, within)
                    said = f"{name}: {args.percent:g}% of new attempts start on {args.build_id}"
                if not done:
                    print(
                        f"{said} once the change reaches every task queue: the server accepted"
                        f" it, and it has not reached them within {within:g}s; until it"
                        " does, a new attempt may start on the previous routing (`rollbackctl"
                        " versions` shows it; the command may be run again, with a longer"
                        " --wait)",
                        file=sys.stderr,
                    )
                    return 1
                print(said)
                return 0
            rows = await versioning.versions(client, name)
        except RPCError as exc:
            if versioning.not_ready(exc):  # still so at the end of --wait
                raise OpsError(
                    f"{name}: {exc.message} (still so after {args.wait:g}s: are the version's"
                    " workers running, with every task queue's pollers? the command may be run"
                    " again, with a longer --wait)"
                ) from exc
            raise OpsError(f"{name}: {exc.message}") from exc
        print(versioning_table(rows) if rows else f"{name}: no versions yet")
        return 0

    return _ops(args, action)


def cmd_upgrade_check(args: argparse.Namespace) -> int:
    """0 when no attempt started before clusters had names (0.1) is running, else 1 with them."""

    async def action(client: Client, _: TemporalConfig) -> int:
        rows = await ops.unnamed_running(client)
        if not rows:
            print("No 0.1 attempt is running: install 1.0 (docs/operating/upgrade.md).")
            return 0
        print(f"{len(rows)} attempt(s) started by 0.1 still running; keep a 0.1 worker until"
              " they end (the 0.1 intake stopped):")  # fmt: skip
        for row in rows:
            print(
                f"  {row.workflow_id}  {row.mode or '-'}  started {row.started:%Y-%m-%dT%H:%M:%SZ}"
            )
        return 1

    return _ops(args, action)


def cmd_prometheus_check(args: argparse.Namespace) -> int:
    """0 when the Prometheus of ``--prometheus-url`` (``ROLLBACK_PROMETHEUS_URL``) answers an
    instant query the way the health checks ask one, else 1 with why."""
    try:
        url = parse_prometheus_url(args, os.environ)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if url is None:
        print(
            "error: no Prometheus given (--prometheus-url, ROLLBACK_PROMETHEUS_URL)",
            file=sys.stderr,
        )
        return 2
    try:
        Prometheus(url).query("vector(1)", datetime.now(UTC))
    except PrometheusError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"Prometheus at {redact_url(url)} answers: the policies' health checks can be asked.")
    return 0


def versioning_table(rows: list[versioning.VersionRow]) -> str:
    body = [
        (
            r.build_id,
            r.status,
            f"{r.ramp:g}%" if r.ramp is not None else "",
            str(r.running),
            "yes" if r.removable else "no",
        )
        for r in rows
    ]
    return ops.columns(("BUILD", "STATUS", "RAMP", "RUNNING", "REMOVABLE"), body)
