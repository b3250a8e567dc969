"""The engine's Temporal budget: the billable actions per second this cluster's intake may spend.

Temporal Cloud gives a namespace a rate of actions (500 a second by default) and answers more
with ResourceExhausted; a fleet-wide wave of resizes can ask for more than that. With a budget
(``--temporal-budget``, off by default) the intake paces what it sends, and only that: the
worker's timers, verdicts and rollbacks are never delayed (a rollback waits for nothing).

The pacer is a token bucket without a burst: a send goes ``cost / rate`` seconds after the one
before it at the earliest, so no second carries more than ``rate`` actions' worth. A
sighting (a signal-with-start that opens an attempt) is charged what a whole successful attempt
costs, ``ATTEMPT_ACTIONS`` (``bench --only cost`` measures it, and asserts it is this figure): the
actions that follow a start (its first task's activity and timer, the verdict at the window's
end) come from it, so pacing the starts at ``rate / ATTEMPT_ACTIONS`` keeps the whole wave,
windows' ends included, near ``rate``. Controls, resumes and suspects are one action each and
are never kept waiting: an operator's cancel or a certain failure does not queue behind a wave.
They are still charged, so the sightings after them wait for what they spent.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable

ATTEMPT_ACTIONS = 5  # billable actions of a successful attempt (bench "cost")


class Budget:
    """A pacer of ``rate`` actions per second; ``rate`` None: no budget, nothing waits."""

    def __init__(
        self,
        rate: float | None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if rate is not None and rate <= 0:
            raise ValueError(f"a budget is a positive rate of actions per second, not {rate}")
        self.rate, self._clock, self._sleep = rate, clock, sleep
        self._next = -math.inf  # the earliest time the next send may go
        self._turn = asyncio.Lock()

    async def spend(self, actions: int) -> float:
        """Wait for the turn of a send of ``actions``; the seconds waited. One send at a time
        takes its turn, and the next turn is measured from when it went (not from when it was
        due), so a send that woke late never brings the next one closer."""
        if self.rate is None:
            return 0.0
        began = self._clock()
        async with self._turn:
            while (wait := self._next - self._clock()) > 0:
                await self._sleep(wait)  # ``charge`` may have moved the turn meanwhile
            now = self._clock()
            self._next = now + actions / self.rate
        return now - began

    def charge(self, actions: int) -> None:
        """Spend ``actions`` now, waiting for nothing (a send that must not queue): the next
        paced send waits for them."""
        if self.rate is not None:
            self._next = max(self._clock(), self._next) + actions / self.rate
