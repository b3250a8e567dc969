"""``rollbackctl run|demo|simulate|dev-server``: everything that runs on one machine.

These commands use the simulated cluster and the embedded Temporal dev server (package
``sim``), which the production install does not carry: ``cli.main`` imports this module only
when one of them is asked for.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import urllib.parse
from collections.abc import Awaitable, Iterator
from datetime import timedelta
from pathlib import Path

import yaml
from pydantic import ValidationError

from cli import localrun
from cli import report as story
from cli.crds import CRDS
from sim.apiserver import ApiError
from sim.devserver import DevServer, DevServerError, ensure_port_free
from sim.prometheus import PrometheusUnavailableError
from sim.scenario import SCENARIOS, Scenario, World, play, run_scenario
from worker import telemetry
from worker.config import IntakeConfig, KubeConfig, TemporalConfig, WorkerConfig
from worker.flags import ConfigError
from worker.process import serve, stop_on_signals
from workflows.durations import format_duration

DEMO = SCENARIOS / "oom-rollback.yaml"


def cmd_dev_server(args: argparse.Namespace) -> int:
    server = DevServer(Path(args.data_dir), args.port, args.ui_port, args.headless)
    try:
        server.start()
    except DevServerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    ui = f", Web UI http://127.0.0.1:{server.ui_port}" if server.ui_port else ""
    print(f"Temporal dev server on {server.address}{ui}; data in {args.data_dir}. Ctrl-C stops.")
    try:
        assert server.process is not None
        server.process.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


def scenario_path(name: str) -> Path:
    """A scenario file, or a shipped scenario by name (``success``, ``oom-rollback.yaml``)."""
    path = Path(name)
    if path.exists() or path.parent != Path("."):
        return path
    shipped = SCENARIOS / (name if name.endswith(".yaml") else f"{name}.yaml")
    if shipped.exists():
        return shipped
    known = ", ".join(sorted(p.stem for p in SCENARIOS.glob("*.yaml")))
    raise FileNotFoundError(f"no such file, nor a shipped scenario of that name ({known})")


def cmd_simulate(args: argparse.Namespace) -> int:
    try:
        args.scenario = str(scenario_path(args.scenario))
        scenario = Scenario.load(args.scenario)
    except ValidationError as exc:  # one line per problem, with its path
        for error in exc.errors():
            where = ".".join(str(p) for p in error["loc"])
            print(f"error: {args.scenario}: {where}: {error['msg']}", file=sys.stderr)
        return 1
    except (OSError, ValueError, yaml.YAMLError) as exc:
        print(f"error: {args.scenario}: {exc}", file=sys.stderr)
        return 1
    if getattr(args, "validate", False):
        print(
            f"{args.scenario}: valid scenario {scenario.name}: {len(scenario.workloads)}"
            f" workload(s), {len(scenario.steps)} step(s), {len(scenario.expect)} expectation(s)"
        )
        return 0
    quiet = args.output in ("json", "html")
    with _engine_logs_to_file(scenario.name) as log_file:
        report = asyncio.run(
            run_scenario(
                scenario,
                on_line=(lambda _: None) if quiet else _print_line,
                on_progress=None if quiet or not sys.stderr.isatty() else _progress,
            )
        )
    if report.passed:
        log_file.unlink(missing_ok=True)
    elif report.logs:
        shutil.copy(log_file, Path(report.logs) / "rollbackctl.log")
    if args.report:
        page = story.render(story.from_scenario(report, scenario))
        Path(args.report).write_text(page, encoding="utf-8")
    if args.output == "html":
        print(story.render(story.from_scenario(report, scenario)))
    elif quiet:
        print(json.dumps(report.as_json(), indent=2))
    else:
        verdict = "PASSED" if report.passed else "FAILED"
        print(f"\n{scenario.name}: {verdict} in {report.duration:.1f}s")
        for line in report.explain():
            print(f"  {line}")
    return 0 if report.passed else 1


@contextlib.contextmanager
def _engine_logs_to_file(name: str) -> Iterator[Path]:
    """The timeline is what a person reads: the engine's own lines go to a file, the console
    keeps its warnings and errors (as ``rollbackctl run`` does)."""
    with tempfile.NamedTemporaryFile(prefix=f"rollback-{name}-", suffix=".log", delete=False) as f:
        path = Path(f.name)
    telemetry.console_quiet(path)
    yield path


def cmd_demo(args: argparse.Namespace) -> int:
    print(f"Demo: {DEMO.name} — {Scenario.load(DEMO).description.strip()}\n")
    args.scenario, args.output, args.report, args.validate = str(DEMO), "text", None, False
    return cmd_simulate(args)


# The Temporal connection flags: for a Temporal of yours (--address), not for the dev server
# that run starts itself.
CONNECTION_FLAGS = {
    "address": "--address",
    "namespace": "--temporal-namespace",
    "profile": "--profile",
    "api_key_file": "--api-key-file",
    "api_key": "--api-key",
    "tls": "--tls",
    "tls_cert": "--tls-cert",
    "tls_key": "--tls-key",
    "tls_ca": "--tls-ca",
}


def _refuse_unusable_flags(args: argparse.Namespace, simulated: bool) -> None:
    """A flag the chosen mode cannot honour is refused, never dropped."""
    given = [flag for attr, flag in CONNECTION_FLAGS.items() if getattr(args, attr, None)]
    if simulated and given:
        raise ConfigError(
            f"{', '.join(given)}: run without a cluster starts its own Temporal dev server;"
            " give --kubeconfig (or --kube-url) to run against a cluster and your Temporal"
        )
    if not simulated and not args.address and given:
        raise ConfigError(
            f"{', '.join(given)} need --address: without it run starts its own Temporal dev"
            " server (default namespace, no TLS or API key)"
        )


# What one engine of a simulated fleet cannot honour: each cluster's engine runs with the
# defaults, its worker as a child process (rollbackctl run against one cluster takes them all).
ENGINE_FLAGS = {
    "actuation": "--actuation",
    "worker_versioning": "--worker-versioning",
    "deployment_name": "--deployment-name",
    "build_id": "--build-id",
    "max_cached_workflows": "--max-cached-workflows",
    "notifications": "--notifications",
    "metrics_address": "--metrics-address",
    "health_address": "--health-address",
    "protected_namespaces": "--protected-namespaces",
    "min_ready_duration": "--min-ready-duration",
    "cluster": "--cluster",
    "task_queue": "--task-queue",
    "identity": "--identity",
    "temporal_budget": "--temporal-budget",
    "storm_breaker": "--storm-breaker",
}


def cmd_run(args: argparse.Namespace) -> int:
    """The embedded default: Temporal dev server + worker + intake, against a cluster or the
    simulated one (with the demo scenario playing, or ``--play``'s). The simulated cluster
    replaces the cluster only: the worker and intake are the same code, with the same flags, as
    against a real one; a simulated fleet runs one engine per cluster."""
    data_dir = Path(args.data_dir)
    kube = KubeConfig.from_args(args)
    # A kubeconfig that run wrote for an earlier simulated cluster (an exported KUBECONFIG)
    # names no real cluster: this run starts a fresh simulated one and rewrites that file.
    simulated = kube.simulated or (
        not args.kube_url and localrun.names_simulated_cluster(kube.kubeconfig)
    )
    _refuse_unusable_flags(args, simulated)
    scenario = _played(args, simulated)
    fleet = scenario is not None and scenario.fleet
    if scenario is not None and not fleet:
        args.cluster = args.cluster or scenario.cluster  # run names its simulated cluster
        # The story's time scale, unless the flag says otherwise.
        args.min_ready_duration = args.min_ready_duration or format_duration(
            timedelta(seconds=scenario.min_ready_duration)
        )
    # A fleet's engines are each cluster's own (``_run_fleet``); the rest take these settings.
    worker = None if fleet else WorkerConfig.from_args(args)
    intake = None if fleet else IntakeConfig.from_args(args)
    try:
        held = localrun.claim(data_dir)
    except localrun.RunInUseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1

    try:
        if scenario is not None and fleet:
            asyncio.run(_run_fleet(args, held, scenario))
        elif worker is not None and intake is not None:
            if scenario is not None:
                asyncio.run(_run_simulated(args, held, scenario, worker, intake))
            else:
                asyncio.run(_run_on_cluster(args, held, worker, intake))
        print("Stopped.", flush=True)
    except DevServerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        held.release()
    return 0


def _played(args: argparse.Namespace, simulated: bool) -> Scenario | None:
    """The story a simulated run plays (None against a real cluster, where ``--play`` is
    refused: it would play nothing)."""
    if not simulated:
        if args.play:
            raise ConfigError("--play: run against a cluster plays no scenario; drop --kubeconfig")
        return None
    path = scenario_path(args.play) if args.play else DEMO
    try:
        scenario = Scenario.load(path)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise ConfigError(f"--play {path}: {exc}") from None
    given = [flag for attr, flag in ENGINE_FLAGS.items() if getattr(args, attr, None)]
    if scenario.fleet and given:
        raise ConfigError(
            f"{', '.join(given)}: a simulated fleet runs each cluster's engine with the"
            " defaults; give them to run with a one-cluster scenario, or against your cluster"
        )
    return scenario


def _prepare(world: World, data_dir: Path, lease_namespace: str) -> Path:
    """Each simulated cluster as a real one is set up (our CRDs, the Lease's namespace), and
    a kubeconfig for kubectl: its current context the first cluster, and in a fleet a context
    per cluster named after it."""
    for member in world.members:
        store = member.api.store
        for crd in CRDS.values():  # as installed on a cluster: kubectl reads their columns
            store.create(crd)
        with contextlib.suppress(ApiError):  # the Lease's namespace, unless it exists
            store.create(
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": lease_namespace}}
            )
    fleet = {m.name: m.api.url for m in world.members} if world.scenario.fleet else None
    return localrun.write_kubeconfig(data_dir.resolve() / "kubeconfig", world.api.url, fleet)


async def _run_simulated(
    args: argparse.Namespace,
    held: localrun.Claim,
    scenario: Scenario,
    worker: WorkerConfig,
    intake: IntakeConfig,
) -> None:
    """``run`` without a cluster: the simulated one, with the demo playing."""
    data_dir = Path(args.data_dir)
    stop = stop_on_signals()
    telemetry.console_quiet(data_dir / "rollback.log")  # the timeline is what you watch
    kept = _fresh_history(data_dir, args.port)
    if kept is not None:
        _print_line(f"A fresh demo: the last run's Temporal history is kept in {kept}")
    queue = worker.temporal.task_queue
    world = World(
        scenario,
        _print_line,
        data_dir,
        temporal_port=args.port,
        ui=True,
        task_queue=queue,
        engine=False,
    )
    engine: asyncio.Task[None] | None = None
    try:
        await world.start()
        kubeconfig = _prepare(world, data_dir, intake.lease_namespace)
        worker, checks = await _health_checks(world, worker)
        temporal = TemporalConfig.at(world.temporal.address, queue, worker.cluster)
        kube = dataclasses.replace(worker.kube, kubeconfig=None, url=world.api.url)
        ready = asyncio.Event()
        engine = asyncio.create_task(
            serve(
                stop,
                dataclasses.replace(worker, temporal=temporal, kube=kube),
                dataclasses.replace(
                    intake, temporal=temporal, kube=kube, prometheus_url=worker.prometheus_url
                ),
                ready=ready,
            )
        )
        await _first(ready.wait(), engine)
        world.zero()  # time zero: the engine is up
        held.publish(
            _published(data_dir, world.temporal, queue, str(kubeconfig), (worker.cluster,))
        )
        kubectl = rollbackctl("kubectl")
        _banner(
            world.temporal,
            f"simulated cluster {worker.cluster} at {world.api.url} playing {scenario.name}",
            worker,
            next(iter(world.scenario.expect)),
            f"kubectl: export KUBECONFIG={kubeconfig}   (then: {kubectl} get deploy,rbp -A)",
            f"Logs: {data_dir / 'rollback.log'} (engine), {data_dir / 'temporal.log'} (Temporal)",
            checks,
        )
        await _first(play(world), engine)
        await _first(stop.wait(), engine)
    finally:
        stop.set()
        if engine is not None:
            await engine
        await world.stop()


async def _health_checks(world: World, worker: WorkerConfig) -> tuple[WorkerConfig, str]:
    """The Prometheus the policies' health checks ask: the one given (``--prometheus-url``),
    else a local one scraping the simulated kubelets when ``prometheus`` is installed (stopped
    with the world); and the banner's line saying which, or that checks are off and why."""
    url = worker.prometheus_url or (world.prometheus.url if world.prometheus else None)
    if url is None:
        try:
            url = (await world.start_prometheus()).url
        except PrometheusUnavailableError as exc:
            return worker, (
                f"Health checks: off ({exc}; or give --prometheus-url); a policy's checks then"
                " meet its onPrometheusError"
            )
    said = f"Prometheus: {url} (the policies' health checks ask it; docs: Health checks)"
    return dataclasses.replace(worker, prometheus_url=url), said


async def _run_fleet(args: argparse.Namespace, held: localrun.Claim, scenario: Scenario) -> None:
    """``run --play`` of a fleet: one Temporal, a simulated cluster per cluster of the story,
    each with its own engine (its worker a child process, its intake in this one), as a fleet
    runs in production."""
    data_dir = Path(args.data_dir)
    stop = stop_on_signals()
    telemetry.console_quiet(data_dir / "rollback.log")
    kept = _fresh_history(data_dir, args.port)
    if kept is not None:
        _print_line(f"A fresh demo: the last run's Temporal history is kept in {kept}")
    world = World(scenario, _print_line, data_dir, temporal_port=args.port, ui=True)
    intake = IntakeConfig.from_args(args, {**os.environ, "ROLLBACK_CLUSTER": world.first.name})
    try:
        await world.start()
        kubeconfig = _prepare(world, data_dir, intake.lease_namespace)
        names = tuple(m.name for m in world.members)
        held.publish(_published(data_dir, world.temporal, world.task_queue, str(kubeconfig), names))
        ctl, kubectl = rollbackctl(), rollbackctl("kubectl")
        ui = f"http://127.0.0.1:{world.temporal.ui_port}"
        first = next(iter(scenario.expect))
        theirs = ui_list(ui, f'RollbackCluster = "{names[0]}"')
        print(
            f"\nrightsizing-rollback is running a fleet: clusters {', '.join(names)} on one"
            f" Temporal {world.temporal.address}, Web UI {ui}, playing {scenario.name}.\n"
            f"Look with: {ctl} get   |   {ctl} describe {first}\n"
            f"kubectl: export KUBECONFIG={kubeconfig}   (then: {kubectl} --context {names[1]}"
            " get deploy -A)\n"
            f"Logs: {data_dir / 'rollback.log'}, {data_dir}/worker-<cluster>.log (engines),"
            f" {data_dir / 'temporal.log'} (Temporal)\n"
            f"In the UI, {names[0]}'s attempts:"
            f" {theirs}  Ctrl-C stops.\n",
            flush=True,
        )
        await play(world)
        await stop.wait()
    finally:
        await world.stop()


async def _run_on_cluster(
    args: argparse.Namespace,
    held: localrun.Claim,
    worker: WorkerConfig,
    intake: IntakeConfig,
) -> None:
    """``run`` against the cluster of a kubeconfig; its own dev server unless --address."""
    data_dir = Path(args.data_dir)
    stop = stop_on_signals()
    server = None
    temporal = worker.temporal
    if not args.address:
        server = DevServer(data_dir / "temporal", args.port, log_path=data_dir / "temporal.log")
        await asyncio.to_thread(server.start)
        temporal = TemporalConfig.at(server.address, temporal.task_queue, worker.cluster)
    try:
        held.publish(
            _published(
                data_dir, server, temporal.task_queue, None, (worker.cluster,), temporal.address
            )
        )
        if server is not None:
            _banner(server, "cluster from your kubeconfig", worker, "NAMESPACE/KIND/NAME")
        await serve(
            stop,
            dataclasses.replace(worker, temporal=temporal),
            dataclasses.replace(intake, temporal=temporal),
        )
    finally:
        if server is not None:
            await asyncio.to_thread(server.stop)


async def _first(work: Awaitable[object], engine: asyncio.Task[None]) -> None:
    """``work``, unless the engine ends first (it failed: its error is raised here)."""
    task = asyncio.ensure_future(work)
    await asyncio.wait({task, engine}, return_when=asyncio.FIRST_COMPLETED)
    if not task.done():
        task.cancel()
        engine.result()  # raises what stopped the engine
        raise RuntimeError("the worker and intake stopped")


def _published(
    data_dir: Path,
    server: DevServer | None,
    task_queue: str,
    kubeconfig: str | None,
    clusters: tuple[str, ...],
    address: str | None = None,
) -> localrun.LocalRun:
    ui = f"http://127.0.0.1:{server.ui_port}" if server is not None and server.ui_port else None
    return localrun.LocalRun(
        pid=os.getpid(),
        data_dir=str(data_dir.resolve()),
        temporal=address or (server.address if server else ""),
        task_queue=task_queue,
        ui=ui,
        kubeconfig=kubeconfig,
        clusters=clusters,
    )


def rollbackctl(name: str = "rollbackctl") -> str:
    """How to call a command of this installation (rollbackctl, the kubectl its extras bring)
    from this shell: by name when that is this installation's, else by its path (``make run``
    installs into .venv, which is not on PATH); a kubectl found elsewhere by name."""
    mine = Path(sys.executable).parent / name
    found = shutil.which(name)
    if found is not None and (not mine.exists() or Path(found).resolve() == mine.resolve()):
        return name
    return os.path.relpath(mine) if mine.is_relative_to(Path.cwd()) else str(mine)


def _fresh_history(data_dir: Path, port: int) -> Path | None:
    """The simulated cluster lives as long as one run, so its Temporal history does too: a
    restart does not pile the demo's runs on the last ones. The last history is kept beside
    (``temporal.previous``); the one before it is dropped."""
    current = data_dir / "temporal"
    if not current.exists():
        return None
    ensure_port_free(port)  # not the history of a server that is still running
    previous = data_dir / "temporal.previous"
    shutil.rmtree(previous, ignore_errors=True)
    current.rename(previous)
    return previous


FAILED_QUERY = 'RollbackMode = "failedPermanent"'


def ui_list(ui: str, query: str, namespace: str = "default") -> str:
    """A link to the Temporal UI's workflow list filtered by ``query`` (a saved query: open it,
    or bookmark it)."""
    return f"{ui}/namespaces/{namespace}/workflows?query={urllib.parse.quote(query, safe='')}"


def _banner(
    server: DevServer, cluster: str, worker: WorkerConfig, workload: str, *more: str
) -> None:
    """What is running and the commands to look at it, each as this shell can run it."""
    ui = f"http://127.0.0.1:{server.ui_port}" if server.ui_port else "(headless)"
    ctl = rollbackctl()
    serving = []
    if worker.kube.metrics_address:
        serving.append(f"metrics: http://{worker.kube.metrics_address}/metrics")
    if worker.kube.health_address:
        serving.append(f"health: http://{worker.kube.health_address}/readyz")
    receivers = len(worker.notifications.receivers)
    if receivers:
        serving.append(f"notifications: {receivers} receiver(s)")
    lines = [*more, *(["Also serving " + ", ".join(serving)] if serving else [])]
    if server.ui_port:
        lines.append(f"In the UI, the failed ones: {ui_list(ui, FAILED_QUERY)}")
    extra = "".join(f"{line}\n" for line in lines)
    print(
        f"\nrightsizing-rollback is running: Temporal {server.address}, Web UI {ui}, {cluster}.\n"
        f"Look with: {ctl} get   |   {ctl} describe {workload}\n{extra}Ctrl-C stops.\n",
        flush=True,
    )


def _print_line(line: str) -> None:
    print(f"\r{line}", flush=True)


def _progress(elapsed: float, total: float) -> None:
    sys.stderr.write(f"\r[{elapsed:5.1f}s / {total:.0f}s] waiting for the expected outcome...")
    sys.stderr.flush()
