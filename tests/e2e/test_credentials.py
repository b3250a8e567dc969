"""Credentials come from files and go nowhere else: not into the environment, the arguments or
the logs of a running worker (docs/operating/temporal.md, "Configure Temporal")."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from sim.apiserver import KubeEmulator, free_port

SECRET = "tmprl-api-key-5f1e0c9b"


def test_a_worker_with_an_api_key_file_shows_it_nowhere(tmp_path: Path) -> None:
    key = tmp_path / "api-key"
    key.write_text(SECRET + "\n")
    cert, private = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_text("-----BEGIN CERTIFICATE-----\ncert-body-7d2a\n-----END CERTIFICATE-----\n")
    private.write_text("-----BEGIN PRIVATE KEY-----\nkey-body-9c4b\n-----END PRIVATE KEY-----\n")
    log = tmp_path / "worker.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TEMPORAL_")} | {
        "TEMPORAL_API_KEY_FILE": str(key),
        "PYTHONUNBUFFERED": "1",
    }
    with KubeEmulator() as api, log.open("w") as out:
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "worker",
                "--cluster",
                "test",
                "--address",
                f"127.0.0.1:{free_port()}",  # nobody there: the worker keeps retrying, logging
                "--tls-cert",
                str(cert),
                "--tls-key",
                str(private),
                "--kube-url",
                api.url,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
        try:
            deadline = time.monotonic() + 30
            while "retrying" not in log.read_text() and time.monotonic() < deadline:
                time.sleep(0.2)
            proc = Path(f"/proc/{worker.pid}")
            environ = (proc / "environ").read_bytes().decode(errors="replace")
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
        finally:
            worker.terminate()
            worker.wait(30)
    logged = log.read_text()
    assert "retrying" in logged  # it did run and log its connection attempts
    for secret in (SECRET, "cert-body-7d2a", "key-body-9c4b"):
        assert secret not in environ, f"{secret} in the environment"
        assert secret not in cmdline, f"{secret} in the arguments"
        assert secret not in logged, f"{secret} in the logs"
