"""The kubelet's restart backoff for a crashing container (CrashLoopBackOff), as Kubernetes 1.34
computes it: ``flowcontrol.Backoff`` with 10 s initial and 5 min most, consulted by
``kuberuntime``'s ``doBackOff`` each time the container is to start again.

- The first exit restarts the container at once (no entry yet: ``Next`` records 10 s).
- Each later exit waits the recorded delay from the exit's ``finishedAt``, then doubles it for the
  next: 10, 20, 40, 80, 160, 300, 300 s...; the container reports ``waiting: CrashLoopBackOff``
  meanwhile.
- An entry untouched for twice the most (10 minutes: the container ran that long) starts over.
- The key holds the container's resources (kubernetes#131681, in 1.34), so a resize starts the
  backoff over: a crash-looping container resized starts again at once with its new resources.
  Older kubelets kept the key, so the container waited out its backoff (kubernetes#119838): the
  reason, with kubernetes#138760, that the engine recreates crash-looping pods on a restore.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

INITIAL = 10.0  # seconds: kubelet's backOffPeriod
MOST = 300.0  # seconds: MaxContainerBackOff


@dataclass
class _Entry:
    delay: float
    updated: float  # when the container last started again


class RestartBackoff:
    """Per-container restart delays, keyed as the kubelet keys them."""

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}

    @staticmethod
    def key(uid: str, container: str, resources: Any) -> str:
        return f"{uid}/{container}/{json.dumps(resources or {}, sort_keys=True)}"

    def _live(self, key: str, at: float) -> _Entry | None:
        entry = self._entries.get(key)
        if entry is not None and at - entry.updated > 2 * MOST:
            del self._entries[key]  # ran long enough: the next crash is a first one
            return None
        return entry

    def delay(self, key: str, exited: float, now: float) -> float:
        """Seconds left before a container that exited at ``exited`` may start again (0: now)."""
        entry = self._live(key, exited)
        return 0.0 if entry is None else max(0.0, entry.delay - (now - exited))

    def started(self, key: str, exited: float, now: float) -> None:
        """The container starts again, at ``now``, after its exit at ``exited``: the next wait
        doubles (``Next``)."""
        entry = self._live(key, exited)
        if entry is None:
            self._entries[key] = _Entry(INITIAL, now)
        else:
            entry.delay, entry.updated = min(entry.delay * 2, MOST), now
