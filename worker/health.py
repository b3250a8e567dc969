"""Honest liveness and readiness: ``/livez`` and ``/readyz`` on ``--health-address``.

Each process registers named checks that return ``None`` when fine, or why not; an endpoint
answers 200 ``ok`` when all of its checks pass, else 503 with one line per failing check. The
checks read state the components keep anyway (threads, informer progress, the worker's run,
the last Temporal health check), so a probe never calls the API server or Temporal itself.

- intake, live: the leader-election thread runs; while leading, every informer thread runs and
  none has failed without a break for ``STUCK_AFTER``. Ready: a standby is ready (it can take
  over); a leader once every informer has synced and none is failing right now.
- worker, live: the Temporal worker is running (its pollers have not stopped on a fatal error).
  Ready: also, Temporal answered its last health check (every ``TEMPORAL_CHECK_EVERY``).

docs/operating/install.md, "Deploy and operate", says how the manifests probe them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

log = logging.getLogger(__name__)

Check = Callable[[], str | None]


class Health:
    def __init__(self) -> None:
        self._checks: dict[str, dict[str, Check]] = {"/livez": {}, "/readyz": {}}
        self._server: ThreadingHTTPServer | None = None

    def live(self, name: str, check: Check) -> None:
        """A liveness check is a readiness check too: what is not alive is not ready."""
        self._checks["/livez"][name] = check
        self._checks["/readyz"][name] = check

    def ready(self, name: str, check: Check) -> None:
        self._checks["/readyz"][name] = check

    def report(self, path: str) -> tuple[bool, str]:
        failing = []
        for name, check in self._checks[path].items():
            try:
                problem = check()
            except Exception as exc:  # a broken check is a failing check, not a crash
                problem = f"check raised {exc!r}"
            if problem:
                failing.append(f"{name}: {problem}")
        return not failing, "\n".join(failing) or "ok"

    def serve(self, address: str) -> Health:
        host, _, port = address.rpartition(":")
        health = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path not in health._checks:
                    self.send_error(404)
                    return
                ok, body = health.report(self.path)
                data = (body + "\n").encode()
                self.send_response(200 if ok else 503)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:
                return  # probes every few seconds: not worth a log line each

        self._server = ThreadingHTTPServer((host or "0.0.0.0", int(port)), Handler)
        threading.Thread(target=self._server.serve_forever, name="health", daemon=True).start()
        log.info("health on http://%s/livez and /readyz", address)
        return self

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.server_address[1])

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
