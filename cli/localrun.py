"""Where a ``rollbackctl run`` on this machine is, for itself and for the other commands.

``rollbackctl run`` claims its data directory (``.rollback-data`` by default) with an exclusive
``flock`` on ``run.lock``, held for as long as the process lives (the kernel drops it when the
process dies, SIGKILL included), and publishes what it serves in ``run.json``: the Temporal
address and task queue, and the simulated cluster's kubeconfig. So:

- a second ``run`` on the same directory is refused with one line that names the first one;
- ``rollbackctl get|describe|cancel|reopen`` run from the same directory, given no Temporal
  address (flag, ``TEMPORAL_ADDRESS`` or profile), use the live run's; given no cluster, they
  read policies and pods through the live run's simulated cluster;
- the kubeconfig ``run`` writes for the simulated cluster is marked (its context is
  ``SIMULATED_CONTEXT``), so a later ``run`` in a shell that exported it starts a fresh simulated
  cluster (and rewrites the file) instead of taking a dead one for a real cluster.

Imported by ``cli.main`` (the production install): nothing here needs the simulator.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

import yaml

DEFAULT_DATA_DIR = ".rollback-data"
LOCK_FILE = "run.lock"
RUN_FILE = "run.json"
SIMULATED_CONTEXT = "rightsizing-rollback-simulated"


class RunInUseError(RuntimeError):
    """Another live ``rollbackctl run`` holds this data directory; the message names it."""


@dataclass(frozen=True)
class LocalRun:
    """What a live ``rollbackctl run`` serves (``run.json``)."""

    pid: int
    data_dir: str
    temporal: str  # host:port
    task_queue: str
    ui: str | None = None
    kubeconfig: str | None = None  # the simulated cluster's; None against a real cluster
    clusters: tuple[str, ...] = ()  # the clusters it serves (a simulated fleet: several)

    def describe(self) -> str:
        return f"pid {self.pid}, Temporal {self.temporal}"

    @property
    def cluster(self) -> str | None:
        """The cluster it serves; None when it plays a fleet (or an older file says none)."""
        return self.clusters[0] if len(self.clusters) == 1 else None


class Claim:
    """The data directory, held by this process until ``release`` (or its death)."""

    def __init__(self, data_dir: Path, handle: IO[str]) -> None:
        self.data_dir, self._handle = data_dir, handle

    def publish(self, run: LocalRun) -> None:
        path = self.data_dir / RUN_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(run), indent=2), encoding="utf-8")
        tmp.replace(path)

    def release(self) -> None:
        with contextlib.suppress(OSError):
            (self.data_dir / RUN_FILE).unlink()
        self._handle.close()  # drops the lock


def claim(data_dir: Path) -> Claim:
    """Hold ``data_dir`` for this process, or raise ``RunInUseError`` naming the holder."""
    data_dir.mkdir(parents=True, exist_ok=True)
    handle = (data_dir / LOCK_FILE).open("a+", encoding="utf-8")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        other = _read(data_dir)
        who = (
            f"another rollbackctl run ({other.describe()})" if other else "another rollbackctl run"
        )
        raise RunInUseError(
            f"{who} is using the data directory {data_dir}: stop it (Ctrl-C in its terminal),"
            " or give this one its own with --data-dir DIR (and --port PORT)"
        ) from None
    return Claim(data_dir, handle)


def find(data_dir: Path | str = DEFAULT_DATA_DIR) -> LocalRun | None:
    """The live run holding ``data_dir``, or None (no run, or it has died)."""
    path = Path(data_dir) / LOCK_FILE
    try:
        handle = path.open("r", encoding="utf-8")
    except OSError:
        return None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read(Path(data_dir))  # held: the run is alive
        return None  # free: whoever held it has gone


def _read(data_dir: Path) -> LocalRun | None:
    try:
        doc = json.loads((data_dir / RUN_FILE).read_text(encoding="utf-8"))
        return LocalRun(**{**doc, "clusters": tuple(doc.get("clusters") or ())})
    except (OSError, ValueError, TypeError):
        return None  # still starting, or an older file


def write_kubeconfig(path: Path, url: str, fleet: dict[str, str] | None = None) -> Path:
    """A kubeconfig for the simulated cluster at ``url`` (plain HTTP, no credentials), marked
    as such; with ``fleet`` (cluster name -> URL), a context per cluster named after it too, so
    ``kubectl --context <cluster>`` reaches each."""
    servers = {SIMULATED_CONTEXT: url, **(fleet or {})}
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": n, "cluster": {"server": u}} for n, u in servers.items()],
        "users": [{"name": SIMULATED_CONTEXT, "user": {}}],
        "contexts": [
            {"name": n, "context": {"cluster": n, "user": SIMULATED_CONTEXT}} for n in servers
        ],
        "current-context": SIMULATED_CONTEXT,
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    tmp.replace(path)  # a kubectl reading it meanwhile sees the old file or the new, never half
    return path


def kubeconfig_documents(kubeconfig: str | None) -> list[dict[str, Any]]:
    """The readable documents of ``kubeconfig`` (a path, or a ``:``-separated list as in
    ``$KUBECONFIG``), in order; a file that is missing or not YAML is skipped."""
    found = []
    for part in (kubeconfig or "").split(os.pathsep):
        try:
            doc = yaml.safe_load(Path(part).read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(doc, dict):
            found.append(doc)
    return found


def context_namespace(kubeconfig: str | None, context: str | None) -> str:
    """kubectl's default namespace: the context's (``context``, else the current one, of the
    first file of ``kubeconfig`` that names it; ``~/.kube/config`` when none), else
    ``default``."""
    docs = kubeconfig_documents(kubeconfig or str(Path.home() / ".kube" / "config"))
    name = context or next((d["current-context"] for d in docs if d.get("current-context")), None)
    for doc in docs:
        for entry in doc.get("contexts") or []:
            if isinstance(entry, dict) and entry.get("name") == name:
                return str((entry.get("context") or {}).get("namespace") or "default")
    return "default"


def contexts(kubeconfig: str | None) -> set[str]:
    """The context names of ``kubeconfig`` (a path, or a ``:``-separated list)."""
    return {
        str(c.get("name"))
        for doc in kubeconfig_documents(kubeconfig)
        for c in doc.get("contexts") or []
        if isinstance(c, dict)
    }


def names_simulated_cluster(kubeconfig: str | None) -> bool:
    """Whether ``kubeconfig`` (a path, or a ``:``-separated list as in ``$KUBECONFIG``) is one
    that ``rollbackctl run`` wrote for its simulated cluster."""
    return any(
        doc.get("current-context") == SIMULATED_CONTEXT for doc in kubeconfig_documents(kubeconfig)
    )
