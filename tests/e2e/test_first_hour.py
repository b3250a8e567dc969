"""The first hour, as a person meets it, as one story: every command the README's quickstart
and ``make run``'s banner print is taken from them (parsed, not copied here) and run exactly as
printed, in a fresh clone, against that clone's ``make run``; any non-zero exit or traceback
fails the test.

The clone shares this suite's virtualenv (its ``pyproject.toml`` is dated older than the
install stamp, so ``make run`` does not reinstall): what it checks is the commands, not pip.

Also here, each once, what broke when the commands were used together (issue "the first hour"):
an exported kubeconfig of an earlier simulated cluster does not pass for a real cluster; a second
``run`` on the same data directory is refused and leaves the first one working; ``run
--notifications FILE --metrics-address ADDR`` on the simulated cluster delivers to a local
receiver and serves metrics; an unreachable Temporal and an unknown ``--mode`` are refused in
one line.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from cli.localrun import write_kubeconfig
from sim.apiserver import free_port
from tests.conftest import ROOT, chromium, measure_report, overlapping

VENV = Path(sys.executable).parent.parent
TIMEOUT = 90.0  # seconds any one wait of this story may take


def readme_commands() -> tuple[list[str], list[str]]:
    """The README's first two commands (set up and run; test), and its "Things to try"."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    first = re.search(r"```bash\n(.*?)```", text, re.S)
    assert first is not None, "the README starts with a bash block of two commands"
    setup = [line.split("#")[0].strip() for line in first[1].splitlines() if line.strip()]
    tries = re.search(r"### Things to try.*?```console\n(.*?)```", text, re.S)
    assert tries is not None, "the README has a Things to try block"
    return setup, [line[2:] for line in tries[1].splitlines() if line.startswith("$ ")]


def docs_examples() -> dict[str, list[str]]:
    """The commands the getting-started page shows with their output, and that output."""
    text = (ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8")
    shown: dict[str, list[str]] = {}
    for block in re.findall(r"## What the commands show.*?```console\n(.*?)```", text, re.S):
        for part in re.split(r"^\$ ", block, flags=re.M)[1:]:
            command, *output = part.splitlines()
            shown[command] = [line for line in output if line.strip()]
    assert shown, "docs/getting-started.md shows command output"
    return shown


def _same_shape(shown: list[str], real: str, command: str) -> None:
    """Every heading row the page shows is in the real output, column for column, and every
    other line's first field (a label, a namespace, an age: digits aside) starts a real line."""

    def key(line: str) -> str:
        return re.sub(r"\d+", "0", re.split(r":|\s{2,}", line.strip())[0])

    lines = [line for line in real.splitlines() if line.strip()]
    headings = {" ".join(line.split()) for line in lines}
    keys = {key(line) for line in lines}
    for line in shown:
        if line == line.upper() and re.search("[A-Z]{2}", line):
            assert " ".join(line.split()) in headings, (command, line, real)
        assert key(line) in keys, (command, line, real)


class Shell:
    """What a person's shell keeps between commands: the directory and the exports."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.cwd, self.env = cwd, env
        self.ran: list[tuple[str, str]] = []

    def run(self, command: str, expect: int = 0, timeout: float = 180) -> str:
        if command.startswith("export "):
            name, value = command.removeprefix("export ").split("=", 1)
            expanded = subprocess.run(
                ["bash", "-c", f'printf %s "{value}"'], cwd=self.cwd, env=self.env,
                capture_output=True, text=True, check=True,
            ).stdout  # fmt: skip
            self.env[name] = expanded
            return ""
        done = subprocess.run(
            ["bash", "-c", command], cwd=self.cwd, env=self.env, capture_output=True, text=True,
            timeout=timeout, check=False, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        output = done.stdout + done.stderr
        self.ran.append((command, output))
        assert done.returncode == expect, f"{command}: exit {done.returncode}\n{output[-3000:]}"
        assert "Traceback" not in output, f"{command}:\n{output[-3000:]}"
        return output


class Process:
    """A long-running command (``make run``), its output read line by line."""

    def __init__(self, command: list[str], cwd: Path, env: dict[str, str]) -> None:
        self.process: subprocess.Popen[str] = subprocess.Popen(
            command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, start_new_session=True, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._queue.put(line)
        self._queue.put(None)

    def wait_for(self, pattern: str) -> str:
        """The first line (seen so far or next) that contains ``pattern``."""
        for line in self.lines:
            if pattern in line:
                return line
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            try:
                got = self._queue.get(timeout=1)
            except queue.Empty:
                continue
            if got is None:
                break
            self.lines.append(got)
            if pattern in got:
                return got
        raise AssertionError(f"never printed {pattern!r}:\n{''.join(self.lines)[-3000:]}")

    def ctrl_c(self) -> int:
        """What Ctrl-C in its terminal does: SIGINT to its whole process group."""
        os.killpg(self.process.pid, signal.SIGINT)
        code = self.process.wait(timeout=60)
        while (got := self._queue.get(timeout=10)) is not None:
            self.lines.append(got)
        return code

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


@pytest.fixture
def clone(tmp_path: Path) -> Iterator[Path]:
    """A fresh clone of this repository whose setup is done (this suite's virtualenv)."""
    target = tmp_path / "rightsizing-rollback"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(target)], check=True)
    (target / ".venv").symlink_to(VENV)
    os.utime(target / "pyproject.toml", (0, 0))  # older than the install stamp: no reinstall
    yield target
    shutil.rmtree(target / ".rollback-data", ignore_errors=True)


def _env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TEMPORAL_", "ROLLBACK_", "VIRTUAL_ENV")) and k != "KUBECONFIG"
    }
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


def test_the_first_hour_as_printed(clone: Path) -> None:
    setup, tries = readme_commands()
    assert setup[0] == "make run" and setup[1] == "make test"
    # Point 4: the shell still exports the kubeconfig of an earlier, dead, simulated cluster.
    (clone / ".rollback-data").mkdir()
    stale = write_kubeconfig(clone / ".rollback-data" / "kubeconfig", "http://127.0.0.1:9")
    run = Process(["bash", "-c", setup[0]], clone, _env(KUBECONFIG=str(stale)))
    try:
        banner = run.wait_for("Look with:")
        assert "simulated cluster sim at" in run.wait_for("is running")
        run.wait_for("-> failedPermanent turn 2")
        look = [c.strip() for c in banner.split("Look with:", 1)[1].split("|")]
        kubectl_line = run.wait_for("kubectl: export KUBECONFIG=")
        found = re.match(r"kubectl: (export \S+)\s+\(then: (.+)\)", kubectl_line.strip())
        assert found is not None, kubectl_line

        _banner_commands(clone, look, found[1], found[2])
        # The banner's link to the failed attempts: the Temporal UI's list, filtered, lists it.
        link = run.wait_for("In the UI, the failed ones: ").split(": ", 1)[1].strip()
        listed = Shell(clone, _env()).run(
            f"{chromium()} --headless --no-sandbox --disable-gpu --virtual-time-budget=10000"
            f" --dump-dom '{link}' 2>/dev/null"
        )
        assert "rollback/sim/shop/Deployment/api" in listed, listed[-2000:]
        # The Prometheus it started, which the health checks ask, answers.
        prometheus = run.wait_for("Prometheus: http").split("Prometheus: ", 1)[1].split()[0]
        with urllib.request.urlopen(f"{prometheus}/api/v1/query?query=up", timeout=10) as r:
            assert json.loads(r.read())["status"] == "success"
        shell = _things_to_try(clone, tries, run)
        _used_together(shell)
        _docs_demo_blocks(shell)
    finally:
        code = run.ctrl_c() if run.process.poll() is None else run.process.returncode
        run.kill()
    output = "".join(run.lines)
    assert "Traceback" not in output, output[-3000:]
    assert code in (0, -signal.SIGINT, 2), output[-3000:]  # make reports an interrupt as 2
    assert "Stopped." in output, output[-2000:]  # rollbackctl itself shut down cleanly
    assert "Traceback" not in (clone / ".rollback-data" / "rollback.log").read_text()


def _banner_commands(clone: Path, look: list[str], export: str, kubectl: str) -> None:
    """The banner's commands, as printed, in a shell without KUBECONFIG (point 5)."""
    shell = Shell(clone, _env())
    listed = shell.run(look[0])
    assert re.search(r"shop\s+Deployment/api\s+failedPermanent\s+2", listed), listed
    described = shell.run(look[1])
    now = next(line for line in described.splitlines() if line.startswith("Cohort now:"))
    verdict = next(line for line in described.splitlines() if line.startswith("At verdict:"))
    # Point 6: what was true at the verdict, and what is true now, apart.
    assert "3/3 pods OOMKilled" in verdict
    assert "3 pods (3 on app:" in now and "OOMKilled" not in now and "768Mi" in now, now
    # Point 7: why the pods' 768Mi sits beside the template's 1Gi.
    template = next(line for line in described.splitlines() if line.startswith("Template:"))
    assert "1Gi" in template and "annotation applier" in template, template
    shell.run(export)
    # The restored pods come back once their restart backoff (from the cut's OOM kills) ends,
    # as a kubelet's do: wait for the Deployment to say so, then look.
    binary = kubectl.split(maxsplit=1)[0]
    shell.run(f"{binary} wait deploy/api -n shop --for=condition=Available --timeout=90s")
    deployed = shell.run(kubectl)
    assert re.search(r"NAME\s+READY\s+UP-TO-DATE\s+AVAILABLE\s+AGE", deployed), deployed
    assert re.search(r"deployment\.apps/api\s+3/3\s+3\s+3", deployed), deployed


def _things_to_try(clone: Path, tries: list[str], run: Process) -> Shell:
    """The README's "Things to try", line by line, as a person with .venv activated."""
    shell = Shell(clone, _env(PATH=f"{clone / '.venv' / 'bin'}:{os.environ['PATH']}"))
    said = {command: shell.run(command) for command in tries}
    for command, shown in docs_examples().items():
        _same_shape(shown, said[command], command)
    events = said["kubectl get events -n shop"]
    assert re.match(r"LAST SEEN\s+TYPE\s+REASON\s+OBJECT\s+MESSAGE", events), events
    assert "RollbackBackoffExhausted" in events and "deployment/api" in events
    assert re.search(r"pod/api-\S+\s+1/1\s+Running", said["kubectl get deploy,pods,rbp -A"])
    assert "How long to wait between turns" in said["kubectl explain rbp.spec.backoff"]
    assert re.search(r"shop-rollback\s+True", said["rollbackctl get policies"])
    assert "reopened, turn 1" in said["rollbackctl reopen shop/Deployment/api"]
    assert "PASSED" in said["rollbackctl simulate success"]
    demo = said["rollbackctl demo"]
    assert "oom-rollback: PASSED" in demo and " INFO " not in demo  # points 1, 11
    page = shell.run(f"{chromium()} --headless --no-sandbox --disable-gpu --dump-dom"
                     " file://$PWD/story.html 2>/dev/null")  # fmt: skip
    assert 'data-ready="yes"' in page and 'data-lanes="1"' in page
    assert re.search(r'data-pods="[1-9]', page) and "RollbackBackoffExhausted" in page
    # The story as it happened: the pods' resources as they changed (the demo's cut, then the
    # rollback, resized in place), the verdict's numbers, no label over another.
    shown = measure_report(clone / "story.html")
    (lane,) = shown["lanes"]
    assert overlapping(lane["labels"]) == [] and any(
        "adopted and healthy" in text for text, _ in lane["labels"]
    ), lane["labels"]
    assert any(len({t for t, *_ in pod["spans"] if t}) >= 2 for pod in shown["pods"]), shown["pods"]
    # The retry the README suggests really runs: turn 1 again, visible in the timeline.
    run.wait_for("Retrying (after failedPermanent)")
    return shell


def docs_demo_commands() -> list[str]:
    """Every command of the docs' console blocks marked ``demo-runs``, page by page, in order."""
    commands = []
    for page in sorted((ROOT / "docs").rglob("*.md")):
        text = page.read_text(encoding="utf-8")
        for block in re.findall(r"<!-- demo-runs.*?-->\s*```console\n(.*?)```", text, re.S):
            joined = re.sub(r"\\\n\s*", "", block)  # a command continued on the next line
            lines = [line.strip() for line in joined.splitlines()]
            commands += [line[2:] for line in lines if line.startswith("$ ")]
    return commands


def _docs_demo_blocks(shell: Shell) -> None:
    """The docs' commands the demo can run (a how-to's steps), as printed, in the shell the
    README's commands left (its exports)."""
    commands = docs_demo_commands()
    assert any("pause-until=infinite" in c for c in commands), commands
    said = {command: shell.run(command) for command in commands}
    # The incident how-to, through the kubectl plugin: the pause written, what it covers said.
    paused = said['kubectl rollback pause namespace/shop --reason "incident 4711"']
    assert "namespace/shop paused until infinite: incident 4711" in paused, paused
    listed = said["kubectl rollback get pauses -n shop"]
    assert re.search(r"namespace/shop\s+infinite\s+incident 4711\s+in force", listed), listed
    held = said["kubectl rollback get -n shop --held -o wide"]
    assert "NAMESPACE" in held or "No rollback workflows found." in held, held
    # The health checks' how-to: the policy taken, the engine says it will ask Prometheus.
    asked = said[
        "kubectl wait rbp/shop-rollback -n shop --for=condition=HealthChecksAsked --timeout=60s"
    ]
    assert "condition met" in asked, asked


def _used_together(shell: Shell) -> None:
    """What broke when the commands met: a second run, an unknown mode, no Temporal."""
    # Point 3: a second run on the same data directory is refused, naming the first ...
    second = shell.run(f"rollbackctl run --port {free_port()}", expect=1)
    assert "another rollbackctl run (pid" in second and "--data-dir" in second, second
    # ... and the first one still answers, through its kubeconfig.
    assert "deployment.apps/api" in shell.run("kubectl get deploy -A -o name")
    # Points 9, 10: one line for an unknown mode and for a Temporal that is not there.
    unknown = shell.run("rollbackctl get --mode failed", expect=2)
    assert "invalid choice: 'failed'" in unknown
    away = shell.run(f"rollbackctl get --address 127.0.0.1:{free_port()}", expect=1)
    assert "(connection refused): is `make run`" in away and "tonic" not in away, away


class Receiver(BaseHTTPRequestHandler):
    received: queue.Queue[dict[str, object]] = queue.Queue()

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.put(json.loads(body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *_: object) -> None:
        pass


def test_run_honours_notifications_and_metrics_on_the_simulated_cluster(clone: Path) -> None:
    """``rollbackctl run --notifications FILE --metrics-address ADDR``, the obvious way to try
    them locally: the rollback reaches the receiver, the metrics endpoint answers."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    receivers = clone / "receivers.yaml"
    receivers.write_text(
        f"receivers:\n  - name: local\n    url: http://127.0.0.1:{server.server_port}/hook\n"
    )
    metrics = f"127.0.0.1:{free_port()}"
    command = [str(clone / ".venv" / "bin" / "rollbackctl"), "run", "--port", str(free_port()),
               "--notifications", str(receivers), "--metrics-address", metrics]  # fmt: skip
    run = Process(command, clone, _env())
    try:
        assert f"metrics: http://{metrics}/metrics" in run.wait_for("Also serving")
        run.wait_for("-> rollingBack turn 1")
        sent = Receiver.received.get(timeout=TIMEOUT)
        assert sent["transition"] == "rollingBack" and sent["owner"] == {
            "namespace": "shop", "kind": "Deployment", "name": "api"
        }  # fmt: skip
        # The send's outcome is counted once its activity returns, just after the receiver
        # answered: read until it shows (bounded), as Prometheus would on its next scrape.
        deadline, text = time.monotonic() + TIMEOUT, ""
        while 'outcome="sent"' not in text and time.monotonic() < deadline:
            with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10) as answer:
                text = answer.read().decode()
            time.sleep(0.2)
        assert 'rollback_transitions{mode="rollingBack"' in text, text[-2000:]
        assert re.search(r'rollback_notifications\{[^}]*outcome="sent"', text), text[-2000:]
        # A flag this mode cannot honour is refused, not dropped.
        refused = Shell(clone, _env()).run(
            f"{command[0]} run --data-dir other --address 127.0.0.1:7233", expect=2
        )
        assert "--address: run without a cluster starts its own Temporal" in refused
    finally:
        code = run.ctrl_c() if run.process.poll() is None else run.process.returncode
        run.kill()
        server.shutdown()
    assert code == 0 and "Traceback" not in "".join(run.lines), "".join(run.lines)[-3000:]
