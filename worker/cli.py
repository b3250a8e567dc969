"""``rollbackctl``: the command line of the rollback engine.

Sub-commands are grouped by what they touch: ``policy`` works on files only (no cluster, no
Temporal), ``crds`` prints or writes the CustomResourceDefinitions, ``worker`` and ``intake``
run the processes against a cluster, ``get|describe|cancel|reopen`` operate on workflows,
``dev-server`` runs the embedded Temporal. Each handler returns the process exit status; user
errors are printed as one line each, never as a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import yaml
from kubernetes.client import ApiClient
from temporalio.client import Client
from temporalio.runtime import Runtime

from activities.kubernetes import Actuation
from worker import crds, ops, telemetry
from worker.devserver import DevServer
from worker.kube import DEFAULT_READ_TIMEOUT, activities_for, api_client
from worker.ops import OpsError
from worker.policyfiles import load_documents, load_policies
from worker.process import serve, stop_on_signals
from worker.runner import MAX_CACHED_WORKFLOWS
from worker.simulate import SCENARIOS, Scenario, World, play, run_scenario
from worker.temporal import TemporalConfig, add_connection_flags
from workflows.backoff import backoff_schedule
from workflows.durations import format_duration, parse_duration
from workflows.policy import AnyPolicy, RollbackPolicy
from workflows.selection import Resolution, WorkloadRef, policy_id, resolve

Handler = Callable[[argparse.Namespace], int]


def _policy_ref(policy: AnyPolicy) -> dict[str, str | None]:
    namespace = (
        (policy.metadata.namespace or "default") if isinstance(policy, RollbackPolicy) else None
    )
    return {"kind": policy.kind, "namespace": namespace, "name": policy.metadata.name}


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
        "policy": _policy_ref(winner) if winner else None,
        "candidates": [
            {**_policy_ref(c.policy), "matched": c.matched, "reason": c.reason}
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
    if winner is None:
        lines.append(
            "Policy:    none matches: the workload is retained (no monitoring, rollback or retry)"
        )
    else:
        spec = winner.spec
        lines.append(
            f"Policy:    {policy_id(winner)} (weight {spec.weight},"
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
        lines.append(f"  {mark} {policy_id(c.policy)}: {c.reason}")
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
    resolution = resolve(policies, workload)
    if args.output == "json":
        print(json.dumps(explain_json(workload, resolution), indent=2))
    else:
        print(explain_text(workload, resolution))
    return 0


def cmd_crds(args: argparse.Namespace) -> int:
    if args.write:
        for path in crds.write(Path(args.write)):
            print(f"wrote {path}")
    else:
        print("---\n".join(crds.render(doc) for doc in crds.CRDS.values()), end="")
    return 0


def _kube(args: argparse.Namespace, rt: Runtime | None = None) -> ApiClient:
    return api_client(args.kubeconfig, args.kube_url, telemetry.meter(rt), args.kube_timeout)


def cmd_worker(args: argparse.Namespace) -> int:
    config = TemporalConfig.from_args(args)
    rt = telemetry.runtime(args.metrics_address)
    activities = activities_for(_kube(args, rt), Actuation(args.actuation))

    async def main() -> None:
        await serve(
            await config.connect_patiently(rt),
            config.task_queue,
            stop_on_signals(),
            activities=activities,
            max_cached_workflows=args.max_cached_workflows,
        )

    asyncio.run(main())
    return 0


def cmd_intake(args: argparse.Namespace) -> int:
    config = TemporalConfig.from_args(args)
    rt = telemetry.runtime(args.metrics_address)
    api = _kube(args, rt)

    async def main() -> None:
        await serve(
            await config.connect_patiently(rt),
            config.task_queue,
            stop_on_signals(),
            intake_api=api,
            lease_namespace=args.lease_namespace,
            identity=args.identity,
            sample_interval=parse_duration(args.sample_interval),
            metric_meter=telemetry.meter(rt),
        )

    asyncio.run(main())
    return 0


def _ops(
    args: argparse.Namespace, action: Callable[[Client, TemporalConfig], Awaitable[int]]
) -> int:
    config = TemporalConfig.from_args(args)

    async def main() -> int:
        return await action(await config.connect(), config)

    try:
        return asyncio.run(main())
    except OpsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def cmd_get(args: argparse.Namespace) -> int:
    async def action(client: Client, _: TemporalConfig) -> int:
        rows = await ops.get(client, args.namespace_filter, args.mode)
        if args.output == "json":
            print(json.dumps([r.as_json() for r in rows], indent=2))
        else:
            print(ops.table(rows) if rows else "No rollback workflows found.")
        return 0

    return _ops(args, action)


def cmd_describe(args: argparse.Namespace) -> int:
    async def action(client: Client, _: TemporalConfig) -> int:
        owner = ops.parse_owner(args.owner)
        status, state = await ops.describe(client, owner)
        if args.output == "json":
            body = state.model_dump(mode="json", by_alias=True) if state else None
            print(
                json.dumps(
                    {"workflowId": owner.workflow_id, "status": status, "state": body}, indent=2
                )
            )
        else:
            print(ops.describe_text(owner, status, state))
        return 0

    return _ops(args, action)


def cmd_cancel(args: argparse.Namespace) -> int:
    async def action(client: Client, _: TemporalConfig) -> int:
        owner = ops.parse_owner(args.owner)
        await ops.cancel(client, owner, args.reason)
        print(f"cancel signalled to {owner.workflow_id}")
        return 0

    return _ops(args, action)


def cmd_reopen(args: argparse.Namespace) -> int:
    async def action(client: Client, config: TemporalConfig) -> int:
        owner = ops.parse_owner(args.owner)
        await ops.reopen(client, config.task_queue, owner)
        print(f"reopen signalled to {owner.workflow_id}")
        return 0

    return _ops(args, action)


def cmd_dev_server(args: argparse.Namespace) -> int:
    server = DevServer(Path(args.data_dir), args.port, args.ui_port, args.headless)
    with server:
        ui = f", Web UI http://127.0.0.1:{server.ui_port}" if server.ui_port else ""
        print(
            f"Temporal dev server on {server.address}{ui}; data in {args.data_dir}. Ctrl-C stops."
        )
        try:
            assert server.process is not None
            server.process.wait()
        except KeyboardInterrupt:
            pass
    return 0


def cmd_simulate(args: argparse.Namespace) -> int:
    try:
        scenario = Scenario.load(args.scenario)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        print(f"{args.scenario}: {exc}", file=sys.stderr)
        return 1
    quiet = args.output == "json"
    report = asyncio.run(
        run_scenario(
            scenario,
            on_line=(lambda _: None) if quiet else _print_line,
            on_progress=None if quiet or not sys.stderr.isatty() else _progress,
        )
    )
    if quiet:
        print(json.dumps(report.as_json(), indent=2))
    else:
        verdict = "PASSED" if report.passed else "FAILED"
        print(f"\n{scenario.name}: {verdict} in {report.duration:.1f}s")
        for problem in report.problems:
            print(f"  {problem}")
    return 0 if report.passed else 1


DEMO = SCENARIOS / "oom-rollback.yaml"


def cmd_demo(args: argparse.Namespace) -> int:
    print(f"Demo: {DEMO.name} — {Scenario.load(DEMO).description.strip()}\n")
    args.scenario, args.output = str(DEMO), "text"
    return cmd_simulate(args)


def cmd_run(args: argparse.Namespace) -> int:
    """The embedded default: Temporal dev server + worker + intake, against a cluster or the
    simulated one (with the demo scenario playing)."""
    data_dir = Path(args.data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    simulated = not (args.kubeconfig or args.kube_url or os.environ.get("KUBECONFIG"))

    async def main() -> None:
        stop = stop_on_signals()
        if simulated:
            world = World(
                Scenario.load(DEMO),
                _print_line,
                data_dir,
                temporal_port=args.port,
                ui=True,
                task_queue=TemporalConfig.from_env().task_queue,
            )
            await world.start()
            _banner(world.temporal, f"simulated cluster at {world.api.url} playing {DEMO.name}")
            try:
                await play(world)
                await stop.wait()
            finally:
                await world.stop()
            return
        server = None
        if not args.address:
            server = DevServer(data_dir / "temporal", args.port, log_path=data_dir / "temporal.log")
            await asyncio.to_thread(server.start)
            args.address = server.address
        config = TemporalConfig.from_args(args)
        rt = telemetry.runtime(args.metrics_address)
        api = _kube(args, rt)
        try:
            if server is not None:
                _banner(server, "cluster from your kubeconfig")
            await serve(
                await config.connect_patiently(rt),
                config.task_queue,
                stop,
                activities=activities_for(api, Actuation(args.actuation)),
                max_cached_workflows=args.max_cached_workflows,
                intake_api=api,
                lease_namespace=args.lease_namespace,
                identity=args.identity,
                sample_interval=parse_duration(args.sample_interval),
                metric_meter=telemetry.meter(rt),
            )
        finally:
            if server is not None:
                await asyncio.to_thread(server.stop)

    asyncio.run(main())
    return 0


def _banner(server: DevServer, cluster: str) -> None:
    ui = f"http://127.0.0.1:{server.ui_port}" if server.ui_port else "(headless)"
    print(
        f"\nrightsizing-rollback is running: Temporal {server.address}, Web UI {ui}, {cluster}.\n"
        "Look with: rollbackctl get   |   rollbackctl describe NAMESPACE/KIND/NAME\n"
        'In the UI: filter with RollbackMode = "failedPermanent". Ctrl-C stops.\n',
        flush=True,
    )


def _print_line(line: str) -> None:
    print(f"\r{line}", flush=True)


def _progress(elapsed: float, total: float) -> None:
    sys.stderr.write(f"\r[{elapsed:5.1f}s / {total:.0f}s] waiting for the expected outcome...")
    sys.stderr.flush()


def _add_kube_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("Kubernetes")
    group.add_argument(
        "--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, in-cluster, ~/.kube/config)"
    )
    group.add_argument("--kube-url", help="plain-HTTP API server URL (the simulated cluster)")
    group.add_argument(
        "--kube-timeout",
        type=float,
        default=float(os.environ.get("ROLLBACK_KUBE_TIMEOUT", DEFAULT_READ_TIMEOUT)),
        help="seconds to wait for an API server answer before the call fails"
        " (ROLLBACK_KUBE_TIMEOUT, default %(default)s)",
    )
    group.add_argument(
        "--actuation",
        choices=[a.value for a in Actuation],
        default=os.environ.get("ROLLBACK_ACTUATION", "annotations"),
        help="annotations: publish rollback recommendations for an applier;"
        " in-place: also resize pods (ROLLBACK_ACTUATION)",
    )
    parser.add_argument(
        "--metrics-address",
        default=os.environ.get("ROLLBACK_METRICS_ADDRESS"),
        help="serve Prometheus /metrics on host:port, e.g. 0.0.0.0:9464 (ROLLBACK_METRICS_ADDRESS)",
    )


def _add_worker_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-cached-workflows",
        type=int,
        default=int(os.environ.get("ROLLBACK_MAX_CACHED_WORKFLOWS", MAX_CACHED_WORKFLOWS)),
        help="workflows kept in memory between tasks; at least the workloads monitored at once"
        " (ROLLBACK_MAX_CACHED_WORKFLOWS, default %(default)s)",
    )


def _add_intake_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("intake")
    group.add_argument(
        "--lease-namespace",
        default=os.environ.get("POD_NAMESPACE", "default"),
        help="namespace of the leader-election Lease (POD_NAMESPACE)",
    )
    group.add_argument(
        "--identity", help="leader-election identity (default: POD_NAME or host-pid)"
    )
    group.add_argument(
        "--sample-interval",
        default=os.environ.get("ROLLBACK_SAMPLE_INTERVAL", "30s"),
        help="cohort sampling interval (ROLLBACK_SAMPLE_INTERVAL, default 30s)",
    )


def _add_operations(sub: Any) -> None:
    """``get``, ``describe``, ``cancel``, ``reopen``: operations on workflows."""
    listing = sub.add_parser("get", help="list workloads with their rollback mode, turn and policy")
    add_connection_flags(listing)
    listing.add_argument(
        "-n", "--in-namespace", dest="namespace_filter", help="only this Kubernetes namespace"
    )
    listing.add_argument("--mode", help="only this mode, e.g. failedPermanent")
    listing.add_argument("-o", "--output", choices=["table", "json"], default="table")
    listing.set_defaults(handler=cmd_get)

    for name, handler, text in (
        ("describe", cmd_describe, "status and recent history of one workload"),
        ("cancel", cmd_cancel, "stop monitoring a workload, leaving its resources as they are"),
        ("reopen", cmd_reopen, "start a fresh monitoring window for the current recommendation"),
    ):
        cmd = sub.add_parser(name, help=text)
        add_connection_flags(cmd)
        cmd.add_argument("owner", metavar="NAMESPACE/KIND/NAME")
        if name == "describe":
            cmd.add_argument("-o", "--output", choices=["text", "json"], default="text")
        if name == "cancel":
            cmd.add_argument("--reason", default="cancelled with rollbackctl")
        cmd.set_defaults(handler=handler)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rollbackctl", description="Durable rollback engine for Kubernetes rightsizing."
    )
    parser.add_argument(
        "--log-format",
        choices=["text", "json"],
        default=os.environ.get("ROLLBACK_LOG_FORMAT", "text"),
        help="log lines as text or JSON objects (ROLLBACK_LOG_FORMAT)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    policy = sub.add_parser("policy", help="validate policies and explain which one applies")
    policy_sub = policy.add_subparsers(dest="policy_command", required=True, metavar="COMMAND")
    validate = policy_sub.add_parser(
        "validate", help="validate RollbackPolicy/ClusterRollbackPolicy YAML"
    )
    validate.add_argument("files", nargs="+", metavar="FILE")
    validate.set_defaults(handler=cmd_policy_validate)
    explain = policy_sub.add_parser("explain", help="which policy applies to a workload, and why")
    explain.add_argument("--policies", nargs="+", required=True, metavar="FILE")
    explain.add_argument("--workload", required=True, metavar="FILE", help="one workload manifest")
    explain.add_argument(
        "--namespace", help="namespace of the workload (default: its manifest's, else 'default')"
    )
    explain.add_argument("-o", "--output", choices=["text", "json"], default="text")
    explain.set_defaults(handler=cmd_policy_explain)

    crd = sub.add_parser("crds", help="print the CustomResourceDefinitions (or --write DIR)")
    crd.add_argument("--write", metavar="DIR", help="write one YAML file per CRD into DIR")
    crd.set_defaults(handler=cmd_crds)

    worker = sub.add_parser(
        "worker", help="run the Temporal worker (workflows + Kubernetes activities)"
    )
    add_connection_flags(worker)
    _add_kube_flags(worker)
    _add_worker_flags(worker)
    worker.set_defaults(handler=cmd_worker)

    intake = sub.add_parser("intake", help="run the intake controller (leader-elected)")
    add_connection_flags(intake)
    _add_kube_flags(intake)
    _add_intake_flags(intake)
    intake.set_defaults(handler=cmd_intake)

    _add_operations(sub)

    run = sub.add_parser(
        "run", help="the embedded default: Temporal dev server, worker and intake in one process"
    )
    add_connection_flags(run)
    _add_kube_flags(run)
    _add_worker_flags(run)
    _add_intake_flags(run)
    run.add_argument("--data-dir", default=".rollback-data", help="Temporal's SQLite and logs")
    run.add_argument("--port", type=int, default=7233, help="Temporal port (Web UI on port + 1000)")
    run.set_defaults(handler=cmd_run)

    demo = sub.add_parser("demo", help="play the demo scenario on the simulated cluster and exit")
    demo.set_defaults(handler=cmd_demo)

    simulate = sub.add_parser("simulate", help="run a scenario against the simulated cluster")
    simulate.add_argument("scenario", metavar="SCENARIO.yaml")
    simulate.add_argument("-o", "--output", choices=["text", "json"], default="text")
    simulate.set_defaults(handler=cmd_simulate)

    dev = sub.add_parser("dev-server", help="run the embedded Temporal dev server (SQLite, Web UI)")
    dev.add_argument("--data-dir", default=".rollback-data", help="where the SQLite file lives")
    dev.add_argument("--port", type=int, default=7233)
    dev.add_argument("--ui-port", type=int, default=None, help="Web UI port (default: port + 1000)")
    dev.add_argument("--headless", action="store_true", help="no Web UI")
    dev.set_defaults(handler=cmd_dev_server)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    telemetry.configure_logging(args.log_format)
    handler: Handler = args.handler
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
