"""``rollbackctl run|demo|simulate|dev-server``: everything that runs on one machine.

These commands use the simulated cluster and the embedded Temporal dev server (package
``sim``), which the production install does not carry: ``cli.main`` imports this module only
when one of them is asked for.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
from pathlib import Path

import yaml
from pydantic import ValidationError

from cli.crds import CRDS
from sim.devserver import DevServer, DevServerError, ensure_port_free
from sim.report import render as render_report
from sim.scenario import SCENARIOS, Scenario, World, play, run_scenario, write_kubeconfig
from worker import telemetry
from worker.config import IntakeConfig, WorkerConfig
from worker.process import serve, stop_on_signals

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


def cmd_simulate(args: argparse.Namespace) -> int:
    try:
        scenario = Scenario.load(args.scenario)
    except ValidationError as exc:  # one line per problem, with its path
        for error in exc.errors():
            where = ".".join(str(p) for p in error["loc"])
            print(f"{args.scenario}: {where}: {error['msg']}", file=sys.stderr)
        return 1
    except (OSError, ValueError, yaml.YAMLError) as exc:
        print(f"{args.scenario}: {exc}", file=sys.stderr)
        return 1
    if getattr(args, "validate", False):
        print(
            f"{args.scenario}: valid scenario {scenario.name}: {len(scenario.workloads)}"
            f" workload(s), {len(scenario.steps)} step(s), {len(scenario.expect)} expectation(s)"
        )
        return 0
    quiet = args.output in ("json", "html")
    report = asyncio.run(
        run_scenario(
            scenario,
            on_line=(lambda _: None) if quiet else _print_line,
            on_progress=None if quiet or not sys.stderr.isatty() else _progress,
        )
    )
    if args.report:
        Path(args.report).write_text(render_report(report, scenario), encoding="utf-8")
    if args.output == "html":
        print(render_report(report, scenario))
    elif quiet:
        print(json.dumps(report.as_json(), indent=2))
    else:
        verdict = "PASSED" if report.passed else "FAILED"
        print(f"\n{scenario.name}: {verdict} in {report.duration:.1f}s")
        for line in report.explain():
            print(f"  {line}")
    return 0 if report.passed else 1


def cmd_demo(args: argparse.Namespace) -> int:
    print(f"Demo: {DEMO.name} — {Scenario.load(DEMO).description.strip()}\n")
    args.scenario, args.output = str(DEMO), "text"
    return cmd_simulate(args)


def cmd_run(args: argparse.Namespace) -> int:
    """The embedded default: Temporal dev server + worker + intake, against a cluster or the
    simulated one (with the demo scenario playing)."""
    data_dir = Path(args.data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    worker = WorkerConfig.from_args(args)

    async def simulated() -> None:
        stop = stop_on_signals()
        telemetry.console_quiet(data_dir / "rollback.log")  # the timeline is what you watch
        kept = _fresh_history(data_dir, args.port)
        if kept is not None:
            _print_line(f"A fresh demo: the last run's Temporal history is kept in {kept}")
        world = World(
            Scenario.load(DEMO),
            _print_line,
            data_dir,
            temporal_port=args.port,
            ui=True,
            task_queue=worker.temporal.task_queue,
        )
        try:
            await world.start()
            for crd in CRDS.values():  # as installed on a cluster: kubectl reads their columns
                world.api.store.create(crd)
            kubeconfig = write_kubeconfig(data_dir.resolve() / "kubeconfig", world.api.url)
            _banner(
                world.temporal,
                f"simulated cluster at {world.api.url} playing {DEMO.name}",
                f"kubectl: export KUBECONFIG={kubeconfig}   (then: kubectl get deploy,rbp -A)",
            )
            await play(world)
            await stop.wait()
        finally:
            await world.stop()

    async def real() -> None:
        stop = stop_on_signals()
        server = None
        if not args.address:
            server = DevServer(data_dir / "temporal", args.port, log_path=data_dir / "temporal.log")
            await asyncio.to_thread(server.start)
            args.address = server.address
        try:
            if server is not None:
                _banner(server, "cluster from your kubeconfig")
            await serve(stop, WorkerConfig.from_args(args), IntakeConfig.from_args(args))
        finally:
            if server is not None:
                await asyncio.to_thread(server.stop)

    try:
        asyncio.run(simulated() if worker.kube.simulated else real())
    except DevServerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def rollbackctl() -> str:
    """How to call rollbackctl from this shell: by name when that is this installation's, else
    by its path (``make run`` installs into .venv, which is not on PATH)."""
    mine = Path(sys.executable).parent / "rollbackctl"
    found = shutil.which("rollbackctl")
    if found is not None and Path(found).resolve() == mine.resolve():
        return "rollbackctl"
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


def _banner(server: DevServer, cluster: str, *more: str) -> None:
    ui = f"http://127.0.0.1:{server.ui_port}" if server.ui_port else "(headless)"
    ctl = rollbackctl()
    extra = "".join(f"{line}\n" for line in more)
    print(
        f"\nrightsizing-rollback is running: Temporal {server.address}, Web UI {ui}, {cluster}.\n"
        f"Look with: {ctl} get   |   {ctl} describe NAMESPACE/KIND/NAME\n{extra}"
        'In the UI: filter with RollbackMode = "failedPermanent". Ctrl-C stops.\n',
        flush=True,
    )


def _print_line(line: str) -> None:
    print(f"\r{line}", flush=True)


def _progress(elapsed: float, total: float) -> None:
    sys.stderr.write(f"\r[{elapsed:5.1f}s / {total:.0f}s] waiting for the expected outcome...")
    sys.stderr.flush()
