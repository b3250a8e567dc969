"""Processes starting while Temporal is away wait for it (``TemporalConfig.connect_patiently``)."""

from __future__ import annotations

import asyncio
import socket
import sys
import tempfile
import time
from pathlib import Path

import pytest

from cli.local import rollbackctl
from cli.main import main
from sim.apiserver import free_port
from sim.devserver import DevServer
from worker.config import TemporalConfig


async def test_connect_waits_for_a_temporal_server_that_comes_up_later() -> None:
    port = free_port()
    config = TemporalConfig.at(f"127.0.0.1:{port}")
    with tempfile.TemporaryDirectory() as tmp:
        server = DevServer(Path(tmp), port, headless=True, log_path=Path(tmp) / "log")

        async def start_later() -> None:
            await asyncio.sleep(1.5)
            await asyncio.to_thread(server.start)

        starting = asyncio.create_task(start_later())
        try:
            client = await config.connect_patiently(within=60)
            await starting
            assert (await client.count_workflows()).count == 0
        finally:
            await asyncio.to_thread(server.stop)


async def test_connect_gives_up_after_its_patience() -> None:
    config = TemporalConfig.at(f"127.0.0.1:{free_port()}")
    started = time.monotonic()
    with pytest.raises(RuntimeError):
        await config.connect_patiently(within=1.0)
    assert time.monotonic() - started < 10


@pytest.mark.parametrize("command", ["dev-server", "run"])
def test_a_port_in_use_is_one_line_naming_the_port_and_the_flag(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A second `make run` (or any Temporal already on the port): one line and exit 1, not the
    traceback it used to be."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = main([command, "--port", str(port), "--data-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    assert f"error: port {port} is already in use" in err and "--port" in err


def test_the_banner_names_rollbackctl_as_it_can_be_called(monkeypatch: pytest.MonkeyPatch) -> None:
    """`make run` installs into .venv, which is not on PATH: the banner said `rollbackctl get`,
    "command not found" on a fresh machine. Now it names the command as this shell can run it."""
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    ctl = rollbackctl()
    assert ctl != "rollbackctl" and Path(ctl).name == "rollbackctl" and Path(ctl).exists()
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:/usr/bin:/bin")
    assert rollbackctl() == "rollbackctl"
