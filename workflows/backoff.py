"""The backoff schedule: ``wait(turn) = timePeriod * multiplyByTurn * turn``.

Worked example from the spec, ``timePeriod: 1m``, ``multiplyByTurn: 2``::

    turn 1: 1m * 2 * 1 = 2m
    turn 2: 1m * 2 * 2 = 4m
    turn 3: 1m * 2 * 3 = 6m

After ``maxAttempts`` turns the rollback is ``failedPermanent``; with ``maxAttempts: 1`` the
first expired backoff is terminal. Turns count from 1 (the first monitored attempt).
"""

from __future__ import annotations

from datetime import timedelta

from workflows.policy import Backoff


def backoff_wait(backoff: Backoff, turn: int) -> timedelta:
    if turn < 1:
        raise ValueError(f"turns count from 1, got {turn}")
    return backoff.time_period * backoff.multiply_by_turn * turn


def backoff_schedule(backoff: Backoff) -> list[timedelta]:
    """The wait after each failed turn, turn 1 first, ``maxAttempts`` entries."""
    return [backoff_wait(backoff, turn) for turn in range(1, backoff.max_attempts + 1)]


def is_last_turn(backoff: Backoff, turn: int) -> bool:
    return turn >= backoff.max_attempts
