"""``rollbackctl simulate --report``: the story as a page, checked in a real headless Chromium
(Debian's ``chromium``): it renders, has one lane per owner, and logs no console message."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from sim.scenario import SCENARIOS
from tests.conftest import ROOT, chromium, measure_report, overlapping


def test_the_report_renders_one_lane_per_owner_without_console_errors(tmp_path: Path) -> None:
    page, story = tmp_path / "story.html", SCENARIOS / "rollout-strimzi-observe-only.yaml"
    run = subprocess.run(
        [sys.executable, "-m", "cli.main", "simulate", str(story), "--report", str(page)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:]
    shown = subprocess.run(
        [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
         "--v=0", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr[-2000:]
    dom = shown.stdout
    # The page's script ran to its end (it numbers the lanes and marks the body ready) ...
    assert 'data-ready="yes"' in dom and 'data-lanes="2"' in dom
    lanes = re.findall(r'<section class="lane owner" data-owner="([^"]+)" data-index="(\d)"', dom)
    assert lanes == [("shop/Deployment/web", "1"), ("shop/StrimziPodSet/kafka", "2")]
    # ... without one console message (an uncaught error would be one).
    assert "CONSOLE" not in shown.stderr, shown.stderr
    # What a lane shows: the modes as spans, the Events as markers, the policy, the results.
    assert dom.count('class="span mode-monitoring"') == 3  # two windows of web, one of kafka
    assert 'class="span mode-failedPermanent"' in dom and 'class="event"' in dom
    assert "RollbackPolicy/shop/shop-rollback" in dom and "every expectation met" in dom
    # A time axis; Events labelled with their reason; a lane per pod; a legend of what is shown.
    assert re.search(r'class="axis" data-ticks="([4-9]|1[01])"', dom)
    assert re.search(r'<span class="label"[^>]*>RollbackMonitoringStarted</span>', dom)
    pods = re.search(r'data-pods="(\d+)"', dom)
    assert pods is not None and int(pods[1]) >= 3  # web's pods (two rollouts), kafka
    assert "OOMKilled" in dom  # kafka's restarts, as markers on its pod lanes
    legend = re.findall(r'class="legend-mode"[^>]*>([a-zA-Z]+)<', dom)
    assert "monitoring" in legend and "cancelled" not in legend and "aborted" not in legend
    # As laid out: no two labels over each other, at any width; each lane's story spans it.
    for width in (1280, 700):
        for lane in measure_report(page, width)["lanes"]:
            assert lane["labels"] and overlapping(lane["labels"]) == [], (width, lane["labels"])
            left, _, right, _ = lane["track"]
            assert lane["reach"] >= left + 0.9 * (right - left), (width, lane)
