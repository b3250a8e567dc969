"""Notifications under faults, end to end: the real worker (a child process, SIGKILLed mid-send),
the real intake, the real Temporal dev server, the simulated cluster, and local HTTP receivers
that fail in each way a real one does. One OOM rollback story notifies two transitions
(``rollingBack``, then ``failedPermanent``) to every receiver."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from sim.apiserver import free_port
from sim.scenario import Apply, Scenario, Step, World
from tests.conftest import ROOT
from tests.e2e.test_policy_status import OOMS, deployment, rollback_policy, state, until
from worker.config import TemporalConfig
from workflows.contract import EventReason
from workflows.notify import IDEMPOTENCY_HEADER

NS = "shop"


class Receivers:
    """One aiohttp server, a path per kind of receiver; what each stored, and every request."""

    def __init__(self) -> None:
        self.stored: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.requests: dict[str, int] = defaultdict(int)
        self.keys_seen: dict[str, set[str]] = defaultdict(set)
        self.hang_started = asyncio.Event()
        self.released = asyncio.Event()  # set at teardown: a hanging answer need not be waited
        self.port = free_port()

    async def handle(self, request: web.Request) -> web.Response:
        kind = request.match_info["kind"]
        key = request.headers.get(IDEMPOTENCY_HEADER, "")
        body = await request.json()
        self.requests[kind] += 1
        first = key not in self.keys_seen[kind]
        self.keys_seen[kind].add(key)
        honours = kind != "plain" and not kind.endswith("-plain")
        if kind == "flaky" and first:
            return web.Response(status=500)  # not stored: the retry must store it
        if kind == "reject":
            return web.Response(status=400)  # refused for good: reported, not retried
        if kind == "hang" and first:
            self.hang_started.set()
            with contextlib.suppress(TimeoutError):  # the worker is killed meanwhile
                await asyncio.wait_for(self.released.wait(), 30)
            return web.Response(status=504)
        stored = self.stored[kind]
        if not honours or all(m["header"] != key for m in stored):
            stored.append(body | {"header": key})
        if kind.startswith("slow") and first:
            await asyncio.sleep(3)  # stored, but the answer comes after the client's timeout
        return web.Response(status=200)

    def url(self, kind: str) -> str:
        return f"http://127.0.0.1:{self.port}/{kind}"


@pytest.fixture
async def receivers() -> Any:
    found = Receivers()
    app = web.Application()
    app.router.add_post("/{kind}", found.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", found.port).start()
    yield found
    found.released.set()
    await runner.cleanup()


def config(receivers: Receivers, path: Path) -> Path:
    def webhook(kind: str, timeout: float = 1.0) -> dict[str, Any]:
        return {"name": kind, "url": receivers.url(kind), "timeoutSeconds": timeout}

    path.write_text(
        yaml.safe_dump(
            {
                "uiUrl": "http://localhost:8233",
                "receivers": [
                    webhook("honour"),
                    webhook("plain"),
                    webhook("flaky"),
                    webhook("slow"),
                    webhook("slow-plain"),
                    webhook("reject"),
                    webhook("hang", timeout=10.0),
                    {"name": "chat", "type": "slack", "url": receivers.url("slack")},
                    # Filtered out: only failures of another namespace, only critical ones here.
                    {"name": "elsewhere", "url": receivers.url("plain"), "namespaces": ["prod-*"]},
                    {"name": "pager", "url": receivers.url("pager"), "minSeverity": "critical"},
                ],
            }
        )
    )
    return path


async def test_each_transition_reaches_each_receiver_once(
    receivers: Receivers, monkeypatch: pytest.MonkeyPatch
) -> None:
    scenario = Scenario.model_validate(
        {
            "name": "notifications",
            "workloads": [deployment(NS)],
            "policies": [rollback_policy(NS)],
        }
    )
    with tempfile.TemporaryDirectory(prefix="rollback-notify-") as tmp:
        monkeypatch.setenv("ROLLBACK_NOTIFICATIONS", str(config(receivers, Path(tmp) / "n.yaml")))
        world = World(scenario, lambda line: None, Path(tmp))
        try:
            await world.start()
            await world.run_step(
                Step(apply=Apply(workload=f"{NS}/Deployment/api", requests=OOMS, limits=OOMS))
            )
            # The worker dies in the middle of a send; the attempt is retried on its successor.
            await asyncio.wait_for(receivers.hang_started.wait(), 60)
            await asyncio.sleep(0.5)
            assert world.worker is not None
            world.worker.kill()
            await asyncio.sleep(1)
            world.worker.start()
            # The rollback never waited on a receiver: it ended while one still held a send.
            await until(lambda: state(world, NS).get("mode") == "failedPermanent", 60)
            assert receivers.stored["hang"] == []

            expected = {
                "honour": 2,  # one per transition
                "plain": 2,  # no send to it timed out: no duplicate
                "flaky": 2,  # 500 first, stored on the retry
                "slow": 2,  # stored, timed out, retried: the key keeps it at one
                "slow-plain": 4,  # the same without the key: the one duplicate allowed
                "hang": 2,  # killed mid-send, retried by the next worker
                "slack": 2,
                "pager": 1,  # critical only: failedPermanent
            }
            with contextlib.suppress(TimeoutError):
                await until(lambda: {k: len(receivers.stored[k]) for k in expected} == expected, 90)
            assert {k: len(receivers.stored[k]) for k in expected} == expected
            # Nothing more arrives: each transition's notification workflow has ended.
            client = await TemporalConfig.at(world.temporal.address).connect()
            for m in receivers.stored["honour"]:
                child = f"notify/sim/{NS}/Deployment/api/{m['transition']}/turn-1/{m['key'][:12]}"
                await asyncio.wait_for(client.get_workflow_handle(child).result(), 60)
            assert {k: len(receivers.stored[k]) for k in expected} == expected
            assert receivers.stored["reject"] == []

            messages = receivers.stored["honour"]
            assert [m["transition"] for m in messages] == ["rollingBack", "failedPermanent"]
            for m in messages:
                assert m["header"] == m["key"]
                assert m["owner"] == {"namespace": NS, "kind": "Deployment", "name": "api"}
                assert m["cluster"] == "sim"  # the scenario's cluster: a fleet tells them apart
                assert m["policy"] == {"kind": "RollbackPolicy", "namespace": NS, "name": "policy"}
                assert (m["reason"], m["turn"]) == ("oomKilled", 1)
                assert m["workflowUrl"].startswith(
                    "http://localhost:8233/namespaces/default/workflows/rollback%2Fsim%2Fshop%2FDeployment%2Fapi/"
                )
            assert "OOMKilled" in messages[0]["message"]
            assert messages[0]["severity"] == "warning" and messages[1]["severity"] == "critical"
            assert {m["key"] for m in receivers.stored["slow-plain"]} == {
                m["key"] for m in messages
            }
            slack = receivers.stored["slack"][0]["text"]
            assert slack.startswith(":warning: *sim/shop/Deployment/api* rollingBack (oomKilled)")
            _the_docs_show_what_was_sent(
                messages[0], [m["text"] for m in receivers.stored["slack"]]
            )

            # A receiver that refuses for good is reported on the owner, once per transition.
            def failures() -> list[dict[str, Any]]:
                return [
                    e
                    for e in world.api.store.items("Event", NS)
                    if e.get("reason") == EventReason.NOTIFICATION_FAILED
                ]

            reported = await until(lambda: len(failures()) == 2 and failures())
            assert all("to reject failed: HTTP 400, not retried" in e["message"] for e in reported)
            assert receivers.requests["reject"] == 2
        finally:
            await world.stop(graceful=False)


def _the_docs_show_what_was_sent(body: dict[str, Any], slack: list[str]) -> None:
    """The notifications page's examples, "from a real run", against this run's: the same
    fields with the same values, but for what differs from run to run (key, time, run ID)."""
    page = (ROOT / "docs" / "operating" / "notifications-and-alerts.md").read_text()
    shown = json.loads(re.search(r"```json\n(.*?)```", page, re.S).group(1))  # type: ignore[union-attr]
    sent = {k: v for k, v in body.items() if k != "header"}
    assert shown.keys() == sent.keys()
    varying = {"key", "time", "runId", "workflowUrl"}
    assert {k: v for k, v in shown.items() if k not in varying} == {
        k: v for k, v in sent.items() if k not in varying
    }
    assert shown["workflowUrl"].rsplit("/", 2)[0] == sent["workflowUrl"].rsplit("/", 2)[0]
    lines = re.search(r"```text\n(.*?)```", page.split("The Slack message", 1)[1], re.S)
    shown_lines = lines.group(1).splitlines()  # type: ignore[union-attr]
    sent_lines = [line for text in slack for line in text.splitlines()]
    assert len(shown_lines) == len(sent_lines)
    for shown_line, sent_line in zip(shown_lines, sent_lines, strict=True):
        assert shown_line.split(" <", 1)[0] == sent_line.split(" <", 1)[0]
