"""``rollbackctl describe OWNER --report``'s page from a live cluster's own history of its pods
(``cli.podhistory``, through the real client over HTTP to the simulated cluster, whose kubelet
and controllers record the Events real ones do), laid out by headless Chromium."""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from temporalio.client import Client

from activities.owners import dig
from cli import ops, podhistory
from cli import report as story
from sim.apiserver import KubeEmulator
from sim.cluster import Behaviour, SimulatedCluster
from sim.scenario import SCENARIOS, Scenario, World, play
from tests.browser import Browser
from tests.conftest import ROOT, measure_report, overlapping
from worker.kube import api_client
from worker.temporal import reopen
from workflows.activity_api import OwnerRef
from workflows.contract import EventReason, Obj, WorkloadKind

REC_KEY = "static.rightsizing.kubex.ai/desired-resource-requests"
MERGE = "application/merge-patch+json"
OWNER = OwnerRef(namespace="shop", kind=WorkloadKind.DEPLOYMENT, name="api")


def _deployment(replicas: int) -> dict:  # type: ignore[type-arg]
    template = {
        "metadata": {"labels": {"app": "api"}},
        "spec": {"containers": [{"name": "app", "image": "x",
                                 "resources": {"requests": {"memory": "1Gi"}}}]},
    }  # fmt: skip
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "api", "namespace": "shop"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "api"}},
                 "template": template},
    }  # fmt: skip


def _until(sim: SimulatedCluster, check: Callable[[list[Obj]], bool]) -> None:
    """Step the simulated cluster until ``check`` holds for its pods."""
    deadline = time.monotonic() + 10
    while not check(list(sim.store.items("Pod", "shop"))):
        assert time.monotonic() < deadline, "the simulated cluster never got there"
        sim.step()
        time.sleep(0.05)


def _statuses(pods: list[Obj]) -> list[Obj]:
    return [cs for p in pods for cs in (p.get("status") or {}).get("containerStatuses") or []]


def _running(pods: list[Obj]) -> bool:
    return len(pods) == 3 and all(dig(p, "status", "phase") == "Running" for p in pods)


def _on(memory: str) -> Callable[[list[Obj]], bool]:
    def resized(pods: list[Obj]) -> bool:
        statuses = _statuses(pods)
        return len(statuses) == len(pods) and all(
            cs["resources"]["requests"]["memory"] == memory for cs in statuses
        )

    return resized


def _crash_looping(pods: list[Obj]) -> bool:
    """Killed, started again at once, killed again: backing off (10 s) in CrashLoopBackOff."""
    return all("waiting" in cs["state"] for cs in _statuses(pods))


def _cluster_history() -> podhistory.OwnerHistory:
    """Three pods resized in place to a cut that OOMs, then to one that fits; one scaled away."""
    with KubeEmulator() as api:
        store = api.store
        store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}})
        allocatable = {"cpu": "8", "memory": "16Gi", "pods": "110"}
        node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}
        store.create({**node, "status": {"allocatable": allocatable}})
        sim = SimulatedCluster(store)
        sim.add(_deployment(3), {"app": Behaviour(working_set="512Mi", startup=0.0)})
        _until(sim, _running)
        deployments = store.rtype("Deployment")
        for memory in ("256Mi", "768Mi"):
            rec = {REC_KEY: json.dumps({"app": {"memory": memory}})}
            store.patch(deployments, "shop", "api", {"metadata": {"annotations": rec}}, MERGE)
            _until(sim, _on(memory))
            if memory == "256Mi":  # OOMKilled twice: a restart, then a crash loop
                _until(sim, _crash_looping)
        store.patch(deployments, "shop", "api", {"spec": {"replicas": 2}}, MERGE)
        _until(sim, lambda pods: len(pods) == 2)
        return podhistory.read(api_client(url=api.url), OWNER)


def test_the_live_report_draws_each_pods_resources_as_they_changed(tmp_path: Path) -> None:
    history = _cluster_history()
    # Every pod, the gone one too, with its resizes in the order they were actuated.
    assert len(history.pods) == 3
    (gone,) = [p for p in history.pods if p.status is None]
    assert gone.deleted is not None and gone.created is not None
    for pod in history.pods:
        assert [m for _, m in pod.resizes] == ["256Mi", "768Mi"], pod
        started = [h for h in pod.happenings if h.reason == "Started"]
        assert started and started[0].count >= 3  # the start, the OOM restart, the resize's
        assert any(h.reason == "BackOff" for h in pod.happenings)
    assert all(
        p.last_restart and p.last_restart[1] == "OOMKilled" for p in history.pods if p.status
    )

    # The page: the story's own range (not up to a "now" minutes later), every pod's resources
    # as spans, no two labels over each other.
    first = min(p.created for p in history.pods if p.created)
    last = max(t for p in history.pods for t, _ in p.resizes)
    transitions = [(first, "monitoring", 1), (last, "rollingBack", 1)]
    history.events += [
        {"time": first + timedelta(seconds=s), "reason": reason, "message": message,
         "warning": False}
        for s, reason, message in [
            (0.0, EventReason.MONITORING_STARTED, "Monitoring recommendation 1 (turn 1)"),
            (0.1, EventReason.ROLLING_BACK_STARTED,
             "Rolling back: 0/3 pods adopted and healthy, 3 required; 3/3 pods OOMKilled (app)"),
            (0.2, EventReason.BACKOFF_TURN_COMPLETED, "Backoff turn 1 of 2 completed"),
            (0.3, EventReason.BACKOFF_EXHAUSTED, "Backoff exhausted after 2 turns"),
        ]
    ]  # fmt: skip
    later = datetime.now(UTC) + timedelta(minutes=3)
    page = tmp_path / "story.html"
    drawn = story.from_live(str(OWNER), "RollbackPolicy/shop/p", transitions, [], history, later)
    page.write_text(story.render(drawn))
    assert drawn.quiet > 170 and "then quiet for" in page.read_text()  # the tail is folded
    shown = measure_report(page)
    (lane,) = shown["lanes"]
    assert lane["labels"] and overlapping(lane["labels"]) == []
    assert any("0/3 adopted and healthy" in text for text, _ in lane["labels"])
    left, _, right, _ = lane["track"]
    assert lane["reach"] >= left + 0.9 * (right - left)  # the story fills the width
    assert len(shown["pods"]) == 3
    for pod in shown["pods"]:  # each resize, drawn (the gone pod's last lasted under a second,
        texts = [text for text, *_ in pod["spans"]]  # finer than the cluster keeps time)
        assert "256Mi" in texts and ("768Mi" in texts or "gone" in pod["title"]), pod


# --- the oom-rollback story, drawn and compared with what the simulated cluster lived ---------

FAILING = {"OOMKilled", "CrashLoopBackOff"}


def _drawn(page: Path, end: float, known: float) -> dict[str, list[tuple[float, float, str, str]]]:
    """Each pod's spans as headless Chromium lays the page out: (from, to) in seconds of the
    story (the span's box on its track), its state and the memory written on it, up to
    ``known``: when the report began to read. The axis runs on past the last thing read
    (``TAIL``: 4%, 1.4 s of a 35 s story), drawn as last read; what the cluster did after the
    read is not the report's to know (a rehearsal's later report, read as its rollback began on
    a loaded machine, drew 256Mi over a tail in which the restore to 768Mi landed)."""
    drawn = {}
    for pod in measure_report(page)["pods"]:
        left, _, right, _ = pod["track"]
        seconds = end / (right - left)
        spans = [
            ((a - left) * seconds, (b - left) * seconds, state, text)
            for text, _, state, (a, b) in pod["spans"]
        ]
        drawn[pod["title"].split()[1]] = [
            (a, min(b, known), state, text) for a, b, state, text in spans if a < known
        ]
    return drawn


def _lived(changes: list[Obj], pod: str, until: float) -> list[tuple[float, float, Obj]]:
    """The pod's states as the simulated cluster recorded each change: (from, to, change)."""
    mine = [c for c in changes if c["pod"] == pod]
    ends = [c["t"] for c in mine[1:]] + [until]
    return [(c["t"], end, c) for c, end in zip(mine, ends, strict=True)]


def _overlap(a: float, b: float, c: float, d: float) -> float:
    return max(0.0, min(b, d) - max(a, c))


async def _story(world: World, client: Client) -> tuple[story.Story, float]:
    """The live report, and when (in its seconds) it began to read Temporal and the cluster."""
    read = datetime.now(UTC)
    transitions, failures = await ops.recorded_transitions(client, world.first.name, OWNER)
    history = await asyncio.to_thread(podhistory.read, api_client(url=world.api.url), OWNER)
    told = story.from_live(str(OWNER), "p", transitions, failures, history, datetime.now(UTC))
    return told, (read - told.start).total_seconds() if told.start else told.end


def _check_against_the_cluster(
    drawn: dict[str, list[tuple[float, float, str, str]]],
    lived: list[Obj],
    offset: float,
    past: float | None = None,
) -> None:
    """Every state drawn is one the pod was in (times to the second, as the cluster keeps
    them), every size drawn is the one it ran, and most of the story is drawn: of its ``past``
    only (up to then) when it goes on into a crash loop, whose repeats the kubelet's recorder
    folds into the Event it already wrote, so that a later report cannot tell that tail from
    the turns after it (CI at a68e5e5 and 2ca9fd3, on a loaded machine: 33% to 46% of a later
    report in all, the first report drawn later after a longer tail)."""
    for pod, spans in drawn.items():
        lives = _lived(lived, pod, spans[-1][1] + offset + 60)
        definite = 0.0
        for a, b, state, memory in spans:
            start, end = a + offset, b + offset  # on the simulated cluster's clock
            if end - start >= 1.2 and memory:  # a size, in its middle
                (middle,) = [c for x, y, c in lives if x <= (start + end) / 2 < y]
                assert middle["memory"] == memory, (pod, a, b, memory, middle)
            if state == "Running":  # never over a crash loop (beyond a second's rounding)
                looped = sum(
                    _overlap(start, end, x, y) for x, y, c in lives if c["status"] in FAILING
                )
                assert looped <= 1.0, (pod, a, b, state, looped)
            elif state in FAILING and end - start >= 0.5:  # a crash or a back-off in it
                assert any(
                    _overlap(start - 0.5, end, x, y) > 0
                    and (c["status"] in FAILING or c["restarts"] > 0)
                    for x, y, c in lives
                ), (pod, a, b, state)
            if state != story.UNRECORDED:
                definite += _overlap(a, b, spans[0][0], spans[-1][1] if past is None else past)
        told = (spans[-1][1] if past is None else past) - spans[0][0]
        assert definite >= 0.5 * told, (pod, spans)


@dataclass
class Played:
    world: World
    client: Client
    zero: datetime  # the wall-clock time of the simulated cluster's second 0
    ended: int  # transitions recorded up to failedPermanent


@pytest.fixture(scope="module")
async def oom_rollback() -> AsyncIterator[Played]:
    """The demo's story (``oom-rollback``) played to ``failedPermanent``, its Temporal UI on.
    The report test, last in this module, reopens it."""
    scenario = Scenario.load(SCENARIOS / "oom-rollback.yaml")
    with tempfile.TemporaryDirectory(prefix="rollback-story-") as tmp:
        world = World(scenario, lambda line: None, Path(tmp), ui=True)
        try:
            await world.start()
            zero = datetime.now(UTC) - timedelta(seconds=time.monotonic() - world.recorder.start)
            await play(world)
            client = await Client.connect(world.temporal.address)
            ended = await _until_mode(world, "failedPermanent", 0)
            await _expectations_met(world, scenario.timeout)  # test_scenarios leaves it to us
            yield Played(world, client, zero, ended)
        finally:
            await world.stop()


# --- the Temporal UI's list, as the docs show it after their one-time step -------------------

UI_COLUMNS = "namespace-workflow-table-columns"  # where the UI keeps *Configure Columns*' choice
TIMES = {"Start", "End"}


def _docs_ui_list() -> tuple[list[str], list[list[str]]]:
    """The list the workflow page shows (its ``ui-list`` table): columns and rows."""
    text = (ROOT / "docs" / "concepts" / "workflow.md").read_text(encoding="utf-8")
    block = text.split("<!-- ui-list", 1)[1].split("-->", 1)[1].strip().split("\n\n")[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in block.splitlines()]
    return rows[0], [r for r in rows[2:] if r]


def test_the_ui_list_tells_each_outcome_as_the_docs_show_it(oom_rollback: Played) -> None:
    """Point 12: after the docs' one-time step (their columns, stored where the UI's *Configure
    Columns* stores them), the real Temporal UI's list reads as the docs show it: a succeeded
    attempt, a backoff, and a permanent failure told apart at a glance."""
    columns, shown = _docs_ui_list()
    assert "RollbackMode" in columns and len(shown) == 3
    ui = f"http://127.0.0.1:{oom_rollback.world.temporal.ui_port}"
    browser = Browser()
    try:
        browser.goto(f"{ui}/namespaces/default/workflows")
        browser.until("document.readyState === 'complete'")
        stored = json.dumps({"default": [{"label": c} for c in columns]})
        browser.evaluate(f"localStorage.setItem({json.dumps(UI_COLUMNS)}, {json.dumps(stored)})")
        query = urllib.parse.quote('WorkflowType = "RollbackWorkflow"')
        browser.goto(f"{ui}/namespaces/default/workflows?query={query}")
        headers = browser.until(  # the list with the columns chosen (not the page before)
            "(h => h.includes('RollbackMode') && h)"
            "([...document.querySelectorAll('thead th')].map(t => t.innerText.trim()))"
        )
        rows = browser.until(  # its rows, once the three runs are listed
            "(rows => rows.filter(r => r.includes('failedPermanent')).length && rows.length >= 3"
            " && rows)([...document.querySelectorAll('tbody tr')]"
            ".map(r => [...r.querySelectorAll('td')].map(c => c.innerText.trim())))"
        )
    finally:
        browser.close()
    offset = len(headers) - len(columns)  # the UI's own leading cells (selection)
    assert headers[offset:] == columns, headers
    keep = [i for i, c in enumerate(columns) if c not in TIMES]
    got = [[row[offset:][i].casefold() for i in keep] for row in rows]
    wanted = [[row[i].casefold() for i in keep] for row in shown]
    # The docs' rows, in their order, newest first (a later run may stand above them). A
    # backoff's run continues as new into the next turn when it sees the re-applied
    # recommendation adopted before it ends; else it completes and the intake starts the next.
    at = 0
    for row in wanted:
        alike = [row, ["completed", *row[1:]]] if row[0] == "continued as new" else [row]
        while at < len(got) and got[at] not in alike:
            at += 1
        assert at < len(got), (row, got)
        at += 1


async def test_the_oom_rollback_story_is_drawn_as_the_cluster_lived_it(
    oom_rollback: Played, tmp_path: Path
) -> None:
    """Point 11 of "everything a person reads is true": the demo's story, drawn from the
    cluster's record, against the simulated cluster's own record of each pod's changes. Each
    window a verdict judged all pods OOMKilled in is drawn so on every pod, never Running; the
    restored size is drawn as the pods lived it; a later report (after a ``reopen`` and its
    rollback) draws the same past the same way."""
    world, client = oom_rollback.world, oom_rollback.client
    first, known = await _story(world, client)
    page = tmp_path / "story.html"
    page.write_text(story.render(first))
    offset = (first.start - oom_rollback.zero).total_seconds() if first.start else 0.0
    drawn = _drawn(page, first.end, known)
    _check_against_the_cluster(drawn, world.recorder.pods, offset)
    rollbacks = [s.start for s in first.lanes[0].spans if s.label == "rollingBack"]
    assert len(rollbacks) == 2, first.lanes[0].spans
    for at in rollbacks:  # the window each rollback ends: OOMKilled on every pod
        for pod, spans in drawn.items():
            (state,) = [s for a, b, s, _ in spans if a <= at - 0.1 < b]
            assert state == "OOMKilled", (pod, at, spans)
    # A later report, after a reopen and the rollback it ends in, draws the same past.
    await reopen(client, world.first.name, world.task_queue, OWNER)
    await _until_mode(world, "rollingBack", oom_rollback.ended)
    later, known = await _story(world, client)
    later_page = tmp_path / "later.html"
    later_page.write_text(story.render(later))
    again = _drawn(later_page, later.end, known)
    shift = (first.start - later.start).total_seconds() if later.start else 0.0
    _same_past(drawn, again, shift)
    # Up to the first report's last OOM kill (on the later's clock): the crash loop after it
    # is one folded BackOff Event that runs on into the reopened turn's, so its length, which
    # depends on how late the first report was drawn, is not the later report's to know.
    past = max(b for spans in drawn.values() for _, b, s, _ in spans if s == "OOMKilled") + shift
    _check_against_the_cluster(again, world.recorder.pods, offset - shift, past)


def _same_past(
    drawn: dict[str, list[tuple[float, float, str, str]]],
    again: dict[str, list[tuple[float, float, str, str]]],
    shift: float,
) -> None:
    """Where both reports draw a pod's state at the same time, they draw the same one."""
    for pod, spans in drawn.items():
        for a, b, state, _ in spans:
            for c, d, other, _ in again[pod]:
                both = story.UNRECORDED not in (state, other)
                if both and _overlap(a, b, c - shift, d - shift) > 0.3:
                    assert state == other, (pod, (a, b, state), (c - shift, d - shift, other))


async def _expectations_met(world: World, timeout: float) -> None:
    """The scenario's own expectations hold (``World.problems``), as ``run_scenario`` asks."""
    deadline = time.monotonic() + timeout
    while (problems := world.problems()) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    assert not problems, problems


async def _until_mode(world: World, mode: str, after: int) -> int:
    """Wait for the owner's transition to ``mode`` after the first ``after`` transitions; the
    number of transitions then."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        seen = world.timeline("transitions")
        if any(t["mode"] == mode for t in seen[after:]):
            return len(seen)
        await asyncio.sleep(0.1)
    raise AssertionError(f"never reached {mode}: {world.timeline('transitions')}")
