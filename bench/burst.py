"""Pods adopting at once through the intake (its own process, no worker): adoption -> workflow
started p50/p99, signals per owner, intake requests, CPU and RSS, against a bare client's
signal-with-starts on the same server."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from temporalio.client import Client

from bench import CLUSTER, actions
from bench.harness import (
    READY,
    REC,
    Lines,
    make_workload,
    met,
    p50_p99,
    policy_doc,
    proc_stats,
    say,
)
from bench.memory import memory_mib
from sim.apiserver import KubeEmulator, free_port
from sim.devserver import DevServer
from worker.config import TemporalConfig
from worker.intake import MAX_CONCURRENT_SIGNALS
from worker.temporal import observe
from workflows.activity_api import OwnerRef
from workflows.contract import WorkloadKind


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status)
    except (OSError, urllib.error.URLError):
        return 0


async def burst(owners: int, per_owner: int, lines: Lines) -> None:
    """``owners * per_owner`` pods adopting their recommendation at once. The intake runs as its
    own process (``rollbackctl intake``) against the emulator; no worker, so what is measured is
    the intake alone: adoption -> workflow started, its CPU and memory, its requests, and the
    signals each owner's workflow received (counted in the histories)."""
    with tempfile.TemporaryDirectory() as tmp, KubeEmulator() as api:
        api.store.create(policy_doc("all", "20s"))
        pods = {
            f"w{w}": make_workload(api, f"ns{w % 20}", f"w{w}", per_owner, READY, adopted=False)
            for w in range(owners)
        }
        with DevServer(
            Path(tmp) / "t", free_port(), headless=True, log_path=Path(tmp) / "log"
        ) as server:
            queue, health = "bench-burst", free_port()
            log = (Path(tmp) / "intake.log").open("wb")
            intake = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "cli",
                    "intake",
                    "--cluster",
                    CLUSTER,
                    "--kube-url",
                    api.url,
                    "--address",
                    server.address,
                    "--task-queue",
                    queue,
                    "--lease-namespace",
                    "default",
                    "--health-address",
                    f"127.0.0.1:{health}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            try:
                while _get(f"http://127.0.0.1:{health}/readyz") != 200:
                    assert intake.poll() is None, (Path(tmp) / "intake.log").read_text()[-2000:]
                    await asyncio.sleep(0.2)
                synced_rss = memory_mib(intake.pid)
                _, cpu_before = proc_stats(intake.pid)
                api.clear_journal()
                adopted_at: dict[str, float] = {}
                began = time.monotonic()
                for name, owned in pods.items():
                    for pod in owned:
                        meta = pod["metadata"]
                        api.store.patch(
                            api.store.rtype("Pod"),
                            meta["namespace"],
                            meta["name"],
                            {
                                "spec": {
                                    "containers": [
                                        {
                                            "name": "app",
                                            "resources": {"requests": {"memory": "512Mi"}},
                                        }
                                    ]
                                }
                            },
                            "application/strategic-merge-patch+json",
                        )
                        adopted_at.setdefault(
                            f"rollback/{CLUSTER}/{meta['namespace']}/Deployment/{name}", time.time()
                        )
                adopting = time.monotonic() - began
                client = await TemporalConfig.at(server.address).connect()
                count_query = f'TaskQueue = "{queue}"'
                while (await client.count_workflows(count_query)).count < owners:
                    assert time.monotonic() - began < 600, "not every owner was signalled"
                    await asyncio.sleep(0.5)
                all_started = time.monotonic() - began
                await asyncio.sleep(3)  # anything still queued would be signalled by now
                rss, cpu = proc_stats(intake.pid)
            finally:
                intake.terminate()
                intake.wait(10)
            starts, handles = [], []
            async for wf in client.list_workflows(count_query):
                starts.append(max(0.0, wf.start_time.timestamp() - adopted_at[wf.id]))
                handles.append(client.get_workflow_handle(wf.id, run_id=wf.run_id))
            limit = asyncio.Semaphore(50)

            async def signals(handle: Any) -> int:
                async with limit:
                    return actions.shape((await handle.fetch_history()).events)["signals"]

            received = await asyncio.gather(*(signals(h) for h in handles))
            requests = Counter(r.verb for r in api.journal)
            floor_rate = await _bare_signal_with_starts(client, owners)
    p50, p99 = p50_p99(starts)
    say(
        lines,
        f"  {owners * per_owner} pods of {owners} Deployments adopting at once (the adoption"
        f" patches took {adopting:.1f}s to make): every owner's workflow started {all_started:.1f}s"
        f" after the first; adoption -> workflow started p50 {p50 * 1000:.0f} ms, p99"
        f" {p99 * 1000:.0f} ms (target p99 <= 5 s{met(p99 <= 5)})",
    )
    say(
        lines,
        f"    the floor, on the same server: a bare client signal-with-starting {owners} workflows,"
        f" {MAX_CONCURRENT_SIGNALS} at a time, as the intake does: {floor_rate:.0f}/s, so"
        f" {owners / floor_rate:.1f}s for all (the intake: {owners / all_started:.0f}/s,"
        f" {owners / all_started / floor_rate:.2f}x the floor; target >= 0.9x"
        f"{met(owners / all_started >= 0.9 * floor_rate)})",
    )
    say(
        lines,
        f"    signals per owner: {sum(received) / len(received):.2f} (max {max(received)}); intake"
        f" requests during the burst: {dict(sorted(requests.items()))}",
    )
    say(
        lines,
        f"    intake process: CPU {cpu - cpu_before:.1f}s for the burst"
        f" ({(cpu - cpu_before) / (owners * per_owner) * 1000:.2f} ms per pod); RSS {synced_rss:.0f} MiB"
        f" once synced with {owners} owners, {owners} ReplicaSets and {owners * per_owner} pods cached,"
        f" peak {rss:.0f} MiB",
    )


async def _bare_signal_with_starts(client: Client, count: int) -> float:
    """Signal-with-starts per second from a bare client, as many at once as the intake sends."""
    limit = asyncio.Semaphore(MAX_CONCURRENT_SIGNALS)
    run = uuid.uuid4().hex[:6]

    async def one(i: int) -> None:
        owner = OwnerRef(namespace="floor", kind=WorkloadKind.DEPLOYMENT, name=f"f{run}-{i}")
        async with limit:
            await observe(client, CLUSTER, f"bench-floor-{run}", owner, REC)

    began = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(count)))
    return count / (time.monotonic() - began)
