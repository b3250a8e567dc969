"""A picture of a scenario's story: one self-contained HTML page (no external file, no network).

One lane per owner: its modes over time as coloured spans (a ``monitoring`` span is a window, a
``backingOff`` span a backoff), its Events as markers (the reason and message on hover), the
policy its state names; beside it, the owner's expectation results. A small script numbers the
lanes and wires the hover details, so a browser that runs it without a console error shows
everything (``tests/e2e/test_report.py`` checks that in headless Chromium).
"""

from __future__ import annotations

import html
import json
from typing import Any

COLOURS = {
    "monitoring": "#4e79a7",
    "monitoringSucceeded": "#59a14f",
    "rollingBack": "#e15759",
    "backingOff": "#f28e2b",
    "backedOff": "#edc948",
    "failedPermanent": "#b07aa1",
    "cancelled": "#9c755f",
    "aborted": "#bab0ac",
    "superseded": "#76b7b2",
}
WIDTH = 900  # px of the time axis

SCRIPT = """
document.querySelectorAll('.lane').forEach((lane, i) => { lane.dataset.index = String(i + 1); });
document.body.dataset.lanes = String(document.querySelectorAll('.lane').length);
const detail = document.getElementById('detail');
document.querySelectorAll('[data-detail]').forEach((el) => {
  el.addEventListener('mouseenter', () => { detail.textContent = el.dataset.detail; });
});
document.body.dataset.ready = 'yes';
"""

STYLE = f"""
body {{ font: 14px system-ui, sans-serif; margin: 24px; color: #222; }}
h1 {{ font-size: 20px; }} .passed {{ color: #2e7d32; }} .failed {{ color: #c62828; }}
.lane {{ margin: 14px 0; padding: 8px; border: 1px solid #ddd; border-radius: 6px; }}
.lane h2 {{ font-size: 15px; margin: 0 0 6px; }} .policy {{ color: #666; font-weight: normal; }}
.track {{ position: relative; height: 26px; background: #f4f4f4; width: {WIDTH}px; }}
.span {{ position: absolute; top: 0; height: 26px; opacity: .85; }}
.event {{ position: absolute; top: 26px; width: 2px; height: 10px; background: #222; }}
.results {{ margin: 18px 0 0; }} .results li.bad {{ color: #c62828; }}
.results li.ok {{ color: #2e7d32; }}
.legend span {{ display: inline-block; padding: 2px 6px; margin-right: 4px; color: #fff; }}
#detail {{ min-height: 20px; margin-top: 8px; font-family: monospace; }}
"""


def render(report: Any, scenario: Any) -> str:
    """The page for ``report`` (``sim.scenario.Report``) of ``scenario``."""
    owners = sorted(set(scenario.expect) | {t["owner"] for t in report.transitions + report.events})
    end = max([report.duration, *(e["t"] for e in report.transitions + report.events)], default=1.0)
    scale = WIDTH / max(end, 0.001)
    verdict = "PASSED" if report.passed else "FAILED"
    lanes = [_lane(owner, report, scenario, scale, end) for owner in owners]
    legend = "".join(
        f'<span style="background:{c}">{html.escape(m)}</span>' for m, c in COLOURS.items()
    )
    data = json.dumps({"scenario": report.scenario, "owners": owners, "passed": report.passed})
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(report.scenario)}</title>
<style>{STYLE}</style></head>
<body>
<h1>{html.escape(report.scenario)}: <span class="{verdict.lower()}">{verdict}</span>
in {report.duration:.1f}s</h1>
<p>{html.escape(scenario.description.strip())}</p>
<div class="legend">{legend}</div>
{"".join(lanes)}
<div id="detail"></div>
<script type="application/json" id="data">{html.escape(data)}</script>
<script>{SCRIPT}</script>
</body></html>
"""


def _lane(owner: str, report: Any, scenario: Any, scale: float, end: float) -> str:
    transitions = [t for t in report.transitions if t["owner"] == owner]
    spans = []
    for i, t in enumerate(transitions):
        if t["mode"] is None:
            continue
        until = transitions[i + 1]["t"] if i + 1 < len(transitions) else end
        left, width = t["t"] * scale, max(2.0, (until - t["t"]) * scale)
        reason = f" ({t['failureReason']})" if t.get("failureReason") else ""
        detail = f"{t['t']:.2f}s-{until:.2f}s {t['mode']} turn {t['turn']}{reason}"
        spans.append(
            f'<div class="span mode-{html.escape(t["mode"])}" title="{html.escape(detail)}"'
            f' data-detail="{html.escape(detail)}" style="left:{left:.1f}px;width:{width:.1f}px;'
            f'background:{COLOURS.get(t["mode"], "#999")}"></div>'
        )
    markers = [
        f'<div class="event" title="{html.escape(text)}" data-detail="{html.escape(text)}"'
        f' style="left:{e["t"] * scale:.1f}px"></div>'
        for e in report.events
        if e["owner"] == owner
        for text in [f"{e['t']:.2f}s {e['reason']}: {e['message']}"]
    ]
    state = (report.final.get(owner) or {}).get("state") or {}
    policy = state.get("policy") or {}
    named = "/".join(
        p for p in (policy.get("kind"), policy.get("namespace"), policy.get("name")) if p
    )
    results = _results(owner, report, scenario)
    return f"""<section class="lane" data-owner="{html.escape(owner)}">
<h2>{html.escape(owner)} <span class="policy">{html.escape(named or "no policy")}</span></h2>
<div class="track">{"".join(spans)}{"".join(markers)}</div>
<ul class="results">{results}</ul>
</section>"""


def _results(owner: str, report: Any, scenario: Any) -> str:
    if owner not in scenario.expect:
        return '<li class="ok">no expectation</li>'
    problems = [p for p in report.problems if p.startswith(f"{owner}: ")]
    if not problems:
        return '<li class="ok">every expectation met</li>'
    return "".join(f'<li class="bad">{html.escape(p)}</li>' for p in problems)
