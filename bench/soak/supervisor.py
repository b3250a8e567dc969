"""The soak's engine as production runs it: two workers and two intakes as separate processes
(``Child``: SIGKILLable, restartable, its peak RSS sampled), and the notification receiver
they post to (``Receiver``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import yaml

from bench.memory import memory_mib
from sim.devserver import die_with_parent
from workflows.contract import Obj
from workflows.notify import IDEMPOTENCY_HEADER

KUBE_TIMEOUT = 3.0
# The intakes wait longer on the API server: in the Lease cut a renewal hangs that long, so the
# cut-off leader's elector is stuck past the Lease's expiry (15 s) and only the fence (its
# renew deadline, 10 s, on its own clock) keeps its other threads from acting.
INTAKE_KUBE_TIMEOUT = 20.0
MIN_READY = "2s"  # the workers' --min-ready-duration


class Child:
    """A process of the engine (a worker or an intake), SIGKILLable and restartable."""

    def __init__(self, name: str, command: list[str], log: Path) -> None:
        self.name, self.command, self.log = name, command, log
        self.process: subprocess.Popen[bytes] | None = None
        self.peak_rss_mib = 0.0

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                die_with_parent(self.command), stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )  # fmt: skip

    def sample_rss(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.peak_rss_mib = max(self.peak_rss_mib, peak_rss(self.process.pid))

    def kill(self) -> None:
        self.sample_rss()
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        self.sample_rss()
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()


def peak_rss(pid: int) -> float:
    """VmHWM of ``pid`` in MiB (Linux), 0 when it is gone."""
    try:
        return memory_mib(pid, "VmHWM")
    except OSError:
        return 0.0


class Receiver(BaseHTTPRequestHandler):
    """The notification receiver: every POST, with its idempotency key."""

    received: ClassVar[list[tuple[str, Obj]]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.received.append((self.headers.get(IDEMPOTENCY_HEADER, ""), body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *_: object) -> None:
        pass


def start_engine(
    workdir: Path,
    cluster: str,
    address: str,
    kube_url: str,
    queue: str,
    in_place: bool,
    storm_breaker: str,
) -> tuple[dict[str, Child], ThreadingHTTPServer]:
    """The engine's four processes, started, and the receiver they notify (its own file: a
    fleet's clusters share the work directory, and a worker restarted after another cluster
    wrote a shared one would notify that cluster's receiver); the intakes' ``storm_breaker``
    (``--storm-breaker``)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    receivers = workdir / f"receivers-{cluster}.yaml"
    url = f"http://127.0.0.1:{server.server_port}/"
    receivers.write_text(
        yaml.safe_dump({"receivers": [{"name": "soak", "minSeverity": "info", "url": url}]})
    )
    common = ["--cluster", cluster, "--address", address, "--task-queue", queue,
              "--kube-url", kube_url]  # fmt: skip
    # The soak's windows are seconds long: a pod restarted by an in-place resize must not
    # need Kubex's default 10 s of Ready, longer than the 8 s window, to count.
    actuation = ["--min-ready-duration", MIN_READY, *(["--actuation", "in-place"] * in_place)]
    children = {
        name: Child(
            name,
            [sys.executable, "-m", "worker", *common, "--kube-timeout", str(KUBE_TIMEOUT),
             *actuation, "--notifications", str(receivers)],
            workdir / f"{cluster}-{name}.log",
        )
        for name in ("worker-a", "worker-b")
    } | {
        name: Child(
            name,
            [sys.executable, "-m", "cli.main", "intake", *common, "--identity", name,
             "--kube-timeout", str(INTAKE_KUBE_TIMEOUT), "--lease-namespace", "default",
             "--storm-breaker", storm_breaker],
            workdir / f"{cluster}-{name}.log",
        )
        for name in ("intake-a", "intake-b")
    }  # fmt: skip
    for child in children.values():
        child.start()
    return children, server
