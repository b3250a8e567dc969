"""A rollback story as a picture: one self-contained HTML page (no external file, no network).

Two callers build a ``Story`` and ``render`` it:

- ``rollbackctl simulate --report`` (``cli.local``, ``from_scenario``): what the simulated
  cluster recorded while the scenario played, with the expectation results;
- ``rollbackctl describe OWNER --report`` (``cli.main``, ``from_live``): a live workload, from
  the transitions its workflow recorded (Temporal) and the cluster's history of its pods
  (``cli.podhistory``: its Events and its pods now).

The page reads like a trace viewer: a time axis over the story's own range (from its first
transition or Event to its last happening; a quiet time since, up to now, is folded into the
title); per owner, its modes as coloured spans (a ``monitoring`` span is a window,
``backingOff`` a backoff) and its Events as markers labelled with their reason, a verdict's
numbers in its label (the message on hover); under it, a lane per pod, its size and state in
each interval it held them (a live pod's, as far as the cluster's record proves: ``_pod_lane``),
a marker per resize, back-off and exit with its cause; a legend of what is shown. A small
script lays the labels out in rows so that none overlaps another (measured in the page) and
wires the hover details, so a browser that runs it without a console error shows everything
(``tests/e2e/test_report.py`` checks that in headless Chromium).
"""

from __future__ import annotations

import html
import itertools
import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from activities.cohort import REASON_LABELS
from cli.podhistory import OwnerHistory, PodHistory
from workflows.contract import EventReason

MODE_COLOURS = {
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
UNRECORDED = "Unrecorded"  # a pod's state the cluster kept no record of
POD_COLOURS = {
    "Running": "#8cc084",
    "Pending": "#c9c9c9",
    "NotReady": "#f2c14e",
    "OOMKilled": "#d1495b",
    "CrashLoopBackOff": "#8e2c3a",
    "Succeeded": "#6c9bd2",
    "Failed": "#5a5a5a",
    UNRECORDED: "#bdbdbd",
}
# Events whose message carries the verdict's numbers: their label shows them.
VERDICTS = (EventReason.MONITORING_SUCCEEDED, EventReason.ROLLING_BACK_STARTED)
VERDICT_NUMBERS = re.compile(r"(\d+/\d+) pods adopted and healthy")
VERDICT_MODES = {
    "monitoringSucceeded": EventReason.MONITORING_SUCCEEDED,
    "rollingBack": EventReason.ROLLING_BACK_STARTED,
}
HEALTHY = "adopted and healthy"
EVERY_POD = re.compile(rf"(\d+)/(\d+) pods ({'|'.join([HEALTHY, *REASON_LABELS.values()])})\b")
HALF_SECOND = timedelta(seconds=0.5)
MOMENT = timedelta(milliseconds=10)
TAIL = 1.04  # the axis runs a little past the last happening, so it is not on the edge
TICK_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 86400)


@dataclass
class Span:
    start: float  # seconds since the story's start
    end: float
    label: str  # the mode, or a pod's state
    detail: str  # on hover
    text: str = ""  # written on the span when it is wide enough (a pod's memory)


@dataclass
class Marker:
    t: float
    label: str  # an Event's reason, a restart's cause
    detail: str
    warning: bool = False


@dataclass
class Lane:
    key: str  # the owner (``shop/Deployment/api``) or the pod
    title: str
    kind: str = "owner"  # or "pod"
    subtitle: str = ""
    spans: list[Span] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)
    results: list[tuple[bool, str]] = field(default_factory=list)


@dataclass
class Story:
    title: str
    lanes: list[Lane]
    end: float  # seconds covered
    start: datetime | None = None  # wall-clock time of second 0, when known
    description: str = ""
    passed: bool | None = None  # a scenario's verdict; None: a live workload
    quiet: float = 0.0  # seconds from the story's end to now, nothing happening (folded)


def _ticks(end: float) -> list[float]:
    step = next((s for s in TICK_STEPS if end / s <= 10), TICK_STEPS[-1])
    return [i * step for i in range(int(end // step) + 1)]


def _seconds(value: float) -> str:
    value = round(value)
    if value < 120:
        return f"{value}s"
    if value < 7200:
        return f"{value // 60}m{value % 60:02d}s" if value % 60 else f"{value // 60}m"
    return f"{value // 3600}h{(value % 3600) // 60:02d}m"


def _pct(t: float, end: float) -> float:
    return max(0.0, min(100.0, 100.0 * t / end))


def _axis(story: Story) -> str:
    ticks = []
    for t in _ticks(story.end):
        at = ""
        if story.start is not None:
            at = (story.start + timedelta(seconds=t)).strftime("%H:%M:%S")
        ticks.append(
            f'<div class="tick" style="left:{_pct(t, story.end):.2f}%" title="{at}">'
            f"<span>{_seconds(t)}</span></div>"
        )
    start = f" from {story.start.strftime('%Y-%m-%d %H:%M:%S UTC')}" if story.start else ""
    return f'<div class="axis" data-ticks="{len(ticks)}" title="time{start}">{"".join(ticks)}</div>'


def _lane(lane: Lane, end: float) -> str:
    colours = MODE_COLOURS if lane.kind == "owner" else POD_COLOURS
    prefix = "mode" if lane.kind == "owner" else "pod"
    spans = []
    for s in lane.spans:
        left, width = _pct(s.start, end), max(0.3, _pct(s.end, end) - _pct(s.start, end))
        spans.append(
            f'<div class="span {prefix}-{html.escape(s.label)}" title="{html.escape(s.detail)}"'
            f' data-detail="{html.escape(s.detail)}" data-state="{html.escape(s.label)}"'
            f' style="left:{left:.2f}%;width:{width:.2f}%;'
            f'background:{colours.get(s.label, "#999")}">{html.escape(s.text)}</div>'
        )
    markers = [
        f'<div class="event{" warning" if m.warning else ""}" title="{html.escape(m.detail)}"'
        f' data-detail="{html.escape(m.detail)}" style="left:{_pct(m.t, end):.2f}%">'
        f'<span class="label">{html.escape(m.label)}</span></div>'
        for m in sorted(lane.markers, key=lambda m: m.t)
    ]
    results = "".join(
        f'<li class="{"ok" if ok else "bad"}">{html.escape(text)}</li>' for ok, text in lane.results
    )
    subtitle = f' <span class="policy">{html.escape(lane.subtitle)}</span>' if lane.subtitle else ""
    return f"""<section class="lane {lane.kind}" data-owner="{html.escape(lane.key)}">
<h2>{html.escape(lane.title)}{subtitle}</h2>
<div class="track">{"".join(spans)}{"".join(markers)}</div>
{f'<ul class="results">{results}</ul>' if results else ""}
</section>"""


SCRIPT = """
document.querySelectorAll('.lane.owner').forEach((lane, i) => {
  lane.dataset.index = String(i + 1);
});
document.body.dataset.lanes = String(document.querySelectorAll('.lane.owner').length);
document.body.dataset.pods = String(document.querySelectorAll('.lane.pod').length);
// Labels in rows: each goes to the first row where it clears the one before it (its left edge
// past that one's right edge), and to the left of its marker where it would leave the track.
const ROW = 14, FIRST = 28;
function layout() {
  document.querySelectorAll('.lane.owner').forEach((lane) => {
    const track = lane.querySelector('.track').getBoundingClientRect();
    const labels = [...lane.querySelectorAll('.event .label')];
    const rows = [];
    labels.forEach((label) => {
      label.classList.remove('flip');
      if (label.getBoundingClientRect().right > track.right) label.classList.add('flip');
      const box = label.getBoundingClientRect();
      let row = rows.findIndex((right) => right + 6 <= box.left);
      if (row < 0) { row = rows.length; rows.push(0); }
      rows[row] = box.right;
      label.style.top = (FIRST + row * ROW) + 'px';
      label.parentElement.style.height = (FIRST + row * ROW + 12) + 'px';
    });
    lane.querySelector('.track').style.marginBottom = (rows.length * ROW + 12) + 'px';
    lane.dataset.rows = String(rows.length);
  });
}
layout();
window.addEventListener('resize', layout);
const detail = document.getElementById('detail');
document.querySelectorAll('[data-detail]').forEach((el) => {
  el.addEventListener('mouseenter', () => { detail.textContent = el.dataset.detail; });
});
document.body.dataset.ready = 'yes';
"""

STYLE = """
body { font: 14px system-ui, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 20px; } .passed { color: #2e7d32; } .failed { color: #c62828; }
.lane { margin: 10px 0 0; padding: 8px; border: 1px solid #ddd; border-radius: 6px; }
.lane.pod { margin: 2px 0 0; padding: 2px 9px 4px; border: none; }
.lane.pod h2 { font-size: 12px; color: #555; font-weight: normal; padding-left: 16px; }
.lane.owner .track { margin-bottom: 26px; }
.lane h2 { font-size: 15px; margin: 0 0 6px; } .policy { color: #666; font-weight: normal; }
.track { position: relative; height: 26px; background: #f4f4f4; width: 100%; }
.lane.pod .track { height: 16px; }
.span { position: absolute; top: 0; height: 100%; opacity: .9; overflow: hidden;
        font-size: 11px; color: #fff; white-space: nowrap; text-indent: 3px; }
.event { position: absolute; top: 0; width: 2px; height: 34px; background: #222; }
.event.warning { background: #c62828; }
.lane.pod .event { height: 16px; background: #8e2c3a; }
.event .label { position: absolute; top: 28px; left: 3px; font-size: 10px; line-height: 12px;
                white-space: nowrap; background: rgba(255,255,255,.9); z-index: 2; }
.event .label.flip { left: auto; right: 3px; }
.lane.pod .event .label { display: none; }
.axis { position: relative; height: 18px; margin: 0 9px; border-bottom: 1px solid #999; }
.tick { position: absolute; bottom: 0; height: 6px; border-left: 1px solid #999; }
.tick span { position: absolute; bottom: 6px; left: -8px; font-size: 11px; color: #555; }
.results { margin: 8px 0 0; } .results li.bad { color: #c62828; }
.results li.ok { color: #2e7d32; }
.legend span { display: inline-block; padding: 2px 6px; margin: 0 4px 4px 0; color: #fff; }
#detail { min-height: 20px; margin-top: 8px; font-family: monospace; white-space: pre-wrap; }
"""


def render(story: Story) -> str:
    """The page for ``story``."""
    end = max(story.end, 0.001)
    owners = [lane for lane in story.lanes if lane.kind == "owner"]
    used = {s.label for lane in owners for s in lane.spans}
    legend = "".join(
        f'<span class="legend-mode" style="background:{c}">{html.escape(m)}</span>'
        for m, c in MODE_COLOURS.items()
        if m in used
    )
    pods = {s.label for lane in story.lanes if lane.kind == "pod" for s in lane.spans}
    legend += "".join(
        f'<span class="legend-pod" style="background:{c}">pod {html.escape(m)}</span>'
        for m, c in POD_COLOURS.items()
        if m in pods
    )
    verdict = ""
    if story.passed is not None:
        word = "PASSED" if story.passed else "FAILED"
        verdict = f': <span class="{word.lower()}">{word}</span>'
    data = json.dumps(
        {"title": story.title, "owners": [lane.key for lane in owners], "passed": story.passed}
    )
    quiet = f"; then quiet for {_seconds(story.quiet)}, up to now" if story.quiet >= 1 else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(story.title)}</title>
<style>{STYLE}</style></head>
<body>
<h1>{html.escape(story.title)}{verdict} ({_seconds(story.end)}{quiet})</h1>
<p>{html.escape(story.description.strip())}</p>
<div class="legend">{legend}</div>
{_axis(story)}
{"".join(_lane(lane, end) for lane in story.lanes)}
<div id="detail"></div>
<script type="application/json" id="data">{html.escape(data)}</script>
<script>{SCRIPT}</script>
</body></html>
"""


# --- stories -------------------------------------------------------------------------------------


def mode_spans(
    transitions: list[tuple[float, str | None, Any, str | None]], end: float
) -> list[Span]:
    """(t, mode, turn, failure reason) in order -> a span per mode, until the next one."""
    spans = []
    for i, (t, mode, turn, reason) in enumerate(transitions):
        if mode is None:
            continue
        until = transitions[i + 1][0] if i + 1 < len(transitions) else end
        why = f" ({reason})" if reason else ""
        detail = f"{_seconds(t)}-{_seconds(until)} {mode} turn {turn}{why}"
        spans.append(Span(t, until, mode, detail))
    return spans


def pod_lanes(owner: str, samples: list[dict[str, Any]], end: float) -> list[Lane]:
    """A lane per pod from its samples ``{t, pod, status, restarts, memory, reason}`` (each a
    change): its states as spans, a marker per restart."""
    lanes: dict[str, Lane] = {}
    last: dict[str, dict[str, Any]] = {}
    for sample in sorted(samples, key=lambda s: s["t"]):
        pod = sample["pod"]
        lane = lanes.setdefault(pod, Lane(f"{owner}/{pod}", f"pod {pod}", kind="pod"))
        if lane.spans:
            lane.spans[-1].end = sample["t"]
        if sample["status"] is not None:
            text = sample.get("memory") or ""
            detail = f"{pod}: {sample['status']} from {_seconds(sample['t'])}" + (
                f", memory {text}" if text else ""
            )
            lane.spans.append(Span(sample["t"], end, sample["status"], detail, text))
        before = last.get(pod, {}).get("restarts", 0)
        if sample.get("restarts", 0) > before:
            cause = sample.get("reason") or "restart"
            lane.markers.append(
                Marker(sample["t"], cause, f"{pod}: {cause}, restart {sample['restarts']}", True)
            )
        last[pod] = sample
    return list(lanes.values())


def from_scenario(report: Any, scenario: Any) -> Story:
    """A scenario's story (``sim.scenario.Report`` of ``sim.scenario.Scenario``)."""
    records = report.transitions + report.events
    owners = sorted(set(scenario.expect) | {t["owner"] for t in records})
    end = max([report.duration, *(e["t"] for e in records)], default=1.0)
    lanes = []
    for owner in owners:
        transitions = [
            (t["t"], t["mode"], t["turn"], t.get("failureReason"))
            for t in report.transitions
            if t["owner"] == owner
        ]
        state = (report.final.get(owner) or {}).get("state") or {}
        policy = state.get("policy") or {}
        named = "/".join(
            p for p in (policy.get("kind"), policy.get("namespace"), policy.get("name")) if p
        )
        lane = Lane(owner, owner, subtitle=named or "no policy", spans=mode_spans(transitions, end))
        lane.markers = [
            Marker(e["t"], e["reason"], f"{_seconds(e['t'])} {e['reason']}: {e['message']}")
            for e in report.events
            if e["owner"] == owner
        ]
        lane.results = _results(owner, report, scenario)
        lanes.append(lane)
        lanes += pod_lanes(owner, [p for p in report.pods if p["owner"] == owner], end)
    return Story(scenario.name, lanes, end, description=scenario.description, passed=report.passed)


def _results(owner: str, report: Any, scenario: Any) -> list[tuple[bool, str]]:
    if owner not in scenario.expect:
        return [(True, "no expectation")]
    problems = [p for p in report.problems if p.startswith(f"{owner}: ")]
    return [(False, p) for p in problems] or [(True, "every expectation met")]


def _age(at: datetime | None, origin: datetime) -> float:
    return 0.0 if at is None else max(0.0, (at - origin).total_seconds())


def _instant(at: datetime) -> datetime:
    """A time the cluster keeps to the second (a kubelet's Event, a container's start or exit)
    stands for that whole second: drawn at its middle, half a second at most from the truth
    (a resize caused by a rollback in the same second: ``_resized``)."""
    return at + HALF_SECOND if at.microsecond == 0 else at


def _resized(at: datetime, rollbacks: list[datetime]) -> datetime:
    """A resize's ``_instant``, except in the second of a rollback: the resize that second
    holds may be the rollback's own, so it is not drawn before the verdict that caused it."""
    drawn = _instant(at)
    if at.microsecond == 0:
        caused = [t for t in rollbacks if at <= t < at + 2 * HALF_SECOND]
        drawn = max([drawn, *(t + MOMENT for t in caused)])
    return drawn


@dataclass
class Judged:
    """What a verdict said of every pod of its cohort: each was ``state`` (``Running``: adopted
    and healthy; else the reason each failed by) through the window it judged."""

    opened: datetime
    at: datetime
    state: str
    detail: str


def judged(
    transitions: list[tuple[datetime, str, int]], events: list[dict[str, Any]]
) -> list[Judged]:
    """The verdicts whose numbers cover the whole cohort ("3/3 pods OOMKilled", "3/3 pods
    adopted and healthy, 3 required"), each at its transition's time, over its window (from
    the transition to ``monitoring`` before it). Health is judged from a window's opening: a
    pod healthy at the verdict was healthy through it, one OOMKilled was killed in it and has
    not been ready since. A verdict on part of the cohort ("1/3 pods OOMKilled") says no pod's
    state: which pods, it does not record."""
    found = []
    opened: datetime | None = None
    for at, mode, _ in transitions:
        if mode == "monitoring":
            opened = at
        reason = VERDICT_MODES.get(mode)
        if reason is None or opened is None:
            continue
        said = min(
            (e for e in events if e["reason"] == reason),
            key=lambda e: abs((e["time"] - at).total_seconds()),
            default=None,
        )
        if said is None or abs((said["time"] - at).total_seconds()) > 2:
            continue  # its Event is gone (past its TTL): its numbers with it
        for k, n, what in EVERY_POD.findall(said["message"]):
            if k == n != "0":
                state = "Running" if what == HEALTHY else what
                found.append(Judged(opened, at, state, f"{reason}: {said['message']}"))
                break
        opened = None
    return found


def from_live(
    owner: str,
    policy: str,
    transitions: list[tuple[datetime, str, int]],
    failures: list[tuple[datetime, str]],
    history: OwnerHistory | None,
    now: datetime,
    note: str = "",
) -> Story:
    """A live workload's story: ``transitions`` (time, mode, turn) as its workflow recorded
    them, ``failures`` (time, what failed) from the same histories, and the cluster's
    ``history`` of it (None: no cluster to read). The axis runs from the first transition or
    Event to the last thing that happened; the time since, up to ``now``, is folded."""
    events = history.events if history else []
    pods = history.pods if history else []
    story_times = [t for t, *_ in transitions] + [e["time"] for e in events]
    origin = min(story_times, default=now)
    happened = [*story_times, *(t for t, _ in failures)]
    for pod in pods:
        kept = [t for t, _ in pod.resizes] + [h.last for h in pod.happenings]
        kept += [t for t in (pod.created, pod.deleted, pod.running_since) if t is not None]
        kept += [pod.last_restart[0]] if pod.last_restart else []
        happened += [_instant(t) for t in kept]
    last = max((t for t in happened if t >= origin), default=origin)
    end = max(1.0, _age(last, origin) * TAIL)
    spans = mode_spans([(_age(t, origin), m, turn, None) for t, m, turn in transitions], end)
    lane = Lane(owner, owner, subtitle=policy or "no policy", spans=spans)
    lane.markers = [_owner_marker(e, _age(e["time"], origin)) for e in events] + [
        Marker(_age(t, origin), "activity failed", what, True) for t, what in failures
    ]
    lanes, verdicts = [lane], judged(transitions, events)
    rollbacks = [t for t, mode, _ in transitions if mode == "rollingBack"]
    for pod in pods:
        if pod.deleted is not None and pod.deleted < origin:
            continue  # gone before the story began
        lanes.append(_pod_lane(owner, pod, verdicts, rollbacks, origin, end))
    return Story(owner, lanes, end, start=origin, description=note, quiet=max(0.0, _age(now, last)))


def _owner_marker(event: dict[str, Any], t: float) -> Marker:
    label = event["reason"]
    numbers = VERDICT_NUMBERS.search(event["message"]) if label in VERDICTS else None
    if numbers:  # the verdict, with its numbers at the verdict
        label = f"{label}: {numbers[1]} adopted and healthy"
    return Marker(
        t, label, f"{_seconds(t)} {event['reason']}: {event['message']}", event["warning"]
    )


def _pod_lane(
    owner: str,
    pod: PodHistory,
    verdicts: list[Judged],
    rollbacks: list[datetime],
    origin: datetime,
    end: float,
) -> Lane:
    """A pod's size and state in each interval it held them, from what the record proves:

    - its size from its resizes (each its own Event); before the first, only while unresized;
    - its state through each window a verdict judged the whole cohort in (``judged``), and
      from its status now: running since its containers started, waiting in the restart
      backoff from a container's last exit to its start again;
    - elsewhere ``Unrecorded``: the kubelet's Events say that a pod started or backed off, not
      for how long, and a resize may start or end a crash loop.

    Each is drawn from facts that a later report reads the same (a run of repeated Events only
    at its first time), so what one report draws, a later one draws the same or leaves
    unrecorded where the pod's status has moved on. Markers: each resize, the first of each run
    of back-offs and kills (its count on hover), the last exit with its cause."""
    start = _age(_instant(pod.created), origin) if pod.created else 0.0
    stop = _age(_instant(pod.deleted), origin) if pod.deleted is not None else end
    sizes = [(_age(_resized(t, rollbacks), origin), m) for t, m in pod.resizes]
    known: list[tuple[float, float, str, str]] = []  # (from, to, state, why), first wins
    for v in verdicts:  # over the window, from the resize that brought what it judged
        at = _age(v.at, origin)
        opened = max([_age(v.opened, origin), *(t for t, _ in sizes if t <= at)])
        known.append((opened, at, v.state, f"judged {v.detail}"))
    for exited, started, cause in pod.down:
        until = _age(_instant(started), origin) if started else stop
        why = f"waiting in its restart backoff after its exit ({cause}) at {exited:%H:%M:%S}"
        known.append((_age(_instant(exited), origin), until, "CrashLoopBackOff", why))
    if pod.running_since is not None:
        since = pod.running_since
        why = f"running since {since:%H:%M:%S}, as its status says now"
        known.append((_age(_instant(since), origin), stop, "Running", why))
    cuts = {start, stop, *(t for t, _ in sizes), *(t for k in known for t in k[:2])}
    bounds = sorted(t for t in cuts if start <= t <= stop)
    spans: list[Span] = []
    for left, right in itertools.pairwise(bounds):
        middle = (left + right) / 2
        state, why = next(
            ((s, w) for a, b, s, w in known if a <= middle < b),
            (UNRECORDED, "its state in this interval: not recorded by the cluster"),
        )
        before = [m for t, m in sizes if t <= middle]
        memory = before[-1] if before else ("" if sizes else pod.memory)
        if spans and (spans[-1].label, spans[-1].text, spans[-1].detail) == (state, memory, why):
            spans[-1].end = right
        else:
            spans.append(Span(left, right, state, why, memory))
    for span in spans:
        held = span.text or "not recorded (before its first resize)"
        span.detail = (
            f"{pod.name}: {span.label} {_seconds(span.start)}-{_seconds(span.end)},"
            f" memory {held}; {span.detail}"
        )
    lane = Lane(f"{owner}/{pod.name}", f"pod {pod.name}", kind="pod", spans=spans)
    lane.subtitle = "gone" if pod.status is None else f"{pod.restarts} restart(s) now"
    for h in pod.happenings:
        if h.reason in ("Killing", "BackOff"):
            detail = f"{pod.name}: {h.reason} x{h.count} from {h.first:%H:%M:%S}: {h.message}"
            lane.markers.append(Marker(_age(_instant(h.first), origin), h.reason, detail, True))
    for t, m in sizes:
        lane.markers.append(Marker(t, "resized", f"{pod.name}: resized to {m}"))
    if pod.last_restart is not None:
        restarted, cause = pod.last_restart
        detail = f"{pod.name}: exited ({cause}) at {restarted:%H:%M:%S}; {pod.restarts} restart(s)"
        lane.markers.append(Marker(_age(_instant(restarted), origin), cause, detail, True))
    return lane
