"""``python -m bench [--quick] [--write] [--only SECTIONS]``: the figures of bench/RESULTS.md.

cost    one successful attempt per window length (20s, 5m, 1h at once on one dev server, the real
        workflow and activities against the emulator): history events, activities, timers and
        Kubernetes requests by verb, which must be the same for every window; and the
        Prometheus queries of an attempt with health checks (one per check per window end).
memory  KiB per cached workflow, by workflow runner, each measured in a fresh process.
burst   pods adopting at once through the intake (its own process, no worker): adoption ->
        workflow started p50/p99, signals per owner, intake requests, CPU and RSS.
status  policy status writes while workloads adopt at once under a few policies (real worker and
        intake): writes per transition, the most writes of one policy in any 2 s.
P1      rollback workflows completed per second vs a floor workflow doing the same activities
        and timers, batches alternated and repeated, the work of sampled runs asserted equal
        from their histories; the ratio of the medians is the engine's overhead.
P2      Kubernetes API requests per cohort sample, and writes per transition, counted at the
        emulator, vs a naive baseline that GETs every pod.
P3      N workloads monitored at once by one worker process through the real intake and
        activities: every final mode right; worker peak RSS, CPU per workload, samples taken,
        time from the last workload created to all done.
P4      policy resolution for W workloads x P policies: the intake's index vs a linear scan.
SQ      the dev server's SQLite with and without the WAL pragmas (P1's workloads on each).
cli     how fast ``rollbackctl --help`` and ``completion`` answer, against the bare interpreter.
detect  (``--only detect``, not in the default run) N workloads on 1-hour windows under an early
        verdict whose apps crash at random moments: from the pod status change that lost the
        window to the rollback published and to the restore Ready, p50/p99, against the window's
        end and Flagger's defaults (``bench.detect``).
p5      (``--only p5``, not in the default run) Kubex's scale: 25,000 owners of mixed kinds,
        35,000 pods, 1,000 nodes; the intake's sync, a wave of adoptions through one worker
        under a Temporal budget, peak RSS of both, actions per second per second, the floor.
fleet   N simulated clusters (each its own API server, worker process and intake) with M
        workloads each, the same names in every cluster, on one Temporal: attempts per second
        per cluster and in total against one cluster alone in the same run, final modes checked,
        and what a 50-cluster fleet costs the server at a stated change rate.

One module per benchmark over ``bench.harness``: ``cost``, ``workflow_memory``, ``burst``,
``status``, ``p4``, ``api_cost`` (P2), ``throughput`` (P1, versioning, SQLite), ``p3``, ``fleet``,
``detect``, ``p5``, ``soak``.
A target missed says NOT MET on the line of its figure.

``--write`` replaces, in RESULTS.md, the sections this run measured (each stamped with its
command) and keeps the others."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from datetime import UTC, datetime

from bench.api_cost import api_cost, writes_per_transition
from bench.burst import burst
from bench.cli_latency import cli_latency
from bench.cost import attempt_cost, attempt_paths, health_cost
from bench.detect import detect
from bench.fleet import fleet
from bench.harness import (
    Lines,
    say,
    scratch_server,
)
from bench.p3 import WINDOW_SECONDS, concurrent
from bench.p4 import policy_resolution
from bench.p5 import p5, p5_floor
from bench.results import RESULTS, machine, merge_results
from bench.soak import report as soak_report
from bench.soak import soak
from bench.status import status_pass, status_writes
from bench.throughput import sqlite_wal, throughput, versioning_cost
from bench.workflow_memory import workflow_memory

SECTIONS = (
    "cost",
    "memory",
    "burst",
    "status",
    "p4",
    "p2",
    "p1",
    "versioning",
    "sqlite",
    "p3",
    "fleet",
    "cli",
)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke check for CI")
    parser.add_argument("--write", action="store_true", help="write bench/RESULTS.md")
    parser.add_argument("--p1", default="100,1000", help="P1 sizes (default 100,1000)")
    parser.add_argument(
        "--windows", default="20s,5m,1h", help="cost: window lengths (default 20s,5m,1h)"
    )
    parser.add_argument("--p3", type=int, default=5_000, help="P3 workloads (default 5000)")
    parser.add_argument(
        "--clusters", type=int, default=4, help="fleet: simulated clusters (default 4)"
    )
    parser.add_argument(
        "--fleet", type=int, default=250, help="fleet: workloads per cluster (default 250)"
    )
    parser.add_argument(
        "--soak", type=int, default=1_000, help="soak workloads (default 1000; --only soak)"
    )
    parser.add_argument(
        "--detect", type=int, default=100, help="detect workloads (default 100; --only detect)"
    )
    parser.add_argument(
        "--p5",
        default="25000,35000,1000,200",
        help="p5: owners,pods,nodes,budget (default 25000,35000,1000,200; --only p5)",
    )
    parser.add_argument("--no-floor", action="store_true", help="p5: skip the floor's run")
    parser.add_argument(
        "--floor-only",
        action="store_true",
        help="p5: only the floor, at P5's owners, on a fresh dev server (--only p5)",
    )
    parser.add_argument(
        "--only",
        default=",".join(SECTIONS),
        help=f"sections to run (default {','.join(SECTIONS)}; also: soak, the chaos soak;"
        " detect, the early verdict's speed; p5, Kubex's scale)",
    )
    args = parser.parse_args()
    quick = args.quick
    sizes = [20, 50] if quick else [int(n) for n in args.p1.split(",")]
    p3 = 20 if quick else args.p3
    only = set(args.only.lower().split(","))
    if (args.no_floor or args.floor_only) and only != {"p5"}:
        parser.error("--no-floor and --floor-only are P5's: use them with --only p5")
    if args.no_floor and args.floor_only:
        parser.error("--no-floor and --floor-only exclude each other")
    lines: Lines = []
    command = " ".join(["python -m bench", *sys.argv[1:]])
    say(lines, "# Benchmark results")
    say(lines)
    say(lines, f"Machine: {machine()}. Command: `{command}`. Date: {datetime.now(UTC):%Y-%m-%d}.")
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    say(lines, f"Load average at the start: {load} (1, 5, 15 min). Timings and ratios are only")
    say(lines, "comparable from a run alone on the machine; a busy one makes every figure worse.")
    say(lines)
    if "cost" in only:
        say(lines, "## Cost of one successful attempt by window length")
        asyncio.run(attempt_cost(["2s", "6s"] if quick else args.windows.split(","), lines))
        asyncio.run(attempt_paths(lines))
        say(lines, "Health checks (the shipped health-checks story, a real Prometheus):")
        asyncio.run(health_cost(lines))
        say(lines)
    if "memory" in only:
        say(lines, "## Memory: what one cached workflow costs the worker, by workflow runner")
        workflow_memory(100 if quick else 2_000, lines)
        say(lines)
    if "burst" in only:
        say(lines, "## Burst: pods adopting at once, through the intake")
        asyncio.run(burst(50 if quick else 5_000, 2, lines))
        say(lines)
    if "status" in only:
        say(lines, "## Policy status: writes during a burst")
        asyncio.run(status_writes(40 if quick else 200, 4 if quick else 10, lines))
        status_pass(1_000 if quick else 5_000, 100, lines)
        say(lines)
    if "p4" in only:
        say(lines, "## P4 policy resolution, index vs linear scan")
        policy_resolution(1_000 if quick else 10_000, 100 if quick else 1_000, lines)
        say(lines)
    if "p2" in only:
        say(lines, "## P2 Kubernetes API cost per sample and per transition")
        api_cost(5 if quick else 50, 10, 3 if quick else 10, lines)
        writes_per_transition(lines)
        say(lines)
    if "p1" in only:
        say(lines, "## P1 throughput vs the floor workflow (same dev server, same worker)")
        with scratch_server() as server:
            asyncio.run(throughput(server.address, sizes, 2 if quick else 3, lines))
        say(lines)
    if "versioning" in only:
        say(lines, "## Worker Versioning: a pinned, versioned worker vs an unversioned one")
        with scratch_server() as server:
            asyncio.run(versioning_cost(server.address, 20 if quick else 500, 3, lines))
        say(lines)
    if "sqlite" in only:
        say(lines, "## SQLite: WAL + synchronous=off (the embedded default) vs the default journal")
        asyncio.run(sqlite_wal([50] if quick else [500], lines))
        say(lines)
    if "p3" in only:
        say(lines, "## P3 concurrent workloads on one worker process")
        asyncio.run(concurrent(p3, lines, 5 if quick else WINDOW_SECONDS))  # quick: a smoke check
        say(lines)
    if "fleet" in only:
        say(lines, "## Fleet: clusters sharing one Temporal")
        asyncio.run(fleet(2 if quick else args.clusters, 20 if quick else args.fleet, lines))
        say(lines)
    if "cli" in only:
        say(lines, "## CLI: --help and completion latency")
        cli_latency(5 if quick else 20, lines)
        say(lines)
    if "detect" in only:
        say(lines, "## Detect: a certain failure to its rollback, under an early verdict")
        asyncio.run(detect(10 if quick else args.detect, lines))
        say(lines)
    if "p5" in only:
        say(lines, "## P5: Kubex's scale on one intake and one worker, inside a Temporal budget")
        owners, pods, nodes, budget = (
            (60, 90, 10, 200) if quick else tuple(int(n) for n in args.p5.split(","))
        )
        if args.floor_only:
            asyncio.run(p5_floor(owners, lines))
        else:
            asyncio.run(p5(owners, pods, nodes, budget, lines, floor=not args.no_floor))
        say(lines)
    if "soak" in only:
        say(lines, "## Soak: many workloads, many faults at once, an oracle")
        result = asyncio.run(soak(20 if quick else args.soak))
        for line in soak_report(result):
            say(lines, line)
        say(lines)
    if args.write:
        stamp = (
            f"Command: `{command}` on this machine, {datetime.now(UTC):%Y-%m-%d}; load average"
            f" at the start {load}."
        )
        RESULTS.write_text(
            merge_results(RESULTS.read_text() if RESULTS.exists() else "", lines, stamp)
        )
        print(f"\nwrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
