"""A headless Chromium driven over the DevTools protocol, for pages read after a step (the
Temporal UI's list after its one-time column setup)."""

from __future__ import annotations

import itertools
import json
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
from typing import Any

import websocket  # websocket-client, which the kubernetes client brings

from tests.conftest import chromium


class Browser:
    def __init__(self) -> None:
        self.profile = tempfile.mkdtemp(prefix="chromium-")
        self.process = subprocess.Popen(
            [chromium(), "--headless", "--no-sandbox", "--disable-gpu",
             "--remote-debugging-port=0", f"--user-data-dir={self.profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.process.stderr is not None
        for line in self.process.stderr:
            if found := re.search(r"DevTools listening on ws://([^/]+)/", line):
                host = found[1]
                break
        with urllib.request.urlopen(f"http://{host}/json/list", timeout=10) as answer:
            page = next(t for t in json.loads(answer.read()) if t["type"] == "page")
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=30)
        self._ids = itertools.count(1)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        sent = next(self._ids)
        self.ws.send(json.dumps({"id": sent, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == sent:
                assert "error" not in message, message
                return message.get("result", {})

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result["result"].get("value")

    def goto(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def until(self, expression: str, timeout: float = 30) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.2)
        raise AssertionError(f"never true in the page: {expression}")

    def close(self) -> None:
        self.ws.close()
        self.process.kill()
        self.process.wait()
        shutil.rmtree(self.profile, ignore_errors=True)
