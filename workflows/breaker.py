"""The storm breaker: re-applies stop cluster-wide when too many verdicts roll back at once.

A bad batch of recommendations (a sizing model's bug, a wrong unit) cuts many workloads at once;
each attempt rolls back, and each backoff's end re-applies the same bad cut, turn after turn. The
breaker, opt-in (``--storm-breaker SHARE%/WINDOW[/MIN]``, e.g. ``50%/10m``: more than half of
the verdicts of the last 10 minutes rolled back, at least 10 of them), sees it in the verdicts:
each transition into ``rollingBack`` (a rollback) or ``monitoringSucceeded`` (a success) counts
once, at its transition time. Tripped, it stops every write that brings a cut back, as the kill
switch does, until an operator resets it; new attempts still start and rollbacks still land (a
cut the applier puts on is still watched, and rolled back if it hurts).

Pure: the states and the time are given (the intake feeds it, ``worker.intake.breaker``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from workflows.contract import Mode
from workflows.durations import format_duration, parse_duration
from workflows.state import OwnerState

DEFAULT_MINIMUM = 10  # verdicts in the window before a share means anything
VERDICTS = {Mode.ROLLING_BACK: True, Mode.MONITORING_SUCCEEDED: False}  # mode -> rolled back


@dataclass(frozen=True)
class StormBreaker:
    """Trip when more than ``share`` percent of at least ``minimum`` verdicts within
    ``window`` rolled back."""

    share: float
    window: timedelta
    minimum: int = DEFAULT_MINIMUM

    @classmethod
    def parse(cls, text: str) -> StormBreaker:
        """``SHARE%/WINDOW[/MIN]``: ``50%/10m``, ``30%/1h/25`` (ValueError saying what is
        wrong)."""
        found = re.fullmatch(r"\s*([0-9.]+)%/([^/\s]+)(?:/([0-9]+))?\s*", text)
        if found is None:
            raise ValueError(f"{text!r} is not SHARE%/WINDOW[/MIN], e.g. 50%/10m")
        share, window, minimum = found.groups()
        try:
            parsed = cls(float(share), parse_duration(window), int(minimum or DEFAULT_MINIMUM))
        except ValueError as exc:
            raise ValueError(f"{text!r}: {exc}") from None
        if not 0 < parsed.share < 100:
            raise ValueError(f"{text!r}: the share is a percentage above 0 and below 100")
        if parsed.minimum < 1:
            raise ValueError(f"{text!r}: the minimum is 1 verdict or more")
        return parsed

    def __str__(self) -> str:
        return f"{self.share:g}%/{format_duration(self.window)}/{self.minimum}"


@dataclass
class Verdicts:
    """The verdicts within the breaker's window, each counted once; none before ``since`` (the
    breaker's last reset)."""

    breaker: StormBreaker
    since: datetime | None = None
    _seen: dict[tuple[str, str, int, Mode], tuple[datetime, bool]] = field(default_factory=dict)

    def record(self, owner: str, state: OwnerState) -> None:
        rolled_back = VERDICTS.get(state.mode)
        at = state.last_transition_time
        if rolled_back is None or (self.since is not None and at < self.since):
            return
        key = (owner, state.active_recommendation_fingerprint or "", state.turn, state.mode)
        self._seen[key] = (at, rolled_back)

    def reset(self, since: datetime) -> None:
        """Counted from ``since`` on only (an operator reset the breaker then)."""
        self.since = since
        self._seen = {k: v for k, v in self._seen.items() if v[0] >= since}

    def trips(self, now: datetime) -> str | None:
        """Why the breaker trips now (None: it does not), the verdicts older than its window
        forgotten."""
        start = now - self.breaker.window
        self._seen = {k: v for k, v in self._seen.items() if v[0] >= start}
        total = len(self._seen)
        rolled = sum(back for _, back in self._seen.values())
        if total < self.breaker.minimum or rolled * 100 <= self.breaker.share * total:
            return None
        return (
            f"{rolled} of {total} verdicts rolled back within"
            f" {format_duration(self.breaker.window)} ({rolled * 100 / total:.0f}% >"
            f" {self.breaker.share:g}%)"
        )
