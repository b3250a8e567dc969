"""A real Prometheus (Debian's ``prometheus``) for the simulated cluster: it scrapes each
simulated node's cAdvisor metrics through the emulator's API server proxy
(``/api/v1/nodes/<node>/proxy/metrics/cadvisor``, as a cluster's Prometheus reaches kubelets),
every second, so the health checks (``activities.health``) have the series a real cluster's
would. ``rollbackctl run`` starts one when ``prometheus`` is installed; the tests do too."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml

from sim.apiserver import free_port
from sim.devserver import die_with_parent

INSTALL_HINT = "apt-get install prometheus (Debian, Ubuntu)"
SCRAPE_INTERVAL = 1  # seconds between scrapes (and rule evaluations)


class PrometheusUnavailableError(RuntimeError):
    """No ``prometheus`` binary here, or it did not become ready."""


class LocalPrometheus:
    def __init__(
        self, workdir: Path, scrape_configs: list[dict[str, Any]], rule_files: Sequence[Path] = ()
    ) -> None:
        """A Prometheus scraping ``scrape_configs`` every ``SCRAPE_INTERVAL``, with
        ``rule_files``."""
        binary = shutil.which("prometheus")
        if binary is None:
            raise PrometheusUnavailableError(f"prometheus is not installed: {INSTALL_HINT}")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        workdir.mkdir(parents=True, exist_ok=True)
        config = workdir / "prometheus.yml"
        config.write_text(
            yaml.safe_dump(
                {
                    "global": {
                        "scrape_interval": f"{SCRAPE_INTERVAL}s",
                        "evaluation_interval": f"{SCRAPE_INTERVAL}s",
                    },
                    "rule_files": [str(r) for r in rule_files],
                    "scrape_configs": scrape_configs,
                }
            )
        )
        self.log = workdir / "prometheus.log"
        self.process = subprocess.Popen(
            die_with_parent(  # a SIGKILLed rollbackctl run leaves no Prometheus behind
                [
                    binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={workdir / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                ]
            ),
            stdout=subprocess.DEVNULL,
            stderr=self.log.open("wb"),
        )

    @classmethod
    def of_kubelets(cls, workdir: Path, api_url: str, nodes: list[str]) -> LocalPrometheus:
        """Scraping each node's cAdvisor metrics through the API server at ``api_url``."""
        target = urlparse(api_url).netloc
        return cls(
            workdir,
            [
                {
                    "job_name": f"cadvisor-{node}",
                    "metrics_path": f"/api/v1/nodes/{node}/proxy/metrics/cadvisor",
                    "static_configs": [{"targets": [target]}],
                }
                for node in nodes
            ],
        )

    def get(self, path: str, **params: str) -> Any:
        """The HTTP API's answer to ``path`` with ``params``, as JSON."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=10) as response:
            return json.loads(response.read())

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def wait_ready(self, timeout: float = 30.0) -> LocalPrometheus:
        deadline = time.monotonic() + timeout
        while not self.ready():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise PrometheusUnavailableError(
                    f"prometheus did not become ready (its log: {self.log})"
                )
            time.sleep(0.2)
        return self

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
